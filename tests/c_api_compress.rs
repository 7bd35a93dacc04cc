//! Compressed collectives through the C API, ranks as threads of this process over shm: a
//! communicator's `fabricoll_config.compress` and a call's `fabricoll_collective_options` give
//! the same bits on every rank, within the error bound of docs/compression.md of the
//! uncompressed result; ranks asking for different compression fail, each naming `compress`;
//! a per-call format on a call it cannot apply to (int32 data, op max, Broadcast) and bad
//! option fields fail naming themselves.
use capi::{comm, last_error, ranks, ranks_each, shm_config};
use nccl_net_fabricoll::compress::Format;
use nccl_net_fabricoll::ffi::api::*;
use std::os::raw::c_int;

use fabricoll_status::*;

mod capi;

const F32: c_int = fabricoll_datatype::FABRICOLL_FLOAT32 as c_int;
const I32: c_int = fabricoll_datatype::FABRICOLL_INT32 as c_int;
const SUM: c_int = fabricoll_redop::FABRICOLL_SUM as c_int;
const MAX: c_int = fabricoll_redop::FABRICOLL_MAX as c_int;
const ALLREDUCE: c_int = fabricoll_coll::FABRICOLL_COLL_ALLREDUCE as c_int;
const ALLGATHER: c_int = fabricoll_coll::FABRICOLL_COLL_ALLGATHER as c_int;
const BROADCAST: c_int = fabricoll_coll::FABRICOLL_COLL_BROADCAST as c_int;

/// Every coded format, as the C enum and as the codec's format (for the bound).
const FORMATS: [(c_int, Format); 6] = [
    (
        fabricoll_compress::FABRICOLL_COMPRESS_BF16 as c_int,
        Format::Bf16,
    ),
    (
        fabricoll_compress::FABRICOLL_COMPRESS_FP16 as c_int,
        Format::Fp16,
    ),
    (
        fabricoll_compress::FABRICOLL_COMPRESS_FP8E4M3 as c_int,
        Format::Fp8E4m3,
    ),
    (
        fabricoll_compress::FABRICOLL_COMPRESS_FP8E5M2 as c_int,
        Format::Fp8E5m2,
    ),
    (
        fabricoll_compress::FABRICOLL_COMPRESS_INT8 as c_int,
        Format::Int8,
    ),
    (
        fabricoll_compress::FABRICOLL_COMPRESS_INT4 as c_int,
        Format::Int4,
    ),
];

/// Run `f(rank, comm)` on every rank at once; their results.
fn each<T: Send>(cs: &[usize], f: impl Fn(usize, usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let hs: Vec<_> = cs
            .iter()
            .enumerate()
            .map(|(r, &c)| {
                let f = &f;
                s.spawn(move || f(r, c))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn destroy(cs: &[usize]) {
    for &c in cs {
        assert_eq!(fabricoll_comm_destroy(comm(c)), FABRICOLL_SUCCESS);
    }
}

fn options(format: c_int, block: c_int) -> fabricoll_call_options {
    let mut o = std::mem::MaybeUninit::<fabricoll_call_options>::uninit();
    let size = std::mem::size_of::<fabricoll_call_options>();
    // SAFETY: `o` is writable for `size` bytes.
    let st = unsafe { fabricoll_call_options_init_size(o.as_mut_ptr(), size) };
    assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
    // SAFETY: fabricoll_call_options_init_size wrote every field.
    let mut o = unsafe { o.assume_init() };
    assert_eq!((o.size, o.compress, o.compress_block), (size, 0, 0));
    o.compress = format;
    o.compress_block = block;
    o
}

/// The C type of a Rust element type.
trait Elem {
    const DT: c_int;
}
impl Elem for f32 {
    const DT: c_int = F32;
}
impl Elem for i32 {
    const DT: c_int = I32;
}

/// A call of `coll` from `x` into `y`: `x.len()` elements (per rank for AllGather).
fn call<T: Elem>(coll: c_int, x: &[T], y: &mut [T], op: c_int) -> fabricoll_call {
    fabricoll_call {
        coll,
        sendbuf: x.as_ptr().cast(),
        recvbuf: y.as_mut_ptr().cast(),
        count: x.len(),
        datatype: T::DT,
        op,
        root: 0,
        algo: 0,
    }
}

/// `fabricoll_collective_options`, blocking (`nonblocking` false) or started and waited for.
fn run(
    c: &fabricoll_call,
    o: Option<&fabricoll_call_options>,
    cm: usize,
    nonblocking: bool,
) -> fabricoll_status {
    let op = o.map_or(std::ptr::null(), |o| o as *const fabricoll_call_options);
    if !nonblocking {
        // SAFETY: the call's buffers outlive the blocking call; the options are whole.
        return unsafe { fabricoll_collective_options(c, op, comm(cm), std::ptr::null_mut()) };
    }
    let mut req = std::ptr::null_mut();
    // SAFETY: as above; the buffers outlive the wait below.
    let st = unsafe { fabricoll_collective_options(c, op, comm(cm), &mut req) };
    if st != FABRICOLL_SUCCESS {
        return st;
    }
    fabricoll_wait(req)
}

/// Fail unless `st` is success, naming `what` and the library's message.
fn must(st: fabricoll_status, what: &str) {
    assert_eq!(st, FABRICOLL_SUCCESS, "{what}: {}", last_error());
}

/// Rank `r`'s input: within +-10 on even ranks, a wide range of magnitudes on odd ones.
fn input(r: usize, count: usize, seed: u64) -> Vec<f32> {
    nccl_net_fabricoll::testing::values::values(
        seed * 97 + r as u64,
        count,
        (r % 2 == 1).then_some(12),
    )
}

/// The largest scale a block whose largest magnitude is `amax` gets (docs/compression.md).
fn scale(f: Format, amax: f64) -> f64 {
    match f {
        Format::Bf16 => 1.0,
        Format::Int8 | Format::Int4 => {
            (amax / f64::from(f.max_code_value())).max(2f64.powi(-126)) * (1.0 + 2f64.powi(-20))
        }
        _ => (2.0 * amax / f64::from(f.max_code_value())).max(2f64.powi(-126)),
    }
}

/// One round trip's bound e(x, s).
fn once(f: Format, x: f64, s: f64) -> f64 {
    let (rel, abs) = f.error_terms();
    rel * x.abs() + abs * s + 2f64.powi(-149)
}

/// Element `i`'s block of `k` elements: segments are whole blocks, so blocks start at
/// multiples of `k` of the whole vector.
fn block_amax(v: &[f32], k: usize, i: usize) -> f64 {
    let b0 = i / k * k;
    v[b0..(b0 + k).min(v.len())]
        .iter()
        .fold(0f64, |m, y| m.max(f64::from(y.abs())))
}

/// Check a compressed AllReduce sum: every rank's bits equal rank 0's, and each element is
/// within the documented bound of the exact sum plus the uncompressed result's own f32
/// rounding of `uncompressed`.
fn check_allreduce(
    what: &str,
    f: Format,
    k: usize,
    inputs: &[Vec<f32>],
    got: &[Vec<f32>],
    uncompressed: &[f32],
) {
    let n = inputs.len() as f64;
    for (r, g) in got.iter().enumerate() {
        assert!(
            g.iter()
                .zip(&got[0])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: rank {r}'s result differs from rank 0's"
        );
    }
    for (i, (&c, &u)) in got[0].iter().zip(uncompressed).enumerate() {
        let (mut e, mut mag, mut amax) = (0.0, 0.0, 0.0);
        for v in inputs {
            let x = f64::from(v[i]);
            let a = block_amax(v, k, i);
            let q = once(f, x, scale(f, a));
            e += q;
            mag += x.abs() + q;
            amax += a + once(f, a, scale(f, a));
        }
        let exact: f64 = inputs.iter().map(|v| f64::from(v[i])).sum();
        let before = e + (n + 1.0) * 2f64.powi(-24) * mag;
        let bound = before + once(f, exact.abs() + before, scale(f, amax));
        // The uncompressed f32 sum's own rounding (n - 1 additions).
        let own = n * 2f64.powi(-24) * inputs.iter().map(|v| f64::from(v[i].abs())).sum::<f64>();
        let d = (f64::from(c) - f64::from(u)).abs();
        assert!(
            d <= bound + own,
            "{what}: element {i}: compressed {c:e}, uncompressed {u:e}, bound {:e}",
            bound + own
        );
    }
}

/// The communicator's `fabricoll_config.compress` (bf16 and int8, 3 ranks): blocking and
/// non-blocking AllReduce sums come out the same on every rank, within the bound of the
/// uncompressed result, which a per-call OFF on the same communicators gives.
#[test]
fn config_compress_gives_one_result_within_the_bound() {
    let n = 3;
    let count = 5000;
    for (cf, f) in [FORMATS[0], FORMATS[4]] {
        let mut cfg = shm_config();
        cfg.compress = cf;
        cfg.compress_block = 128;
        let Some(cs) = ranks("config_compress_gives_one_result_within_the_bound", &cfg, n) else {
            return;
        };
        let inputs: Vec<Vec<f32>> = (0..n).map(|r| input(r, count, 1)).collect();
        let off = options(fabricoll_compress::FABRICOLL_COMPRESS_OFF as c_int, 0);
        let out = each(&cs, |r, c| {
            let x = &inputs[r];
            let mut results = Vec::new();
            for (o, nb) in [(None, false), (None, true), (Some(&off), false)] {
                let mut y = vec![0f32; count];
                let k = call(ALLREDUCE, x, &mut y, SUM);
                let st = run(&k, o, c, nb);
                assert_eq!(st, FABRICOLL_SUCCESS, "{f} rank {r}: {}", last_error());
                results.push(y);
            }
            results
        });
        let uncompressed = &out[0][2];
        for (r, o) in out.iter().enumerate() {
            assert!(
                o[2].iter()
                    .zip(uncompressed)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{f}: rank {r}'s uncompressed result differs from rank 0's"
            );
        }
        for (j, what) in [(0, "blocking"), (1, "non-blocking")] {
            let got: Vec<Vec<f32>> = out.iter().map(|o| o[j].clone()).collect();
            check_allreduce(
                &format!("config {f} {what}"),
                f,
                128,
                &inputs,
                &got,
                uncompressed,
            );
            assert!(
                got[0].iter().zip(uncompressed).any(|(a, b)| a != b),
                "{f} {what}: the result is the uncompressed one: nothing was compressed"
            );
        }
        destroy(&cs);
    }
}

/// `fabricoll_collective_options` on communicators that compress nothing: every format
/// compresses that one call (AllReduce and AllGather, blocking and not), the same bits on
/// every rank, within the bound; NULL options leave the call uncompressed.
#[test]
fn per_call_options_compress_one_call() {
    let n = 3;
    let count = 3000;
    let Some(cs) = ranks("per_call_options_compress_one_call", &shm_config(), n) else {
        return;
    };
    let inputs: Vec<Vec<f32>> = (0..n).map(|r| input(r, count, 2)).collect();
    let plain_allreduce = || {
        each(&cs, |r, c| {
            let mut y = vec![0f32; count];
            let k = call(ALLREDUCE, &inputs[r], &mut y, SUM);
            must(run(&k, None, c, false), "uncompressed");
            y
        })
    };
    let plain = plain_allreduce();
    for (i, (cf, f)) in FORMATS.into_iter().enumerate() {
        let o = options(cf, 64);
        let nb = i % 2 == 1;
        let out = each(&cs, |r, c| {
            let x = &inputs[r];
            let mut y = vec![0f32; count];
            let k = call(ALLREDUCE, x, &mut y, SUM);
            must(run(&k, Some(&o), c, nb), &format!("{f} rank {r}"));
            // AllGather: each rank's block quantized once, decoded alike everywhere.
            let mut g = vec![0f32; count * n];
            let k = call(ALLGATHER, x, &mut g, SUM);
            must(run(&k, Some(&o), c, !nb), &format!("{f} rank {r}"));
            (y, g)
        });
        let got: Vec<Vec<f32>> = out.iter().map(|o| o.0.clone()).collect();
        check_allreduce(&format!("per-call {f}"), f, 64, &inputs, &got, &plain[0]);
        for (r, (_, g)) in out.iter().enumerate() {
            assert!(
                g.iter()
                    .zip(&out[0].1)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{f} allgather: rank {r}'s result differs from rank 0's"
            );
            for (q, x) in inputs.iter().enumerate() {
                for (i, &v) in x.iter().enumerate() {
                    let bound = once(f, f64::from(v), scale(f, block_amax(x, 64, i)));
                    let d = (f64::from(g[q * count + i]) - f64::from(v)).abs();
                    assert!(
                        d <= bound,
                        "{f} allgather: rank {r} block {q} element {i}: {d:e} > {bound:e}"
                    );
                }
            }
        }
    }
    // The plain call again: NULL options on a communicator that compresses nothing.
    let again = plain_allreduce();
    assert_eq!(again, plain);
    destroy(&cs);
}

/// Ranks that ask for different compression in one call fail, every one of them, each naming
/// `compress`: per-call formats that differ, and a communicator that compresses against one
/// that does not.
#[test]
fn ranks_asking_for_different_compression_fail_naming_compress() {
    let test = "ranks_asking_for_different_compression_fail_naming_compress";
    let Some(cs) = ranks(test, &shm_config(), 2) else {
        return;
    };
    let fmts = [
        fabricoll_compress::FABRICOLL_COMPRESS_INT8 as c_int,
        fabricoll_compress::FABRICOLL_COMPRESS_FP16 as c_int,
    ];
    let errs = each(&cs, |r, c| {
        let x = vec![1f32; 4096];
        let mut y = vec![0f32; 4096];
        let o = options(fmts[r], 0);
        let k = call(ALLREDUCE, &x, &mut y, SUM);
        (run(&k, Some(&o), c, false), last_error())
    });
    for (r, (st, e)) in errs.iter().enumerate() {
        assert_ne!(*st, FABRICOLL_SUCCESS, "rank {r}");
        assert!(e.contains("compress"), "per-call: rank {r}: {e}");
    }
    destroy(&cs);

    let mut int8 = shm_config();
    int8.compress = fabricoll_compress::FABRICOLL_COMPRESS_INT8 as c_int;
    let plain = shm_config();
    let Some(cs) = ranks_each(test, &[&int8, &plain]) else {
        return;
    };
    let errs = each(&cs, |r, c| {
        let x = vec![1f32; 4096];
        let mut y = vec![0f32; 4096];
        let k = call(ALLREDUCE, &x, &mut y, SUM);
        (run(&k, None, c, r == 1), last_error())
    });
    for (r, (st, e)) in errs.iter().enumerate() {
        assert_ne!(*st, FABRICOLL_SUCCESS, "rank {r}");
        assert!(e.contains("compress"), "config: rank {r}: {e}");
    }
    destroy(&cs);
}

/// A per-call format on a call it cannot apply to is FABRICOLL_INVALID_ARGUMENT naming
/// `compress` (the ranks need not agree: each refuses before sending anything); bad fields
/// name themselves; the communicator's format leaves such calls as they are (exact).
#[test]
fn unsupported_per_call_requests_fail_naming_compress() {
    let test = "unsupported_per_call_requests_fail_naming_compress";
    let mut cfg = shm_config();
    cfg.compress = fabricoll_compress::FABRICOLL_COMPRESS_INT8 as c_int;
    let Some(cs) = ranks(test, &cfg, 2) else {
        return;
    };
    let int8 = options(fabricoll_compress::FABRICOLL_COMPRESS_INT8 as c_int, 0);
    let out = each(&cs, |r, c| {
        let xi: Vec<i32> = (0..100).map(|i| i * (r as i32 + 1)).collect();
        let mut yi = vec![0i32; 100];
        let xf = vec![1.5f32; 100];
        let mut yf = vec![0f32; 100];
        let mut errs = Vec::new();
        for (k, o, nb) in [
            (call(ALLREDUCE, &xi, &mut yi, SUM), &int8, false),
            (call(ALLREDUCE, &xf, &mut yf, MAX), &int8, true),
            (call(BROADCAST, &xf, &mut yf, SUM), &int8, false),
        ] {
            errs.push((run(&k, Some(o), c, nb), last_error()));
        }
        // Bad fields of the options.
        let mut bad = Vec::new();
        let k = call(ALLREDUCE, &xf, &mut yf, SUM);
        for (o, name) in [
            (options(42, 0), "options.compress"),
            (options(0, 64), "options.compress_block"),
            (options(6, -1), "options.compress_block"),
            (
                fabricoll_call_options {
                    size: 1000,
                    compress: int8.compress,
                    compress_block: 0,
                },
                "options.size",
            ),
        ] {
            bad.push((run(&k, Some(&o), c, false), last_error(), name));
        }
        // The communicator's int8 leaves int32 data and op max alone: exact results.
        let k = call(ALLREDUCE, &xi, &mut yi, SUM);
        must(run(&k, None, c, false), "int32 sum on an int8 communicator");
        let k = call(ALLREDUCE, &xf, &mut yf, MAX);
        must(run(&k, None, c, false), "op max on an int8 communicator");
        (errs, bad, yi, yf)
    });
    for (r, (errs, bad, yi, yf)) in out.into_iter().enumerate() {
        for (i, (st, e)) in errs.into_iter().enumerate() {
            assert_eq!(st, FABRICOLL_INVALID_ARGUMENT, "rank {r} case {i}: {e}");
            assert!(e.contains("'compress'"), "rank {r} case {i}: {e}");
        }
        for (st, e, name) in bad {
            assert_eq!(st, FABRICOLL_INVALID_ARGUMENT, "rank {r} {name}: {e}");
            assert!(e.contains(name), "rank {r} {name}: {e}");
        }
        assert_eq!(yi, (0..100).map(|i| 3 * i).collect::<Vec<i32>>());
        assert_eq!(yf, vec![1.5f32; 100]);
    }
    destroy(&cs);

    // A bad config.compress names itself.
    let mut id = fabricoll_unique_id { internal: [0; 128] };
    for (set, name) in [
        ((42, 0), "config.compress"),
        ((6, -3), "config.compress_block"),
    ] {
        let mut c = shm_config();
        (c.compress, c.compress_block) = set;
        // SAFETY: both pointers are valid.
        let st = unsafe { fabricoll_get_unique_id_config(&mut id, &c) };
        assert_eq!(st, FABRICOLL_INVALID_ARGUMENT, "{name}");
        assert!(last_error().contains(name), "{name}: {}", last_error());
    }
}

//! Compressed collectives on several hosts (ranks as threads over loopback, hosts from
//! `FABRICOLL_LOCAL_RANKS`): on 2 x 2, 2 x 3 and 3 x 2 ranks the inter-host level alone is
//! compressed (docs/compression.md, "Levels"). Every rank's output must be the bits of the
//! composition computed here from the inputs (the host's full-precision partial sums, the
//! owner rule among each lane, the decoded result handed on inside the host), the same on
//! every rank, and within the documented bound of an f64 reference; data whose intra-host
//! partial sums cancel shows that shared memory kept full precision (the result differs from,
//! and is far closer than, every level compressed). On hosts of different sizes every level is
//! compressed, as before.
use nccl_net_fabricoll::algo::{Algorithm, Collective};
use nccl_net_fabricoll::coll::{Call, Comm, Kind};
use nccl_net_fabricoll::compress::{owner, Codec, Format};
use nccl_net_fabricoll::config::{CompressLevels, Compression, Config};
use nccl_net_fabricoll::reduce::{DataType, RedOp};
use nccl_net_fabricoll::transport::Region;
use std::ops::Range;
use std::sync::Arc;

mod common;
use common::typed::{decode, encode, held};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    AllReduce,
    AllReduceAvg,
    ReduceScatter,
    AllGather,
}

const OPS: [Op; 4] = [
    Op::AllReduce,
    Op::AllReduceAvg,
    Op::ReduceScatter,
    Op::AllGather,
];

/// `n` ranks in hosts of `per` consecutive ranks, compressing with `codec` on `levels`.
fn comms(n: usize, per: usize, codec: Codec, levels: CompressLevels) -> Vec<Arc<Comm>> {
    let mut cfg = common::fixed_model(None, 60_000);
    cfg.compress = Compression {
        format: codec.format,
        block: codec.block,
    };
    cfg.compress_levels = levels;
    cfg.local_ranks = Some(per);
    let cfgs: Vec<Config> = (0..n).map(|_| cfg.clone()).collect();
    common::comms_in_process("coll_compressed_tiered", "loopback", &cfgs).expect("loopback")
}

/// The ranks of each host (consecutive blocks of `per`).
fn hosts(n: usize, per: usize) -> Vec<Vec<usize>> {
    (0..n)
        .collect::<Vec<_>>()
        .chunks(per)
        .map(<[usize]>::to_vec)
        .collect()
}

/// NCCL's count of `op` for `len` elements per rank's input.
fn count(op: Op, n: usize, len: usize) -> usize {
    match op {
        Op::ReduceScatter => len / n,
        _ => len,
    }
}

fn out_len(op: Op, n: usize, c: usize) -> usize {
    match op {
        Op::ReduceScatter => c,
        Op::AllGather => c * n,
        _ => c,
    }
}

/// Quantize `v` and decode it again (one round trip of `codec`).
fn round_trip(codec: &Codec, v: &[f32]) -> Vec<f32> {
    let all = 0..v.len();
    let codes = owner::contribute(codec, v, std::slice::from_ref(&all)).unwrap();
    let mut out = vec![0f32; v.len()];
    owner::finish(codec, &codes, &mut out).unwrap();
    out
}

/// The f32 sum of the ranks' `x[r][range]` in the order of `ranks` (the first, then each next).
fn sum_in_order(x: &[Vec<f32>], ranks: &[usize], range: Range<usize>) -> Vec<f32> {
    let mut acc = x[ranks[0]][range.clone()].to_vec();
    for &r in &ranks[1..] {
        acc.iter_mut()
            .zip(&x[r][range.clone()])
            .for_each(|(a, v)| *a += *v);
    }
    acc
}

/// The owner rule over `parts` (each host's f32 values of one segment, in host order): each
/// quantized once, summed dequantized in order, divided by `avg`, quantized once, decoded.
fn owner_rule(codec: &Codec, parts: &[Vec<f32>], avg: Option<usize>) -> Vec<f32> {
    let len = parts[0].len();
    let all = 0..len;
    let codes: Vec<Vec<u8>> = parts
        .iter()
        .map(|p| owner::contribute(codec, p, std::slice::from_ref(&all)).unwrap())
        .collect();
    let refs: Vec<&[u8]> = codes.iter().map(Vec::as_slice).collect();
    let sum = owner::reduce_segment(codec, &refs, len, avg).unwrap();
    let mut out = vec![0f32; len];
    owner::finish(codec, &sum, &mut out).unwrap();
    out
}

/// Every rank's expected output of the inter-host-only composition (docs/compression.md).
fn expected_tiered(op: Op, codec: &Codec, per: usize, x: &[Vec<f32>], c: usize) -> Vec<Vec<f32>> {
    let n = x.len();
    let hs = hosts(n, per);
    let nh = hs.len();
    let avg = (op == Op::AllReduceAvg).then_some(n);
    match op {
        Op::AllReduce | Op::AllReduceAvg => {
            let mut out = vec![0f32; c];
            for slice in owner::segments(codec, c, per) {
                for seg in owner::segments(codec, slice.len(), nh) {
                    let at = slice.start + seg.start..slice.start + seg.end;
                    let parts: Vec<Vec<f32>> =
                        hs.iter().map(|h| sum_in_order(x, h, at.clone())).collect();
                    out[at].copy_from_slice(&owner_rule(codec, &parts, avg));
                }
            }
            vec![out; n]
        }
        Op::ReduceScatter => (0..n)
            .map(|r| {
                let parts: Vec<Vec<f32>> = hs
                    .iter()
                    .map(|h| sum_in_order(x, h, r * c..(r + 1) * c))
                    .collect();
                owner_rule(codec, &parts, None)
            })
            .collect(),
        Op::AllGather => {
            let out: Vec<f32> = x.iter().flat_map(|v| round_trip(codec, v)).collect();
            vec![out; n]
        }
    }
}

/// Every rank's expected output with every level compressed (the owner rule over all ranks).
fn expected_flat(op: Op, codec: &Codec, x: &[Vec<f32>], c: usize) -> Vec<Vec<f32>> {
    let n = x.len();
    let avg = (op == Op::AllReduceAvg).then_some(n);
    let all: Vec<usize> = (0..n).collect();
    let rule = |range: Range<usize>| {
        let parts: Vec<Vec<f32>> = all.iter().map(|&r| x[r][range.clone()].to_vec()).collect();
        owner_rule(codec, &parts, avg)
    };
    match op {
        Op::AllReduce | Op::AllReduceAvg => {
            vec![
                owner::segments(codec, c, n)
                    .into_iter()
                    .flat_map(rule)
                    .collect();
                n
            ]
        }
        Op::ReduceScatter => (0..n).map(|r| rule(r * c..(r + 1) * c)).collect(),
        Op::AllGather => {
            vec![x.iter().flat_map(|v| round_trip(codec, v)).collect(); n]
        }
    }
}

/// Run `op` on every rank (blocking, a thread each), in place or not: each rank's output.
fn run(comms: &[Arc<Comm>], op: Op, dt: DataType, x: &[Vec<f32>], in_place: bool) -> Vec<Vec<f32>> {
    let n = comms.len();
    let c = count(op, n, x[0].len());
    common::on_every_rank(comms, |rank, comm| {
        let el = dt.size();
        let input = encode(dt, &x[rank]);
        let ol = out_len(op, n, c);
        // NCCL's in-place layouts: AllGather's input is its block of the
        // output, ReduceScatter's output its block of the input.
        let at = rank * c * el;
        let b = common::typed::buffers(
            &input,
            ol * el,
            in_place.then_some(match op {
                Op::AllGather => (at, 0),
                Op::ReduceScatter => (0, at),
                _ => (0, 0),
            }),
        );
        let (send, recv) = (b.send, b.recv);
        let coll = match op {
            Op::ReduceScatter => Collective::ReduceScatter,
            Op::AllGather => Collective::AllGather,
            _ => Collective::AllReduce,
        };
        let call = Call {
            dtype: dt,
            op: if op == Op::AllReduceAvg {
                RedOp::Avg
            } else {
                RedOp::Sum
            },
            ..common::call(Kind::Coll(coll), send, recv, c)
        };
        comm.run(&call)
            .unwrap_or_else(|e| panic!("{op:?} {dt} n={n} rank {rank}: {e}"));
        decode(dt, &recv.to_vec())
    })
}

/// The bound of docs/compression.md for the composition, per element, against the exact f64
/// result of the held inputs: each host's partial sum quantized once (its block's scale from
/// the partial sums' largest magnitude), the f32 sums, and the owner's result quantized once.
fn check_bound(
    op: Op,
    codec: &Codec,
    dt: DataType,
    per: usize,
    x: &[Vec<f32>],
    rank: usize,
    got: &[f32],
) {
    let (n, f) = (x.len(), codec.format);
    let c = count(op, n, x[0].len());
    let bd = common::typed::Bound { codec: *codec, dt };
    let scale = |amax: f64| bd.scale(amax);
    let once = |v: f64, s: f64| bd.once(v, s);
    let out_round = |v: f64| bd.out_round(v);
    let x64: Vec<Vec<f64>> = x
        .iter()
        .map(|v| v.iter().map(|&y| f64::from(y)).collect())
        .collect();
    let amax = |v: &[f64], seg: &Range<usize>, i: usize| bd.block_amax(v, seg, i);
    if op == Op::AllGather {
        for r in 0..n {
            let seg = 0..c;
            for i in seg.clone() {
                let exact = x64[r][i];
                let s = scale(amax(&x64[r], &seg, i));
                let bound = once(exact, s) + out_round(exact.abs() + once(exact, s));
                let v = f64::from(got[r * c + i]);
                assert!(
                    (v - exact).abs() <= bound,
                    "{op:?} {f}: block {r} element {i}: {v:e} vs {exact:e}, bound {bound:e}"
                );
            }
        }
        return;
    }
    // The hosts' partial sums (f64; their f32 rounding is in the margin below).
    let hs = hosts(n, per);
    let partial: Vec<Vec<f64>> = hs
        .iter()
        .map(|h| {
            (0..x[0].len())
                .map(|i| h.iter().map(|&r| x64[r][i]).sum())
                .collect()
        })
        .collect();
    let abs_sum = |i: usize| -> f64 { x64.iter().map(|v| v[i].abs()).sum() };
    // The segments a partial sum is quantized in: AllReduce's owners' segments, each rank's block.
    let segs: Vec<Range<usize>> = match op {
        Op::ReduceScatter => std::iter::once(rank * c..(rank + 1) * c).collect(),
        _ => owner::segments(codec, c, per)
            .into_iter()
            .flat_map(|sl| {
                owner::segments(codec, sl.len(), hs.len())
                    .into_iter()
                    .map(move |s| sl.start + s.start..sl.start + s.end)
            })
            .collect(),
    };
    let div = if op == Op::AllReduceAvg {
        n as f64
    } else {
        1.0
    };
    let margin = (n as f64 + 1.0) * 2f64.powi(-24);
    for seg in &segs {
        for i in seg.clone() {
            let exact: f64 = x64.iter().map(|v| v[i]).sum::<f64>() / div;
            let (mut e, mut amax_sum) = (0.0, 0.0);
            for p in &partial {
                // A partial sum's block maximum, allowing for its f32 rounding.
                let a = amax(p, seg, i) * (1.0 + margin) + margin * abs_sum(i);
                let q = once(p[i].abs() + margin * abs_sum(i), scale(a));
                e += q;
                amax_sum += a + once(a, scale(a));
            }
            let sum_err = margin * (abs_sum(i) + e);
            let before = (e + sum_err) / div;
            let result = once(exact.abs() + before, scale(amax_sum / div));
            let bound = before + result + out_round(exact.abs() + before + result);
            let at = if op == Op::ReduceScatter {
                i - seg.start
            } else {
                i
            };
            let v = f64::from(got[at]);
            assert!(
                (v - exact).abs() <= bound,
                "{op:?} {f} {dt}: element {i}: got {v:e}, exact {exact:e}, bound {bound:e}"
            );
        }
    }
}

/// Deterministic data: wide dynamic range on odd ranks, within +-10 on even ones.
fn data(seed: u64, len: usize, wide: bool) -> Vec<f32> {
    nccl_net_fabricoll::testing::values::values(seed, len, wide.then_some(15))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// 2 x 2, 2 x 3 and 3 x 2: every format x collective, uneven counts (a short last block),
/// float, bfloat16 and half data, in place and out of place: the composition's bits on every rank,
/// within the bound.
#[test]
fn tiered_layouts_give_the_composition_bits_within_the_bound() {
    for (hosts_n, per) in [(2, 2), (2, 3), (3, 2)] {
        let n = hosts_n * per;
        for (fi, f) in Format::CODED.into_iter().enumerate() {
            let codec = Codec::new(f, 32).unwrap();
            let cs = comms(n, per, codec, CompressLevels::Inter);
            for (oi, op) in OPS.into_iter().enumerate() {
                let dt = match (fi + oi) % 4 {
                    2 => DataType::Bfloat16,
                    3 => DataType::Float16,
                    _ => DataType::Float32,
                };
                // Uneven: not a multiple of the block, of the ranks or of the hosts.
                let len = match op {
                    Op::ReduceScatter => n * 37,
                    _ => 301,
                };
                let x: Vec<Vec<f32>> = (0..n)
                    .map(|r| held(dt, &data((fi * 31 + oi * 7 + r) as u64, len, r % 2 == 1)))
                    .collect();
                let c = count(op, n, len);
                let want = expected_tiered(op, &codec, per, &x, c);
                let in_place = (fi + oi) % 2 == 1;
                let got = run(&cs, op, dt, &x, in_place);
                for r in 0..n {
                    let w = held(dt, &want[r]);
                    assert_eq!(
                        bits(&got[r]),
                        bits(&w),
                        "{hosts_n}x{per} {op:?} {f} {dt} in_place={in_place}: rank {r}"
                    );
                    check_bound(op, &codec, dt, per, &x, r, &got[r]);
                }
            }
        }
    }
}

/// Data whose intra-host partial sums cancel the large values: each block holds one value of
/// +-1000 that the host's other rank cancels, and small values besides. Compressing each
/// rank's contribution scales the block to 1000 and loses the small values; the host's sum in
/// full precision has only the small ones and keeps them. The result is the composition's
/// bits, differs from every level compressed, and is far closer to the exact sum.
#[test]
fn shared_memory_keeps_full_precision() {
    let codec = Codec::new(Format::Int8, 64).unwrap();
    let (n, per, len) = (4, 2, 256);
    let x: Vec<Vec<f32>> = (0..n)
        .map(|r| {
            (0..len)
                .map(|i| {
                    let big = if r % 2 == 0 { 1000.0 } else { -1000.0 };
                    if i % 64 == 0 {
                        big
                    } else {
                        0.01 * ((i * (r + 1)) % 7 + 1) as f32
                    }
                })
                .collect()
        })
        .collect();
    let exact: Vec<f64> = (0..len)
        .map(|i| x.iter().map(|v| f64::from(v[i])).sum())
        .collect();
    let err = |v: &[f32]| -> f64 {
        v.iter()
            .zip(&exact)
            .map(|(a, b)| (f64::from(*a) - b).abs())
            .fold(0.0, f64::max)
    };
    let tiered = run(
        &comms(n, per, codec, CompressLevels::Inter),
        Op::AllReduce,
        DataType::Float32,
        &x,
        false,
    );
    let flat = run(
        &comms(n, per, codec, CompressLevels::All),
        Op::AllReduce,
        DataType::Float32,
        &x,
        false,
    );
    let want = expected_tiered(Op::AllReduce, &codec, per, &x, len);
    let want_flat = expected_flat(Op::AllReduce, &codec, &x, len);
    for r in 0..n {
        assert_eq!(bits(&tiered[r]), bits(&want[r]), "tiered, rank {r}");
        assert_eq!(bits(&flat[r]), bits(&want_flat[r]), "every level, rank {r}");
    }
    assert_ne!(bits(&tiered[0]), bits(&flat[0]));
    let (et, ef) = (err(&tiered[0]), err(&flat[0]));
    // int8 of a block of 1000 has steps of about 8: the small values vanish; of a block of
    // host sums below 0.2, steps below 0.002.
    assert!(et < 2e-3, "tiered error {et}");
    assert!(ef > 1e-2, "every-level error {ef}");
}

/// Hosts of different sizes (2 + 2 + 1) compress every level: the owner rule over all ranks.
/// One host and one rank per host do too (the inter-host level is every level there).
#[test]
fn uneven_hosts_compress_every_level() {
    let codec = Codec::new(Format::Fp8E4m3, 32).unwrap();
    for (n, per) in [(5, 2), (3, 1), (3, 3)] {
        let cs = comms(n, per, codec, CompressLevels::Inter);
        for op in OPS {
            let len = match op {
                Op::ReduceScatter => n * 41,
                _ => 203,
            };
            let x: Vec<Vec<f32>> = (0..n).map(|r| data(r as u64 + 7, len, r == 1)).collect();
            let c = count(op, n, len);
            let got = run(&cs, op, DataType::Float32, &x, false);
            let want = expected_flat(op, &codec, &x, c);
            for r in 0..n {
                assert_eq!(
                    bits(&got[r]),
                    bits(&want[r]),
                    "{n} ranks, {per} per host, {op:?}: rank {r}"
                );
            }
        }
    }
}

/// What a tiered communicator reports of a call's exchanges: the composition's four (host,
/// lane, lane, host) for AllReduce; with every level compressed, the flat two.
#[test]
fn exchanges_follow_the_levels_setting() {
    let codec = Codec::new(Format::Bf16, 256).unwrap();
    let mut send = vec![0u8; 4096];
    let mut recv = vec![0u8; 4096];
    // SAFETY: the buffers outlive the calls that only describe them.
    let (s, r) = unsafe {
        (
            Region::from_raw(send.as_mut_ptr(), send.len()),
            Region::from_raw(recv.as_mut_ptr(), recv.len()),
        )
    };
    let call = common::call(Kind::Coll(Collective::AllReduce), s, r, 1024);
    let tiered = comms(4, 2, codec, CompressLevels::Inter);
    assert_eq!(
        tiered[0].exchange_algos(&call, codec).unwrap(),
        vec![
            (Collective::AllToAll, Algorithm::Pairwise),
            (Collective::AllToAll, Algorithm::Pairwise),
            (Collective::AllGather, Algorithm::Mesh),
            (Collective::AllGather, Algorithm::Mesh),
        ]
    );
    let flat = comms(4, 2, codec, CompressLevels::All);
    assert_eq!(flat[0].exchange_algos(&call, codec).unwrap().len(), 2);
}

/// Ranks that compress different levels of one call (one every level, the others the
/// inter-host level only) fail together instead of hanging, each with an error that says
/// the calls differ or names the rank it waited for.
#[test]
fn ranks_compressing_different_levels_fail_together() {
    let codec = Codec::new(Format::Int8, 64).unwrap();
    let (n, per) = (4, 2);
    let cfgs: Vec<Config> = (0..n)
        .map(|r| {
            // As tests/coll_mismatch.rs: a rank that learns nothing of the other call fails
            // at the deadline, and the test then reports that rank's error.
            let mut cfg = common::fixed_model(None, 10_000);
            cfg.compress = Compression {
                format: codec.format,
                block: codec.block,
            };
            cfg.compress_levels = if r == 0 {
                CompressLevels::All
            } else {
                CompressLevels::Inter
            };
            cfg.local_ranks = Some(per);
            cfg
        })
        .collect();
    let cs = common::comms_in_process("coll_compressed_tiered", "loopback", &cfgs).unwrap();
    let errs: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = cs
            .iter()
            .map(|comm| s.spawn(move || common::typed::ones_allreduce(comm, None)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, e) in errs.iter().enumerate() {
        assert!(e != "OK", "rank {rank} succeeded");
    }
    assert!(
        errs.iter().any(|e| e.contains("the ranks' calls differ")),
        "{errs:?}"
    );
}

/// Several non-blocking tiered calls in flight at once on every rank complete, waited for in
/// reverse order, with the composition's bits; an abort fails a tiered call that a rank of
/// the other host never joined, on the ranks that started it, without waiting for it.
#[test]
fn nonblocking_calls_in_flight_and_abort() {
    let codec = Codec::new(Format::Fp8E5m2, 64).unwrap();
    let (n, per, len) = (4, 2, 3000);
    let cs = comms(n, per, codec, CompressLevels::Inter);
    let x: Vec<Vec<f32>> = (0..n).map(|r| data(r as u64 + 40, len, r == 2)).collect();
    let want = expected_tiered(Op::AllReduce, &codec, per, &x, len);
    let got = common::on_every_rank(&cs, |rank, comm| {
        let mut bufs: Vec<Vec<f32>> = (0..3).map(|_| x[rank].clone()).collect();
        let ids: Vec<_> = bufs
            .iter_mut()
            .map(|b| {
                // SAFETY: `bufs` outlives every request, all waited for below.
                let r = unsafe { Region::from_raw(b.as_mut_ptr() as *mut u8, 4 * b.len()) };
                comm.start(&common::call(Kind::Coll(Collective::AllReduce), r, r, len))
                    .unwrap()
            })
            .collect();
        for id in ids.into_iter().rev() {
            comm.wait(id).unwrap();
        }
        bufs
    });
    for (rank, bufs) in got.iter().enumerate() {
        for b in bufs {
            assert_eq!(bits(b), bits(&want[rank]), "rank {rank}");
        }
    }
    // Ranks 0 and 1 (host 0) start a call the other host never joins; each aborts.
    let errs = common::on_every_rank(&cs[..2], |_, comm| {
        let mut v = vec![1f32; 4096];
        // SAFETY: `v` outlives the request, which fails below before `v` is dropped.
        let r = unsafe { Region::from_raw(v.as_mut_ptr() as *mut u8, 4 * v.len()) };
        let id = comm
            .start(&common::call(Kind::Coll(Collective::AllReduce), r, r, 4096))
            .unwrap();
        // Let the host's exchange run, so that the lane's is the one waiting.
        let _ = comm.test(id);
        comm.abort();
        comm.wait(id).unwrap_err().to_string()
    });
    for (rank, e) in errs.iter().enumerate() {
        assert!(e.contains("aborted"), "rank {rank}: {e}");
    }
}

/// Counts of 0, 1 and fewer blocks than lanes: some lanes and owners get nothing, and every
/// rank still ends with the composition's bits.
#[test]
fn tiny_counts_leave_lanes_empty() {
    let codec = Codec::new(Format::Bf16, 4).unwrap();
    let (n, per) = (6, 3);
    let cs = comms(n, per, codec, CompressLevels::Inter);
    for per_rank in [0, 1, 5] {
        for op in OPS {
            let len = match op {
                Op::ReduceScatter => n * per_rank,
                _ => per_rank,
            };
            let x: Vec<Vec<f32>> = (0..n).map(|r| data(r as u64 + 90, len, false)).collect();
            let want = expected_tiered(op, &codec, per, &x, count(op, n, len));
            let got = run(&cs, op, DataType::Float32, &x, per_rank == 1);
            for r in 0..n {
                assert_eq!(bits(&got[r]), bits(&want[r]), "{op:?} {len}: rank {r}");
            }
        }
    }
}

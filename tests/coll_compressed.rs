//! Compressed collectives over the transport (ranks as threads over loopback): every format x
//! AllReduce (sum, avg), ReduceScatter(V) and AllGather(V), 2 to 8 ranks, uneven counts, f32,
//! bf16 and f16 data, in place and out of place. Every rank's output must be the bits of the
//! owner arithmetic (`compress::owner`) computed here from the inputs, the same on every
//! rank, and within the documented error bound of an f64 reference (docs/compression.md);
//! NaN and infinities never come out finite; large finite values stay finite.
use nccl_net_fabricoll::algo::varied::Varied;
use nccl_net_fabricoll::algo::{self, Algorithm, Collective};
use nccl_net_fabricoll::coll::{Call, Comm, Kind};
use nccl_net_fabricoll::compress::{owner, Codec, Format};
use nccl_net_fabricoll::config::{Compression, Config};
use nccl_net_fabricoll::reduce::{DataType, RedOp};
use nccl_net_fabricoll::transport::Region;
use std::ops::Range;
use std::sync::Arc;

mod common;
use common::typed::{decode, encode, held};

const FORMATS: [Format; 6] = Format::CODED;

/// The collectives tested.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    AllReduce,
    AllReduceAvg,
    ReduceScatter,
    ReduceScatterV,
    AllGather,
    AllGatherV,
}

const OPS: [Op; 6] = [
    Op::AllReduce,
    Op::AllReduceAvg,
    Op::ReduceScatter,
    Op::ReduceScatterV,
    Op::AllGather,
    Op::AllGatherV,
];

fn comms(n: usize, compress: Compression) -> Vec<Arc<Comm>> {
    comms_within(n, compress, 60_000)
}

/// `comms` with the deadline `timeout_ms`.
fn comms_within(n: usize, compress: Compression, timeout_ms: u32) -> Vec<Arc<Comm>> {
    comms_with(n, compress, timeout_ms, None)
}

/// `comms_within` whose compressed calls are cut into chunks of about `chunk` bytes
/// (`FABRICOLL_COMPRESS_CHUNK`; 0: one chunk; None: the default).
fn comms_with(
    n: usize,
    compress: Compression,
    timeout_ms: u32,
    chunk: Option<usize>,
) -> Vec<Arc<Comm>> {
    let mut cfg = common::fixed_model(None, timeout_ms);
    cfg.compress = compress;
    cfg.compress_chunk = chunk;
    let cfgs: Vec<Config> = (0..n).map(|_| cfg.clone()).collect();
    common::comms_in_process("coll_compressed", "loopback", &cfgs).expect("loopback")
}

/// Deterministic data: wide dynamic range on odd ranks, within +-10 on even ones.
fn data(seed: u64, n: usize, wide: bool) -> Vec<f32> {
    nccl_net_fabricoll::testing::values::values(seed, n, wide.then_some(15))
}

/// One case: the per-rank segment counts (owners' segments for AllReduce, outputs for
/// ReduceScatter, inputs for AllGather), each rank's input and where each segment lands.
struct Case {
    op: Op,
    dt: DataType,
    codec: Codec,
    counts: Vec<usize>,
    /// AllGatherV: displacements (a gap between blocks, in reverse rank order).
    displs: Vec<usize>,
    inputs: Vec<Vec<f32>>,
    in_place: bool,
    /// The call's per-call algorithm (None: the communicator's).
    algo: Option<Algorithm>,
}

impl Case {
    fn n(&self) -> usize {
        self.inputs.len()
    }

    fn segs(counts: &[usize]) -> Vec<Range<usize>> {
        let mut at = 0;
        counts
            .iter()
            .map(|c| {
                at += c;
                at - c..at
            })
            .collect()
    }

    fn out_len(&self, rank: usize) -> usize {
        match self.op {
            Op::ReduceScatter | Op::ReduceScatterV => self.counts[rank],
            Op::AllGather | Op::AllGatherV => (0..self.n())
                .map(|r| self.displs[r] + self.counts[r])
                .max()
                .unwrap(),
            _ => self.counts.iter().sum(),
        }
    }

    /// Each rank's expected output, from the owner arithmetic on the held inputs.
    fn expected(&self) -> Vec<Vec<f32>> {
        let (n, c) = (self.n(), &self.codec);
        let x: Vec<Vec<f32>> = self.inputs.iter().map(|v| held(self.dt, v)).collect();
        let round = |v: Vec<f32>| held(self.dt, &v);
        match self.op {
            Op::AllGather | Op::AllGatherV => {
                let mut out = vec![0f32; self.out_len(0)];
                for r in 0..n {
                    let segs = Case::segs(&self.counts[r..=r]);
                    let codes = owner::contribute(c, &x[r], &segs).unwrap();
                    let at = self.displs[r];
                    owner::finish(c, &codes, &mut out[at..at + self.counts[r]]).unwrap();
                }
                vec![round(out); n]
            }
            _ => {
                let segs = Case::segs(&self.counts);
                let wire = owner::wire_ranges(c, &segs);
                let sent: Vec<Vec<u8>> = x
                    .iter()
                    .map(|v| owner::contribute(c, v, &segs).unwrap())
                    .collect();
                let avg = (self.op == Op::AllReduceAvg).then_some(n);
                let results: Vec<Vec<f32>> = (0..n)
                    .map(|o| {
                        let parts: Vec<&[u8]> = sent.iter().map(|s| &s[wire[o].clone()]).collect();
                        let codes = owner::reduce_segment(c, &parts, segs[o].len(), avg).unwrap();
                        let mut v = vec![0f32; segs[o].len()];
                        owner::finish(c, &codes, &mut v).unwrap();
                        round(v)
                    })
                    .collect();
                if matches!(self.op, Op::ReduceScatter | Op::ReduceScatterV) {
                    results
                } else {
                    vec![results.concat(); n]
                }
            }
        }
    }

    /// Each rank's output and the per-element bound against the exact f64 result (of the held
    /// inputs): the bound of docs/compression.md from each block's largest magnitude.
    fn check_bound(&self, rank: usize, got: &[f32]) {
        let (n, f) = (self.n(), self.codec.format);
        let x: Vec<Vec<f64>> = self
            .inputs
            .iter()
            .map(|v| held(self.dt, v).into_iter().map(f64::from).collect())
            .collect();
        let bd = common::typed::Bound {
            codec: self.codec,
            dt: self.dt,
        };
        let scale = |amax: f64| bd.scale(amax);
        let once = |v: f64, s: f64| bd.once(v, s);
        let out_round = |v: f64| bd.out_round(v);
        let block_amax = |v: &[f64], seg: &Range<usize>, i: usize| bd.block_amax(v, seg, i);
        match self.op {
            Op::AllGather | Op::AllGatherV => {
                for r in 0..n {
                    let seg = 0..self.counts[r];
                    for i in seg.clone() {
                        let exact = x[r][i];
                        let s = scale(block_amax(&x[r], &seg, i));
                        let bound = once(exact, s) + out_round(exact + once(exact, s));
                        let v = f64::from(got[self.displs[r] + i]);
                        assert!(
                            (v - exact).abs() <= bound,
                            "{:?} {f} {} n={n}: rank {rank} block {r} element {i}: got {v:e}, exact {exact:e}, bound {bound:e}",
                            self.op,
                            self.dt
                        );
                    }
                }
            }
            _ => {
                let segs = Case::segs(&self.counts);
                let owners: Vec<usize> = match self.op {
                    Op::ReduceScatter | Op::ReduceScatterV => vec![rank],
                    _ => (0..n).collect(),
                };
                let div = if self.op == Op::AllReduceAvg {
                    n as f64
                } else {
                    1.0
                };
                for o in owners {
                    let seg = &segs[o];
                    for i in seg.clone() {
                        let exact: f64 = x.iter().map(|v| v[i]).sum::<f64>() / div;
                        let (mut e, mut mag, mut amax) = (0.0, 0.0, 0.0);
                        for v in &x {
                            let a = block_amax(v, seg, i);
                            let q = once(v[i], scale(a));
                            e += q;
                            mag += v[i].abs() + q;
                            amax += a + once(a, scale(a));
                        }
                        // The f32 sum of n terms, and Avg's division.
                        let sum_err = (n as f64 + 1.0) * 2f64.powi(-24) * mag;
                        let before = (e + sum_err) / div;
                        let result = once(exact.abs() + before, scale(amax / div));
                        let bound = before + result + out_round(exact.abs() + before + result);
                        let at = if owners_all(self.op) {
                            i
                        } else {
                            i - seg.start
                        };
                        let v = f64::from(got[at]);
                        assert!(
                            (v - exact).abs() <= bound,
                            "{:?} {f} {} n={n}: rank {rank} element {i}: got {v:e}, exact {exact:e}, bound {bound:e}",
                            self.op,
                            self.dt
                        );
                    }
                }
            }
        }
    }
}

fn owners_all(op: Op) -> bool {
    matches!(op, Op::AllReduce | Op::AllReduceAvg)
}

/// Run `case` on `comms` (blocking, each rank in its thread): each rank's output.
fn run(comms: &[Arc<Comm>], case: &Case, per_call: Option<Compression>) -> Vec<Vec<f32>> {
    let n = comms.len();
    common::on_every_rank(comms, |rank, comm| {
        run_rank(comm, case, rank, per_call).unwrap_or_else(|e| {
            panic!(
                "{:?} {} {} n={n} rank {rank}: {e}",
                case.op, case.codec.format, case.dt
            )
        })
    })
}

fn run_rank(
    comm: &Comm,
    case: &Case,
    rank: usize,
    per_call: Option<Compression>,
) -> nccl_net_fabricoll::error::Result<Vec<f32>> {
    let (dt, el) = (case.dt, case.dt.size());
    let input = encode(dt, &case.inputs[rank]);
    let out_len = case.out_len(rank);
    let counts_v: Vec<usize> = case.counts.clone();
    let displs_v: Vec<usize> = case.displs.clone();
    let (kind, count) = match case.op {
        Op::AllReduce | Op::AllReduceAvg => (Kind::Coll(Collective::AllReduce), out_len),
        Op::ReduceScatter => (Kind::Coll(Collective::ReduceScatter), case.counts[0]),
        Op::AllGather => (Kind::Coll(Collective::AllGather), case.counts[0]),
        Op::ReduceScatterV | Op::AllGatherV => {
            let coll = if case.op == Op::AllGatherV {
                Varied::AllGatherV
            } else {
                Varied::ReduceScatterV
            };
            // SAFETY: both arrays outlive the blocking call, which reads them when it starts.
            let l = unsafe { common::typed::varied_layout(coll, &counts_v, &displs_v) };
            (Kind::Varied(l), case.counts[rank])
        }
    };
    let op = if case.op == Op::AllReduceAvg {
        RedOp::Avg
    } else {
        RedOp::Sum
    };
    // In place: NCCL's layouts (AllGather's input is the rank's block of the output,
    // ReduceScatter's output the rank's block of the input).
    let in_place = case.in_place.then(|| {
        let off = match case.op {
            Op::AllGather | Op::AllGatherV => case.displs[rank] * el,
            _ => 0,
        };
        let roff = match case.op {
            Op::ReduceScatter | Op::ReduceScatterV => Case::segs(&case.counts)[rank].start * el,
            _ => 0,
        };
        (off, roff)
    });
    let b = common::typed::buffers(&input, out_len * el, in_place);
    let (send, recv) = (b.send, b.recv);
    let call = Call {
        dtype: dt,
        op,
        algo: case.algo,
        ..common::call(kind, send, recv, count)
    };
    comm.run_with(&call, per_call)?;
    Ok(recv
        .to_vec()
        .chunks(el)
        .flat_map(|c| decode(dt, c))
        .collect())
}

/// The counts of `op` at `n` ranks for `total` (roughly) elements: AllReduce's one count as
/// the owners split it; uniform ones `total / n` each; V ones uneven, some empty.
fn counts(op: Op, codec: &Codec, n: usize, total: usize) -> Vec<usize> {
    match op {
        Op::AllReduce | Op::AllReduceAvg => owner::segments(codec, total, n)
            .iter()
            .map(|s| s.len())
            .collect(),
        Op::ReduceScatter | Op::AllGather => vec![total / n + 1; n],
        _ => (0..n)
            .map(|r| (r * 37 + total) % (2 * total / n + 3))
            .collect(),
    }
}

fn case(op: Op, dt: DataType, codec: Codec, n: usize, total: usize, seed: u64) -> Case {
    let counts = counts(op, &codec, n, total);
    let displs = match op {
        // Reverse rank order, one element apart.
        Op::AllGatherV => {
            let mut at = 0;
            let mut d = vec![0; n];
            for r in (0..n).rev() {
                d[r] = at;
                at += counts[r] + 1;
            }
            d
        }
        _ => Case::segs(&counts).iter().map(|s| s.start).collect(),
    };
    let in_len = |r: usize| match op {
        Op::AllGather | Op::AllGatherV => counts[r],
        _ => counts.iter().sum(),
    };
    let inputs = (0..n)
        .map(|r| data(seed * 31 + r as u64, in_len(r), r % 2 == 1))
        .collect();
    Case {
        op,
        dt,
        codec,
        counts,
        displs,
        inputs,
        in_place: seed % 2 == 1,
        algo: None,
    }
}

fn check(comms: &[Arc<Comm>], c: &Case, per_call: Option<Compression>) {
    let got = run(comms, c, per_call);
    let want = c.expected();
    for (rank, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.len(), w.len());
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(
                a.to_bits() == b.to_bits(),
                "{:?} {} {} n={} in_place={}: rank {rank} element {i}: {a:e}, the owner arithmetic gives {b:e}",
                c.op,
                c.codec.format,
                c.dt,
                c.n(),
                c.in_place
            );
        }
        c.check_bound(rank, g);
    }
}

/// Every format x collective x 2..=8 ranks, the data type and in-place-ness varying with the
/// case, the format set on the communicators (`FABRICOLL_COMPRESS`'s path).
#[test]
fn every_format_and_collective_gives_the_owner_bits_on_every_rank() {
    let dts = [DataType::Float32, DataType::Bfloat16, DataType::Float16];
    let mut seed = 0u64;
    for n in 2..=8usize {
        for f in FORMATS {
            let block = [256, 16, 7][n % 3];
            let codec = Codec::new(f, block).unwrap();
            let cs = comms(n, Compression { format: f, block });
            for op in OPS {
                seed += 1;
                let dt = dts[(seed as usize) % 3];
                let total = [1000, 1, 257, 64 * n + 3][(seed as usize) % 4];
                check(&cs, &case(op, dt, codec, n, total, seed), None);
            }
        }
    }
}

/// A per-call setting over communicators that compress nothing.
#[test]
fn a_per_call_setting_compresses_one_call() {
    let n = 3;
    let cs = comms(n, Compression::OFF);
    for f in FORMATS {
        let c = Compression {
            format: f,
            block: 32,
        };
        let codec = c.codec().unwrap();
        for (i, op) in OPS.into_iter().enumerate() {
            let case = case(op, DataType::Float32, codec, n, 500, 100 + i as u64);
            check(&cs, &case, Some(c));
        }
    }
}

/// NaN and infinities never come out finite, on every rank; other blocks stay finite. Large
/// finite values (up to f32's range) stay finite: fp8 and int8 saturate, never overflow.
#[test]
fn specials_never_come_out_finite_and_large_values_stay_finite() {
    let n = 3;
    for f in FORMATS {
        let c = Compression {
            format: f,
            block: 16,
        };
        let cs = comms(n, c);
        for special in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for op in [Op::AllReduce, Op::ReduceScatter, Op::AllGather] {
                let mut k = case(op, DataType::Float32, c.codec().unwrap(), n, 96, 7);
                k.inputs[n - 1][5] = special;
                let got = run(&cs, &k, None);
                let (rank, at) = match op {
                    Op::ReduceScatter => (0, 5),
                    Op::AllGather => (0, k.displs[n - 1] + 5),
                    _ => (0, 5),
                };
                assert!(
                    !got[rank][at].is_finite(),
                    "{f} {op:?}: {special} came out {}",
                    got[rank][at]
                );
                assert!(
                    got[rank][16..].iter().all(|v| v.is_finite()) || op == Op::AllGather,
                    "{f} {op:?}: {special} spread past its block"
                );
            }
        }
        // Large finite values whose sum still fits f32: finite, within the bound.
        let mut k = case(
            Op::AllReduce,
            DataType::Float32,
            c.codec().unwrap(),
            n,
            64,
            9,
        );
        for v in &mut k.inputs {
            v[3] = 4.0e37;
            v[20] = -3.0e37;
        }
        let got = run(&cs, &k, None);
        for g in &got {
            assert!(
                g.iter().all(|v| v.is_finite()),
                "{f}: a large value overflowed"
            );
        }
        for (rank, g) in got.iter().enumerate() {
            k.check_bound(rank, g);
        }
    }
}

/// A per-call compression of a call it cannot apply to is an error naming `compress`; the
/// communicator's setting leaves such calls as they are (exact results).
#[test]
fn calls_compression_cannot_apply_to() {
    let n = 2;
    let c = Compression {
        format: Format::Int8,
        block: 256,
    };
    let cs = comms(n, c);
    let results: Vec<(String, Vec<i32>)> = std::thread::scope(|s| {
        let hs: Vec<_> = cs
            .iter()
            .enumerate()
            .map(|(rank, comm)| {
                s.spawn(move || {
                    let mut v: Vec<i32> = (0..100).map(|i| i * (rank as i32 + 1)).collect();
                    // SAFETY: `v` outlives both blocking calls.
                    let r = unsafe { Region::from_raw(v.as_mut_ptr() as *mut u8, 400) };
                    let call = Call {
                        dtype: DataType::Int32,
                        ..common::call(Kind::Coll(Collective::AllReduce), r, r, 100)
                    };
                    let e = comm.run_with(&call, Some(c)).unwrap_err().to_string();
                    comm.run(&call).unwrap();
                    (e, v)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (e, v) in results {
        assert!(e.contains("'compress'") && e.contains("int32"), "{e}");
        assert_eq!(v, (0..100).map(|i| 3 * i).collect::<Vec<i32>>());
    }
}

/// Ranks asking for different formats or block sizes in one call fail together, each with an
/// error naming the setting that differs, one chunk or pipelined (the ranks' cuts differ
/// where their blocks do).
#[test]
fn ranks_asking_for_different_compression_fail_naming_it() {
    for chunk in [None, Some(1)] {
        different_compression_fails_naming_it(chunk);
    }
}

fn different_compression_fails_naming_it(chunk: Option<usize>) {
    let n = 2;
    // As tests/coll_mismatch.rs: a rank that learns nothing of the other call fails at the
    // deadline, and the test would then report that rank's error.
    let cs = comms_with(n, Compression::OFF, 10_000, chunk);
    let fp8 = Compression {
        format: Format::Fp8E4m3,
        block: 256,
    };
    let cases: [([Compression; 2], [&str; 2]); 3] = [
        (
            [
                fp8,
                Compression {
                    format: Format::Fp16,
                    ..fp8
                },
            ],
            [
                "rank 1 passed compress fp16",
                "rank 0 passed compress fp8e4m3",
            ],
        ),
        (
            [fp8, Compression { block: 64, ..fp8 }],
            [
                "rank 1 passed compress block 64",
                "rank 0 passed compress block 256",
            ],
        ),
        (
            [fp8, Compression::OFF],
            [
                "rank 1 runs it uncompressed",
                "rank 0 passed compress fp8e4m3",
            ],
        ),
    ];
    for (settings, said) in cases {
        let errs: Vec<String> = std::thread::scope(|s| {
            let hs: Vec<_> = cs
                .iter()
                .zip(settings)
                .map(|(comm, c)| s.spawn(move || common::typed::ones_allreduce(comm, Some(c))))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (rank, e) in errs.iter().enumerate() {
            assert!(
                e.contains("the ranks' calls differ") && e.contains(said[rank]),
                "{settings:?} chunk {chunk:?}: rank {rank}: {e}"
            );
        }
    }
}

/// Non-blocking compressed calls, several in flight at once, complete with the same bits as
/// blocking ones, one chunk each or pipelined.
#[test]
fn several_nonblocking_compressed_calls_in_flight() {
    for chunk in [None, Some(1)] {
        nonblocking_calls_in_flight(chunk);
    }
}

fn nonblocking_calls_in_flight(chunk: Option<usize>) {
    let n = 4;
    let c = Compression {
        format: Format::Fp8E5m2,
        block: 64,
    };
    let cs = comms_with(n, c, 60_000, chunk);
    let k = case(
        Op::AllReduce,
        DataType::Float32,
        c.codec().unwrap(),
        n,
        3000,
        4,
    );
    let want = k.expected();
    let got: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
        let hs: Vec<_> = cs
            .iter()
            .enumerate()
            .map(|(rank, comm)| {
                let k = &k;
                s.spawn(move || {
                    let mut bufs: Vec<Vec<f32>> = (0..3).map(|_| k.inputs[rank].clone()).collect();
                    let ids: Vec<_> = bufs
                        .iter_mut()
                        .map(|b| {
                            // SAFETY: `bufs` outlives every request, all waited for below.
                            let r =
                                unsafe { Region::from_raw(b.as_mut_ptr() as *mut u8, 4 * b.len()) };
                            let call =
                                common::call(Kind::Coll(Collective::AllReduce), r, r, b.len());
                            comm.start(&call).unwrap()
                        })
                        .collect();
                    for id in ids.into_iter().rev() {
                        comm.wait(id).unwrap();
                    }
                    bufs
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, bufs) in got.iter().enumerate() {
        for b in bufs {
            assert!(b
                .iter()
                .zip(&want[rank])
                .all(|(x, y)| x.to_bits() == y.to_bits()));
        }
    }
    // Ranks 0 and 1 start a call the others never join; each aborts it in flight.
    let errs = common::on_every_rank(&cs[..2], |_, comm| {
        let mut v = vec![1f32; 3000];
        // SAFETY: `v` outlives the request, which fails below before `v` is dropped.
        let r = unsafe { Region::from_raw(v.as_mut_ptr() as *mut u8, 4 * v.len()) };
        let id = comm
            .start(&common::call(
                Kind::Coll(Collective::AllReduce),
                r,
                r,
                v.len(),
            ))
            .unwrap();
        for _ in 0..10 {
            let _ = comm.test(id);
        }
        comm.abort();
        comm.wait(id).unwrap_err().to_string()
    });
    for (rank, e) in errs.iter().enumerate() {
        assert!(e.contains("aborted"), "chunk {chunk:?}: rank {rank}: {e}");
    }
}

/// A pipelined call whose partner never comes fails at the deadline, naming it, as one chunk
/// does (the deadline is what this tests).
#[test]
fn a_pipelined_call_alone_fails_at_the_deadline() {
    let c = Compression {
        format: Format::Int8,
        block: 16,
    };
    for chunk in [0, 1] {
        let cs = comms_with(2, c, 500, Some(chunk));
        let mut v = vec![1f32; 3000];
        // SAFETY: `v` outlives the blocking call.
        let r = unsafe { Region::from_raw(v.as_mut_ptr() as *mut u8, 4 * v.len()) };
        let call = common::call(Kind::Coll(Collective::AllReduce), r, r, v.len());
        let e = cs[0].run(&call).unwrap_err().to_string();
        assert!(e.contains("timeout"), "chunk {chunk}: {e}");
    }
}

/// A forced algorithm runs each exchange it implements (AllToAll: mesh, bruck, pairwise;
/// AllGather: ring, bidir_ring, mesh, rdh, bruck, hier, swizzle); the others run as the cost
/// model chooses for them. The results are the owner's bits whichever algorithms run.
#[test]
fn a_forced_algorithm_runs_the_exchanges_it_implements() {
    let n = 4;
    let c = Compression {
        format: Format::Int8,
        block: 32,
    };
    let codec = c.codec().unwrap();
    let cs = comms(n, c);
    let r = Region::empty();
    for (i, op) in [Op::AllReduce, Op::ReduceScatter, Op::AllGather]
        .into_iter()
        .enumerate()
    {
        let coll = match op {
            Op::AllReduce => Collective::AllReduce,
            Op::ReduceScatter => Collective::ReduceScatter,
            _ => Collective::AllGather,
        };
        let probe = |algo| Call {
            algo,
            ..common::call(Kind::Coll(coll), r, r, 777)
        };
        let auto = cs[0].exchange_algos(&probe(None), codec).unwrap();
        for a in Algorithm::ALL {
            if !algo::supports(a, coll) {
                continue;
            }
            let got = cs[0].exchange_algos(&probe(Some(a)), codec).unwrap();
            assert_eq!(got.len(), auto.len());
            for ((x, chosen), (_, model)) in got.iter().zip(&auto) {
                let want = if algo::supports(a, *x) { a } else { *model };
                assert_eq!(*chosen, want, "{op:?} forced {a}: the {x:?} exchange");
            }
            let mut k = case(op, DataType::Float32, codec, n, 700, 300 + i as u64);
            k.algo = Some(a);
            check(&cs, &k, None);
        }
    }
}

/// `comms` whose compressed calls are cut into chunks of about `chunk` bytes.
fn comms_chunked(n: usize, compress: Compression, chunk: usize) -> Vec<Arc<Comm>> {
    comms_with(n, compress, 60_000, Some(chunk))
}

/// A pipelined call (chunks of one block of every segment, or as few more as the most chunks
/// a call takes allow) gives the bits of one chunk on every rank, and the owner arithmetic's:
/// every format x collective, f32, bf16 and f16, in place and out of place, uneven counts.
#[test]
fn pipelined_calls_give_the_bits_of_one_chunk() {
    let dts = [DataType::Float32, DataType::Bfloat16, DataType::Float16];
    let mut seed = 1000u64;
    for (n, block) in [(2, 16), (3, 7), (4, 256)] {
        for f in FORMATS {
            let c = Compression { format: f, block };
            let codec = Codec::new(f, block).unwrap();
            let (piped, whole) = (comms_chunked(n, c, 1), comms_chunked(n, c, 0));
            for op in OPS {
                seed += 1;
                let dt = dts[(seed as usize) % 3];
                let total = [1000, 5000, 64 * n + 3][(seed as usize) % 3];
                let case = case(op, dt, codec, n, total, seed);
                let (a, b) = (run(&piped, &case, None), run(&whole, &case, None));
                let want = case.expected();
                for rank in 0..n {
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    let what = format!(
                        "{op:?} {f} {dt} n={n} in_place={} rank {rank}",
                        case.in_place
                    );
                    assert_eq!(
                        bits(&a[rank]),
                        bits(&b[rank]),
                        "{what}: pipelined vs one chunk"
                    );
                    assert_eq!(
                        bits(&a[rank]),
                        bits(&want[rank]),
                        "{what}: owner arithmetic"
                    );
                }
            }
        }
    }
}

/// An AllReduce whose output overlaps its input shifted (not NCCL's in place; by part of an
/// element, one element, or several chunks, past those quantized ahead) gives, pipelined, the
/// bits of the same call out of place: a chunk's output must not reach a later chunk's input.
#[test]
fn a_pipelined_call_whose_output_overlaps_its_input_reads_the_input_first() {
    let (n, count) = (3usize, 3000usize);
    let c = Compression {
        format: Format::Int8,
        block: 16,
    };
    let comms = comms_chunked(n, c, 1);
    let inputs: Vec<Vec<f32>> = (0..n).map(|r| data(77 + r as u64, count, r == 1)).collect();
    let results = |shift: Option<usize>| {
        common::on_every_rank(&comms, |rank, comm| {
            let bytes: Vec<u8> = inputs[rank].iter().flat_map(|x| x.to_ne_bytes()).collect();
            let len = count * 4;
            let mut buf = vec![0u8; len + 1024];
            let mut out = vec![0u8; len];
            buf[..len].copy_from_slice(&bytes);
            let p = buf.as_mut_ptr();
            // SAFETY: both regions lie within `buf` or `out`, which outlive the blocking call.
            let (send, recv) = unsafe {
                match shift {
                    Some(s) => (Region::from_raw(p, len), Region::from_raw(p.add(s), len)),
                    None => (
                        Region::from_raw(p, len),
                        Region::from_raw(out.as_mut_ptr(), len),
                    ),
                }
            };
            let call = common::call(Kind::Coll(Collective::AllReduce), send, recv, count);
            comm.run(&call).unwrap();
            recv.to_vec()
        })
    };
    let apart = results(None);
    for shift in [2, 4, 800] {
        assert_eq!(
            results(Some(shift)),
            apart,
            "output {shift} bytes past the input"
        );
    }
}

//! What the compressed-collective tests share (ranks as threads over loopback): the
//! collectives tested, communicators, deterministic data, and a case's run and its check
//! against the owner arithmetic (`compress::owner`) computed here from the inputs.
#![allow(dead_code)] // not every test binary uses each helper
use crate::common;
use crate::common::typed::{decode, encode, held};
use nccl_net_fabricoll::algo::varied::Varied;
use nccl_net_fabricoll::algo::{Algorithm, Collective};
use nccl_net_fabricoll::coll::{Call, Comm, Kind};
use nccl_net_fabricoll::compress::{owner, Codec, Format};
use nccl_net_fabricoll::config::{Compression, Config};
use nccl_net_fabricoll::reduce::{DataType, RedOp};
use std::ops::Range;
use std::sync::Arc;

pub const FORMATS: [Format; 6] = Format::CODED;

/// The collectives tested.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    AllReduce,
    AllReduceAvg,
    ReduceScatter,
    ReduceScatterV,
    AllGather,
    AllGatherV,
}

pub const OPS: [Op; 6] = [
    Op::AllReduce,
    Op::AllReduceAvg,
    Op::ReduceScatter,
    Op::ReduceScatterV,
    Op::AllGather,
    Op::AllGatherV,
];

pub fn comms(n: usize, compress: Compression) -> Vec<Arc<Comm>> {
    comms_within(n, compress, 60_000)
}

/// `comms` with the deadline `timeout_ms`.
pub fn comms_within(n: usize, compress: Compression, timeout_ms: u32) -> Vec<Arc<Comm>> {
    comms_with(n, compress, timeout_ms, None)
}

/// `comms_within` whose compressed calls are cut into chunks of about `chunk` bytes
/// (`FABRICOLL_COMPRESS_CHUNK`; 0: one chunk; None: the default).
pub fn comms_with(
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

/// `n` ranks on hosts of `per` consecutive ranks (`FABRICOLL_LOCAL_RANKS`: the inter-host
/// level alone compressed, docs/compression.md "Levels"), chunks of about `chunk` bytes.
pub fn comms_on_hosts(n: usize, per: usize, compress: Compression, chunk: usize) -> Vec<Arc<Comm>> {
    let mut cfg = common::fixed_model(None, 60_000);
    cfg.compress = compress;
    cfg.compress_chunk = Some(chunk);
    cfg.local_ranks = Some(per);
    let cfgs: Vec<Config> = (0..n).map(|_| cfg.clone()).collect();
    common::comms_in_process("coll_compressed", "loopback", &cfgs).expect("loopback")
}

/// Deterministic data: wide dynamic range on odd ranks, within +-10 on even ones.
pub fn data(seed: u64, n: usize, wide: bool) -> Vec<f32> {
    nccl_net_fabricoll::testing::values::values(seed, n, wide.then_some(15))
}

/// One case: the per-rank segment counts (owners' segments for AllReduce, outputs for
/// ReduceScatter, inputs for AllGather), each rank's input and where each segment lands.
pub struct Case {
    pub op: Op,
    pub dt: DataType,
    pub codec: Codec,
    pub counts: Vec<usize>,
    /// AllGatherV: displacements (a gap between blocks, in reverse rank order).
    pub displs: Vec<usize>,
    pub inputs: Vec<Vec<f32>>,
    pub in_place: bool,
    /// The call's per-call algorithm (None: the communicator's).
    pub algo: Option<Algorithm>,
}

impl Case {
    pub fn n(&self) -> usize {
        self.inputs.len()
    }

    pub fn segs(counts: &[usize]) -> Vec<Range<usize>> {
        let mut at = 0;
        counts
            .iter()
            .map(|c| {
                at += c;
                at - c..at
            })
            .collect()
    }

    pub fn out_len(&self, rank: usize) -> usize {
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
    pub fn expected(&self) -> Vec<Vec<f32>> {
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
    pub fn check_bound(&self, rank: usize, got: &[f32]) {
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

pub fn owners_all(op: Op) -> bool {
    matches!(op, Op::AllReduce | Op::AllReduceAvg)
}

/// Run `case` on `comms` (blocking, each rank in its thread): each rank's output.
pub fn run(comms: &[Arc<Comm>], case: &Case, per_call: Option<Compression>) -> Vec<Vec<f32>> {
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

pub fn run_rank(
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
pub fn counts(op: Op, codec: &Codec, n: usize, total: usize) -> Vec<usize> {
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

pub fn case(op: Op, dt: DataType, codec: Codec, n: usize, total: usize, seed: u64) -> Case {
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

pub fn check(comms: &[Arc<Comm>], c: &Case, per_call: Option<Compression>) {
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

/// `comms` whose compressed calls are cut into chunks of about `chunk` bytes.
pub fn comms_chunked(n: usize, compress: Compression, chunk: usize) -> Vec<Arc<Comm>> {
    comms_with(n, compress, 60_000, Some(chunk))
}

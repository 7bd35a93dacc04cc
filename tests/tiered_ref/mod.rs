//! The reference of tests/coll_compressed_tiered.rs: its calls (`Op`, `Case`) and the results
//! they must give, computed here from the inputs as docs/compression.md ("Levels") describes the
//! inter-host-only composition (each host's full-precision partial sums, the owner rule among
//! each lane, the decoded result handed on inside the host) and as every level compressed, with
//! the documented bound against an f64 reference (`check_bound`).
use nccl_net_fabricoll::compress::{owner, Codec};
use nccl_net_fabricoll::reduce::DataType;
use std::ops::Range;

use super::common::typed::held;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    AllReduce,
    AllReduceAvg,
    ReduceScatter,
    AllGather,
    ReduceScatterV,
    ReduceScatterVAvg,
    AllGatherV,
}

pub const OPS: [Op; 4] = [
    Op::AllReduce,
    Op::AllReduceAvg,
    Op::ReduceScatter,
    Op::AllGather,
];

pub const ALL_OPS: [Op; 7] = [
    Op::AllReduce,
    Op::AllReduceAvg,
    Op::ReduceScatter,
    Op::AllGather,
    Op::ReduceScatterV,
    Op::ReduceScatterVAvg,
    Op::AllGatherV,
];

impl Op {
    pub fn reduces(self) -> bool {
        !matches!(self, Op::AllGather | Op::AllGatherV)
    }

    pub fn scatters(self) -> bool {
        matches!(
            self,
            Op::ReduceScatter | Op::ReduceScatterV | Op::ReduceScatterVAvg
        )
    }

    pub fn avg(self) -> bool {
        matches!(self, Op::AllReduceAvg | Op::ReduceScatterVAvg)
    }
}

/// Host labels of `n` ranks in hosts of `per` consecutive ranks.
pub fn blocks_of(n: usize, per: usize) -> Vec<usize> {
    (0..n).map(|r| r / per).collect()
}

/// The ranks of each host, in rank order, hosts in order of their first rank.
pub fn hosts(labels: &[usize]) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = Vec::new();
    let mut hs: Vec<Vec<usize>> = Vec::new();
    for (r, h) in labels.iter().enumerate() {
        match order.iter().position(|o| o == h) {
            Some(i) => hs[i].push(r),
            None => {
                order.push(*h);
                hs.push(vec![r]);
            }
        }
    }
    hs
}

/// One call: each rank's input, and its segment (start, count) of the call's vector
/// (ReduceScatter: of the input, packed; AllGather: of the output); AllReduce: the count.
pub struct Case {
    pub op: Op,
    pub dt: DataType,
    pub x: Vec<Vec<f32>>,
    pub blocks: Vec<(usize, usize)>,
    pub count: usize,
    pub in_place: bool,
}

impl Case {
    /// `op` on `n` ranks: uniform collectives of `len` elements per rank's input (AllReduce)
    /// or output (the others), V collectives with uneven counts (0 and 1 among them; the
    /// AllGatherV's blocks in reverse rank order, one element apart).
    pub fn new(op: Op, dt: DataType, n: usize, len: usize, seed: u64, in_place: bool) -> Case {
        let counts: Vec<usize> = match op {
            Op::ReduceScatterV | Op::ReduceScatterVAvg | Op::AllGatherV => (0..n)
                .map(|r| [0, 1, len, 7, len / 3 + 33, 64][(r + seed as usize) % 6])
                .collect(),
            _ => vec![len; n],
        };
        let mut blocks = vec![(0, 0); n];
        let mut at = 0;
        let order: Vec<usize> = match op {
            Op::AllGatherV => (0..n).rev().collect(),
            _ => (0..n).collect(),
        };
        for r in order {
            blocks[r] = (at, counts[r]);
            at += counts[r] + usize::from(op == Op::AllGatherV);
        }
        let in_len = |r: usize| match op {
            Op::AllReduce | Op::AllReduceAvg => len,
            Op::AllGather | Op::AllGatherV => counts[r],
            _ => counts.iter().sum(),
        };
        let x = (0..n)
            .map(|r| held(dt, &data(seed * 31 + r as u64, in_len(r), r % 2 == 1)))
            .collect();
        Case {
            op,
            dt,
            x,
            blocks,
            count: len,
            in_place,
        }
    }

    /// AllReduce (or any uniform `op`) of `count` on the inputs `x`, out of place.
    pub fn of(op: Op, x: Vec<Vec<f32>>, count: usize) -> Case {
        let n = x.len();
        Case {
            op,
            dt: DataType::Float32,
            blocks: (0..n).map(|r| (r * count, count)).collect(),
            x,
            count,
            in_place: false,
        }
    }

    pub fn n(&self) -> usize {
        self.x.len()
    }

    /// Elements of rank `r`'s output.
    pub fn out_len(&self, r: usize) -> usize {
        match self.op {
            Op::AllReduce | Op::AllReduceAvg => self.count,
            _ if self.op.scatters() => self.blocks[r].1,
            _ => self.blocks.iter().map(|b| b.0 + b.1).max().unwrap_or(0),
        }
    }
}

/// Quantize `v` and decode it again (one round trip of `codec`).
pub fn round_trip(codec: &Codec, v: &[f32]) -> Vec<f32> {
    let all = 0..v.len();
    let codes = owner::contribute(codec, v, std::slice::from_ref(&all)).unwrap();
    let mut out = vec![0f32; v.len()];
    owner::finish(codec, &codes, &mut out).unwrap();
    out
}

/// The f32 sum of the ranks' `x[r][range]` in the order of `ranks` (the first, then each next).
pub fn sum_in_order(x: &[Vec<f32>], ranks: &[usize], range: Range<usize>) -> Vec<f32> {
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
pub fn owner_rule(codec: &Codec, parts: &[Vec<f32>], avg: Option<usize>) -> Vec<f32> {
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

/// AllReduce's segments on `hosts` hosts with `lanes` lanes: each lane's slice of whole
/// blocks cut into one segment of whole blocks per host.
pub fn all_reduce_segments(
    codec: &Codec,
    c: usize,
    lanes: usize,
    hosts: usize,
) -> Vec<Range<usize>> {
    owner::segments(codec, c, lanes)
        .into_iter()
        .flat_map(|sl| {
            owner::segments(codec, sl.len(), hosts)
                .into_iter()
                .map(move |s| sl.start + s.start..sl.start + s.end)
        })
        .collect()
}

/// Every rank's expected output of the inter-host-only composition (docs/compression.md):
/// as many lanes as the smallest host has ranks.
pub fn expected_tiered(codec: &Codec, labels: &[usize], c: &Case) -> Vec<Vec<f32>> {
    let (n, x) = (c.n(), &c.x);
    let hs = hosts(labels);
    let lanes = hs.iter().map(Vec::len).min().unwrap();
    let avg = c.op.avg().then_some(n);
    let host_rule = |range: Range<usize>| {
        let parts: Vec<Vec<f32>> = hs
            .iter()
            .map(|h| sum_in_order(x, h, range.clone()))
            .collect();
        owner_rule(codec, &parts, avg)
    };
    match c.op {
        Op::AllReduce | Op::AllReduceAvg => {
            let mut out = vec![0f32; c.count];
            for at in all_reduce_segments(codec, c.count, lanes, hs.len()) {
                out[at.clone()].copy_from_slice(&host_rule(at));
            }
            vec![out; n]
        }
        _ if c.op.scatters() => (0..n)
            .map(|r| host_rule(c.blocks[r].0..c.blocks[r].0 + c.blocks[r].1))
            .collect(),
        _ => vec![gathered(codec, c); n],
    }
}

/// AllGather(V)'s output: every rank's input quantized once, decoded into its block.
pub fn gathered(codec: &Codec, c: &Case) -> Vec<f32> {
    let mut out = vec![0f32; c.out_len(0)];
    for (r, &(at, len)) in c.blocks.iter().enumerate() {
        out[at..at + len].copy_from_slice(&round_trip(codec, &c.x[r]));
    }
    out
}

/// Every rank's expected output with every level compressed (the owner rule over all ranks).
pub fn expected_flat(codec: &Codec, c: &Case) -> Vec<Vec<f32>> {
    let (n, x) = (c.n(), &c.x);
    let avg = c.op.avg().then_some(n);
    let rule = |range: Range<usize>| {
        let parts: Vec<Vec<f32>> = x.iter().map(|v| v[range.clone()].to_vec()).collect();
        owner_rule(codec, &parts, avg)
    };
    match c.op {
        Op::AllReduce | Op::AllReduceAvg => {
            vec![
                owner::segments(codec, c.count, n)
                    .into_iter()
                    .flat_map(rule)
                    .collect();
                n
            ]
        }
        _ if c.op.scatters() => (0..n)
            .map(|r| rule(c.blocks[r].0..c.blocks[r].0 + c.blocks[r].1))
            .collect(),
        _ => vec![gathered(codec, c); n],
    }
}

/// The bound of docs/compression.md for the composition, per element, against the exact f64
/// result of the held inputs: each host's partial sum quantized once (its block's scale from
/// the partial sums' largest magnitude), the f32 sums, and the owner's result quantized once.
pub fn check_bound(codec: &Codec, labels: &[usize], c: &Case, rank: usize, got: &[f32]) {
    let (n, f, op, dt) = (c.n(), codec.format, c.op, c.dt);
    let bd = super::common::typed::Bound { codec: *codec, dt };
    let scale = |amax: f64| bd.scale(amax);
    let once = |v: f64, s: f64| bd.once(v, s);
    let out_round = |v: f64| bd.out_round(v);
    let x64: Vec<Vec<f64>> =
        c.x.iter()
            .map(|v| v.iter().map(|&y| f64::from(y)).collect())
            .collect();
    let amax = |v: &[f64], seg: &Range<usize>, i: usize| bd.block_amax(v, seg, i);
    if !op.reduces() {
        for (r, &(at, len)) in c.blocks.iter().enumerate() {
            let seg = 0..len;
            for i in seg.clone() {
                let exact = x64[r][i];
                let s = scale(amax(&x64[r], &seg, i));
                let bound = once(exact, s) + out_round(exact.abs() + once(exact, s));
                let v = f64::from(got[at + i]);
                assert!(
                    (v - exact).abs() <= bound,
                    "{op:?} {f}: block {r} element {i}: {v:e} vs {exact:e}, bound {bound:e}"
                );
            }
        }
        return;
    }
    // The hosts' partial sums (f64; their f32 rounding is in the margin below).
    let hs = hosts(labels);
    let len = x64[0].len();
    let partial: Vec<Vec<f64>> = hs
        .iter()
        .map(|h| {
            (0..len)
                .map(|i| h.iter().map(|&r| x64[r][i]).sum())
                .collect()
        })
        .collect();
    let abs_sum = |i: usize| -> f64 { x64.iter().map(|v| v[i].abs()).sum() };
    // The segments a partial sum is quantized in: AllReduce's owners' segments, each rank's block.
    let lanes = hs.iter().map(Vec::len).min().unwrap();
    let segs: Vec<Range<usize>> = if op.scatters() {
        let (at, len) = c.blocks[rank];
        std::iter::once(at..at + len).collect()
    } else {
        all_reduce_segments(codec, c.count, lanes, hs.len())
    };
    let div = if op.avg() { n as f64 } else { 1.0 };
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
            let at = if op.scatters() { i - seg.start } else { i };
            let v = f64::from(got[at]);
            assert!(
                (v - exact).abs() <= bound,
                "{op:?} {f} {dt}: element {i}: got {v:e}, exact {exact:e}, bound {bound:e}"
            );
        }
    }
}

/// Deterministic data: wide dynamic range on odd ranks, within +-10 on even ones.
pub fn data(seed: u64, len: usize, wide: bool) -> Vec<f32> {
    nccl_net_fabricoll::testing::values::values(seed, len, wide.then_some(15))
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

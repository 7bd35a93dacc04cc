//! Compressed collectives on several hosts (ranks as threads over loopback, hosts from
//! `FABRICOLL_LOCAL_RANKS` or from each rank's host in its envelope): the inter-host level
//! alone is compressed (docs/compression.md, "Levels"), on hosts of equal size (2 x 2, 2 x 3,
//! 3 x 2) and of different sizes (2 + 2 + 1, 3 + 2, 1 + 2, 3 + 1 + 2, interleaved 3 + 2 + 1),
//! uniform and V collectives. Every rank's output must be the bits of the composition computed
//! here from the inputs (the host's full-precision partial sums, the owner rule among each
//! lane, the decoded result handed on inside the host), the same on every rank, and within the
//! documented bound of an f64 reference; data whose intra-host partial sums cancel shows that
//! shared memory kept full precision (the result differs from, and is far closer than, every
//! level compressed). One host, one rank per host and `FABRICOLL_COMPRESS_LEVELS=all` compress
//! every level.
use nccl_net_fabricoll::algo::varied::Varied;
use nccl_net_fabricoll::algo::{Algorithm, Collective};
use nccl_net_fabricoll::coll::agree::Envelope;
use nccl_net_fabricoll::coll::{Call, Comm, Kind};
use nccl_net_fabricoll::compress::{owner, Codec, Format};
use nccl_net_fabricoll::config::{CompressLevels, Compression, Config};
use nccl_net_fabricoll::reduce::{DataType, RedOp};
use nccl_net_fabricoll::transport::loopback::LoopbackFabric;
use nccl_net_fabricoll::transport::{Region, Transport};
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
    ReduceScatterV,
    ReduceScatterVAvg,
    AllGatherV,
}

const OPS: [Op; 4] = [
    Op::AllReduce,
    Op::AllReduceAvg,
    Op::ReduceScatter,
    Op::AllGather,
];

const ALL_OPS: [Op; 7] = [
    Op::AllReduce,
    Op::AllReduceAvg,
    Op::ReduceScatter,
    Op::AllGather,
    Op::ReduceScatterV,
    Op::ReduceScatterVAvg,
    Op::AllGatherV,
];

impl Op {
    fn reduces(self) -> bool {
        !matches!(self, Op::AllGather | Op::AllGatherV)
    }

    fn scatters(self) -> bool {
        matches!(
            self,
            Op::ReduceScatter | Op::ReduceScatterV | Op::ReduceScatterVAvg
        )
    }

    fn avg(self) -> bool {
        matches!(self, Op::AllReduceAvg | Op::ReduceScatterVAvg)
    }
}

fn config(codec: Codec, levels: CompressLevels) -> Config {
    let mut cfg = common::fixed_model(None, 60_000);
    cfg.compress = Compression {
        format: codec.format,
        block: codec.block,
    };
    cfg.compress_levels = levels;
    cfg
}

/// `n` ranks in hosts of `per` consecutive ranks (`FABRICOLL_LOCAL_RANKS`), compressing with
/// `codec` on `levels`.
fn comms(n: usize, per: usize, codec: Codec, levels: CompressLevels) -> Vec<Arc<Comm>> {
    let mut cfg = config(codec, levels);
    cfg.local_ranks = Some(per);
    let cfgs: Vec<Config> = (0..n).map(|_| cfg.clone()).collect();
    common::comms_in_process("coll_compressed_tiered", "loopback", &cfgs).expect("loopback")
}

/// Ranks on the hosts `labels` (rank r on host `labels[r]`), as their envelopes say.
fn comms_on(labels: &[usize], codec: Codec, levels: CompressLevels) -> Vec<Arc<Comm>> {
    let cfg = config(codec, levels);
    let f = LoopbackFabric::new();
    let eps: Vec<Arc<dyn Transport>> = labels
        .iter()
        .map(|_| Arc::new(f.endpoint()) as Arc<dyn Transport>)
        .collect();
    let envelopes: Vec<Vec<u8>> = eps
        .iter()
        .zip(labels)
        .map(|(e, &h)| {
            let mut v = Envelope::here(&**e, &cfg);
            v.host = h as u64 + 1;
            v.to_bytes()
        })
        .collect();
    eps.into_iter()
        .enumerate()
        .map(|(r, e)| Arc::new(Comm::agreed(r, e, &envelopes, &cfg).unwrap()))
        .collect()
}

/// Host labels of `n` ranks in hosts of `per` consecutive ranks.
fn blocks_of(n: usize, per: usize) -> Vec<usize> {
    (0..n).map(|r| r / per).collect()
}

/// The ranks of each host, in rank order, hosts in order of their first rank.
fn hosts(labels: &[usize]) -> Vec<Vec<usize>> {
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
struct Case {
    op: Op,
    dt: DataType,
    x: Vec<Vec<f32>>,
    blocks: Vec<(usize, usize)>,
    count: usize,
    in_place: bool,
}

impl Case {
    /// `op` on `n` ranks: uniform collectives of `len` elements per rank's input (AllReduce)
    /// or output (the others), V collectives with uneven counts (0 and 1 among them; the
    /// AllGatherV's blocks in reverse rank order, one element apart).
    fn new(op: Op, dt: DataType, n: usize, len: usize, seed: u64, in_place: bool) -> Case {
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
    fn of(op: Op, x: Vec<Vec<f32>>, count: usize) -> Case {
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

    fn n(&self) -> usize {
        self.x.len()
    }

    /// Elements of rank `r`'s output.
    fn out_len(&self, r: usize) -> usize {
        match self.op {
            Op::AllReduce | Op::AllReduceAvg => self.count,
            _ if self.op.scatters() => self.blocks[r].1,
            _ => self.blocks.iter().map(|b| b.0 + b.1).max().unwrap_or(0),
        }
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

/// AllReduce's segments on `hosts` hosts with `lanes` lanes: each lane's slice of whole
/// blocks cut into one segment of whole blocks per host.
fn all_reduce_segments(codec: &Codec, c: usize, lanes: usize, hosts: usize) -> Vec<Range<usize>> {
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
fn expected_tiered(codec: &Codec, labels: &[usize], c: &Case) -> Vec<Vec<f32>> {
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
fn gathered(codec: &Codec, c: &Case) -> Vec<f32> {
    let mut out = vec![0f32; c.out_len(0)];
    for (r, &(at, len)) in c.blocks.iter().enumerate() {
        out[at..at + len].copy_from_slice(&round_trip(codec, &c.x[r]));
    }
    out
}

/// Every rank's expected output with every level compressed (the owner rule over all ranks).
fn expected_flat(codec: &Codec, c: &Case) -> Vec<Vec<f32>> {
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

/// Run `c` on every rank (blocking, a thread each), in place or not: each rank's output.
fn run(comms: &[Arc<Comm>], c: &Case) -> Vec<Vec<f32>> {
    let n = comms.len();
    let (dt, el) = (c.dt, c.dt.size());
    common::on_every_rank(comms, |rank, comm| {
        let input = encode(dt, &c.x[rank]);
        let ol = c.out_len(rank);
        // NCCL's in-place layouts: AllGather's input is its block of the output,
        // ReduceScatter's output its block of the input.
        let at = c.blocks[rank].0 * el;
        let b = common::typed::buffers(
            &input,
            ol * el,
            c.in_place.then_some(match c.op {
                _ if c.op.scatters() => (0, at),
                Op::AllGather | Op::AllGatherV => (at, 0),
                _ => (0, 0),
            }),
        );
        let (send, recv) = (b.send, b.recv);
        let counts: Vec<usize> = c.blocks.iter().map(|b| b.1).collect();
        let displs: Vec<usize> = c.blocks.iter().map(|b| b.0).collect();
        let (kind, count) = match c.op {
            Op::AllReduce | Op::AllReduceAvg => (Kind::Coll(Collective::AllReduce), c.count),
            Op::ReduceScatter => (Kind::Coll(Collective::ReduceScatter), c.count),
            Op::AllGather => (Kind::Coll(Collective::AllGather), c.count),
            _ => {
                let v = if c.op == Op::AllGatherV {
                    Varied::AllGatherV
                } else {
                    Varied::ReduceScatterV
                };
                // SAFETY: both arrays outlive the blocking call, which reads them when it
                // starts.
                let l = unsafe { common::typed::varied_layout(v, &counts, &displs) };
                (Kind::Varied(l), counts[rank])
            }
        };
        let call = Call {
            dtype: dt,
            op: if c.op.avg() { RedOp::Avg } else { RedOp::Sum },
            ..common::call(kind, send, recv, count)
        };
        comm.run(&call)
            .unwrap_or_else(|e| panic!("{:?} {dt} n={n} rank {rank}: {e}", c.op));
        decode(dt, &recv.to_vec())
    })
}

/// The bound of docs/compression.md for the composition, per element, against the exact f64
/// result of the held inputs: each host's partial sum quantized once (its block's scale from
/// the partial sums' largest magnitude), the f32 sums, and the owner's result quantized once.
fn check_bound(codec: &Codec, labels: &[usize], c: &Case, rank: usize, got: &[f32]) {
    let (n, f, op, dt) = (c.n(), codec.format, c.op, c.dt);
    let bd = common::typed::Bound { codec: *codec, dt };
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
fn data(seed: u64, len: usize, wide: bool) -> Vec<f32> {
    nccl_net_fabricoll::testing::values::values(seed, len, wide.then_some(15))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Run `c` on `cs` (hosts `labels`) and check every rank's bits against the composition and
/// every element against the bound; whether the composition's bits differ from every level
/// compressed.
fn check_tiered(cs: &[Arc<Comm>], codec: &Codec, labels: &[usize], c: &Case, what: &str) -> bool {
    let want = expected_tiered(codec, labels, c);
    let got = run(cs, c);
    for r in 0..c.n() {
        assert_eq!(
            bits(&got[r]),
            bits(&held(c.dt, &want[r])),
            "{what} {:?} {} {} in_place={}: rank {r}",
            c.op,
            codec.format,
            c.dt,
            c.in_place
        );
        check_bound(codec, labels, c, r, &got[r]);
    }
    want != expected_flat(codec, c)
}

/// Hosts of equal and of different sizes, in blocks and interleaved: every format x collective
/// (uniform and V, sum and avg), uneven counts (a short last block; V counts of 0 and 1 among
/// them), float, bfloat16 and half data, in place and out of place: the composition's bits on
/// every rank, within the bound.
#[test]
fn tiered_layouts_give_the_composition_bits_within_the_bound() {
    let layouts: [&[usize]; 8] = [
        &[0, 0, 1, 1],
        &[0, 0, 0, 1, 1, 1],
        &[0, 0, 1, 1, 2, 2],
        &[0, 0, 1, 1, 2],
        &[0, 0, 0, 1, 1],
        &[0, 1, 1],
        &[0, 0, 0, 1, 2, 2],
        &[0, 1, 0, 2, 1, 0],
    ];
    for labels in layouts {
        let n = labels.len();
        let mut differs = 0;
        for (fi, f) in Format::CODED.into_iter().enumerate() {
            let codec = Codec::new(f, 32).unwrap();
            let cs = comms_on(labels, codec, CompressLevels::Inter);
            for (oi, op) in ALL_OPS.into_iter().enumerate() {
                let dt = match (fi + oi) % 4 {
                    2 => DataType::Bfloat16,
                    3 => DataType::Float16,
                    _ => DataType::Float32,
                };
                // Uneven: not a multiple of the block, of the ranks or of the hosts.
                let len = if op == Op::AllReduce || op == Op::AllReduceAvg {
                    301
                } else {
                    37
                };
                let seed = (fi * 31 + oi * 7) as u64;
                let c = Case::new(op, dt, n, len, seed, (fi + oi) % 2 == 1);
                differs += usize::from(check_tiered(
                    &cs,
                    &codec,
                    labels,
                    &c,
                    &format!("{labels:?}"),
                ));
            }
        }
        // The reductions' composition is not every level compressed.
        assert!(differs >= Format::CODED.len(), "{labels:?}: {differs}");
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
    let c = Case::of(Op::AllReduce, x, len);
    let tiered = run(&comms(n, per, codec, CompressLevels::Inter), &c);
    let flat = run(&comms(n, per, codec, CompressLevels::All), &c);
    let want = expected_tiered(&codec, &blocks_of(n, per), &c);
    let want_flat = expected_flat(&codec, &c);
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

/// Hosts of different sizes (2 + 2 + 1 from `FABRICOLL_LOCAL_RANKS`) compress the inter-host
/// level only, one lane: the composition's bits, uniform and V collectives. One host and one
/// rank per host compress every level (the inter-host level is every level there, or there is
/// none), and so does `FABRICOLL_COMPRESS_LEVELS=all` on hosts of different sizes: the owner
/// rule over all ranks.
#[test]
fn uneven_hosts_compress_the_inter_host_level_only() {
    let codec = Codec::new(Format::Fp8E4m3, 32).unwrap();
    for (n, per, levels) in [
        (5, 2, CompressLevels::Inter),
        (3, 1, CompressLevels::Inter),
        (3, 3, CompressLevels::Inter),
        (5, 2, CompressLevels::All),
    ] {
        let cs = comms(n, per, codec, levels);
        let tiered = per > 1 && per < n && levels == CompressLevels::Inter;
        for (oi, op) in ALL_OPS.into_iter().enumerate() {
            let len = if op.scatters() || !op.reduces() {
                41
            } else {
                203
            };
            let c = Case::new(op, DataType::Float32, n, len, oi as u64 + 7, false);
            let got = run(&cs, &c);
            let want = if tiered {
                expected_tiered(&codec, &blocks_of(n, per), &c)
            } else {
                expected_flat(&codec, &c)
            };
            for r in 0..n {
                assert_eq!(
                    bits(&got[r]),
                    bits(&want[r]),
                    "{n} ranks, {per} per host, {levels:?}, {op:?}: rank {r}"
                );
            }
        }
    }
}

/// What a tiered communicator reports of a call's exchanges: the composition's four (host,
/// lane, lane, host) for AllReduce, on hosts of equal size and of different sizes; a
/// ReduceScatter's and an AllGather's third host exchange where hosts differ (the extra ranks'
/// results, their codes); with every level compressed, the flat two.
#[test]
fn exchanges_follow_the_levels_setting() {
    let codec = Codec::new(Format::Bf16, 256).unwrap();
    let mut send = vec![0u8; 1 << 16];
    let mut recv = vec![0u8; 1 << 16];
    // SAFETY: the buffers outlive the calls that only describe them.
    let (s, r) = unsafe {
        (
            Region::from_raw(send.as_mut_ptr(), send.len()),
            Region::from_raw(recv.as_mut_ptr(), recv.len()),
        )
    };
    let call = |coll| common::call(Kind::Coll(coll), s, r, 1024);
    let (a2a, ag) = (
        (Collective::AllToAll, Algorithm::Pairwise),
        (Collective::AllGather, Algorithm::Mesh),
    );
    for (n, per) in [(4, 2), (5, 2)] {
        let tiered = comms(n, per, codec, CompressLevels::Inter);
        let algos = |coll| tiered[0].exchange_algos(&call(coll), codec).unwrap();
        assert_eq!(algos(Collective::AllReduce), vec![a2a, a2a, ag, ag]);
        let (rs, gather) = if n == 5 {
            (vec![a2a, a2a, ag], vec![a2a, ag, ag])
        } else {
            (vec![a2a, a2a], vec![ag, ag])
        };
        assert_eq!(algos(Collective::ReduceScatter), rs, "{n}");
        assert_eq!(algos(Collective::AllGather), gather, "{n}");
        let flat = comms(n, per, codec, CompressLevels::All);
        let all = call(Collective::AllReduce);
        assert_eq!(flat[0].exchange_algos(&all, codec).unwrap().len(), 2);
    }
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
/// another host never joined, on the ranks that started it, without waiting for it. On 2 x 2
/// and on 2 + 2 + 1 (an extra rank on each of the first two hosts).
#[test]
fn nonblocking_calls_in_flight_and_abort() {
    for n in [4, 5] {
        nonblocking_on(n);
    }
}

fn nonblocking_on(n: usize) {
    let codec = Codec::new(Format::Fp8E5m2, 64).unwrap();
    let (per, len) = (2, 3000);
    let cs = comms(n, per, codec, CompressLevels::Inter);
    let x: Vec<Vec<f32>> = (0..n).map(|r| data(r as u64 + 40, len, r == 2)).collect();
    let want = expected_tiered(
        &codec,
        &blocks_of(n, per),
        &Case::of(Op::AllReduce, x.clone(), len),
    );
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
            assert_eq!(bits(b), bits(&want[rank]), "{n} ranks: rank {rank}");
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
        assert!(e.contains("aborted"), "{n} ranks: rank {rank}: {e}");
    }
}

/// Counts of 0, 1 and fewer blocks than lanes, on 3 x 2 and on hosts of 3 + 1 + 2: some lanes
/// and owners get nothing, and every rank still ends with the composition's bits.
#[test]
fn tiny_counts_leave_lanes_empty() {
    let codec = Codec::new(Format::Bf16, 4).unwrap();
    for labels in [&[0, 0, 0, 1, 1, 1][..], &[0, 0, 0, 1, 2, 2]] {
        let n = labels.len();
        let cs = comms_on(labels, codec, CompressLevels::Inter);
        for per_rank in [0, 1, 5] {
            for op in OPS {
                let c = Case::new(op, DataType::Float32, n, per_rank, 90, per_rank == 1);
                let want = expected_tiered(&codec, labels, &c);
                let got = run(&cs, &c);
                for r in 0..n {
                    assert_eq!(
                        bits(&got[r]),
                        bits(&want[r]),
                        "{labels:?} {op:?} {per_rank}: rank {r}"
                    );
                }
            }
        }
    }
}

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
use nccl_net_fabricoll::compress::{Codec, Format};
use nccl_net_fabricoll::config::{CompressLevels, Compression, Config};
use nccl_net_fabricoll::reduce::{DataType, RedOp};
use nccl_net_fabricoll::transport::loopback::LoopbackFabric;
use nccl_net_fabricoll::transport::{Region, Transport};
use std::sync::Arc;

mod common;
mod tiered_ref;
use common::typed::{decode, encode, held};
use tiered_ref::*;

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

//! Gather, scatter, barrier, allgatherv, reducescatterv, alltoallv and tagged send/recv at 2 to
//! 4 ranks over loopback, shm and net, with uneven counts (zeros included), checked element by
//! element; and their error paths: counts that differ between ranks fail on every rank within
//! the deadline, bad tags, roots and missing count arrays are invalid arguments naming them
//! (the C API's side: tests/capi_varied.rs).
use nccl_net_fabricoll::algo::varied::Varied;
use nccl_net_fabricoll::coll::{Call, Comm, Kind, Layout};
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::reduce::{DataType, RedOp};
use nccl_net_fabricoll::transport::Region;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

const DEADLINE_MS: u32 = 3000;

/// `n` communicators over `transport` ("loopback", "shm", "net"), or None where it is missing.
fn comms(test: &str, transport: &str, n: usize) -> Option<Vec<Arc<Comm>>> {
    let mut cfg: Config = match transport {
        "net" => common::fixed_model_on(Some("net"), Some("lo"), DEADLINE_MS),
        "shm" => common::fixed_model(Some("shm"), DEADLINE_MS),
        _ => common::fixed_model(None, DEADLINE_MS),
    };
    cfg.intra_provider = None;
    cfg.host = Some("0".into());
    common::comms_in_process(test, transport, &vec![cfg; n])
}

/// Rank r's input element k.
fn v(r: usize, k: usize) -> i32 {
    (r * 1000 + k) as i32
}

/// A region over a slice (the call reads or writes it before the slice goes away).
fn reg<T>(s: &mut [T]) -> Region {
    // SAFETY: every call in these tests completes before the slice is dropped or moved.
    unsafe { Region::from_raw(s.as_mut_ptr().cast(), std::mem::size_of_val(s)) }
}

fn call(kind: Kind, send: Region, recv: Region, count: usize, root: usize) -> Call {
    Call {
        kind,
        send,
        recv,
        count,
        dtype: DataType::Int32,
        op: RedOp::Sum,
        root,
        algo: None,
    }
}

/// Blocks of `counts` in reverse rank order, one unused element before each: (displs, length).
fn spread(counts: &[usize]) -> (Vec<usize>, usize) {
    let mut d = vec![0; counts.len()];
    let mut off = 0;
    for i in (0..counts.len()).rev() {
        off += 1;
        d[i] = off;
        off += counts[i];
    }
    (d, off)
}

fn packed(counts: &[usize]) -> Vec<usize> {
    counts
        .iter()
        .scan(0, |o, c| {
            let d = *o;
            *o += c;
            Some(d)
        })
        .collect()
}

/// Every op on rank `r` of `n`, checked.
fn every_op(c: &Comm, r: usize, n: usize) {
    let ctx = |what: &str| format!("rank {r} of {n}: {what}");
    // Gather at the last rank, 3 elements each.
    let root = n - 1;
    let mut inp: Vec<i32> = (0..3).map(|k| v(r, k)).collect();
    let mut out = vec![-1i32; 3 * n];
    let g = Layout::new(Varied::Gather);
    c.run(&call(
        Kind::Varied(g),
        reg(&mut inp),
        reg(&mut out),
        3,
        root,
    ))
    .unwrap_or_else(|e| panic!("{}: {e}", ctx("gather")));
    if r == root {
        let want: Vec<i32> = (0..3 * n).map(|j| v(j / 3, j % 3)).collect();
        assert_eq!(out, want, "{}", ctx("gather"));
    }
    // Scatter from rank 0, 2 elements each.
    let mut inp: Vec<i32> = (0..2 * n).map(|k| v(r, k)).collect();
    let mut out = vec![-1i32; 2];
    let s = Layout::new(Varied::Scatter);
    c.run(&call(Kind::Varied(s), reg(&mut inp), reg(&mut out), 2, 0))
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("scatter")));
    assert_eq!(
        out,
        vec![v(0, 2 * r), v(0, 2 * r + 1)],
        "{}",
        ctx("scatter")
    );
    let b = Layout::new(Varied::Barrier);
    c.run(&call(
        Kind::Varied(b),
        Region::empty(),
        Region::empty(),
        0,
        0,
    ))
    .unwrap_or_else(|e| panic!("{}: {e}", ctx("barrier")));
    // AllGatherV with a zero count and spread blocks, started non-blocking.
    let mut counts: Vec<usize> = [2, 0, 3, 1][..n].to_vec();
    let (mut displs, len) = spread(&counts);
    let mut inp: Vec<i32> = (0..counts[r]).map(|k| v(r, k)).collect();
    let mut out = vec![-1i32; len];
    let mut l = Layout::new(Varied::AllGatherV);
    (l.counts, l.displs) = (reg(&mut counts), reg(&mut displs));
    let req = c
        .start(&call(
            Kind::Varied(l),
            reg(&mut inp),
            reg(&mut out),
            counts[r],
            0,
        ))
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("allgatherv")));
    c.wait(req)
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("allgatherv")));
    let mut want = vec![-1i32; len];
    for i in 0..n {
        for k in 0..counts[i] {
            want[displs[i] + k] = v(i, k);
        }
    }
    assert_eq!(out, want, "{}", ctx("allgatherv"));
    // ReduceScatterV (sum) with a zero count.
    let mut counts: Vec<usize> = [3, 0, 1, 2][..n].to_vec();
    let offs = packed(&counts);
    let total: usize = counts.iter().sum();
    let mut inp: Vec<i32> = (0..total).map(|k| v(r, k)).collect();
    let mut out = vec![-1i32; counts[r]];
    let mut l = Layout::new(Varied::ReduceScatterV);
    l.counts = reg(&mut counts);
    c.run(&call(Kind::Varied(l), reg(&mut inp), reg(&mut out), 0, 0))
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("reducescatterv")));
    let want: Vec<i32> = (0..counts[r])
        .map(|k| (0..n).map(|i| v(i, offs[r] + k)).sum())
        .collect();
    assert_eq!(out, want, "{}", ctx("reducescatterv"));
    // AllToAllV: m(i, j) elements from i to j, zeros included; sends packed, receives spread.
    let m = |i: usize, j: usize| (i + 2 * j) % 3;
    let mut sc: Vec<usize> = (0..n).map(|j| m(r, j)).collect();
    let mut rc: Vec<usize> = (0..n).map(|i| m(i, r)).collect();
    let (mut rd, len) = spread(&rc);
    let sd_of = |i: usize| packed(&(0..n).map(|j| m(i, j)).collect::<Vec<_>>());
    let mut inp: Vec<i32> = (0..sc.iter().sum()).map(|k| v(r, k)).collect();
    let mut out = vec![-1i32; len];
    let mut l = Layout::new(Varied::AllToAllV);
    (l.counts, l.recv_counts, l.recv_displs) = (reg(&mut sc), reg(&mut rc), reg(&mut rd));
    c.run(&call(Kind::Varied(l), reg(&mut inp), reg(&mut out), 0, 0))
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("alltoallv")));
    let mut want = vec![-1i32; len];
    for i in 0..n {
        for k in 0..rc[i] {
            want[rd[i] + k] = v(i, sd_of(i)[r] + k);
        }
    }
    assert_eq!(out, want, "{}", ctx("alltoallv"));
    // Tagged: each rank sends tag 5 then untagged to the next; the previous rank's messages
    // are received untagged first, so only the tags can match them.
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let mut s5 = [v(r, 5); 4];
    let mut s0 = [v(r, 0); 2];
    let (mut r5, mut r0) = ([-1i32; 4], [-1i32; 2]);
    let tagged = |send, peer, tag| Kind::Tagged { send, peer, tag };
    let reqs = [
        c.start(&call(
            Kind::Recv { peer: prev },
            Region::empty(),
            reg(&mut r0),
            2,
            0,
        )),
        c.start(&call(
            tagged(false, prev, 5),
            Region::empty(),
            reg(&mut r5),
            4,
            0,
        )),
        c.start(&call(
            tagged(true, next, 5),
            reg(&mut s5),
            Region::empty(),
            4,
            0,
        )),
        c.start(&call(
            tagged(true, next, 0),
            reg(&mut s0),
            Region::empty(),
            2,
            0,
        )),
    ];
    for q in reqs {
        let q = q.unwrap_or_else(|e| panic!("{}: {e}", ctx("tagged start")));
        c.wait(q)
            .unwrap_or_else(|e| panic!("{}: {e}", ctx("tagged wait")));
    }
    assert_eq!(r5, [v(prev, 5); 4], "{}", ctx("tag 5"));
    assert_eq!(r0, [v(prev, 0); 2], "{}", ctx("tag 0"));
}

fn every_op_on(test: &str, transport: &str) {
    for n in 2..=4 {
        let Some(cs) = comms(test, transport, n) else {
            return;
        };
        std::thread::scope(|s| {
            for (r, c) in cs.iter().enumerate() {
                s.spawn(move || every_op(c, r, n));
            }
        });
    }
}

#[test]
fn every_varied_op_over_loopback() {
    every_op_on("every_varied_op_over_loopback", "loopback");
}

#[test]
fn every_varied_op_over_shm() {
    every_op_on("every_varied_op_over_shm", "shm");
}

#[test]
fn every_varied_op_over_net() {
    every_op_on("every_varied_op_over_net", "net");
}

/// No rank leaves a barrier before the last one has entered it (3 and 5 ranks: dissemination
/// rounds that do not divide evenly).
#[test]
fn no_rank_leaves_the_barrier_before_the_last_enters() {
    for n in [3, 5] {
        let Some(cs) = comms("no_rank_leaves_the_barrier", "loopback", n) else {
            return;
        };
        let late = Duration::from_millis(200);
        let t0 = Instant::now();
        let left: Vec<Duration> = std::thread::scope(|s| {
            let hs: Vec<_> = cs
                .iter()
                .enumerate()
                .map(|(r, c)| {
                    s.spawn(move || {
                        if r == 1 {
                            std::thread::sleep(late);
                        }
                        let b = Kind::Varied(Layout::new(Varied::Barrier));
                        c.run(&call(b, Region::empty(), Region::empty(), 0, 0))
                            .unwrap();
                        t0.elapsed()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(left.iter().all(|&t| t >= late), "n {n}: {left:?}");
    }
}

/// Ranks whose counts disagree: every rank fails within the deadline, never hangs.
#[test]
fn counts_that_differ_between_ranks_fail_every_rank() {
    let test = "counts_that_differ_between_ranks_fail_every_rank";
    for transport in ["loopback", "shm"] {
        let Some(cs) = comms(test, transport, 2) else {
            return;
        };
        for case in ["allgatherv", "alltoallv"] {
            let t = Instant::now();
            let got: Vec<String> = std::thread::scope(|s| {
                let hs: Vec<_> = cs
                    .iter()
                    .enumerate()
                    .map(|(r, c)| {
                        s.spawn(move || {
                            let mut inp = vec![1i32; 8];
                            let mut out = vec![0i32; 16];
                            let (mut a, mut b) = (vec![2usize, 1 + r], vec![2usize, 2]);
                            let mut l = Layout::new(if case == "allgatherv" {
                                Varied::AllGatherV
                            } else {
                                Varied::AllToAllV
                            });
                            l.counts = reg(&mut a);
                            let count = if case == "allgatherv" {
                                a[r]
                            } else {
                                // Rank 0 sends 1 element to rank 1, which expects 2.
                                b[1 - r] = a[1 - r];
                                b[r] = a[r];
                                if r == 1 {
                                    b[0] = 2;
                                }
                                l.recv_counts = reg(&mut b);
                                0
                            };
                            let k = Kind::Varied(l);
                            match c.run(&call(k, reg(&mut inp), reg(&mut out), count, 0)) {
                                Ok(()) => "OK".to_string(),
                                Err(e) => e.to_string(),
                            }
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let took = t.elapsed();
            assert!(
                took < Duration::from_millis(2 * DEADLINE_MS as u64 + 30_000),
                "{transport} {case}: took {took:?}: {got:?}"
            );
            for e in &got {
                assert!(
                    e.contains("calls differ")
                        || e.contains("bytes where")
                        || e.contains("arrived for a receive buffer")
                        || e.starts_with("timeout")
                        || e.starts_with("remote error")
                        || e.starts_with("system error"),
                    "{transport} {case}: {got:?}"
                );
            }
            assert!(
                got.iter().any(|e| e.contains("calls differ")
                    || e.contains("bytes where")
                    || e.contains("arrived for a receive buffer")),
                "{transport} {case}: no rank said why: {got:?}"
            );
            // AllGatherV's counts are the same on every rank: the signature compares them.
            assert!(
                case != "allgatherv" || got.iter().any(|e| e.contains("the ranks' calls differ")),
                "{transport}: {got:?}"
            );
        }
    }
}

/// Bad arguments fail at once on the calling rank, naming the argument.
#[test]
fn bad_tags_roots_and_missing_counts_are_named() {
    let Some(cs) = comms("bad_tags_roots_and_missing_counts_are_named", "loopback", 2) else {
        return;
    };
    let c = &cs[0];
    let err = |k: Kind, count, root| {
        c.run(&call(
            k,
            reg(&mut [0i32; 8]),
            reg(&mut [0i32; 8]),
            count,
            root,
        ))
        .unwrap_err()
        .to_string()
    };
    let e = err(
        Kind::Tagged {
            send: true,
            peer: 1,
            tag: nccl_net_fabricoll::exec::MAX_TAG + 1,
        },
        1,
        0,
    );
    assert!(e.contains("'tag'"), "{e}");
    let e = err(Kind::Varied(Layout::new(Varied::Gather)), 1, 2);
    assert!(e.contains("'root'"), "{e}");
    let e = err(Kind::Varied(Layout::new(Varied::AllGatherV)), 1, 0);
    assert!(e.contains("'recvcounts'"), "{e}");
    let mut l = Layout::new(Varied::AllToAllV);
    let mut sc = [1usize, 1];
    l.counts = reg(&mut sc);
    let e = err(Kind::Varied(l), 0, 0);
    assert!(e.contains("'recvcounts'"), "{e}");
    let mut short = [1usize];
    let mut l = Layout::new(Varied::ReduceScatterV);
    l.counts = reg(&mut short);
    let e = err(Kind::Varied(l), 0, 0);
    assert!(
        e.contains("'recvcounts'") && e.contains("not 2 counts"),
        "{e}"
    );
}

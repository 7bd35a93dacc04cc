//! Blocking collectives over the direct channel (the shm fastbox, `Comm::run` →
//! `Exec::run_direct`): ranks as threads, each with its own shm endpoint. The results match an
//! independent reference whichever path each rank takes (the paths share one wire format), and
//! the error paths of the direct runner end within the deadline, on abort and on a mismatch,
//! restoring an in-place input. Skipped where shm has no fastbox (libfabric 1.19 and later
//! match tags in the provider).
use nccl_net_fabricoll::algo::{Algorithm, Collective};
use nccl_net_fabricoll::coll::{self, Call, Comm, Kind};
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::reduce::{DataType, RedOp};
use nccl_net_fabricoll::testing::skip;

mod common;
use nccl_net_fabricoll::transport::{Region, Transport};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `n` communicators over shm endpoints of this process, or None where shm or its fastbox is
/// missing (test `test` is then skipped: `testing::skip`).
fn comms(test: &str, n: usize, c: &Config) -> Option<Vec<Arc<Comm>>> {
    let eps: Vec<Arc<dyn Transport>> = match (0..n).map(|_| coll::open_endpoint(c)).collect() {
        Ok(e) => e,
        Err(e) => {
            skip(test, &format!("no shm endpoint ({e})"));
            return None;
        }
    };
    let addrs: Vec<Vec<u8>> = eps.iter().map(|e| e.address()).collect();
    let comms: Vec<Arc<Comm>> = eps
        .into_iter()
        .enumerate()
        .map(|(r, e)| Arc::new(Comm::new(r, e, &addrs, c).unwrap()))
        .collect();
    let peer = comms[0].transport().insert_peer(&addrs[n - 1]).unwrap();
    if comms[0].transport().direct_bytes(peer) == 0 {
        skip(test, "this libfabric's shm needs no fastbox");
        return None;
    }
    Some(comms)
}

fn region(v: &mut [f32]) -> Region {
    // SAFETY: each buffer outlives the blocking call that uses it.
    unsafe { Region::from_raw(v.as_mut_ptr() as *mut u8, v.len() * 4) }
}

fn value(r: usize, i: usize) -> f32 {
    ((r * 7 + i * 3) % 5 + 1) as f32
}

fn call(coll: Collective, send: Region, recv: Region, count: usize) -> Call {
    common::call(Kind::Coll(coll), send, recv, count)
}

/// Input and expected output lengths and values of rank `r` (NCCL's layouts, root 0).
fn case(coll: Collective, n: usize, count: usize, r: usize) -> (Vec<f32>, Vec<f32>) {
    let sum = |i: usize| (0..n).map(|q| value(q, i)).sum::<f32>();
    match coll {
        Collective::AllReduce => (
            (0..count).map(|i| value(r, i)).collect(),
            (0..count).map(sum).collect(),
        ),
        Collective::AllGather => (
            (0..count).map(|i| value(r, i)).collect(),
            (0..n * count)
                .map(|j| value(j / count, j % count))
                .collect(),
        ),
        Collective::ReduceScatter => (
            (0..n * count).map(|j| value(r, j)).collect(),
            (0..count).map(|i| sum(r * count + i)).collect(),
        ),
        Collective::Broadcast => (
            (0..count).map(|i| value(r, i)).collect(),
            (0..count).map(|i| value(0, i)).collect(),
        ),
        Collective::Reduce => (
            (0..count).map(|i| value(r, i)).collect(),
            if r == 0 {
                (0..count).map(sum).collect()
            } else {
                vec![0.0; count]
            },
        ),
        Collective::AllToAll => (
            (0..n * count).map(|j| value(r, j)).collect(),
            (0..n * count)
                .map(|j| value(j / count, r * count + j % count))
                .collect(),
        ),
    }
}

#[test]
fn small_blocking_collectives_run_direct_and_agree_with_ranks_on_the_general_path() {
    let test = "small_blocking_collectives_run_direct_and_agree_with_ranks_on_the_general_path";
    let c = common::fixed_model(Some("shm"), 20000);
    for n in [2usize, 3] {
        let Some(cs) = comms(test, n, &c) else {
            return;
        };
        for coll in Collective::ALL {
            for count in [1usize, 5, 64] {
                // Round 0: every rank blocking (direct). Round 1: rank 0 blocking, the others
                // non-blocking (start + wait: the general path).
                for round in 0..2 {
                    let before: Vec<u64> = cs.iter().map(|x| x.direct_runs()).collect();
                    std::thread::scope(|s| {
                        for (r, comm) in cs.iter().enumerate() {
                            s.spawn(move || {
                                let (mut inp, want) = case(coll, n, count, r);
                                let mut out = vec![0f32; want.len()];
                                let k = call(coll, region(&mut inp), region(&mut out), count);
                                if round == 1 && r > 0 {
                                    let req = comm.start(&k).unwrap();
                                    comm.wait(req).unwrap();
                                } else {
                                    comm.run(&k).unwrap();
                                }
                                if coll != Collective::Reduce || r == 0 {
                                    assert_eq!(
                                        out, want,
                                        "{coll:?} n {n} count {count} rank {r} round {round}"
                                    );
                                }
                            });
                        }
                    });
                    for (r, comm) in cs.iter().enumerate() {
                        let direct = comm.direct_runs() - before[r];
                        let want = u64::from(round == 0 || r == 0);
                        assert_eq!(
                            direct, want,
                            "{coll:?} n {n} count {count} rank {r} round {round}"
                        );
                    }
                }
            }
        }
        // In place, and messages too large for the channel (the general path, every rank):
        // 64 KiB, whose chunks are over the fastbox's 16 KiB.
        let count = 16384;
        let before = cs[0].direct_runs();
        std::thread::scope(|s| {
            for (r, comm) in cs.iter().enumerate() {
                s.spawn(move || {
                    let (mut data, want) = case(Collective::AllReduce, n, count, r);
                    let x = region(&mut data);
                    // The ring, whose chunks (64 KiB / n) are over the fastbox's 16 KiB
                    // whatever auto would pick (others cut 64 KiB finer).
                    let ring = Call {
                        algo: Some(Algorithm::Ring),
                        ..call(Collective::AllReduce, x, x, count)
                    };
                    comm.run(&ring).unwrap();
                    assert_eq!(data, want);
                    let (mut data, want) = case(Collective::AllReduce, n, 3, r);
                    let x = region(&mut data);
                    comm.run(&call(Collective::AllReduce, x, x, 3)).unwrap();
                    assert_eq!(data, want);
                });
            }
        });
        assert_eq!(
            cs[0].direct_runs() - before,
            1,
            "only the 12-byte AllReduce runs direct"
        );
    }
}

#[test]
fn repeated_calls_of_one_plan_each_use_their_own_buffers_type_and_operation() {
    let test = "repeated_calls_of_one_plan_each_use_their_own_buffers_type_and_operation";
    // A finished collective leaves its executor for the next call of the same plan (the same
    // problem, algorithm and element size), which re-arms it: nothing of the earlier call
    // (buffers, type, operation, in-place backup) may leak into the later one.
    let Some(cs) = comms(test, 2, &common::fixed_model(Some("shm"), 20000)) else {
        return;
    };
    let count = 5;
    let sum = |i: usize| value(0, i) + value(1, i);
    let before: Vec<u64> = cs.iter().map(|x| x.direct_runs()).collect();
    std::thread::scope(|s| {
        for (r, comm) in cs.iter().enumerate() {
            s.spawn(move || {
                let ar = |send, recv| call(Collective::AllReduce, send, recv, count);
                let want: Vec<f32> = (0..count).map(sum).collect();
                // Out of place, then the same plan on other buffers in place.
                let mut a: Vec<f32> = (0..count).map(|i| value(r, i)).collect();
                let mut out = vec![0f32; count];
                comm.run(&ar(region(&mut a), region(&mut out))).unwrap();
                assert_eq!(out, want, "rank {r}: out of place");
                let mut b: Vec<f32> = (0..count).map(|i| value(r, i)).collect();
                let x = region(&mut b);
                comm.run(&ar(x, x)).unwrap();
                assert_eq!(b, want, "rank {r}: in place");
                // The same element size with another type and operation: int32 max.
                let mut ints: Vec<i32> = (0..count)
                    .map(|i| (i as i32 - 2) * (r as i32 * 2 - 1))
                    .collect();
                let mut imax = vec![0i32; count];
                // SAFETY: both buffers outlive the blocking call.
                let (si, ri) = unsafe {
                    (
                        Region::from_raw(ints.as_mut_ptr() as *mut u8, count * 4),
                        Region::from_raw(imax.as_mut_ptr() as *mut u8, count * 4),
                    )
                };
                let mut k = ar(si, ri);
                k.dtype = DataType::Int32;
                k.op = RedOp::Max;
                comm.run(&k).unwrap();
                let want_max: Vec<i32> = (0..count).map(|i| (i as i32 - 2).abs()).collect();
                assert_eq!(imax, want_max, "rank {r}: int32 max after float sum");
                // A receive buffer too small for the plan: an error naming it, nothing sent.
                let mut short = vec![0f32; count - 1];
                let e = comm
                    .run(&ar(region(&mut a), region(&mut short)))
                    .unwrap_err()
                    .to_string();
                assert!(e.contains("recvbuff"), "rank {r}: {e}");
                assert!(short.iter().all(|&v| v == 0.0), "rank {r}: {short:?}");
                // And the plan runs again afterwards.
                out.fill(0.0);
                comm.run(&ar(region(&mut a), region(&mut out))).unwrap();
                assert_eq!(out, want, "rank {r}: after the error");
                // The general path (chunks over the channel's 16 KiB) keeps its executors as
                // well: one plan in place, out of place, then twice in flight at once.
                let big = 16384;
                let want: Vec<f32> = (0..big).map(sum).collect();
                let mine = || (0..big).map(|i| value(r, i)).collect::<Vec<f32>>();
                let bar = |send, recv| call(Collective::AllReduce, send, recv, big);
                let mut x = mine();
                let xr = region(&mut x);
                comm.run(&bar(xr, xr)).unwrap();
                assert!(x == want, "rank {r}: large in place");
                let (mut y, mut z) = (mine(), mine());
                let (mut oy, mut oz) = (vec![0f32; big], vec![0f32; big]);
                comm.run(&bar(region(&mut y), region(&mut oy))).unwrap();
                assert!(oy == want && y == mine(), "rank {r}: large out of place");
                oy.fill(0.0);
                let q1 = comm.start(&bar(region(&mut y), region(&mut oy))).unwrap();
                let q2 = comm.start(&bar(region(&mut z), region(&mut oz))).unwrap();
                comm.wait(q2).unwrap();
                comm.wait(q1).unwrap();
                assert!(oy == want && oz == want, "rank {r}: two in flight");
            });
        }
    });
    for (r, comm) in cs.iter().enumerate() {
        assert_eq!(comm.direct_runs() - before[r], 4, "rank {r}");
    }
}

#[test]
fn a_direct_collective_ends_at_its_deadline_and_on_abort_with_its_input_restored() {
    let test = "a_direct_collective_ends_at_its_deadline_and_on_abort_with_its_input_restored";
    let restoring = Config {
        inplace_restore: true,
        // The deadline is the subject; it also covers the pair's init, so not too short.
        ..common::fixed_model(Some("shm"), 1500)
    };
    let Some(cs) = comms(test, 2, &restoring) else {
        return;
    };
    // Rank 1 never calls: rank 0's in-place AllReduce times out, its input intact.
    let mut data: Vec<f32> = (0..16).map(|i| value(0, i)).collect();
    let orig = data.clone();
    let x = region(&mut data);
    let t = Instant::now();
    let e = cs[0]
        .run(&call(Collective::AllReduce, x, x, 16))
        .unwrap_err();
    // At the deadline, give or take a loaded machine's delay.
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    assert!(e.to_string().contains("FABRICOLL_TIMEOUT_MS"), "{e}");
    assert_eq!(data, orig);
    assert_eq!(cs[0].direct_runs(), 1);

    // Abort from another thread ends a direct collective long before its deadline.
    let Some(cs) = comms(test, 2, &common::fixed_model(Some("shm"), 120_000)) else {
        return;
    };
    let comm = cs[0].clone();
    let waiter = std::thread::spawn(move || {
        let mut data: Vec<f32> = (0..16).map(|i| value(0, i)).collect();
        let orig = data.clone();
        let x = region(&mut data);
        let t = Instant::now();
        let e = comm
            .run(&call(Collective::AllReduce, x, x, 16))
            .unwrap_err();
        (e.to_string(), t.elapsed(), data == orig)
    });
    std::thread::sleep(Duration::from_millis(200));
    cs[0].abort();
    let (e, took, restored) = waiter.join().unwrap();
    assert!(e.contains("aborted"), "{e}");
    // Long before the 120 s deadline: the abort ended it.
    assert!(took < Duration::from_secs(60), "{took:?}");
    assert!(restored);
}

#[test]
fn ranks_that_disagree_on_the_count_get_errors_not_hangs() {
    let test = "ranks_that_disagree_on_the_count_get_errors_not_hangs";
    let Some(cs) = comms(test, 2, &common::fixed_model(Some("shm"), 3000)) else {
        return;
    };
    let t = Instant::now();
    let results: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = cs
            .iter()
            .enumerate()
            .map(|(r, comm)| {
                s.spawn(move || {
                    let count = 4 + 2 * r;
                    let mut inp: Vec<f32> = (0..count).map(|i| value(r, i)).collect();
                    let mut out = vec![0f32; count];
                    let k = call(
                        Collective::AllReduce,
                        region(&mut inp),
                        region(&mut out),
                        count,
                    );
                    comm.run(&k)
                        .map(|_| String::new())
                        .unwrap_or_else(|e| e.to_string())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Errors, not a hang: well within the 1 s deadline's reach, even on a loaded machine.
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    // Every rank sees the other's call signature in its first message.
    for e in &results {
        assert!(
            e.contains("the ranks' calls differ") && e.contains("count"),
            "every rank fails with a clear error: {results:?}"
        );
    }
}

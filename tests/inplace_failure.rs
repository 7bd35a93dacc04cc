//! A failed in-place collective: without restore (the default) it returns its error within the
//! deadline and the message says that the buffer is undefined; with restore
//! (`FABRICOLL_INPLACE_RESTORE=1`) the buffer holds the input again. The failures: a peer
//! that never calls (the deadline), an abort while the call waits, and a peer whose count
//! differs (a message of the wrong size).
use nccl_net_fabricoll::algo::{Algorithm, Collective};
use nccl_net_fabricoll::coll::{Call, Comm, Kind};
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::reduce::{DataType, RedOp};
use nccl_net_fabricoll::transport::Region;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

/// The timeout of the communicators whose calls are left to time out: short, since each case
/// waits it out, yet long enough that their init (under the same timeout) passes under load.
const DEADLINE_MS: u32 = 1500;

/// How late a deadline may fire on a loaded machine before a test calls it missed.
const LATE: Duration = Duration::from_secs(30);

fn cfg(restore: bool, timeout_ms: u32) -> Config {
    Config {
        inplace_restore: restore,
        ..common::fixed_model(Some("shm"), timeout_ms)
    }
}

fn comms(test: &str, transport: &str, n: usize, c: &Config) -> Option<Vec<Arc<Comm>>> {
    let cfgs: Vec<Config> = (0..n).map(|_| c.clone()).collect();
    common::comms_in_process(test, transport, &cfgs)
}

fn region(v: &mut [f32]) -> Region {
    // SAFETY: each buffer outlives the blocking call that uses it.
    unsafe { Region::from_raw(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
}

fn allreduce(x: Region, count: usize, algo: Algorithm) -> Call {
    Call {
        kind: Kind::Coll(Collective::AllReduce),
        send: x,
        recv: x,
        count,
        dtype: DataType::Float32,
        op: RedOp::Sum,
        root: 0,
        algo: Some(algo),
    }
}

const UNDEFINED: &str = "the buffer's contents are undefined";

/// Rank 0 calls alone: its call ends at the deadline; (message, took, input intact).
fn alone(cs: &[Arc<Comm>], count: usize, algo: Algorithm) -> (String, Duration, bool) {
    let mut data: Vec<f32> = (0..count).map(|i| i as f32 * 0.5 + 1.0).collect();
    let orig = data.clone();
    let t = Instant::now();
    let e = cs[0]
        .run(&allreduce(region(&mut data), count, algo))
        .unwrap_err()
        .to_string();
    (e, t.elapsed(), data == orig)
}

#[test]
fn a_lone_in_place_call_times_out_saying_whether_its_buffer_is_undefined() {
    let test = "a_lone_in_place_call_times_out_saying_whether_its_buffer_is_undefined";
    let deadline = Duration::from_millis(DEADLINE_MS.into());
    // Every case waits out its deadline and its communicators are its own, so the cases wait
    // side by side (a case's time is its own call's, measured in its thread).
    let mut cases = Vec::new();
    for transport in ["loopback", "shm"] {
        for algo in [Algorithm::Ring, Algorithm::Rdh, Algorithm::Mesh] {
            for count in [1001usize, 200_001] {
                cases.push((transport, algo, count));
            }
        }
    }
    std::thread::scope(|s| {
        for &(transport, algo, count) in &cases {
            s.spawn(move || {
                let what = format!("{transport} {algo} count {count}");
                let Some(cs) = comms(test, transport, 2, &cfg(false, DEADLINE_MS)) else {
                    return;
                };
                let (e, took, _) = alone(&cs, count, algo);
                assert!(e.contains(UNDEFINED), "{what}: {e}");
                assert!(took < deadline + LATE, "{what}: {took:?}");
                let Some(cs) = comms(test, transport, 2, &cfg(true, DEADLINE_MS)) else {
                    return;
                };
                let (e, took, intact) = alone(&cs, count, algo);
                assert!(!e.contains(UNDEFINED), "{what}: {e}");
                assert!(took < deadline + LATE, "{what}: {took:?}");
                assert!(intact, "{what}: the restoring call left its input changed");
            });
        }
    });
}

#[test]
fn an_abort_ends_an_in_place_call_at_once_with_or_without_restore() {
    let test = "an_abort_ends_an_in_place_call_at_once_with_or_without_restore";
    for restore in [false, true] {
        // A timeout that never fires in a passing run: the abort, not the deadline, ends it.
        let Some(cs) = comms(test, "shm", 2, &cfg(restore, 120_000)) else {
            return;
        };
        let c = cs[0].clone();
        let waiter = std::thread::spawn(move || alone(&[c], 100_001, Algorithm::Ring));
        std::thread::sleep(Duration::from_millis(200));
        cs[0].abort();
        let (e, took, intact) = waiter.join().unwrap();
        assert!(e.contains("aborted"), "{e}");
        assert_eq!(e.contains(UNDEFINED), !restore, "{e}");
        assert!(took < Duration::from_secs(60), "{took:?}");
        if restore {
            assert!(intact, "the restoring call left its input changed");
        }
    }
}

#[test]
fn counts_that_differ_fail_both_ranks_within_the_deadline() {
    let test = "counts_that_differ_fail_both_ranks_within_the_deadline";
    for restore in [false, true] {
        for algo in [Algorithm::Ring, Algorithm::Mesh, Algorithm::Rdh] {
            let Some(cs) = comms(test, "loopback", 2, &cfg(restore, DEADLINE_MS)) else {
                return;
            };
            let counts = [100_001usize, 120_001];
            let t = Instant::now();
            let outcomes: Vec<(String, bool)> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..2)
                    .map(|r| {
                        let c = cs[r].clone();
                        s.spawn(move || {
                            let mut data: Vec<f32> =
                                (0..counts[r]).map(|i| (i % 97) as f32 + r as f32).collect();
                            let orig = data.clone();
                            let res = c.run(&allreduce(region(&mut data), counts[r], algo));
                            let msg = res.err().map_or("OK".to_string(), |e| e.to_string());
                            (msg, data == orig)
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(
                t.elapsed() < 2 * Duration::from_millis(DEADLINE_MS.into()) + LATE,
                "{algo}: {:?}",
                t.elapsed()
            );
            for (r, (msg, intact)) in outcomes.iter().enumerate() {
                assert_ne!(msg, "OK", "{algo}: rank {r} reported success");
                assert_eq!(msg.contains(UNDEFINED), !restore, "{algo}: rank {r}: {msg}");
                if restore {
                    assert!(intact, "{algo}: rank {r}'s input was not restored");
                }
            }
        }
    }
}

//! Notified requests (`Comm::notify`) over shm: the callback runs exactly once, in the progress
//! thread, with the request's status (success, a lone rank's timeout, abort, drop of the
//! communicator), or in the caller's thread for a request that had already ended; the progress
//! thread takes no CPU while nothing is pending.
use nccl_net_fabricoll::algo::Collective;
use nccl_net_fabricoll::coll::{self, Callback, Comm, Kind};
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::error::Result;
use nccl_net_fabricoll::testing::skip;
use nccl_net_fabricoll::transport::Region;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

mod common;

/// FABRICOLL_TIMEOUT_MS of the communicators whose deadline a test checks. It covers their
/// bootstrap and calibration too: short, yet long enough for a loaded machine.
const DEADLINE_MS: u32 = 3000;

/// FABRICOLL_TIMEOUT_MS of the other communicators: it never fires in a passing test, so a
/// request that ends before it ended for the reason the test gives (abort, drop).
const LONG_MS: u32 = 120_000;

/// How long a test waits for a callback that must come: a bound on a hang, not a speed check.
const WAIT: Duration = Duration::from_secs(30);

/// The tests of this file run one at a time: the idle test counts the CPU time of every
/// progress thread of the process.
static SERIAL: Mutex<()> = Mutex::new(());

/// `n` communicators over shm in this process with the long timeout (None: skipped, no shm).
fn comms(test: &str, n: usize) -> Option<Vec<Arc<Comm>>> {
    comms_with(test, n, LONG_MS)
}

/// `n` communicators over shm in this process with `timeout_ms` (None: skipped, no shm here).
fn comms_with(test: &str, n: usize, timeout_ms: u32) -> Option<Vec<Arc<Comm>>> {
    let mut cfg: Config = common::fixed_model(Some("shm"), timeout_ms);
    cfg.intra_provider = None;
    common::comms_in_process(test, "shm", &vec![cfg; n])
}

/// A float allreduce of 2 elements between `buf`'s halves (in-place-free: send then receive).
fn allreduce(buf: &mut [f32; 4]) -> coll::Call {
    let p = buf.as_mut_ptr().cast::<u8>();
    // SAFETY: the buffer outlives the request: every test waits for its callback (or for
    // the communicator's drop, which ends it) before the buffer goes.
    let (send, recv) = unsafe { (Region::from_raw(p, 8), Region::from_raw(p.add(8), 8)) };
    common::call(Kind::Coll(Collective::AllReduce), send, recv, 2)
}

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// What one callback saw: its status, and the name of the thread it ran in.
type Seen = (Result<()>, String);

/// A callback that reports to `tx` and counts its calls in `count`.
fn reporter(tx: mpsc::Sender<Seen>, count: Arc<AtomicUsize>) -> Callback {
    Box::new(move |r| {
        count.fetch_add(1, Ordering::SeqCst);
        let name = std::thread::current().name().unwrap_or("").to_string();
        let _ = tx.send((r, name));
    })
}

/// Start a collective on `c` that its peer never joins, and notify it: the receiver of its
/// callback's report, and the count of its calls.
fn notify_lone(c: &Arc<Comm>, buf: &mut [f32; 4]) -> (mpsc::Receiver<Seen>, Arc<AtomicUsize>) {
    let count = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::channel();
    let id = c.start(&allreduce(buf)).unwrap();
    c.notify(id, reporter(tx, count.clone())).unwrap();
    (rx, count)
}

/// Start an allreduce on both ranks and notify both; each rank's communicator and request.
fn notify_both<'a>(
    cs: &'a [Arc<Comm>],
    bufs: &mut [[f32; 4]; 2],
    tx: &mpsc::Sender<Seen>,
    count: &Arc<AtomicUsize>,
) -> Vec<(&'a Arc<Comm>, coll::RequestId)> {
    let ids: Vec<_> = cs
        .iter()
        .zip(bufs.iter_mut())
        .map(|(c, b)| (c, c.start(&allreduce(b)).unwrap()))
        .collect();
    for (c, id) in &ids {
        c.notify(*id, reporter(tx.clone(), count.clone())).unwrap();
    }
    ids
}

#[test]
fn callback_runs_once_in_the_progress_thread_on_success() {
    let _serial = serial();
    let Some(cs) = comms("callback_runs_once_in_the_progress_thread_on_success", 2) else {
        return;
    };
    let mut bufs = [[1.0f32, 2.0, 0.0, 0.0], [10.0, 20.0, 0.0, 0.0]];
    let count = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::channel();
    for _round in 0..20 {
        for (c, id) in notify_both(&cs, &mut bufs, &tx, &count) {
            // The request is the library's now.
            assert!(c.test(id).is_err());
        }
        for _ in 0..2 {
            let (r, _name) = rx.recv_timeout(WAIT).unwrap();
            r.unwrap();
        }
    }
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(count.load(Ordering::SeqCst), 40, "one call per request");
    for b in &bufs {
        assert_eq!(b[2..], [11.0, 22.0]);
    }
    // Where the request was still running at notify, the callback came from the progress
    // thread; check one that surely was (the peer has not started yet).
    let id = cs[0].start(&allreduce(&mut bufs[0])).unwrap();
    cs[0]
        .notify(id, reporter(tx.clone(), count.clone()))
        .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let id1 = cs[1].start(&allreduce(&mut bufs[1])).unwrap();
    cs[1].wait(id1).unwrap();
    let (r, name) = rx.recv_timeout(WAIT).unwrap();
    r.unwrap();
    assert!(name.starts_with("fabricoll-progress"), "ran in {name:?}");
}

#[test]
fn a_lone_ranks_request_fails_within_the_timeout() {
    let _serial = serial();
    let Some(cs) = comms_with(
        "a_lone_ranks_request_fails_within_the_timeout",
        2,
        DEADLINE_MS,
    ) else {
        return;
    };
    let mut buf = [1.0f32; 4];
    let t0 = Instant::now();
    let (rx, count) = notify_lone(&cs[0], &mut buf);
    let (r, name) = rx
        .recv_timeout(Duration::from_millis(u64::from(DEADLINE_MS)) + WAIT)
        .expect("the callback within the timeout");
    let e = r.unwrap_err().to_string();
    assert!(e.contains("no progress"), "{e}");
    assert!(t0.elapsed() >= Duration::from_millis(u64::from(DEADLINE_MS)));
    assert!(name.starts_with("fabricoll-progress"), "{name}");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(count.load(Ordering::SeqCst), 1);
    assert_eq!(cs[0].pending(), 0, "the failed request is freed");
}

#[test]
fn abort_fails_notified_requests() {
    let _serial = serial();
    let Some(cs) = comms("abort_fails_notified_requests", 2) else {
        return;
    };
    let mut buf = [1.0f32; 4];
    let (rx, count) = notify_lone(&cs[0], &mut buf);
    cs[0].abort();
    let (r, _) = rx.recv_timeout(WAIT).unwrap();
    assert!(r.unwrap_err().to_string().contains("aborted"));
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[test]
fn notify_on_an_ended_request_calls_back_in_the_callers_thread() {
    let _serial = serial();
    let Some(cs) = comms(
        "notify_on_an_ended_request_calls_back_in_the_callers_thread",
        1,
    ) else {
        return;
    };
    let mut buf = [3.0f32, 4.0, 0.0, 0.0];
    let count = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::channel();
    // One rank: the collective ends inside `start`.
    let id = cs[0].start(&allreduce(&mut buf)).unwrap();
    let me = std::thread::current().name().unwrap_or("").to_string();
    cs[0].notify(id, reporter(tx, count.clone())).unwrap();
    assert_eq!(
        count.load(Ordering::SeqCst),
        1,
        "called before notify returned"
    );
    let (r, name) = rx.try_recv().unwrap();
    r.unwrap();
    assert_eq!(name, me);
    assert_eq!(buf[2..], [3.0, 4.0]);
    // A request handed over (or unknown) is not a request any more; the callback is dropped.
    let never = Arc::new(AtomicUsize::new(0));
    let (tx2, _rx2) = mpsc::channel();
    let e = cs[0].notify(id, reporter(tx2, never.clone())).unwrap_err();
    assert!(e.to_string().contains("request"), "{e}");
    assert_eq!(never.load(Ordering::SeqCst), 0);
}

#[test]
fn dropping_the_communicator_fails_pending_notified_requests() {
    let _serial = serial();
    let Some(mut cs) = comms(
        "dropping_the_communicator_fails_pending_notified_requests",
        2,
    ) else {
        return;
    };
    let mut buf = [1.0f32; 4];
    let c = cs.remove(0);
    let (rx, count) = notify_lone(&c, &mut buf);
    let weak = Arc::downgrade(&c);
    let t0 = Instant::now();
    drop(c);
    // The drop (here, or in the progress thread between its rounds) ran the callback.
    let (r, _) = rx.recv_timeout(WAIT).unwrap();
    assert!(r.is_err());
    // Well before the communicator's own timeout: the drop ended it, not the deadline.
    assert!(t0.elapsed() < Duration::from_millis(u64::from(LONG_MS)) / 2);
    let deadline = Instant::now() + WAIT;
    while weak.upgrade().is_some() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(weak.upgrade().is_none(), "the progress thread let it go");
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

/// CPU time (user + system, in clock ticks) of this process's threads named `prefix*`.
fn thread_ticks(prefix: &str) -> Option<u64> {
    let mut total = None;
    for t in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(t.ok()?.path().join("stat")).ok()?;
        let (name, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
        if name.starts_with(prefix) {
            let f: Vec<&str> = rest.split(' ').collect();
            // Fields 14 and 15 (utime, stime) of stat(5); `rest` starts at field 3.
            let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
            *total.get_or_insert(0) += ticks;
        }
    }
    total
}

#[test]
fn the_progress_thread_sleeps_when_idle() {
    let _serial = serial();
    let Some(cs) = comms("the_progress_thread_sleeps_when_idle", 2) else {
        return;
    };
    let mut bufs = [[1.0f32; 4], [2.0f32; 4]];
    let (tx, rx) = mpsc::channel();
    let count = Arc::new(AtomicUsize::new(0));
    notify_both(&cs, &mut bufs, &tx, &count);
    for _ in 0..2 {
        rx.recv_timeout(WAIT).unwrap().0.unwrap();
    }
    // Nothing notified is pending: the threads park. (The thread name is cut to 15 bytes.)
    let Some(before) = thread_ticks("fabricoll-progr") else {
        return skip("the_progress_thread_sleeps_when_idle", "no /proc/self/task");
    };
    std::thread::sleep(Duration::from_millis(500));
    let after = thread_ticks("fabricoll-progr").unwrap();
    // 500 ms of spinning would be about 50 ticks; a parked thread takes none.
    println!("parked: {} ticks in 500 ms", after - before);
    assert!(after - before <= 2, "{} ticks while idle", after - before);
    // Pending but stalled (the peer never joins): the thread sleeps on the completion queue.
    let mut lone = [1.0f32; 4];
    let id = cs[0].start(&allreduce(&mut lone)).unwrap();
    cs[0]
        .notify(id, reporter(tx.clone(), count.clone()))
        .unwrap();
    // Time for the thread to finish its poll window and go to sleep, even on a loaded machine
    // (CPU time is counted, not wall time: load makes the check weaker, never flaky).
    std::thread::sleep(Duration::from_millis(500));
    let before = thread_ticks("fabricoll-progr").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let after = thread_ticks("fabricoll-progr").unwrap();
    println!("stalled: {} ticks in 500 ms", after - before);
    assert!(
        after - before <= 15,
        "{} ticks while stalled",
        after - before
    );
    cs[0].abort();
    assert!(rx.recv_timeout(WAIT).unwrap().0.is_err());
}

/// A figure, not a check (run with `--ignored --nocapture`): an 8-byte allreduce at 2
/// ranks, rank 1 blocking, rank 0 completing by `wait` or by `notify`. Per call: rank 0's
/// start to its completion (wait's return, or the callback's first instruction), and the
/// callback or return against the end of rank 1's call (the same clock: one process), whose
/// last act was to see rank 0's message after sending its own.
#[test]
#[ignore]
fn notify_latency() {
    let _serial = serial();
    let Some(cs) = comms("notify_latency", 2) else {
        return;
    };
    const N: usize = 4000;
    let us = |d: f64| d * 1e6;
    for mode in ["wait", "notify", "wait", "notify"] {
        let cs2 = cs.clone();
        let peer = std::thread::spawn(move || {
            let mut b = [1.0f32; 4];
            (0..N)
                .map(|_| {
                    cs2[1].run(&allreduce(&mut b)).unwrap();
                    Instant::now()
                })
                .collect::<Vec<_>>()
        });
        let mut b = [1.0f32; 4];
        let mut ends = Vec::with_capacity(N);
        let mut total = Vec::with_capacity(N);
        for _ in 0..N {
            let t0 = Instant::now();
            let id = cs[0].start(&allreduce(&mut b)).unwrap();
            let at = if mode == "wait" {
                cs[0].wait(id).unwrap();
                Instant::now()
            } else {
                let (tx, rx) = mpsc::sync_channel(1);
                let cb: Callback = Box::new(move |r| {
                    let _ = tx.send((r, Instant::now()));
                });
                cs[0].notify(id, cb).unwrap();
                let (r, at) = rx.recv().unwrap();
                r.unwrap();
                at
            };
            total.push((at - t0).as_secs_f64());
            ends.push(at);
        }
        let peer_ends = peer.join().unwrap();
        let mut lag: Vec<f64> = ends
            .iter()
            .zip(&peer_ends)
            .map(|(a, p)| {
                if a >= p {
                    (*a - *p).as_secs_f64()
                } else {
                    -(*p - *a).as_secs_f64()
                }
            })
            .collect();
        total.sort_by(f64::total_cmp);
        lag.sort_by(f64::total_cmp);
        println!(
            "{mode}: start to completion median {:.1} us (p90 {:.1}); after the peer's end median {:.1} us (p90 {:.1})",
            us(total[N / 2]),
            us(total[N * 9 / 10]),
            us(lag[N / 2]),
            us(lag[N * 9 / 10])
        );
    }
}

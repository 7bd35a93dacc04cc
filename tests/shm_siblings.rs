//! shm ranks as threads of one process (siblings). libfabric's shm maps a sibling's region by
//! taking the sibling's own mapping, which its close unmaps: a rank that destroys its
//! communicator while a peer still finishes its collective (or holds a message from it) must
//! not take the region away under that peer (`transport::fabric::shm::siblings`). Before that
//! was handled the process died of SIGSEGV inside `fi_cq_read`, so a failure here may be the
//! whole test binary crashing.
use nccl_net_fabricoll::algo::Collective;
use nccl_net_fabricoll::coll::{self, Comm, Kind};
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::transport::Region;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

/// Generous: these tests are about crashes, not deadlines.
const TIMEOUT_MS: u32 = 60_000;

/// Set (to the hex address of the parent's endpoint) in the child process of
/// `an_endpoint_with_no_sibling_closes_without_progress`.
const CHILD: &str = "FABRICOLL_SHM_SIBLINGS_TEST_PEER";

fn config(fastbox: bool) -> Config {
    let mut cfg = common::fixed_model(Some("shm"), TIMEOUT_MS);
    cfg.intra_provider = None;
    cfg.host = Some("0".into());
    cfg.shm_fastbox = fastbox;
    cfg
}

/// Rank r's AllReduces of `counts` floats, checked; then it drops its communicator at once,
/// while slower peers may still be finishing.
fn allreduces_then_destroy(comm: Arc<Comm>, r: usize, n: usize, counts: &[usize]) {
    for &count in counts {
        let mut inp = vec![(r + 1) as f32; count];
        let mut out = vec![0f32; count];
        // SAFETY: both vectors outlive the blocking call.
        let (send, recv) = unsafe {
            (
                Region::from_raw(inp.as_mut_ptr().cast(), count * 4),
                Region::from_raw(out.as_mut_ptr().cast(), count * 4),
            )
        };
        let call = common::call(Kind::Coll(Collective::AllReduce), send, recv, count);
        comm.run(&call)
            .unwrap_or_else(|e| panic!("rank {r} of {n}, count {count}: {e}"));
        let want = (n * (n + 1) / 2) as f32;
        assert!(
            out.iter().all(|&x| x == want),
            "rank {r} of {n}, count {count}"
        );
    }
    drop(comm);
}

#[test]
fn a_rank_that_destroys_first_leaves_its_sibling_ranks_running() {
    let test = "a_rank_that_destroys_first_leaves_its_sibling_ranks_running";
    // Without the fastbox every message goes through the provider; with it, the hellos and
    // what falls back to the provider do.
    for fastbox in [false, true] {
        for n in [2, 3, 7] {
            for _round in 0..3 {
                let Some(comms) = common::comms_in_process(test, "shm", &vec![config(fastbox); n])
                else {
                    return;
                };
                std::thread::scope(|s| {
                    for (r, c) in comms.into_iter().enumerate() {
                        s.spawn(move || allreduces_then_destroy(c, r, n, &[1, 4096, 1 << 20]));
                    }
                });
            }
        }
    }
}

/// Two shm endpoints of this process with `cfg`, or None (the test skipped) without shm.
fn two_endpoints(
    test: &str,
    cfg: &Config,
) -> Option<(
    Arc<dyn nccl_net_fabricoll::transport::Transport>,
    Arc<dyn nccl_net_fabricoll::transport::Transport>,
)> {
    match (coll::open_endpoint(cfg), coll::open_endpoint(cfg)) {
        (Ok(a), Ok(b)) => Some((a, b)),
        (Err(e), _) | (_, Err(e)) => {
            nccl_net_fabricoll::testing::skip(test, &format!("no shm endpoint ({e})"));
            None
        }
    }
}

#[test]
fn the_address_of_a_destroyed_sibling_is_refused_naming_it() {
    let test = "the_address_of_a_destroyed_sibling_is_refused_naming_it";
    let cfg = config(true);
    let Some((a, b)) = two_endpoints(test, &cfg) else {
        return;
    };
    let gone = a.address();
    drop(a);
    let e = b
        .insert_peer(&gone)
        .expect_err("a destroyed sibling's address")
        .to_string();
    assert!(e.contains("of this process was closed"), "{e}");
    // A live sibling is still welcome, and so is the same address twice.
    let c = coll::open_endpoint(&cfg).expect("a third endpoint");
    let p = b.insert_peer(&c.address()).expect("a live sibling");
    assert_eq!(b.insert_peer(&c.address()).expect("again"), p);
}

/// The peer process of `an_endpoint_with_no_sibling_closes_without_progress` (which starts it):
/// it opens an endpoint, sends one message to the parent's, which never answers, then closes
/// its endpoint (removing its region) and exits.
#[test]
#[ignore = "the peer of an_endpoint_with_no_sibling_closes_without_progress, which starts it"]
fn peer_that_sends_once_and_leaves() {
    let Ok(addr) = std::env::var(CHILD) else {
        return;
    };
    let t = coll::open_endpoint(&config(false)).expect("the peer's endpoint");
    let p = t
        .insert_peer(&common::unhex(&addr))
        .expect("the parent's address");
    t.send_owned(p, 1, vec![7u8; 8], 1).expect("send");
    // A few rounds of progress: the first message to a new peer may wait for the peer's
    // answer, which never comes; this process leaves anyway.
    let mut sink = Vec::new();
    for _ in 0..100 {
        t.poll(&mut sink).expect("poll");
    }
    drop(t);
}

/// An endpoint that never talked to an endpoint of its own process is closed at once when
/// dropped, as it was before siblings were parked: not progressed. libfabric 1.17's shm, when
/// it reads the first message of a peer of another process whose region is already gone
/// (that peer closed its endpoint), maps nothing and dereferences the null mapping
/// (`smr_progress_connreq`); progressing the endpoint at its close killed every CollNet rank
/// process over shm whose peer had left first (plugin-tests' collnet_harness).
#[test]
fn an_endpoint_with_no_sibling_closes_without_progress() {
    let test = "an_endpoint_with_no_sibling_closes_without_progress";
    let t = match coll::open_endpoint(&config(false)) {
        Ok(t) => t,
        Err(e) => {
            nccl_net_fabricoll::testing::skip(test, &format!("no shm endpoint ({e})"));
            return;
        }
    };
    let mut kid = common::ignored_test("peer_that_sends_once_and_leaves")
        .env(CHILD, common::hex(&t.address()))
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the peer");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = kid.try_wait().expect("wait for the peer") {
            break s;
        }
        if start.elapsed() > Duration::from_millis(u64::from(TIMEOUT_MS)) {
            let _ = kid.kill();
            panic!("the peer process did not finish");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success(), "the peer process: {status}");
    // The peer's message (and, on 1.17, its request to be mapped) waits unread; closing must
    // not read it.
    drop(t);
}

/// Messages a sibling sent and its peer never received are settled when both close: received
/// whole, whatever their size (inline, inject, segmented, copied). A receive that truncates
/// such a message kills the process inside libfabric 2.x's shm (`smr_copy_saved` follows a
/// null pointer once its copy comes up short), so settling must not truncate.
#[test]
fn unreceived_messages_of_every_size_are_settled_at_close() {
    let test = "unreceived_messages_of_every_size_are_settled_at_close";
    let cfg = config(false);
    let Some((a, b)) = two_endpoints(test, &cfg) else {
        return;
    };
    let to_b = a.insert_peer(&b.address()).expect("b's address");
    b.insert_peer(&a.address()).expect("a's address");
    // Inline, inject, past the inject size, segmented, and large.
    let sizes = [16usize, 1000, 5000, 70_000, 1 << 20];
    for (i, &len) in sizes.iter().enumerate() {
        a.send_owned(to_b, 100 + i as u64, vec![i as u8; len], i as u64)
            .expect("send");
    }
    // Progress both until every send completes (a segmented one needs the receiver's progress
    // to land in its unexpected queue), or until none has completed for a while: where a send
    // needs its receive (a rendezvous: libfabric before 1.19, where fabricoll matches small
    // messages itself), it never completes. Stopping early only leaves less to settle.
    let quiet = Duration::from_secs(2);
    let (mut done, mut sink) = (Vec::new(), Vec::new());
    let mut last = Instant::now();
    while done.len() < sizes.len() && last.elapsed() < quiet {
        if a.poll(&mut done).expect("a's poll") > 0 {
            last = Instant::now();
        }
        b.poll(&mut sink).expect("b's poll");
    }
    assert!(sink.is_empty(), "b received {} completions", sink.len());
    // Both dropped: b is parked (linked with a, still open), then both settle and close. A
    // crash here is the failure.
    drop(b);
    drop(a);
}

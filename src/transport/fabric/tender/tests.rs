//! The tender between two native TCP endpoints.
use super::super::testutil::*;
use super::super::FabricTransport;
use crate::transport::{Completion, Peer, Posted, Transport};
use std::time::{Duration, Instant};

/// Send `data` from `b` to `a` with `tag` (op `op`), polling `b` (and `a` too when `poll_a`)
/// until the send has completed; returns what `a`'s polls completed.
fn send(
    a: &FabricTransport,
    b: &FabricTransport,
    to_a: Peer,
    (tag, op): (u64, u64),
    data: &mut [u8],
    poll_a: bool,
) -> Vec<Completion> {
    let start = Instant::now();
    let (mut at_a, mut at_b) = (Vec::new(), Vec::<Completion>::new());
    let mut posted = false;
    while !at_b.iter().any(|c| c.op == op) {
        if !posted {
            posted = b.send(to_a, tag, region(data), None, op).expect("send") == Posted::Queued;
        }
        if poll_a {
            a.poll(&mut at_a).expect("poll");
        }
        b.poll(&mut at_b).expect("poll");
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "send {op}: {at_b:?}"
        );
    }
    assert!(at_b.iter().all(|c| c.status.is_ok()), "{at_b:?}");
    at_a
}

/// `a` as `b`'s peer, connected: a first message from `b` with both ends polled (connecting
/// needs the owner's progress).
fn connect(a: &FabricTransport, b: &FabricTransport) -> Peer {
    let to_a = b.insert_peer(&a.address()).expect("insert");
    let mut got = vec![0u8; 64];
    let mut first = vec![1u8; 64];
    a.recv(1, 0, region(&mut got), None, 1).expect("recv");
    let mut out = send(a, b, to_a, (1, 2), &mut first, true);
    let start = Instant::now();
    while out.is_empty() {
        a.poll(&mut out).expect("poll");
        assert!(start.elapsed() < Duration::from_secs(20), "first message");
    }
    to_a
}

/// Wait (at most 30 s) for `a`'s tender to complete something, then poll it: what completed.
fn tended(a: &FabricTransport, when: &str) -> Vec<Completion> {
    let start = Instant::now();
    while a.inner.lock().ready.is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the receive did not complete {when}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut out = Vec::new();
    a.poll(&mut out).expect("poll");
    out
}

/// A receive completes while its owner does not poll: the tender read it, and the owner's
/// next poll returns it. Without the tender the message stayed in the socket (this test
/// fails with `a.tender` taken away).
#[test]
fn an_endpoint_whose_owner_does_not_poll_is_progressed() {
    let Some((a, b)) = pair("net", Some("lo")) else {
        return;
    };
    assert!(a.tender.is_some(), "a native TCP endpoint has a tender");
    let to_a = connect(&a, &b);
    // From here on `a` is not polled while the message travels.
    let mut small: Vec<u8> = (0..200).map(|i| i as u8).collect();
    let mut got = vec![0u8; 200];
    a.recv(7, 0, region(&mut got), None, 3).expect("recv");
    send(&a, &b, to_a, (7, 4), &mut small, false);
    let out = tended(&a, "while its owner was away");
    assert!(
        out.len() == 1 && out[0].op == 3 && out[0].status.is_ok(),
        "{out:?}"
    );
    assert_eq!(got, small);
}

/// An owner inside a blocking wait (`Transport::owner_waits`) polls as soon as it gets a CPU,
/// so the tender leaves its endpoint alone however long it goes without polling; once the wait
/// is over, the tender steps in as before. A round of the tender that had already begun when
/// the wait began may still read a message (it looked before the wait was announced), so the
/// test allows three tries: a tender that ignores waits reads the message in every one.
#[test]
fn an_owner_inside_a_blocking_wait_is_left_alone() {
    let Some((a, b)) = pair("net", Some("lo")) else {
        return;
    };
    let to_a = connect(&a, &b);
    let mut early = Vec::new();
    for t in 0..3u64 {
        a.owner_waits(true);
        // A round of the tender begun before the wait ends first.
        std::thread::sleep(super::TENDER_AFTER * 4);
        let mut small: Vec<u8> = (0..200).map(|i| (i + t) as u8).collect();
        let mut got = vec![0u8; 200];
        a.recv(7 + t, 0, region(&mut got), None, 10 + t)
            .expect("recv");
        send(&a, &b, to_a, (7 + t, 20 + t), &mut small, false);
        // Many times the tender's period: it would have read the message by now.
        std::thread::sleep(super::TENDER_AFTER * 20);
        let left_alone = a.inner.lock().ready.is_empty();
        a.owner_waits(false);
        let out = tended(&a, "once its owner had left its wait");
        assert!(out.len() == 1 && out[0].op == 10 + t, "{out:?}");
        assert_eq!(got, small);
        if left_alone {
            return;
        }
        early.push(t);
    }
    panic!("the tender progressed an endpoint whose owner was inside a blocking wait, in tries {early:?}");
}

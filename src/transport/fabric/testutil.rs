//! What the endpoint tests share: pairs of endpoints of a provider and polling them.
use super::discovery::{discover, Use};
use super::FabricTransport;
use crate::config::Config;
use crate::transport::fabric::shm::watch;
use crate::transport::Posted;
use crate::transport::{Completion, Peer, Region, Transport};
use std::time::{Duration, Instant};

/// The running test's name: the test harness names each test's thread after it.
pub(super) fn test_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("transport::fabric test")
        .to_string()
}

/// The running test cannot run here because of `why` (`testing::skip`); the caller returns.
pub(super) fn skip(why: &str) {
    crate::testing::skip(&test_name(), why)
}

/// Two shm endpoints with fastboxes, or None (the test skipped) where they have none.
pub(super) fn shm_pair() -> Option<(FabricTransport, FabricTransport)> {
    let (a, b) = pair("shm", None)?;
    if a.inner.lock().shm.inbox.is_none() {
        skip("this libfabric's shm needs no fastbox (software matching is off)");
        return None;
    }
    Some((a, b))
}

/// Two endpoints of `provider` (on `domain`), or None (the test skipped) where it is missing.
pub(super) fn pair(
    provider: &str,
    domain: Option<&str>,
) -> Option<(FabricTransport, FabricTransport)> {
    pair_with(provider, domain, &[])
}

/// `pair` for a test that tries several providers: None where `provider` is missing, without
/// skipping (the test skips if it found none).
pub(super) fn try_pair(
    provider: &str,
    domain: Option<&str>,
) -> Option<(FabricTransport, FabricTransport)> {
    open_pair(provider, domain, &[]).ok()
}

/// `pair`, with the variables `more` set as well.
pub(super) fn pair_with(
    provider: &str,
    domain: Option<&str>,
    more: &[(&str, &str)],
) -> Option<(FabricTransport, FabricTransport)> {
    match open_pair(provider, domain, more) {
        Ok(p) => Some(p),
        Err(why) => {
            skip(&why);
            None
        }
    }
}

/// Two endpoints of `provider` on `domain` with the variables `more`, or why there are none.
fn open_pair(
    provider: &str,
    domain: Option<&str>,
    more: &[(&str, &str)],
) -> std::result::Result<(FabricTransport, FabricTransport), String> {
    let cfg = Config::from_lookup(|n| match n {
        "FABRICOLL_PROVIDER" => Some(provider.into()),
        "FABRICOLL_DOMAIN" => domain.map(String::from),
        _ => more
            .iter()
            .find(|(k, _)| *k == n)
            .map(|(_, v)| v.to_string()),
    })
    .expect("config");
    let disc = discover(&cfg, Use::Engines).map_err(|e| format!("provider {provider}: {e}"))?;
    if !disc
        .chosen
        .as_deref()
        .is_some_and(|c| super::names::answers(c, provider))
    {
        return Err(format!("provider {provider} is not offered here"));
    }
    let dev = disc
        .devices
        .first()
        .ok_or_else(|| format!("provider {provider} has no device here"))?;
    let a = FabricTransport::open(dev).expect("endpoint a");
    let b = FabricTransport::open(dev).expect("endpoint b");
    Ok((a, b))
}

pub(super) fn region(v: &mut [u8]) -> Region {
    // SAFETY: every buffer outlives the operations posted on it (each test polls them).
    unsafe { Region::from_raw(v.as_mut_ptr(), v.len()) }
}

/// Poll `a` and `b` (the provider moves large messages only while both progress) until
/// they have `want` completions each, `out` holding those found before.
pub(super) fn completions(
    a: &FabricTransport,
    b: &FabricTransport,
    want: usize,
    mut out: [Vec<Completion>; 2],
) -> [Vec<Completion>; 2] {
    let start = Instant::now();
    while out[0].len() < want || out[1].len() < want {
        a.poll(&mut out[0]).expect("poll");
        b.poll(&mut out[1]).expect("poll");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no completion: {:?}",
            out
        );
    }
    out
}

/// A spawned process that `t` watches as `peer`'s (both endpoints of a pair live in this
/// process): kill it to make the peer exit.
pub(super) fn stand_in(t: &FabricTransport, peer: Peer) -> std::process::Child {
    let child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep");
    let name = format!("{}{}-0-1", watch::PREFIX, child.id());
    let w = watch::PeerWatch::of_address(name.as_bytes()).expect("our name format");
    t.inner.lock().shm.watch.insert(peer.0, w);
    child
}

/// A pair of shm endpoints that hold a slot in each other's inbox, with their peers.
pub(super) fn linked_pair() -> Option<(FabricTransport, FabricTransport, Peer, Peer)> {
    let (a, b) = shm_pair()?;
    let to_a = b.insert_peer(&a.address()).expect("insert");
    let to_b = a.insert_peer(&b.address()).expect("insert");
    assert!(a.inner.lock().shm.rndv_ok(to_b.0) && b.inner.lock().shm.rndv_ok(to_a.0));
    Some((a, b, to_a, to_b))
}

/// Send `src` from `b` to `a` as op `op`, progressing both while the send is refused.
pub(super) fn send_all(
    a: &FabricTransport,
    b: &FabricTransport,
    to_a: Peer,
    tag: u64,
    src: &mut [u8],
    op: u64,
) {
    let (start, mut sink) = (Instant::now(), Vec::new());
    while b.send(to_a, tag, region(src), None, op).expect("send") == Posted::Busy {
        a.poll(&mut sink).expect("poll");
        assert!(sink.is_empty(), "{sink:?}");
        assert!(start.elapsed() < Duration::from_secs(10), "send stays busy");
    }
}

//! The shm paths: one `ShmPath` per endpoint owns their state. Every shm endpoint has a region
//! name of its own and watches its peers' processes; one that matches small messages in
//! software (libfabric before 1.19, see `discovery::inject_safe`) also has the rest.
//!
//! - `matching`: small messages sent untagged into a pool of our receives, matched here;
//! - `fastbox`: shared-memory rings that carry small messages between fastbox peers;
//! - `cma` and `rndv`: large messages copied by their receiver out of the sender's memory;
//! - `direct`: the direct channel (`Transport::send_now` / `take_now`) over the fastbox;
//! - `watch`: unique names of shm regions, and the watch on peers' processes;
//! - `siblings`: endpoints of this process that talk to each other, closed together.
pub(crate) mod cma;
mod direct;
pub(crate) mod fastbox;
mod foreign;
pub(crate) mod matching;
pub(crate) mod rndv;
pub(crate) mod siblings;
pub(crate) mod watch;

use super::{check, sys, Inner, Role};
use crate::error::{Error, Result};
use crate::transport::{Caps, Peer};
use matching::Soft;
use rndv::RndvSend;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::ptr;

/// The state of an endpoint's shm paths.
pub(crate) struct ShmPath {
    /// Software matching of small messages (shm before libfabric 1.19), else None.
    pub(crate) soft: Option<Soft>,
    /// The shared-memory region's name (shm), unlinked when this drops if still open.
    pub(crate) name: Option<String>,
    /// shm peers' processes, checked before every post to them.
    pub(crate) watch: FxHashMap<u64, watch::PeerWatch>,
    /// Our shared-memory inbox for small messages (shm with software matching), else None.
    pub(crate) inbox: Option<fastbox::Inbox>,
    /// Slots claimed in peers' inboxes, by peer.
    pub(crate) outbox: FxHashMap<u64, fastbox::Outbox>,
    /// The shm peers' `fastbox::sender_id`s, to ask our inbox whether they hold a slot in it.
    pub(crate) peer_senders: FxHashMap<u64, u64>,
    /// The other way round: the peer whose endpoint has a given `sender_id`.
    pub(crate) sender_peers: FxHashMap<u64, u64>,
    /// Large sends announced by an `RTS` frame and not yet acknowledged, by cookie.
    pub(crate) rndv: FxHashMap<u64, RndvSend>,
    next_cookie: u64,
    /// This process's pid, for `RTS` frames: `getpid` is a system call, kept off the path of
    /// every large send. An endpoint is not used across `fork`.
    pid: i32,
    /// `ACK` frames that found the sender's ring full: (its `sender_id`, payload).
    acks: VecDeque<(u64, [u8; cma::ACK_BYTES])>,
    /// Peers that could not copy from our memory: large messages to them take the provider.
    no_cma: FxHashMap<u64, ()>,
    /// Sends that a `FALLBACK` answer turned to the provider while it was busy, posted again
    /// on poll.
    resend: VecDeque<RndvSend>,
    /// Tests: act as if the kernel refused every copy from a peer (`cma::refused`).
    #[cfg(test)]
    pub(crate) refuse_cma: bool,
    /// `take_now` calls that found nothing since the completion queue was last read there.
    direct_misses: u32,
    /// Peers whose hello (see `Inner::hello`) the provider refused with EAGAIN, sent again on
    /// poll.
    pub(crate) hellos: Vec<u64>,
    /// Messages that settling (`siblings`) or the look for another call's messages
    /// (`foreign`) found waiting and received whole, to drop them.
    pub(crate) settled: u64,
    /// The answer to the last look (`foreign`): a waiting message's tag and length.
    pub(crate) looked: Option<(u64, usize)>,
}

impl ShmPath {
    /// The paths of an endpoint whose shm region is `name` (None: not shm); software matching
    /// and the inbox are set up later, where the provider needs them.
    pub(crate) fn new(name: Option<String>) -> ShmPath {
        ShmPath {
            soft: None,
            name,
            watch: FxHashMap::default(),
            inbox: None,
            outbox: FxHashMap::default(),
            peer_senders: FxHashMap::default(),
            sender_peers: FxHashMap::default(),
            rndv: FxHashMap::default(),
            next_cookie: 1,
            pid: std::process::id() as i32,
            acks: VecDeque::new(),
            no_cma: FxHashMap::default(),
            resend: VecDeque::new(),
            #[cfg(test)]
            refuse_cma: false,
            direct_misses: 0,
            hellos: Vec::new(),
            settled: 0,
            looked: None,
        }
    }

    /// The pid of a watched shm peer whose process has exited (`ask_kernel`: poll its pidfd
    /// when the watcher has not flagged it yet; see `watch::PeerWatch::dead`), else None.
    pub(crate) fn gone_pid(&self, peer: Peer, ask_kernel: bool) -> Option<i32> {
        let w = self.watch.get(&peer.0).filter(|w| w.dead(ask_kernel))?;
        Some(w.pid())
    }

    /// Whether both ends of `peer` hold a slot in each other's inbox, so that every message
    /// it sends us, and every answer it owes us, comes through our inbox.
    pub(crate) fn both_slots(&self, peer: u64) -> bool {
        match &self.inbox {
            Some(ib) if self.outbox.contains_key(&peer) => self
                .peer_senders
                .get(&peer)
                .is_some_and(|&id| ib.sends_here(id)),
            _ => false,
        }
    }

    /// Whether a large message to `peer` may go as an `RTS` (see `cma`).
    pub(crate) fn rndv_ok(&self, peer: u64) -> bool {
        !self.no_cma.contains_key(&peer) && self.both_slots(peer)
    }
}

impl Drop for ShmPath {
    fn drop(&mut self) {
        if let Some(n) = self.name.take() {
            watch::closed(&n);
        }
    }
}

/// The error of an operation on a shm peer whose process `pid` has exited (`how`: what it
/// left undone, if anything).
pub(crate) fn peer_exited(pid: i32, how: &str) -> Error {
    Error::Remote(format!("the peer process {pid} has exited{how}"))
}

impl Inner {
    /// An empty untagged message to a fastbox peer (its pool receive drops it). Small messages,
    /// the handshakes among them, no longer reach the provider, whose shm maps the peer's
    /// region at the first send and answers EAGAIN until then: the hello sets that up when the
    /// peer is inserted, so that the first large send finds it ready. If the provider is busy,
    /// again on the next poll.
    ///
    /// Never to a peer whose process has exited: it may have died holding its region's lock,
    /// on which the provider's send would spin forever (asked of the kernel, not only of the
    /// watcher's flag: creation is when a rank is most likely to be found dead). The hello is
    /// dropped; what is later posted to that peer fails on the same check, naming it.
    pub(crate) fn hello(&mut self, peer: u64) -> Result<()> {
        if let Some(pid) = self.shm.gone_pid(Peer(peer), true) {
            log::debug!("no fastbox hello to peer process {pid}: it has exited");
            return Ok(());
        }
        let ctx = self.new_ctx(0, 0, false, None, Role::Swallow);
        // SAFETY: a zero-byte send; ctx lives in `ops` until its completion is read.
        let rc = unsafe { sys::fi_send(self.tx_ep, ptr::null(), 0, ptr::null_mut(), peer, ctx) };
        if rc == 0 {
            return Ok(());
        }
        self.ops.remove(&(ctx as usize));
        if rc == -(sys::FI_EAGAIN as isize) {
            if !self.shm.hellos.contains(&peer) {
                self.shm.hellos.push(peer);
            }
            return Ok(());
        }
        check("fi_send (fastbox hello)", rc as i64)
    }

    /// Read our inbox: messages go to the software matcher like pool messages, `RTS` frames
    /// to the matcher too, `ACK`s complete our sends.
    pub(crate) fn drain_inbox(&mut self, caps: &Caps) {
        if let Some(mut ib) = self.shm.inbox.take() {
            ib.drain(|a| self.on_frame(caps, a));
            self.shm.inbox = Some(ib);
        }
    }

    /// One frame of our inbox, to the matcher or the rendezvous.
    fn on_frame(&mut self, caps: &Caps, a: fastbox::Arrived<'_>) {
        match a.kind {
            fastbox::RTS => self.on_rts(a.from, a.msg),
            fastbox::ACK => self.on_ack(caps, a.msg),
            _ => self.on_small(a.msg),
        }
    }
}

/// Whether the shm endpoint named `name` (one of ours) was closed: one of this process dropped
/// (`siblings`), or another process's whose region is gone (the provider unlinks it when the
/// endpoint closes; a killed process leaves it, but the peer watch sees that one exit).
pub(crate) fn ended(name: &str) -> bool {
    if watch::of_this_process(name) {
        return siblings::dropped(name);
    }
    !std::path::Path::new("/dev/shm").join(name).exists()
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use crate::transport::fabric::shm::fastbox;
    use crate::transport::{Posted, Transport};
    use std::time::{Duration, Instant};

    #[test]
    fn small_shm_messages_go_through_the_fastbox_in_order_and_large_ones_do_not() {
        let Some((a, b)) = shm_pair() else { return };
        let to_a = b.insert_peer(&a.address()).expect("insert");
        assert!(
            b.inner.lock().shm.outbox.contains_key(&to_a.0),
            "a slot in a's inbox"
        );
        let fb = fastbox::MAX_PAYLOAD;
        let sizes = [0usize, 1, 8, 4096, 4097, fb, fb + 1, 65536];
        let mut src: Vec<Vec<u8>> = sizes
            .iter()
            .map(|n| (0..*n).map(|i| (i * 13 + n) as u8).collect())
            .collect();
        // Four messages with one tag: received in the order sent, whatever the path.
        let mut dst: Vec<Vec<u8>> = sizes.iter().map(|n| vec![0u8; n + 8]).collect();
        for (i, d) in dst.iter_mut().enumerate() {
            let tag = if i < 4 { 5 } else { 6 + i as u64 };
            a.recv(tag, 0, region(d), None, i as u64).expect("recv");
        }
        let (start, mut early) = (Instant::now(), [Vec::new(), Vec::new()]);
        for (i, s) in src.iter_mut().enumerate() {
            let tag = if i < 4 { 5 } else { 6 + i as u64 };
            // The provider may refuse (EAGAIN) until it has mapped a's region: progress both.
            while b
                .send(to_a, tag, region(s), None, 100 + i as u64)
                .expect("send")
                == Posted::Busy
            {
                a.poll(&mut early[0]).expect("poll");
                b.poll(&mut early[1]).expect("poll");
                assert!(start.elapsed() < Duration::from_secs(10), "send stays busy");
            }
        }
        let [mut got, sent] = completions(&a, &b, sizes.len(), early);
        assert!(sent.iter().all(|c| c.status.is_ok()));
        // The provider's halves of the receives the fastbox served are cancelled and their
        // completions swallowed: one completion per receive, nothing more.
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(200) {
            a.poll(&mut got).expect("poll");
        }
        assert_eq!(got.len(), sizes.len(), "{got:?}");
        got.sort_by_key(|c| c.op);
        for (i, c) in got.iter().enumerate() {
            assert!(c.status.is_ok(), "{:?}", c.status);
            assert_eq!(c.len, sizes[i], "op {i}");
            assert_eq!(dst[i][..sizes[i]], src[i][..], "payload of op {i}");
        }
    }

    #[test]
    fn a_waiter_with_an_inbox_never_sleeps_past_a_fastbox_frame() {
        let Some((a, b)) = shm_pair() else { return };
        let to_a = b.insert_peer(&a.address()).expect("insert");
        let mut buf = vec![0u8; 8];
        a.recv(7, 0, region(&mut buf), None, 1).expect("recv");
        // Frames raise no completion, so a wait must return without sleeping its timeout
        // (on a CQ with a wait fd it would sleep all of it).
        let t = Instant::now();
        a.wait(Duration::from_secs(5)).expect("wait");
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "slept {:?}",
            t.elapsed()
        );
        let mut msg = *b"no sleep";
        assert_eq!(
            b.send(to_a, 7, region(&mut msg), None, 2).expect("send"),
            Posted::Queued
        );
        let [c, _] = completions(&a, &b, 1, Default::default());
        assert_eq!((c[0].op, c[0].len), (1, 8));
        assert_eq!(&buf, b"no sleep");
    }
}

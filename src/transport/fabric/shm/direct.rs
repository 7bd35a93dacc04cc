//! The direct channel (`Transport::send_now` / `take_now`): small messages written straight into
//! a fastbox peer's inbox and taken out by tag, without an operation or a completion.
use super::super::Inner;
use super::matching::Unexp;
use super::{fastbox, peer_exited, ShmPath};
use crate::error::{Error, Result};
use crate::transport::{Caps, Peer};

/// How many times `take_now` reads the completion queue for a message of a peer whose process
/// has exited before it calls the message lost.
const GONE_READS: usize = 16;

impl ShmPath {
    /// `Transport::direct_bytes`: the fastbox, where both ends have one. Up to `soft.small`
    /// bytes that holds whichever way the peer sends (its frames and its provider messages of
    /// that size both end in `on_small`); up to `MAX_PAYLOAD` only while the peer holds a slot
    /// in our inbox, since without one its larger messages take the provider's tagged path,
    /// which `take_now` does not look at.
    pub(crate) fn direct_bytes(&self, peer: Peer) -> usize {
        match &self.soft {
            Some(soft) if self.inbox.is_some() && self.outbox.contains_key(&peer.0) => {
                if self.both_slots(peer.0) {
                    fastbox::MAX_PAYLOAD
                } else {
                    fastbox::MAX_PAYLOAD.min(soft.small)
                }
            }
            _ => 0,
        }
    }
}

impl Inner {
    /// `Transport::send_now`.
    pub(crate) fn send_now(
        &mut self,
        caps: &Caps,
        peer: Peer,
        tag: u64,
        data: &[u8],
    ) -> Result<bool> {
        let max = self.shm.direct_bytes(peer);
        if data.len() > max {
            return Err(Error::arg(
                "data",
                format!(
                    "{} bytes is more than the direct channel to this peer carries ({max})",
                    data.len()
                ),
            ));
        }
        if let Some(pid) = self.shm.gone_pid(peer, false) {
            return Err(peer_exited(pid, ""));
        }
        let ob = self
            .shm
            .outbox
            .get_mut(&peer.0)
            .expect("direct_bytes checked it");
        match ob.push(tag, data) {
            fastbox::Pushed::Done => Ok(true),
            fastbox::Pushed::Full => {
                // The peer may be waiting for room in our inbox just as we wait for its.
                self.drain_inbox(caps);
                Ok(false)
            }
        }
    }

    /// `Transport::take_now`. Looks in what arrived earlier, then the inbox, and every
    /// `CQ_EVERY` misses the completion queue (a peer without a slot in our inbox sends small
    /// messages through the provider); a peer whose exit was seen before the look, and whose
    /// message is not in the completion queue either, has gone without sending it.
    pub(crate) fn take_now(
        &mut self,
        caps: &Caps,
        peer: Peer,
        tag: u64,
        ignore: u64,
        f: &mut dyn FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<bool> {
        const CQ_EVERY: u32 = 256;
        let gone = self.shm.gone_pid(peer, false);
        if self.take_unexpected(tag, ignore, f)? {
            return Ok(true);
        }
        let mut found: Option<Result<()>> = None;
        if let Some(mut ib) = self.shm.inbox.take() {
            ib.drain(|a| {
                let arrived = match a.msg.get(..8) {
                    Some(t) if a.kind == fastbox::DATA && found.is_none() => {
                        Some(u64::from_le_bytes(t.try_into().expect("8 bytes")))
                    }
                    _ => None,
                };
                if let Some(t) = arrived.filter(|t| (t ^ tag) & !ignore == 0) {
                    found = Some(f(t, &a.msg[8..]));
                } else {
                    self.on_frame(caps, a);
                }
            });
            self.shm.inbox = Some(ib);
        }
        if let Some(r) = found {
            return r.map(|_| true);
        }
        self.shm.direct_misses += 1;
        if self.shm.direct_misses >= CQ_EVERY {
            self.shm.direct_misses = 0;
            self.progress(caps)?;
            if self.take_unexpected(tag, ignore, f)? {
                return Ok(true);
            }
        }
        let Some(pid) = gone else {
            return Ok(false);
        };
        // What the peer sent through the provider before it exited is in the completion
        // queue, which the look above reads only every CQ_EVERY misses: read it before
        // calling the message lost, several times, since the provider processes a bounded
        // number of commands per read (and a message may take more than one).
        for _ in 0..GONE_READS {
            self.progress(caps)?;
            if self.take_unexpected(tag, ignore, f)? {
                return Ok(true);
            }
        }
        Err(peer_exited(pid, " without sending the message"))
    }

    /// A message matching `tag` (bits in `ignore` aside) that arrived before anyone asked for
    /// it, handed to `f` with its tag.
    pub(crate) fn take_unexpected(
        &mut self,
        tag: u64,
        ignore: u64,
        f: &mut dyn FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<bool> {
        let Some(soft) = self.shm.soft.as_mut() else {
            return Ok(false);
        };
        let Some(i) = soft
            .unexpected
            .iter()
            .position(|(t, _)| (t ^ tag) & !ignore == 0)
        else {
            return Ok(false);
        };
        let (t, m) = soft.unexpected.remove(i).expect("index from position");
        match m {
            Unexp::Data(data) => f(t, &data).map(|_| true),
            // Only a program whose ranks disagree on a message's size gets here: the direct
            // channel carries messages of up to the fastbox payload, an RTS announces larger.
            Unexp::Rndv { rts, .. } => Err(Error::InvalidUsage(format!(
                "a message of {} bytes arrived for a receive buffer of at most {} bytes",
                rts.len,
                fastbox::MAX_PAYLOAD
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::testutil::*;
    use super::super::fastbox;
    use crate::error::Error;
    use crate::transport::fabric::FabricTransport;
    use crate::transport::Posted;
    use crate::transport::{Peer, Transport};
    use std::time::{Duration, Instant};

    #[test]
    fn the_direct_channel_carries_more_than_small_messages_only_from_peers_with_a_slot_here() {
        let Some((a, b)) = shm_pair() else { return };
        // Every slot of a's inbox taken before b comes: b's messages to a beyond the small
        // size then take the provider's tagged path, which take_now cannot see.
        let squatters = squat(&a);
        let to_a = b.insert_peer(&a.address()).expect("insert");
        let to_b = a.insert_peer(&b.address()).expect("insert");
        assert!(
            !b.inner.lock().shm.outbox.contains_key(&to_a.0),
            "no slot left"
        );
        assert_eq!(b.direct_bytes(to_a), 0, "b cannot write into a's inbox");
        let small = a.inner.lock().shm.soft.as_ref().expect("soft").small;
        assert!(small < fastbox::MAX_PAYLOAD);
        assert_eq!(a.direct_bytes(to_b), small, "b holds no slot in a's inbox");
        drop(squatters);
        // With both slots held, the whole fastbox payload, both ways.
        let (c, d) = shm_pair().expect("a second pair");
        let to_c = d.insert_peer(&c.address()).expect("insert");
        let to_d = c.insert_peer(&d.address()).expect("insert");
        assert_eq!(c.direct_bytes(to_d), fastbox::MAX_PAYLOAD);
        assert_eq!(d.direct_bytes(to_c), fastbox::MAX_PAYLOAD);
        let big: Vec<u8> = (0..fastbox::MAX_PAYLOAD).map(|i| (i * 31) as u8).collect();
        assert!(d.send_now(to_c, 4, &big).expect("send_now"));
        assert_eq!(take(&c, to_d, 4), big);
    }

    /// Every slot of `t`'s inbox, held until the result is dropped: peers that come later
    /// get none.
    fn squat(t: &FabricTransport) -> Vec<fastbox::Outbox> {
        let name = t
            .inner
            .lock()
            .shm
            .inbox
            .as_ref()
            .expect("inbox")
            .name
            .clone();
        (0..fastbox::SLOTS)
            .map(|i| fastbox::Outbox::open(&name, &format!("squatter-{i}")).expect("slot"))
            .collect()
    }

    /// Make `peer` exit as `t` sees it (both endpoints live in this process: a spawned
    /// process stands in for the peer's), and wait up to 5 s until `t` flags it.
    fn exit_peer(t: &FabricTransport, peer: Peer) {
        let mut child = stand_in(t, peer);
        child.kill().expect("kill");
        child.wait().expect("reap");
        let start = Instant::now();
        while t.inner.lock().shm.gone_pid(peer, false).is_none() {
            assert!(start.elapsed() < Duration::from_secs(5), "never flagged");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Take tag `tag` from `peer` on `t`, polling up to 5 s.
    fn take(t: &FabricTransport, peer: Peer, tag: u64) -> Vec<u8> {
        let start = Instant::now();
        let mut got = None;
        while !t
            .take_now(peer, tag, 0, &mut |_, m| {
                got = Some(m.to_vec());
                Ok(())
            })
            .expect("take_now")
        {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "tag {tag} never came"
            );
        }
        got.expect("taken")
    }

    #[test]
    fn the_direct_channel_delivers_by_tag_in_any_order_and_refuses_what_it_cannot_carry() {
        let Some((a, b)) = shm_pair() else { return };
        assert!(a.caps().direct_channel && b.caps().direct_channel);
        let to_a = b.insert_peer(&a.address()).expect("insert");
        let to_b = a.insert_peer(&b.address()).expect("insert");
        let max = b.direct_bytes(to_a);
        assert!(max == fastbox::MAX_PAYLOAD && a.direct_bytes(to_b) == max);
        // Nothing yet; then three tags taken in another order than sent (the ones passed
        // over wait among the unexpected), one of them the largest payload.
        let none = a
            .take_now(to_b, 1, 0, &mut |_, _| Ok(()))
            .expect("take_now");
        assert!(!none);
        let big: Vec<u8> = (0..max).map(|i| (i * 7) as u8).collect();
        assert!(b.send_now(to_a, 1, b"one").expect("send_now"));
        assert!(b.send_now(to_a, 2, &big).expect("send_now"));
        assert!(b.send_now(to_a, 3, b"").expect("send_now"));
        assert_eq!(take(&a, to_b, 3), b"");
        assert_eq!(take(&a, to_b, 1), b"one");
        assert_eq!(take(&a, to_b, 2), big);
        // The general path's recv matches what send_now sent, and take_now takes what send
        // sent: one wire format.
        let mut buf = [0u8; 5];
        a.recv(9, 0, region(&mut buf), None, 77).expect("recv");
        assert!(b.send_now(to_a, 9, b"mixed").expect("send_now"));
        let (start, mut c) = (Instant::now(), Vec::new());
        while c.is_empty() {
            a.poll(&mut c).expect("poll");
            assert!(start.elapsed() < Duration::from_secs(5), "no completion");
        }
        assert_eq!((c[0].op, c[0].len, &buf), (77, 5, b"mixed"));
        let mut msg = *b"general";
        assert_eq!(
            b.send(to_a, 10, region(&mut msg), None, 5).expect("send"),
            Posted::Queued
        );
        assert_eq!(take(&a, to_b, 10), b"general");
        // The taker's error comes back, and the message is consumed all the same.
        assert!(b.send_now(to_a, 11, b"bad").expect("send_now"));
        let start = Instant::now();
        let err = loop {
            match a.take_now(to_b, 11, 0, &mut |_, _| Err(Error::Remote("no".into()))) {
                Ok(false) => assert!(start.elapsed() < Duration::from_secs(5)),
                Ok(true) => panic!("the error was lost"),
                Err(e) => break e,
            }
        };
        assert!(err.to_string().contains("no"), "{err}");
        assert!(!a
            .take_now(to_b, 11, 0, &mut |_, _| Ok(()))
            .expect("take_now"));
        // More than the channel carries: an error naming the argument, nothing sent.
        let err = b.send_now(to_a, 12, &vec![0u8; max + 1]).unwrap_err();
        assert!(err.to_string().contains("'data'"), "{err}");
    }

    #[test]
    fn a_full_direct_channel_says_so_and_takes_more_once_drained() {
        let Some((a, b)) = shm_pair() else { return };
        let to_a = b.insert_peer(&a.address()).expect("insert");
        let to_b = a.insert_peer(&b.address()).expect("insert");
        let payload = vec![0x5au8; b.direct_bytes(to_a)];
        let mut sent = 0u64;
        while b.send_now(to_a, sent, &payload).expect("send_now") {
            sent += 1;
            assert!(sent < 1000, "the ring never fills");
        }
        assert!(sent > 0);
        for tag in 0..sent {
            assert_eq!(take(&a, to_b, tag), payload);
        }
        assert!(b.send_now(to_a, sent, &payload).expect("send_now"));
        assert_eq!(take(&a, to_b, sent), payload);
    }

    #[test]
    fn what_an_exited_peer_sent_through_the_provider_is_still_taken() {
        let Some((a, b)) = shm_pair() else { return };
        // Every slot of a's inbox taken before b comes: b's posted send to a goes through the
        // provider and waits in a's completion queue, which a has not read yet.
        let _squatters = squat(&a);
        let to_a = b.insert_peer(&a.address()).expect("insert");
        let to_b = a.insert_peer(&b.address()).expect("insert");
        let mut msg = b"last words".to_vec();
        send_all(&a, &b, to_a, 7, &mut msg, 1);
        exit_peer(&a, to_b);
        assert_eq!(take(&a, to_b, 7), b"last words");
        let e = a.take_now(to_b, 8, 0, &mut |_, _| Ok(())).unwrap_err();
        assert!(e.to_string().contains("exited without sending"), "{e}");
    }

    #[test]
    fn the_direct_channel_reports_a_peer_whose_process_exited() {
        let Some((a, b)) = shm_pair() else { return };
        let to_a = b.insert_peer(&a.address()).expect("insert");
        let to_b = a.insert_peer(&b.address()).expect("insert");
        assert!(b.send_now(to_a, 1, b"last words").expect("send_now"));
        exit_peer(&a, to_b);
        // What it sent before it went is still taken; then neither side waits for it.
        assert_eq!(take(&a, to_b, 1), b"last words");
        let e = a.take_now(to_b, 2, 0, &mut |_, _| Ok(())).unwrap_err();
        assert!(e.to_string().contains("exited without sending"), "{e}");
        let e = a.send_now(to_b, 3, b"x").unwrap_err();
        assert!(e.to_string().contains("has exited"), "{e}");
    }
}

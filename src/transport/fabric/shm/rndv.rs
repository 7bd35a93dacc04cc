//! The CMA rendezvous between fastbox peers (see `cma`): a large send goes out as an `RTS`
//! frame, the receiver copies the data out of the sender's memory and answers with an `ACK`.
use super::super::{Inner, OpBuf};
use super::cma;
use super::fastbox;
use super::matching::{too_large, SoftDst, SoftRecv, Unexp};
use super::peer_exited;
use crate::error::Error;
use crate::transport::{Caps, Completion, OpId, Peer, Posted};

/// A large send announced by an `RTS` frame, waiting for the receiver's `ACK` (see `cma`).
pub(crate) struct RndvSend {
    pub(crate) peer: u64,
    pub(crate) tag: u64,
    pub(crate) addr: usize,
    pub(crate) len: usize,
    pub(crate) desc: usize,
    pub(crate) op: OpId,
    pub(crate) owned: Option<Vec<u8>>,
}

impl Inner {
    /// Announce `s` to its peer with an `RTS` frame; the send completes on the `ACK`.
    pub(crate) fn post_rts(&mut self, s: RndvSend) -> Posted {
        let cookie = self.shm.next_cookie;
        let rts = cma::Rts {
            pid: self.shm.pid,
            addr: s.addr as u64,
            len: s.len as u64,
            cookie,
        };
        let ob = self
            .shm
            .outbox
            .get_mut(&s.peer)
            .expect("rndv_ok checked it");
        match ob.push_kind(fastbox::RTS, s.tag, &rts.encode()) {
            fastbox::Pushed::Done => {
                self.shm.next_cookie += 1;
                self.shm.rndv.insert(cookie, s);
                Posted::Queued
            }
            fastbox::Pushed::Full => {
                if let Some(data) = s.owned {
                    self.backlog.push_front((Peer(s.peer), s.tag, data, s.op));
                }
                Posted::Busy
            }
        }
    }

    /// An `RTS` frame from the fastbox sender `from`: match it in posted order or keep it.
    pub(crate) fn on_rts(&mut self, from: u64, msg: &[u8]) {
        let tag = u64::from_le_bytes(msg[0..8].try_into().expect("8 bytes"));
        let Some(rts) = cma::Rts::decode(&msg[8..]) else {
            log::warn!("malformed RTS frame ({} bytes) dropped", msg.len());
            return;
        };
        let soft = self.shm.soft.as_mut().expect("soft mode");
        match soft.take_posted(tag) {
            Some((i, r)) => {
                if let Some(r) = self.fetch(r, tag, rts, from) {
                    // The provider brings it instead: the receive stays where it was.
                    self.shm
                        .soft
                        .as_mut()
                        .expect("soft mode")
                        .posted
                        .insert(i, r);
                }
            }
            None => soft.unexpected.push_back((tag, Unexp::Rndv { rts, from })),
        }
    }

    /// Complete receive `r` with the message `rts` announced (tag `tag`, from the fastbox
    /// sender `from`) by copying it out of the sender's memory, and answer the sender. Returns
    /// the receive when the kernel refused the copy: the sender then sends through the
    /// provider, into the receive's provider half (posted whenever a message may exceed the
    /// small size), so it must stay posted.
    pub(crate) fn fetch(
        &mut self,
        r: SoftRecv,
        tag: u64,
        rts: cma::Rts,
        from: u64,
    ) -> Option<SoftRecv> {
        let len = rts.len as usize;
        let (answer, got) = if rts.len > r.len as u64 {
            // The receive fails, the send is done: the message was delivered, just too large.
            (cma::AckStatus::Done, Err(too_large(rts.len, r.len)))
        } else {
            match self.copy_in(r.dst, rts) {
                Err(e) if cma::refused(&e) => {
                    log::info!(
                        "the kernel refuses copies from process {} ({e}): its large messages \
                         come through the provider",
                        rts.pid
                    );
                    self.ack(from, rts.cookie, cma::AckStatus::Fallback);
                    return Some(r);
                }
                Err(e) => (
                    cma::AckStatus::Failed,
                    Err(Error::System(format!(
                        "receive failed: copying {len} bytes from process {}: {e}",
                        rts.pid
                    ))),
                ),
                Ok(data) => (cma::AckStatus::Done, Ok(data)),
            }
        };
        self.ack(from, rts.cookie, answer);
        if let Some(ctx) = r.provider {
            self.swallow(ctx);
        }
        self.ready.push(match got {
            Ok(data) => Completion::done(r.op, len, tag, data),
            Err(e) => Completion::failed(r.op, tag, e),
        });
        None
    }

    /// Copy the message `rts` announced into `dst` (a new buffer for an owned receive, which
    /// is returned).
    pub(crate) fn copy_in(&self, dst: SoftDst, rts: cma::Rts) -> std::io::Result<Option<Vec<u8>>> {
        #[cfg(test)]
        if self.shm.refuse_cma {
            return Err(std::io::Error::from_raw_os_error(libc::EPERM));
        }
        let len = rts.len as usize;
        match dst {
            SoftDst::Region(region) => region
                .with_mut(|d| cma::read_from(rts.pid, rts.addr, &mut d[..len]))
                .map(|_| None),
            SoftDst::Owned => {
                let mut v = vec![0u8; len];
                cma::read_from(rts.pid, rts.addr, &mut v).map(|_| Some(v))
            }
        }
    }

    /// Send an `ACK` to the fastbox sender `from`, now or (its ring full) on a later poll.
    pub(crate) fn ack(&mut self, from: u64, cookie: u64, status: cma::AckStatus) {
        let payload = cma::encode_ack(cookie, status);
        if !self.shm.acks.is_empty() || !self.push_ack(from, &payload) {
            self.shm.acks.push_back((from, payload));
        }
    }

    /// Push one `ACK`; false if the ring is full. One for a sender we hold no slot of is
    /// dropped with a warning (its send then fails at its deadline; senders announce only to
    /// peers that hold a slot in their inbox, so this is not expected).
    pub(crate) fn push_ack(&mut self, from: u64, payload: &[u8]) -> bool {
        let ob = self
            .shm
            .sender_peers
            .get(&from)
            .and_then(|p| self.shm.outbox.get_mut(p));
        match ob {
            Some(ob) => ob.push_kind(fastbox::ACK, 0, payload) == fastbox::Pushed::Done,
            None => {
                log::warn!("an ACK for fastbox sender {from:#x}, whose inbox we cannot reach");
                true
            }
        }
    }

    /// An `ACK` frame: the send it names is complete, failed, or goes to the provider.
    pub(crate) fn on_ack(&mut self, caps: &Caps, msg: &[u8]) {
        let Some((cookie, status)) = cma::decode_ack(&msg[8..]) else {
            log::warn!("malformed ACK frame ({} bytes) dropped", msg.len());
            return;
        };
        let Some(s) = self.shm.rndv.remove(&cookie) else {
            log::warn!("an ACK for no pending send (cookie {cookie})");
            return;
        };
        let status = match status {
            cma::AckStatus::Done => Ok(()),
            cma::AckStatus::Failed => Err(Error::Remote(format!(
                "send failed: the receiver could not copy the {} bytes from this process",
                s.len
            ))),
            cma::AckStatus::Fallback => {
                self.shm.no_cma.insert(s.peer, ());
                return self.resend_one(caps, s);
            }
        };
        self.ready.push(match status {
            Ok(()) => Completion::done(s.op, s.len, s.tag, s.owned),
            Err(e) => Completion::failed(s.op, s.tag, e),
        });
    }

    /// Post `s` through the provider (its peer refused our copies); kept for the next poll
    /// if the provider is busy. An error (the peer has exited, say) is this send's, not the
    /// endpoint's.
    pub(crate) fn resend_one(&mut self, caps: &Caps, mut s: RndvSend) {
        let owned = s.owned.take();
        let was_owned = owned.is_some();
        let b = OpBuf {
            addr: s.addr,
            len: s.len,
            desc: s.desc,
            op: s.op,
            owned,
            device: false,
        };
        match self.post_send(caps, Peer(s.peer), s.tag, b) {
            // An owned one went back to the backlog; a caller's buffer waits here.
            Ok(Posted::Busy) if !was_owned => self.shm.resend.push_back(s),
            Ok(_) => {}
            Err(e) => self.ready.push(Completion::failed(s.op, s.tag, e)),
        }
    }

    /// What `poll` does for the rendezvous: ACKs and resends that had to wait, and sends to
    /// peers whose process has exited (they will never answer).
    pub(crate) fn progress_rndv(&mut self, caps: &Caps) {
        while let Some((from, payload)) = self.shm.acks.front().copied() {
            if !self.push_ack(from, &payload) {
                break;
            }
            self.shm.acks.pop_front();
        }
        for _ in 0..self.shm.resend.len() {
            let s = self.shm.resend.pop_front().expect("counted");
            self.resend_one(caps, s);
        }
        if self.shm.rndv.is_empty() {
            return;
        }
        let gone: Vec<(u64, i32)> = self
            .shm
            .rndv
            .iter()
            .filter_map(|(&c, s)| self.shm.gone_pid(Peer(s.peer), false).map(|pid| (c, pid)))
            .collect();
        for (cookie, pid) in gone {
            let s = self.shm.rndv.remove(&cookie).expect("listed");
            let e = peer_exited(pid, " before taking the message");
            self.ready.push(Completion::failed(s.op, s.tag, e));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::testutil::*;
    use super::super::fastbox;
    use crate::transport::fabric::Role;
    use crate::transport::Region;
    use crate::transport::{Posted, Transport};
    use std::ptr;
    use std::time::{Duration, Instant};

    #[test]
    fn large_shm_messages_between_fastbox_peers_are_copied_by_their_receiver() {
        let Some((a, b, to_a, _)) = linked_pair() else {
            return;
        };
        let fb = fastbox::MAX_PAYLOAD;
        let sizes = [fb + 1, 65536, 3 << 20];
        let mut src: Vec<Vec<u8>> = sizes
            .iter()
            .map(|n| (0..*n).map(|i| (i * 7 + n) as u8).collect())
            .collect();
        let mut dst: Vec<Vec<u8>> = sizes.iter().map(|n| vec![0u8; n + 64]).collect();
        // The first receive is posted before its message, the others after theirs (their
        // RTS frames wait among the unexpected, and the copy happens at the receive).
        let (first, rest) = dst.split_at_mut(1);
        a.recv(10, 0, region(&mut first[0]), None, 0).expect("recv");
        for (i, s) in src.iter_mut().enumerate() {
            send_all(&a, &b, to_a, 10 + i as u64, s, 100 + i as u64);
        }
        {
            let g = b.inner.lock();
            assert_eq!(g.shm.rndv.len(), 3, "every send waits for its ACK");
        }
        let mut early = [Vec::new(), Vec::new()];
        a.poll(&mut early[0]).expect("poll");
        for (i, d) in rest.iter_mut().enumerate() {
            a.recv(11 + i as u64, 0, region(d), None, 1 + i as u64)
                .expect("recv");
        }
        let [mut got, mut sent] = completions(&a, &b, sizes.len(), early);
        // Nothing more comes: the provider halves of the receives were cancelled quietly.
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(200) {
            a.poll(&mut got).expect("poll");
            b.poll(&mut sent).expect("poll");
        }
        assert_eq!((got.len(), sent.len()), (sizes.len(), sizes.len()));
        got.sort_by_key(|c| c.op);
        sent.sort_by_key(|c| c.op);
        for (i, n) in sizes.iter().enumerate() {
            assert!(
                got[i].status.is_ok() && sent[i].status.is_ok(),
                "{got:?} {sent:?}"
            );
            assert_eq!(
                (got[i].len, got[i].tag, sent[i].len),
                (*n, 10 + i as u64, *n)
            );
            assert_eq!(dst[i][..*n], src[i][..], "payload of message {i}");
            assert!(
                dst[i][*n..].iter().all(|&x| x == 0),
                "written past the message"
            );
        }
        assert!(b.inner.lock().shm.rndv.is_empty());
        // Only the small-message pool is left posted on the receiving side.
        let g = a.inner.lock();
        assert!(g.shm.soft.as_ref().expect("soft").posted.is_empty());
        assert!(
            g.ops.values().all(|c| c.role == Role::Pool),
            "provider halves left"
        );
    }

    #[test]
    fn a_large_shm_message_too_big_for_its_receive_fails_the_receive_not_the_send() {
        let Some((a, b, to_a, _)) = linked_pair() else {
            return;
        };
        let mut small = vec![0u8; 40_000];
        a.recv(3, 0, region(&mut small), None, 1).expect("recv");
        let mut big = vec![9u8; 50_000];
        send_all(&a, &b, to_a, 3, &mut big, 2);
        let [got, sent] = completions(&a, &b, 1, Default::default());
        let e = got[0].status.as_ref().unwrap_err().to_string();
        assert!(
            e.contains("arrived for a receive buffer") && e.contains("50000"),
            "{e}"
        );
        assert!(small.iter().all(|&x| x == 0), "nothing written");
        assert!(sent[0].status.is_ok(), "{:?}", sent[0].status);
    }

    #[test]
    fn where_the_kernel_refuses_copies_large_shm_messages_take_the_provider() {
        let Some((a, b, to_a, _)) = linked_pair() else {
            return;
        };
        a.inner.lock().shm.refuse_cma = true;
        let n = 100_000;
        let mut src: Vec<Vec<u8>> = (0..2u8)
            .map(|k| (0..n).map(|i| (i as u8) ^ k).collect())
            .collect();
        let mut dst = [vec![0u8; n], vec![0u8; n]];
        a.recv(1, 0, region(&mut dst[0]), None, 1).expect("recv");
        send_all(&a, &b, to_a, 1, &mut src[0], 11);
        let [got, sent] = completions(&a, &b, 1, Default::default());
        assert!(
            got[0].status.is_ok() && sent[0].status.is_ok(),
            "{got:?} {sent:?}"
        );
        assert_eq!(dst[0], src[0]);
        // The sender remembers: the next one goes to the provider at once.
        assert!(!b.inner.lock().shm.rndv_ok(to_a.0));
        send_all(&a, &b, to_a, 2, &mut src[1], 12);
        assert!(b.inner.lock().shm.rndv.is_empty(), "no RTS this time");
        a.recv(2, 0, region(&mut dst[1]), None, 2).expect("recv");
        let [got, sent] = completions(&a, &b, 1, Default::default());
        assert!(
            got[0].status.is_ok() && sent[0].status.is_ok(),
            "{got:?} {sent:?}"
        );
        assert_eq!(dst[1], src[1]);
    }

    #[test]
    fn a_large_shm_message_the_receiver_cannot_read_fails_both_sides() {
        let Some((a, b, to_a, _)) = linked_pair() else {
            return;
        };
        // Inaccessible memory (mapped, so no other allocation can take its place): only the
        // receiver's process_vm_readv looks at it, and gets EFAULT.
        let len = 1 << 20;
        // SAFETY: a fresh private anonymous mapping with no access; unmapped below.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let mut dst = vec![0u8; len];
        a.recv(8, 0, region(&mut dst), None, 1).expect("recv");
        // SAFETY: the region is never dereferenced in this process (the send goes as an RTS).
        let bad = unsafe { Region::from_raw(p as *mut u8, len) };
        assert_eq!(b.send(to_a, 8, bad, None, 2).expect("send"), Posted::Queued);
        let [got, sent] = completions(&a, &b, 1, Default::default());
        let e = got[0].status.as_ref().unwrap_err().to_string();
        assert!(e.contains("receive failed: copying"), "{e}");
        let e = sent[0].status.as_ref().unwrap_err().to_string();
        assert!(e.contains("could not copy"), "{e}");
        // SAFETY: mapped above with this length; nothing refers to it any more.
        unsafe { libc::munmap(p, len) };
    }

    #[test]
    fn a_fallback_to_a_peer_that_has_exited_fails_that_send_not_the_endpoint() {
        let Some((a, b, to_a, _)) = linked_pair() else {
            return;
        };
        a.inner.lock().shm.refuse_cma = true;
        let mut dst = vec![0u8; 100_000];
        a.recv(6, 0, region(&mut dst), None, 1).expect("recv");
        let mut src = vec![3u8; 100_000];
        send_all(&a, &b, to_a, 6, &mut src, 7);
        let mut sink = Vec::new();
        a.poll(&mut sink).expect("poll"); // a answers FALLBACK
        assert!(sink.is_empty(), "{sink:?}");
        let mut child = stand_in(&b, to_a);
        child.kill().expect("kill");
        child.wait().expect("reap");
        let (start, mut out) = (Instant::now(), Vec::new());
        while out.is_empty() {
            b.poll(&mut out).expect("the endpoint goes on");
            assert!(start.elapsed() < Duration::from_secs(5), "never failed");
        }
        assert_eq!(out[0].op, 7);
        let e = out[0].status.as_ref().unwrap_err().to_string();
        assert!(e.contains("has exited"), "{e}");
    }

    #[test]
    fn a_large_shm_send_to_a_peer_that_exits_before_copying_it_fails() {
        let Some((a, b, to_a, _)) = linked_pair() else {
            return;
        };
        let mut big = vec![1u8; 70_000];
        send_all(&a, &b, to_a, 4, &mut big, 5);
        // a never receives it; its process "exits" (a spawned process stands in for it).
        let mut child = stand_in(&b, to_a);
        let mut out = Vec::new();
        b.poll(&mut out).expect("poll");
        assert!(out.is_empty(), "still waiting for the ACK: {out:?}");
        child.kill().expect("kill");
        child.wait().expect("reap");
        let start = Instant::now();
        while out.is_empty() {
            b.poll(&mut out).expect("poll");
            assert!(start.elapsed() < Duration::from_secs(5), "never failed");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(out[0].op, 5);
        let e = out[0].status.as_ref().unwrap_err().to_string();
        assert!(e.contains("has exited before taking the message"), "{e}");
        assert!(b.inner.lock().shm.rndv.is_empty());
    }

    #[test]
    fn a_large_shm_send_posted_after_its_peer_exited_fails() {
        // Large sends skip the pidfd poll: one posted before the watcher has seen the exit
        // goes out as an RTS and must fail on poll; one posted after fails at once. Either
        // way it fails, and nothing stays pending.
        let Some((_a, b, to_a, _)) = linked_pair() else {
            return;
        };
        let mut child = stand_in(&b, to_a);
        child.kill().expect("kill");
        child.wait().expect("reap");
        let mut big = vec![1u8; 70_000];
        let e = match b.send(to_a, 4, region(&mut big), None, 5) {
            Err(e) => e.to_string(),
            Ok(posted) => {
                assert_eq!(
                    posted,
                    Posted::Queued,
                    "an RTS is never busy on an empty ring"
                );
                let (start, mut out) = (Instant::now(), Vec::new());
                while out.is_empty() {
                    b.poll(&mut out).expect("poll");
                    assert!(start.elapsed() < Duration::from_secs(5), "never failed");
                    std::thread::sleep(Duration::from_millis(1));
                }
                assert_eq!(out[0].op, 5);
                out[0].status.as_ref().unwrap_err().to_string()
            }
        };
        assert!(e.contains("has exited"), "{e}");
        assert!(b.inner.lock().shm.rndv.is_empty());
    }
}

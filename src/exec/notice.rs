//! Telling the other ranks that the calls differ. The rank that sees a foreign call signature
//! fails at once, but a peer may be waiting for a message that rank would have sent only
//! later. So the failing rank sends every peer of its schedule a short notice, tagged with its
//! own signature under a message key no schedule uses, and a rank whose collective has made no
//! progress for `WATCH_AFTER` looks for such a notice: a posted receive on the general path,
//! a look into each peer's direct channel on the direct path. Nothing of this runs while
//! collectives make progress.
use super::signature::SIG_MASK;
use super::tags::{coll_tag, KEY_MASK, SEQ_MASK, SEQ_SHIFT, SRC_MASK, SRC_SHIFT};
use super::{BufPool, Exec, St, Tags};
use crate::error::{Error, Result};
use crate::transport::{Completion, Peer, Transport};
use std::time::{Duration, Instant};

/// The message key of notices: the largest of the tag's field, above every schedule's keys and
/// the goodbye's (`tags::goodbye_tag`).
pub(super) const NOTICE_KEY: usize = super::MAX_MESSAGES_PER_PEER + 2;

/// The message key of late notices: the notice a rank that found the calls differ sends every
/// other rank, for those whose part of the call ended before they could learn it
/// (`coll::late`). Above every schedule's keys, below the goodbye's.
pub(super) const LATE_KEY: usize = super::MAX_MESSAGES_PER_PEER;

/// Whether `op` is a notice's send (`Exec::send_notices`).
pub fn is_notice(op: crate::transport::OpId) -> bool {
    (op & u32::MAX as u64) as usize == NOTICE_STEP
}

/// Bytes of a notice (its sender's signature bits, little-endian).
const NOTICE_BYTES: usize = 8;

/// Step index of the posted receive that watches for notices.
pub(super) const WATCH_STEP: usize = u32::MAX as usize;

/// Step index of notices sent.
pub(super) const NOTICE_STEP: usize = u32::MAX as usize - 1;

/// How long a collective whose operation failed with the peer's connection (`Exec::hold`)
/// waits for a notice that explains it before it reports the failure.
const HOLD: Duration = Duration::from_millis(100);

/// How long a collective makes no progress before it watches for notices.
pub(super) const WATCH_AFTER: Duration = Duration::from_millis(10);

/// Whether a collective watches for notices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Watch {
    Off,
    /// Stalled long enough: watch from the next round on.
    Due,
    /// The watching receive is posted (general path).
    Posted,
}

impl Exec {
    fn seq(&self) -> Option<u32> {
        match self.job.args.tags {
            Tags::Coll(seq) => Some(seq),
            Tags::P2p(_) => None,
        }
    }

    /// Send every peer of the schedule a notice that the calls differ, and every other rank a
    /// late notice (best effort: the collective has failed already). A rank whose part of the
    /// call was over before it could learn it (a Reduce's leaf, which only sends) hears of it
    /// from the late notice (`coll::late`).
    /// Returns how many notices went out (each completes as an operation of this collective,
    /// step `NOTICE_STEP`).
    pub(super) fn send_notices(&self, t: &dyn Transport, peers: &[Peer]) -> usize {
        let Some(seq) = self.seq() else { return 0 };
        let body = || self.sig.to_le_bytes().to_vec();
        let op = self.op_id(NOTICE_STEP);
        let mut sent = 0;
        let tag = coll_tag(seq, self.job.rank, NOTICE_KEY, self.sig);
        for &p in &self.plan.message_peers {
            sent += usize::from(t.send_owned(peers[p], tag, body(), op).is_ok());
        }
        let late = coll_tag(seq, self.job.rank, LATE_KEY, self.sig);
        for (p, &peer) in peers.iter().enumerate() {
            if p != self.job.rank {
                sent += usize::from(t.send_owned(peer, late, body(), op).is_ok());
            }
        }
        sent
    }

    /// The sequence number (its tag bits) of this collective, None for point-to-point.
    pub fn seq_bits(&self) -> Option<u32> {
        self.seq().map(|s| s & SEQ_MASK as u32)
    }

    /// Mark the watch due once the collective has stalled for `WATCH_AFTER`.
    pub(super) fn stalled(&mut self, for_: Duration) {
        if self.watch == Watch::Off && for_ >= WATCH_AFTER && self.seq().is_some() {
            self.watch = Watch::Due;
        }
    }

    /// General path: post the watching receive when due, and cancel it once finished.
    pub(super) fn tend_watch(&mut self, t: &dyn Transport) -> Result<()> {
        match self.watch {
            Watch::Due if !self.finished => {
                let seq = self.seq().expect("only collectives watch");
                let tag = coll_tag(seq, 0, NOTICE_KEY, 0);
                let op = self.op_id(WATCH_STEP);
                t.recv_owned(tag, SRC_MASK | SIG_MASK, NOTICE_BYTES, op)?;
                self.watch = Watch::Posted;
            }
            Watch::Posted if self.finished => self.unwatch(t),
            _ => {}
        }
        Ok(())
    }

    /// Cancel the watching receive, if posted.
    pub(super) fn unwatch(&mut self, t: &dyn Transport) {
        if self.watch == Watch::Posted {
            t.cancel(self.op_id(WATCH_STEP));
        }
        self.watch = Watch::Off;
    }

    /// General path: the watching receive completed. A notice fails the collective (one that
    /// a rank is gone, `gone`, is passed on by `fail`); a cancelled watch says nothing.
    pub(super) fn on_watch(&mut self, c: &Completion) -> Result<()> {
        self.watch = Watch::Off;
        if c.status.is_err() {
            return Ok(());
        }
        if let Some((e, gone)) = c.data.as_deref().and_then(|b| self.gone_notice(c.tag, b)) {
            self.gone.failed_over = Some(gone);
            return Err(e);
        }
        Err(self.noticed(c.tag))
    }

    /// Step `i` failed with `e`. Where the peer's end went away (a cancelled operation, a
    /// broken connection) the peer may have failed over a call that differs, and its notice
    /// says which: hold the error for `HOLD` while watching, and report it only if no notice
    /// comes (`held_expired`). Other errors fail the collective at once.
    pub(super) fn hold(&mut self, i: usize, e: Error, pool: &mut BufPool) -> Result<()> {
        let peer_gone = matches!(e, Error::Remote(_) | Error::System(_));
        if self.seq().is_none() || !peer_gone || self.held.is_some() {
            return Err(e);
        }
        // The step is over without completing: nothing depending on it runs.
        self.state[i] = St::Done;
        if self.job.schedule.ranks[self.job.rank][i].op.is_recv() {
            self.posted_recvs -= 1;
        }
        if let Some((buf, need)) = self.staging[i].take() {
            self.staged -= need;
            pool.put(buf);
        }
        self.held = Some((e, Instant::now()));
        if self.watch == Watch::Off {
            self.watch = Watch::Due;
        }
        Ok(())
    }

    /// The held error, once `HOLD` has passed without a notice.
    pub(super) fn held_expired(&mut self) -> Result<()> {
        match &self.held {
            Some((_, at)) if at.elapsed() >= HOLD => Err(self.held.take().expect("matched").0),
            _ => Ok(()),
        }
    }

    /// Where receives match the signature exactly (`Caps::truncation_crashes`), another
    /// call's messages never meet them: while this collective is stalled, look, at most every
    /// `WATCH_AFTER`, at the first message from each peer waiting in its sequence. One of
    /// another call is taken and dropped, and fails the collective as its arrival would have.
    pub(super) fn look_for_foreign(&mut self, t: &dyn Transport, peers: &[Peer]) -> Result<()> {
        if self.finished || self.watch == Watch::Off {
            return Ok(());
        }
        let Some(seq) = self.seq() else { return Ok(()) };
        let now = Instant::now();
        if self
            .foreign_at
            .is_some_and(|at| now.duration_since(at) < WATCH_AFTER)
        {
            return Ok(());
        }
        self.foreign_at = Some(now);
        for &p in &self.plan.message_peers {
            if !t.caps_to(peers[p]).truncation_crashes {
                continue;
            }
            let tag = coll_tag(seq, p, 0, self.sig);
            if let Some(theirs) = t.take_foreign(peers[p], tag, KEY_MASK | SIG_MASK, SIG_MASK)? {
                return self.check_signature_bits(p, theirs);
            }
        }
        Ok(())
    }

    /// Direct path: look for a notice from each peer when due.
    pub(super) fn take_notice(&self, t: &dyn Transport, peers: &[Peer]) -> Result<()> {
        let Some(seq) = self.seq() else { return Ok(()) };
        if self.watch != Watch::Due {
            return Ok(());
        }
        for &p in &self.plan.message_peers {
            let tag = coll_tag(seq, p, NOTICE_KEY, 0);
            t.take_now(peers[p], tag, SIG_MASK, &mut |tag, body| {
                Err(self
                    .gone_notice(tag, body)
                    .map_or_else(|| self.noticed(tag), |(e, _)| e))
            })?;
        }
        Ok(())
    }

    /// The error for a notice (or late notice) tagged `tag`.
    pub fn noticed(&self, tag: u64) -> Error {
        let n = self.job.schedule.problem.nranks;
        let from = ((tag & SRC_MASK) >> SRC_SHIFT) as usize;
        self.signature().mismatch(from, n, tag & SIG_MASK)
    }
}

/// The tag and ignore mask of a receive that takes every late notice, of any call from any
/// rank.
pub fn late_watch() -> (u64, u64) {
    (
        coll_tag(0, 0, LATE_KEY, 0),
        (SEQ_MASK << SEQ_SHIFT) | SRC_MASK | SIG_MASK,
    )
}

/// A late notice's sequence number (tag bits) and sender, from its tag.
pub fn late_notice_of(tag: u64) -> (u32, usize) {
    (
        ((tag >> SEQ_SHIFT) & SEQ_MASK) as u32,
        ((tag & SRC_MASK) >> SRC_SHIFT) as usize,
    )
}

#[cfg(test)]
mod tests {
    use super::{NOTICE_KEY, WATCH_STEP};
    use crate::algo::{Algorithm, Collective, Problem};
    use crate::error::Error;
    use crate::exec::recorder::{ring_rank0, Recorder, PEERS};
    use crate::exec::tags::coll_tag;
    use crate::exec::{BufPool, Exec, St};
    use crate::transport::{Completion, Scratch};
    use std::time::Duration;

    /// Rank 0 of a 2-rank ring AllReduce of 1024 floats, advanced once on a `Recorder`, and the
    /// index of a receive it posted.
    fn posted(t: &Recorder, pool: &mut BufPool) -> (Box<Exec>, usize, Scratch, Scratch) {
        let (x, inp, out) = ring_rank0(t, pool);
        let i = (0..x.state.len())
            .find(|&i| x.state[i] == St::Posted && x.job.schedule.ranks[0][i].op.is_recv())
            .expect("a posted receive");
        (x, i, inp, out)
    }

    #[test]
    fn a_lost_peer_is_held_while_a_notice_may_explain_it_then_reported() {
        let (t, mut pool) = (Recorder::default(), BufPool::default());
        let (mut x, i, _inp, _out) = posted(&t, &mut pool);
        let lost = Completion::failed(x.op_id(i), 0, Error::Remote("peer gone".into()));
        x.on_completion(lost, &mut pool)
            .expect("held, not reported yet");
        t.posts.lock().clear();
        x.advance(&t, &PEERS, &mut pool)
            .expect("still within the hold");
        assert_eq!(*t.posts.lock(), ['W'], "the hold watches for notices");
        std::thread::sleep(super::HOLD + Duration::from_millis(20));
        let e = x.advance(&t, &PEERS, &mut pool).unwrap_err().to_string();
        assert!(e.contains("peer gone"), "{e}");
        t.posts.lock().clear();
        let _ = x.fail(&t, &PEERS);
        assert_eq!(
            *t.posts.lock(),
            ['C', 'C'],
            "the watch and the other receive cancelled"
        );
    }

    #[test]
    fn a_notice_names_the_other_call_and_a_foreign_message_makes_notices() {
        let (t, mut pool) = (Recorder::default(), BufPool::default());
        let (mut x, i, _inp, _out) = posted(&t, &mut pool);
        // Rank 1 called ReduceScatter: its notice carries that call's signature.
        let theirs = crate::exec::Signature::of(
            &Problem::new(Collective::ReduceScatter, 2, 1024),
            Algorithm::Ring,
            crate::reduce::DataType::Float32,
            crate::reduce::RedOp::Sum,
        )
        .bits();
        let notice = Completion::done(
            x.op_id(WATCH_STEP),
            8,
            coll_tag(0, 1, NOTICE_KEY, theirs),
            None,
        );
        let e = x.on_completion(notice, &mut pool).unwrap_err().to_string();
        assert!(e.contains("rank 1 called ReduceScatter"), "{e}");
        // A message of that call on a posted receive fails the collective, and `fail` sends
        // the one peer a notice.
        let foreign = Completion::done(x.op_id(i), 2048, coll_tag(0, 1, 0, theirs), None);
        let e = x.on_completion(foreign, &mut pool).unwrap_err().to_string();
        assert!(e.contains("the ranks' calls differ"), "{e}");
        t.posts.lock().clear();
        let _ = x.fail(&t, &PEERS);
        assert!(t.posts.lock().contains(&'N'), "{:?}", t.posts.lock());
    }

    #[test]
    fn a_truncated_receive_makes_notices_whatever_its_tag_says() {
        let (t, mut pool) = (Recorder::default(), BufPool::default());
        let (mut x, i, _inp, _out) = posted(&t, &mut pool);
        // 2.1's shm reports the receive's own tag: the signatures compare the same.
        let own = coll_tag(0, 1, 0, x.sig);
        let cut =
            Error::InvalidUsage("a larger message arrived for a receive buffer of 8 bytes".into());
        let e = x
            .on_completion(Completion::failed(x.op_id(i), own, cut), &mut pool)
            .unwrap_err()
            .to_string();
        assert!(e.contains("do the ranks make the same call"), "{e}");
        t.posts.lock().clear();
        let _ = x.fail(&t, &PEERS);
        assert!(t.posts.lock().contains(&'N'), "{:?}", t.posts.lock());
    }
}

//! Telling the other ranks that the calls differ. The rank that sees a foreign call signature
//! fails at once, but a peer may be waiting for a message that rank would have sent only
//! later. So the failing rank sends every peer of its schedule a short notice, tagged with its
//! own signature under a message key no schedule uses, and a rank whose collective has made no
//! progress for `WATCH_AFTER` looks for such a notice: a posted receive on the general path,
//! a look into each peer's direct channel on the direct path. Nothing of this runs while
//! collectives make progress.
use super::signature::SIG_MASK;
use super::tags::{coll_tag, SRC_MASK, SRC_SHIFT};
use super::{BufPool, Exec, Signature, St, Tags};
use crate::error::{Error, Result};
use crate::transport::{Completion, Peer, Transport};
use std::time::{Duration, Instant};

/// The message key of notices: one above the largest a schedule's messages use.
pub(super) const NOTICE_KEY: usize = super::MAX_MESSAGES_PER_PEER;

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

    /// Send every peer of the schedule a notice that the calls differ (best effort: the
    /// collective has failed already).
    pub(super) fn send_notices(&self, t: &dyn Transport, peers: &[Peer]) {
        let Some(seq) = self.seq() else { return };
        let tag = coll_tag(seq, self.job.rank, NOTICE_KEY, self.sig);
        for &p in &self.plan.message_peers {
            let body = self.sig.to_le_bytes().to_vec();
            let _ = t.send_owned(peers[p], tag, body, self.op_id(NOTICE_STEP));
        }
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

    /// General path: the watching receive completed. A notice fails the collective; a
    /// cancelled watch says nothing.
    pub(super) fn on_watch(&mut self, c: &Completion) -> Result<()> {
        self.watch = Watch::Off;
        if c.status.is_err() {
            return Ok(());
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

    /// Direct path: look for a notice from each peer when due.
    pub(super) fn take_notice(&self, t: &dyn Transport, peers: &[Peer]) -> Result<()> {
        let Some(seq) = self.seq() else { return Ok(()) };
        if self.watch != Watch::Due {
            return Ok(());
        }
        for &p in &self.plan.message_peers {
            let tag = coll_tag(seq, p, NOTICE_KEY, 0);
            t.take_now(
                peers[p],
                tag,
                SIG_MASK,
                &mut |tag, _| Err(self.noticed(tag)),
            )?;
        }
        Ok(())
    }

    /// The error for a notice tagged `tag`.
    fn noticed(&self, tag: u64) -> Error {
        let p = &self.job.schedule.problem;
        let from = ((tag & SRC_MASK) >> SRC_SHIFT) as usize;
        let mine = Signature::of(p, self.job.args.dtype, self.job.args.op);
        mine.mismatch(from, p.nranks, tag & SIG_MASK)
    }
}

//! Calls that differed, learned after the fact.
//!
//! A rank whose part of a collective is over before it could see that another rank made a
//! different call would return success: a Reduce's leaf only sends, and its sends complete
//! whatever the root runs. So the rank that finds the difference sends every other rank a late
//! notice (`Exec::send_notices`), and each communicator keeps one receive posted that takes
//! them, from its first call on and again after each notice. A late notice about collective
//! `seq` from rank `r`:
//!
//! - fails that collective where it still runs here, naming `r`'s call (a rank that waits for
//!   a message the other call never sends learns it at once, not at its deadline);
//! - is dropped where that collective already failed here;
//! - otherwise (it succeeded here, or has not started) is kept, and the next collective or
//!   transfer this rank completes after the notice is read reports it, once, instead of its
//!   success. That call itself ran as usual, so that the other ranks' part of it went on; only
//!   the report differs.
//!
//! Notices are read whenever the communicator polls its transport: every call on the posted
//! path, and every 64th blocking call on the direct channel, which otherwise reads none.
use crate::error::Error;
use crate::exec::{late_watch, Exec, Signature};
use crate::transport::{OpId, Transport};
use std::collections::VecDeque;

/// The operation id of the receive of late notices: request id 0, which no request gets
/// (`Engine::new_id` skips it), at a step above the goodbye's operations (`goodbye::op`).
pub(super) const OP: OpId = u32::MAX as OpId;

/// Bytes of a late notice (its sender's signature bits).
const NOTICE_BYTES: usize = 8;

/// Collectives remembered per kind (failed here, succeeded here): a late notice names one of
/// the last few calls, since its sender sends it as soon as it fails.
const KEPT: usize = 64;

/// A communicator's late notices.
#[derive(Default)]
pub(super) struct Late {
    /// The receive of late notices is posted.
    armed: bool,
    /// Sequence numbers (tag bits) of the collectives that failed here, or that a late notice
    /// already told of, latest last.
    failed: VecDeque<u32>,
    /// Sequence numbers and signatures of the collectives that succeeded here, latest last.
    succeeded: VecDeque<(u32, Signature)>,
    /// The error the next call that completes here reports.
    pending: Option<Error>,
    /// Notices (of either kind) this rank sent whose sends have not completed.
    out: usize,
}

impl Late {
    /// Post the receive of late notices, unless it is posted.
    pub(super) fn arm(&mut self, t: &dyn Transport) {
        if self.armed {
            return;
        }
        let (tag, ignore) = late_watch();
        match t.recv_owned(tag, ignore, NOTICE_BYTES, OP) {
            Ok(()) => self.armed = true,
            Err(e) => log::debug!("the receive of late notices was not posted: {e}"),
        }
    }

    /// The receive completed (a notice, or cancelled with the endpoint): post it again later.
    pub(super) fn disarm(&mut self) {
        self.armed = false;
    }

    /// `x` failed here (a transfer is not numbered: nothing to note).
    pub(super) fn failed(&mut self, x: &Exec) {
        if let Some(seq) = x.seq_bits() {
            push(&mut self.failed, seq);
        }
    }

    /// `x` succeeded here.
    pub(super) fn succeeded(&mut self, x: &Exec) {
        if let Some(seq) = x.seq_bits() {
            push(&mut self.succeeded, (seq, x.signature()));
        }
    }

    /// A late notice about collective `seq` from rank `from`, whose call has signature bits
    /// `theirs`, that no running collective here took: kept for the next report unless that
    /// collective failed here or was told of already.
    pub(super) fn notice(&mut self, seq: u32, from: usize, nranks: usize, theirs: u64) {
        if self.failed.contains(&seq) {
            return;
        }
        // Told once: other ranks' notices about the same call are dropped from now on.
        push(&mut self.failed, seq);
        if self.pending.is_some() {
            return;
        }
        let what = match self.succeeded.iter().rev().find(|(s, _)| *s == seq) {
            // The finder made this rank's call: another rank made the other one.
            Some((_, sig)) if sig.bits() == theirs => format!(
                "the ranks' calls differ: this rank and rank {from} called {}, another rank \
                 something else",
                sig.describe()
            ),
            Some((_, sig)) => match sig.mismatch(from, nranks, theirs) {
                Error::InvalidUsage(m) => m,
                e => e.to_string(),
            },
            None => {
                format!("the ranks' calls differ (rank {from}'s call has signature {theirs:#05x})")
            }
        };
        self.pending = Some(Error::InvalidUsage(format!(
            "an earlier collective of this communicator (number {seq} of its tag sequence) \
             returned success here, but rank {from} found that {what}"
        )));
    }

    /// A failed collective sent `n` notices.
    pub(super) fn sent(&mut self, n: usize) {
        self.out += n;
    }

    /// One notice's send completed (or failed).
    pub(super) fn sent_one(&mut self) {
        self.out = self.out.saturating_sub(1);
    }

    /// Whether notices of this rank are still on their way: the native TCP endpoint makes a
    /// connection to a rank it never talked to only inside its sender's progress calls, so a
    /// rank that returned its error and then made no call would leave them unsent.
    pub(super) fn sending(&self) -> bool {
        self.out > 0
    }

    /// The error a completed call reports instead of its success, once.
    pub(super) fn take(&mut self) -> Option<Error> {
        self.pending.take()
    }
}

fn push<T>(q: &mut VecDeque<T>, x: T) {
    if q.len() == KEPT {
        q.pop_front();
    }
    q.push_back(x);
}

#[cfg(test)]
mod tests {
    use super::{push, Late};
    use crate::algo::{Algorithm, Collective, Problem};
    use crate::exec::Signature;
    use crate::reduce::{DataType, RedOp};

    fn sig(coll: Collective) -> Signature {
        let p = Problem::new(coll, 3, 64);
        Signature::of(&p, Algorithm::Tree, DataType::Float32, RedOp::Sum)
    }

    #[test]
    fn a_notice_about_a_call_that_succeeded_is_reported_once_naming_both_calls() {
        let mut l = Late::default();
        push(&mut l.succeeded, (5, sig(Collective::Reduce)));
        let bcast = sig(Collective::Broadcast).bits();
        l.notice(5, 0, 3, bcast);
        // Another rank's notice about the same call says nothing more.
        l.notice(5, 1, 3, sig(Collective::Reduce).bits());
        let e = l.take().expect("kept for the next report").to_string();
        assert!(e.contains("returned success here, but rank 0 found"), "{e}");
        assert!(e.contains("rank 0 called Broadcast"), "{e}");
        assert!(l.take().is_none(), "told once");
    }

    #[test]
    fn a_notice_about_a_call_that_failed_here_is_dropped() {
        let mut l = Late::default();
        push(&mut l.failed, 7);
        l.notice(7, 2, 3, 0x123);
        assert!(l.take().is_none());
    }

    #[test]
    fn a_finder_that_made_this_ranks_call_blames_another_rank() {
        let mut l = Late::default();
        let reduce = sig(Collective::Reduce);
        push(&mut l.succeeded, (1, reduce));
        l.notice(1, 2, 3, reduce.bits());
        let e = l.take().expect("kept").to_string();
        assert!(e.contains("this rank and rank 2 called Reduce"), "{e}");
        // A call no longer remembered: the finder's signature bits stand for its call.
        l.notice(9, 1, 3, 0x2a);
        let e = l.take().expect("kept").to_string();
        assert!(e.contains("rank 1's call has signature 0x02a"), "{e}");
    }

    #[test]
    fn notices_in_flight_are_counted_out() {
        let mut l = Late::default();
        l.sent(2);
        l.sent_one();
        assert!(l.sending());
        l.sent_one();
        l.sent_one();
        assert!(!l.sending(), "never below zero");
    }
}

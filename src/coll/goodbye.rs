//! How a communicator ends without losing what it sent: the goodbye.
//!
//! A send's completion means its buffer may be reused, not that the peer has the message: an
//! eager or injected message may still wait in the peer's provider for its receive (the native
//! TCP endpoint keeps a small unexpected message with the connection it came on) or in ours for
//! the connection. Closing the endpoint then can discard it, and the peer's receive waits for
//! its deadline. So, as MPI's finalize and NCCL's destroy do, a communicator whose transport
//! may lose messages that way (`Caps::close_loses`) says goodbye before it closes, to every
//! rank it exchanged messages with or posted a receive from (`Engine::talked`):
//!
//! 1. it posts a receive for each such peer's goodbye, then sends each its own (tagged
//!    `exec::goodbye_tag`, a message key no schedule uses), after everything it sent before;
//! 2. it waits until each peer's goodbye has come, its own goodbyes are sent, or the peer
//!    failed (the send or the receive ended in error), for at most the communicator's deadline.
//!
//! A peer's goodbye comes after everything that peer sent (one ordered connection per
//! direction), and that peer sends it only once it is ending itself, so by then it takes no
//! more messages of ours: whatever it has not taken it no longer wants. Since every rank posts
//! its receives before it sends, the last goodbye a rank sends meets a posted receive, never a
//! place where its sender's close could drop it. A peer that never ends its communicator, or
//! died without a trace, costs the deadline, and a warning names it; `Comm::abort` (NCCL's
//! `ncclCommAbort`, `fabricoll_comm_abort`) ends without goodbye.
use super::Comm;
use crate::exec::{goodbye_tag, Exec};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Bytes of a goodbye (the sender's rank, little-endian).
const GOODBYE_BYTES: usize = 8;

/// The operation id of the goodbye receive from rank `p` (`send` false) or of the goodbye sent
/// to it: request id 0, which no request gets (`Engine::next_id` skips it), so that the engine
/// takes their completions for a finished request's.
fn op(nranks: usize, p: usize, send: bool) -> u64 {
    (if send { nranks + p } else { p }) as u64
}

impl Comm {
    /// Say goodbye to every rank this one talked to and wait for theirs (see the module doc).
    pub(super) fn goodbye(&self) {
        if !self.transport.caps().close_loses || self.no_goodbye.load(Ordering::SeqCst) {
            return;
        }
        let talked: Vec<usize> = {
            let e = self.engine.lock();
            (0..self.nranks)
                .filter(|&p| p != self.rank && e.talked[p])
                .collect()
        };
        if talked.is_empty() {
            return;
        }
        let t = &*self.transport;
        let n = self.nranks;
        // Per peer: its goodbye not yet in, ours not yet sent.
        let mut waiting = vec![false; n];
        let mut sending = vec![false; n];
        for &p in &talked {
            let tag = goodbye_tag(p);
            waiting[p] = t.recv_owned(tag, 0, GOODBYE_BYTES, op(n, p, false)).is_ok();
        }
        for &p in &talked {
            let body = (self.rank as u64).to_le_bytes().to_vec();
            sending[p] = t
                .send_owned(self.peers[p], goodbye_tag(self.rank), body, op(n, p, true))
                .is_ok();
            // A peer we cannot send to is gone: nothing of ours reaches it any more.
            waiting[p] &= sending[p];
        }
        let deadline = Instant::now() + self.timeout.limit;
        let mut comps = Vec::new();
        while waiting.iter().chain(&sending).any(|&w| w) && Instant::now() < deadline {
            comps.clear();
            if t.poll(&mut comps).is_err() {
                break;
            }
            for c in &comps {
                let (id, k) = (Exec::exec_of(c.op), (c.op & u32::MAX as u64) as usize);
                if id != 0 || k >= 2 * n {
                    continue; // a failed collective's late completion
                }
                let (p, sent) = (k % n, k >= n);
                if sent {
                    sending[p] = false;
                    // The peer's failure ends the wait for it too.
                    waiting[p] &= c.status.is_ok();
                } else {
                    waiting[p] = false;
                }
            }
            if comps.is_empty() {
                let _ = t.wait(super::engine::SLEEP_SLICE);
            }
        }
        let silent: Vec<usize> = (0..n).filter(|&p| waiting[p] || sending[p]).collect();
        log::debug!(
            "rank {}: goodbye to ranks {talked:?} took {:?}",
            self.rank,
            self.timeout.limit.saturating_sub(deadline - Instant::now())
        );
        for &p in &silent {
            if waiting[p] {
                t.cancel(op(n, p, false));
            }
        }
        if !silent.is_empty() {
            log::warn!(
                "rank {}: ranks {silent:?} did not say goodbye within {}: the communicator closes without knowing that they took every message of this rank",
                self.rank,
                self.timeout
            );
        }
    }
}

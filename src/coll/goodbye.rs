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
//! 2. its endpoint stays open until each peer's goodbye has come, its own goodbyes are sent,
//!    or the peer failed (the send or the receive ended in error), for at most the
//!    communicator's deadline: a `Farewell`, which the closer (`closer`) polls in the
//!    background, so that destroy itself returns at once.
//!
//! A peer's goodbye comes after everything that peer sent (one ordered connection per
//! direction), and that peer sends it only once it is ending itself, so by then it takes no
//! more messages of ours: whatever it has not taken it no longer wants. Since every rank posts
//! its receives before it sends, the last goodbye a rank sends meets a posted receive, never a
//! place where its sender's close could drop it. A peer that never ends its communicator, or
//! died without a trace, keeps the endpoint open until the deadline, and a warning names it;
//! `Comm::leave_without_goodbye` (`fabricoll_comm_abort`, as NCCL's `ncclCommAbort`) ends
//! without goodbye.
use super::Comm;
use crate::config::Timeout;
use crate::exec::{goodbye_tag, Exec};
use crate::transport::{Completion, Transport};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of a goodbye (the sender's rank, little-endian).
const GOODBYE_BYTES: usize = 8;

/// The operation id of the goodbye receive from rank `p` (`send` false) or of the goodbye sent
/// to it: request id 0, which no request gets (`Engine::next_id` skips it), so that a late
/// completion of a collective is never taken for a goodbye's.
fn op(nranks: usize, p: usize, send: bool) -> u64 {
    (if send { nranks + p } else { p }) as u64
}

/// The goodbyes of an ended communicator, in flight: its transport (the endpoint, which owns
/// the goodbyes' buffers) stays open as long as this lives.
pub(super) struct Farewell {
    transport: Arc<dyn Transport>,
    rank: usize,
    talked: Vec<usize>,
    /// Per peer: its goodbye not yet in.
    waiting: Vec<bool>,
    /// Per peer: ours not yet sent.
    sending: Vec<bool>,
    started: Instant,
    deadline: Instant,
    timeout: Timeout,
    comps: Vec<Completion>,
    /// The wait is over (`Step::Over`); the endpoint stays open as long as this lives.
    over: bool,
    /// Endpoints of this process read this one's messages in its own memory
    /// (`Caps::reads_local_peers`).
    read_in_place: bool,
}

/// What one `Farewell::step` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Every goodbye is in, sent or failed, or the deadline passed: the wait is over.
    Over,
    /// Not yet; some completion came (`true`) or none did.
    Pending(bool),
}

impl Comm {
    /// Say goodbye to every rank this one talked to (see the module doc): the goodbyes in
    /// flight, or None where there is nothing to wait for (a transport that loses nothing on
    /// close, `leave_without_goodbye`, no peer talked to, or nothing could be posted).
    pub(super) fn goodbye(&self) -> Option<Farewell> {
        if !self.transport.caps().close_loses || self.no_goodbye.load(Ordering::SeqCst) {
            return None;
        }
        let talked: Vec<usize> = {
            let e = self.engine.lock();
            (0..self.nranks)
                .filter(|&p| p != self.rank && e.talked[p])
                .collect()
        };
        if talked.is_empty() {
            return None;
        }
        let t = &*self.transport;
        let n = self.nranks;
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
            if !sending[p] && waiting[p] {
                waiting[p] = false;
                t.cancel(op(n, p, false));
            }
        }
        if !waiting.iter().chain(&sending).any(|&w| w) {
            return None;
        }
        let started = Instant::now();
        Some(Farewell {
            transport: self.transport.clone(),
            rank: self.rank,
            talked,
            waiting,
            sending,
            started,
            deadline: started + self.timeout.limit,
            timeout: self.timeout,
            comps: Vec::new(),
            over: false,
            read_in_place: self.transport.caps().reads_local_peers,
        })
    }
}

impl Farewell {
    /// Poll the transport once and take the goodbyes' completions; at `now` past the
    /// deadline, give up on the silent ranks (a warning names them). Once over, a step only
    /// polls (the provider may still need this endpoint's progress for its peers).
    pub(super) fn step(&mut self, now: Instant) -> Step {
        let n = self.waiting.len();
        self.comps.clear();
        if let Err(e) = self.transport.poll(&mut self.comps) {
            if !self.over {
                log::debug!("rank {}: goodbye: the transport failed: {e}", self.rank);
                self.over = true;
            }
        }
        let moved = !self.comps.is_empty();
        if self.over {
            return Step::Over;
        }
        for c in &self.comps {
            let (id, k) = (Exec::exec_of(c.op), (c.op & u32::MAX as u64) as usize);
            if id != 0 || k >= 2 * n {
                continue; // a failed collective's late completion
            }
            let (p, sent) = (k % n, k >= n);
            if sent {
                self.sending[p] = false;
                // The peer's failure ends the wait for it too.
                self.waiting[p] &= c.status.is_ok();
            } else {
                self.waiting[p] = false;
            }
        }
        let silent = self.silent();
        if silent.is_empty() {
            log::debug!(
                "rank {}: goodbye to ranks {:?} took {:?}",
                self.rank,
                self.talked,
                self.started.elapsed()
            );
            self.over = true;
        } else if now >= self.deadline {
            for &p in &silent {
                if self.waiting[p] {
                    self.transport.cancel(op(n, p, false));
                }
            }
            log::warn!(
                "rank {}: ranks {silent:?} did not say goodbye within {}: the communicator's endpoint closes without knowing that they took every message of this rank",
                self.rank,
                self.timeout
            );
            self.over = true;
        }
        if self.over {
            Step::Over
        } else {
            Step::Pending(moved)
        }
    }

    /// The wait is over: every goodbye in, sent or failed, or the deadline passed.
    pub(super) fn is_over(&self) -> bool {
        self.over
    }

    /// Endpoints of this process may read this one's messages in its own memory, so it must
    /// stay open while one of them may still have its goodbye to read (`closer`).
    pub(super) fn read_in_place(&self) -> bool {
        self.read_in_place
    }

    /// When the wait for the goodbyes ends, done or not.
    pub(super) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Sleep until the transport may have a completion, at most `d`.
    pub(super) fn wait(&self, d: Duration) {
        let _ = self.transport.wait(d);
    }

    /// The ranks whose goodbye has not come, or to which ours is not sent.
    fn silent(&self) -> Vec<usize> {
        (0..self.waiting.len())
            .filter(|&p| self.waiting[p] || self.sending[p])
            .collect()
    }
}

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
//! place where its sender's close could drop it.
//!
//! Failed peers are not waited for, so that neither the closer nor process exit waits the
//! deadline for a goodbye that never comes:
//!
//! - an aborted communicator (`Comm::leave_aborted`, `fabricoll_comm_abort`, as NCCL's
//!   `ncclCommAbort`) waits for nothing, but sends each peer it talked to a goodbye marked
//!   `ABORTED`, best effort: a peer that takes it stops waiting for that rank, and for its own
//!   goodbye to it, which nobody reads;
//! - a peer the transport reports gone (a goodbye to it fails: its process exited, so shm's
//!   peer watch refuses it, or its endpoint is closed, so TCP refuses the connection) is not
//!   waited for;
//! - a peer whose goodbye is late is asked again, after `PROBE_FIRST`, then at doubling
//!   intervals up to `PROBE_MAX`: the farewell sends it its goodbye once more, so that a peer
//!   that died after our goodbye reached it (killed, or exited without destroy) shows as a
//!   failed send; a live peer keeps the extra goodbyes unread, a few bytes each, until it
//!   closes. Each time, the farewell also asks the transport whether the peer is gone
//!   (`Transport::peer_gone`: over shm its process exited or its endpoint closed, which a
//!   send into its region does not show; over TCP, only where our last goodbye to it has not
//!   gone out for `STALL`, a few bytes a live connection takes at once, whether its address
//!   still takes connections: the native TCP endpoint of libfabric 1.17 keeps a send to a
//!   peer whose connection ended queued for ever). So a dead peer, or one whose endpoint
//!   closed without a goodbye to us (it never took our messages: a lone rank's collective),
//!   is let go within about `PROBE_MAX`.
//!
//! A live peer that never ends its communicator, or one the transport cannot see fail (a host
//! gone from the network, whose connection still takes bytes), keeps the endpoint open until
//! the deadline, and a warning names it.
use super::Comm;
use crate::config::Timeout;
use crate::exec::{goodbye_tag, Exec};
use crate::transport::{Completion, Peer, Transport};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of a goodbye (the sender's rank, and `ABORTED`, little-endian).
const GOODBYE_BYTES: usize = 8;

/// Bit of a goodbye's body: its sender aborted its communicator and waits for nothing.
const ABORTED: u64 = 1 << 63;

/// How long after the goodbyes a farewell first asks a silent peer again (see the module doc).
const PROBE_FIRST: Duration = Duration::from_millis(500);

/// The longest interval between two goodbyes to a silent peer.
const PROBE_MAX: Duration = Duration::from_secs(4);

/// How long a goodbye of ours may wait to go out before the farewell asks the transport
/// whether its peer is gone: a few bytes that a live connection takes at once.
const STALL: Duration = Duration::from_secs(1);

/// What an operation of the goodbye is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// The receive of the peer's goodbye.
    Recv,
    /// Our goodbye to it.
    Send,
    /// Our goodbye to it once more (a probe).
    Probe,
}

const KINDS: [Kind; 3] = [Kind::Recv, Kind::Send, Kind::Probe];

/// The operation id of `kind` for rank `p`: request id 0, which no request gets
/// (`Engine::next_id` skips it), so that a late completion of a collective is never taken for
/// a goodbye's.
fn op(nranks: usize, p: usize, kind: Kind) -> u64 {
    let k = KINDS.iter().position(|&x| x == kind).expect("listed");
    (k * nranks + p) as u64
}

/// The rank and kind of a goodbye's operation `op`, None for any other operation.
fn of_op(nranks: usize, op: u64) -> Option<(usize, Kind)> {
    let (id, k) = (Exec::exec_of(op), (op & u32::MAX as u64) as usize);
    (id == 0 && k < KINDS.len() * nranks).then(|| (k % nranks, KINDS[k / nranks]))
}

/// The body of rank `rank`'s goodbye.
fn body(rank: usize, flags: u64) -> Vec<u8> {
    (rank as u64 | flags).to_le_bytes().to_vec()
}

/// The goodbyes of an ended communicator, in flight: its transport (the endpoint, which owns
/// the goodbyes' buffers) stays open as long as this lives.
pub(super) struct Farewell {
    transport: Arc<dyn Transport>,
    rank: usize,
    /// Every rank's endpoint on the transport.
    peers: Vec<Peer>,
    talked: Vec<usize>,
    /// Per peer: its goodbye not yet in.
    waiting: Vec<bool>,
    /// Per peer: ours not yet sent.
    sending: Vec<bool>,
    /// Per peer: a probe (our goodbye once more) in flight.
    probing: Vec<bool>,
    /// Per peer: when our goodbye or probe now in flight was sent.
    sent_at: Vec<Instant>,
    /// When silent peers are asked again next, and the interval after that.
    probe_at: Instant,
    probe_every: Duration,
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
    /// The ranks this one talked to (`Engine::talked`), itself left out.
    fn talked(&self) -> Vec<usize> {
        let e = self.engine.lock();
        (0..self.nranks)
            .filter(|&p| p != self.rank && e.talked[p])
            .collect()
    }

    /// Say goodbye to every rank this one talked to (see the module doc): the goodbyes in
    /// flight, or None where there is nothing to wait for (a transport that loses nothing on
    /// close, an aborted communicator, no peer talked to, or nothing could be posted).
    pub(super) fn goodbye(&self) -> Option<Farewell> {
        if !self.transport.caps().close_loses || self.no_goodbye.load(Ordering::SeqCst) {
            return None;
        }
        let talked = self.talked();
        if talked.is_empty() {
            return None;
        }
        let t = &*self.transport;
        let n = self.nranks;
        let mut waiting = vec![false; n];
        let mut sending = vec![false; n];
        for &p in &talked {
            let tag = goodbye_tag(p);
            waiting[p] = t
                .recv_owned(tag, 0, GOODBYE_BYTES, op(n, p, Kind::Recv))
                .is_ok();
        }
        for &p in &talked {
            let body = body(self.rank, 0);
            sending[p] = t
                .send_owned(
                    self.peers[p],
                    goodbye_tag(self.rank),
                    body,
                    op(n, p, Kind::Send),
                )
                .is_ok();
            // A peer we cannot send to is gone: nothing of ours reaches it any more.
            if !sending[p] && waiting[p] {
                waiting[p] = false;
                t.cancel(op(n, p, Kind::Recv));
            }
        }
        if !waiting.iter().chain(&sending).any(|&w| w) {
            return None;
        }
        let started = Instant::now();
        Some(Farewell {
            transport: self.transport.clone(),
            rank: self.rank,
            peers: self.peers.clone(),
            talked,
            waiting,
            sending,
            probing: vec![false; n],
            sent_at: vec![started; n],
            probe_at: started + PROBE_FIRST,
            probe_every: PROBE_FIRST,
            started,
            deadline: started + self.timeout.limit,
            timeout: self.timeout,
            comps: Vec::new(),
            over: false,
            read_in_place: self.transport.caps().reads_local_peers,
        })
    }

    /// The goodbye of an aborted communicator: marked `ABORTED`, to every rank this one talked
    /// to, sent once and waited for by nobody (best effort: its completions, if the engine
    /// polls them, belong to no request). Its later destroy says no other.
    pub(super) fn goodbye_aborted(&self) {
        if !self.transport.caps().close_loses || self.no_goodbye.swap(true, Ordering::SeqCst) {
            return;
        }
        let n = self.nranks;
        for p in self.talked() {
            let body = body(self.rank, ABORTED);
            let tag = goodbye_tag(self.rank);
            let _ = self
                .transport
                .send_owned(self.peers[p], tag, body, op(n, p, Kind::Send));
        }
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
        for i in 0..self.comps.len() {
            let c = &self.comps[i];
            let Some((p, kind)) = of_op(n, c.op) else {
                continue; // a failed collective's late completion
            };
            let (ok, aborted) = (c.status.is_ok(), said_aborted(c));
            match kind {
                Kind::Recv => {
                    self.waiting[p] = false;
                    if aborted {
                        // It reads nothing more: ours to it need not go out.
                        log::debug!("rank {}: rank {p} aborted", self.rank);
                        self.sending[p] = false;
                    }
                }
                Kind::Send => self.sending[p] = false,
                Kind::Probe => self.probing[p] = false,
            }
            // A failed send: the peer is gone, so its goodbye will not come either.
            if !ok && kind != Kind::Recv {
                self.gone(p);
            }
        }
        if now >= self.probe_at {
            self.probe(now);
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
                    self.transport.cancel(op(n, p, Kind::Recv));
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

    /// Rank `p` failed: wait for its goodbye, and for ours to it, no longer.
    fn gone(&mut self, p: usize) {
        if self.waiting[p] {
            log::debug!("rank {}: rank {p} is gone", self.rank);
            self.waiting[p] = false;
            self.transport.cancel(op(self.waiting.len(), p, Kind::Recv));
        }
        self.sending[p] = false;
    }

    /// Ask after each silent peer (see the module doc): the transport whether it is gone
    /// (`Transport::peer_gone`, asking its address only where our last goodbye has not gone
    /// out for `STALL`), and, where our last goodbye went out, our goodbye once more (a send
    /// that fails says the peer is gone).
    fn probe(&mut self, now: Instant) {
        let n = self.waiting.len();
        for p in 0..n {
            // (Its goodbye in, ours may still be stuck: a peer that died since.)
            if !self.waiting[p] && !self.sending[p] {
                continue;
            }
            let in_flight = self.sending[p] || self.probing[p];
            let stuck = in_flight && now.duration_since(self.sent_at[p]) >= STALL;
            if self.transport.peer_gone(self.peers[p], stuck) {
                self.gone(p);
                continue;
            }
            if in_flight {
                continue;
            }
            self.sent_at[p] = now;
            let tag = goodbye_tag(self.rank);
            let sent = self.transport.send_owned(
                self.peers[p],
                tag,
                body(self.rank, 0),
                op(n, p, Kind::Probe),
            );
            match sent {
                Ok(()) => self.probing[p] = true,
                Err(_) => self.gone(p),
            }
        }
        self.probe_every = (self.probe_every * 2).min(PROBE_MAX);
        self.probe_at = now + self.probe_every;
    }

    /// The ranks whose goodbye has not come, or to which ours is not sent.
    fn silent(&self) -> Vec<usize> {
        (0..self.waiting.len())
            .filter(|&p| self.waiting[p] || self.sending[p])
            .collect()
    }
}

/// Whether the goodbye received in `c` says that its sender aborted.
fn said_aborted(c: &Completion) -> bool {
    let word = c.data.as_deref().and_then(|d| d.get(..8)).map(|b| {
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        u64::from_le_bytes(w)
    });
    c.status.is_ok() && word.is_some_and(|w| w & ABORTED != 0)
}

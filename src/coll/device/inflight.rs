//! A communicator's device calls in flight, in call order, and one step that advances them all
//! together (`Inflight::advance`): blocking, non-blocking, grouped and stream-ordered calls
//! alike. Whoever waits (a blocking call, `fabricoll_wait` or `test`, a host call that must
//! come after them) steps them, and so does the communicator's worker thread (`stream`), so a
//! call progresses while nobody waits for it.
//!
//! **Order.** Each call's slices run as host collectives or transfers, started one after
//! another. A call's next slice may start only once every earlier call of the same channel
//! (`Channel`: the collectives share one, each point-to-point direction, peer and tag has its
//! own) has started all of its slices. So the collectives' slices start in call order on every
//! rank, as the engine's tags need, and a send to a peer never overtakes an earlier one on the
//! same channel, while sends and receives of one group (different channels) run side by side
//! whatever their order in the group.
//!
//! **Slots.** Every call holds a slot of its own while it runs (`pool`): the calls of a group
//! all progress, however many. A call takes it when it is made, before it is added here,
//! unless none is free or a stream-ordered call waits at its submission for one
//! (`wants_slot`): then a blocking, non-blocking or grouped call allocates one, and a
//! stream-ordered call waits (`Streams::submit`: its copies are enqueued on its stream at
//! submission, in its slots), stepping the calls here, which free slots as they end. While a
//! submission waits, no call borrows a free slot for more slices in flight. The calls here
//! are all earlier than the waiting one and end without it.
//!
//! **Stream-ordered calls** have their whole copy schedule on the caller's stream (`staged`):
//! each slice's collective starts once the stream has staged it (an event), and the stream's
//! copy out of a slice waits for its slot's flag to reach the number of that use of the slot
//! (`pool::Slot::flag`, numbered at submission). A slot is one call's at a time, used slice
//! after slice, so each slot's numbers are released in order, as the call's collectives finish
//! (`release`); calls release their slices independently of each other, so a stream-ordered
//! call never waits for another's collectives (a send and a receive on two streams, made
//! send first on both ranks, both complete). A call ends when the stream has passed its last
//! copy; a failed one releases every slice at once, so that its stream goes on.
//!
//! **Deadline.** When none of the running calls moved for the communicator's timeout, they all
//! fail with a `Timeout`; an abort fails them at the next step.
use super::pool::Pool;
use super::staged::Pipeline;
use crate::coll::{Callback, Comm, Kind};
use crate::device::Stream;
use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::time::Instant;

/// What orders a call's slices against earlier calls (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Channel {
    Coll,
    P2p { send: bool, peer: usize, tag: u32 },
}

impl Channel {
    pub fn of(kind: &Kind) -> Channel {
        match *kind {
            Kind::Send { peer } => Channel::P2p {
                send: true,
                peer,
                tag: 0,
            },
            Kind::Recv { peer } => Channel::P2p {
                send: false,
                peer,
                tag: 0,
            },
            Kind::Tagged { send, peer, tag } => Channel::P2p { send, peer, tag },
            _ => Channel::Coll,
        }
    }
}

/// How a call ends.
pub(super) enum End {
    /// A request (of a blocking, non-blocking or grouped call): its result stays until `take`,
    /// or goes to the callback `notify` set.
    Request(Option<Callback>),
    /// A stream-ordered call on `stream` (dropped once the call has ended and released every
    /// slice: dropping it waits for its operations that hold memory, which the releases end).
    Stream { stream: Option<Stream> },
}

/// What the caller of `advance` does once the lock is released: run a callback, or drop a
/// released stream (which may wait for its work).
pub(super) enum Finish {
    Callback(Callback, Result<()>),
    Drop(Stream),
}

pub(super) struct Entry {
    pub id: u64,
    channel: Channel,
    pipe: Pipeline,
    /// None while running.
    result: Option<Result<()>>,
    end: End,
}

impl Entry {
    pub fn new(id: u64, pipe: Pipeline, end: End) -> Entry {
        Entry {
            id,
            channel: Channel::of(&pipe.call().kind),
            pipe,
            result: None,
            end,
        }
    }

    fn running(&self) -> bool {
        self.result.is_none()
    }

    fn stream_ordered(&self) -> bool {
        matches!(self.end, End::Stream { .. })
    }
}

/// The calls in flight, the slots, and the stream-ordered calls' first error.
#[derive(Default)]
pub(super) struct Inflight {
    pub pool: Option<Pool>,
    /// The first failure of a stream-ordered call: later ones fail with it at once.
    pub error: Option<Error>,
    /// Every rank has made its staging: the first stream-ordered call waited for them
    /// (`Streams::join`) before its stream waited for anything.
    pub joined: bool,
    /// Stream-ordered calls waiting at their submission for a free slot (`Streams::submit`).
    pub slot_waiters: usize,
    entries: VecDeque<Entry>,
    next_id: u64,
    last_moved: Option<Instant>,
}

impl Inflight {
    /// Adds a call (made with `id` from `next_id`) behind the others.
    pub fn push(&mut self, e: Entry) {
        if let Some(p) = self.pool.as_mut().filter(|_| !e.pipe.is_direct()) {
            let reduces = match e.pipe.call().kind {
                Kind::Coll(c) => c.reduces(),
                Kind::Varied(l) => l.coll == crate::algo::varied::Varied::ReduceScatterV,
                _ => false,
            };
            p.log_choice(reduces);
        }
        if !self.entries.iter().any(Entry::running) {
            self.last_moved = Some(Instant::now());
        }
        self.entries.push_back(e);
    }

    pub fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Whether a call is running.
    pub fn busy(&self) -> bool {
        self.entries.iter().any(Entry::running)
    }

    /// Whether a stream-ordered call waits at its submission for a slot: a call made now must
    /// not take a free slot before it, and no call borrows one (the module doc).
    pub fn wants_slot(&self) -> bool {
        self.slot_waiters > 0
    }

    /// Whether a running call of `channel` has slices not started yet (a call of that channel
    /// made now must wait for them).
    pub fn holds(&self, channel: Channel) -> bool {
        self.entries
            .iter()
            .any(|e| e.running() && e.channel == channel && !e.pipe.issued())
    }

    /// The result of request `id` if it has ended (the request is then gone); None while it
    /// runs; an error naming `request` if it is not a request of these calls.
    pub fn take(&mut self, id: u64) -> Result<Option<Result<()>>> {
        let i = self.find(id)?;
        if self.entries[i].running() {
            return Ok(None);
        }
        let e = self.entries.remove(i).expect("found above");
        Ok(e.result)
    }

    /// Sets request `id`'s callback: Err(callback back) where it has already ended (its
    /// result with it, the request gone).
    pub fn set_callback(
        &mut self,
        id: u64,
        cb: Callback,
    ) -> Result<std::result::Result<(), (Callback, Result<()>)>> {
        let i = self.find(id)?;
        if !self.entries[i].running() {
            let e = self.entries.remove(i).expect("found above");
            return Ok(Err((cb, e.result.unwrap_or(Ok(())))));
        }
        match &mut self.entries[i].end {
            End::Request(slot @ None) => {
                *slot = Some(cb);
                Ok(Ok(()))
            }
            _ => Err(Error::arg("request", "already handed to notify")),
        }
    }

    fn find(&self, id: u64) -> Result<usize> {
        self.entries
            .iter()
            .position(|e| e.id == id && matches!(e.end, End::Request(None)))
            .ok_or_else(|| {
                Error::arg(
                    "request",
                    "not a pending device request of this communicator (or handed to notify)",
                )
            })
    }

    /// Adds call `e`, which failed as it was submitted (`err`; its stream may hold part of
    /// its schedule), and releases what can be: what to do once the lock is released.
    pub fn push_failed(&mut self, e: Entry, err: Error) -> Vec<Finish> {
        self.push(e);
        self.end(self.entries.len() - 1, Err(err));
        let mut fin = Vec::new();
        self.release(&mut fin);
        fin
    }

    /// One round over every running call: slots for calls without one, each call's step, the
    /// deadline; then the releases of stream-ordered slices and ended calls. Whether
    /// anything moved, and what to do once the lock is released.
    pub fn advance(&mut self, comm: &Comm) -> (bool, Vec<Finish>) {
        let mut fin = Vec::new();
        if !self.busy() {
            return (false, fin);
        }
        let moved = match self.step_all(comm) {
            Ok(m) => m,
            Err(e) => {
                self.fail_all(&e);
                true
            }
        };
        let now = Instant::now();
        if moved || self.last_moved.is_none() {
            self.last_moved = Some(now);
        } else if self
            .last_moved
            .is_some_and(|t| now.duration_since(t) > comm.timeout.limit)
        {
            // An abort while a step held this thread reads as the abort.
            let e = comm.check_alive().err();
            for i in 0..self.entries.len() {
                if self.entries[i].running() {
                    let err = e.clone().unwrap_or_else(|| {
                        Error::Timeout(self.entries[i].stalled(&comm.timeout.to_string()))
                    });
                    self.end(i, Err(err));
                }
            }
        }
        self.release(&mut fin);
        (moved, fin)
    }

    fn step_all(&mut self, comm: &Comm) -> Result<bool> {
        comm.check_alive()?;
        let Some(pool) = self.pool.as_mut() else {
            return Err(Error::Internal(
                "device calls in flight without their staging".into(),
            ));
        };
        pool.device().make_current()?;
        let mut moved = false;
        let mut failed = Vec::new();
        // A submission waits for a slot: no call borrows one.
        let borrow = self.slot_waiters == 0;
        let mut blocked: Vec<Channel> = Vec::new();
        for (i, e) in self.entries.iter_mut().enumerate() {
            if !e.running() {
                continue;
            }
            let may_start = !blocked.contains(&e.channel);
            match e.pipe.step(comm, pool, may_start, borrow) {
                Ok(m) => moved |= m,
                Err(err) => {
                    failed.push((i, err));
                    continue;
                }
            }
            if !e.pipe.issued() {
                blocked.push(e.channel);
            }
        }
        for (i, err) in failed {
            self.end(i, Err(err));
        }
        for i in 0..self.entries.len() {
            let e = &self.entries[i];
            if e.running() && e.pipe.finished() {
                self.end(i, Ok(()));
                moved = true;
            }
        }
        Ok(moved)
    }

    /// Ends every running call with `err`.
    pub fn fail_all(&mut self, err: &Error) {
        for i in 0..self.entries.len() {
            if self.entries[i].running() {
                self.end(i, Err(err.clone()));
            }
        }
    }

    /// Ends call `i` with `r`: its slots go back to the pool, or are leaked where a copy or
    /// the transport may still use them. A failed stream-ordered call's error becomes the
    /// communicator's, and fails the stream-ordered calls after it.
    fn end(&mut self, i: usize, r: Result<()>) {
        let e = &mut self.entries[i];
        log::debug!("device call {} ended: {r:?} ({})", e.id, e.pipe.progress());
        if let Some(pool) = self.pool.as_mut() {
            // Every slice of a stream-ordered call released before its slots may be leaked:
            // its stream goes on (a failed call's outputs hold what its slots held).
            e.pipe.release(pool, true);
            let own = e.pipe.own();
            for s in e.pipe.slots() {
                if r.is_ok() || (Some(s) == own && !e.pipe.touched()) {
                    pool.give(s);
                } else {
                    pool.leak(s);
                }
            }
        }
        let stream_err = match &r {
            Err(err) if e.stream_ordered() => {
                log::warn!("stream-ordered call {} failed: {err}", e.id);
                Some(err.clone())
            }
            _ => None,
        };
        e.result = Some(r);
        if let Some(err) = stream_err {
            let first = self.error.get_or_insert(err).clone();
            for j in i + 1..self.entries.len() {
                let later = &self.entries[j];
                if later.running() && matches!(later.end, End::Stream { .. }) {
                    self.end(j, Err(earlier(&first)));
                }
            }
        }
    }

    /// Releases the slices of running stream-ordered calls whose collectives have finished
    /// (an ended call released all of its own, `end`); drops the streams of the ended
    /// stream-ordered calls, and hands over the ended requests that have a callback.
    fn release(&mut self, fin: &mut Vec<Finish>) {
        if let Some(pool) = self.pool.as_ref() {
            for e in self.entries.iter_mut().filter(|e| e.running()) {
                e.pipe.release(pool, false);
            }
        }
        let mut keep = VecDeque::with_capacity(self.entries.len());
        for mut e in self.entries.drain(..) {
            let gone = match &mut e.end {
                End::Stream { stream } if e.result.is_some() => {
                    fin.extend(stream.take().map(Finish::Drop));
                    true
                }
                End::Request(cb @ Some(_)) if e.result.is_some() => {
                    let r = e.result.take().expect("ended");
                    fin.push(Finish::Callback(cb.take().expect("set"), r));
                    true
                }
                _ => false,
            };
            if !gone {
                keep.push_back(e);
            }
        }
        self.entries = keep;
    }

    /// Ends every call, running or not, with `err` and releases every stream (the
    /// communicator is being destroyed).
    pub fn close(&mut self, err: &Error) -> Vec<Finish> {
        self.fail_all(err);
        let mut fin = Vec::new();
        self.release(&mut fin);
        fin
    }
}

impl Entry {
    /// Why a call that made no progress within `timeout` failed.
    fn stalled(&self, timeout: &str) -> String {
        if self.stream_ordered() && self.pipe.started() == 0 {
            format!(
                "the stream did not reach stream-ordered call {} within {timeout}",
                self.id
            )
        } else {
            format!(
                "a {} device call made no progress within {timeout} ({})",
                if self.pipe.is_direct() {
                    "direct"
                } else {
                    "staged"
                },
                self.pipe.progress()
            )
        }
    }
}

/// The error of a call refused because an earlier stream-ordered call failed.
pub(super) fn earlier(e: &Error) -> Error {
    let text = format!("an earlier stream-ordered call on this communicator failed: {e}");
    match e {
        Error::InvalidArgument(_) | Error::InvalidUsage(_) => Error::InvalidUsage(text),
        Error::System(_) => Error::System(text),
        Error::Internal(_) => Error::Internal(text),
        Error::Remote(_) => Error::Remote(text),
        Error::Timeout(_) => Error::Timeout(text),
    }
}

//! The staged path of one call (`Pipeline`): the call runs as the same collective on
//! page-locked host slots (`pool`), one slice at a time (`slices`), with up to `SLOTS` slices
//! in flight. A slice is copied in (device to host, on the pool's `inbound` stream), its
//! collective runs on the host engine (sends, receives and reductions), and it is copied out
//! (host to device, on the `outbound` stream); the copy-in of one slice, the collective of the
//! next older and the copy-out of the one before overlap. `step` advances it without
//! blocking, so that several calls progress together (`inflight`); the caller of `step` says
//! when the next slice's collective may start, which keeps the starts in call order on every
//! rank. Each slice's collective is bit-identical across ranks as every host collective is,
//! so the whole call is too.
//!
//! A stream-ordered call's schedule on the caller's stream is `ordered`'s.
//!
//! Reductions run on the host, on the staged slice: the slice is in host memory already, and a
//! device kernel would need every received contribution copied back to the device first (one
//! more crossing of the bus per contribution). A pageable host buffer of a mixed call is copied
//! to and from its slot by the host.
use super::direct::Direct;
use super::pool::{Pool, Slot, SLICE_BYTES, SLOTS, SLOT_BYTES};
use super::slices::{self, Piece, Slice};
use super::DevCall;
use crate::coll::{Call, Comm, Kind, RequestId};
use crate::config::Compression;
use crate::device::{Device, Event, HostBuffer, PtrKind, Span, Stream};
use crate::error::{Error, Result};
use ordered::OnStream;
use std::collections::VecDeque;
use std::sync::Arc;

mod ordered;

/// One side of the call (its input or its output) as the copies see it.
enum Side {
    /// NULL: the call does not use it on this rank.
    Absent,
    /// Pageable host memory at this address: copied by the host.
    Host(u64),
    /// Page-locked host memory at this address: copied by the host too. A stream's copy
    /// between two host buffers is synchronous with respect to the calling thread on CUDA (no
    /// copy engine takes it): it would wait for the caller's stream to reach the copy, behind
    /// the flag waits that the worker releases. A stream-ordered call's worker copies such a
    /// side itself: in, once the stream has staged the slice; out, before it releases it.
    Pinned(u64),
    /// Memory the streams copy.
    Stream(Span),
}

impl Side {
    /// The side as the caller's stream copies it: page-locked host memory is the worker's.
    fn on_stream(&self) -> &Side {
        match self {
            Side::Pinned(_) => &Side::Absent,
            s => s,
        }
    }
}

/// A slice in flight, in slot `slot`.
struct Stage {
    slice: usize,
    slot: usize,
    state: State,
}

#[derive(Clone, Copy)]
enum State {
    /// Copying in; `recorded`: an event follows the copies (else nothing to wait for).
    In {
        recorded: bool,
    },
    Running {
        req: RequestId,
    },
    Out {
        recorded: bool,
    },
    Free,
    /// A stream-ordered call's slice whose collective has finished (its copy out is the
    /// stream's, once released).
    Collected,
}

/// One call's slices and where each is.
pub(super) struct Pipeline {
    call: DevCall,
    /// The compression every slice's collective runs with, settled when the call was made.
    compress: Compression,
    list: Vec<Slice>,
    input: Side,
    output: Side,
    /// Bytes of a slot that a slice needs: (input, output).
    need: (usize, usize),
    /// The call's own slot (None: not given one yet), kept until it ends.
    own: Option<usize>,
    stages: VecDeque<Stage>,
    next_in: usize,
    next_start: usize,
    done: usize,
    /// A stream-ordered call's schedule (None: the worker copies, on the pool's streams).
    on_stream: Option<OnStream>,
    /// The call on the direct path (`direct`): one slice, no slot, no copies.
    direct: Option<Direct>,
}

impl Pipeline {
    /// The slices of `call` on `comm`, `nslices` of them where the ranks agreed on the number
    /// at run time (AllToAllV; None: from the blocks, which every rank shares); or the call
    /// whole on the direct path, where `direct` (what direct calls share) is given and it can
    /// take it.
    pub fn new(
        comm: &Comm,
        call: DevCall,
        nslices: Option<usize>,
        direct: Option<Arc<super::direct::Ctx>>,
    ) -> Result<Pipeline> {
        let elem = call.dtype.size();
        let blocks = match &call.blocks {
            Some(b) => b.clone(),
            None => slices::uniform(call.kind, comm.nranks, call.count),
        };
        // The slice size must be the same on every rank: a rooted collective's root has
        // `nranks` blocks on one side where the others have one, so it counts for all.
        let width = match call.kind {
            Kind::Varied(_) => comm.nranks,
            _ => blocks.widest(),
        };
        let per = (SLICE_BYTES.min(SLOT_BYTES / width.max(1)) / elem).max(1);
        let n = nslices.unwrap_or_else(|| slices::count_of(blocks.longest(), per));
        let list = slices::slices(&blocks, elem, per, n);
        let (ie, oe) = blocks.extent();
        let dev = call.device().clone();
        let input = side(&dev, call.send, call.kinds[0], ie * elem, "sendbuf")?;
        let output = side(&dev, call.recv, call.kinds[1], oe * elem, "recvbuf")?;
        let (ib, ob) = blocks.slot_bytes(elem, per);
        let need = (
            if matches!(input, Side::Absent) { 0 } else { ib },
            if matches!(output, Side::Absent) {
                0
            } else {
                ob
            },
        );
        if need.0.max(need.1) > SLOT_BYTES {
            return Err(Error::Internal(format!(
                "a slice of {} bytes does not fit a staging slot of {SLOT_BYTES}",
                need.0.max(need.1)
            )));
        }
        let compress = comm.settled_compression(call.kind, call.dtype, call.op, call.compress)?;
        let (direct, list, need) = match direct {
            Some(st) => match Direct::new(&call, &blocks, compress, st)? {
                Some((d, whole)) => (Some(d), vec![whole], (0, 0)),
                None => (None, list, need),
            },
            None => (None, list, need),
        };
        Ok(Pipeline {
            call,
            compress,
            direct,
            list,
            input,
            output,
            need,
            own: None,
            stages: VecDeque::new(),
            next_in: 0,
            next_start: 0,
            done: 0,
            on_stream: None,
        })
    }

    /// How many slices the call has (at least one).
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// How many slices' collectives have started.
    pub fn started(&self) -> usize {
        self.next_start
    }

    pub fn call(&self) -> &DevCall {
        &self.call
    }

    /// Whether the call takes the direct path (it needs no slot).
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    /// Bytes of a slot that one slice needs.
    pub fn need(&self) -> (usize, usize) {
        self.need
    }

    pub fn own(&self) -> Option<usize> {
        self.own
    }

    /// Gives the call its own slot (busy in the pool, kept until the call ends).
    pub fn set_own(&mut self, slot: usize) {
        self.own = Some(slot);
    }

    /// Whether every slice's collective has started (later calls of its kind may start).
    pub fn issued(&self) -> bool {
        self.next_start == self.list.len()
    }

    /// How far it got, for an error.
    pub fn progress(&self) -> String {
        format!("{} of {} slices done", self.done, self.list.len())
    }

    /// Whether it has ended: every slice done (a stream-ordered call's: and the stream past
    /// its last copy).
    pub fn finished(&self) -> bool {
        self.done == self.list.len() && self.on_stream.as_ref().is_none_or(|o| o.passed_seen)
    }

    /// Whether a copy or collective of it may still use its slots (a stream-ordered call's
    /// copies are on the stream from its submission).
    pub fn touched(&self) -> bool {
        !self.stages.is_empty() || self.on_stream.is_some()
    }

    /// The slots it holds: its own, and those of slices in flight.
    pub fn slots(&self) -> Vec<usize> {
        if let Some(o) = &self.on_stream {
            return o.slots.clone();
        }
        let mut v: Vec<usize> = self.own.into_iter().collect();
        v.extend(
            self.stages
                .iter()
                .map(|s| s.slot)
                .filter(|&s| Some(s) != self.own),
        );
        v
    }

    /// Advances what can move without waiting: copies in (in its own slot, or one borrowed
    /// from the pool where `borrow`), starts the next slice's collective where `may_start`,
    /// copies out finished slices, and frees slots. Whether anything moved.
    pub fn step(
        &mut self,
        comm: &Comm,
        pool: &mut Pool,
        may_start: bool,
        borrow: bool,
    ) -> Result<bool> {
        if self.direct.is_some() {
            return self.step_direct(comm, may_start);
        }
        if self.on_stream.is_some() {
            return self.step_stream(comm, pool, may_start);
        }
        let Some(own) = self.own else {
            return Ok(false);
        };
        let mut moved = false;
        while self.next_in < self.list.len() && self.stages.len() < SLOTS {
            let slot = if self.stages.iter().all(|s| s.slot != own) {
                own
            } else if borrow {
                match pool.take(self.need) {
                    Some(s) => s,
                    None => break,
                }
            } else {
                break;
            };
            let s = &self.list[self.next_in];
            let recorded = copy(pool, pool.slot(slot), &s.input, &self.input, true)?;
            self.stages.push_back(Stage {
                slice: self.next_in,
                slot,
                state: State::In { recorded },
            });
            self.next_in += 1;
            moved = true;
        }
        for st in self.stages.iter_mut() {
            let slot = pool.slot(st.slot);
            match st.state {
                State::In { recorded }
                    if may_start
                        && st.slice == self.next_start
                        && (!recorded || slot.copied_in.query()?) =>
                {
                    let s = &self.list[st.slice];
                    let c = slot_call(&self.call, slot, s, &self.input, &self.output);
                    st.state = State::Running {
                        req: comm.start_with(&c, Some(self.compress))?,
                    };
                    self.next_start += 1;
                    moved = true;
                }
                State::Running { req } if comm.test(req)? => {
                    let s = &self.list[st.slice];
                    let recorded = copy(pool, slot, &s.output, &self.output, false)?;
                    st.state = State::Out { recorded };
                    moved = true;
                }
                State::Out { recorded } if !recorded || slot.copied_out.query()? => {
                    st.state = State::Free;
                    self.done += 1;
                    moved = true;
                }
                _ => {}
            }
        }
        self.stages.retain(|st| {
            let free = matches!(st.state, State::Free);
            if free && st.slot != own {
                pool.give(st.slot);
            }
            !free
        });
        Ok(moved)
    }
}

impl Pipeline {
    /// `step` of a call on the direct path: starts its one host-engine call where `may_start`
    /// (a stream-ordered call's: once its stream has reached it, its event, so that the work
    /// enqueued on the stream before the call has written its input), then notes when it has
    /// finished (a stream-ordered call's flag is then written, `release`, and the call ends
    /// once the stream has passed it).
    fn step_direct(&mut self, comm: &Comm, may_start: bool) -> Result<bool> {
        let Some(d) = self.direct.as_mut() else {
            return Ok(false);
        };
        if self.next_start == 0 {
            let reached = match &self.on_stream {
                Some(os) => may_start && os.staged[0].query()?,
                None => may_start,
            };
            if reached {
                d.start(comm, &self.call, &self.list[0])?;
                self.next_start = 1;
            }
            return Ok(reached);
        }
        let mut moved = false;
        if self.done == 0 && d.test(comm)? {
            self.done = 1;
            moved = true;
        }
        Ok(self.passed(comm)? || moved)
    }
}

/// The side of a buffer of `len` bytes at `addr` (0: NULL).
fn side(dev: &Device, addr: u64, kind: Option<PtrKind>, len: usize, name: &str) -> Result<Side> {
    match kind {
        None => Ok(Side::Absent),
        Some(_) if len == 0 => Ok(Side::Absent),
        Some(PtrKind::Host) => Ok(Side::Host(addr)),
        Some(PtrKind::PinnedHost) => Ok(Side::Pinned(addr)),
        // SAFETY: `DevCall::classify`'s caller promised the buffer valid for the call's
        // length until it completes, and the call completes only once every copy has.
        Some(_) => Ok(Side::Stream(unsafe {
            Span::from_raw(dev, addr, len, name)
        }?)),
    }
}

/// Starts the copies of `pieces` between the caller's side `user` and the slot, into the slot
/// when `inward` (on the pool's inbound stream, else its outbound one): whether an event was
/// recorded after them (host copies are done on return). The slot's buffer is idle: its
/// previous slice's copies and collective have completed.
fn copy(pool: &Pool, slot: &Slot, pieces: &[Piece], user: &Side, inward: bool) -> Result<bool> {
    let (buf, st, ev): (Option<&HostBuffer>, &Stream, &Event) = if inward {
        (slot.input.as_ref(), &pool.inbound, &slot.copied_in)
    } else {
        (slot.output.as_ref(), &pool.outbound, &slot.copied_out)
    };
    let on_stream = copy_on(st, buf, pieces, user, inward)?;
    if on_stream {
        st.record(ev)?;
    }
    Ok(on_stream)
}

/// Copies `pieces` between the caller's side `user` and the slot's buffer `buf` (None: the
/// call has no such side), into `buf` when `inward`: by the host for pageable memory (done on
/// return), else enqueued on `st`. Whether anything was enqueued.
fn copy_on(
    st: &Stream,
    buf: Option<&HostBuffer>,
    pieces: &[Piece],
    user: &Side,
    inward: bool,
) -> Result<bool> {
    let Some(buf) = buf else {
        return Ok(false);
    };
    match user {
        Side::Absent => Ok(false),
        Side::Host(addr) | Side::Pinned(addr) => {
            host_copy(Some(buf), pieces, *addr, inward);
            Ok(false)
        }
        Side::Stream(span) => {
            for p in pieces {
                let u = span.slice(p.user..p.user + p.len)?;
                let s = buf.slice(p.slot..p.slot + p.len)?;
                if inward {
                    st.copy(&s, &u)?;
                } else {
                    st.copy(&u, &s)?;
                }
            }
            Ok(!pieces.is_empty())
        }
    }
}

/// Copies `pieces` between the caller's host memory at `addr` and the slot's buffer `buf`
/// (None: the call has no such side) by the calling thread, into `buf` when `inward`.
fn host_copy(buf: Option<&HostBuffer>, pieces: &[Piece], addr: u64, inward: bool) {
    let Some(buf) = buf else {
        return;
    };
    for p in pieces {
        let u = (addr + p.user as u64) as *mut u8;
        // SAFETY: the slot is `buf.len()` >= p.slot + p.len bytes (the slice's need), idle (no
        // stream or transport operation uses it now), and the caller's buffer is valid for the
        // call's length (DevCall::classify's contract) and, in a stream-ordered call, not in use
        // by its stream now (the callers' ordering); the two are distinct allocations.
        unsafe {
            let s = buf.as_ptr().add(p.slot);
            if inward {
                std::ptr::copy_nonoverlapping(u, s, p.len);
            } else {
                std::ptr::copy_nonoverlapping(s, u, p.len);
            }
        }
    }
}

/// The host call of slice `s` on the slot's buffers.
fn slot_call(call: &DevCall, slot: &Slot, s: &Slice, input: &Side, output: &Side) -> Call {
    let base = |buf: Option<&HostBuffer>, side: &Side| match (buf, side) {
        (Some(b), Side::Host(_) | Side::Pinned(_) | Side::Stream(_)) => Some(b.as_ptr() as u64),
        _ => None,
    };
    slices::call(
        call,
        s,
        base(slot.input.as_ref(), input),
        base(slot.output.as_ref(), output),
    )
}

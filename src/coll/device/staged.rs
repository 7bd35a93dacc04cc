//! The staged path: a call on device buffers runs as the same collective on page-locked host
//! slots, one slice at a time (`slices`), with up to `SLOTS` slices in flight. A slice is
//! copied in (device to host, on the `inbound` stream), its collective runs on the host engine
//! (sends, receives and reductions), and it is copied out (host to device, on the `outbound`
//! stream); the copy-in of one slice, the collective of the next older and the copy-out of the
//! one before overlap. Collectives start in slice order, the same on every rank, and each is
//! bit-identical across ranks as every host collective is, so the whole call is too.
//!
//! Reductions run on the host, on the staged slice: the slice is in host memory already, and a
//! device kernel would need every received contribution copied back to the device first (one
//! more crossing of the bus per contribution). A pageable host buffer of a mixed call is copied
//! to and from its slot by the host.
use super::slices::{self, Piece, Slice};
use super::DevCall;
use crate::coll::{Call, Comm, Kind, RequestId};
use crate::device::{Device, Event, HostBuffer, PtrKind, Span, Stream};
use crate::error::{Error, Result};
use crate::transport::Region;
use std::time::{Duration, Instant};

/// The longest sleep of the pipeline between rounds without progress (the copies and the
/// fabric make progress without this thread, but the next slice waits for it).
const PIPELINE_MAX_NAP: Duration = Duration::from_micros(200);

/// Slices in flight at most: one copying in, one in its collective, one copying out, and one
/// more so that a slow stage does not stall the other two.
pub(super) const SLOTS: usize = 4;

/// Bytes of a slice per block, at most (a slot holds `nranks` blocks on a gathered side).
pub(super) const SLICE_BYTES: usize = 1 << 20;

/// Bytes of each side (input, output) of a slot: allocated up front, when the communicator
/// first uses the device, and kept. A slice's blocks share it, so on a gathered side of more
/// than 4 ranks a slice has less than `SLICE_BYTES` per block.
pub(super) const SLOT_BYTES: usize = 4 * SLICE_BYTES;

/// A communicator's staging memory and copy streams, kept between calls.
///
/// The slots' page-locked memory is allocated here, once, and freed when the staging is
/// dropped (the communicator is destroyed): allocating or freeing page-locked memory waits for
/// the whole device on the CUDA driver, so doing either while a caller's stream waits for a
/// stream-ordered call's flag would wait for that stream, which waits for the call: a
/// deadlock (docs/device.md).
pub struct Staging {
    dev: Device,
    inbound: Stream,
    outbound: Stream,
    slots: Vec<Slot>,
    /// A failed call leaked the slots: this staging cannot run calls any more.
    leaked: bool,
    logged: bool,
}

struct Slot {
    input: Option<HostBuffer>,
    output: Option<HostBuffer>,
    copied_in: Event,
    copied_out: Event,
}

/// One side of the call (its input or its output) as the copies see it.
enum Side {
    /// NULL: the call does not use it on this rank.
    Absent,
    /// Pageable host memory at this address: copied by the host.
    Host(u64),
    /// Memory the streams copy.
    Stream(Span),
}

/// Where slice `i` (in its slot `i % SLOTS`) is.
#[derive(Clone, Copy)]
enum State {
    Free,
    /// Copying in; `recorded`: an event follows the copies (else nothing to wait for).
    In {
        slice: usize,
        recorded: bool,
    },
    Running {
        slice: usize,
        req: RequestId,
    },
    Out {
        recorded: bool,
    },
}

impl Staging {
    /// Copy streams, events and every slot's page-locked memory (`SLOTS` x 2 x `SLOT_BYTES`),
    /// allocated now. Must not run while a stream of the device may wait for a flag that the
    /// caller's side writes (see the type's documentation).
    pub fn new(dev: &Device) -> Result<Staging> {
        let slot = || -> Result<Slot> {
            Ok(Slot {
                input: Some(dev.alloc_host(SLOT_BYTES)?),
                output: Some(dev.alloc_host(SLOT_BYTES)?),
                copied_in: dev.create_event()?,
                copied_out: dev.create_event()?,
            })
        };
        Ok(Staging {
            dev: dev.clone(),
            inbound: dev.create_stream()?,
            outbound: dev.create_stream()?,
            slots: (0..SLOTS).map(|_| slot()).collect::<Result<_>>()?,
            leaked: false,
            logged: false,
        })
    }

    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Whether calls can run on it (no failed call leaked its slots).
    pub fn usable(&self) -> bool {
        !self.leaked
    }

    /// Runs `call` on `comm` to completion (every wait bounded by the communicator's
    /// timeout). It allocates nothing page-locked. On failure the slots are leaked rather than
    /// freed, since the transport may still write them, and the staging is no longer usable.
    pub fn run(&mut self, comm: &Comm, call: &DevCall) -> Result<()> {
        if self.leaked {
            return Err(Error::Internal(
                "the device staging slots were given up after a failed call".into(),
            ));
        }
        let r = self.pipeline(comm, call);
        if r.is_err() {
            self.leaked = true;
            for s in self.slots.iter_mut() {
                std::mem::forget(s.input.take());
                std::mem::forget(s.output.take());
            }
        }
        r
    }

    fn pipeline(&mut self, comm: &Comm, call: &DevCall) -> Result<()> {
        let n = comm.nranks;
        let elem = call.dtype.size();
        let (ins, outs) = slices::blocks(call.kind, n);
        let per = (SLICE_BYTES.min(SLOT_BYTES / ins.max(outs).max(1)) / elem).max(1);
        let list = slices::slices(call.kind, n, call.count, elem, per);
        let input = side(
            &self.dev,
            call.send,
            call.kinds[0],
            ins * call.count * elem,
            "sendbuf",
        )?;
        let output = side(
            &self.dev,
            call.recv,
            call.kinds[1],
            outs * call.count * elem,
            "recvbuf",
        )?;
        self.log_choice(call, list.len());
        let (in_bytes, out_bytes) = slices::slot_bytes(call.kind, n, elem, per.min(call.count));
        if in_bytes.max(out_bytes) > SLOT_BYTES {
            return Err(Error::Internal(format!(
                "a slice of {} bytes does not fit a staging slot of {SLOT_BYTES}",
                in_bytes.max(out_bytes)
            )));
        }
        let mut states = [State::Free; SLOTS];
        let (mut next_in, mut next_start, mut done) = (0, 0, 0);
        let timeout = comm.timeout;
        let mut last = Instant::now();
        let mut nap = Duration::ZERO;
        while done < list.len() {
            comm.check_alive()?;
            let mut moved = false;
            // Copy in the next slice where its slot is free.
            while next_in < list.len() && matches!(states[next_in % SLOTS], State::Free) {
                let slot = &self.slots[next_in % SLOTS];
                let recorded = copy_in(&self.inbound, slot, &list[next_in], &input)?;
                states[next_in % SLOTS] = State::In {
                    slice: next_in,
                    recorded,
                };
                next_in += 1;
                moved = true;
            }
            for (i, st) in states.iter_mut().enumerate() {
                let slot = &self.slots[i];
                match *st {
                    State::In { slice, recorded }
                        if slice == next_start && (!recorded || slot.copied_in.query()?) =>
                    {
                        let c = slot_call(call, n, slot, &list[slice], &input, &output);
                        *st = State::Running {
                            slice,
                            req: comm.start(&c)?,
                        };
                        next_start += 1;
                        moved = true;
                    }
                    State::Running { slice, req } if comm.test(req)? => {
                        let recorded = copy_out(&self.outbound, slot, &list[slice], &output)?;
                        *st = State::Out { recorded };
                        moved = true;
                    }
                    State::Out { recorded, .. } if !recorded || slot.copied_out.query()? => {
                        *st = State::Free;
                        done += 1;
                        moved = true;
                    }
                    _ => {}
                }
            }
            if moved {
                last = Instant::now();
                nap = Duration::ZERO;
            } else if last.elapsed() > timeout.limit {
                // An abort while the engine held this thread reads as the abort.
                comm.check_alive()?;
                return Err(Error::Timeout(format!(
                    "a staged device call made no progress within {timeout} ({done} of {} \
                     slices done)",
                    list.len()
                )));
            } else {
                nap = crate::device::backoff_to(nap, PIPELINE_MAX_NAP);
            }
        }
        Ok(())
    }

    fn log_choice(&mut self, call: &DevCall, slices: usize) {
        if self.logged {
            return;
        }
        self.logged = true;
        let reduces = matches!(call.kind, Kind::Coll(c) if c.reduces());
        log::info!(
            "device buffers: staged through page-locked host slots ({SLOTS} slices of up to \
             {SLICE_BYTES} bytes per block in flight; {slices} slice(s) in the first call), since \
             this build registers no device memory with the provider{}",
            if reduces {
                "; reductions on the host, on the staged slices (a device kernel would need each \
                 received contribution copied back to the device first)"
            } else {
                ""
            }
        );
    }
}

/// The side of a buffer of `len` bytes at `addr` (0: NULL).
fn side(dev: &Device, addr: u64, kind: Option<PtrKind>, len: usize, name: &str) -> Result<Side> {
    match kind {
        None => Ok(Side::Absent),
        Some(PtrKind::Host) => Ok(Side::Host(addr)),
        // SAFETY: `DevCall::classify`'s caller promised the buffer valid for the call's
        // length until it completes, and `run` returns only once every copy has completed.
        Some(_) => Ok(Side::Stream(unsafe {
            Span::from_raw(dev, addr, len, name)
        }?)),
    }
}

/// Starts copying slice `s` of the caller's input into the slot: whether an event was
/// recorded after the copies (host copies are done on return).
fn copy_in(st: &Stream, slot: &Slot, s: &Slice, from: &Side) -> Result<bool> {
    copy(
        st,
        slot.input.as_ref(),
        &s.input,
        from,
        true,
        &slot.copied_in,
    )
}

/// Starts copying slice `s` from the slot into the caller's output.
fn copy_out(st: &Stream, slot: &Slot, s: &Slice, to: &Side) -> Result<bool> {
    copy(
        st,
        slot.output.as_ref(),
        &s.output,
        to,
        false,
        &slot.copied_out,
    )
}

/// The copies of `pieces` between `user` and the slot buffer `buf`, into the slot when
/// `inward`; an event recorded after stream copies. The slot buffer is idle: its previous
/// slice's copies and collective have completed.
fn copy(
    st: &Stream,
    buf: Option<&HostBuffer>,
    pieces: &[Piece],
    user: &Side,
    inward: bool,
    ev: &Event,
) -> Result<bool> {
    let Some(buf) = buf else {
        return Ok(false);
    };
    match user {
        Side::Absent => Ok(false),
        Side::Host(addr) => {
            for p in pieces {
                let u = (*addr + p.user as u64) as *mut u8;
                // SAFETY: the slot is `buf.len()` >= p.slot + p.len bytes (slot_bytes), idle
                // (no stream or transport operation uses it now), and the caller's buffer is
                // valid for the call's length (DevCall::classify's contract); the two are
                // distinct allocations.
                unsafe {
                    let s = buf.as_ptr().add(p.slot);
                    if inward {
                        std::ptr::copy_nonoverlapping(u, s, p.len);
                    } else {
                        std::ptr::copy_nonoverlapping(s, u, p.len);
                    }
                }
            }
            Ok(false)
        }
        Side::Stream(span) => {
            if pieces.is_empty() {
                return Ok(false);
            }
            for p in pieces {
                let u = span.slice(p.user..p.user + p.len)?;
                let s = buf.slice(p.slot..p.slot + p.len)?;
                if inward {
                    st.copy(&s, &u)?;
                } else {
                    st.copy(&u, &s)?;
                }
            }
            st.record(ev)?;
            Ok(true)
        }
    }
}

/// The host call of slice `s` on the slot's buffers.
fn slot_call(
    call: &DevCall,
    nranks: usize,
    slot: &Slot,
    s: &Slice,
    input: &Side,
    output: &Side,
) -> Call {
    let (ins, outs) = slices::blocks(call.kind, nranks);
    let region = |buf: Option<&HostBuffer>, side: &Side, blocks: usize| -> Region {
        match (buf, side) {
            (Some(b), Side::Host(_) | Side::Stream(_)) if blocks > 0 => {
                // SAFETY: the slot buffer outlives the collective: `run` keeps the slots until
                // every collective of the call has ended, and leaks them if one failed.
                unsafe { Region::from_raw(b.as_ptr(), blocks * s.count * call.dtype.size()) }
            }
            _ => Region::empty(),
        }
    };
    Call {
        kind: call.kind,
        send: region(slot.input.as_ref(), input, ins),
        recv: region(slot.output.as_ref(), output, outs),
        count: s.count,
        dtype: call.dtype,
        op: call.op,
        root: call.root,
        algo: call.algo,
    }
}

//! A communicator's staging memory: page-locked host slots, and the two copy streams that the
//! communicator's blocking, non-blocking and grouped device calls share (a stream-ordered call
//! copies on the caller's stream only).
//!
//! `SLOTS` full-size slots are allocated once and kept (`fill`): at the communicator's first
//! device use where its calls are staged, at its first stream-ordered call where they go direct
//! (with `FABRICOLL_DEVICE_DIRECT=streams`, then with `FLAGS` flag slots, a flag without
//! memory, for its stream-ordered direct calls; docs/device-calls.md says why then). A
//! call in flight holds at least one slot for its whole life (its own slot, `take`), so that
//! any number of outstanding calls (a group's sends and receives) all progress; it borrows
//! free slots for more slices in flight while nobody waits for one. A non-blocking, grouped or
//! blocking call that finds no free slot that fits allocates one, in the caller's thread, of
//! the size its slices need (`Slot::new`, then `add`); a stream-ordered call never allocates:
//! it takes one or two slots when it is submitted, or waits there for one to be freed.
//!
//! No call starves another: the calls progress in call order, so a slot that a waiting call
//! needs must never be held by a later call, which cannot end before it. Hence a call takes a
//! free slot only where no stream-ordered call waits for one (else it allocates, or,
//! stream-ordered, waits too), and no call borrows one while any waits (`inflight`). A waiting
//! call only waits for earlier calls to end.
//!
//! Nothing is freed before the communicator is destroyed: allocating or freeing
//! page-locked memory waits for the whole device on the CUDA driver, so doing either while a
//! caller's stream waits for a stream-ordered call's flag would wait for that stream, which
//! waits for the call (docs/device.md). A slot that a failed call may still have in use is
//! leaked (`leak`), never freed.
use crate::device::{Device, Event, Flag, HostBuffer, Stream};
use crate::error::{Error, Result};

/// Full-size slots allocated at the first device use: one copying in, one in its collective,
/// one copying out, and one more so that a slow stage does not stall the other two.
pub(super) const SLOTS: usize = 4;

/// Flag slots (a flag and its events, no memory to stage in) made at the first stream-ordered
/// call of a communicator whose calls go direct: each stream-ordered direct call in flight
/// holds one, for its stream to wait on; one more waits at its submission for one to be freed.
pub(super) const FLAGS: usize = 16;

/// Bytes of a slice per block, at most (a slot holds one slice of each block of a side).
pub(super) const SLICE_BYTES: usize = 1 << 20;

/// Bytes of each side (input, output) of a full-size slot. A slice's blocks share it, so on a
/// side of more than 4 blocks a slice has less than `SLICE_BYTES` per block.
pub(super) const SLOT_BYTES: usize = 4 * SLICE_BYTES;

/// The most slots a communicator holds: past it, a call that finds none free fails (naming
/// the limit) rather than pin more memory.
pub(super) const MAX_SLOTS: usize = 256;

/// One slot: page-locked input and output (None: not needed by the call it was made for),
/// the events recorded after copying in and out, and the flag that releases a stream-ordered
/// call's copies out of it.
pub(super) struct Slot {
    pub input: Option<HostBuffer>,
    pub output: Option<HostBuffer>,
    pub copied_in: Event,
    pub copied_out: Event,
    /// A stream-ordered call's copy out of this slot waits for this word to reach the number
    /// of its use of the slot (`uses`, counted when the call is submitted); the worker writes
    /// the number when the slice's collective has finished. One stream-ordered call holds the
    /// slot at a time and uses it slice after slice, so the numbers are written in order.
    pub flag: Flag,
    /// The number of the slot's last use by a stream-ordered call.
    pub uses: u32,
}

impl Slot {
    /// A slot of `need` (input, output) bytes.
    pub fn new(dev: &Device, need: (usize, usize)) -> Result<Slot> {
        let buf = |n: usize| (n > 0).then(|| dev.alloc_host(n)).transpose();
        Ok(Slot {
            input: buf(need.0)?,
            output: buf(need.1)?,
            copied_in: dev.create_event()?,
            copied_out: dev.create_event()?,
            flag: dev.create_flag("fabricoll staging slot released")?,
            uses: 0,
        })
    }

    fn fits(&self, need: (usize, usize)) -> bool {
        let (i, o) = self.caps();
        i >= need.0 && o >= need.1
    }

    /// Bytes of its input and output.
    fn caps(&self) -> (usize, usize) {
        let cap = |b: &Option<HostBuffer>| b.as_ref().map_or(0, |b| b.len());
        (cap(&self.input), cap(&self.output))
    }

    fn bytes(&self) -> usize {
        let (i, o) = self.caps();
        i + o
    }
}

/// The slots and the copy streams.
pub(super) struct Pool {
    dev: Device,
    pub inbound: Stream,
    pub outbound: Stream,
    /// None: leaked after a failed call.
    slots: Vec<Option<Slot>>,
    busy: Vec<bool>,
    logged: bool,
    /// Whether the `SLOTS` full-size slots were made (`fill`).
    full: bool,
    /// Whether the `FLAGS` flag slots were made (`fill`).
    flags: bool,
}

/// What `Pool::fill` makes: the full-size slots (for staged calls) and the flag slots (for
/// stream-ordered direct calls).
pub(super) struct Fill {
    pub full: Vec<Slot>,
    pub flags: Vec<Slot>,
}

impl Fill {
    /// The slots lacking where a pool holds neither kind yet, made now (page-locked memory:
    /// outside the communicator's locks, before any stream of the device waits for it):
    /// `full`, `flags`: whether each kind is wanted.
    pub fn make(dev: &Device, full: bool, flags: bool) -> Result<Fill> {
        let n = |want: bool, k: usize| if want { k } else { 0 };
        Ok(Fill {
            full: (0..n(full, SLOTS))
                .map(|_| Slot::new(dev, (SLOT_BYTES, SLOT_BYTES)))
                .collect::<Result<_>>()?,
            flags: (0..n(flags, FLAGS))
                .map(|_| Slot::new(dev, (0, 0)))
                .collect::<Result<_>>()?,
        })
    }
}

impl Pool {
    /// The copy streams, made now, and no slot yet (`fill`). Must not run while a stream of
    /// the device may wait for a flag that the caller's side writes (the module's doc).
    pub fn new(dev: &Device) -> Result<Pool> {
        Ok(Pool {
            dev: dev.clone(),
            inbound: dev.create_stream()?,
            outbound: dev.create_stream()?,
            busy: Vec::new(),
            slots: Vec::new(),
            logged: false,
            full: false,
            flags: false,
        })
    }

    /// Which kinds of slots `fill` still lacks of those wanted: (full-size, flags).
    pub fn lacks(&self, full: bool, flags: bool) -> (bool, bool) {
        (full && !self.full, flags && !self.flags)
    }

    /// Adds the slots of `f` (free) where this pool lacks their kind; what it did not take
    /// comes back, for the caller to free once it has let go of the communicator's locks.
    pub fn fill(&mut self, f: Fill) -> Fill {
        let mut back = Fill {
            full: Vec::new(),
            flags: Vec::new(),
        };
        for (have, slots, back) in [
            (&mut self.full, f.full, &mut back.full),
            (&mut self.flags, f.flags, &mut back.flags),
        ] {
            if *have || slots.is_empty() {
                back.extend(slots);
                continue;
            }
            *have = true;
            for s in slots {
                self.slots.push(Some(s));
                self.busy.push(false);
            }
        }
        back
    }

    pub fn device(&self) -> &Device {
        &self.dev
    }

    pub fn slot(&self, i: usize) -> &Slot {
        self.slots[i].as_ref().expect("a slot in use is not leaked")
    }

    pub fn slot_mut(&mut self, i: usize) -> &mut Slot {
        self.slots[i].as_mut().expect("a slot in use is not leaked")
    }

    /// A free slot of at least `need` bytes, now busy: the smallest (a stream-ordered direct
    /// call, which needs only a flag, takes a flag slot where one is free).
    pub fn take(&mut self, need: (usize, usize)) -> Option<usize> {
        let i = (0..self.slots.len())
            .filter(|&i| !self.busy[i])
            .filter_map(|i| Some((i, self.slots[i].as_ref().filter(|s| s.fits(need))?)))
            .min_by_key(|(_, s)| s.bytes())
            .map(|(i, _)| i)?;
        self.busy[i] = true;
        Some(i)
    }

    /// Whether any slot (busy or not) could hold `need`: else a call that allocates none
    /// would wait for ever.
    pub fn could_fit(&self, need: (usize, usize)) -> bool {
        self.slots.iter().flatten().any(|s| s.fits(need))
    }

    pub fn give(&mut self, i: usize) {
        self.busy[i] = false;
    }

    /// Gives up slot `i`: a failed call's transport or copies may still write it.
    pub fn leak(&mut self, i: usize) {
        if let Some(s) = self.slots[i].take() {
            std::mem::forget(s.input);
            std::mem::forget(s.output);
            // a stream may still wait on it (released past every use first, `inflight`)
            std::mem::forget(s.flag);
        }
        self.busy[i] = true;
    }

    /// Adds `slot` (made by `Slot::new` outside the communicator's locks), busy; its index.
    /// Refused (at `MAX_SLOTS`), the slot comes back with the error, for the caller to free
    /// once it has let go of the communicator's locks (freeing waits for the device).
    pub fn add(&mut self, slot: Slot) -> std::result::Result<usize, Box<(Error, Slot)>> {
        if self.slots.iter().flatten().count() >= MAX_SLOTS {
            let e = Error::InvalidUsage(format!(
                "{MAX_SLOTS} staging slots of page-locked memory are in use by this \
                 communicator's device calls, the most it holds: wait for some calls before \
                 starting more"
            ));
            return Err(Box::new((e, slot)));
        }
        let i = match self.slots.iter().position(|s| s.is_none()) {
            Some(i) => {
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.busy.push(false);
                self.slots.len() - 1
            }
        };
        self.busy[i] = true;
        if self.slots.len() > SLOTS {
            log::debug!(
                "device staging: slot {i} added ({} slots), since every slot was held by a \
                 call in flight",
                self.slots.len()
            );
        }
        Ok(i)
    }

    /// Logs once per communicator how device buffers are staged.
    pub fn log_choice(&mut self, reduces: bool) {
        if std::mem::replace(&mut self.logged, true) {
            return;
        }
        log::info!(
            "device buffers: staged through page-locked host slots ({SLOTS} slices of up to \
             {SLICE_BYTES} bytes per block in flight), where a call does not go direct{}",
            if reduces {
                "; reductions on the host, on the staged slices (a device kernel would need each \
                 received contribution copied back to the device first)"
            } else {
                ""
            }
        );
    }
}

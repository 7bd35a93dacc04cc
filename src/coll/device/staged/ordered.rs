//! The schedule of a stream-ordered call on its caller's stream, and its slices' progress.
//!
//! A stream-ordered call (`enqueue`) needs no stream but the caller's: at submission, its whole
//! copy schedule goes on the caller's stream, slice by slice: the copy in (device to host, into
//! one of the call's one or two slots, alternating), an event the worker polls (the slice is
//! staged), a wait for its slot's flag to reach the number of this use of the slot (the worker
//! has finished the slice's collective), and the copy out. So no operation of the call sits on another
//! stream, behind the caller's flag wait on a shared hardware queue (docs/device-calls.md,
//! "Hardware queues"). With two slots, the copies of one slice overlap the next one's
//! collective. `step` then only starts each staged slice's collective and reports it done; the
//! releases are `inflight`'s.
use super::{copy_on, host_copy, slot_call, Pipeline, Pool, Side, Stage, State};
use crate::coll::Comm;
use crate::device::{Event, Stream};
use crate::error::{Error, Result};

/// A stream-ordered call's schedule on the caller's stream, enqueued at submission.
pub(super) struct OnStream {
    /// Its slots: slice i is staged in `slots[i % slots.len()]`.
    pub(super) slots: Vec<usize>,
    /// Per slice, recorded after its copy in: the slice is staged (the first: the stream has
    /// reached the call, so its inputs are written).
    pub(super) staged: Vec<Event>,
    /// Recorded after the last copy out: the stream has passed the call, its slots are idle.
    passed: Event,
    pub(super) passed_seen: bool,
    /// Per slice, the number of its use of its slot: its copy out waits for the slot's flag
    /// to reach it.
    marks: Vec<u32>,
    /// How many slices, from the first, have been released (their slots' flags written).
    released: usize,
}

impl Pipeline {
    /// Enqueues the call's whole copy schedule on the caller's stream `user` (the module doc):
    /// slice i staged in `slots[i % slots.len()]` (one or two slots, busy in the pool, the
    /// call's until it ends), `staged[i]` recorded after its copy in, a wait for that slot's
    /// flag to reach the next number of its uses before its copy out, and `passed` recorded at
    /// the end. The slots are the call's even where this fails part way: the stream may use
    /// them.
    pub fn enqueue(
        &mut self,
        pool: &mut Pool,
        user: &Stream,
        slots: Vec<usize>,
        staged: Vec<Event>,
        passed: Event,
    ) -> Result<()> {
        let (n, k) = (self.list.len(), slots.len());
        if k == 0 || staged.len() != n {
            return Err(Error::Internal(format!(
                "a stream-ordered call of {n} slices given {k} slots and {} events",
                staged.len()
            )));
        }
        let marks = (0..n)
            .map(|i| {
                let s = pool.slot_mut(slots[i % k]);
                s.uses = s.uses.wrapping_add(1);
                s.uses
            })
            .collect();
        let pool: &Pool = pool;
        log::debug!(
            "stream-ordered {:?} of {n} slice(s): slots {slots:?}, flag marks {marks:?}",
            self.call.kind
        );
        self.own = Some(slots[0]);
        let os = self.on_stream.insert(OnStream {
            slots,
            staged,
            passed,
            passed_seen: false,
            marks,
            released: 0,
        });
        if [&self.input, &self.output]
            .iter()
            .any(|s| matches!(s, Side::Host(_)))
        {
            return Err(Error::Internal(
                "pageable host memory in a stream-ordered call".into(),
            ));
        }
        let slot = |i: usize| pool.slot(os.slots[i % k]);
        let stage_in = |j: usize| -> Result<()> {
            let buf = slot(j).input.as_ref();
            copy_on(user, buf, &self.list[j].input, self.input.on_stream(), true)?;
            user.record(&os.staged[j])
        };
        // One slice staged ahead per extra slot: slice i + k - 1 goes in once the stream has
        // passed the wait of slice i - 1, the last to use its slot.
        for j in 0..(k - 1).min(n) {
            stage_in(j)?;
        }
        for i in 0..n {
            if i + k - 1 < n {
                stage_in(i + k - 1)?;
            }
            user.wait_flag(&slot(i).flag, os.marks[i])?;
            let buf = slot(i).output.as_ref();
            copy_on(
                user,
                buf,
                &self.list[i].output,
                self.output.on_stream(),
                false,
            )?;
        }
        user.record(&os.passed)
    }

    /// A stream-ordered call: releases the copies out of the slices whose collectives have
    /// finished, in order (`all`: every slice, whether finished or not: the call failed, and its
    /// stream must go on). Its slots must not be leaked yet.
    pub fn release(&mut self, pool: &Pool, all: bool) {
        let Some(os) = self.on_stream.as_mut() else {
            return;
        };
        let upto = if all { os.marks.len() } else { self.done };
        let k = os.slots.len();
        for i in os.released..upto {
            if let (Side::Pinned(addr), false) = (&self.output, all) {
                // The slice's collective has finished, and the stream waits for the flag below
                // before anything later on it may read the output.
                let slot = pool.slot(os.slots[i % k]);
                host_copy(slot.output.as_ref(), &self.list[i].output, *addr, false);
            }
            log::debug!(
                "stream-ordered slice {i}: slot {} flag set to {}{}",
                os.slots[i % k],
                os.marks[i],
                if all { " (the call ended)" } else { "" }
            );
            pool.slot(os.slots[i % k]).flag.set(os.marks[i]);
        }
        os.released = os.released.max(upto);
    }

    /// A stream-ordered call whose slices are all done: whether the stream has passed it
    /// now (noted once).
    pub(super) fn passed(&mut self, comm: &Comm) -> Result<bool> {
        let Some(os) = self.on_stream.as_mut() else {
            return Ok(false);
        };
        if self.done < self.list.len() || os.passed_seen || !os.passed.query()? {
            return Ok(false);
        }
        os.passed_seen = true;
        log::debug!(
            "rank {}: the stream passed the stream-ordered call",
            comm.rank
        );
        Ok(true)
    }

    /// `step` of a stream-ordered call: starts the collective of each slice the stream has
    /// staged, in order, where `may_start` and its slot is not in use by an earlier slice;
    /// counts the slices whose collectives finished, from the first; notes when the stream
    /// has passed the call.
    pub(super) fn step_stream(
        &mut self,
        comm: &Comm,
        pool: &mut Pool,
        may_start: bool,
    ) -> Result<bool> {
        let Some(os) = self.on_stream.as_mut() else {
            return Ok(false);
        };
        let k = os.slots.len();
        let mut moved = false;
        while may_start
            && self.next_start < self.list.len()
            && self.next_start - self.done < k
            && os.staged[self.next_start].query()?
        {
            let i = self.next_start;
            let slot = os.slots[i % k];
            if let Side::Pinned(addr) = &self.input {
                // The stream has reached the slice (its event above): the input is written,
                // and the slot's previous slice is done with it.
                host_copy(
                    pool.slot(slot).input.as_ref(),
                    &self.list[i].input,
                    *addr,
                    true,
                );
            }
            log::debug!(
                "rank {}: stream-ordered slice {i} staged in slot {slot}: its collective starts",
                comm.rank
            );
            let c = slot_call(
                &self.call,
                pool.slot(slot),
                &self.list[i],
                &self.input,
                &self.output,
            );
            self.stages.push_back(Stage {
                slice: i,
                slot,
                state: State::Running {
                    req: comm.start_with(&c, Some(self.compress))?,
                },
            });
            self.next_start += 1;
            moved = true;
        }
        for st in self.stages.iter_mut() {
            if let State::Running { req } = st.state {
                if comm.test(req)? {
                    log::debug!(
                        "rank {}: stream-ordered slice {}: collective done",
                        comm.rank,
                        st.slice
                    );
                    st.state = State::Collected;
                    moved = true;
                }
            }
        }
        while self
            .stages
            .front()
            .is_some_and(|st| matches!(st.state, State::Collected))
        {
            self.stages.pop_front();
            self.done += 1;
        }
        Ok(self.passed(comm)? || moved)
    }
}

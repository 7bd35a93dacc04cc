//! The pipeline of a compressed call's chunks (`flat`): one exchange runs at a time, in the
//! order `Flat::order` gives (AllReduce: ToOwners of chunk k, then Gather of chunk k - 1), and
//! the codec's work is done in pieces of whole blocks, between polls of the transport while
//! an exchange runs (`Flat::work`, called by the engine's progress) and, where the next
//! exchange still waits for some, when one finishes (`Comm::step_flat`). So quantizing chunk
//! k + 1 and decoding chunk k - 1 overlap chunk k's exchanges; only the first chunk's
//! quantizing and the last chunk's decoding stand alone. Blocks are coded independently and
//! every chunk is cut at block boundaries of every segment, so the codes, sums and results
//! are the bits of one chunk.
use super::convert::{decode_into, with_f32};
use super::flat::Flat;
use super::{Stage, What};
use crate::coll::Comm;
use crate::compress::owner;
use crate::error::{Error, Result};
use crate::exec::{BufPool, Exec};
use crate::transport::Scratch;
use std::ops::Range;

/// Elements of one piece of the codec's work (rounded down to whole blocks, at least one):
/// the transport is polled between pieces.
const PIECE: usize = 64 << 10;

/// A chunk's codec work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Task {
    /// This rank's codes of the chunk's segments (AllGather: its own).
    Quantize = 0,
    /// The owner's sum of its segment (AllReduce: quantized for Gather; ReduceScatter:
    /// decoded into the output).
    Reduce = 1,
    /// Every segment's codes into the output (AllReduce, AllGather).
    Decode = 2,
}

/// How far a task has come: the segment and element (from the chunk's part of it) it is at.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Cursor {
    seg: usize,
    at: usize,
    done: bool,
}

/// The order a pipelined call's exchanges run in, one at a time, for `m` chunks of `s`
/// exchanges each: (chunk, exchange) by diagonals, chunk k's exchange j in diagonal k + j, each
/// diagonal from its newest chunk (AllReduce: ToOwners of chunk k, then Gather of chunk
/// k - 1). So between a chunk's two exchanges run others', while its codec work between them
/// can be done.
pub(super) fn wavefront(m: usize, s: usize) -> Vec<(usize, usize)> {
    (0..(m + s).saturating_sub(1))
        .flat_map(|d| {
            (0..s)
                .filter(move |&j| j <= d && d - j < m)
                .map(move |j| (d - j, j))
        })
        .collect()
}

impl Flat {
    /// The segments task `t` works on.
    fn task_segs(&self, t: Task) -> Range<usize> {
        let (n, r) = (self.nranks, self.rank);
        match (t, self.what) {
            (Task::Quantize, What::AllGather) => r..r + 1,
            (Task::Quantize, _) => 0..n,
            (Task::Reduce, What::AllGather) | (Task::Decode, What::ReduceScatter) => 0..0,
            (Task::Reduce, _) => r..r + 1,
            (Task::Decode, _) => 0..n,
        }
    }

    /// Mark the tasks this call does not do as done.
    pub(super) fn init_work(&mut self) {
        for t in [Task::Quantize, Task::Reduce, Task::Decode] {
            if self.task_segs(t).is_empty() {
                for c in &mut self.chunks {
                    c.work[t as usize].done = true;
                }
            }
        }
    }

    fn done(&self, k: usize, t: Task) -> bool {
        self.chunks[k].work[t as usize].done
    }

    /// Whether chunk `k`'s exchange `stage` has finished.
    fn exchanged(&self, k: usize, stage: Stage) -> bool {
        self.order[..self.finished].contains(&(k, stage))
    }

    /// Whether chunk `k`'s task `t` may run: quantizing at once, reducing once the chunk's
    /// ToOwners exchange finished, decoding once its last exchange did.
    fn ready(&self, k: usize, t: Task) -> bool {
        match t {
            Task::Quantize => true,
            Task::Reduce => self.exchanged(k, Stage::ToOwners),
            Task::Decode => self.exchanged(k, Stage::Gather),
        }
    }

    /// The task exchange `i` of `order` needs done before it starts.
    fn needs(&self, i: usize) -> (usize, Task) {
        match self.order[i] {
            (k, Stage::Gather) if self.what == What::AllReduce => (k, Task::Reduce),
            (k, _) => (k, Task::Quantize),
        }
    }

    /// The next piece of work: what the next exchange needs, else the oldest chunk's
    /// reducing or decoding that may run (never quantizing further ahead, which bounds the
    /// chunks whose buffers are taken). None: nothing until an exchange finishes.
    fn next_task(&self) -> Option<(usize, Task)> {
        if self.started < self.order.len() {
            let (k, t) = self.needs(self.started);
            if !self.done(k, t) && self.ready(k, t) {
                return Some((k, t));
            }
        }
        (0..self.chunks.len())
            .flat_map(|k| [(k, Task::Reduce), (k, Task::Decode)])
            .find(|&(k, t)| !self.done(k, t) && self.ready(k, t))
    }

    /// One piece of the codec's work while an exchange runs; whether there was one.
    pub(in crate::coll) fn work(&mut self, pool: &mut BufPool) -> Result<bool> {
        match self.next_task() {
            Some((k, t)) => self.piece(k, t, pool).map(|()| true),
            None => Ok(false),
        }
    }

    /// Chunk `k`'s task `t` to its end.
    pub(super) fn finish(&mut self, k: usize, t: Task, pool: &mut BufPool) -> Result<()> {
        while !self.done(k, t) {
            self.piece(k, t, pool)?;
        }
        Ok(())
    }

    /// One piece of chunk `k`'s task `t`: up to `PIECE` elements of one segment, or, past its
    /// last segment, the task's end (the chunk's buffers go back to `pool` after its last
    /// task). The chunk's buffers are taken at its first piece.
    fn piece(&mut self, k: usize, t: Task, pool: &mut BufPool) -> Result<()> {
        if !self.chunks[k].live {
            self.take_buffers(k, pool);
        }
        let segs = self.task_segs(t);
        let step = (PIECE / self.codec.block).max(1) * self.codec.block;
        let mut cur = self.chunks[k].work[t as usize];
        cur.seg = cur.seg.max(segs.start);
        while cur.seg < segs.end && cur.at >= self.chunks[k].part[cur.seg].len() {
            cur.seg += 1;
            cur.at = 0;
        }
        if cur.seg >= segs.end {
            cur.done = true;
            self.chunks[k].work[t as usize] = cur;
            self.end_task(k, t, pool);
            return Ok(());
        }
        let (r, x) = (cur.seg, cur.at);
        let y = (x + step).min(self.chunks[k].part[r].len());
        match t {
            Task::Quantize => self.quantize(k, r, x..y)?,
            Task::Reduce => self.reduce(k, x..y)?,
            Task::Decode => self.decode(k, r, x..y)?,
        }
        cur.at = y;
        self.chunks[k].work[t as usize] = cur;
        Ok(())
    }

    /// After chunk `k`'s task `t`: the owner's codes padded for Gather; the buffers back to
    /// `pool` once every task of the chunk is done (its exchanges have all finished then).
    fn end_task(&mut self, k: usize, t: Task, pool: &mut BufPool) {
        let rank = self.rank;
        let c = &mut self.chunks[k];
        if t == Task::Reduce && self.what == What::AllReduce {
            let (own, slot) = (c.own_wire(rank), c.slot(rank));
            c.mine.bytes_mut()[own..slot].fill(0);
        }
        if c.work.iter().all(|w| w.done) && c.live {
            pool.put(std::mem::replace(&mut c.all, Scratch::new(0)));
            pool.put(std::mem::replace(&mut c.mine, Scratch::new(0)));
            c.live = false;
        }
    }

    /// Quantize elements `x` (from chunk `k`'s part of segment `r`) of the input.
    fn quantize(&mut self, k: usize, r: usize, x: Range<usize>) -> Result<()> {
        let (codec, dtype, el) = (self.codec, self.dtype, self.dtype.size());
        let c = &mut self.chunks[k];
        let first = self.in_at[r] + c.part[r].start + x.start;
        let bytes = first * el..(first + x.len()) * el;
        let (lo, hi) = (codec.wire_len(x.start), codec.wire_len(x.end));
        let dst = if self.what == What::AllGather {
            &mut c.mine.bytes_mut()[lo..hi]
        } else {
            let w = c.wire[r].start;
            &mut c.all.bytes_mut()[w + lo..w + hi]
        };
        let mut run = move |b: &[u8]| with_f32(dtype, b, |v| codec.quantize(v, dst));
        match &self.held {
            Some(h) => run(&h[bytes]),
            None => self
                .inp
                .sub(bytes.start, bytes.len())
                .ok_or_else(|| Error::Internal("compressed input past its buffer".into()))?
                .with(run),
        }
    }

    /// The owner's sum of elements `x` of its segment in chunk `k`: AllReduce's quantized
    /// where Gather sends them, ReduceScatter's decoded into the output.
    fn reduce(&mut self, k: usize, x: Range<usize>) -> Result<()> {
        let (n, rank, codec) = (self.nranks, self.rank, self.codec);
        let c = &mut self.chunks[k];
        let slot = c.slot(rank);
        let (lo, hi) = (codec.wire_len(x.start), codec.wire_len(x.end));
        let got = c.mine.bytes();
        let parts: Vec<&[u8]> = (0..n).map(|r| &got[r * slot + lo..r * slot + hi]).collect();
        let codes = owner::reduce_segment(&codec, &parts, x.len(), self.avg.then_some(n))?;
        if self.what == What::AllReduce {
            // This rank's own piece of what it received is read already up to `hi`.
            c.mine.bytes_mut()[lo..hi].copy_from_slice(&codes);
            return Ok(());
        }
        let at = self.out_at[rank] + c.part[rank].start + x.start;
        decode_into(&codec, self.dtype, self.out, at..at + x.len(), &codes)
    }

    /// Decode elements `x` of segment `r` in chunk `k` into the output.
    fn decode(&self, k: usize, r: usize, x: Range<usize>) -> Result<()> {
        let c = &self.chunks[k];
        let (lo, hi) = (self.codec.wire_len(x.start), self.codec.wire_len(x.end));
        let w = c.wire[r].start;
        let at = self.out_at[r] + c.part[r].start + x.start;
        decode_into(
            &self.codec,
            self.dtype,
            self.out,
            at..at + x.len(),
            &c.all.bytes()[w + lo..w + hi],
        )
    }
}

impl Comm {
    /// The executor of `p`'s next exchange (`Flat::order`), as request `id`, with its
    /// sequence number.
    pub(super) fn exchange(&self, p: &mut Flat, id: u32, pool: &mut BufPool) -> Result<Box<Exec>> {
        let n = self.nranks;
        let i = p.started;
        let (k, stage) = p.order[i];
        let at = p.stages().iter().position(|s| *s == stage).unwrap_or(0);
        let c = &p.chunks[k];
        let planned = c.plans.get(at).cloned().ok_or_else(|| {
            Error::Internal(format!(
                "compressed call: no plan for {stage:?} of chunk {k}"
            ))
        })?;
        let (slot, total) = (c.slot(p.rank), c.total());
        // SAFETY: `p` owns both buffers until the chunk's last task, which runs after its
        // exchanges finished, and a failed call's buffers go to the communicator's graveyard
        // with its executor's, so neither region outlives them.
        let (all, mine) = unsafe { (c.all.region(), c.mine.region()) };
        let sub = |r: crate::transport::Region, len: usize| {
            r.sub(0, len).expect("buffers fit their layout")
        };
        let io = match stage {
            Stage::ToOwners => (sub(all, total), sub(mine, n * slot)),
            Stage::Gather => (sub(mine, slot), sub(all, total)),
        };
        p.started += 1;
        let seq = p.seq.wrapping_add(i as u32);
        self.byte_exchange(planned, io, seq, p.sig, id, pool)
    }

    /// After `p`'s exchange finished: what the next exchange needs (the part of it not done
    /// while the exchange ran), then its executor; or, after the last one, the rest of the
    /// codec's work and None (the call is done, its output written).
    pub(super) fn step_flat(
        &self,
        p: &mut Flat,
        id: u32,
        pool: &mut BufPool,
    ) -> Result<Option<Box<Exec>>> {
        p.finished = p.started;
        if p.started == p.order.len() {
            while let Some((k, t)) = p.next_task() {
                p.piece(k, t, pool)?;
            }
            return Ok(None);
        }
        let (k, t) = p.needs(p.started);
        p.finish(k, t, pool)?;
        self.exchange(p, id, pool).map(Some)
    }
}

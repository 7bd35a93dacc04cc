//! The codec's work of a tiered call's chunks, pipelined as `pipe` pipelines `flat`'s: one
//! exchange runs at a time, in `pipe::wavefront`'s order (chunk k's exchange j after chunk
//! k + 1's exchange j - 1), and each chunk's codec tasks (task 0 before its first exchange,
//! task i after its exchange i - 1: the host's sum quantized, the owner's sum, the decoding)
//! run between polls of the transport while another chunk's exchange runs (`Tiered::work`),
//! what the next exchange needs first, then the oldest chunk's; when an exchange finishes,
//! only what the next one still needs is done before it starts (`Tiered::prepare`). So the
//! host's sum and quantizing of chunk k + 1 and the decoding of chunk k - 1 overlap chunk k's
//! exchanges among the lane, and chunk k's hand-on inside the host overlaps the codec's work
//! of later chunks. A task is one chunk's whole (the chunks are about
//! `FABRICOLL_COMPRESS_CHUNK` bytes). Blocks are coded independently and every chunk holds
//! whole blocks of every segment, so every code, sum and result is the bits of one chunk.
use super::{Stage, Tiered, What};
use crate::coll::compressed::convert::{decode_into, with_f32};
use crate::compress::owner;
use crate::error::{Error, Result};
use crate::exec::BufPool;
use crate::transport::Scratch;

impl Tiered {
    /// Note that the exchange started last has finished.
    pub(super) fn exchange_done(&mut self) {
        if let Some(&(k, _)) = self.started.checked_sub(1).and_then(|i| self.order.get(i)) {
            self.chunks[k].exchanged += 1;
        }
    }

    /// Whether chunk `k`'s task `i` may run: its exchanges before it have finished.
    fn ready(&self, k: usize, i: usize) -> bool {
        i <= self.chunks[k].exchanged
    }

    /// The next task: what the next exchange needs, else the oldest chunk's task that may
    /// run past its first exchange (never a chunk's task 0 ahead of need, which bounds the
    /// chunks whose buffers are taken). None: nothing until an exchange finishes.
    fn next_task(&self) -> Option<(usize, usize)> {
        if let Some(&(k, i)) = self.order.get(self.started) {
            if !self.chunks[k].done[i] && self.ready(k, i) {
                return Some((k, i));
            }
        }
        let s = self.stages.len();
        (0..self.chunks.len())
            .filter(|&k| self.chunks[k].live)
            .flat_map(|k| (1..=s).map(move |i| (k, i)))
            .find(|&(k, i)| !self.chunks[k].done[i] && self.ready(k, i))
    }

    /// One task while an exchange runs; whether there was one.
    pub(in crate::coll) fn work(&mut self, pool: &mut BufPool) -> Result<bool> {
        match self.next_task() {
            Some((k, i)) => self.task(k, i, pool).map(|()| true),
            None => Ok(false),
        }
    }

    /// What the next exchange needs, done (every exchange before it has finished).
    pub(super) fn prepare(&mut self, pool: &mut BufPool) -> Result<()> {
        let (k, i) = self.order[self.started];
        if self.chunks[k].done[i] {
            return Ok(());
        }
        self.task(k, i, pool)
    }

    /// Chunk `k`'s task `i`; its buffers taken from `pool` at its first task, and given back
    /// after its last.
    fn task(&mut self, k: usize, i: usize, pool: &mut BufPool) -> Result<()> {
        if !self.chunks[k].live {
            let c = &mut self.chunks[k];
            let [pieces, codes, got, dec] = c.lay.buffers();
            (c.pieces, c.codes, c.got, c.dec) = (
                pool.take(pieces),
                pool.take(codes),
                pool.take(got),
                pool.take(dec),
            );
            c.live = true;
        }
        let extra = self.lay.l.extra();
        // An extra rank's codec work is its quantizing (AllGather): the lanes do the rest.
        match i.checked_sub(1).map(|j| self.stages[j]) {
            None if self.lay.what == What::AllGather => self.quantize_own(k)?,
            None => {}
            Some(_) if extra => {}
            Some(Stage::HostReduce) => self.quantize_host_sum(k)?,
            Some(Stage::HostCodes | Stage::HostGather) => {}
            Some(Stage::LaneToOwners) => self.reduce_own(k)?,
            Some(Stage::LaneGather) => self.decode_lane(k)?,
        }
        let c = &mut self.chunks[k];
        c.done[i] = true;
        if c.done.iter().all(|d| *d) {
            for b in [&mut c.pieces, &mut c.codes, &mut c.got, &mut c.dec] {
                pool.put(std::mem::replace(b, Scratch::new(0)));
            }
            c.live = false;
        }
        Ok(())
    }

    /// AllGather: this rank's codes of its chunk `k` input, where the lane's buffer holds
    /// them, or (extra) alone.
    fn quantize_own(&mut self, k: usize) -> Result<()> {
        let (codec, dtype, el) = (self.codec, self.dtype, self.dtype.size());
        let c = &mut self.chunks[k];
        let Some(s) = c.lay.mine() else {
            return Ok(());
        };
        let wire = match c.lay.l.extra() {
            false => s.wire.clone(),
            true => 0..s.wire.len(),
        };
        let inp = self
            .inp
            .sub(s.from * el, s.data.len() * el)
            .ok_or_else(|| Error::Internal("tiered input past its buffer".into()))?;
        let own = &mut c.codes.bytes_mut()[wire];
        inp.with(|b| with_f32(dtype, b, |v| codec.quantize(v, own)))
    }

    /// Chunk `k`'s host's partial sum of this rank's lane (the host's pieces in `pieces`,
    /// added in f32 in local rank order: the first piece, then each next), quantized segment
    /// by segment.
    fn quantize_host_sum(&mut self, k: usize) -> Result<()> {
        let (codec, dtype, el) = (self.codec, self.dtype, self.dtype.size());
        let c = &mut self.chunks[k];
        let lane = c.lay.lane();
        let len = c.lay.total(lane);
        let b = c.pieces.bytes();
        let mut acc = vec![0f32; len];
        for j in 0..c.lay.l.per_host() {
            with_f32(dtype, &b[j * len * el..(j + 1) * len * el], |x| {
                if j == 0 {
                    acc.copy_from_slice(x);
                } else {
                    acc.iter_mut().zip(x).for_each(|(a, v)| *a += *v);
                }
            });
        }
        let codes = c.codes.bytes_mut();
        for s in &c.lay.lanes[lane] {
            codec.quantize(&acc[s.pos.clone()], &mut codes[s.wire.clone()])?;
        }
        Ok(())
    }

    /// The owner's codes of each of its segments of chunk `k` from every host's codes of
    /// them (in `got`): AllReduce's where LaneGather sends them from, ReduceScatter's decoded
    /// into its output, or, an extra rank's, where HostGather hands them on.
    fn reduce_own(&mut self, k: usize) -> Result<()> {
        let (codec, dtype, avg, out) = (self.codec, self.dtype, self.avg, self.out);
        let c = &mut self.chunks[k];
        let lay = &c.lay;
        let (lane, g) = (lay.lane(), lay.l.at);
        let w = lay.own_wire();
        let base = lay.owned_wire(lane, g).start;
        let sums = {
            let got = c.got.bytes();
            lay.owned(lane, g)
                .map(|i| {
                    let s = &lay.lanes[lane][i];
                    let o = s.wire.start - base;
                    let parts: Vec<&[u8]> = (0..lay.l.hosts())
                        .map(|h| &got[h * w + o..h * w + o + s.wire.len()])
                        .collect();
                    owner::reduce_segment(&codec, &parts, s.data.len(), avg).map(|c| (i, c))
                })
                .collect::<Result<Vec<_>>>()?
        };
        if lay.what == What::AllReduce {
            let b = c.got.bytes_mut();
            let mut at = 0;
            for (_, x) in &sums {
                b[at..at + x.len()].copy_from_slice(x);
                at += x.len();
            }
            return Ok(());
        }
        // SAFETY: `c.dec` is owned by the call and no exchange runs on it now (its
        // HostGather starts after this task).
        let dec = unsafe { c.dec.region() };
        let handed: Vec<_> = lay.handed().collect();
        for (i, x) in &sums {
            let s = &lay.lanes[lane][*i];
            match handed.iter().find(|h| h.1 == *i) {
                Some((_, _, at)) => decode_into(&codec, dtype, dec, at.clone(), x)?,
                None => decode_into(&codec, dtype, out, s.from..s.from + s.data.len(), x)?,
            }
        }
        Ok(())
    }

    /// Every owner's codes of this rank's lane in chunk `k` decoded into the output.
    fn decode_lane(&mut self, k: usize) -> Result<()> {
        let c = &self.chunks[k];
        let codes = c.codes.bytes();
        for s in &c.lay.lanes[c.lay.lane()] {
            decode_into(
                &self.codec,
                self.dtype,
                self.out,
                s.data.clone(),
                &codes[s.wire.clone()],
            )?;
        }
        Ok(())
    }
}

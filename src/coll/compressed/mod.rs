//! Compressed collectives over the transport (docs/compression.md): AllReduce (sum, avg),
//! ReduceScatter(V) and AllGather(V) of f32, bf16 and f16 data that send block-scaled codes
//! (`compress`) instead of the data.
//!
//! A call is one or two byte exchanges, each run by an ordinary executor of an `algo::varied`
//! schedule, with the codec's work (`compress::owner`) between them:
//! - AllReduce: each rank quantizes its input once, segment by owner (whole blocks, as even as
//!   blocks allow); an AllToAllV hands each owner every rank's codes of its segment; the owner
//!   sums them all dequantized, its own included (never its own full-precision data), in rank
//!   order, in f32, divides for Avg and quantizes the sum once; an AllGatherV hands every rank
//!   the owners' codes, which every rank, the owner included, decodes.
//! - ReduceScatter(V): the same AllToAllV and owner's sum over the caller's per-rank counts;
//!   each owner decodes its own codes.
//! - AllGather(V): each rank quantizes its input; an AllGatherV of the codes; every rank,
//!   the owner included, decodes every block.
//!
//! So every rank ends with the same bits, and each element is quantized at most twice. bf16
//! and f16 data are converted to f32 exactly and the decoded result rounded back once.
//!
//! The call is one request of the engine's table: its running exchange is an executor there,
//! as any collective's, and `step` does the codec's work and starts the next exchange when one
//! finishes (`Engine::phased`). The exchanges' sequence numbers are taken when the call starts,
//! so that calls started after it number alike on every rank. Their messages carry the
//! caller's call's signature with the format and block size (`exec::Signature::compress`):
//! ranks whose calls or compression settings differ fail with an error naming the difference.
//!
//! Which algorithm runs an exchange: AllReduce, ReduceScatter and AllGather pad each rank's
//! piece of codes to the largest (AllReduce's segments differ by at most a block; the others'
//! are equal), so their exchanges are plain AllToAll and AllGather collectives of bytes, run by
//! the call's forced algorithm where it implements the exchange's collective, else as an
//! uncompressed AllToAll or AllGather of those bytes would be (the communicator's setting for
//! that collective, else the cost model's choice, `Comm::choose`). The V collectives keep the
//! varied exchanges (AllToAllV pairwise, AllGatherV direct): padding uneven counts to the
//! largest could multiply the bytes. The price (`tune::CompressedPrice`: the exchanges at the
//! codes' bytes plus the codec's work) is logged at info with the uncompressed call's.
//!
//! Which calls: the communicator's setting (`FABRICOLL_COMPRESS`, `fabricoll_config.compress`)
//! compresses the calls it applies to and leaves the others as they are; a per-call setting
//! (`Comm::run_with`, or this thread's `with_call_compression`) of a call it does not apply to
//! is an error naming `compress`.
//!
//! Levels: on several hosts, some holding two ranks or more (of equal or different sizes), a
//! call compresses the inter-host level only (`tiered`), the V collectives too: shared memory
//! carries the data in full precision, and only the exchanges among the ranks of a lane (one
//! per host) carry codes. Elsewhere (one host, one rank per host, an AllGatherV whose blocks
//! overlap) and with `FABRICOLL_COMPRESS_LEVELS=all` every level is compressed alike: the
//! exchanges carry codes whichever algorithm runs them, shared memory included.
use super::engine::{Engine, Planned};
use super::{Call, Comm, Kind};
use crate::algo::varied::{Spec, Varied};
use crate::algo::Collective;
use crate::compress::{owner, Codec};
use crate::config::Compression;
use crate::error::{Error, Result};
use crate::exec::{Args, BufPool, Exec, Job, Signature, Tags, COMPRESSED_ALGO};
use crate::reduce::{DataType, RedOp};
use crate::transport::{Region, Scratch};
use std::cell::Cell;
use std::ops::Range;

mod convert;
mod plan;
#[cfg(test)]
mod tests;
mod tiered;

use convert::{decode_into, with_f32};

thread_local! {
    /// The compression of the calls this thread starts inside `with_call_compression`.
    static CALL: Cell<Option<Compression>> = const { Cell::new(None) };
}

/// Run `f` with `c` as the per-call compression of every collective this thread starts in it
/// (the C API's per-call option, whose calls take the one path of every call).
pub fn with_call_compression<R>(c: Compression, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Compression>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CALL.with(|v| v.set(self.0));
        }
    }
    let _restore = Restore(CALL.with(|v| v.replace(Some(c))));
    f()
}

/// This thread's per-call compression (`with_call_compression`), None outside one.
pub(crate) fn call_compression() -> Option<Compression> {
    CALL.with(Cell::get)
}

/// What a compressed call does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum What {
    AllReduce,
    ReduceScatter,
    AllGather,
}

/// Which exchange runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// AllToAllV: every rank's codes of each segment to its owner.
    ToOwners,
    /// AllGatherV: every segment's codes to every rank.
    Gather,
}

/// A compressed call in progress, as the engine's table holds it: every level compressed
/// alike (`Flat`), or the inter-host level only (`tiered::Tiered`).
pub(super) enum Phased {
    Flat(Flat),
    Tiered(tiered::Tiered),
}

impl Phased {
    /// The buffers, for the pool (done) or the graveyard (failed).
    pub(super) fn into_buffers(self) -> Vec<Scratch> {
        match self {
            Phased::Flat(f) => f.into_buffers().into(),
            Phased::Tiered(t) => t.into_buffers(),
        }
    }
}

/// A compressed call in progress that compresses every level alike: its arithmetic's layout
/// and the buffers its exchanges run on, owned until the call ends (on failure they go to the
/// graveyard with the executor's).
pub(super) struct Flat {
    what: What,
    stage: Stage,
    codec: Codec,
    dtype: DataType,
    avg: bool,
    rank: usize,
    nranks: usize,
    /// Elements of each rank's segment: the owners' split (AllReduce), each rank's output
    /// (ReduceScatter) or input (AllGather), as ranges of a vector of all of them.
    segs: Vec<Range<usize>>,
    /// Where each segment's codes lie in the exchanges' buffers: back to back (V collectives),
    /// or at `r * stride` (`stride`).
    wire: Vec<Range<usize>>,
    /// The bytes of every rank's piece where the exchanges are uniform (each piece padded to
    /// the largest): then they are plain AllToAll and AllGather collectives of bytes.
    stride: Option<usize>,
    /// The exchanges' plans, in the order they run.
    plans: Vec<Planned>,
    /// Where each segment lands in the caller's output, in elements.
    out_at: Vec<usize>,
    out: Region,
    /// ToOwners' input (this rank's codes of every segment) and Gather's output (every
    /// segment's codes).
    all: Scratch,
    /// ToOwners' output (every rank's codes of this rank's segment) and Gather's input (this
    /// rank's segment's codes).
    mine: Scratch,
    /// The next exchange's sequence number.
    seq: u32,
    sig: Signature,
}

impl Flat {
    /// The buffers, for the pool (done) or the graveyard (failed).
    pub(super) fn into_buffers(self) -> [Scratch; 2] {
        [self.all, self.mine]
    }

    /// How many exchanges a call of `what` runs.
    fn exchanges(what: What) -> u32 {
        if what == What::AllReduce {
            2
        } else {
            1
        }
    }

    /// Bytes of this rank's segment's codes.
    fn own_wire(&self) -> usize {
        self.wire[self.rank].len()
    }

    /// Bytes of each rank's piece in the exchanges: the stride, else this rank's codes.
    fn slot(&self) -> usize {
        self.stride.unwrap_or_else(|| self.own_wire())
    }

    /// Bytes of the buffer that holds every segment's codes.
    fn total(&self) -> usize {
        match self.stride {
            Some(s) => s * self.nranks,
            None => self.wire.last().map_or(0, |w| w.end),
        }
    }

    /// Which exchanges run, in order.
    fn stages(&self) -> &'static [Stage] {
        match self.what {
            What::AllReduce => &[Stage::ToOwners, Stage::Gather],
            What::ReduceScatter => &[Stage::ToOwners],
            What::AllGather => &[Stage::Gather],
        }
    }

    /// The owner's codes of its segment from every rank's codes of it.
    fn reduce_own(&self) -> Result<Vec<u8>> {
        let (n, w, slot) = (self.nranks, self.own_wire(), self.slot());
        let got = &self.mine.bytes()[..n * slot];
        let parts: Vec<&[u8]> = (0..n).map(|r| &got[r * slot..r * slot + w]).collect();
        let len = self.segs[self.rank].len();
        owner::reduce_segment(&self.codec, &parts, len, self.avg.then_some(n))
    }

    /// Decode segment `r`'s codes into the caller's output.
    fn decode(&self, r: usize, codes: &[u8]) -> Result<()> {
        decode_into(
            &self.codec,
            self.dtype,
            self.out,
            self.out_at[r]..self.out_at[r] + self.segs[r].len(),
            codes,
        )
    }
}

/// Whether a call of `kind` with `op` on `dtype` data can be compressed; else why not.
fn applies(kind: Kind, dtype: DataType, op: RedOp) -> std::result::Result<(), String> {
    if !matches!(
        dtype,
        DataType::Float32 | DataType::Bfloat16 | DataType::Float16
    ) {
        return Err(format!("{dtype} data (only float, bfloat16 and half are)"));
    }
    let sum = matches!(op, RedOp::Sum | RedOp::Avg);
    match kind {
        Kind::Coll(Collective::AllGather) => Ok(()),
        Kind::Coll(Collective::AllReduce | Collective::ReduceScatter) if sum => Ok(()),
        Kind::Varied(l) if l.coll == Varied::AllGatherV => Ok(()),
        Kind::Varied(l) if l.coll == Varied::ReduceScatterV && sum => Ok(()),
        Kind::Coll(Collective::AllReduce | Collective::ReduceScatter) => {
            Err(format!("op {op} (only sum and avg are)"))
        }
        Kind::Varied(l) if l.coll == Varied::ReduceScatterV => {
            Err(format!("op {op} (only sum and avg are)"))
        }
        k => Err(format!(
            "{k:?} (only AllReduce, ReduceScatter(V) and AllGather(V) are)"
        )),
    }
}

impl Comm {
    /// The codec `call` runs with: the per-call setting where one is given (`per_call`, else
    /// this thread's `with_call_compression`), else the communicator's; None to send the data
    /// as it is. A per-call compression of a call it does not apply to is an error naming
    /// `compress`; the communicator's setting leaves such calls as they are.
    pub(super) fn compression_for(
        &self,
        call: &Call,
        per_call: Option<Compression>,
    ) -> Result<Option<Codec>> {
        let explicit = per_call.or_else(|| CALL.with(Cell::get));
        Ok(self
            .settled_compression(call.kind, call.dtype, call.op, explicit)?
            .codec())
    }

    /// The compression a call of `kind` on `dtype` with `op` runs with, settled when the call
    /// is made: `per_call` where given (an error naming `compress` where it does not apply),
    /// else the communicator's where it applies, else off. For calls whose collectives start
    /// later and maybe on another thread (the device calls' slices), which pass it as their
    /// per-call setting.
    pub(crate) fn settled_compression(
        &self,
        kind: Kind,
        dtype: DataType,
        op: RedOp,
        per_call: Option<Compression>,
    ) -> Result<Compression> {
        let c = per_call.unwrap_or(self.compress);
        let Some(codec) = c.codec() else {
            return Ok(Compression::OFF);
        };
        match applies(kind, dtype, op) {
            Ok(()) => Ok(c),
            Err(why) if per_call.is_some() => Err(Error::arg(
                "compress",
                format!("{} does not apply to {why}", codec.format),
            )),
            Err(_) => Ok(Compression::OFF),
        }
    }

    /// Start `call` compressed with `codec` as request `id`: the codec's first work and the
    /// first exchange's executor, which the caller puts in the table.
    pub(super) fn start_compressed(
        &self,
        e: &mut Engine,
        call: &Call,
        codec: Codec,
        id: u32,
    ) -> Result<(Box<Exec>, Box<Phased>)> {
        if let Some(lanes) = self.tiers(call) {
            let (x, t) = self.start_tiered(e, call, codec, lanes, id)?;
            return Ok((x, Box::new(Phased::Tiered(t))));
        }
        let mut p = self.begin(call, codec, &mut e.pool)?;
        let x = self.plan_exchanges(e, call, &mut p).and_then(|()| {
            p.seq = e.take_seqs(Flat::exchanges(p.what));
            log::debug!(
                "collective #{}: {:?} count {} compressed as {} in blocks of {}, exchanges by {}",
                p.seq,
                call.kind,
                call.count,
                codec.format,
                codec.block,
                p.plans
                    .iter()
                    .map(|x| x.schedule.algo.name())
                    .collect::<Vec<_>>()
                    .join(" then ")
            );
            self.exchange(&mut p, id, &mut e.pool)
        });
        match x {
            Ok(x) => {
                e.note_talked(&x);
                Ok((x, Box::new(Phased::Flat(p))))
            }
            Err(err) => {
                p.into_buffers().into_iter().for_each(|b| e.pool.put(b));
                Err(err)
            }
        }
    }

    /// The layout of a compressed `call`, its input quantized into the first exchange's buffer.
    fn begin(&self, call: &Call, codec: Codec, pool: &mut BufPool) -> Result<Flat> {
        let (n, rank, dtype) = (self.nranks, self.rank, call.dtype);
        let (what, problem, counts, out_at, in_elems) = match call.kind {
            Kind::Coll(coll) => {
                let p = call.problem(coll, n)?;
                let c = call.count;
                match coll {
                    Collective::AllReduce => {
                        let segs = owner::segments(&codec, c, n);
                        let counts = segs.iter().map(|s| s.len()).collect();
                        let at = segs.iter().map(|s| s.start).collect();
                        (What::AllReduce, p, counts, at, c)
                    }
                    Collective::ReduceScatter => {
                        (What::ReduceScatter, p, vec![c; n], vec![0; n], c * n)
                    }
                    _ => (
                        What::AllGather,
                        p,
                        vec![c; n],
                        (0..n).map(|r| r * c).collect(),
                        c,
                    ),
                }
            }
            Kind::Varied(l) => {
                let spec = call.varied_spec(&l, n, rank)?;
                let p = spec.problem(n);
                let ins = spec.lens(rank, n).0;
                match spec {
                    Spec::AllGatherV { blocks } => {
                        let (at, counts) = blocks.into_iter().unzip();
                        (What::AllGather, p, counts, at, ins)
                    }
                    Spec::ReduceScatterV { counts } => {
                        (What::ReduceScatter, p, counts, vec![0; n], ins)
                    }
                    _ => return Err(Error::Internal("not a compressed collective".into())),
                }
            }
            _ => return Err(Error::Internal("not a compressed collective".into())),
        };
        let mut segs = Vec::with_capacity(n);
        let mut at = 0usize;
        for c in &counts {
            segs.push(at..at + c);
            at += c;
        }
        let el = dtype.size();
        let inp = call.send.sub(0, in_elems * el).ok_or_else(|| {
            Error::arg(
                "sendbuff",
                format!(
                    "{} bytes, the collective reads {}",
                    call.send.len(),
                    in_elems * el
                ),
            )
        })?;
        let out_elems = match what {
            What::ReduceScatter => counts[rank],
            _ => (0..n).map(|r| out_at[r] + counts[r]).max().unwrap_or(0),
        };
        if call.recv.len() < out_elems * el {
            return Err(Error::arg(
                "recvbuff",
                format!(
                    "{} bytes, the collective writes {}",
                    call.recv.len(),
                    out_elems * el
                ),
            ));
        }
        let (wire, stride) = if matches!(call.kind, Kind::Coll(_)) {
            let stride = segs
                .iter()
                .map(|s| codec.wire_len(s.len()))
                .max()
                .unwrap_or(0);
            let wire = segs
                .iter()
                .enumerate()
                .map(|(r, s)| r * stride..r * stride + codec.wire_len(s.len()))
                .collect();
            (wire, Some(stride))
        } else {
            (owner::wire_ranges(&codec, &segs), None)
        };
        let mut p = Flat {
            what,
            stage: Stage::Gather,
            codec,
            dtype,
            avg: call.op == RedOp::Avg,
            rank,
            nranks: n,
            segs,
            wire,
            stride,
            plans: Vec::new(),
            out_at,
            out: call.recv,
            all: Scratch::new(0),
            mine: Scratch::new(0),
            seq: 0,
            sig: Signature::of(&problem, COMPRESSED_ALGO, dtype, call.op),
        };
        p.sig.compress = Some((codec.format, codec.block));
        let (own, slot, total) = (p.own_wire(), p.slot(), p.total());
        match what {
            What::AllGather => {
                p.mine = pool.take(slot);
                p.all = pool.take(total);
            }
            _ => {
                p.all = pool.take(total);
                p.mine = pool.take(n * slot);
                p.stage = Stage::ToOwners;
            }
        }
        // The whole input is quantized before anything is written: in place is safe.
        inp.with(|b| {
            with_f32(dtype, b, |x| -> Result<()> {
                match what {
                    What::AllGather => {
                        let b = p.mine.bytes_mut();
                        codec.quantize(x, &mut b[..own])?;
                        b[own..slot].fill(0);
                        Ok(())
                    }
                    _ => {
                        let b = p.all.bytes_mut();
                        let mut end = 0;
                        for (s, w) in p.segs.iter().zip(&p.wire) {
                            // Padding between pieces goes over the wire: zeros, never decoded.
                            b[end..w.start].fill(0);
                            codec.quantize(&x[s.clone()], &mut b[w.clone()])?;
                            end = w.end;
                        }
                        b[end..total].fill(0);
                        Ok(())
                    }
                }
            })
        })?;
        Ok(p)
    }

    /// The executor of `p`'s current exchange, as request `id`; takes its sequence number.
    fn exchange(&self, p: &mut Flat, id: u32, pool: &mut BufPool) -> Result<Box<Exec>> {
        let n = self.nranks;
        let (slot, total) = (p.slot(), p.total());
        let at = p.stages().iter().position(|s| *s == p.stage).unwrap_or(0);
        let planned = p.plans.get(at).cloned().ok_or_else(|| {
            Error::Internal(format!("compressed call: no plan for {:?}", p.stage))
        })?;
        // SAFETY: `p` owns both buffers until its call ends, and a failed call's buffers go to
        // the communicator's graveyard with its executor's, so neither region outlives them.
        let (all, mine) = unsafe { (p.all.region(), p.mine.region()) };
        let sub = |r: Region, len: usize| r.sub(0, len).expect("buffers fit their layout");
        let (inp, out) = match p.stage {
            Stage::ToOwners => (sub(all, total), sub(mine, n * slot)),
            Stage::Gather => (sub(mine, slot), sub(all, total)),
        };
        let seq = p.seq;
        p.seq = p.seq.wrapping_add(1);
        self.byte_exchange(planned, (inp, out), seq, p.sig, id, pool)
    }

    /// The executor, as request `id`, of the exchange `planned` of bytes from `io.0` into
    /// `io.1` with sequence number `seq`, its messages carrying `sig`.
    fn byte_exchange(
        &self,
        planned: Planned,
        (inp, out): (Region, Region),
        seq: u32,
        sig: Signature,
        id: u32,
        pool: &mut BufPool,
    ) -> Result<Box<Exec>> {
        let args = Args {
            dtype: DataType::Uint8,
            op: RedOp::Sum,
            inp,
            out,
            tags: Tags::Coll(seq),
            timeout: self.timeout,
            sends_first: self.sends_first(),
            restore: false,
            signature: Some(sig),
            device: None,
        };
        Exec::new(
            Job {
                schedule: planned.schedule,
                rank: self.rank,
                args,
            },
            planned.plan,
            id,
            pool,
        )
    }

    /// After `p`'s exchange finished: the codec's work, then the next exchange's executor,
    /// or None when the call is done (its output written).
    pub(super) fn step(
        &self,
        p: &mut Phased,
        id: u32,
        pool: &mut BufPool,
    ) -> Result<Option<Box<Exec>>> {
        match p {
            Phased::Flat(f) => self.step_flat(f, id, pool),
            Phased::Tiered(t) => self.step_tiered(t, id, pool),
        }
    }

    /// `step` of a call that compresses every level.
    fn step_flat(&self, p: &mut Flat, id: u32, pool: &mut BufPool) -> Result<Option<Box<Exec>>> {
        match (p.stage, p.what) {
            (Stage::ToOwners, What::AllReduce) => {
                let codes = p.reduce_own()?;
                let slot = p.slot();
                let b = p.mine.bytes_mut();
                b[..codes.len()].copy_from_slice(&codes);
                b[codes.len()..slot].fill(0);
                p.stage = Stage::Gather;
                self.exchange(p, id, pool).map(Some)
            }
            (Stage::ToOwners, _) => {
                let codes = p.reduce_own()?;
                p.decode(p.rank, &codes)?;
                Ok(None)
            }
            (Stage::Gather, _) => {
                let all = p.all.bytes();
                for (r, w) in p.wire.iter().enumerate() {
                    p.decode(r, &all[w.clone()])?;
                }
                Ok(None)
            }
        }
    }
}

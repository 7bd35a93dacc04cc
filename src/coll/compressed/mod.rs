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
//! as any collective's (`Engine::phased`). A large call is cut into chunks (`flat`: the same
//! whole blocks of every segment, about `FABRICOLL_COMPRESS_CHUNK` bytes each, the same cut on
//! every rank) run as a pipeline (`pipe`): one exchange at a time, chunk k's ToOwners before
//! chunk k - 1's Gather, while the engine's progress does the codec's work of the chunks
//! around it in pieces of whole blocks between polls (`Phased::work`); `step` starts the next
//! exchange when one finishes, after whatever of its codec work is left. Blocks are coded
//! independently, so a pipelined call gives the bits of one chunk. Every exchange's sequence
//! number is taken when the call starts, so that calls started after it number alike on every
//! rank. Their messages carry the caller's call's signature with the format and block size
//! (`exec::Signature::compress`): ranks whose calls or compression settings differ fail with
//! an error naming the difference. The inter-host-only composition (`tiered`) is cut and
//! pipelined alike (`tiered/work.rs`; the order of both from `pipe::wavefront`).
//!
//! Which algorithm runs an exchange: AllReduce, ReduceScatter and AllGather pad each rank's
//! piece of codes to the largest (AllReduce's segments differ by at most a block; the others'
//! are equal), so their exchanges are plain AllToAll and AllGather collectives of bytes, run by
//! the call's forced algorithm where it implements the exchange's collective, else as an
//! uncompressed AllToAll or AllGather of those bytes would be (the communicator's setting for
//! that collective, else the cost model's choice, `Comm::choose`). The V collectives keep the
//! varied exchanges (AllToAllV pairwise, AllGatherV direct): padding uneven counts to the
//! largest could multiply the bytes. The price (`tune::CompressedPrice`: the exchanges at the
//! codes' bytes and the codec's work at the rates measured on this machine, overlapped where
//! the call is pipelined) is logged at info with the uncompressed call's.
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
use crate::algo::varied::Varied;
use crate::algo::Collective;
use crate::compress::Codec;
use crate::config::Compression;
use crate::error::{Error, Result};
use crate::exec::{Args, BufPool, Exec, Job, Signature, Tags};
use crate::reduce::{DataType, RedOp};
use crate::transport::{Region, Scratch};
use std::cell::Cell;

mod convert;
mod flat;
mod pipe;
mod plan;
mod rate;
#[cfg(test)]
mod tests;
mod tiered;

use flat::Flat;

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
            Phased::Flat(f) => f.into_buffers(),
            Phased::Tiered(t) => t.into_buffers(),
        }
    }

    /// The sequence numbers the call took (`Engine::check_room`).
    pub(super) fn seqs(&self) -> usize {
        match self {
            Phased::Flat(f) => f.seqs,
            Phased::Tiered(t) => t.seqs,
        }
    }

    /// One piece of the codec's work while the call's exchange runs (`pipe`); whether there
    /// was one.
    pub(super) fn work(&mut self, pool: &mut BufPool) -> Result<bool> {
        match self {
            Phased::Flat(f) => f.work(pool),
            Phased::Tiered(t) => t.work(pool),
        }
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
        let mut p = self.begin(call, codec)?;
        p.init_work();
        let x = self.plan_exchanges(e, call, &mut p).and_then(|()| {
            p.seq = e.take_seqs(p.seqs as u32);
            log::debug!(
                "collective #{}: {:?} count {} compressed as {} in blocks of {}, {} chunk(s), exchanges by {}",
                p.seq,
                call.kind,
                call.count,
                codec.format,
                codec.block,
                p.chunks.len(),
                p.chunks[0]
                    .plans
                    .iter()
                    .map(|x| x.schedule.algo.name())
                    .collect::<Vec<_>>()
                    .join(" then ")
            );
            let (k, t) = (0, pipe::Task::Quantize);
            p.finish(k, t, &mut e.pool)?;
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
}

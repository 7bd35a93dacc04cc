//! A compressed call that compresses every level alike: its layout (each rank's segment, where
//! it lies in the caller's buffers), cut into chunks of whole blocks, each with its own
//! exchanges' layout and buffers (docs/compression.md). The chunks run as a pipeline (`pipe`).
use super::{Stage, What};
use crate::algo::varied::Spec;
use crate::algo::Collective;
use crate::coll::engine::Planned;
use crate::coll::{Call, Comm, Kind};
use crate::compress::{owner, Codec};
use crate::error::{Error, Result};
use crate::exec::{BufPool, Signature, COMPRESSED_ALGO};
use crate::reduce::{DataType, RedOp};
use crate::transport::{Region, Scratch};
use std::ops::Range;

/// Most chunks a call is cut into: each takes one sequence number per exchange
/// (`Engine::check_room`); a larger call gets larger chunks.
pub(super) const MAX_CHUNKS: usize = 32;

/// A compressed call in progress that compresses every level alike: its layout, its chunks
/// and where the pipeline stands (`pipe`). The chunks' buffers are owned until the call ends
/// (on failure they go to the graveyard with the executor's).
pub(in crate::coll) struct Flat {
    pub(super) what: What,
    pub(super) codec: Codec,
    pub(super) dtype: DataType,
    pub(super) avg: bool,
    pub(super) rank: usize,
    pub(super) nranks: usize,
    /// Elements of each rank's segment: the owners' split (AllReduce), each rank's output
    /// (ReduceScatter) or input (AllGather).
    pub(super) counts: Vec<usize>,
    /// Where segment r's first element lies in the caller's input (AllReduce, ReduceScatter;
    /// AllGather: only this rank's, at 0).
    pub(super) in_at: Vec<usize>,
    /// Where segment r's first element lands in the caller's output.
    pub(super) out_at: Vec<usize>,
    pub(super) inp: Region,
    /// A copy of the input, where the output overlaps it otherwise than NCCL's in-place
    /// layouts: a chunk's output would otherwise overwrite a later chunk's input.
    pub(super) held: Option<Vec<u8>>,
    pub(super) out: Region,
    pub(super) chunks: Vec<Chunk>,
    /// The exchanges in the order they run: (chunk, stage).
    pub(super) order: Vec<(usize, Stage)>,
    /// Exchanges of `order` started, and finished.
    pub(super) started: usize,
    pub(super) finished: usize,
    /// The first exchange's sequence number; exchange i of `order` takes `seq + i`.
    pub(super) seq: u32,
    /// The sequence numbers the call takes (`chunk_cut`'s chunks' exchanges, at least
    /// `order`'s).
    pub(super) seqs: usize,
    pub(super) sig: Signature,
}

/// One chunk: the same elements of every segment, whole blocks.
pub(super) struct Chunk {
    /// Each segment's elements in this chunk, from the segment's first element.
    pub(super) part: Vec<Range<usize>>,
    /// Where each segment's codes lie in the exchanges' buffers: back to back (V
    /// collectives), or at `r * stride`.
    pub(super) wire: Vec<Range<usize>>,
    pub(super) stride: Option<usize>,
    /// Its exchanges' plans, in the order of `Flat::stages`.
    pub(super) plans: Vec<Planned>,
    /// ToOwners' input (this rank's codes of every segment) and Gather's output (every
    /// segment's codes).
    pub(super) all: Scratch,
    /// ToOwners' output (every rank's codes of this rank's segment) and Gather's input (this
    /// rank's segment's codes).
    pub(super) mine: Scratch,
    /// Whether `all` and `mine` are taken (from its first piece of work to its last).
    pub(super) live: bool,
    /// How far each task (`pipe::Task`) has come.
    pub(super) work: [super::pipe::Cursor; 3],
}

impl Chunk {
    /// Bytes of this rank's segment's codes.
    pub(super) fn own_wire(&self, rank: usize) -> usize {
        self.wire[rank].len()
    }

    /// Bytes of each rank's piece in the exchanges: the stride, else this rank's codes.
    pub(super) fn slot(&self, rank: usize) -> usize {
        self.stride.unwrap_or_else(|| self.own_wire(rank))
    }

    /// Bytes of the buffer that holds every segment's codes.
    pub(super) fn total(&self) -> usize {
        match self.stride {
            Some(s) => s * self.wire.len(),
            None => self.wire.last().map_or(0, |w| w.end),
        }
    }
}

impl Flat {
    /// The buffers, for the pool (done) or the graveyard (failed).
    pub(in crate::coll) fn into_buffers(self) -> Vec<Scratch> {
        self.chunks
            .into_iter()
            .filter(|c| c.live)
            .flat_map(|c| [c.all, c.mine])
            .collect()
    }

    /// Which exchanges a chunk runs, in order.
    pub(super) fn stages(&self) -> &'static [Stage] {
        stages_of(self.what)
    }
}

/// Which exchanges a chunk of `what` runs, in order.
fn stages_of(what: What) -> &'static [Stage] {
    match what {
        What::AllReduce => &[Stage::ToOwners, Stage::Gather],
        What::ReduceScatter => &[Stage::ToOwners],
        What::AllGather => &[Stage::Gather],
    }
}

/// The cut of a call whose segments hold `counts` elements of `el` bytes: the elements of each
/// segment per chunk, and the chunks the call takes sequence numbers for. The second, m, comes
/// from the call's bytes alone (the sum of `counts`: AllReduce's and ReduceScatter's input,
/// AllGather's output), one chunk per `chunk_bytes` (at least one, at most `MAX_CHUNKS`; one
/// where `chunk_bytes` is 0), so that ranks whose block sizes differ still number the calls
/// after this one alike; the first is the longest segment over m, rounded up to whole blocks,
/// so the call runs at most m chunks.
pub(super) fn chunk_cut(
    codec: &Codec,
    counts: &[usize],
    el: usize,
    chunk_bytes: usize,
) -> (usize, usize) {
    let bytes = counts.iter().sum::<usize>().saturating_mul(el);
    let m = match chunk_bytes {
        0 => 1,
        c => bytes.div_ceil(c).clamp(1, MAX_CHUNKS),
    };
    let longest = counts.iter().copied().max().unwrap_or(0);
    let per = longest.div_ceil(m).max(1).div_ceil(codec.block) * codec.block;
    (per, m)
}

/// Chunk `k`'s elements of segments of `counts` elements, `per` of each.
pub(super) fn chunk_parts(counts: &[usize], per: usize, k: usize) -> Vec<Range<usize>> {
    counts
        .iter()
        .map(|&c| (k * per).min(c)..((k + 1) * per).min(c))
        .collect()
}

/// The exchanges' layout of a chunk of `part`: pieces padded to the largest (`uniform`), else
/// back to back.
pub(super) fn chunk_wire(
    codec: &Codec,
    part: &[Range<usize>],
    uniform: bool,
) -> (Vec<Range<usize>>, Option<usize>) {
    if uniform {
        let stride = part
            .iter()
            .map(|s| codec.wire_len(s.len()))
            .max()
            .unwrap_or(0);
        let wire = part
            .iter()
            .enumerate()
            .map(|(r, s)| r * stride..r * stride + codec.wire_len(s.len()))
            .collect();
        (wire, Some(stride))
    } else {
        (owner::wire_ranges(codec, part), None)
    }
}

/// Whether byte ranges `a` and `b` overlap.
pub(super) fn overlap(a: &Range<usize>, b: &Range<usize>) -> bool {
    a.start < b.end && b.start < a.end
}

impl Comm {
    /// The layout of a compressed `call`, cut into chunks (`chunk_elems`), no buffer taken yet.
    pub(super) fn begin(&self, call: &Call, codec: Codec) -> Result<Flat> {
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
        let mut in_at = Vec::with_capacity(n);
        let mut at = 0usize;
        for c in &counts {
            in_at.push(if what == What::AllGather { 0 } else { at });
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
        let uniform = matches!(call.kind, Kind::Coll(_));
        let (per, reserved) = chunk_cut(&codec, &counts, el, self.compress_chunk);
        let m = counts
            .iter()
            .copied()
            .max()
            .unwrap_or(0)
            .div_ceil(per)
            .max(1);
        let chunks = (0..m)
            .map(|k| {
                let part = chunk_parts(&counts, per, k);
                let (wire, stride) = chunk_wire(&codec, &part, uniform);
                Chunk {
                    part,
                    wire,
                    stride,
                    plans: Vec::new(),
                    all: Scratch::new(0),
                    mine: Scratch::new(0),
                    live: false,
                    work: Default::default(),
                }
            })
            .collect();
        let stages = stages_of(what);
        let order = super::pipe::wavefront(m, stages.len())
            .into_iter()
            .map(|(k, j)| (k, stages[j]))
            .collect();
        // A chunk's output is written before later chunks' input is read: safe where the
        // buffers are apart or laid out as NCCL's in place (each output element on its own
        // input element, or AllGather's input its own block, apart from the others').
        let ins = inp.addr()..inp.addr() + inp.len();
        let outs = call.recv.addr()..call.recv.addr() + out_elems * el;
        let byte =
            |r: usize, at: &[usize]| outs.start + at[r] * el..outs.start + (at[r] + counts[r]) * el;
        let in_place = match what {
            What::AllReduce => ins.start == outs.start,
            What::ReduceScatter => outs.start == ins.start + in_at[rank] * el,
            What::AllGather => {
                ins.start == outs.start + out_at[rank] * el
                    && (0..n)
                        .all(|r| r == rank || !overlap(&byte(r, &out_at), &byte(rank, &out_at)))
            }
        };
        let held = (m > 1 && overlap(&ins, &outs) && !in_place).then(|| inp.to_vec());
        let mut sig = Signature::of(&problem, COMPRESSED_ALGO, dtype, call.op);
        sig.compress = Some((codec.format, codec.block));
        Ok(Flat {
            what,
            codec,
            dtype,
            avg: call.op == RedOp::Avg,
            rank,
            nranks: n,
            counts,
            in_at,
            out_at,
            inp,
            held,
            out: call.recv,
            chunks,
            order,
            started: 0,
            finished: 0,
            seq: 0,
            seqs: reserved * stages_of(what).len(),
            sig,
        })
    }
}

impl Flat {
    /// Take chunk `k`'s buffers from `pool`, their padding zeroed (it goes over the wire and
    /// is never decoded).
    pub(super) fn take_buffers(&mut self, k: usize, pool: &mut BufPool) {
        let (n, rank, what) = (self.nranks, self.rank, self.what);
        let c = &mut self.chunks[k];
        let (own, slot, total) = (c.own_wire(rank), c.slot(rank), c.total());
        match what {
            What::AllGather => {
                c.mine = pool.take(slot);
                c.all = pool.take(total);
                c.mine.bytes_mut()[own..slot].fill(0);
            }
            _ => {
                c.all = pool.take(total);
                c.mine = pool.take(n * slot);
                let b = c.all.bytes_mut();
                for r in 0..n {
                    let end = c.wire.get(r + 1).map_or(total, |w| w.start);
                    b[c.wire[r].end..end].fill(0);
                }
            }
        }
        c.live = true;
    }
}

//! Compressing the inter-host level only (docs/compression.md, "Levels"): on a communicator
//! over H >= 2 hosts, some of them holding two ranks or more, shared memory carries the data in
//! full precision and only the exchanges among the ranks of one lane (the rank of each host
//! with the same local index, `algo::lanes`; as many lanes as the smallest host has ranks, L)
//! carry codes. The ranks of a bigger host past the lanes are *extra*: they take part in their
//! host's exchanges only. The call's vector is cut into segments, each of one lane and one
//! host (`layout`):
//!
//! - AllReduce: the count cut into L slices of whole blocks, slice k the lane k's, each cut
//!   into H segments of whole blocks. (1) Inside each host, every rank (extras included) sends
//!   slice k of its input to the host's rank k, which sums the pieces in f32 in local rank
//!   order (the first piece, then each next added): the host's partial sum of its slice, in
//!   full precision. (2) Among the lane, the owner rule of `compress::owner` on that partial
//!   sum: each rank quantizes its partial sum once and sends each segment's codes to its
//!   owner, which adds the H dequantized contributions in host order in f32, divides by the
//!   communicator's rank count for Avg and quantizes the sum once; (3) every rank of the lane
//!   decodes every owner's codes into its output (rounded once to bf16 or f16 data), and (4)
//!   the host's lane ranks hand their decoded slices to every other rank of the host as they
//!   are.
//! - ReduceScatter(V): rank r's output is a segment of lane `local(r) % L` owned by its host's
//!   rank of that lane. (1) Inside each host, the host's rank k receives from every host rank
//!   the pieces of lane k's segments and sums them as above; (2) among the lane, the owner rule
//!   on those sums, each owner decoding its own segment, and (3) where hosts differ in size,
//!   the decoded segments of extra ranks handed to them as they are.
//! - AllGather(V): rank r's input is a segment of lane `local(r) % L` contributed by its host's
//!   rank of that lane. Each rank quantizes its input once; (1) where hosts differ in size, the
//!   extra ranks hand their codes to their lane's rank; (2) among the lane, the codes gathered
//!   and decoded by every lane rank, its own included; (3) inside each host, the decoded
//!   segments handed on as they are.
//!
//! So each element is quantized at most twice whatever the layout, every rank's result is the
//! same bits (every rank decodes the same codes, or copies what was decoded), and NaN and
//! infinities survive (a full-precision sum keeps them, and the codec marks their blocks).
//! A call of more than `FABRICOLL_COMPRESS_CHUNK` bytes is cut into chunks as `flat`'s (the
//! same whole blocks of every segment, `flat::chunk_cut`), each the composition of its own
//! elements, run as a pipeline (`work`); blocks are coded independently, so the bits are one
//! chunk's. Every exchange is an ordinary executor of an `algo::lanes` schedule among its group (no
//! message to the other ranks; an extra rank runs the lanes' stages as nothing to do), one
//! request of the engine's table as any compressed call, so abort, destroy, deadlines and a
//! peer's failure act on it as on any collective; no communicator is split. Its messages carry
//! the call's signature with the format and the algorithm `hier` (`TIERED_ALGO`): a rank that
//! runs the call compressed on every level fails against one that runs this composition,
//! naming the algorithm.
use super::flat::{chunk_cut, overlap};
use super::{pipe, What};
use crate::algo::lanes::{self, Lanes};
use crate::algo::varied::{Spec, Varied};
use crate::algo::{Algorithm, Collective};
use crate::coll::engine::{Engine, Planned};
use crate::coll::{Call, Comm, Kind};
use crate::compress::Codec;
use crate::config::CompressLevels;
use crate::error::{Error, Result};
use crate::exec::{BufPool, Exec, Signature};
use crate::reduce::{DataType, RedOp};
use crate::transport::{Region, Scratch};
use crate::tune::{self, CompressedPrice, Exchange, Shape, Tier};
use layout::Layout;
use std::sync::Arc;

mod layout;
mod work;

/// The algorithm a tiered call's signature names.
pub(super) const TIERED_ALGO: Algorithm = Algorithm::Hier;

/// One exchange of a tiered call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Inside the host: the data's pieces to the rank that sums them.
    HostReduce,
    /// Inside the host: an extra rank's codes to its lane's rank.
    HostCodes,
    /// Among the lane: each segment's codes to its owner.
    LaneToOwners,
    /// Among the lane: every owner's codes to every rank.
    LaneGather,
    /// Inside the host: the decoded results to the ranks that need them.
    HostGather,
}

impl Stage {
    /// The exchanges of `what`, on hosts of different sizes (`uneven`) or not.
    fn of(what: What, uneven: bool) -> &'static [Stage] {
        match (what, uneven) {
            (What::AllReduce, _) => &[
                Stage::HostReduce,
                Stage::LaneToOwners,
                Stage::LaneGather,
                Stage::HostGather,
            ],
            (What::ReduceScatter, false) => &[Stage::HostReduce, Stage::LaneToOwners],
            (What::ReduceScatter, true) => {
                &[Stage::HostReduce, Stage::LaneToOwners, Stage::HostGather]
            }
            (What::AllGather, false) => &[Stage::LaneGather, Stage::HostGather],
            (What::AllGather, true) => &[Stage::HostCodes, Stage::LaneGather, Stage::HostGather],
        }
    }

    fn tier(self) -> Tier {
        match self {
            Stage::HostReduce | Stage::HostCodes | Stage::HostGather => Tier::Host,
            _ => Tier::Lane,
        }
    }

    fn coll(self) -> Collective {
        match self {
            Stage::HostReduce | Stage::HostCodes | Stage::LaneToOwners => Collective::AllToAll,
            _ => Collective::AllGather,
        }
    }

    /// The algorithm its schedule is named by (pairwise order, direct messages) and priced as.
    fn algo(self) -> Algorithm {
        match self.coll() {
            Collective::AllToAll => Algorithm::Pairwise,
            _ => Algorithm::Mesh,
        }
    }
}

/// What a compressed `call` computes.
fn what_of(call: &Call) -> What {
    match call.kind {
        Kind::Coll(Collective::AllReduce) => What::AllReduce,
        Kind::Coll(Collective::ReduceScatter) => What::ReduceScatter,
        Kind::Varied(l) if l.coll == Varied::ReduceScatterV => What::ReduceScatter,
        _ => What::AllGather,
    }
}

/// The exchanges of a tiered call of `call`'s collective on `lanes`, in order, as
/// `Comm::exchange_algos` reports them.
pub(super) fn exchange_algos(call: &Call, lanes: &Lanes) -> Vec<(Collective, Algorithm)> {
    Stage::of(what_of(call), lanes.uneven())
        .iter()
        .map(|s| (s.coll(), s.algo()))
        .collect()
}

/// A tiered compressed call in progress: its layout, cut into chunks (the same whole blocks of
/// every segment, as `flat`'s), each with its exchanges' plans and its buffers, owned until the
/// call ends (on failure they go to the graveyard), and where the pipeline stands (`work`).
pub(in crate::coll) struct Tiered {
    codec: Codec,
    dtype: DataType,
    /// Avg's divisor: the communicator's rank count.
    avg: Option<usize>,
    /// The whole call's layout.
    lay: Layout,
    /// The exchanges every chunk runs, in order.
    stages: &'static [Stage],
    chunks: Vec<Part>,
    /// The exchanges in the order they run: (chunk, index in `stages`).
    order: Vec<(usize, usize)>,
    /// Exchanges of `order` started.
    started: usize,
    /// The caller's input (or `held`'s copy of it) and output, whole.
    inp: Region,
    out: Region,
    /// A copy of the input, where the output overlaps it otherwise than NCCL's in-place
    /// layouts and the call runs in several chunks.
    held: Option<Scratch>,
    /// The first exchange's sequence number; exchange i of `order` takes `seq + i`.
    seq: u32,
    /// The sequence numbers the call takes (`flat::chunk_cut`'s chunks' exchanges).
    pub(super) seqs: usize,
    sig: Signature,
}

/// One chunk of a tiered call.
struct Part {
    lay: Layout,
    /// Its exchanges' plans, in the order of `Tiered::stages`.
    plans: Vec<Planned>,
    /// The host's pieces (HostReduce's output), the lane's codes of every segment (an extra
    /// rank's AllGather: its own), its host's segments' codes from every host (owners), and
    /// the decoded segments it hands on to extra ranks; taken from its first task to its last.
    pieces: Scratch,
    codes: Scratch,
    got: Scratch,
    dec: Scratch,
    live: bool,
    /// Its exchanges finished (they run in `stages`' order).
    exchanged: usize,
    /// Which of its codec tasks are done: task 0 before its first exchange, task i after
    /// exchange i - 1 (`work`).
    done: Vec<bool>,
}

impl Tiered {
    /// The buffers, for the pool (done) or the graveyard (failed).
    pub(in crate::coll) fn into_buffers(self) -> Vec<Scratch> {
        let held = self.held.into_iter();
        let live = self.chunks.into_iter().filter(|c| c.live);
        live.flat_map(|c| [c.pieces, c.codes, c.got, c.dec])
            .chain(held)
            .collect()
    }

    /// The input and output regions of chunk `k`'s exchange `stage`.
    fn regions(&self, k: usize, stage: Stage) -> (Region, Region) {
        let c = &self.chunks[k];
        let [pieces_len, codes_len, got_len, dec_len] = c.lay.buffers();
        // SAFETY: `self` owns the chunk's buffers until its last task, which runs after its
        // exchanges finished, and a failed call's buffers go to the communicator's graveyard
        // with its executor's, so no region outlives them.
        let (pieces, codes, got, dec) = unsafe {
            (
                c.pieces.region(),
                c.codes.region(),
                c.got.region(),
                c.dec.region(),
            )
        };
        let sub = |r: Region, len: usize| r.sub(0, len).expect("buffers fit their layout");
        let (pieces, codes, got, dec) = (
            sub(pieces, pieces_len),
            sub(codes, codes_len),
            sub(got, got_len),
            sub(dec, dec_len),
        );
        match (stage, self.lay.what) {
            (Stage::HostReduce, _) => (self.inp, pieces),
            (Stage::HostCodes, _) => (codes, codes),
            (Stage::LaneToOwners, _) => (codes, got),
            (Stage::LaneGather, What::AllReduce) => (got, codes),
            (Stage::LaneGather, _) => (codes, codes),
            (Stage::HostGather, What::ReduceScatter) => (dec, self.out),
            (Stage::HostGather, _) => (self.out, self.out),
        }
    }
}

impl Comm {
    /// The lanes of a call compressed on the inter-host level only, None to compress every
    /// level: with `FABRICOLL_COMPRESS_LEVELS=all`, on one host, with one rank per host, and
    /// for an AllGatherV whose blocks overlap in the output.
    pub(super) fn tiers(&self, call: &Call) -> Option<Lanes> {
        if self.compress_levels == CompressLevels::All {
            return None;
        }
        if let Kind::Varied(l) = call.kind {
            let spec = call.varied_spec(&l, self.nranks, self.rank).ok()?;
            match spec {
                Spec::AllGatherV { mut blocks } => {
                    blocks.retain(|b| b.1 > 0);
                    blocks.sort_unstable();
                    if blocks.windows(2).any(|b| b[0].0 + b[0].1 > b[1].0) {
                        return None;
                    }
                }
                Spec::ReduceScatterV { .. } => {}
                _ => return None,
            }
        }
        Lanes::of(self.hosts, self.nranks, self.rank)
    }

    /// Start `call` compressed on the inter-host level only, as request `id`: its layout,
    /// plans, the first chunk's codec work and first exchange.
    pub(super) fn start_tiered(
        &self,
        e: &mut Engine,
        call: &Call,
        codec: Codec,
        lanes: Lanes,
        id: u32,
    ) -> Result<(Box<Exec>, Tiered)> {
        let mut t = self.begin_tiered(call, codec, lanes, &mut e.pool)?;
        let x = self.plan_tiered(call, &mut t).and_then(|()| {
            t.seq = e.take_seqs(t.seqs as u32);
            log::debug!(
                "collective #{}: {:?} count {} compressed as {} in blocks of {} on the \
                 inter-host level only (ranks per host {:?}, {} lanes), {} chunk(s)",
                t.seq,
                call.kind,
                call.count,
                codec.format,
                codec.block,
                t.lay.l.sizes(),
                t.lay.l.width(),
                t.chunks.len()
            );
            t.prepare(&mut e.pool)?;
            self.tiered_exchange(&mut t, id, &mut e.pool)
        });
        match x {
            Ok(x) => {
                e.note_talked(&x);
                Ok((x, t))
            }
            Err(err) => {
                t.into_buffers().into_iter().for_each(|b| e.pool.put(b));
                Err(err)
            }
        }
    }

    /// The layout of a tiered `call`, cut into chunks; no chunk's buffer taken yet.
    fn begin_tiered(
        &self,
        call: &Call,
        codec: Codec,
        lanes: Lanes,
        pool: &mut BufPool,
    ) -> Result<Tiered> {
        let (n, rank, dtype, c) = (self.nranks, self.rank, call.dtype, call.count);
        let el = dtype.size();
        let what = what_of(call);
        let (problem, blocks, in_elems, out_elems) = match call.kind {
            Kind::Coll(coll) => {
                let problem = call.problem(coll, n)?;
                match what {
                    What::AllReduce => (problem, Vec::new(), c, c),
                    What::ReduceScatter => {
                        (problem, (0..n).map(|r| (r * c, c)).collect(), c * n, c)
                    }
                    What::AllGather => (problem, (0..n).map(|r| (r * c, c)).collect(), c, c * n),
                }
            }
            Kind::Varied(l) => {
                let spec = call.varied_spec(&l, n, rank)?;
                let (ins, outs) = spec.lens(rank, n);
                let blocks = match &spec {
                    Spec::AllGatherV { blocks } => blocks.clone(),
                    Spec::ReduceScatterV { counts } => {
                        let mut at = 0;
                        counts
                            .iter()
                            .map(|&c| {
                                at += c;
                                (at - c, c)
                            })
                            .collect()
                    }
                    _ => return Err(Error::Internal("not a compressed collective".into())),
                };
                (spec.problem(n), blocks, ins, outs)
            }
            _ => return Err(Error::Internal("not a compressed collective".into())),
        };
        for (name, r, need, does) in [
            ("sendbuff", call.send, in_elems * el, "reads"),
            ("recvbuff", call.recv, out_elems * el, "writes"),
        ] {
            if r.len() < need {
                return Err(Error::arg(
                    name,
                    format!("{} bytes, the collective {does} {need}", r.len()),
                ));
            }
        }
        let lay = match what {
            What::AllReduce => Layout::all_reduce(&codec, lanes, c, el),
            _ => Layout::per_rank(what, &codec, lanes, &blocks, el),
        };
        let stages = Stage::of(what, lay.l.uneven());
        let counts = lay.counts();
        let (per, reserved) = chunk_cut(&codec, &counts, el, self.compress_chunk);
        let longest = counts.iter().copied().max().unwrap_or(0);
        let m = longest.div_ceil(per).max(1);
        let chunks = (0..m)
            .map(|k| Part {
                lay: lay.chunk(&codec, per, k),
                plans: Vec::new(),
                pieces: Scratch::new(0),
                codes: Scratch::new(0),
                got: Scratch::new(0),
                dec: Scratch::new(0),
                live: false,
                exchanged: 0,
                done: vec![false; stages.len() + 1],
            })
            .collect();
        let inp = call
            .send
            .sub(0, lay.in_elems() * el)
            .expect("checked above");
        let out = call
            .recv
            .sub(0, lay.out_elems() * el)
            .expect("checked above");
        // A chunk's output is written before later chunks' input is read: safe where the
        // buffers are apart or laid out as NCCL's in place (each output element on its own
        // input element, or AllGather's input its own segment of the output, apart from the
        // others'); otherwise the input is copied first.
        let (ins, outs) = (
            inp.addr()..inp.addr() + inp.len(),
            out.addr()..out.addr() + out.len(),
        );
        let own = lay.mine().map_or(0, |s| s.data.start) * el;
        let in_place = match what {
            What::AllReduce => ins.start == outs.start,
            What::ReduceScatter => outs.start == ins.start + own,
            // The others' segments lie apart from its own (`tiers`).
            What::AllGather => ins.start == outs.start + own,
        };
        let held = (m > 1 && overlap(&ins, &outs) && !in_place).then(|| {
            let mut h = pool.take(inp.len());
            inp.with(|b| h.bytes_mut()[..b.len()].copy_from_slice(b));
            h
        });
        let inp = match &held {
            // SAFETY: `held` is owned by the call until it ends (the graveyard on failure).
            Some(h) => unsafe { h.region() }
                .sub(0, ins.len())
                .expect("a copy of the input"),
            None => inp,
        };
        let mut sig = Signature::of(&problem, TIERED_ALGO, dtype, call.op);
        sig.compress = Some((codec.format, codec.block));
        Ok(Tiered {
            codec,
            dtype,
            avg: (call.op == RedOp::Avg).then_some(n),
            lay,
            stages,
            chunks,
            order: pipe::wavefront(m, stages.len()),
            started: 0,
            inp,
            out,
            held,
            seq: 0,
            seqs: reserved * stages.len(),
            sig,
        })
    }

    /// The plans of every chunk's exchanges, and the call's price logged at info.
    fn plan_tiered(&self, call: &Call, t: &mut Tiered) -> Result<()> {
        let (n, rank, el) = (self.nranks, self.rank, t.dtype.size());
        for c in &mut t.chunks {
            for &stage in t.stages {
                let (group, p) = c.lay.pieces(stage);
                let s = lanes::exchange(n, rank, &group, &p)
                    .map_err(|err| Error::Internal(format!("tiered {stage:?}: {err}")))?;
                c.plans.push(self.planned(Arc::new(s), 1)?);
            }
        }
        if log::log_enabled!(log::Level::Info) {
            // The first chunk's exchanges (the largest); every chunk runs them alike.
            let first = &t.chunks[0].lay;
            let exchanges = t
                .stages
                .iter()
                .map(|&stage| {
                    let (ranks, piece) = first.priced(stage);
                    let us = self.model.tier_exchange_us(
                        stage.tier(),
                        stage.coll(),
                        stage.algo(),
                        ranks,
                        piece,
                        t.lay.l.width(),
                    );
                    Exchange {
                        coll: stage.coll(),
                        bytes: piece,
                        algo: stage.algo(),
                        us,
                        level: Some(stage.tier()),
                    }
                })
                .collect();
            let what = t.lay.what;
            let shape = match what {
                What::AllReduce => Shape::AllReduce,
                What::ReduceScatter => Shape::ReduceScatter,
                What::AllGather => Shape::AllGather,
            };
            // The V collectives' count: the average rank's.
            let count = match (what, call.kind) {
                (_, Kind::Coll(_)) => call.count,
                (What::AllGather, _) => t.lay.out_elems() / n.max(1),
                _ => t.lay.in_elems() / n.max(1),
            };
            let sizes = t.lay.l.sizes();
            let rate = super::rate::measured_rate(t.codec.format);
            let price = CompressedPrice {
                shape,
                format: t.codec.format,
                block: t.codec.block,
                nranks: n,
                count,
                elem: el,
                codec_us: rate.us(tune::codec_elements_tiered(shape, &sizes, count)),
                rate,
                chunks: t.chunks.len(),
                exchanges,
                tiers: Some(sizes),
            };
            self.model
                .log_compressed(&price, self.uncompressed_price(call));
        }
        Ok(())
    }

    /// The executor of `t`'s next exchange (`Tiered::order`), as request `id`, with its
    /// sequence number.
    fn tiered_exchange(&self, t: &mut Tiered, id: u32, pool: &mut BufPool) -> Result<Box<Exec>> {
        let i = t.started;
        let (k, s) = t.order[i];
        let planned = t.chunks[k].plans.get(s).cloned().ok_or_else(|| {
            Error::Internal(format!(
                "tiered compressed call: no exchange {s} of chunk {k}"
            ))
        })?;
        let io = t.regions(k, t.stages[s]);
        t.started += 1;
        let seq = t.seq.wrapping_add(i as u32);
        self.byte_exchange(planned, io, seq, t.sig, id, pool)
    }

    /// After `t`'s exchange finished: what the next exchange needs (the part of it not done
    /// while the exchange ran), then its executor; or, after the last one, the rest of the
    /// codec's work and None (the call is done, its output written).
    pub(super) fn step_tiered(
        &self,
        t: &mut Tiered,
        id: u32,
        pool: &mut BufPool,
    ) -> Result<Option<Box<Exec>>> {
        t.exchange_done();
        if t.started == t.order.len() {
            while t.work(pool)? {}
            return Ok(None);
        }
        t.prepare(pool)?;
        self.tiered_exchange(t, id, pool).map(Some)
    }
}

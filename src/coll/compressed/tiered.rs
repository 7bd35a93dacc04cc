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
//! Every exchange is an ordinary executor of an `algo::lanes` schedule among its group (no
//! message to the other ranks; an extra rank runs the lanes' stages as nothing to do), one
//! request of the engine's table as any compressed call, so abort, destroy, deadlines and a
//! peer's failure act on it as on any collective; no communicator is split. Its messages carry
//! the call's signature with the format and the algorithm `hier` (`TIERED_ALGO`): a rank that
//! runs the call compressed on every level fails against one that runs this composition,
//! naming the algorithm.
use super::convert::{decode_into, with_f32};
use super::What;
use crate::algo::lanes::{self, Lanes};
use crate::algo::varied::{Spec, Varied};
use crate::algo::{Algorithm, Collective};
use crate::coll::engine::{Engine, Planned};
use crate::coll::{Call, Comm, Kind};
use crate::compress::{owner, Codec};
use crate::config::CompressLevels;
use crate::error::{Error, Result};
use crate::exec::{BufPool, Exec, Signature};
use crate::reduce::{DataType, RedOp};
use crate::transport::{Region, Scratch};
use crate::tune::{self, CompressedPrice, Exchange, Shape, Tier};
use layout::Layout;
use std::sync::Arc;

mod layout;

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

/// A tiered compressed call in progress: its layout, its exchanges' plans and regions, and
/// the buffers they run on, owned until the call ends (on failure they go to the graveyard).
pub(in crate::coll) struct Tiered {
    codec: Codec,
    dtype: DataType,
    /// Avg's divisor: the communicator's rank count.
    avg: Option<usize>,
    lay: Layout,
    /// The exchanges in order, with their plans and (input, output) regions; `at` the next.
    stages: Vec<(Stage, Planned, Region, Region)>,
    at: usize,
    out: Region,
    /// The host's pieces (HostReduce's output), the lane's codes of every segment (an extra
    /// rank's AllGather: its own), its host's segments' codes from every host (owners), and
    /// the decoded segments it hands on to extra ranks.
    pieces: Scratch,
    codes: Scratch,
    got: Scratch,
    dec: Scratch,
    seq: u32,
    sig: Signature,
}

impl Tiered {
    /// The buffers, for the pool (done) or the graveyard (failed).
    pub(in crate::coll) fn into_buffers(self) -> Vec<Scratch> {
        vec![self.pieces, self.codes, self.got, self.dec]
    }

    /// The host's partial sum of this rank's lane: the host's pieces of `len` elements in
    /// `pieces`, added in f32 in local rank order (the first piece, then each next).
    fn host_sum(&self, len: usize) -> Vec<f32> {
        let el = self.dtype.size();
        let b = self.pieces.bytes();
        let mut acc = vec![0f32; len];
        for k in 0..self.lay.l.per_host() {
            with_f32(self.dtype, &b[k * len * el..(k + 1) * len * el], |x| {
                if k == 0 {
                    acc.copy_from_slice(x);
                } else {
                    acc.iter_mut().zip(x).for_each(|(a, v)| *a += *v);
                }
            });
        }
        acc
    }

    /// The owner's codes of each of its segments from every host's codes of them (in `got`),
    /// with the segments' indices in the lane.
    fn reduce_own(&self) -> Result<Vec<(usize, Vec<u8>)>> {
        let (k, g) = (self.lay.lane(), self.lay.l.at);
        let w = self.lay.own_wire();
        let base = self.lay.owned_wire(k, g).start;
        let got = self.got.bytes();
        self.lay
            .owned(k, g)
            .map(|i| {
                let s = &self.lay.lanes[k][i];
                let o = s.wire.start - base;
                let parts: Vec<&[u8]> = (0..self.lay.l.hosts())
                    .map(|h| &got[h * w + o..h * w + o + s.wire.len()])
                    .collect();
                owner::reduce_segment(&self.codec, &parts, s.data.len(), self.avg).map(|c| (i, c))
            })
            .collect()
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
    /// plans and first exchange.
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
            t.seq = e.take_seqs(t.stages.len() as u32);
            log::debug!(
                "collective #{}: {:?} count {} compressed as {} in blocks of {} on the \
                 inter-host level only (ranks per host {:?}, {} lanes)",
                t.seq,
                call.kind,
                call.count,
                codec.format,
                codec.block,
                t.lay.l.sizes(),
                t.lay.l.width()
            );
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

    /// The layout of a tiered `call` and its buffers; AllGather's input quantized.
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
        let [pieces, codes, got, dec] = lay.buffers();
        let mut sig = Signature::of(&problem, TIERED_ALGO, dtype, call.op);
        sig.compress = Some((codec.format, codec.block));
        let mut t = Tiered {
            codec,
            dtype,
            avg: (call.op == RedOp::Avg).then_some(n),
            lay,
            stages: Vec::new(),
            at: 0,
            out: call.recv,
            pieces: pool.take(pieces),
            codes: pool.take(codes),
            got: pool.take(got),
            dec: pool.take(dec),
            seq: 0,
            sig,
        };
        if what == What::AllGather {
            // Its own segment's codes: where the lane's buffer holds them, or (extra) alone.
            let k = t.lay.lane();
            let s = t.lay.lanes[k].iter().find(|s| s.rank == rank);
            let wire = match (s, t.lay.l.extra()) {
                (Some(s), false) => s.wire.clone(),
                (Some(s), true) => 0..s.wire.len(),
                (None, _) => 0..0,
            };
            let len = s.map_or(0, |s| s.data.len());
            let inp = call.send.sub(0, len * el).expect("checked above");
            let codec = t.codec;
            let own = &mut t.codes.bytes_mut()[wire];
            inp.with(|b| with_f32(dtype, b, |v| codec.quantize(v, own)))?;
        }
        Ok(t)
    }

    /// The plans and regions of `t`'s exchanges, and the call's price logged at info.
    fn plan_tiered(&self, call: &Call, t: &mut Tiered) -> Result<()> {
        let (n, rank, el) = (self.nranks, self.rank, t.dtype.size());
        let [pieces_len, codes_len, got_len, dec_len] = t.lay.buffers();
        // SAFETY: `t` owns its buffers until its call ends, and a failed call's buffers go to
        // the communicator's graveyard with its executor's, so no region outlives them.
        let (pieces, codes, got, dec) = unsafe {
            (
                t.pieces.region(),
                t.codes.region(),
                t.got.region(),
                t.dec.region(),
            )
        };
        let sub = |r: Region, len: usize| r.sub(0, len).expect("buffers fit their layout");
        let (pieces, codes, got, dec) = (
            sub(pieces, pieces_len),
            sub(codes, codes_len),
            sub(got, got_len),
            sub(dec, dec_len),
        );
        let out_len = t.lay.out_elems() * el;
        let out = sub(t.out, out_len);
        let inp = sub(call.send, t.lay.in_elems() * el);
        let what = t.lay.what;
        for &stage in Stage::of(what, t.lay.l.uneven()) {
            let (i, o) = match (stage, what) {
                (Stage::HostReduce, _) => (inp, pieces),
                (Stage::HostCodes, _) => (codes, codes),
                (Stage::LaneToOwners, _) => (codes, got),
                (Stage::LaneGather, What::AllReduce) => (got, codes),
                (Stage::LaneGather, _) => (codes, codes),
                (Stage::HostGather, What::ReduceScatter) => (dec, out),
                (Stage::HostGather, _) => (out, out),
            };
            let (group, p) = t.lay.pieces(stage);
            let s = lanes::exchange(n, rank, &group, &p)
                .map_err(|err| Error::Internal(format!("tiered {stage:?}: {err}")))?;
            let planned = self.planned(Arc::new(s), 1)?;
            t.stages.push((stage, planned, i, o));
        }
        if log::log_enabled!(log::Level::Info) {
            let exchanges = t
                .stages
                .iter()
                .map(|&(stage, ..)| {
                    let (ranks, piece) = t.lay.priced(stage);
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
                chunks: 1,
                exchanges,
                tiers: Some(sizes),
            };
            self.model
                .log_compressed(&price, self.uncompressed_price(call));
        }
        Ok(())
    }

    /// The executor of `t`'s next exchange, as request `id`; takes its sequence number.
    fn tiered_exchange(&self, t: &mut Tiered, id: u32, pool: &mut BufPool) -> Result<Box<Exec>> {
        let (_, planned, inp, out) = t.stages.get(t.at).cloned().ok_or_else(|| {
            Error::Internal(format!("tiered compressed call: no exchange {}", t.at))
        })?;
        let seq = t.seq;
        t.seq = t.seq.wrapping_add(1);
        self.byte_exchange(planned, (inp, out), seq, t.sig, id, pool)
    }

    /// After `t`'s exchange finished: the codec's work, then the next exchange's executor, or
    /// None when the call is done (its output written).
    pub(super) fn step_tiered(
        &self,
        t: &mut Tiered,
        id: u32,
        pool: &mut BufPool,
    ) -> Result<Option<Box<Exec>>> {
        let stage = t.stages[t.at].0;
        let k = t.lay.lane();
        // An extra rank's codec work is its quantizing at the start: the lanes do the rest.
        match stage {
            _ if t.lay.l.extra() => {}
            Stage::HostReduce => {
                let sum = t.host_sum(t.lay.total(k));
                let b = t.codes.bytes_mut();
                for s in &t.lay.lanes[k] {
                    t.codec
                        .quantize(&sum[s.pos.clone()], &mut b[s.wire.clone()])?;
                }
            }
            Stage::HostCodes | Stage::HostGather => {}
            Stage::LaneToOwners => {
                let sums = t.reduce_own()?;
                match t.lay.what {
                    What::AllReduce => {
                        let b = t.got.bytes_mut();
                        let mut at = 0;
                        for (_, c) in &sums {
                            b[at..at + c.len()].copy_from_slice(c);
                            at += c.len();
                        }
                    }
                    _ => {
                        // Its own segment into its output, an extra rank's to be handed on.
                        // SAFETY: `t.dec` is owned by `t` and no exchange runs on it now.
                        let dec = unsafe { t.dec.region() };
                        let handed: Vec<_> = t.lay.handed().collect();
                        for (i, c) in &sums {
                            let len = t.lay.lanes[k][*i].data.len();
                            match handed.iter().find(|h| h.1 == *i) {
                                Some((_, _, at)) => {
                                    decode_into(&t.codec, t.dtype, dec, at.clone(), c)?
                                }
                                None => decode_into(&t.codec, t.dtype, t.out, 0..len, c)?,
                            }
                        }
                    }
                }
            }
            Stage::LaneGather => {
                let codes = t.codes.bytes();
                for s in &t.lay.lanes[k] {
                    decode_into(
                        &t.codec,
                        t.dtype,
                        t.out,
                        s.data.clone(),
                        &codes[s.wire.clone()],
                    )?;
                }
            }
        }
        t.at += 1;
        if t.at == t.stages.len() {
            return Ok(None);
        }
        self.tiered_exchange(t, id, pool).map(Some)
    }
}

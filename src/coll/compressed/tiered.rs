//! Compressing the inter-host level only (docs/compression.md, "Levels"): on a communicator
//! whose hosts each hold the same number L >= 2 of ranks, over H >= 2 hosts, shared memory
//! carries the data in full precision and only the exchanges among the ranks of one lane (the
//! rank of each host with the same local index, `algo::lanes`) carry codes:
//!
//! - AllReduce: the count is cut into L slices of whole blocks (`owner::segments`), slice k
//!   the lane k's. (1) Inside each host, every rank sends slice k of its input to the host's
//!   rank k, which sums the L pieces in f32 in local rank order (the first piece, then each
//!   next added): the host's partial sum of its slice, in full precision. (2) Among the lane,
//!   the owner rule of `compress::owner` on that partial sum: the slice is cut into H segments
//!   of whole blocks, each rank quantizes its partial sum once and sends each segment's codes
//!   to its owner, which adds the H dequantized contributions in host order in f32, divides by
//!   the communicator's rank count for Avg and quantizes the sum once; (3) every rank of the
//!   lane decodes every owner's codes into its output (rounded once to bf16 or f16 data), and
//!   (4) the host's ranks hand each other their decoded slices as they are.
//! - ReduceScatter: (1) inside each host, the host's rank k receives from every host rank the
//!   blocks of lane k's ranks (H blocks) and sums them as above; (2) among the lane, the owner
//!   rule on those sums, each owner decoding its own block.
//! - AllGather: (1) among the lane, each rank's input quantized once, the codes gathered and
//!   decoded by every lane rank, its own included; (2) inside each host, the decoded blocks
//!   handed on as they are.
//!
//! So each element is quantized at most twice whatever L and H, every rank's result is the
//! same bits (every rank decodes the same codes, or copies what was decoded), and NaN and
//! infinities survive (a full-precision sum keeps them, and the codec marks their blocks).
//! Every exchange is an ordinary executor of an `algo::lanes` schedule among its group (no
//! message to the other ranks), one request of the engine's table as any compressed call, so
//! abort, destroy, deadlines and a peer's failure act on it as on any collective; no
//! communicator is split. Its messages carry the call's signature with the format and the
//! algorithm `hier` (`TIERED_ALGO`): a rank that runs the call compressed on every level fails
//! against one that runs this composition, naming the algorithm.
use super::convert::{decode_into, with_f32};
use super::What;
use crate::algo::lanes::{self, Lanes, Pieces};
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
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The algorithm a tiered call's signature names.
pub(super) const TIERED_ALGO: Algorithm = Algorithm::Hier;

/// One exchange of a tiered call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Inside the host: the data's pieces to the rank that sums them.
    HostReduce,
    /// Among the lane: each segment's codes to its owner.
    LaneToOwners,
    /// Among the lane: every owner's codes to every rank.
    LaneGather,
    /// Inside the host: the decoded results to every rank.
    HostGather,
}

impl Stage {
    fn of(what: What) -> &'static [Stage] {
        match what {
            What::AllReduce => &[
                Stage::HostReduce,
                Stage::LaneToOwners,
                Stage::LaneGather,
                Stage::HostGather,
            ],
            What::ReduceScatter => &[Stage::HostReduce, Stage::LaneToOwners],
            What::AllGather => &[Stage::LaneGather, Stage::HostGather],
        }
    }

    fn tier(self) -> Tier {
        match self {
            Stage::HostReduce | Stage::HostGather => Tier::Host,
            _ => Tier::Lane,
        }
    }

    fn coll(self) -> Collective {
        match self {
            Stage::HostReduce | Stage::LaneToOwners => Collective::AllToAll,
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

/// The exchanges of a tiered call of `call`'s collective, in order, as
/// `Comm::exchange_algos` reports them.
pub(super) fn exchange_algos(call: &Call) -> Vec<(Collective, Algorithm)> {
    let what = match call.kind {
        Kind::Coll(Collective::AllReduce) => What::AllReduce,
        Kind::Coll(Collective::ReduceScatter) => What::ReduceScatter,
        _ => What::AllGather,
    };
    Stage::of(what)
        .iter()
        .map(|s| (s.coll(), s.algo()))
        .collect()
}

/// A tiered compressed call in progress: its layout, its exchanges' plans and regions, and
/// the buffers they run on, owned until the call ends (on failure they go to the graveyard).
pub(in crate::coll) struct Tiered {
    what: What,
    codec: Codec,
    dtype: DataType,
    /// Avg's divisor: the communicator's rank count.
    avg: Option<usize>,
    lanes: Lanes,
    /// NCCL's count.
    count: usize,
    /// AllReduce: every lane's slice of the count. Others: unused.
    slices: Vec<Range<usize>>,
    /// The lane members' segments of this rank's slice (AllReduce) or of its lane's blocks
    /// (ReduceScatter: block g of `count` elements), in elements of the slice or blocks.
    segs: Vec<Range<usize>>,
    /// Where each segment's codes lie in the lane's buffers.
    wire: Vec<Range<usize>>,
    /// The exchanges in order, with their plans and (input, output) regions; `at` the next.
    stages: Vec<(Stage, Planned, Region, Region)>,
    at: usize,
    out: Region,
    /// The host's pieces (HostReduce's output), the lane's codes of every segment, and this
    /// rank's segment's codes from every host (or its own codes).
    pieces: Scratch,
    codes: Scratch,
    got: Scratch,
    seq: u32,
    sig: Signature,
}

impl Tiered {
    /// The buffers, for the pool (done) or the graveyard (failed).
    pub(in crate::coll) fn into_buffers(self) -> Vec<Scratch> {
        vec![self.pieces, self.codes, self.got]
    }

    /// Bytes of this rank's segment's codes.
    fn own_wire(&self) -> usize {
        self.wire[self.lanes.at].len()
    }

    /// The host's partial sum of this rank's share: the L pieces of `len` elements in
    /// `pieces`, added in f32 in local rank order (the first piece, then each next).
    fn host_sum(&self, len: usize) -> Vec<f32> {
        let el = self.dtype.size();
        let b = self.pieces.bytes();
        let mut acc = vec![0f32; len];
        for k in 0..self.lanes.per_host() {
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

    /// The owner's codes of its segment from every host's codes of it (in `got`).
    fn reduce_own(&self) -> Result<Vec<u8>> {
        let w = self.own_wire();
        let got = self.got.bytes();
        let parts: Vec<&[u8]> = (0..self.lanes.hosts())
            .map(|g| &got[g * w..(g + 1) * w])
            .collect();
        let len = self.segs[self.lanes.at].len();
        owner::reduce_segment(&self.codec, &parts, len, self.avg)
    }
}

impl Comm {
    /// The lanes of a call compressed on the inter-host level only, None to compress every
    /// level: with `FABRICOLL_COMPRESS_LEVELS=all`, on one host, with one rank per host, for
    /// the V collectives, and on hosts of different sizes (said once at info).
    pub(super) fn tiers(&self, call: &Call) -> Option<Lanes> {
        if self.compress_levels == CompressLevels::All || !matches!(call.kind, Kind::Coll(_)) {
            return None;
        }
        let lanes = Lanes::of(self.hosts, self.nranks, self.rank);
        if lanes.is_none()
            && self.hosts.count() > 1
            && self.hosts.even(self.nranks).is_none()
            && !self.tier_fallback_logged.swap(true, Ordering::Relaxed)
        {
            log::info!(
                "compressed collectives on hosts of different sizes (ranks per host {:?}) \
                 compress every level, shared memory included: compressing the inter-host \
                 level only needs the same number of ranks on every host",
                self.hosts.sizes(self.nranks)
            );
        }
        lanes
    }

    /// Start the uniform `call` compressed on the inter-host level only, as request `id`: its
    /// layout, plans and first exchange.
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
                 inter-host level only ({} hosts x {} ranks)",
                t.seq,
                call.kind,
                call.count,
                codec.format,
                codec.block,
                t.lanes.hosts(),
                t.lanes.per_host()
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
        let (n, dtype, c) = (self.nranks, call.dtype, call.count);
        let (x, y, j) = (lanes.hosts(), lanes.per_host(), lanes.local);
        let Kind::Coll(coll) = call.kind else {
            return Err(Error::Internal("not a uniform collective".into()));
        };
        let problem = call.problem(coll, n)?;
        let (what, in_elems, out_elems) = match coll {
            Collective::AllReduce => (What::AllReduce, c, c),
            Collective::ReduceScatter => (What::ReduceScatter, c * n, c),
            Collective::AllGather => (What::AllGather, c, c * n),
            _ => return Err(Error::Internal("not a compressed collective".into())),
        };
        let el = dtype.size();
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
        let (slices, segs) = match what {
            What::AllReduce => {
                let slices = owner::segments(&codec, c, y);
                let segs = owner::segments(&codec, slices[j].len(), x);
                (slices, segs)
            }
            _ => (Vec::new(), (0..x).map(|g| g * c..(g + 1) * c).collect()),
        };
        let wire = owner::wire_ranges(&codec, &segs);
        let total = wire.last().map_or(0, |w| w.end);
        let w = wire[lanes.at].len();
        let (pieces, got) = match what {
            What::AllReduce => (y * slices[j].len() * el, x * w),
            What::ReduceScatter => (y * x * c * el, x * w),
            What::AllGather => (0, w),
        };
        let mut sig = Signature::of(&problem, TIERED_ALGO, dtype, call.op);
        sig.compress = Some((codec.format, codec.block));
        let mut t = Tiered {
            what,
            codec,
            dtype,
            avg: (call.op == RedOp::Avg).then_some(n),
            lanes,
            count: c,
            slices,
            segs,
            wire,
            stages: Vec::new(),
            at: 0,
            out: call.recv,
            pieces: pool.take(pieces),
            codes: pool.take(total),
            got: pool.take(got),
            seq: 0,
            sig,
        };
        if what == What::AllGather {
            let inp = call.send.sub(0, c * el).expect("checked above");
            let codec = t.codec;
            let own = &mut t.got.bytes_mut()[..w];
            inp.with(|b| with_f32(dtype, b, |v| codec.quantize(v, own)))?;
        }
        Ok(t)
    }

    /// The plans and regions of `t`'s exchanges, and the call's price logged at info.
    fn plan_tiered(&self, call: &Call, t: &mut Tiered) -> Result<()> {
        let (n, rank, el) = (self.nranks, self.rank, t.dtype.size());
        let l = t.lanes.clone();
        let (x, y, j, c) = (l.hosts(), l.per_host(), l.local, t.count);
        let w = t.own_wire();
        // SAFETY: `t` owns its buffers until its call ends, and a failed call's buffers go to
        // the communicator's graveyard with its executor's, so no region outlives them.
        let (pieces, codes, got) = unsafe { (t.pieces.region(), t.codes.region(), t.got.region()) };
        let sub = |r: Region, len: usize| r.sub(0, len).expect("buffers fit their layout");
        let total = t.wire.last().map_or(0, |r| r.end);
        let bytes = |r: &Range<usize>| (r.start * el, r.len() * el);
        let mut exchanges = Vec::new();
        for &stage in Stage::of(t.what) {
            let (group, p, inp, out, piece) = match (stage, t.what) {
                (Stage::HostReduce, What::AllReduce) => {
                    let len = t.slices[j].len() * el;
                    let p = Pieces {
                        send: t.slices.iter().map(|s| vec![bytes(s)]).collect(),
                        recv: (0..y).map(|k| vec![(k * len, len)]).collect(),
                    };
                    (
                        &l.host,
                        p,
                        sub(call.send, c * el),
                        sub(pieces, y * len),
                        len,
                    )
                }
                (Stage::HostReduce, _) => {
                    // Lane k's blocks of the input, host by host.
                    let b = c * el;
                    let p = Pieces {
                        send: l
                            .lanes
                            .iter()
                            .map(|lane| lane.iter().map(|&r| (r * b, b)).collect())
                            .collect(),
                        recv: (0..y)
                            .map(|k| (0..x).map(|g| ((k * x + g) * b, b)).collect())
                            .collect(),
                    };
                    (
                        &l.host,
                        p,
                        sub(call.send, n * b),
                        sub(pieces, y * x * b),
                        x * b,
                    )
                }
                (Stage::LaneToOwners, _) => {
                    let p = Pieces {
                        send: t.wire.iter().map(|r| vec![(r.start, r.len())]).collect(),
                        recv: (0..x).map(|g| vec![(g * w, w)]).collect(),
                    };
                    (&l.lane, p, sub(codes, total), sub(got, x * w), w)
                }
                (Stage::LaneGather, _) => {
                    let p = Pieces {
                        send: vec![vec![(0, w)]; x],
                        recv: t.wire.iter().map(|r| vec![(r.start, r.len())]).collect(),
                    };
                    (&l.lane, p, sub(got, w), sub(codes, total), w)
                }
                (Stage::HostGather, What::AllReduce) => {
                    let mut p = Pieces {
                        send: vec![vec![bytes(&t.slices[j])]; y],
                        recv: t.slices.iter().map(|s| vec![bytes(s)]).collect(),
                    };
                    // Its own slice is in place already.
                    (p.send[j], p.recv[j]) = (Vec::new(), Vec::new());
                    let out = sub(t.out, c * el);
                    (&l.host, p, out, out, t.slices[j].len() * el)
                }
                (Stage::HostGather, _) => {
                    let b = c * el;
                    let blocks = |k: usize| -> Vec<(usize, usize)> {
                        l.lanes[k].iter().map(|&r| (r * b, b)).collect()
                    };
                    let mut p = Pieces {
                        send: vec![blocks(j); y],
                        recv: (0..y).map(blocks).collect(),
                    };
                    (p.send[j], p.recv[j]) = (Vec::new(), Vec::new());
                    let out = sub(t.out, n * b);
                    (&l.host, p, out, out, x * b)
                }
            };
            let s = lanes::exchange(n, rank, group, &p)
                .map_err(|err| Error::Internal(format!("tiered {stage:?}: {err}")))?;
            let planned = self.planned(Arc::new(s), 1)?;
            let lanes_sharing = if stage.tier() == Tier::Lane { y } else { 1 };
            let us = self.model.tier_exchange_us(
                stage.tier(),
                stage.coll(),
                stage.algo(),
                group.len(),
                piece,
                lanes_sharing,
            );
            exchanges.push(Exchange {
                coll: stage.coll(),
                bytes: piece,
                algo: stage.algo(),
                us,
                level: Some(stage.tier()),
            });
            t.stages.push((stage, planned, inp, out));
        }
        if log::log_enabled!(log::Level::Info) {
            let shape = match t.what {
                What::AllReduce => Shape::AllReduce,
                What::ReduceScatter => Shape::ReduceScatter,
                What::AllGather => Shape::AllGather,
            };
            let price = CompressedPrice {
                shape,
                format: t.codec.format,
                block: t.codec.block,
                nranks: n,
                count: c,
                elem: el,
                codec_us: tune::codec_us_tiered(t.codec.format, shape, x, y, c),
                exchanges,
                tiers: Some((x, y)),
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
        let (x, j, c) = (t.lanes.hosts(), t.lanes.local, t.count);
        match stage {
            Stage::HostReduce => {
                let len = match t.what {
                    What::AllReduce => t.slices[j].len(),
                    _ => x * c,
                };
                let sum = t.host_sum(len);
                let b = t.codes.bytes_mut();
                for (s, w) in t.segs.iter().zip(&t.wire) {
                    t.codec.quantize(&sum[s.clone()], &mut b[w.clone()])?;
                }
            }
            Stage::LaneToOwners => {
                let codes = t.reduce_own()?;
                match t.what {
                    What::AllReduce => t.got.bytes_mut()[..codes.len()].copy_from_slice(&codes),
                    _ => {
                        decode_into(&t.codec, t.dtype, t.out, 0..c, &codes)?;
                        return Ok(None);
                    }
                }
            }
            Stage::LaneGather => {
                let codes = t.codes.bytes();
                for (g, w) in t.wire.iter().enumerate() {
                    let at = match t.what {
                        What::AllReduce => t.slices[j].start + t.segs[g].start,
                        _ => t.lanes.lane[g] * c,
                    };
                    decode_into(
                        &t.codec,
                        t.dtype,
                        t.out,
                        at..at + t.segs[g].len(),
                        &codes[w.clone()],
                    )?;
                }
            }
            Stage::HostGather => return Ok(None),
        }
        t.at += 1;
        self.tiered_exchange(t, id, pool).map(Some)
    }
}

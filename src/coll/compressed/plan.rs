//! A compressed call's exchanges: which algorithm runs each (the call's forced one where it
//! implements the exchange's collective, else as an uncompressed exchange of those bytes would),
//! their plans, and the call's price (`tune::CompressedPrice`), logged at info.
use super::flat::{chunk_cut, chunk_parts, chunk_wire, Flat};
use super::{Stage, What};
use crate::algo::varied::{self, Spec};
use crate::algo::{self, Collective, Problem};
use crate::coll::call::algo_arg;
use crate::coll::engine::Engine;
use crate::coll::{Call, Comm, Kind};
use crate::compress::{owner, Codec};
use crate::error::{Error, Result};
use crate::tune::{self, CompressedPrice, Exchange, Shape};
use std::sync::Arc;

impl Comm {
    /// The exchange of `coll` (AllToAll or AllGather) of `stride` bytes per rank of a call of
    /// `own` with the per-call algorithm `per_call`: its problem, algorithm and options. The
    /// call's forced algorithm where it implements `coll`; else as an uncompressed `coll` of
    /// these bytes would run (the communicator's setting for `coll`, else the cost model).
    fn exchange_choice(
        &self,
        own: Collective,
        coll: Collective,
        stride: usize,
        per_call: Option<algo::Algorithm>,
    ) -> Result<(Problem, algo::Algorithm, algo::Options)> {
        let prob = Problem::new(coll, self.nranks, stride);
        let forced = self
            .forced_for(own, per_call)
            .filter(|a| algo::supports(*a, coll));
        let (a, o) = self.choose(&prob, 1, forced)?;
        Ok((prob, a, o))
    }

    /// The collective and algorithm of each exchange of the uniform collective `call`
    /// (AllReduce, ReduceScatter, AllGather; a V collective too where the inter-host level
    /// alone is compressed) compressed with `codec`, in the order they run: what
    /// `fabricoll-perf` prints and the tests check.
    pub fn exchange_algos(
        &self,
        call: &Call,
        codec: Codec,
    ) -> Result<Vec<(Collective, algo::Algorithm)>> {
        let n = self.nranks;
        if let Some(lanes) = self.tiers(call) {
            return Ok(super::tiered::exchange_algos(call, &lanes));
        }
        let Kind::Coll(own) = call.kind else {
            return Err(Error::arg(
                "kind",
                "only uniform collectives have uniform exchanges",
            ));
        };
        let (counts, colls): (Vec<usize>, &[Collective]) = match own {
            Collective::AllReduce => (
                owner::segments(&codec, call.count, n)
                    .iter()
                    .map(|s| s.len())
                    .collect(),
                &[Collective::AllToAll, Collective::AllGather],
            ),
            Collective::ReduceScatter => (vec![call.count; n], &[Collective::AllToAll]),
            Collective::AllGather => (vec![call.count; n], &[Collective::AllGather]),
            c => return Err(Error::arg("coll", format!("{c:?} is not compressed"))),
        };
        // The first chunk's, the largest: every chunk's exchanges run alike.
        let (per, _) = chunk_cut(&codec, &counts, call.dtype.size(), self.compress_chunk);
        let (_, stride) = chunk_wire(&codec, &chunk_parts(&counts, per, 0), true);
        let stride = stride.unwrap_or(0);
        colls
            .iter()
            .map(|&c| Ok((c, self.exchange_choice(own, c, stride, call.algo)?.1)))
            .collect()
    }

    /// The plans of each chunk's exchanges (`Chunk::plans`), and the call's price logged at
    /// info.
    pub(super) fn plan_exchanges(&self, e: &mut Engine, call: &Call, p: &mut Flat) -> Result<()> {
        let n = self.nranks;
        let mut exchanges = Vec::new();
        for k in 0..p.chunks.len() {
            for &stage in p.stages() {
                let coll = match stage {
                    Stage::ToOwners => Collective::AllToAll,
                    Stage::Gather => Collective::AllGather,
                };
                let c = &p.chunks[k];
                let (planned, x) = match (c.stride, call.kind) {
                    (Some(stride), Kind::Coll(own)) => {
                        let (prob, a, o) = self.exchange_choice(own, coll, stride, call.algo)?;
                        let us = (k == 0)
                            .then(|| self.model.predict_on(a, &prob, 1, &o))
                            .flatten();
                        let planned = self.schedule(e, prob, a, o, 1)?;
                        (planned, (a, stride, us))
                    }
                    _ => {
                        let blocks: Vec<(usize, usize)> =
                            c.wire.iter().map(|w| (w.start, w.len())).collect();
                        let own = c.slot(p.rank);
                        let spec = match stage {
                            Stage::ToOwners => Spec::AllToAllV {
                                send: blocks,
                                recv: (0..n).map(|r| (r * own, own)).collect(),
                            },
                            Stage::Gather => Spec::AllGatherV { blocks },
                        };
                        let s = varied::schedule(n, &[(self.rank, &spec)]).map_err(algo_arg)?;
                        let planned = self.planned(Arc::new(s), 1)?;
                        // Priced as the uniform collective of the average piece.
                        let a = planned.schedule.algo;
                        let avg = c.total() / n.max(1);
                        let us = (k == 0)
                            .then(|| self.model.predict(a, &Problem::new(coll, n, avg), 1))
                            .flatten();
                        (planned, (a, avg, us))
                    }
                };
                p.chunks[k].plans.push(planned);
                if k == 0 {
                    exchanges.push(Exchange {
                        coll,
                        bytes: x.1,
                        algo: x.0,
                        us: x.2,
                        level: None,
                    });
                }
            }
        }
        if log::log_enabled!(log::Level::Info) {
            self.log_price(call, p, exchanges);
        }
        Ok(())
    }

    /// Log the price of `p` (its first chunk's `exchanges`, every chunk alike, and the
    /// codec) with the uncompressed call's.
    fn log_price(&self, call: &Call, p: &Flat, exchanges: Vec<Exchange>) {
        let n = self.nranks;
        let all: usize = p.counts.iter().sum();
        let (shape, count) = match p.what {
            What::AllReduce => (Shape::AllReduce, all),
            What::ReduceScatter => (Shape::ReduceScatter, all / n.max(1)),
            What::AllGather => (Shape::AllGather, all / n.max(1)),
        };
        let rate = super::rate::measured_rate(p.codec.format);
        let price = CompressedPrice {
            shape,
            format: p.codec.format,
            block: p.codec.block,
            nranks: n,
            count,
            elem: p.dtype.size(),
            codec_us: rate.us(tune::codec_elements(shape, n, count)),
            rate,
            exchanges,
            chunks: p.chunks.len(),
            tiers: None,
        };
        self.model
            .log_compressed(&price, self.uncompressed_price(call));
    }

    /// The algorithm the uncompressed `call` would run and its prediction (None: a varied
    /// call, or no prediction), for the compressed call's log line.
    pub(super) fn uncompressed_price(&self, call: &Call) -> Option<(algo::Algorithm, f64)> {
        let elem = call.dtype.size();
        match call.kind {
            Kind::Coll(coll) => call.problem(coll, self.nranks).ok().and_then(|prob| {
                let (a, o) = self.choose(&prob, elem, call.algo).ok()?;
                Some((a, self.model.predict_on(a, &prob, elem, &o)?))
            }),
            _ => None,
        }
    }
}

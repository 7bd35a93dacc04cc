//! A compressed call's exchanges: which algorithm runs each (the call's forced one where it
//! implements the exchange's collective, else as an uncompressed exchange of those bytes would),
//! their plans, and the call's price (`tune::CompressedPrice`), logged at info.
use super::{Flat, Stage, What};
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
        let (stride, colls): (usize, &[Collective]) = match own {
            Collective::AllReduce => (
                owner::segments(&codec, call.count, n)
                    .iter()
                    .map(|s| codec.wire_len(s.len()))
                    .max()
                    .unwrap_or(0),
                &[Collective::AllToAll, Collective::AllGather],
            ),
            Collective::ReduceScatter => (codec.wire_len(call.count), &[Collective::AllToAll]),
            Collective::AllGather => (codec.wire_len(call.count), &[Collective::AllGather]),
            c => return Err(Error::arg("coll", format!("{c:?} is not compressed"))),
        };
        colls
            .iter()
            .map(|&c| Ok((c, self.exchange_choice(own, c, stride, call.algo)?.1)))
            .collect()
    }

    /// The plans of `p`'s exchanges (`p.plans`), and the call's price logged at info.
    pub(super) fn plan_exchanges(&self, e: &mut Engine, call: &Call, p: &mut Flat) -> Result<()> {
        let n = self.nranks;
        let mut exchanges = Vec::new();
        for &stage in p.stages() {
            let coll = match stage {
                Stage::ToOwners => Collective::AllToAll,
                Stage::Gather => Collective::AllGather,
            };
            let (planned, x) = match (p.stride, call.kind) {
                (Some(stride), Kind::Coll(own)) => {
                    let (prob, a, o) = self.exchange_choice(own, coll, stride, call.algo)?;
                    let us = self.model.predict_on(a, &prob, 1, &o);
                    let planned = self.schedule(e, prob, a, o, 1)?;
                    (planned, (a, stride, us))
                }
                _ => {
                    let blocks: Vec<(usize, usize)> =
                        p.wire.iter().map(|w| (w.start, w.len())).collect();
                    let own = p.slot();
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
                    let avg = p.total() / n.max(1);
                    let prob = Problem::new(coll, n, avg);
                    let us = self.model.predict(a, &prob, 1);
                    (planned, (a, avg, us))
                }
            };
            p.plans.push(planned);
            exchanges.push(Exchange {
                coll,
                bytes: x.1,
                algo: x.0,
                us: x.2,
                level: None,
            });
        }
        if log::log_enabled!(log::Level::Info) {
            self.log_price(call, p, exchanges);
        }
        Ok(())
    }

    /// Log the price of `p` (its `exchanges` and the codec) with the uncompressed call's.
    fn log_price(&self, call: &Call, p: &Flat, exchanges: Vec<Exchange>) {
        let n = self.nranks;
        let (shape, count) = match p.what {
            What::AllReduce => (Shape::AllReduce, p.segs.last().map_or(0, |s| s.end)),
            What::ReduceScatter => (
                Shape::ReduceScatter,
                p.segs.last().map_or(0, |s| s.end) / n.max(1),
            ),
            What::AllGather => (
                Shape::AllGather,
                p.segs.last().map_or(0, |s| s.end) / n.max(1),
            ),
        };
        let price = CompressedPrice {
            shape,
            format: p.codec.format,
            block: p.codec.block,
            nranks: n,
            count,
            elem: p.dtype.size(),
            codec_us: tune::codec_us(p.codec.format, shape, n, count),
            exchanges,
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

//! Two-level compositions priced per level (the Hierarchical notes of algorithms.md): X hosts,
//! at most Y ranks each, at least L (the inter-host groups: L of them run at once, each on 1/L
//! of the data, sharing every host's link). Each phase is the one-level formula of its
//! algorithm on its level's link, plus its rendezvous:
//! - AllReduce: intra ReduceScatter (Y, B) + inter AllReduce (X, B/L) + intra AllGather (Y, B);
//! - AllGather: inter AllGather (X, B/L) + intra AllGather (Y, B), B the whole output;
//! - ReduceScatter: intra ReduceScatter (Y, B) + inter ReduceScatter (X, B/L), B the input;
//! - Broadcast: inter (X, B, one group) + intra (Y, B); Reduce the reverse.
//!
//! The AllReduce's lanes run their inter phase together, or apart where its intra phase ends
//! at different times on a host's ranks (`Net::lanes`).
//!
//! The AllGather's and ReduceScatter's intra phase runs one intra collective per host of the
//! vector's blocks, all at once: the longer of one collective of B and the rank's CPU work.
//!
//! The node-swizzled ReduceScatter runs X steps, each an intra ReduceScatter of the part
//! destined for one host (B/X), then sends that part's reduced slice (B/n per rank, Y ranks of
//! a host sending at once to one other host); the rank's CPU posts, handles and reduces the
//! slices across between the local phases' steps: `t_rs + max((X-1) (t_rs + t_cpu), (X-1)
//! t_wire + alpha)`, then the slices are reduced; its mirror AllGather likewise without
//! reductions.
#![forbid(unsafe_code)]

use super::levels::{Layout, Link, Net};
use super::{eager_alphas, formula, pipeline_fill};
use crate::algo::{self, Algorithm, Collective};

/// Which level a part of a prediction ran on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Level {
    Intra,
    Inter,
}

/// A candidate and its predicted time: a flat algorithm (no parts), a hierarchy (its phases)
/// or a swizzle (its intra and inter totals, overlapped).
#[derive(Clone, Copy, Debug)]
pub(super) struct Priced {
    pub algo: Algorithm,
    pub intra: Algorithm,
    pub inter: Algorithm,
    pub us: f64,
    pub parts: [(Level, f64); 3],
    pub nparts: usize,
}

impl Priced {
    pub fn flat(algo: Algorithm, us: f64) -> Priced {
        Priced {
            algo,
            intra: Algorithm::Ring,
            inter: Algorithm::Ring,
            us,
            parts: [(Level::Intra, 0.0); 3],
            nparts: 0,
        }
    }

    /// The candidate and its prediction for the log, per level where it has levels: the
    /// algorithm (with its levels), the total, and each phase's share.
    pub fn describe(&self) -> String {
        let name = match self.algo {
            Algorithm::Hier => format!("hier({} x {})", self.intra, self.inter),
            Algorithm::Swizzle => format!("swizzle({})", self.intra),
            a => a.to_string(),
        };
        if self.nparts == 0 {
            return format!("{name} {:.1} us", self.us);
        }
        let parts: Vec<String> = self.parts[..self.nparts]
            .iter()
            .map(|(l, t)| {
                let l = if *l == Level::Intra { "intra" } else { "inter" };
                format!("{l} {t:.1}")
            })
            .collect();
        let sep = if self.algo == Algorithm::Swizzle {
            " overlapped with "
        } else {
            " + "
        };
        format!("{name} {:.1} us = {}", self.us, parts.join(sep))
    }
}

/// The algorithms a level can run: every flat one.
pub(super) fn flats() -> impl Iterator<Item = Algorithm> {
    Algorithm::ALL
        .into_iter()
        .filter(|a| !matches!(a, Algorithm::Hier | Algorithm::Swizzle))
}

impl Net {
    /// One phase: `algo` running `coll` on `n` ranks over `link` with a whole vector of `big`
    /// bytes (nothing on one rank); None if `algo` does not implement `coll`.
    pub(super) fn phase(
        &self,
        link: Link,
        algo: Algorithm,
        coll: Collective,
        n: usize,
        big: f64,
    ) -> Option<f64> {
        if !algo::supports(algo, coll) {
            return None;
        }
        if n <= 1 {
            return Some(0.0);
        }
        let l = &link;
        let t = formula(
            algo,
            coll,
            n as f64,
            big,
            (l.alpha_us, l.beta_us_per_byte, l.o_us, self.gamma),
        )?;
        let fill = pipeline_fill(
            algo,
            coll,
            n as f64,
            big,
            self.slice,
            (l.alpha_us, l.beta_us_per_byte, l.o_us, self.gamma),
        );
        let (extra, _) = eager_alphas(algo, coll, n, big, l.eager_bytes, self.serial);
        Some(t + fill + extra * l.alpha_us)
    }

    /// The two-level AllGather's (and ReduceScatter's) intra-host phase: the plan runs one
    /// `intra` collective per host of the vector's blocks (`algo::hier`), all at once, so the
    /// bytes are those of one collective of the whole vector (`single`), but each rank sends
    /// `x` times the messages and receives as many, each its CPU cost `o` at either end. The
    /// collectives fill each other's waits (alphas, bytes), so the phase takes the longer of
    /// `single` and the rank's CPU work: the `2 x` messages per message of one collective and
    /// the ReduceScatter's reductions of `(y-1)/y` of the vector.
    fn per_host_phase(
        &self,
        intra: Algorithm,
        coll: Collective,
        (x, y): (usize, usize),
        big: f64,
        single: f64,
    ) -> f64 {
        if x <= 1 || y <= 1 {
            return single;
        }
        let msgs: f64 = super::rounds(intra, coll, y, big / x as f64)
            .iter()
            .map(|&(count, per_round, _)| count * per_round)
            .sum();
        let red = if coll == Collective::ReduceScatter {
            (y - 1) as f64 / y as f64 * big * self.gamma
        } else {
            0.0
        };
        single.max(2.0 * x as f64 * msgs * self.intra.o_us + red)
    }

    /// What the two-level AllGather's inter-host `rdh` costs beyond `phase`: a lane's blocks
    /// lie apart in the output (one per host, `y` blocks apart), so its doubling round `s`
    /// sends `2^s` messages, one per block (`algo::rdh`, a piece per unit), where `formula`
    /// counts one. The rank posts them while their bytes flow and handles as many received,
    /// one of them inside the round's alpha: the round takes `max(2^s o, bytes) + (2^s - 1) o`
    /// beyond its alpha, `bytes` the round's share of the lane's vector `share` over `link`.
    fn strided_doubling(&self, link: Link, x: usize, share: f64) -> f64 {
        let p = 1usize << x.ilog2();
        let o = link.o_us;
        (0..p.trailing_zeros())
            .map(|s| {
                let k = f64::from(1u32 << s);
                let bytes = share * k / x as f64 * link.beta_us_per_byte;
                (k * o - bytes).max(0.0) + (k - 1.0) * o
            })
            .sum()
    }

    /// The AllReduce's inter-host phase, after its intra-host ReduceScatter: `lanes` lanes of
    /// `x` members each run `inter` on `share` bytes (a rank's part), sharing every host's
    /// link. Where the intra phase ends at one time on every rank of a host (rdh, the rings:
    /// the same rounds on every rank), the lanes run their rounds together: each round an
    /// alpha and the lanes' bytes at a `lanes`-th of the link (`phase` on the shared link).
    /// Where it ends at different times (`ends_apart`) and the lanes run `rdh`, a lane that
    /// enters first runs its large first rounds ahead of the others and stays ahead: while
    /// one waits out its alpha, the others' bytes use the link (as Bruck's rounds,
    /// `levels::Net::bruck`). The phase is then the longer of one lane's chain (alone on the
    /// link) and every lane's bytes and reductions (the shared link without alphas) one alpha
    /// after them, if that is shorter. Other inter algorithms stay priced together: a ring's
    /// lanes, whose steps are all alike, stay near step.
    fn lanes(
        &self,
        intra: Algorithm,
        inter: Algorithm,
        coll: Collective,
        (x, lanes): (usize, usize),
        share: f64,
    ) -> Option<f64> {
        let net = self.inter.shared(lanes as f64);
        let together = self.phase(net, inter, coll, x, share)?;
        if !self.ends_apart(intra, lanes, share) || inter != Algorithm::Rdh || x <= 1 {
            return Some(together);
        }
        let chain = self.phase(self.inter, inter, coll, x, share)?;
        let unlatched = Link {
            alpha_us: 0.0,
            ..net
        };
        let bytes = self.phase(unlatched, inter, coll, x, share)? + net.alpha_us;
        Some(together.min(chain.max(bytes)))
    }

    /// Does the intra-host ReduceScatter by `intra` among `y` ranks, each keeping a part of
    /// `part` bytes, end at different times on a host's ranks? A `mesh` rank reduces its
    /// peers' parts in member order, and each part leaves at a different place in its
    /// sender's order. Where a part's reduction is quicker than the gap between two parts'
    /// arrivals (the rank posts one and handles one, `o` each, and the part's bytes come in
    /// through its link) every rank ends one reduction after its last part; where it is
    /// slower the reductions queue from the first part in member order on, and a rank whose
    /// first part came early ends early. The other algorithms run the same rounds on every
    /// rank.
    fn ends_apart(&self, intra: Algorithm, y: usize, part: f64) -> bool {
        let l = &self.intra;
        intra == Algorithm::Mesh
            && y > 1
            && part * self.gamma > 2.0 * l.o_us + part * l.beta_us_per_byte
    }

    /// Hierarchical `intra` x `inter` for `coll` with a whole vector of `big` bytes.
    pub fn hier(
        &self,
        coll: Collective,
        lay: &Layout,
        big: f64,
        intra: Algorithm,
        inter: Algorithm,
    ) -> Option<Priced> {
        use Collective::*;
        use Level::*;
        let (x, y, groups) = (lay.x(), lay.ymax(), lay.ymin());
        let net = self.inter.shared(groups as f64);
        let share = big / groups as f64;
        let i = |c: Collective| self.phase(self.intra, intra, c, y, big);
        let parts: Vec<(Level, f64)> = match coll {
            AllReduce => vec![
                (Intra, i(ReduceScatter)?),
                (
                    Inter,
                    self.lanes(intra, inter, AllReduce, (x, groups), share)?,
                ),
                (Intra, i(AllGather)?),
            ],
            AllGather => {
                let strided = if inter == Algorithm::Rdh && y > 1 {
                    self.strided_doubling(net, x, share)
                } else {
                    0.0
                };
                vec![
                    (
                        Inter,
                        self.phase(net, inter, AllGather, x, share)? + strided,
                    ),
                    (
                        Intra,
                        self.per_host_phase(intra, AllGather, (x, y), big, i(AllGather)?),
                    ),
                ]
            }
            ReduceScatter => vec![
                (
                    Intra,
                    self.per_host_phase(intra, ReduceScatter, (x, y), big, i(ReduceScatter)?),
                ),
                (Inter, self.phase(net, inter, ReduceScatter, x, share)?),
            ],
            Broadcast => vec![
                (Inter, self.phase(self.inter, inter, Broadcast, x, big)?),
                (Intra, i(Broadcast)?),
            ],
            Reduce => vec![
                (Intra, i(Reduce)?),
                (Inter, self.phase(self.inter, inter, Reduce, x, big)?),
            ],
            AllToAll => return None,
        };
        let mut p = Priced::flat(Algorithm::Hier, parts.iter().map(|p| p.1).sum());
        p.intra = intra;
        p.inter = inter;
        p.nparts = parts.len();
        p.parts[..parts.len()].copy_from_slice(&parts);
        Some(p)
    }

    /// The node-swizzled ReduceScatter (or its mirror AllGather) with `intra` inside hosts;
    /// AllReduce is the two in turn (the schedule runs them so).
    pub fn swizzle(
        &self,
        coll: Collective,
        lay: &Layout,
        big: f64,
        intra: Algorithm,
    ) -> Option<Priced> {
        if coll == Collective::AllReduce {
            let rs = self.swizzle(Collective::ReduceScatter, lay, big, intra)?;
            let ag = self.swizzle(Collective::AllGather, lay, big, intra)?;
            let mut p = Priced::flat(Algorithm::Swizzle, rs.us + ag.us);
            p.intra = intra;
            p.nparts = 2;
            p.parts[0] = (Level::Intra, rs.parts[0].1 + ag.parts[0].1);
            p.parts[1] = (Level::Inter, rs.parts[1].1 + ag.parts[1].1);
            return Some(p);
        }
        if !matches!(coll, Collective::ReduceScatter | Collective::AllGather) {
            return None;
        }
        let (x, y) = (lay.x() as f64, lay.ymax());
        let slice = big / lay.n() as f64;
        let local = self.phase(self.intra, intra, coll, y, big / x)?;
        let e = &self.inter;
        // One part's slices leave a host on its link one after the other.
        let wire = y as f64 * slice * e.beta_us_per_byte + e.rendezvous(1.0, slice, self.serial);
        // ReduceScatter: each partial that lands is reduced into the accumulator.
        let red = if coll == Collective::ReduceScatter {
            slice * self.gamma
        } else {
            0.0
        };
        // The local phases run one after the other on each rank, and its CPU also posts the
        // part it sends across and handles (and reduces) the one it receives, `o` each at the
        // network's level: that work falls between the local phases' steps and delays them
        // (AllGather: the network's messages are ready first and handled first, then the
        // parts' local phases follow in a row). No round is faster than its CPU's work, the
        // local phase's messages posted and handled at their level's `o`.
        let msgs: f64 = super::rounds(intra, coll, y, big / x)
            .iter()
            .map(|&(count, per_round, _)| count * per_round)
            .sum();
        let across = 2.0 * e.o_us + red;
        let cpu = 2.0 * msgs * self.intra.o_us + across;
        let chained = (x - 1.0) * (local + across).max(cpu);
        // Or the network: the parts leave in a row, the last lands `alpha` later and is reduced.
        let net = (x - 1.0) * wire + e.alpha_us + red;
        let total = local + chained.max(net) + red;
        let mut p = Priced::flat(Algorithm::Swizzle, total);
        p.intra = intra;
        p.nparts = 2;
        p.parts[0] = (Level::Intra, x * local);
        p.parts[1] = (Level::Inter, net);
        Some(p)
    }
}

//! Two-level compositions priced per level (the Hierarchical notes of algorithms.md): X hosts,
//! at most Y ranks each, at least L (the inter-host groups: L of them run at once, each on 1/L
//! of the data, sharing every host's link). Each phase is the one-level formula of its
//! algorithm on its level's link, plus its rendezvous:
//! - AllReduce: intra ReduceScatter (Y, B) + inter AllReduce (X, B/L) + intra AllGather (Y, B);
//! - AllGather: inter AllGather (X, B/L) + intra AllGather (Y, B), B the whole output;
//! - ReduceScatter: intra ReduceScatter (Y, B) + inter ReduceScatter (X, B/L), B the input;
//! - Broadcast: inter (X, B, one group) + intra (Y, B); Reduce the reverse.
//!
//! The node-swizzled ReduceScatter runs X steps, each an intra ReduceScatter of the part
//! destined for one host (B/X) overlapped with sending the previous part's reduced slice (B/n
//! per rank, Y ranks of a host sending at once to one other host): `t_rs + (X-1) max(t_rs,
//! t_send)`, then the X slices are reduced; its mirror AllGather likewise without reductions.
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

    /// What the two-level AllGather's (and ReduceScatter's) intra-host phase costs beyond one
    /// `intra` collective of the whole vector: the plan runs one per host of the vector's
    /// blocks (`algo::hier`), at once, so the bytes are the same but each rank sends `x` times
    /// the messages and receives as many, each its CPU cost `o` at either end.
    fn per_host_copies(
        &self,
        intra: Algorithm,
        coll: Collective,
        x: usize,
        y: usize,
        big: f64,
    ) -> f64 {
        if x <= 1 || y <= 1 {
            return 0.0;
        }
        let msgs: f64 = super::rounds(intra, coll, y, big / x as f64)
            .iter()
            .map(|&(count, per_round, _)| count * per_round)
            .sum();
        2.0 * (x - 1) as f64 * msgs * self.intra.o_us
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
                (Inter, self.phase(net, inter, AllReduce, x, share)?),
                (Intra, i(AllGather)?),
            ],
            AllGather => vec![
                (Inter, self.phase(net, inter, AllGather, x, share)?),
                (
                    Intra,
                    i(AllGather)? + self.per_host_copies(intra, AllGather, x, y, big),
                ),
            ],
            ReduceScatter => vec![
                (
                    Intra,
                    i(ReduceScatter)? + self.per_host_copies(intra, ReduceScatter, x, y, big),
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
        let send = e.alpha_us
            + y as f64 * slice * e.beta_us_per_byte
            + e.rendezvous(1.0, slice, self.serial);
        let red = if coll == Collective::ReduceScatter {
            (x - 1.0) * slice * self.gamma
        } else {
            0.0
        };
        // In each overlapped round a rank's CPU posts the local phase's messages and the one
        // across, and handles as many received, `o` each at its level.
        let msgs: f64 = super::rounds(intra, coll, y, big / x)
            .iter()
            .map(|&(count, per_round, _)| count * per_round)
            .sum();
        let cpu = 2.0 * (msgs * self.intra.o_us + e.o_us);
        let mut p = Priced::flat(
            Algorithm::Swizzle,
            local + (x - 1.0) * local.max(send).max(cpu) + red,
        );
        p.intra = intra;
        p.nparts = 2;
        p.parts[0] = (Level::Intra, x * local);
        p.parts[1] = (Level::Inter, (x - 1.0) * send);
        Some(p)
    }
}

//! The choice on several hosts: every flat algorithm in topology order, the swizzle with each
//! intra algorithm and every hierarchical intra x inter pair, priced per level; the first in that fixed order whose
//! prediction is within `MARGIN` of the best wins, so that parameters a few per cent apart
//! (calibrations on an unchanged machine) make the same choice.
#![forbid(unsafe_code)]

use super::compose::{flats, Priced};
use super::levels::{Layout, Net};
use super::{whole_bytes, Model};
use crate::algo::{self, Algorithm, Options, Problem};

/// A candidate later in the fixed order is chosen only when predicted this much faster than
/// every earlier one.
pub const MARGIN: f64 = 0.05;

impl Model {
    /// The two levels as the formulas use them.
    pub(super) fn net(&self) -> Net {
        Net {
            intra: self.intra,
            inter: self.inter(),
            gamma: self.gamma_us_per_byte,
            serial: self.shared_cpus,
            slice: self.slice_bytes as f64,
        }
    }

    /// Every candidate for `p` on the hosts of `opts` with its prediction, in the fixed order
    /// (flat ones in `Algorithm::ALL` order, then swizzles, then hier pairs).
    pub(super) fn candidates(&self, p: &Problem, elem: usize, opts: &Options) -> Vec<Priced> {
        let net = self.net();
        let lay = Layout::new(p, opts);
        let big = whole_bytes(p, elem);
        let root = opts
            .hosts
            .order(p.nranks)
            .iter()
            .position(|&r| r == p.root)
            .unwrap_or(0);
        let mut out: Vec<Priced> = flats()
            .filter(|a| algo::supports(*a, p.coll))
            .filter_map(|a| Some(Priced::flat(a, net.flat(a, p.coll, &lay, big, root)?)))
            .collect();
        // Hierarchies refuse windows; with one rank per host a hierarchy is its inter
        // algorithm alone, a flat candidate already.
        if p.window.is_some() || lay.ymax() == 1 {
            return out;
        }
        // Swizzles before hier pairs: of two schedules predicted alike, the one that overlaps
        // its intra-host work with the network loses less where that work is slower than
        // predicted (ranks sharing CPUs; docs/performance.md, "Several hosts").
        if algo::supports(Algorithm::Swizzle, p.coll) {
            out.extend(flats().filter_map(|i| net.swizzle(p.coll, &lay, big, i)));
        }
        if algo::supports(Algorithm::Hier, p.coll) {
            for intra in flats() {
                for inter in flats() {
                    out.extend(net.hier(p.coll, &lay, big, intra, inter));
                }
            }
        }
        out
    }

    /// The predicted time of `algo` for `p` on the hosts of `opts` (hier and swizzle with
    /// their best levels); None if not applicable.
    pub fn predict_on(
        &self,
        algo: Algorithm,
        p: &Problem,
        elem: usize,
        opts: &Options,
    ) -> Option<f64> {
        if !super::levels::spans_hosts(p, opts) {
            return self.predict(algo, p, elem);
        }
        self.candidates(p, elem, opts)
            .iter()
            .filter(|c| c.algo == algo)
            .map(|c| c.us)
            .min_by(f64::total_cmp)
    }

    /// `opts` with the intra and inter algorithms `algo` (hier or swizzle) runs best with on
    /// the hosts of `opts`; unchanged on one host or for any other algorithm.
    pub fn levels_for(&self, algo: Algorithm, p: &Problem, elem: usize, opts: Options) -> Options {
        if !matches!(algo, Algorithm::Hier | Algorithm::Swizzle)
            || !super::levels::spans_hosts(p, &opts)
        {
            return opts;
        }
        let cands = self.candidates(p, elem, &opts);
        let own: Vec<Priced> = cands.into_iter().filter(|c| c.algo == algo).collect();
        match pick(&own) {
            Some(c) => Options {
                intra: c.intra,
                inter: c.inter,
                ..opts
            },
            None => opts,
        }
    }

    /// `choose` on several hosts.
    pub(super) fn choose_levels(
        &self,
        p: &Problem,
        elem: usize,
        opts: Options,
    ) -> (Algorithm, Options) {
        let cands = self.candidates(p, elem, &opts);
        let Some(best) = pick(&cands) else {
            return (Algorithm::Ring, opts);
        };
        let chosen = Options {
            intra: best.intra,
            inter: best.inter,
            ..opts
        };
        let class = (p.count * elem).max(1).ilog2();
        if log::log_enabled!(log::Level::Info) && self.logged.lock().insert((p.coll, class)) {
            self.log_levels(p, elem, &opts, &cands, &best);
        }
        (best.algo, chosen)
    }

    fn log_levels(
        &self,
        p: &Problem,
        elem: usize,
        opts: &Options,
        cands: &[Priced],
        best: &Priced,
    ) {
        let mut sorted = cands.to_vec();
        sorted.sort_by(|x, y| x.us.total_cmp(&y.us));
        let list: Vec<String> = sorted.iter().map(Priced::describe).collect();
        log::info!(
            "{:?} of {} B on {} ranks, hosts of {:?} ranks ({}{}): predicted {}; chose {}",
            p.coll,
            p.count * elem,
            p.nranks,
            opts.hosts.sizes(p.nranks),
            self.levels_text(),
            if self.shared_cpus {
                ", ranks share CPUs"
            } else {
                ""
            },
            list.join(", "),
            best.describe()
        );
    }
}

/// The first candidate (in the given order) predicted within `MARGIN` of the fastest.
fn pick(cands: &[Priced]) -> Option<Priced> {
    let best = cands.iter().map(|c| c.us).min_by(f64::total_cmp)?;
    cands
        .iter()
        .find(|c| c.us <= best * (1.0 + MARGIN))
        .copied()
}

//! The alpha-beta-gamma cost model: a message of m bytes costs `alpha + m*beta`, reducing m
//! bytes costs `m*gamma`, and every message also costs the sending CPU `o = alpha/2`, so that
//! algorithms that send many messages at once pay for it on a CPU-driven transport (`alpha/2`
//! predicts single-step mesh's measured cost, `alpha/4` did not; see docs/performance.md). The
//! formulas are the textbook ones for each algorithm (as in Thakur, Rabenseifner and Gropp,
//! "Optimization of collective communication operations in MPICH", 2005), written out per
//! algorithm in this module, plus one term they leave out: on a
//! transport with a rendezvous protocol (`eager_bytes`), each round of messages larger than the
//! eager limit waits for a handshake, costed as two more `alpha`s (`RENDEZVOUS_ALPHAS`), or is
//! cut into eager-sized slices at `o` per extra message, whichever is cheaper (`eager_slicing`).
//! Over tcp (ofi_rxm, eager up to 16 KiB) that term is what separates algorithms with equal
//! bytes: one round of small messages (mesh) beats several rounds of growing ones (recursive
//! doubling), which the plain formulas, favouring fewer rounds, get backwards; and it sizes the
//! slices. Where ranks share CPUs (`Model::shared_cpus`: 4 ranks bound two to a CPU) a
//! handshake waits for its peer to be scheduled, so the handshakes of one round no longer
//! overlap and each message pays its own: then mesh, which sends to every peer at once, loses
//! to recursive halving/doubling. The measurements behind each term are in
//! docs/performance.md ("Cost model"). PURE: the measurements are taken by `coll`.
//!
//! Several hosts (`Options::hosts`): a level per kind of link, intra-host (shared memory) and
//! inter-host (the network, its beta being a host's link, shared by the ranks that send across
//! at once), each with its own alpha, beta, per-message CPU cost and eager limit, and gamma
//! once. `choose` then compares flat algorithms in topology order (`levels`), hierarchical
//! compositions of any intra x inter pair and the node-swizzled ReduceScatter / AllGather
//! (`compose`), with a margin before it leaves a fixed order (`pick`). One host keeps the
//! one-level formulas above exactly.
#![forbid(unsafe_code)]

use crate::algo::{self, Algorithm, Collective, Options, Problem};
use crate::config::Config;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::Arc;

mod compose;
mod compressed;
mod fit;
mod levels;
mod pick;
mod pipeline;
mod steady;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_levels;

pub use compressed::{
    codec_elements, codec_elements_tiered, codec_us, codec_us_tiered, CodecRate, CompressedPrice,
    Exchange, Shape, Tier,
};
pub use fit::{fit, fit_link, quantize, LinkSamples};
pub use levels::Link;
pub use pick::MARGIN;
use pipeline::{binomial_piped, pipeline_fill, ring_overlap, Round};
pub use steady::{steady, Steady, OUTLIER};

/// Measured or configured link parameters (microseconds, microseconds per byte).
#[derive(Clone, Debug)]
pub struct Model {
    pub alpha_us: f64,
    pub beta_us_per_byte: f64,
    pub gamma_us_per_byte: f64,
    /// Which of the three came from the configuration (the rest are measured).
    pub fixed: [bool; 3],
    /// Messages above this many bytes go by a rendezvous protocol that costs one more round
    /// trip, or are cut into slices of this size (`usize::MAX`: no rendezvous). Set from the
    /// provider (`transport::Caps::eager_bytes`).
    pub eager_bytes: usize,
    /// Bytes per slice of the pipelined schedules (`transport::Caps::slice_bytes`): a chain
    /// (ring Broadcast and Reduce) fills its pipeline one slice per hop, a binary tree's
    /// AllReduce one slice per level, up and down (`pipeline_fill`).
    pub slice_bytes: usize,
    /// Some machine runs more ranks than it has CPUs for (`coll::placement`): a handshake then
    /// waits for its peer to be scheduled, so the rendezvous of messages sent at once no
    /// longer overlap and each costs its own `RENDEZVOUS_ALPHAS` (`eager_alphas`).
    pub shared_cpus: bool,
    /// The intra-host level (shared memory) where the ranks span several hosts; `alpha_us`,
    /// `beta_us_per_byte` and `eager_bytes` above are then the inter-host level (the network).
    pub intra: Link,
    /// The sending CPU's cost of one message over the network where the ranks span several
    /// hosts (None: `alpha_us / 2`, as on one host). Measured apart from alpha, since network
    /// delay costs no CPU: on a long link `alpha/2` per message would make one round of many
    /// messages (mesh) look far slower than it is.
    pub inter_o_us: Option<f64>,
    logged: Arc<Mutex<HashSet<(Collective, u32)>>>,
    /// The compressed calls' log lines given (`log_compressed`).
    logged_compressed: Arc<Mutex<HashSet<CompressedLogKey>>>,
}

/// What a compressed call's log line is given once for: shape, format, power-of-two size
/// class, and whether the inter-host level alone was compressed.
type CompressedLogKey = (Shape, crate::compress::Format, u32, bool);

impl PartialEq for Model {
    fn eq(&self, o: &Model) -> bool {
        self.alpha_us == o.alpha_us
            && self.beta_us_per_byte == o.beta_us_per_byte
            && self.gamma_us_per_byte == o.gamma_us_per_byte
            && self.intra == o.intra
            && self.inter_o_us == o.inter_o_us
    }
}

/// GB/s to microseconds per byte.
pub fn gbps_to_us_per_byte(gbps: f64) -> f64 {
    1.0 / (gbps * 1e3)
}

impl Model {
    /// Defaults: 10 us, 2 GB/s links, 8 GB/s reductions, unless the configuration says otherwise.
    pub fn from_config(cfg: &Config) -> Model {
        Model {
            alpha_us: cfg.alpha_us.unwrap_or(10.0),
            beta_us_per_byte: gbps_to_us_per_byte(cfg.beta_gbps.unwrap_or(2.0)),
            gamma_us_per_byte: gbps_to_us_per_byte(cfg.gamma_gbps.unwrap_or(8.0)),
            fixed: [
                cfg.alpha_us.is_some(),
                cfg.beta_gbps.is_some(),
                cfg.gamma_gbps.is_some(),
            ],
            eager_bytes: usize::MAX,
            slice_bytes: crate::transport::DEFAULT_SLICE_BYTES,
            shared_cpus: false,
            intra: Link::SHM,
            inter_o_us: None,
            logged: Arc::default(),
            logged_compressed: Arc::default(),
        }
    }

    /// This model for an intra-host transport whose eager protocol ends at `eager_bytes`.
    pub fn with_intra_eager(mut self, eager_bytes: usize) -> Model {
        self.intra.eager_bytes = eager_bytes;
        self
    }

    /// This model with the intra-host level `intra` (alpha, beta and per-message cost; the
    /// eager limit stays the transport's).
    pub fn with_intra(mut self, intra: Link) -> Model {
        self.intra = Link {
            eager_bytes: self.intra.eager_bytes,
            ..intra
        };
        self
    }

    /// Both levels' parameters and gamma, for log lines:
    /// "intra alpha .. us, beta .. GB/s, o .. us; inter ...; gamma .. GB/s".
    pub fn levels_text(&self) -> String {
        let gbps = |b: f64| 1.0 / (b * 1e3);
        let link = |l: Link| {
            format!(
                "alpha {:.2} us, beta {:.3} GB/s, o {:.2} us",
                l.alpha_us,
                gbps(l.beta_us_per_byte),
                l.o_us
            )
        };
        format!(
            "intra {}; inter {}; gamma {:.2} GB/s",
            link(self.intra),
            link(self.inter()),
            gbps(self.gamma_us_per_byte)
        )
    }

    /// The inter-host level (the one level on one host).
    pub fn inter(&self) -> Link {
        Link {
            alpha_us: self.alpha_us,
            beta_us_per_byte: self.beta_us_per_byte,
            o_us: self.inter_o_us.unwrap_or(self.alpha_us / 2.0),
            eager_bytes: self.eager_bytes,
        }
    }

    /// Replace the measured parameters of both levels (several hosts), keeping configured
    /// ones (the configuration's alpha and beta are the network's).
    pub fn with_measured_levels(&self, intra: Option<Link>, inter: Link, gamma: f64) -> Model {
        let mut m = self.with_measured(inter.alpha_us, inter.beta_us_per_byte, gamma);
        m.inter_o_us = Some(inter.o_us);
        if let Some(l) = intra {
            m = m.with_intra(l);
        }
        m
    }

    /// This model for a transport whose eager protocol ends at `eager_bytes`.
    pub fn with_eager(mut self, eager_bytes: usize) -> Model {
        self.eager_bytes = eager_bytes;
        self
    }

    /// This model for schedules sliced at `slice_bytes` (`slice_bytes`).
    pub fn with_slice(mut self, slice_bytes: usize) -> Model {
        self.slice_bytes = slice_bytes.max(1);
        self
    }

    /// This model for ranks some of which share CPUs (`shared_cpus`).
    pub fn with_shared_cpus(mut self, shared: bool) -> Model {
        self.shared_cpus = shared;
        self
    }

    pub fn new(alpha_us: f64, beta_gbps: f64, gamma_gbps: f64) -> Model {
        Model {
            alpha_us,
            beta_us_per_byte: gbps_to_us_per_byte(beta_gbps),
            gamma_us_per_byte: gbps_to_us_per_byte(gamma_gbps),
            fixed: [true; 3],
            eager_bytes: usize::MAX,
            slice_bytes: crate::transport::DEFAULT_SLICE_BYTES,
            shared_cpus: false,
            intra: Link::SHM,
            inter_o_us: None,
            logged: Arc::default(),
            logged_compressed: Arc::default(),
        }
    }

    pub fn needs_calibration(&self) -> bool {
        !self.fixed.iter().all(|f| *f)
    }

    /// Replace the measured parameters, keeping configured ones.
    pub fn with_measured(
        &self,
        alpha_us: f64,
        beta_us_per_byte: f64,
        gamma_us_per_byte: f64,
    ) -> Model {
        let mut m = self.clone();
        if !m.fixed[0] {
            m.alpha_us = alpha_us;
        }
        if !m.fixed[1] {
            m.beta_us_per_byte = beta_us_per_byte;
        }
        if !m.fixed[2] {
            m.gamma_us_per_byte = gamma_us_per_byte;
        }
        m
    }

    /// Predicted time (us) of `algo` for `p` with `elem`-byte elements; None if not applicable.
    pub fn predict(&self, algo: Algorithm, p: &Problem, elem: usize) -> Option<f64> {
        let n = p.nranks as f64;
        if p.nranks == 1 {
            return Some(0.0);
        }
        let big = whole_bytes(p, elem);
        let t = self.alpha_beta(algo, p.coll, n, big)?;
        let (alphas, _) = self.eager_alphas(algo, p, big);
        Some(t + alphas * self.alpha_us)
    }

    /// `opts` for running `p` with `algo`: slices of the eager limit where `eager_alphas` finds
    /// them cheaper than the rendezvous of whole messages, the configured slices otherwise.
    pub fn eager_slicing(
        &self,
        algo: Algorithm,
        p: &Problem,
        elem: usize,
        opts: Options,
    ) -> Options {
        let big = whole_bytes(p, elem);
        let slice = (self.eager_bytes / elem.max(1)).max(1);
        let finer = opts.slice == 0 || slice < opts.slice;
        if p.nranks > 1 && finer && self.eager_alphas(algo, p, big).1 {
            Options { slice, ..opts }
        } else {
            opts
        }
    }

    /// `eager_alphas` on this model's transport and placement.
    fn eager_alphas(&self, algo: Algorithm, p: &Problem, big: f64) -> (f64, bool) {
        eager_alphas(
            algo,
            p.coll,
            p.nranks,
            big,
            self.eager_bytes,
            self.shared_cpus,
        )
    }

    /// The alpha-beta-gamma formulas of each algorithm (`formula`, with the per-message CPU
    /// cost `o`).
    fn alpha_beta(&self, algo: Algorithm, coll: Collective, n: f64, big: f64) -> Option<f64> {
        let (a, b, g) = (self.alpha_us, self.beta_us_per_byte, self.gamma_us_per_byte);
        let fill = pipeline_fill(
            algo,
            coll,
            n,
            big,
            self.slice_bytes as f64,
            (a, b, a / 2.0, g),
        );
        formula(algo, coll, n, big, (a, b, a / 2.0, g)).map(|t| t + fill)
    }

    /// The algorithm with the smallest predicted time. On one host, the flat algorithms of
    /// the one-level formulas (hier is only run when asked for); on several hosts
    /// (`opts.hosts`), flat, hierarchical and swizzled candidates priced per level (`pick`).
    pub fn choose(&self, p: &Problem, elem: usize, opts: Options) -> (Algorithm, Options) {
        if levels::spans_hosts(p, &opts) {
            return self.choose_levels(p, elem, opts);
        }
        let mut cands: Vec<(f64, Algorithm)> = Algorithm::ALL
            .iter()
            .filter(|a| !matches!(a, Algorithm::Hier | Algorithm::Swizzle))
            .filter(|a| algo::supports(**a, p.coll))
            .filter_map(|a| self.predict(*a, p, elem).map(|t| (t, *a)))
            .collect();
        cands.sort_by(|x, y| x.0.total_cmp(&y.0));
        let best = cands.first().map_or(Algorithm::Ring, |c| c.1);
        let sliced = self.eager_slicing(best, p, elem, opts);
        let class = (p.count * elem).max(1).ilog2();
        if log::log_enabled!(log::Level::Info) && self.logged.lock().insert((p.coll, class)) {
            let list: Vec<String> = cands
                .iter()
                .map(|(t, a)| format!("{a} {t:.1} us"))
                .collect();
            log::info!(
                "{:?} of {} B on {} ranks (alpha {:.2} us, beta {:.3} GB/s, gamma {:.2} GB/s{}): predicted {}; chose {best}{}",
                p.coll,
                p.count * elem,
                p.nranks,
                self.alpha_us,
                1.0 / (self.beta_us_per_byte * 1e3),
                1.0 / (self.gamma_us_per_byte * 1e3),
                if self.shared_cpus { ", ranks share CPUs" } else { "" },
                list.join(", "),
                if sliced == opts {
                    String::new()
                } else {
                    format!(" in eager slices of {} B", sliced.slice * elem)
                }
            );
        }
        (best, sliced)
    }
}

/// The one-level formulas for `n` ranks and a whole vector of `big` bytes on links of
/// `(alpha, beta, o, gamma)`: the model on one host, and each phase of a composition.
pub(crate) fn formula(
    algo: Algorithm,
    coll: Collective,
    n: f64,
    big: f64,
    (a, b, o, g): (f64, f64, f64, f64),
) -> Option<f64> {
    let lg = n.log2();
    let clg = n.log2().ceil();
    let pow2 = (n as usize).is_power_of_two();
    let f = (n - 1.0) / n;
    let fold = if pow2 { 0.0 } else { 1.0 };
    use Algorithm::*;
    use Collective::*;
    let t = match (algo, coll) {
        (Ring, AllReduce) => 2.0 * (n - 1.0) * a + 2.0 * f * big * b + f * big * g,
        (Ring, AllGather) => (n - 1.0) * a + f * big * b,
        (Ring, ReduceScatter) => (n - 1.0) * a + f * big * b + f * big * g,
        (Ring, Broadcast) => (n - 1.0) * a + big * b,
        (Ring, Reduce) => (n - 1.0) * a + big * b + big * g,
        // Two rings use both neighbours: twice the messages, the same bytes per link.
        (BidirRing, AllReduce) => 2.0 * (n - 1.0) * (a + o) + 2.0 * f * big * b + f * big * g,
        (BidirRing, AllGather) => (n - 1.0) * (a + o) + f * big * b,
        (BidirRing, ReduceScatter) => (n - 1.0) * (a + o) + f * big * b + f * big * g,
        // Every rank sends n-1 messages and receives n-1 (`exchange`); the AllReduce twice.
        (Mesh, AllReduce) => 2.0 * exchange(a + f * big * b, n - 1.0, o) + f * big * g,
        (Mesh, AllGather | AllToAll) => exchange(a + f * big * b, n - 1.0, o),
        (Mesh, ReduceScatter) => exchange(a + f * big * b, n - 1.0, o) + f * big * g,
        // The root sends n-1 messages at `o` each; every other rank receives one.
        (Mesh, Broadcast) => a + (n - 1.0) * o + (n - 1.0) * big * b,
        // Every rank sends the root its buffer; they share the root's ingress and come in
        // together, the root handles each (`o`; the first one's is the last part of its
        // alpha), then reduces the n-1 whole buffers in member order.
        (Mesh, Reduce) => a + (n - 2.0) * o + (n - 1.0) * big * (b + g),
        (Mesh1, AllReduce) => exchange(a + (n - 1.0) * big * b, n - 1.0, o) + (n - 1.0) * big * g,
        (Rdh, AllReduce) => {
            (2.0 * lg.floor() + 2.0 * fold) * a
                + (2.0 * f + 2.0 * fold) * big * b
                + (f + fold) * big * g
        }
        (Rdh, AllGather) => (lg.floor() + fold) * a + (f + fold) * big * b,
        (Rdh, ReduceScatter) => {
            (lg.floor() + fold) * a + (f + fold) * big * b + (f + fold) * big * g
        }
        (Rd, AllReduce) => (lg.floor() + 2.0 * fold) * (a + big * b + big * g),
        // Each interior node of the binary tree reduces two children's partials of the whole
        // buffer; the double tree's interior nodes do so on half of it.
        (Tree, AllReduce) => 2.0 * clg * a + 3.0 * big * b + 2.0 * big * g,
        (Tree, Broadcast) => clg * (a + big * b),
        (Tree, Reduce) => clg * (a + big * b + big * g),
        (DbTree, AllReduce) => 2.0 * clg * (a + o) + 2.0 * big * b + big * g,
        (Bruck, AllGather) => clg * a + f * big * b + big * b / 4.0,
        (Bruck, AllToAll) => clg * a + big / 2.0 * clg * b + big * b / 2.0,
        (Pairwise, AllToAll) => (n - 1.0) * a + f * big * b,
        _ => return None,
    };
    Some(t)
}

/// One round in which every rank sends `msgs` messages and receives as many, the transfer
/// (alpha and the bytes through the busiest link) taking `wire`: a rank's CPU posts its
/// sends (`o` each) while their bytes flow, and handles each message it receives (`o` each,
/// the receiver's part of LogGP's overhead). The messages share its ingress, so they come in
/// together at the end of the transfer, and their handling follows the later of the posts
/// and the transfer.
pub(crate) fn exchange(wire: f64, msgs: f64, o: f64) -> f64 {
    wire.max(msgs * o) + msgs * o
}

/// Total bytes of `p`'s "whole vector": the AllReduce, Broadcast or Reduce buffer, N times the
/// per-rank count for the others.
fn whole_bytes(p: &Problem, elem: usize) -> f64 {
    let bytes = (p.count * elem) as f64;
    match p.coll {
        Collective::AllReduce | Collective::Broadcast | Collective::Reduce => bytes,
        _ => bytes * p.nranks as f64,
    }
}

/// What messages above `eager_bytes` add to `algo`'s time, in alphas, and whether sending them
/// as eager-sized slices (alpha/2 per extra message) is cheaper than their rendezvous
/// (`RENDEZVOUS_ALPHAS` per round, or per message where ranks share CPUs: `serial`). Linear in
/// alpha, so the choice needs no measurement: `Model::predict`, `Model::eager_slicing` and
/// `fit` all take it from here.
fn eager_alphas(
    algo: Algorithm,
    coll: Collective,
    nranks: usize,
    big: f64,
    eager_bytes: usize,
    serial: bool,
) -> (f64, bool) {
    if eager_bytes == usize::MAX {
        return (0.0, false);
    }
    let eager = eager_bytes as f64;
    let (mut rendezvous, mut sliced) = (0.0, 0.0);
    for (count, msgs, msg) in rounds(algo, coll, nranks, big) {
        if msg > eager {
            let handshakes = if serial { count * msgs } else { count };
            rendezvous += handshakes * RENDEZVOUS_ALPHAS;
            sliced += count * msgs * ((msg / eager).ceil() - 1.0) / 2.0;
        }
    }
    if sliced < rendezvous {
        (sliced, true)
    } else {
        (rendezvous, false)
    }
}

/// A rendezvous costs the receiver two more one-way trips than an eager message: the sender's
/// request to send, then the receiver's read request, before the data moves.
const RENDEZVOUS_ALPHAS: f64 = 2.0;

/// `algo`'s rounds as (how many, messages each rank sends per round, bytes per message) for a
/// whole vector of `big` bytes: what decides between eager and rendezvous (`eager_alphas`).
/// The messages of one round travel at once, so their handshakes overlap, but each extra slice
/// of each of them is one more message for the sending CPU.
pub(super) fn rounds(
    algo: Algorithm,
    coll: Collective,
    nranks: usize,
    big: f64,
) -> Vec<(f64, f64, f64)> {
    let n = nranks as f64;
    let steps = nranks.ilog2();
    let clg = nranks.next_power_of_two().ilog2();
    let fold = !nranks.is_power_of_two();
    // Recursive halving/doubling: rounds of big/2, big/4, ... down to big/2^steps.
    let halving = (1..=steps).map(|k| (1.0, 1.0, big / f64::from(1u32 << k)));
    use Algorithm::*;
    use Collective::*;
    match (algo, coll) {
        (Ring, AllReduce) => vec![(2.0 * (n - 1.0), 1.0, big / n)],
        (Ring, AllGather | ReduceScatter) => vec![(n - 1.0, 1.0, big / n)],
        (BidirRing, AllGather | ReduceScatter) => vec![(n - 1.0, 2.0, big / n / 2.0)],
        (BidirRing, AllReduce) => vec![(2.0 * (n - 1.0), 2.0, big / n / 2.0)],
        (Ring, Broadcast | Reduce) => vec![(n - 1.0, 1.0, big)],
        (Mesh, AllReduce) => vec![(2.0, n - 1.0, big / n)],
        (Mesh, AllGather | ReduceScatter) => vec![(1.0, n - 1.0, big / n)],
        (Mesh, Broadcast | Reduce) | (Mesh1, AllReduce) => vec![(1.0, n - 1.0, big)],
        (Rdh, AllReduce) => {
            let mut r: Vec<_> = halving.map(|(c, k, m)| (2.0 * c, k, m)).collect();
            if fold {
                r.push((2.0, 1.0, big));
            }
            r
        }
        (Rdh, AllGather | ReduceScatter) => {
            let mut r: Vec<_> = halving.collect();
            if fold {
                r.push((1.0, 1.0, big));
            }
            r
        }
        (Rd, AllReduce) => vec![(f64::from(steps) + if fold { 2.0 } else { 0.0 }, 1.0, big)],
        (Tree, AllReduce) => vec![(2.0 * f64::from(clg), 2.0, big)],
        (Tree, Broadcast | Reduce) => vec![(f64::from(clg), 2.0, big)],
        (DbTree, AllReduce) => vec![(2.0 * f64::from(clg), 2.0, big / 2.0)],
        (Bruck, AllGather) => (0..clg)
            .map(|k| (1.0, 1.0, (big / n) * f64::from(1u32 << k)))
            .collect(),
        _ => Vec::new(),
    }
}

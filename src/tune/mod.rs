//! The alpha-beta-gamma cost model: a message of m bytes costs `alpha + m*beta`, reducing m
//! bytes costs `m*gamma`, and every message also costs the sending CPU `o = alpha/2`, so that
//! algorithms that send many messages at once pay for it on a CPU-driven transport (`alpha/2`
//! predicts single-step mesh's measured cost, `alpha/4` did not; see docs/performance.md). The
//! formulas are those of shared/docs/algorithms.md, plus one term they leave out: on a
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
#![forbid(unsafe_code)]

use crate::algo::{self, Algorithm, Collective, Options, Problem};
use crate::config::Config;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::Arc;

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
    /// Some machine runs more ranks than it has CPUs for (`coll::placement`): a handshake then
    /// waits for its peer to be scheduled, so the rendezvous of messages sent at once no
    /// longer overlap and each costs its own `RENDEZVOUS_ALPHAS` (`eager_alphas`).
    pub shared_cpus: bool,
    logged: Arc<Mutex<HashSet<(Collective, u32)>>>,
}

impl PartialEq for Model {
    fn eq(&self, o: &Model) -> bool {
        self.alpha_us == o.alpha_us
            && self.beta_us_per_byte == o.beta_us_per_byte
            && self.gamma_us_per_byte == o.gamma_us_per_byte
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
            shared_cpus: false,
            logged: Arc::default(),
        }
    }

    /// This model for a transport whose eager protocol ends at `eager_bytes`.
    pub fn with_eager(mut self, eager_bytes: usize) -> Model {
        self.eager_bytes = eager_bytes;
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
            shared_cpus: false,
            logged: Arc::default(),
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

    /// The alpha-beta-gamma formulas of algorithms.md (with the per-message CPU cost `o`).
    fn alpha_beta(&self, algo: Algorithm, coll: Collective, n: f64, big: f64) -> Option<f64> {
        let (a, b, g) = (self.alpha_us, self.beta_us_per_byte, self.gamma_us_per_byte);
        let o = a / 2.0;
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
            (Mesh, AllReduce) => 2.0 * a + 2.0 * (n - 1.0) * o + 2.0 * f * big * b + f * big * g,
            (Mesh, AllGather) => a + (n - 1.0) * o + f * big * b,
            (Mesh, ReduceScatter) => a + (n - 1.0) * o + f * big * b + f * big * g,
            (Mesh, Broadcast) => a + (n - 1.0) * o + (n - 1.0) * big * b,
            (Mesh, Reduce) => a + (n - 1.0) * o + (n - 1.0) * big * b + f * big * g,
            (Mesh, AllToAll) => a + (n - 1.0) * o + f * big * b,
            (Mesh1, AllReduce) => a + (n - 1.0) * o + (n - 1.0) * big * (b + g),
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
            (Tree, AllReduce) => 2.0 * clg * a + 3.0 * big * b + big * g,
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

    /// The algorithm with the smallest predicted time (hier is only chosen when asked for).
    pub fn choose(&self, p: &Problem, elem: usize, opts: Options) -> (Algorithm, Options) {
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
fn rounds(algo: Algorithm, coll: Collective, nranks: usize, big: f64) -> Vec<(f64, f64, f64)> {
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

/// Alpha, beta and gamma from timings: `small_us` of a ring AllReduce of a tiny message,
/// `large` = (bytes, us) of ring AllReduces of one or more large sizes (ascending), `reduce` =
/// (bytes, us) of a local reduction, on a transport whose eager protocol ends at `eager_bytes`
/// (the large AllReduces' rounds then wait for a handshake or send extra slices too, as
/// `Model::predict` assumes).
///
/// Beta comes from the difference between the two largest sizes when there are two: the
/// per-round latency then cancels out. With more ranks than cores the tiny AllReduce's rounds
/// include waiting for a peer to be scheduled, so alpha comes out several times the latency a
/// large round pays; subtracting that from one large timing can leave nothing, which clamps
/// beta to its floor and makes `auto` send the whole vector to every peer (mesh1) at 1 MiB
/// (seen over tcp with more ranks than cores; docs/performance.md).
pub fn fit(
    nranks: usize,
    small_us: f64,
    large: &[(usize, f64)],
    reduce: (usize, f64),
    eager_bytes: usize,
) -> (f64, f64, f64) {
    let n = nranks as f64;
    let alpha = (small_us / (2.0 * (n - 1.0))).max(0.05);
    let gamma = (reduce.1 / reduce.0.max(1) as f64).max(1e-7);
    let f = (n - 1.0) / n;
    // The calibration's ring runs with the model's slicing (`Model::eager_slicing`), so its
    // rendezvous or extra slices are the ones `eager_alphas` prices.
    let alphas = |bytes: f64| {
        let (extra, _) = eager_alphas(
            Algorithm::Ring,
            Collective::AllReduce,
            nranks,
            bytes,
            eager_bytes,
            false, // one message a round: per round and per message agree
        );
        2.0 * (n - 1.0) + extra
    };
    // Time a ring AllReduce of `bytes` spends moving data: what latency and reduction leave.
    let transfer = |&(bytes, us): &(usize, f64)| {
        let bytes = bytes as f64;
        us - alphas(bytes) * alpha - f * bytes * gamma
    };
    let per_byte = |us: f64, bytes: usize| us / (2.0 * f * bytes as f64);
    let beta = match large {
        [.., one @ (b1, _), two @ (b2, _)] if b2 > b1 => {
            let diff = per_byte(transfer(two) - transfer(one), b2 - b1);
            if diff > 0.0 {
                diff
            } else {
                per_byte(transfer(two), *b2)
            }
        }
        [.., last] => per_byte(transfer(last), last.0),
        // No timing at all: no bandwidth term (beta at its floor).
        [] => 0.0,
    };
    (alpha, beta.max(1e-7), gamma)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_messages_prefer_latency_algorithms_large_prefer_bandwidth() {
        let m = Model::new(10.0, 2.0, 8.0);
        let small = Problem::new(Collective::AllReduce, 16, 2);
        let large = Problem::new(Collective::AllReduce, 16, 16 << 20);
        let (a, _) = m.choose(&small, 4, Options::default());
        let (b, _) = m.choose(&large, 4, Options::default());
        assert!(
            matches!(
                a,
                Algorithm::Rd
                    | Algorithm::Rdh
                    | Algorithm::Tree
                    | Algorithm::DbTree
                    | Algorithm::Mesh1
            ),
            "{a}"
        );
        assert!(matches!(b, Algorithm::Ring | Algorithm::Rdh), "{b}");
        assert_eq!(
            m.predict(
                Algorithm::Ring,
                &Problem::new(Collective::AllReduce, 1, 5),
                4
            ),
            Some(0.0)
        );
    }

    #[test]
    fn rendezvous_rounds_favour_one_round_of_small_messages() {
        // Parameters fitted over tcp with 4 ranks, where mesh AllGather of 64 KiB to 4 MiB beat rdh.
        let m = Model::new(7.5, 1.4, 19.0);
        let ag = |bytes: usize| Problem::new(Collective::AllGather, 4, bytes / 16);
        for bytes in [64 << 10, 1 << 20, 4 << 20] {
            assert_eq!(
                m.choose(&ag(bytes), 4, Options::default()).0,
                Algorithm::Rdh
            );
            let tcp = m.clone().with_eager(16 << 10);
            assert_eq!(
                tcp.choose(&ag(bytes), 4, Options::default()).0,
                Algorithm::Mesh,
                "{bytes} B"
            );
        }
        // Below the eager limit nothing changes: tiny AllReduce stays with few rounds.
        let tcp = m.with_eager(16 << 10);
        let tiny = Problem::new(Collective::AllReduce, 4, 2);
        assert!(matches!(
            tcp.choose(&tiny, 4, Options::default()).0,
            Algorithm::Rd | Algorithm::Rdh
        ));
    }

    #[test]
    fn where_ranks_share_cpus_each_message_pays_its_own_handshake() {
        let tcp = Model::new(7.5, 1.4, 19.0).with_eager(16 << 10);
        let shared = tcp.clone().with_shared_cpus(true);
        let ag = |bytes: usize| Problem::new(Collective::AllGather, 4, bytes / 16);
        let ar = |bytes: usize| Problem::new(Collective::AllReduce, 4, bytes / 4);
        for bytes in [1 << 20, 4 << 20] {
            for p in [ag(bytes), ar(bytes)] {
                assert_eq!(tcp.choose(&p, 4, Options::default()).0, Algorithm::Mesh);
                assert_eq!(
                    shared.choose(&p, 4, Options::default()).0,
                    Algorithm::Rdh,
                    "{:?} of {bytes} B",
                    p.coll
                );
            }
            // One message a round (ring, rdh): per message is per round, nothing changes.
            for a in [Algorithm::Ring, Algorithm::Rdh] {
                assert_eq!(
                    tcp.predict(a, &ag(bytes), 4),
                    shared.predict(a, &ag(bytes), 4)
                );
            }
            // Mesh sends three at once: two alphas more for each of the two extra handshakes.
            let extra = shared.predict(Algorithm::Mesh, &ag(bytes), 4).unwrap()
                - tcp.predict(Algorithm::Mesh, &ag(bytes), 4).unwrap();
            assert!((extra - 4.0 * 7.5).abs() < 1e-9, "{extra}");
        }
        // Without a rendezvous (shm, net) sharing CPUs changes nothing.
        let shm = Model::new(7.5, 1.4, 19.0);
        assert_eq!(
            shm.clone()
                .with_shared_cpus(true)
                .predict(Algorithm::Mesh, &ag(1 << 20), 4),
            shm.predict(Algorithm::Mesh, &ag(1 << 20), 4)
        );
    }

    #[test]
    fn messages_up_to_four_eager_slices_are_sliced_not_rendezvoused() {
        let tcp = Model::new(20.0, 1.5, 17.0).with_eager(16 << 10);
        let opts = Options {
            slice: (1 << 20) / 4,
            ..Options::default()
        };
        // 2-rank AllGather: one round of one message of half the output.
        let ag = |out: usize| Problem::new(Collective::AllGather, 2, out / 2 / 4);
        for (out, sliced) in [
            (32 << 10, false),  // 16 KiB messages: eager already
            (64 << 10, true),   // 2 slices
            (128 << 10, true),  // 4 slices: 3 * alpha/2 < 2 alpha
            (256 << 10, false), // 8 slices: 7 * alpha/2 > 2 alpha
            (64 << 20, false),
        ] {
            let o = tcp.eager_slicing(Algorithm::Ring, &ag(out), 4, opts);
            let want = if sliced { (16 << 10) / 4 } else { opts.slice };
            assert_eq!(o.slice, want, "{out} B");
            assert_eq!(tcp.choose(&ag(out), 4, opts).1.slice, want, "{out} B");
        }
        // 4-rank mesh: 3 messages a round, so each slice beyond the first costs 3 * alpha/2.
        let ag4 = |out: usize| Problem::new(Collective::AllGather, 4, out / 4 / 4);
        let mesh = |out: usize| tcp.eager_slicing(Algorithm::Mesh, &ag4(out), 4, opts).slice;
        assert_eq!(
            mesh(128 << 10),
            (16 << 10) / 4,
            "32 KiB messages: 1.5 alpha < 2 alpha"
        );
        assert_eq!(
            mesh(256 << 10),
            opts.slice,
            "64 KiB messages: 4.5 alpha > 2 alpha"
        );
        // The sliced variant is what `predict` prices: below the rendezvous.
        let with = tcp.predict(Algorithm::Ring, &ag(64 << 10), 4).unwrap();
        let plain = Model::new(20.0, 1.5, 17.0)
            .predict(Algorithm::Ring, &ag(64 << 10), 4)
            .unwrap();
        assert!((with - plain - 10.0).abs() < 1e-9, "{with} {plain}");
        // No rendezvous (shm), or no slicing at all asked for with 0: left alone.
        let shm = Model::new(20.0, 1.5, 17.0);
        assert_eq!(
            shm.eager_slicing(Algorithm::Ring, &ag(64 << 10), 4, opts),
            opts
        );
        let whole = Options::default();
        assert_eq!(
            tcp.eager_slicing(Algorithm::Ring, &ag(64 << 10), 4, whole)
                .slice,
            (16 << 10) / 4
        );
        // One rank sends nothing.
        let one = Problem::new(Collective::AllGather, 1, 1 << 14);
        assert_eq!(tcp.eager_slicing(Algorithm::Ring, &one, 4, opts), opts);
    }

    #[test]
    fn fit_recovers_parameters() {
        let (a, b, g) = (5.0, gbps_to_us_per_byte(3.0), gbps_to_us_per_byte(10.0));
        let n = 4;
        let bytes = 1 << 22;
        let f = 0.75;
        let t = 2.0 * 3.0 * a + 2.0 * f * bytes as f64 * b + f * bytes as f64 * g;
        let (fa, fb, fg) = fit(
            n,
            2.0 * 3.0 * a,
            &[(bytes, t)],
            (1 << 20, (1 << 20) as f64 * g),
            usize::MAX,
        );
        assert!((fa - a).abs() < 1e-9 && (fb - b).abs() / b < 1e-9 && (fg - g).abs() / g < 1e-9);
        // With a rendezvous above 16 KiB, each of the 6 rounds of 1 MiB also waits a handshake.
        let (fa, fb, _) = fit(
            n,
            2.0 * 3.0 * a,
            &[(bytes, t + 6.0 * RENDEZVOUS_ALPHAS * a)],
            (1 << 20, (1 << 20) as f64 * g),
            16 << 10,
        );
        assert!((fa - a).abs() < 1e-9 && (fb - b).abs() / b < 1e-9);
        // 32 ranks and 1 MiB: 32 KiB messages, which the calibration's ring sends as two eager
        // slices each (62 rounds, one extra message each at alpha/2), not by rendezvous.
        let (n, bytes) = (32, 1 << 20);
        let f = 31.0 / 32.0;
        let t = 62.0 * a + 2.0 * f * bytes as f64 * b + f * bytes as f64 * g + 62.0 * a / 2.0;
        let (fa, fb, _) = fit(
            n,
            62.0 * a,
            &[(bytes, t)],
            (1 << 20, (1 << 20) as f64 * g),
            16 << 10,
        );
        assert!(
            (fa - a).abs() < 1e-9 && (fb - b).abs() / b < 1e-9,
            "{fb} {b}"
        );
    }

    #[test]
    fn fit_takes_beta_from_two_sizes_when_small_rounds_are_slow() {
        // 4 ranks whose tiny AllReduce pays 40 us a round (waiting to be scheduled) while a
        // large round pays 5: one large timing minus 6 x 40 us leaves nothing.
        let (a, b, g) = (5.0, gbps_to_us_per_byte(1.5), gbps_to_us_per_byte(15.0));
        let (n, f) = (4, 0.75);
        let t = |bytes: usize| {
            let bytes = bytes as f64;
            6.0 * a + 6.0 * RENDEZVOUS_ALPHAS * a + 2.0 * f * bytes * b + f * bytes * g
        };
        let (m1, m4) = (1usize << 20, 4usize << 20);
        let red = (m1, m1 as f64 * g);
        let slow_small = 6.0 * 40.0;
        let (_, one, _) = fit(n, slow_small, &[(m1, t(m1))], red, 16 << 10);
        assert!(
            one < b / 2.0,
            "one size alone gives a far too small beta: {one}"
        );
        let (fa, fb, _) = fit(n, slow_small, &[(m1, t(m1)), (m4, t(m4))], red, 16 << 10);
        assert!((fa - 40.0).abs() < 1e-9);
        assert!((fb - b).abs() / b < 1e-9, "{fb} {b}");
        // A second timing no slower than the first (noise) falls back to the larger one alone.
        let (_, fb, _) = fit(n, 6.0 * a, &[(m1, t(m4)), (m4, t(m4))], red, 16 << 10);
        let (_, alone, _) = fit(n, 6.0 * a, &[(m4, t(m4))], red, 16 << 10);
        assert_eq!(fb, alone);
        // No large timing: beta at its floor, alpha and gamma still fitted.
        let (fa, fb, fg) = fit(n, 6.0 * a, &[], red, 16 << 10);
        assert_eq!((fa, fb), (a, 1e-7));
        assert!((fg - g).abs() / g < 1e-9);
    }
}

//! What slicing does to the formulas: a pipelined plan's fill (chains, binary trees), the
//! binomial trees' slices running through their rounds, and a reducing ring's pieces
//! overlapping one's reduction with the next one's bytes. `formula` is each plan unsliced; these
//! give the difference a plan's slices make, so that an unsliced plan keeps its formula.
#![forbid(unsafe_code)]

use super::formula;
use crate::algo::{Algorithm, Collective};

/// What a pipelined plan adds to `formula`'s pipelined limit for `n` ranks and `big` bytes cut
/// into slices of `slice` bytes, on a link of alpha `a`, beta `b` and per-message cost `o`,
/// reductions at `g`: the time its first slice takes to fill the pipeline, less that
/// slice's share of the limit. Without it the model priced long chains and deep trees as if
/// their slices were infinitely thin, and picked them at sizes where the buffer is a few slices.
/// - A chain (ring Broadcast and Reduce): the first slice crosses `n - 1` hops one after the
///   other, so every hop but one costs a whole slice (reduced on the way for Reduce) on top of
///   the bytes' own time; a tree of log n hops can be several times faster. Reduce's later
///   slices arrive while the one before is reduced, so they cost the slower of `b` and `g`
///   where `formula` (exact unsliced) charges both.
/// - A binary tree's AllReduce (`tree`, and `dbtree`'s two trees of half the buffer each) of
///   depth `d = ceil(log2 n)`: the first slice `s` climbs every level, where a parent receives
///   its two children's slices over its one ingress (`2 s b`) and reduces both (`2 s g`), then
///   comes down every level, where a parent sends it to both children over its one egress
///   (`2 s b`). The root has one child, so its level costs half: the first slice is done after
///   `(d - 1/2) (4 s b + 2 s g)` and the alphas `formula` counts, of which one slice's share
///   of the limit (`3 s b + 2 s g` for one tree, `4 s b + 2 s g` for a slice of each of the
///   two) is in `formula` already.
/// - A binomial tree (`tree` Broadcast and Reduce) of depth `d = ceil(log2 n)`, for which
///   `formula` charges `d` whole-buffer hops one after the other, is priced as its slices run
///   (`binomial_piped`); what is returned is the difference, which for Reduce is negative once
///   the buffer is several slices: the levels overlap.
pub(crate) fn pipeline_fill(
    algo: Algorithm,
    coll: Collective,
    n: f64,
    big: f64,
    slice: f64,
    (a, b, o, g): (f64, f64, f64, f64),
) -> f64 {
    let depth = n.log2().ceil();
    let tree = |s: f64, share: f64| ((depth - 0.5) * s * (4.0 * b + 2.0 * g) - share).max(0.0);
    match (algo, coll) {
        (Algorithm::Ring, Collective::Broadcast) => (n - 2.0).max(0.0) * big.min(slice) * b,
        (Algorithm::Ring, Collective::Reduce) => {
            // The next slice's bytes come in while a rank reduces this one: past the first
            // slice the chain runs at the slower of the two, not their sum.
            let s = big.min(slice);
            (n - 2.0).max(0.0) * s * (b + g) - (big - s) * b.min(g)
        }
        (Algorithm::Tree, Collective::AllReduce) => {
            let s = big.min(slice);
            tree(s, s * (3.0 * b + 2.0 * g))
        }
        (Algorithm::DbTree, Collective::AllReduce) => {
            let s = (big / 2.0).min(slice);
            tree(s, s * (4.0 * b + 2.0 * g))
        }
        (
            Algorithm::Ring | Algorithm::BidirRing,
            Collective::AllReduce | Collective::ReduceScatter,
        ) => ring_overlap(algo, n, big, slice, (a, b, o, g)),
        (Algorithm::Tree, Collective::Broadcast | Collective::Reduce) => {
            let rounds: Vec<Round> = (0..depth as usize)
                .map(|_| Round {
                    inter: false,
                    alpha: a,
                    whole: big * b,
                    slice: big.min(slice) * b,
                })
                .collect();
            let unpiped = formula(algo, coll, n, big, (a, b, 0.0, g)).unwrap_or(0.0);
            binomial_piped(coll, &rounds, big, big.min(slice), g) - unpiped
        }
        _ => 0.0,
    }
}

/// What a reducing ring's `n - 1` rounds (ReduceScatter, and AllReduce's first half) gain
/// over `formula`, which charges each round's chunk `c = big / n` its bytes and then its
/// reduction. The chunk goes in pieces: slices, and for `bidir_ring` the two rings' halves,
/// which run independently. A piece is forwarded once it is reduced, so while one piece is
/// reduced the next one's bytes flow, in this round or the next: the rounds take the longer of
/// one piece's hop and reduction in every round (`formula`'s figure, unsliced) and the first
/// piece's hop followed by every round's chunk at the slower of the rank's link and reduction,
/// and the rank's CPU busy from its first post to its last reduction: per round it reduces the
/// chunk and, per piece, posts one message and handles one received (`o` at either end), so
/// `bidir_ring`'s two pieces a round can make its rounds CPU-bound. Nothing for an unsliced
/// ring where alpha covers both ends' `o`, as a calibrated one does.
pub(crate) fn ring_overlap(
    algo: Algorithm,
    n: f64,
    big: f64,
    slice: f64,
    (a, b, o, g): (f64, f64, f64, f64),
) -> f64 {
    let c = big / n;
    let (lat, piece) = if algo == Algorithm::BidirRing {
        (a + o, (c / 2.0).min(slice))
    } else {
        (a, c.min(slice))
    };
    if piece <= 0.0 {
        return 0.0;
    }
    let pieces = (c / piece).ceil();
    let rounds = n - 1.0;
    let chained = rounds * (lat + piece * (b + g));
    let cpu = rounds * (c * g + pieces * 2.0 * o);
    let streamed = (lat + piece * b.min(g) + rounds * c * b.max(g)).max(cpu);
    chained.max(streamed) - rounds * (lat + c * (b + g))
}

/// One round of a binomial tree (distance `2^r` for round r): whether it crosses hosts, its
/// alpha, and its bytes' time for the whole buffer and for one slice on its link (shared as
/// the round shares it).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Round {
    pub inter: bool,
    pub alpha: f64,
    pub whole: f64,
    pub slice: f64,
}

/// A binomial Broadcast or Reduce of `big` bytes in slices of `s`, its rounds from the
/// nearest partner (round 0) to the farthest, reductions at `g` per byte. The plan sends every
/// slice as soon as it is there (and reduces every slice as soon as it is in), so:
/// - Broadcast: the root streams the buffer to its `d` children at once, sharing its links:
///   the child of round i has all of it once the root's link of that round has carried every
///   round's buffer sent over it; its last slice then goes down the biggest subtree, each node
///   again sharing its link among its own children of that kind (round j's child of a node
///   shares with the node's rounds up to j). The slowest of those paths. Unsliced on one level
///   that is `d a + d (d + 1) / 2 B b`: the root's sends share its link, then its children's.
/// - Reduce: the slowest of the first slice's climb through every round (a whole-buffer hop
///   and reduction each when unsliced: `formula`'s figure), the root reducing `d` buffers
///   after its nearest child's first slice is in, the root's busiest link carrying its
///   children's buffers before it reduces the last slice, and the slices as the nodes pass
///   them on (`binomial_reduce_streams`).
pub(crate) fn binomial_piped(coll: Collective, rounds: &[Round], big: f64, s: f64, g: f64) -> f64 {
    let d = rounds.len();
    if d == 0 {
        return 0.0;
    }
    let carried = |inter: bool| -> f64 {
        rounds
            .iter()
            .filter(|r| r.inter == inter)
            .map(|r| r.whole)
            .sum()
    };
    match coll {
        Collective::Reduce => {
            let climb: f64 = rounds.iter().map(|r| r.alpha + r.slice + s * g).sum();
            let first = rounds[0].alpha + rounds[0].slice;
            let cpu = first + d as f64 * big * g;
            let link = rounds[0].alpha + carried(false).max(carried(true)) + s * g;
            climb
                .max(cpu)
                .max(link)
                .max(binomial_reduce_streams(rounds, big, s, g))
        }
        _ => {
            let mut worst: f64 = 0.0;
            // The last slice's descent below round i's child: through rounds i-1, ..., 0.
            let mut below = 0.0;
            for (i, r) in rounds.iter().enumerate() {
                worst = worst.max(r.alpha + carried(r.inter) + below);
                let same = rounds[..=i].iter().filter(|q| q.inter == r.inter).count();
                below += r.alpha + same as f64 * r.slice;
            }
            worst
        }
    }
}

/// Most slices `binomial_reduce_streams` follows one by one; a buffer of more is followed in
/// this many equal pieces (the work grows with the slices and the square of the depth).
const STREAMED_SLICES: usize = 128;

/// A sliced binomial Reduce followed slice by slice, subtree by subtree. The subtree under a
/// node whose lowest round is `j` is a binomial tree of rounds `0..j` (its children hang
/// under it by rounds `0..j`), so one node of each order stands for all of them. A node
/// reduces slice `k` of its children in round order (`algo::tree`: each child's partial into
/// the accumulator after the previous child's) and sends it up once the last child's is in;
/// its CPU takes its reductions in the order they became ready, as the executor (and the
/// simulator) do, so a slice's chain waits behind the other slices' reductions that came in
/// before it, and a node whose children keep its CPU busy passes its first slice up late and
/// the rest in a burst. A node's children of one level share its one ingress of that level,
/// each sending its slices in order (`shared_ingress`). What this adds to the root-bound
/// price: the root's farthest children are subtrees that can only send once they have reduced
/// most of their buffer, and their slices then queue for the root's link and CPU. The slices
/// are taken as even pieces of the buffer; the receivers' handling is in the alphas.
fn binomial_reduce_streams(rounds: &[Round], big: f64, s: f64, g: f64) -> f64 {
    use std::cmp::Ordering;
    use std::collections::BinaryHeap;
    let finite = rounds
        .iter()
        .all(|r| r.alpha.is_finite() && r.slice.is_finite() && r.slice >= 0.0);
    if rounds.is_empty() || !finite || !(big > 0.0 && s > 0.0 && g.is_finite()) {
        return 0.0;
    }
    let k = ((big / s).ceil() as usize).clamp(1, STREAMED_SLICES);
    let piece = big / k as f64;
    let scale = piece / s;
    // When a node of each order has each slice ready to send: a leaf has them all at once.
    let mut sent: Vec<Vec<f64>> = vec![vec![0.0; k]];
    // A reduction that is ready: (ready at, child's round, slice), oldest first.
    #[derive(PartialEq)]
    struct Ready(f64, usize, usize);
    impl Eq for Ready {}
    impl Ord for Ready {
        fn cmp(&self, o: &Self) -> Ordering {
            o.0.total_cmp(&self.0)
                .then(o.1.cmp(&self.1))
                .then(o.2.cmp(&self.2))
        }
    }
    impl PartialOrd for Ready {
        fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
            Some(self.cmp(o))
        }
    }
    let reduce = piece * g;
    let mut done = 0.0;
    for j in 1..=rounds.len() {
        // Arrivals of each child's slices over the node's ingress of the child's level.
        let mut arrive = vec![vec![0.0; k]; j];
        for inter in [false, true] {
            let kids: Vec<usize> = (0..j).filter(|&i| rounds[i].inter == inter).collect();
            let cost: Vec<f64> = kids.iter().map(|&i| rounds[i].slice * scale).collect();
            let from: Vec<&[f64]> = kids.iter().map(|&i| sent[i].as_slice()).collect();
            for (c, at) in kids.iter().zip(shared_ingress(&from, &cost)) {
                arrive[*c] = at.iter().map(|t| t + rounds[*c].alpha).collect();
            }
        }
        let mut heap: BinaryHeap<Ready> = (0..k).map(|x| Ready(arrive[0][x], 0, x)).collect();
        let mut cpu: f64 = 0.0;
        let mut out = vec![0.0; k];
        while let Some(Ready(t, i, x)) = heap.pop() {
            cpu = cpu.max(t) + reduce;
            if i + 1 < j {
                heap.push(Ready(cpu.max(arrive[i + 1][x]), i + 1, x));
            } else {
                out[x] = cpu;
            }
        }
        done = cpu;
        sent.push(out);
    }
    done
}

/// When each slice's last byte is in, for streams of slices that share one ingress fairly:
/// stream `c` sends its slices in order, slice `x` from `sent[c][x]` on, each taking `cost[c]`
/// of the link alone; the streams with a slice on the wire split the link evenly (the
/// simulator's max-min sharing, `sim/share/mod.rs`, where nothing else is in the way).
fn shared_ingress(sent: &[&[f64]], cost: &[f64]) -> Vec<Vec<f64>> {
    let m = sent.len();
    let mut done: Vec<Vec<f64>> = sent.iter().map(|s| vec![0.0; s.len()]).collect();
    // The next slice of each stream, and what is left of it (in time on the link alone).
    let mut next = vec![0usize; m];
    let mut left: Vec<f64> = cost.to_vec();
    let mut now: f64 = 0.0;
    let mut active = Vec::with_capacity(m);
    loop {
        active.clear();
        let mut arrival = f64::INFINITY;
        for c in (0..m).filter(|&c| next[c] < sent[c].len()) {
            let t = sent[c][next[c]];
            if t <= now {
                active.push(c);
            } else {
                arrival = arrival.min(t);
            }
        }
        if active.is_empty() {
            if arrival.is_infinite() {
                return done;
            }
            now = arrival;
            continue;
        }
        let share = active.len() as f64;
        let first = active
            .iter()
            .map(|&c| left[c])
            .fold(f64::INFINITY, f64::min);
        let step = (first * share).min(arrival - now);
        for &c in &active {
            left[c] -= step / share;
        }
        // Landing on the next slice's start exactly, so that it joins the next pass.
        now = if step == arrival - now {
            arrival
        } else {
            now + step
        };
        for &c in &active {
            if left[c] <= 1e-12 * cost[c].max(1.0) {
                done[c][next[c]] = now;
                next[c] += 1;
                left[c] = cost[c];
            }
        }
    }
}

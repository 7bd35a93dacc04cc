//! Tests of the two-level model on synthetic hosts: the choices the measurements on emulated
//! hosts call for, the stability of fitted parameters, and the repeatability of choosing.
use super::*;
use crate::algo::Hosts;

/// A shared-memory intra level much faster than the network, whose latency and bandwidth are
/// `alpha` and `gbps`; the values are the ones spelled out below.
fn two_level(alpha: f64, gbps: f64) -> Model {
    let mut m = Model::new(alpha, gbps, 8.0).with_intra(Link {
        alpha_us: 1.0,
        beta_us_per_byte: gbps_to_us_per_byte(5.0),
        o_us: 0.5,
        eager_bytes: usize::MAX,
    });
    m.inter_o_us = Some(5.0);
    m
}

/// 1 Gbit/s.
const GBIT: f64 = 0.125;

fn on(x: usize, y: usize) -> Options {
    Options {
        hosts: Hosts::blocks(x * y, y),
        ..Options::default()
    }
}

/// `coll` moving `bytes` bytes in all (the whole vector) on `n` ranks, in floats.
fn problem(coll: Collective, n: usize, bytes: usize) -> Problem {
    let count = match coll {
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => bytes / 4 / n,
        _ => bytes / 4,
    };
    Problem::new(coll, n, count.max(1))
}

#[test]
fn one_host_layouts_keep_the_one_level_choices() {
    let m = two_level(50.0, GBIT);
    let one = Model::new(50.0, GBIT, 8.0);
    for hosts in [
        Hosts::ONE,
        Hosts::blocks(8, 8),
        Hosts::from_labels(&["a"; 8]),
    ] {
        let opts = Options {
            hosts,
            ..Options::default()
        };
        for coll in Collective::ALL {
            for bytes in [64, 64 << 10, 16 << 20] {
                let p = problem(coll, 8, bytes);
                let (a, o) = m.choose(&p, 4, opts);
                assert_eq!((a, o), one.choose(&p, 4, opts), "{coll:?} {bytes}");
                assert_eq!(m.levels_for(Algorithm::Hier, &p, 4, opts), opts);
            }
        }
    }
}

#[test]
fn two_hosts_of_two_at_1_gbit_pick_a_hierarchy_from_64k() {
    let m = two_level(50.0, GBIT);
    let opts = on(2, 2);
    for coll in [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
    ] {
        for bytes in [64 << 10, 1 << 20, 64 << 20] {
            let p = problem(coll, 4, bytes);
            let (a, o) = m.choose(&p, 4, opts);
            assert!(
                matches!(a, Algorithm::Hier | Algorithm::Swizzle),
                "{coll:?} {bytes}: {a}"
            );
            // The levels chosen are the ones priced, and beat a flat ring by far.
            let hier = m.predict_on(a, &p, 4, &o).unwrap();
            let ring = m.predict_on(Algorithm::Ring, &p, 4, &o).unwrap();
            assert!(hier * 1.2 < ring, "{coll:?} {bytes}: {hier} vs ring {ring}");
            assert_eq!(m.levels_for(a, &p, 4, opts), o);
        }
    }
    // Where the network carries half as much, the hierarchy takes about two thirds of the
    // ring's time, as measured on emulated hosts at 1 MiB (docs/performance.md, "Several hosts").
    let p = problem(Collective::AllReduce, 4, 1 << 20);
    let ratio = m.predict_on(Algorithm::Hier, &p, 4, &opts).unwrap()
        / m.predict_on(Algorithm::Ring, &p, 4, &opts).unwrap();
    assert!((0.6..0.8).contains(&ratio), "{ratio}");
}

#[test]
fn four_hosts_of_one_at_1_gbit_ring_from_1m_latency_algorithms_below() {
    let m = two_level(50.0, GBIT);
    let opts = on(4, 1);
    for bytes in [1 << 20, 4 << 20, 64 << 20] {
        let p = problem(Collective::AllReduce, 4, bytes);
        assert_eq!(m.choose(&p, 4, opts).0, Algorithm::Ring, "{bytes}");
    }
    for bytes in [16, 256, 4096] {
        let p = problem(Collective::AllReduce, 4, bytes);
        let (a, _) = m.choose(&p, 4, opts);
        assert!(
            matches!(a, Algorithm::Rd | Algorithm::Mesh1 | Algorithm::Tree),
            "{bytes}: {a}"
        );
        // One or two rounds against the ring's six.
        let ring = m.predict_on(Algorithm::Ring, &p, 4, &opts).unwrap();
        assert!(m.predict_on(a, &p, 4, &opts).unwrap() * 2.0 < ring);
        // Broadcast: the binomial tree's two rounds against the chain's three hops.
        let b = problem(Collective::Broadcast, 4, bytes);
        let tree = m.predict_on(Algorithm::Tree, &b, 4, &opts).unwrap();
        assert!(tree < m.predict_on(Algorithm::Ring, &b, 4, &opts).unwrap());
    }
}

#[test]
fn with_1_ms_of_delay_one_round_beats_recursive_doubling() {
    let m = two_level(1000.0, GBIT);
    let p = problem(Collective::AllReduce, 4, 256 << 10);
    let opts = on(4, 1);
    assert_eq!(m.choose(&p, 4, opts).0, Algorithm::Mesh);
    let mesh = m.predict_on(Algorithm::Mesh, &p, 4, &opts).unwrap();
    let rd = m.predict_on(Algorithm::Rd, &p, 4, &opts).unwrap();
    assert!(mesh * 1.1 < rd, "{mesh} {rd}");
}

#[test]
fn recursive_halving_pays_for_all_ranks_of_a_host_crossing_at_once() {
    // 2 hosts x 4: rdh's first halving step sends half the vector across from every rank.
    let m = two_level(50.0, GBIT);
    let p = problem(Collective::ReduceScatter, 8, 16 << 20);
    let opts = on(2, 4);
    let rdh = m.predict_on(Algorithm::Rdh, &p, 4, &opts).unwrap();
    let ring = m.predict_on(Algorithm::Ring, &p, 4, &opts).unwrap();
    let hier = m.predict_on(Algorithm::Hier, &p, 4, &opts).unwrap();
    // rdh: 4 ranks x 8 MiB over one link; ring: one flow of 7/8 x 16 MiB; hier: 1/2 of it.
    assert!(rdh > 1.9 * ring && ring > 1.6 * hier, "{rdh} {ring} {hier}");
}

#[test]
fn forced_hier_takes_the_best_pair() {
    let m = two_level(50.0, GBIT);
    let p = problem(Collective::AllReduce, 4, 64 << 10);
    let opts = on(2, 2);
    let o = m.levels_for(Algorithm::Hier, &p, 4, opts);
    assert_ne!((o.intra, o.inter), (Algorithm::Ring, Algorithm::Ring));
    let best = m.predict_on(Algorithm::Hier, &p, 4, &opts).unwrap();
    let ring_ring = m.net().hier(
        Collective::AllReduce,
        &layout(&p, &opts),
        65536.0,
        Algorithm::Ring,
        Algorithm::Ring,
    );
    assert!(best < ring_ring.unwrap().us);
    // Other algorithms keep their options.
    assert_eq!(m.levels_for(Algorithm::Ring, &p, 4, opts), opts);
}

fn layout(p: &Problem, opts: &Options) -> levels::Layout {
    levels::Layout::new(p, opts)
}

#[test]
fn uneven_hosts_and_every_collective_are_priced() {
    let m = two_level(50.0, GBIT)
        .with_eager(16 << 10)
        .with_intra_eager(4 << 10);
    let opts = Options {
        hosts: Hosts::from_labels(&[0, 0, 0, 1, 1, 2]),
        ..Options::default()
    };
    for coll in Collective::ALL {
        for bytes in [16, 1 << 20] {
            let p = problem(coll, 6, bytes).with_root(4);
            let (a, _) = m.choose(&p, 4, opts);
            let t = m.predict_on(a, &p, 4, &opts).unwrap();
            assert!(t.is_finite() && t > 0.0, "{coll:?} {bytes}: {a} {t}");
        }
    }
}

#[test]
fn candidates_describe_each_level() {
    let m = two_level(50.0, GBIT);
    let p = problem(Collective::AllReduce, 4, 1 << 20);
    let c = m.candidates(&p, 4, &on(2, 2));
    let h = c
        .iter()
        .find(|c| {
            c.algo == Algorithm::Hier && c.intra == Algorithm::Ring && c.inter == Algorithm::Tree
        })
        .unwrap();
    let d = h.describe();
    assert!(d.starts_with("hier(ring x tree) "), "{d}");
    assert!(d.contains(" us = intra ") && d.contains(" + inter "), "{d}");
    assert_eq!(
        c[0].describe().split(' ').count(),
        3,
        "flat: name, time, unit"
    );
}

/// The choice among every (intra, inter) pair depends on the problem alone: asked again (as
/// each rank asks on its own), it gives the same algorithm and options. (How long it takes is
/// a benchmark's business, not a test's: a loaded machine would make any bound flaky.)
#[test]
fn choosing_among_every_pair_is_repeatable() {
    let m = two_level(50.0, GBIT);
    let opts = on(8, 8);
    let p = problem(Collective::AllReduce, 64, 1 << 20);
    let first = format!("{:?}", m.choose(&p, 4, opts));
    for _ in 0..4 {
        assert_eq!(format!("{:?}", m.choose(&p, 4, opts)), first);
    }
    let again = two_level(50.0, GBIT);
    assert_eq!(format!("{:?}", again.choose(&p, 4, opts)), first);
}

/// Samples of a link with alpha `a`, beta `b`, per-message cost `o`, each repetition off by up
/// to +-1 % (`seed` varies the draw) and one of each seven 5 times slower.
fn samples(a: f64, b: f64, o: f64, seed: u64) -> LinkSamples {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut noisy = |t: f64, i: usize| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let u = (x >> 11) as f64 / (1u64 << 53) as f64;
        let slow = if i == (seed as usize) % 7 { 5.0 } else { 1.0 };
        t * (1.0 + 0.02 * (u - 0.5)) * slow
    };
    let reps = |t: f64, noisy: &mut dyn FnMut(f64, usize) -> f64| {
        (0..7).map(|i| noisy(t, i)).collect::<Vec<f64>>()
    };
    LinkSamples {
        pingpong: reps(2.0 * a, &mut noisy),
        one_way: [256 << 10, 1 << 20]
            .iter()
            .map(|&m| (m, reps(2.0 * a + m as f64 * b, &mut noisy)))
            .collect(),
        burst: reps(2.0 * a + 7.0 * o, &mut noisy),
        burst_len: 8,
    }
}

#[test]
fn noisy_calibrations_fit_the_same_parameters_and_choices() {
    // Parameters on the quantization grid, as an unchanged machine's medians would round to.
    let (a, b, o) = (
        quantize(50.0),
        quantize(gbps_to_us_per_byte(GBIT)),
        quantize(5.0),
    );
    let fits: Vec<Link> = (0..20)
        .map(|s| fit_link(&samples(a, b, o, s), 16 << 10))
        .collect();
    for f in &fits {
        assert_eq!(*f, fits[0]);
    }
    assert!((fits[0].alpha_us - a).abs() < 1e-9 && (fits[0].beta_us_per_byte - b).abs() < 1e-12);
    assert!((fits[0].o_us - o).abs() < 1e-9, "{:?}", fits[0]);
    // Off the grid, fits may round either way, but the choices stay: the margin.
    let opts = on(2, 2);
    let choices = |l: Link| -> Vec<Algorithm> {
        let mut m = two_level(l.alpha_us, GBIT);
        m.beta_us_per_byte = l.beta_us_per_byte;
        m.inter_o_us = Some(l.o_us);
        [16, 4096, 64 << 10, 1 << 20, 16 << 20]
            .iter()
            .flat_map(|&bytes| Collective::ALL.map(|c| m.choose(&problem(c, 4, bytes), 4, opts).0))
            .collect()
    };
    let first = choices(fit_link(&samples(47.0, b * 1.03, 5.3, 0), 16 << 10));
    for s in 1..20 {
        let l = fit_link(&samples(47.0, b * 1.03, 5.3, s), 16 << 10);
        assert_eq!(choices(l), first, "seed {s}");
    }
}

#[test]
fn medians_ignore_outliers_and_quantization_is_a_grid() {
    assert_eq!(fit::median(&[1.0, 100.0, 2.0]), Some(2.0));
    assert_eq!(fit::median(&[]), None);
    assert_eq!(quantize(quantize(37.0)), quantize(37.0));
    assert!((quantize(37.0) / 37.0 - 1.0).abs() < 0.045);
    assert_eq!(quantize(0.0), 0.0);
}

/// The two-level AllGather and ReduceScatter run their intra-host phase once per host of the
/// vector's blocks: each rank sends `hosts` times the messages of one intra collective. On 64
/// hosts that costs the same bytes but 63 times more messages more than on one host's worth,
/// so a small AllGather's hier(rdh x rdh) costs more per host added, not only per round.
#[test]
fn a_hierarchy_pays_for_its_per_host_intra_phases() {
    let m = two_level(1.0, 12.5);
    let price = |x: usize, coll: Collective| {
        let p = problem(coll, x * 8, 8 << 10);
        m.candidates(&p, 4, &on(x, 8))
            .into_iter()
            .find(|c| {
                c.algo == Algorithm::Hier && c.intra == Algorithm::Rdh && c.inter == Algorithm::Rdh
            })
            .map(|c| c.us)
            .expect("hier(rdh x rdh) is priced")
    };
    for coll in [Collective::AllGather, Collective::ReduceScatter] {
        let (few, many) = (price(8, coll), price(64, coll));
        // rdh among 8 ranks sends log2(8) messages per rank; each added host adds as many,
        // each at the intra level's `o`.
        assert!(
            many - few >= 56.0 * 3.0 * 0.5,
            "{coll:?}: {few} us on 8 hosts, {many} on 64"
        );
    }
}

/// `algo`'s AllToAll of a `big`-byte buffer per rank on 2 hosts of 2, as the flat model prices it.
fn all_to_all_on_2x2(m: &Model, algo: Algorithm, big: f64) -> f64 {
    let p = Problem::new(Collective::AllToAll, 4, big as usize / 16);
    let lay = layout(&p, &on(2, 2));
    m.net()
        .flat(algo, Collective::AllToAll, &lay, big, 0)
        .unwrap()
}

/// Bruck's rounds are priced from their pairs: on 2 hosts of 2 an AllToAll sends two blocks a
/// round; in round 1 one rank of each host crosses the network (its alpha plus the two blocks'
/// bytes, slower than shared memory's pair), in round 2 both do, but not together: the rank
/// whose first round stayed inside the host enters the second early, so a rank's chain is two
/// rounds each alone on the NIC. That chain, or where the bytes dominate, the NIC's three
/// rounds' shares of two blocks each and one alpha after them; then the formula's extra half
/// block per peer, spread over the ranks' links (2/3 of two rounds' bytes through each NIC).
#[test]
fn bruck_rounds_are_priced_from_their_pairs() {
    let mut m = two_level(10.0, 1.0);
    m.eager_bytes = usize::MAX;
    let b = 1e-3;
    for (big, want) in [
        // Blocks of big/4: the chain, 2 (alpha + 2 blocks b).
        (4000.0, 2.0 * (10.0 + 2000.0 * b)),
        // The NIC: 3 x 2 blocks b + alpha.
        (40000.0, 3.0 * 20000.0 * b + 10.0),
    ] {
        let t = all_to_all_on_2x2(&m, Algorithm::Bruck, big);
        let want = want + 2.0 * big / 2.0 * 2.0 / 3.0 * b;
        assert!((t - want).abs() < 1e-9, "{big} B: {t} us, by hand {want}");
    }
}

/// Pairwise keeps `WINDOW` exchanges in flight, so on 2 hosts of 2 its three steps wait for
/// one another once (one network alpha); a rank posts and handles its one message inside the
/// host and two across, `o` each at its level; its host's NIC carries 2/3 of both ranks'
/// (n-1)/n of the buffer, then one alpha. The slowest of the three.
#[test]
fn pairwise_is_its_cpu_or_its_bytes() {
    let m = two_level(10.0, 1.0);
    let b = 1e-3;
    let cpu = 2.0 * (0.5 + 2.0 * 5.0);
    for (big, want) in [
        (4000.0, cpu),
        (40000.0, 2.0 * 0.75 * 40000.0 * 2.0 / 3.0 * b + 10.0),
    ] {
        let t = all_to_all_on_2x2(&m, Algorithm::Pairwise, big);
        assert!((t - want).abs() < 1e-9, "{big} B: {t} us, by hand {want}");
    }
}

/// The swizzle's local phases run in a row, and between their steps each rank's CPU posts the
/// part it sends across and handles and reduces the one it receives (`2 o` at the network's
/// level and a slice's reduction): on 4 hosts of 4, rdh inside, a small ReduceScatter's rounds
/// are each a local phase and that work; a larger one's parts leave a host one after the
/// other, the last one alpha later, and is reduced twice (the last partial, then the host's
/// own).
#[test]
fn a_swizzles_local_phases_wait_for_its_cpu_or_its_network() {
    let m = two_level(10.0, 1.0);
    let (bi, be, g, oe) = (2e-4, 1e-3, 1.25e-4, 5.0);
    let price = |big: f64, x: usize| {
        let p = problem(Collective::ReduceScatter, x * 4, big as usize);
        let lay = layout(&p, &on(x, 4));
        m.net()
            .swizzle(Collective::ReduceScatter, &lay, big, Algorithm::Rdh)
            .unwrap()
            .us
    };
    // rdh among 4 ranks on a part of big/x: 2 alphas, 3/4 of it through the link and reduced.
    let local = |part: f64| 2.0 + 0.75 * part * (bi + g);
    let (big, x) = (6400.0, 4);
    let slice = big / 16.0;
    let want = local(big / 4.0) + 3.0 * (local(big / 4.0) + 2.0 * oe + slice * g) + slice * g;
    let t = price(big, x);
    assert!((t - want).abs() < 1e-9, "{t} us, by hand {want}");
    let (big, x) = (32000.0, 2);
    let slice = big / 8.0;
    let want = local(big / 2.0) + 4.0 * slice * be + 10.0 + 2.0 * slice * g;
    let t = price(big, x);
    assert!((t - want).abs() < 1e-9, "{t} us, by hand {want}");
}

/// The two-level ReduceScatter's intra-host phase runs one rdh per host of the vector's
/// blocks, all at once: on 8 hosts of 8 it takes the longer of one rdh of the whole vector
/// (3 alphas, 7/8 of it through the link and reduced) and the rank's CPU work (8 hosts' 3
/// messages, each posted and handled at `o`, and the reductions of 7/8 of the vector).
#[test]
fn a_hierarchys_per_host_phases_take_the_longer_of_their_bytes_and_their_cpu() {
    let m = two_level(1.0, 12.5);
    let (bi, g) = (2e-4, 1.25e-4);
    for big in [65536.0, 1048576.0] {
        let p = problem(Collective::ReduceScatter, 64, big as usize);
        let intra = m
            .candidates(&p, 4, &on(8, 8))
            .into_iter()
            .find(|c| {
                c.algo == Algorithm::Hier && c.intra == Algorithm::Rdh && c.inter == Algorithm::Rdh
            })
            .expect("hier(rdh x rdh) is priced")
            .parts[0]
            .1;
        let single: f64 = 3.0 + 0.875 * big * (bi + g);
        let cpu = 2.0 * 8.0 * 3.0 * 0.5 + 0.875 * big * g;
        let want = single.max(cpu);
        assert!(
            (intra - want).abs() < 1e-9,
            "{big} B: {intra} us, by hand {want}"
        );
    }
}

/// The swizzle's overlapped rounds are no faster than the CPU's work in them: on 2 hosts of 4
/// a tiny ReduceScatter's round posts rdh's 2 messages inside the host and one across (each at
/// its level's `o`) and handles as many, which takes longer than the round's bytes; the local
/// phase comes first.
#[test]
fn a_swizzle_round_is_no_faster_than_its_cpu() {
    let m = two_level(1.0, 1.0);
    let p = problem(Collective::ReduceScatter, 8, 32);
    let lay = layout(&p, &on(2, 4));
    let t = m
        .net()
        .swizzle(Collective::ReduceScatter, &lay, 32.0, Algorithm::Rdh)
        .unwrap()
        .us;
    assert!((t - 14.0).abs() < 0.01, "{t}");
}

/// The two-level AllReduce's lanes on 4 hosts of 4: each of the 4 lanes all-reduces a
/// quarter of the vector (`s`) by rdh among 4 hosts, the 4 lanes sharing each host's link.
/// Together, each round pays its alpha and the lanes' bytes at a quarter of the link:
/// `2 a + 2 (3/4) s (4 b) + (3/4) s g` beyond rdh's two rounds' alphas, `4 a` in all. After a
/// `mesh` ReduceScatter whose part's reduction `s g` outlasts the gap between two parts'
/// arrivals (`2 o + s b_intra`), the lanes enter apart and their alphas overlap the others'
/// bytes: the longer of one lane alone (`4 a + 2 (3/4) s b + (3/4) s g`) and every lane's
/// bytes and reductions plus one alpha (`2 (3/4) s (4 b) + (3/4) s g + a`). After an rdh
/// ReduceScatter, or with parts too small, together.
#[test]
fn lanes_that_enter_apart_overlap_their_alphas_with_each_others_bytes() {
    let (a, b, g, bi, oi) = (10.0, 1e-3, 5e-4, 2e-4, 0.5);
    let m = Model::new(a, 1.0, 2.0).with_intra(Link {
        alpha_us: 1.0,
        beta_us_per_byte: bi,
        o_us: oi,
        eager_bytes: usize::MAX,
    });
    let inter = |big: f64, intra: Algorithm| {
        let p = problem(Collective::AllReduce, 16, big as usize);
        m.candidates(&p, 4, &on(4, 4))
            .into_iter()
            .find(|c| c.algo == Algorithm::Hier && c.intra == intra && c.inter == Algorithm::Rdh)
            .expect("hier(intra x rdh) is priced")
            .parts[1]
            .1
    };
    let together = |s: f64| 4.0 * a + 2.0 * 0.75 * s * 4.0 * b + 0.75 * s * g;
    let alone = |s: f64| 4.0 * a + 2.0 * 0.75 * s * b + 0.75 * s * g;
    let bytes = |s: f64| 2.0 * 0.75 * s * 4.0 * b + 0.75 * s * g + a;
    for (big, intra, apart) in [
        (64000.0, Algorithm::Mesh, true),
        (64000.0, Algorithm::Rdh, false),
        (64000.0, Algorithm::Ring, false),
        (8000.0, Algorithm::Mesh, false),
    ] {
        let s = big / 4.0;
        assert_eq!(s * g > 2.0 * oi + s * bi, big > 10000.0);
        let want = if apart {
            alone(s).max(bytes(s)).min(together(s))
        } else {
            together(s)
        };
        let t = inter(big, intra);
        assert!(
            (t - want).abs() < 1e-9,
            "{big} B after {intra}: {t} us, by hand {want}"
        );
    }
    // Apart, the bytes are the longer here: 96 + 6 + 10 against the 142 together.
    assert!((inter(64000.0, Algorithm::Mesh) - 112.0).abs() < 1e-9);
}

//! Tests of the one-level model (one host): choices, eager slicing, and the calibration fit.
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
            Algorithm::Rd | Algorithm::Rdh | Algorithm::Tree | Algorithm::DbTree | Algorithm::Mesh1
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
            // AllReduce's bidir_ring, whose two rings overlap one's reduction with the other's
            // bytes (`ring_overlap`), may beat mesh and rdh; between those two the handshakes
            // decide: mesh alone, rdh where ranks share CPUs.
            for (m, win, lose) in [
                (&tcp, Algorithm::Mesh, Algorithm::Rdh),
                (&shared, Algorithm::Rdh, Algorithm::Mesh),
            ] {
                let pick = m.choose(&p, 4, Options::default()).0;
                assert!(
                    pick == win
                        || (p.coll == Collective::AllReduce && pick == Algorithm::BidirRing),
                    "{:?} of {bytes} B: {pick}",
                    p.coll
                );
                assert!(m.predict(win, &p, 4).unwrap() < m.predict(lose, &p, 4).unwrap());
            }
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
fn a_long_chain_pays_for_filling_its_pipeline() {
    // 64 ranks, 1 MiB slices: a 2 MiB Broadcast is two slices, so the ring chain's first slice
    // crosses 63 hops before the second follows; a tree's log2(64) = 6 hops win.
    let m = Model::new(1.0, 12.5, 20.0).with_slice(1 << 20);
    let bcast = |n: usize, bytes: usize| Problem::new(Collective::Broadcast, n, bytes / 4);
    let time = |a: Algorithm, p: &Problem| m.predict(a, p, 4).unwrap();
    let p = bcast(64, 2 << 20);
    let (ring, tree) = (time(Algorithm::Ring, &p), time(Algorithm::Tree, &p));
    assert!(ring > 2.0 * tree, "ring {ring} us, tree {tree} us");
    assert_ne!(m.choose(&p, 4, Options::default()).0, Algorithm::Ring);
    // The fill is one slice per hop: the same chain on thin slices costs less.
    let thin = m.clone().with_slice(64 << 10);
    assert!(thin.predict(Algorithm::Ring, &p, 4).unwrap() < ring);
    // A short chain over many slices still beats the tree's log2(n) full copies.
    let p = bcast(4, 64 << 20);
    assert!(time(Algorithm::Ring, &p) < time(Algorithm::Tree, &p));
    // Reduce pays the fill's reductions too.
    let r = Problem::new(Collective::Reduce, 64, (2 << 20) / 4);
    assert!(time(Algorithm::Ring, &r) > time(Algorithm::Ring, &bcast(64, 2 << 20)));
}

#[test]
fn a_tree_pays_for_filling_its_pipeline_and_reducing_two_children() {
    // 16 ranks: NCCL's binary tree has depth 4, its root one child. One slice climbs the
    // levels (two children share the parent's ingress, 2 s b, and are reduced, 2 s g) and comes
    // down (a parent sends to both children, 2 s b), the root's level half of that.
    let (a, b, g) = (2.0, gbps_to_us_per_byte(10.0), gbps_to_us_per_byte(5.0));
    let slice = 1 << 20;
    let m = Model::new(a, 10.0, 5.0).with_slice(slice);
    let ar = |bytes: usize| Problem::new(Collective::AllReduce, 16, bytes / 4);
    let time = |x: Algorithm, p: &Problem| m.predict(x, p, 4).unwrap();
    let level = |s: f64| 4.0 * s * b + 2.0 * s * g;
    let s = slice as f64;
    let close = |x: f64, y: f64| (x - y).abs() < 1e-9 * y;
    // One slice: the fill is all of it but the alphas.
    let t = time(Algorithm::Tree, &ar(slice));
    assert!(close(t, 2.0 * 4.0 * a + 3.5 * level(s)), "tree {t} us");
    // The double tree: a slice of half the buffer in each tree, `o` per level too.
    let t = time(Algorithm::DbTree, &ar(slice));
    assert!(
        close(t, 2.0 * 4.0 * (a + a / 2.0) + 3.5 * level(s / 2.0)),
        "dbtree {t} us"
    );
    // Many slices: the pipelined limit (the tree's interior nodes reduce two children's
    // partials of the whole buffer) plus the same fill.
    let big = 64.0 * s;
    let fill = 3.5 * level(s) - (3.0 * s * b + 2.0 * s * g);
    let t = time(Algorithm::Tree, &ar(64 * slice));
    let piped = 2.0 * 4.0 * a + 3.0 * big * b + 2.0 * big * g;
    assert!(close(t, piped + fill), "tree {t} us");
    // Thinner slices fill sooner.
    let thin = m.clone().with_slice(64 << 10);
    assert!(
        thin.predict(Algorithm::DbTree, &ar(64 * slice), 4).unwrap()
            < time(Algorithm::DbTree, &ar(64 * slice))
    );
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
    // Ranks whose tiny AllReduce rounds cost several times a large round's latency (waiting
    // to be scheduled): subtracting the tiny rounds from one large timing leaves nothing.
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

/// An int8 AllReduce of 4096 floats on 4 ranks with `exchanges`, `codec_us` and `tiers`.
fn int8_price(
    exchanges: Vec<crate::tune::Exchange>,
    codec_us: f64,
    tiers: Option<Vec<usize>>,
) -> crate::tune::CompressedPrice {
    crate::tune::CompressedPrice {
        shape: crate::tune::Shape::AllReduce,
        format: crate::compress::Format::Int8,
        block: 256,
        nranks: 4,
        count: 4096,
        elem: 4,
        exchanges,
        codec_us,
        rate: crate::tune::CodecRate::of(crate::compress::Format::Int8),
        chunks: 1,
        tiers,
    }
}

/// The codec's work per rank: AllReduce quantizes its input and its segment's sum, adds every
/// rank's codes of its segment and decodes the whole result; the price is linear in it, zero
/// when off or alone, and the total adds the exchanges to it.
#[test]
fn compressed_price_counts_the_codec_work_and_the_exchanges() {
    use crate::compress::Format;
    use crate::tune::{codec_elements, codec_us, Exchange, Shape};
    assert_eq!(
        codec_elements(Shape::AllReduce, 4, 1000),
        (1250, 1000, 1000)
    );
    assert_eq!(
        codec_elements(Shape::AllReduce, 3, 1000),
        (1334, 1002, 1000)
    );
    assert_eq!(
        codec_elements(Shape::ReduceScatter, 4, 100),
        (500, 400, 100)
    );
    assert_eq!(codec_elements(Shape::AllGather, 4, 100), (100, 0, 400));
    assert_eq!(codec_us(Format::Off, Shape::AllReduce, 4, 1 << 20), 0.0);
    assert_eq!(codec_us(Format::Int8, Shape::AllReduce, 1, 1 << 20), 0.0);
    for f in Format::CODED {
        let one = codec_us(f, Shape::AllReduce, 4, 1 << 20);
        let two = codec_us(f, Shape::AllReduce, 4, 2 << 20);
        assert!(
            one > 0.0 && (two / one - 2.0).abs() < 1e-9,
            "{f}: {one} {two}"
        );
    }
    // fp16's accumulate is its slowest loop: it costs more than bf16 for the same work.
    assert!(
        codec_us(Format::Fp16, Shape::AllReduce, 4, 1 << 20)
            > codec_us(Format::Bf16, Shape::AllReduce, 4, 1 << 20)
    );
    let x = |coll, us| Exchange {
        coll,
        bytes: 1024,
        algo: Algorithm::Mesh,
        us,
        level: None,
    };
    let mut p = int8_price(
        vec![
            x(Collective::AllToAll, Some(10.0)),
            x(Collective::AllGather, Some(5.0)),
        ],
        2.5,
        None,
    );
    assert_eq!(p.total_us(), Some(17.5));
    let text = p.describe();
    for w in [
        "16384 B",
        "int8",
        "AllToAll of 1024 B",
        "codec 2.5 us",
        "17.5 us",
    ] {
        assert!(text.contains(w), "{w}: {text}");
    }
    p.exchanges[1].us = None;
    assert_eq!(p.total_us(), None);
}

/// A pipelined call (several chunks): every chunk's exchanges and the codec overlap, so the
/// price is the larger of the two plus one chunk's share of the codec; the log line says so.
#[test]
fn a_pipelined_compressed_price_overlaps_the_codec_and_the_wire() {
    use crate::tune::Exchange;
    let x = |us| Exchange {
        coll: Collective::AllToAll,
        bytes: 1024,
        algo: Algorithm::Mesh,
        us: Some(us),
        level: None,
    };
    let p = crate::tune::CompressedPrice {
        chunks: 4,
        ..int8_price(vec![x(6.0), x(4.0)], 20.0, None)
    };
    // max(wire, codec) + codec / chunks: the wire 4 chunks of (6 + 4), the codec 20.
    assert_eq!(p.total_us(), Some(45.0));
    let slow = crate::tune::CompressedPrice {
        codec_us: 80.0,
        ..p.clone()
    };
    assert_eq!(slow.total_us(), Some(100.0));
    assert!(
        p.describe().contains("pipelined in 4 chunks"),
        "{}",
        p.describe()
    );
    let one = crate::tune::CompressedPrice { chunks: 1, ..p };
    assert_eq!(one.total_us(), Some(30.0));
    assert!(!one.describe().contains("pipelined"));
}

/// The inter-host-only composition: the codec works on a host's share of the data, a lane's
/// exchange of codes is priced on the network (its link shared by the host's lanes) and a
/// host's exchange of full-precision data on shared memory, the log line says which
/// composition ran, and a pipelined one overlaps the codec and the wire as every level's.
#[test]
fn tiered_compressed_price_prices_codes_on_the_network_only() {
    use crate::compress::Format;
    use crate::tune::{codec_elements_tiered, codec_us, codec_us_tiered, Exchange, Shape, Tier};
    // 2 hosts x 2 ranks, AllReduce of 1000: slice 500, segment 250.
    assert_eq!(
        codec_elements_tiered(Shape::AllReduce, &[2, 2], 1000),
        (750, 500, 500)
    );
    assert_eq!(
        codec_elements_tiered(Shape::ReduceScatter, &[2, 2, 2], 100),
        (400, 300, 100)
    );
    assert_eq!(
        codec_elements_tiered(Shape::AllGather, &[3, 3], 100),
        (100, 0, 200)
    );
    // Hosts of 3 + 2 ranks: two lanes, rank 2 extra. AllReduce as on 2 x 2; lane 0's rank of
    // the first host sums and owns two blocks (its own and the extra's) of ReduceScatter, and
    // its lane holds three blocks (AllGather decodes them).
    assert_eq!(
        codec_elements_tiered(Shape::AllReduce, &[3, 2], 1000),
        (750, 500, 500)
    );
    assert_eq!(
        codec_elements_tiered(Shape::ReduceScatter, &[3, 2], 100),
        (500, 400, 200)
    );
    assert_eq!(
        codec_elements_tiered(Shape::AllGather, &[3, 2], 100),
        (100, 0, 300)
    );
    // Less codec work than every level compressed, and none on one host.
    assert!(
        codec_us_tiered(Format::Int8, Shape::AllReduce, &[2, 2], 1 << 20)
            < codec_us(Format::Int8, Shape::AllReduce, 4, 1 << 20)
    );
    assert_eq!(
        codec_us_tiered(Format::Int8, Shape::AllReduce, &[4], 1 << 20),
        0.0
    );
    let m = Model::new(10.0, 1.0, 10.0);
    let lane = |bytes, lanes| {
        m.tier_exchange_us(
            Tier::Lane,
            Collective::AllToAll,
            Algorithm::Pairwise,
            2,
            bytes,
            lanes,
        )
        .unwrap()
    };
    let host = |bytes| {
        m.tier_exchange_us(
            Tier::Host,
            Collective::AllToAll,
            Algorithm::Pairwise,
            2,
            bytes,
            1,
        )
        .unwrap()
    };
    // Fewer bytes (codes) cost less; lanes sharing the link cost more; shared memory is faster
    // than the network for the same bytes.
    assert!(lane(1 << 18, 2) < lane(1 << 20, 2));
    assert!(lane(1 << 20, 1) < lane(1 << 20, 2));
    assert!(host(1 << 20) < lane(1 << 20, 1));
    let p = int8_price(
        vec![Exchange {
            coll: Collective::AllToAll,
            bytes: 1024,
            algo: Algorithm::Pairwise,
            us: Some(1.0),
            level: Some(Tier::Lane),
        }],
        1.0,
        Some(vec![2, 2]),
    );
    let text = p.describe();
    for w in [
        "inter-host level only (2 hosts x 2 ranks",
        "lane AllToAll of 1024 B",
    ] {
        assert!(text.contains(w), "{w}: {text}");
    }
    // Pipelined as every level's: the larger of the wire (4 chunks of 1) and the codec (8),
    // plus one chunk's share of the codec.
    let piped = crate::tune::CompressedPrice {
        chunks: 4,
        codec_us: 8.0,
        ..p.clone()
    };
    assert_eq!(piped.total_us(), Some(10.0));
    let text = piped.describe();
    for w in [
        "inter-host level only",
        "pipelined in 4 chunks",
        "codec 8.0 us",
    ] {
        assert!(text.contains(w), "{w}: {text}");
    }
    let uneven = crate::tune::CompressedPrice {
        tiers: Some(vec![2, 2, 1]),
        ..p
    };
    let text = uneven.describe();
    assert!(
        text.contains("inter-host level only (3 hosts of [2, 2, 1] ranks, 1 lane;"),
        "{text}"
    );
}

/// A mesh round (`exchange`): every rank posts its n-1 sends while their bytes flow, then
/// handles the n-1 messages it received, `o` each. On 8 ranks: small, the CPU's `7 o` of posts
/// and `7 o` of handling; large, the transfer then the handling.
#[test]
fn a_mesh_round_posts_its_sends_and_handles_its_receives() {
    let (a, b, o, g) = (1.0, 1e-4, 0.5, 1e-4);
    let ag = |big: f64| {
        formula(
            Algorithm::Mesh,
            Collective::AllGather,
            8.0,
            big,
            (a, b, o, g),
        )
    };
    let close = |x: f64, y: f64| (x - y).abs() < 1e-9 * y;
    assert!(close(ag(8.0).unwrap(), 7.0));
    let big = 8e6;
    assert!(close(ag(big).unwrap(), a + 7.0 / 8.0 * big * b + 3.5));
    // Mesh1 AllReduce sends whole buffers: the same round, then n-1 reductions.
    let t = formula(
        Algorithm::Mesh1,
        Collective::AllReduce,
        8.0,
        8.0,
        (a, b, o, g),
    )
    .unwrap();
    assert!(close(t, 7.0 + 7.0 * 8.0 * g), "{t}");
    // Reduce: the root handles n-1 messages, the first within its alpha, and reduces the
    // n-1 whole buffers it received.
    let t = formula(Algorithm::Mesh, Collective::Reduce, 8.0, 1e3, (a, b, o, g)).unwrap();
    assert!(close(t, a + 6.0 * o + 7.0 * 1e3 * (b + g)), "{t}");
}

/// A reducing ring's rounds are no faster than its CPU: per piece one post and one handled
/// receive (`o` each) and the chunk's reduction. On 4 ranks with alpha `a`, `o = a / 2`, each
/// of `bidir_ring`'s half chunks `a / 2` on the link and `a` to reduce: a round's CPU is
/// `2 a` of posts and handling plus `2 a` of reductions against `a` of bytes, busy from the
/// first post: `3 x 4 a = 12 a`, where the unsliced formula charges each round its alpha, `o`,
/// bytes and reduction one after the other (`13.5 a`). The simulator gives the same
/// (`sim/tests.rs`).
#[test]
fn a_bidirectional_ring_is_bound_by_its_cpu() {
    let m = Model::new(1.0, 1.0, 0.5);
    let p = Problem::new(Collective::ReduceScatter, 4, 250);
    let t = m.predict(Algorithm::BidirRing, &p, 4).unwrap();
    assert!((t - 12.0).abs() < 1e-9, "{t}");
}

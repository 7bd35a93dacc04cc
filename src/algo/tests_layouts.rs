//! Schedules over host layouts, proven by the symbolic checker: flat algorithms in the
//! topology-aware rank order, `hier` with every intra x inter pair, and `swizzle`, on even,
//! uneven and non-contiguous layouts, with counts 0 and awkward ones, several slices and roots.
use super::check::check;
use super::*;

/// Host labels of each rank: 2x2, 3+2+1, 4x1, 1+3, 2x4, 2+2+1, and non-contiguous placements.
const LAYOUTS: [&[u8]; 11] = [
    &[0, 0, 1, 1],
    &[0, 0, 0, 1, 1, 2],
    &[0, 1, 2, 3],
    &[0, 1, 1, 1],
    &[0, 0, 0, 0, 1, 1, 1, 1],
    &[0, 0, 1, 1, 2],
    &[0, 1, 0, 1],
    &[0, 1, 2, 0, 1, 2],
    &[0, 1, 2, 0, 1, 0],
    &[1, 0, 1, 1],
    &[0, 0, 0],
];

/// The one-level algorithms (everything but the two-level compositions).
fn flat() -> impl Iterator<Item = Algorithm> {
    Algorithm::ALL
        .into_iter()
        .filter(|a| !matches!(a, Algorithm::Hier | Algorithm::Swizzle))
}

fn counts(n: usize) -> [usize; 5] {
    [0, 1, 7, 13, 3 * n + 2]
}

fn roots(coll: Collective, n: usize) -> Vec<usize> {
    if matches!(coll, Collective::Broadcast | Collective::Reduce) {
        vec![0, n / 2, n - 1]
    } else {
        vec![0]
    }
}

/// Build and check `algo` for `coll` on every layout, count, slice and root; panics with the
/// case on failure, returns how many schedules were checked (0 where it does not apply).
fn check_layouts(algo: Algorithm, coll: Collective, base: Options, slices: &[usize]) -> usize {
    let mut checked = 0;
    for labels in LAYOUTS {
        let n = labels.len();
        let hosts = Hosts::from_labels(labels);
        for count in counts(n) {
            for &slice in slices {
                for root in roots(coll, n) {
                    let o = Options {
                        slice,
                        hosts,
                        ..base
                    };
                    let p = Problem::new(coll, n, count).with_root(root);
                    let s = match build(p, algo, &o) {
                        Ok(s) => s,
                        Err(AlgoError::NotApplicable { .. }) => return checked,
                        Err(e) => panic!("{algo} {labels:?} {o:?} {p:?}: {e}"),
                    };
                    if let Err(e) = check(&s) {
                        panic!("{algo} {labels:?} {o:?} {p:?}: {e}");
                    }
                    checked += 1;
                }
            }
        }
    }
    checked
}

#[test]
fn flat_algorithms_in_topology_order() {
    let mut total = 0;
    for algo in flat() {
        for coll in Collective::ALL {
            let c = check_layouts(algo, coll, Options::default(), &[0, 1, 3]);
            assert_eq!(c > 0, supports(algo, coll), "{algo} {coll:?}");
            total += c;
        }
    }
    assert!(total > 1000, "{total}");
}

/// A ring over ranks placed round-robin on two hosts follows the hosts' order: rank 0's
/// neighbours are ranks 2 (same host) and 3 (the previous in the order 0, 2, 1, 3).
#[test]
fn ring_crosses_each_host_boundary_once_per_direction() {
    let o = Options {
        hosts: Hosts::from_labels(&[0, 1, 0, 1]),
        ..Options::default()
    };
    let s = build(
        Problem::new(Collective::AllReduce, 4, 8),
        Algorithm::Ring,
        &o,
    )
    .unwrap();
    let peers = |r: usize| -> Vec<usize> {
        let mut v: Vec<usize> = s.ranks[r].iter().filter_map(|st| st.op.peer()).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    assert_eq!(peers(0), vec![2, 3]);
    assert_eq!(peers(1), vec![2, 3]);
    // Contiguous layouts keep the rank order: the schedule is the one-host schedule.
    let even = Options {
        hosts: Hosts::blocks(4, 2),
        ..Options::default()
    };
    let p = Problem::new(Collective::Broadcast, 4, 5).with_root(2);
    assert_eq!(
        build(p, Algorithm::Ring, &even).unwrap().ranks,
        build(p, Algorithm::Ring, &Options::default())
            .unwrap()
            .ranks
    );
}

#[test]
fn hier_every_pair_on_every_layout() {
    let mut total = 0;
    for intra in flat() {
        for inter in flat() {
            let base = Options {
                intra,
                inter,
                ..Options::default()
            };
            for coll in Collective::ALL {
                total += check_layouts(Algorithm::Hier, coll, base, &[0, 2]);
            }
        }
    }
    assert!(total > 10_000, "{total}");
    // The usual pairs offer all five collectives hier composes.
    for coll in Collective::ALL {
        let want = coll != Collective::AllToAll;
        assert_eq!(
            check_layouts(Algorithm::Hier, coll, Options::default(), &[0]) > 0,
            want
        );
    }
}

#[test]
fn swizzle_on_every_layout() {
    for coll in Collective::ALL {
        let want = matches!(
            coll,
            Collective::AllReduce | Collective::AllGather | Collective::ReduceScatter
        );
        assert_eq!(supports(Algorithm::Swizzle, coll), want, "{coll:?}");
    }
    let mut total = 0;
    for intra in [
        Algorithm::Ring,
        Algorithm::Rdh,
        Algorithm::Mesh,
        Algorithm::BidirRing,
        Algorithm::Bruck,
    ] {
        let base = Options {
            intra,
            ..Options::default()
        };
        for coll in [
            Collective::ReduceScatter,
            Collective::AllGather,
            Collective::AllReduce,
        ] {
            let c = check_layouts(Algorithm::Swizzle, coll, base, &[0, 1, 3]);
            let want = intra != Algorithm::Bruck || coll == Collective::AllGather;
            assert_eq!(c > 0, want, "{intra} {coll:?}");
            total += c;
        }
    }
    assert!(total > 1000, "{total}");
    // Windows are not offered, and the levels are checked.
    let o = Options {
        hosts: Hosts::blocks(4, 2),
        ..Options::default()
    };
    let w = Problem::new(Collective::ReduceScatter, 4, 4).with_window(1, 5);
    assert!(matches!(
        build(w, Algorithm::Swizzle, &o),
        Err(AlgoError::NotApplicable { .. })
    ));
    for (hosts, field) in [
        (Hosts::blocks(4, 2), "intra"),
        (Hosts::blocks(6, 2), "hosts"),
    ] {
        let o = Options {
            hosts,
            intra: Algorithm::Hier,
            ..Options::default()
        };
        let rs = Problem::new(Collective::ReduceScatter, 4, 4);
        match build(rs, Algorithm::Swizzle, &o) {
            Err(AlgoError::Invalid(e)) => assert!(e.contains(field), "{e}"),
            r => panic!("{o:?}: {:?}", r.map(|_| ())),
        }
    }
}

/// Swizzle's wire pattern on 4 hosts x 2: every member sends to the member of its local index
/// on each other host, hosts in the order own+1, own+2, own+3.
#[test]
fn swizzle_sends_in_swizzled_order() {
    let o = Options {
        hosts: Hosts::blocks(8, 2),
        ..Options::default()
    };
    let s = build(
        Problem::new(Collective::ReduceScatter, 8, 6),
        Algorithm::Swizzle,
        &o,
    )
    .unwrap();
    for r in 0..8 {
        let remote: Vec<usize> = s.ranks[r]
            .iter()
            .filter_map(|st| match st.op {
                Op::Send { peer, .. } if peer / 2 != r / 2 => Some(peer),
                _ => None,
            })
            .collect();
        let want: Vec<usize> = (1..4).map(|n| (r / 2 + n) % 4 * 2 + r % 2).collect();
        assert_eq!(remote, want, "rank {r}");
    }
}

/// The elements each rank sends within and between hosts match the two-level model's formulas
/// (X hosts of Y ranks, N = XY, B elements in the AllReduce buffer, the AllGather output or the
/// ReduceScatter input; ring at both levels): AllReduce 2(Y-1)B/Y within, 2(X-1)B/N between;
/// AllGather and ReduceScatter half that. Only 1/Y of the data crosses the network.
#[test]
fn two_level_bytes_match_the_model() {
    let b = 720;
    for (x, y) in [(2, 2), (2, 4), (4, 2), (3, 3)] {
        let n = x * y;
        let hosts = Hosts::blocks(n, y);
        let o = Options {
            hosts,
            ..Options::default()
        };
        for algo in [Algorithm::Hier, Algorithm::Swizzle] {
            for (coll, count, k) in [
                (Collective::AllReduce, b, 2),
                (Collective::AllGather, b / n, 1),
                (Collective::ReduceScatter, b / n, 1),
            ] {
                let s = build(Problem::new(coll, n, count), algo, &o).unwrap();
                for r in 0..n {
                    let (mut within, mut between) = (0, 0);
                    for st in &s.ranks[r] {
                        if let Op::Send { peer, src } = st.op {
                            if hosts.host_of(peer) == hosts.host_of(r) {
                                within += src.len;
                            } else {
                                between += src.len;
                            }
                        }
                    }
                    let want = (k * (y - 1) * b / y, k * (x - 1) * b / n);
                    assert_eq!((within, between), want, "{algo} {coll:?} {x}x{y} rank {r}");
                }
            }
        }
    }
}

/// Larger uneven and scattered layouts (7+5+3+1, 4 hosts x 4 round-robin, 4+3+2+4 interleaved)
/// for the two-level algorithms and the flat ones they are built from.
#[test]
fn larger_layouts() {
    let mut sizes: Vec<u8> = Vec::new();
    for (h, s) in [7usize, 5, 3, 1].into_iter().enumerate() {
        sizes.extend(std::iter::repeat_n(h as u8, s));
    }
    let round_robin: Vec<u8> = (0..16).map(|r| (r % 4) as u8).collect();
    let mixed = vec![0, 1, 2, 0, 1, 2, 0, 1, 0, 0, 3, 3, 3];
    for labels in [sizes, round_robin, mixed] {
        let n = labels.len();
        let hosts = Hosts::from_labels(&labels);
        for algo in [
            Algorithm::Hier,
            Algorithm::Swizzle,
            Algorithm::Ring,
            Algorithm::Rdh,
        ] {
            for coll in Collective::ALL {
                for count in [0, 5, 3 * n + 1] {
                    for slice in [0, 2] {
                        let o = Options {
                            hosts,
                            slice,
                            intra: Algorithm::Rdh,
                            inter: Algorithm::Ring,
                        };
                        let p = Problem::new(coll, n, count).with_root(n / 3);
                        let s = match build(p, algo, &o) {
                            Ok(s) => s,
                            Err(AlgoError::NotApplicable { .. }) => continue,
                            Err(e) => panic!("{algo} {labels:?} {p:?}: {e}"),
                        };
                        check(&s)
                            .unwrap_or_else(|e| panic!("{algo} {labels:?} {p:?} {slice}: {e}"));
                    }
                }
            }
        }
    }
}

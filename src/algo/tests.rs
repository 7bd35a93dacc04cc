//! Every algorithm x collective x ranks 1..=64 x counts {0, 1, n-1, n, n+1, primes, large},
//! with and without slicing, proven by the symbolic checker.
use super::check::check;
use super::*;

fn counts(n: usize, coll: Collective) -> Vec<usize> {
    // Collectives whose buffers are count x n elements get a smaller "large".
    let large = if matches!(
        coll,
        Collective::AllReduce | Collective::Broadcast | Collective::Reduce
    ) {
        1000
    } else {
        (4000 / n).max(3)
    };
    let mut v = vec![0, 1, n.saturating_sub(1), n, n + 1, 7, 13, 31, large];
    v.sort_unstable();
    v.dedup();
    v
}

fn ranks() -> Vec<usize> {
    let mut v: Vec<usize> = (1..=17).collect();
    v.extend([24, 31, 32, 33, 48, 63, 64]);
    v
}

/// Check every (collective, n, count, slice) the algorithm implements; returns how many.
pub(crate) fn check_algorithm(
    algo: Algorithm,
    opts_for: impl Fn(usize) -> Option<Options>,
) -> usize {
    let mut checked = 0;
    for coll in Collective::ALL {
        if !supports(algo, coll) {
            continue;
        }
        for n in ranks() {
            let Some(base) = opts_for(n) else { continue };
            for count in counts(n, coll) {
                for slice in [0usize, 3] {
                    let o = Options { slice, ..base };
                    let roots: Vec<usize> =
                        if matches!(coll, Collective::Broadcast | Collective::Reduce) {
                            vec![0, n / 2, n - 1]
                        } else {
                            vec![0]
                        };
                    for root in roots {
                        let p = Problem::new(coll, n, count).with_root(root);
                        let s = build(p, algo, &o).unwrap_or_else(|e| panic!("{algo} {p:?}: {e}"));
                        if let Err(e) = check(&s) {
                            panic!("{algo} {p:?} slice {slice}: {e}");
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    checked
}

#[test]
fn ring() {
    assert!(check_algorithm(Algorithm::Ring, |_| Some(Options::default())) > 0);
}

// One test per algorithm file (each asserts that the algorithm implements what it should).
#[test]
fn bidir_ring() {
    for coll in Collective::ALL {
        let want = matches!(
            coll,
            Collective::AllReduce | Collective::AllGather | Collective::ReduceScatter
        );
        assert_eq!(supports(Algorithm::BidirRing, coll), want, "{coll:?}");
    }
    assert!(check_algorithm(Algorithm::BidirRing, |_| Some(Options::default())) > 0);
}

#[test]
fn mesh() {
    for coll in Collective::ALL {
        assert!(supports(Algorithm::Mesh, coll), "{coll:?}");
    }
    assert!(check_algorithm(Algorithm::Mesh, |_| Some(Options::default())) > 0);
}

#[test]
fn mesh1() {
    for coll in Collective::ALL {
        let want = coll == Collective::AllReduce;
        assert_eq!(supports(Algorithm::Mesh1, coll), want, "{coll:?}");
    }
    assert!(check_algorithm(Algorithm::Mesh1, |_| Some(Options::default())) > 0);
}

#[test]
fn rdh() {
    for coll in Collective::ALL {
        let want = matches!(
            coll,
            Collective::AllReduce | Collective::AllGather | Collective::ReduceScatter
        );
        assert_eq!(supports(Algorithm::Rdh, coll), want, "{coll:?}");
    }
    assert!(check_algorithm(Algorithm::Rdh, |_| Some(Options::default())) > 0);
    // Uneven chunks (count not a multiple of n, or smaller), the AllGather's sources inside its
    // output: AllReduce as Rdh ReduceScatter + ring AllGather, and ring + Rdh.
    for n in ranks() {
        for count in counts(n, Collective::AllReduce) {
            for slice in [0usize, 3] {
                for rdh_first in [true, false] {
                    let o = Options {
                        slice,
                        ..Options::default()
                    };
                    let mut b = Builder::new(n);
                    let g: Vec<usize> = (0..n).collect();
                    let ch = chunks(count, n);
                    let src = vec![Span::new(Buf::In, 0, count); n];
                    let dst = vec![Span::new(Buf::Out, 0, count); n];
                    let mine: Vec<Span> = (0..n).map(|i| dst[i].sub(ch[i].0, ch[i].1)).collect();
                    let start = no_deps(n);
                    if rdh_first {
                        rdh::Rdh
                            .reduce_scatter(&mut b, &g, &src, &mine, &ch, &start, &o)
                            .unwrap();
                        let mid = b.frontiers();
                        ring::all_gather(&mut b, &g, &mine, &dst, &ch, &mid, &o, None);
                    } else {
                        ring::reduce_scatter(&mut b, &g, &src, &mine, &ch, &start, &o, Some(&dst));
                        let mid = b.frontiers();
                        rdh::Rdh
                            .all_gather(&mut b, &g, &mine, &dst, &ch, &mid, &o)
                            .unwrap();
                    }
                    let p = Problem::new(Collective::AllReduce, n, count);
                    check(&b.finish(p, Algorithm::Rdh)).unwrap_or_else(|e| {
                        panic!("{p:?} slice {slice} rdh_first {rdh_first}: {e}")
                    });
                }
            }
        }
    }
}

#[test]
fn rd() {
    for coll in Collective::ALL {
        let want = coll == Collective::AllReduce;
        assert_eq!(supports(Algorithm::Rd, coll), want, "{coll:?}");
    }
    assert!(check_algorithm(Algorithm::Rd, |_| Some(Options::default())) > 0);
}

#[test]
fn tree() {
    for coll in Collective::ALL {
        let want = matches!(
            coll,
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce
        );
        assert_eq!(supports(Algorithm::Tree, coll), want, "{coll:?}");
    }
    assert!(check_algorithm(Algorithm::Tree, |_| Some(Options::default())) > 0);
}

#[test]
fn dbtree() {
    for coll in Collective::ALL {
        let want = coll == Collective::AllReduce;
        assert_eq!(supports(Algorithm::DbTree, coll), want, "{coll:?}");
    }
    assert!(check_algorithm(Algorithm::DbTree, |_| Some(Options::default())) > 0);
}

#[test]
fn bruck() {
    for coll in Collective::ALL {
        let want = matches!(coll, Collective::AllGather | Collective::AllToAll);
        assert_eq!(supports(Algorithm::Bruck, coll), want, "{coll:?}");
    }
    assert!(check_algorithm(Algorithm::Bruck, |_| Some(Options::default())) > 0);
    // AllGather of uneven chunks whose sources sit in its output: AllReduce as ring
    // ReduceScatter + Bruck AllGather.
    for n in ranks() {
        for count in counts(n, Collective::AllReduce) {
            for slice in [0usize, 3] {
                let o = Options {
                    slice,
                    ..Options::default()
                };
                let mut b = Builder::new(n);
                let g: Vec<usize> = (0..n).collect();
                let ch = chunks(count, n);
                let src = vec![Span::new(Buf::In, 0, count); n];
                let dst = vec![Span::new(Buf::Out, 0, count); n];
                let mine: Vec<Span> = (0..n).map(|i| dst[i].sub(ch[i].0, ch[i].1)).collect();
                ring::reduce_scatter(&mut b, &g, &src, &mine, &ch, &no_deps(n), &o, Some(&dst));
                let mid = b.frontiers();
                bruck::Bruck
                    .all_gather(&mut b, &g, &mine, &dst, &ch, &mid, &o)
                    .unwrap();
                let p = Problem::new(Collective::AllReduce, n, count);
                check(&b.finish(p, Algorithm::Bruck))
                    .unwrap_or_else(|e| panic!("{p:?} slice {slice}: {e}"));
            }
        }
    }
}

#[test]
fn pairwise() {
    for coll in Collective::ALL {
        let want = coll == Collective::AllToAll;
        assert_eq!(supports(Algorithm::Pairwise, coll), want, "{coll:?}");
    }
    assert!(check_algorithm(Algorithm::Pairwise, |_| Some(Options::default())) > 0);
}

#[test]
fn hier() {
    for coll in Collective::ALL {
        let want = coll != Collective::AllToAll;
        assert_eq!(supports(Algorithm::Hier, coll), want, "{coll:?}");
    }
    assert!(
        check_algorithm(Algorithm::Hier, |n| {
            (n % 2 == 0).then_some(Options {
                hosts: Hosts::blocks(n, 2),
                ..Options::default()
            })
        }) > 0
    );
    // Bad shapes and nesting are errors that name the field.
    let ar = Problem::new(Collective::AllReduce, 6, 5);
    let bad = [
        (
            Hosts::blocks(8, 2),
            Algorithm::Ring,
            Algorithm::Ring,
            "hosts",
        ),
        (
            Hosts::blocks(6, 2),
            Algorithm::Hier,
            Algorithm::Ring,
            "intra",
        ),
        (
            Hosts::blocks(6, 2),
            Algorithm::Ring,
            Algorithm::Hier,
            "inter",
        ),
        (
            Hosts::blocks(6, 4),
            Algorithm::Swizzle,
            Algorithm::Ring,
            "intra",
        ),
    ];
    for (hosts, intra, inter, field) in bad {
        let o = Options {
            hosts,
            intra,
            inter,
            ..Options::default()
        };
        match build(ar, Algorithm::Hier, &o) {
            Err(AlgoError::Invalid(e)) => assert!(e.contains(field), "{e}"),
            r => panic!("{o:?}: {:?}", r.map(|_| ())),
        }
    }
    // Other shapes (1, 2, 4, 8 and all ranks per node; 0 stands for all) and level pairs, for
    // every collective that both levels offer what hier needs of them for (else skipped).
    use Algorithm::*;
    let runs = [
        (1, Ring, Rdh),
        (4, Ring, Ring),
        (0, Ring, Ring),
        (4, Rdh, Rdh),
        (2, Ring, Rdh),
        (8, Rdh, Ring),
        (4, Mesh, Ring),
        (2, Ring, Mesh),
        (4, BidirRing, Tree),
        (2, Ring, DbTree),
        (4, Tree, Ring),
        (2, Bruck, Rdh),
        (4, Ring, Rd),
    ];
    let mut total = 0;
    for (local, intra, inter) in runs {
        for coll in Collective::ALL {
            let probe = Options {
                hosts: Hosts::blocks(4, 2),
                intra,
                inter,
                ..Options::default()
            };
            if build(Problem::new(coll, 4, 4), Algorithm::Hier, &probe).is_err() {
                continue;
            }
            for n in ranks()
                .into_iter()
                .filter(|&n| local == 0 || n % local == 0)
            {
                let o = Options {
                    hosts: Hosts::blocks(n, local),
                    ..probe
                };
                for count in counts(n, coll) {
                    for slice in [0usize, 3] {
                        let o = Options { slice, ..o };
                        let roots: Vec<usize> =
                            if matches!(coll, Collective::Broadcast | Collective::Reduce) {
                                vec![0, n / 2, n - 1]
                            } else {
                                vec![0]
                            };
                        for root in roots {
                            let p = Problem::new(coll, n, count).with_root(root);
                            let s = build(p, Algorithm::Hier, &o)
                                .unwrap_or_else(|e| panic!("hier {o:?} {p:?}: {e}"));
                            if let Err(e) = check(&s) {
                                panic!("hier {o:?} {p:?}: {e}");
                            }
                            total += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(total > 0);
}

#[test]
fn chunks_are_uneven_never_padded() {
    assert_eq!(chunks(10, 4), vec![(0, 3), (3, 3), (6, 2), (8, 2)]);
    assert_eq!(chunks(2, 4), vec![(0, 1), (1, 1), (2, 0), (2, 0)]);
    let total: usize = chunks(1_000_003, 7).iter().map(|c| c.1).sum();
    assert_eq!(total, 1_000_003);
}

#[test]
fn invalid_problems_are_errors() {
    assert!(build(
        Problem::new(Collective::AllReduce, 0, 4),
        Algorithm::Ring,
        &Options::default()
    )
    .is_err());
    let e = build(
        Problem::new(Collective::Broadcast, 4, 4).with_root(9),
        Algorithm::Ring,
        &Options::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("root"));
    assert!(matches!(
        build(
            Problem::new(Collective::AllToAll, 4, 4),
            Algorithm::Ring,
            &Options::default()
        ),
        Err(AlgoError::NotApplicable { .. })
    ));
}

/// CollNet's windows: AllGather / ReduceScatter over a sub-range of the global vector, for
/// every algorithm that implements them (hier excepted), with windows that start and end
/// inside slices, cover one slice, several, or nothing.
#[test]
fn windowed_allgather_and_reducescatter() {
    let mut checked = 0;
    for algo in [
        Algorithm::Ring,
        Algorithm::BidirRing,
        Algorithm::Mesh,
        Algorithm::Rdh,
        Algorithm::Bruck,
    ] {
        for coll in [Collective::AllGather, Collective::ReduceScatter] {
            if !supports(algo, coll) {
                continue;
            }
            for n in [1usize, 2, 3, 4, 5, 7, 8] {
                for count in [1usize, 5, 12] {
                    let total = n * count;
                    let mut windows = vec![
                        (0, total),
                        (0, 0),
                        (total / 2, 0),
                        (1.min(total), total.saturating_sub(2)),
                        (count / 2, count),
                    ];
                    windows.push((total.saturating_sub(count + 1), (count + 1).min(total)));
                    for (off, len) in windows {
                        if off + len > total {
                            continue;
                        }
                        for slice in [0usize, 2] {
                            let p = Problem::new(coll, n, count).with_window(off, len);
                            let o = Options {
                                slice,
                                ..Options::default()
                            };
                            let s =
                                build(p, algo, &o).unwrap_or_else(|e| panic!("{algo} {p:?}: {e}"));
                            if let Err(e) = check(&s) {
                                panic!("{algo} {p:?} slice {slice}: {e}");
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 500, "{checked}");
    let bad = Problem::new(Collective::AllGather, 4, 4).with_window(10, 10);
    assert!(build(bad, Algorithm::Ring, &Options::default())
        .unwrap_err()
        .to_string()
        .contains("window"));
    let bad = Problem::new(Collective::AllReduce, 4, 4).with_window(0, 1);
    assert!(build(bad, Algorithm::Ring, &Options::default()).is_err());
}

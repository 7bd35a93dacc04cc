//! The checker past 64 ranks (its contributions are interned sets, not 64-bit masks): every
//! algorithm and collective at every rank count 2..=64; the algorithms with O(N) steps per rank
//! at a few hundred ranks; those with O(log N) steps per rank on layouts up to 4,096 ranks (odd,
//! prime, uneven and non-contiguous hosts); and the checker's own errors past 64 ranks.
//! Counts and slices are chosen per size so that every chunk is short but uneven and the large
//! messages are cut into a few slices: the schedules keep their shape, the symbols stay few.
use super::check::check;
use super::*;

/// Build and prove one schedule; panics with the case on failure, returns false where the
/// algorithm does not implement the collective (with these options).
fn prove(algo: Algorithm, p: Problem, o: &Options) -> bool {
    let s = match build(p, algo, o) {
        Ok(s) => s,
        Err(AlgoError::NotApplicable { .. }) => return false,
        Err(e) => panic!("{algo} {o:?} {p:?}: {e}"),
    };
    if let Err(e) = check(&s) {
        panic!(
            "{algo} intra {} inter {} slice {} {p:?}: {e}",
            o.intra, o.inter, o.slice
        );
    }
    true
}

/// The one-level algorithms, in `Algorithm::ALL`'s order.
fn flat() -> Vec<Algorithm> {
    Algorithm::ALL
        .into_iter()
        .filter(|a| !matches!(a, Algorithm::Hier | Algorithm::Swizzle))
        .collect()
}

/// Does the collective's buffer hold `count` elements (rather than `count` per rank)?
fn whole(coll: Collective) -> bool {
    matches!(
        coll,
        Collective::AllReduce | Collective::Broadcast | Collective::Reduce
    )
}

/// Two cases per collective and rank count: an uneven count unsliced, and one sliced by about
/// a third of a chunk; the root moves with n.
fn cases(coll: Collective, n: usize) -> [(Problem, usize); 2] {
    let (big, small) = if whole(coll) {
        (2 * n + 3, n + 1)
    } else {
        (3, 2)
    };
    let root = (n * 2) / 3;
    [
        (Problem::new(coll, n, big).with_root(root), 0),
        (Problem::new(coll, n, small).with_root(n - 1), 1),
    ]
}

/// Host layouts for the two-level algorithms at n ranks: hosts of 2..=8 ranks as n varies (the
/// last host smaller where they do not divide n), and every third n placed round-robin.
fn layout(n: usize) -> Hosts {
    let per = 2 + n % 7;
    if n.is_multiple_of(3) {
        let hosts = n.div_ceil(per);
        let labels: Vec<usize> = (0..n).map(|r| r % hosts).collect();
        Hosts::from_labels(&labels)
    } else {
        Hosts::blocks(n, per)
    }
}

#[test]
fn every_algorithm_and_collective_at_every_rank_count_to_64() {
    let flat = flat();
    let mut proved = 0;
    for n in 2..=64usize {
        for coll in Collective::ALL {
            for &algo in &flat {
                for (p, slice) in cases(coll, n) {
                    let o = Options {
                        slice,
                        ..Options::default()
                    };
                    proved += usize::from(prove(algo, p, &o));
                }
            }
            // The two-level ones with a pair of levels that changes with n (ring x ring where
            // that pair does not implement the collective).
            for (i, algo) in [Algorithm::Hier, Algorithm::Swizzle]
                .into_iter()
                .enumerate()
            {
                for (p, slice) in cases(coll, n) {
                    let o = Options {
                        slice,
                        hosts: layout(n),
                        intra: flat[(n + i) % flat.len()],
                        inter: flat[(n / flat.len() + 3 * n) % flat.len()],
                    };
                    let fallback = Options {
                        intra: Algorithm::Ring,
                        inter: Algorithm::Ring,
                        ..o
                    };
                    if !prove(algo, p, &o) && !prove(algo, p, &fallback) {
                        assert!(!supports(algo, coll), "{algo} {coll:?} n={n}");
                        continue;
                    }
                    proved += 1;
                }
            }
        }
    }
    // Every (algorithm, collective) pair it implements, at 63 rank counts, twice.
    let pairs = Algorithm::ALL
        .iter()
        .flat_map(|a| Collective::ALL.iter().filter(|c| supports(*a, **c)))
        .count();
    assert_eq!(proved, pairs * 63 * 2);
}

/// Layouts of many ranks: (ranks, host of each rank).
fn big_layouts() -> Vec<(usize, Hosts)> {
    // 3,001 ranks on hosts of 1, 2, ..., 12 ranks in turn.
    let mut uneven = Vec::new();
    let mut h = 0;
    while uneven.len() < 3001 {
        let size = 1 + h % 12;
        uneven.extend(std::iter::repeat_n(h, size.min(3001 - uneven.len())));
        h += 1;
    }
    let round_robin: Vec<usize> = (0..2049).map(|r| r % 16).collect();
    vec![
        (4096, Hosts::blocks(4096, 8)),
        (4093, Hosts::blocks(4093, 8)),
        (3001, Hosts::from_labels(&uneven)),
        (2049, Hosts::from_labels(&round_robin)),
    ]
}

/// Algorithms with O(log N) steps per rank (AllReduce of hier with logarithmic levels included)
/// on layouts up to 4,096 ranks: one unsliced case and one whose larger messages are cut into a
/// few slices, per pair. Buffers cut into a chunk per rank hold n + 3 elements (AllGather and
/// ReduceScatter one per rank); those moved whole (rd, tree, dbtree AllReduce) 97.
#[test]
fn logarithmic_algorithms_on_layouts_to_4096_ranks() {
    use Algorithm::*;
    use Collective::*;
    let mut proved = 0;
    for (n, hosts) in big_layouts() {
        // On a non-contiguous layout a flat AllGather's or ReduceScatter's blocks are not
        // contiguous in the ring order, so it moves them one step each: O(N) steps per rank.
        let contiguous = hosts.contiguous(n);
        let cases: [(Algorithm, Collective, Algorithm, Algorithm); 14] = [
            (Rdh, AllReduce, Ring, Ring),
            (Rdh, AllGather, Ring, Ring),
            (Rdh, ReduceScatter, Ring, Ring),
            (Rd, AllReduce, Ring, Ring),
            (Tree, AllReduce, Ring, Ring),
            (Tree, Broadcast, Ring, Ring),
            (Tree, Reduce, Ring, Ring),
            (DbTree, AllReduce, Ring, Ring),
            (Bruck, AllGather, Ring, Ring),
            (Hier, AllReduce, Rdh, Rdh),
            (Hier, AllReduce, Ring, Tree),
            (Hier, AllReduce, Mesh, DbTree),
            (Hier, Broadcast, Ring, Tree),
            (Hier, Reduce, Tree, Tree),
        ];
        for (algo, coll, intra, inter) in cases {
            if !contiguous && matches!(coll, AllGather | ReduceScatter) {
                continue;
            }
            let (count, slice) = match (algo, coll) {
                (Rd | Tree | DbTree, AllReduce) => (97, 17),
                (_, AllGather | ReduceScatter) => (1, n / 6 + 1),
                _ => (n + 3, n / 6 + 1),
            };
            for slice in [0, slice] {
                let o = Options {
                    slice,
                    hosts,
                    intra,
                    inter,
                };
                let p = Problem::new(coll, n, count).with_root(n / 3 + slice % 2);
                assert!(prove(algo, p, &o), "{algo} {coll:?}");
                proved += 1;
            }
        }
    }
    // Three contiguous layouts with all 14 pairs, one round-robin without the 3 AllGathers
    // and ReduceScatters.
    assert_eq!(proved, (3 * 14 + 11) * 2);
}

/// Algorithms with O(N) steps per rank (flat ring, bidir_ring, mesh, mesh1, pairwise, bruck's
/// AllToAll; hier's AllGather and ReduceScatter; swizzle's three collectives) at a few hundred
/// ranks: the checker's race search is quadratic in a rank's steps, so they stay below the
/// logarithmic ones' sizes.
#[test]
fn linear_step_algorithms_at_hundreds_of_ranks() {
    // 257 ranks (a prime) on one host; 300 round-robin on 7 hosts; 520 on 65 hosts of 8.
    let rr: Vec<usize> = (0..300).map(|r| r % 7).collect();
    let layouts = [
        (257, Hosts::ONE),
        (300, Hosts::from_labels(&rr)),
        (520, Hosts::blocks(520, 8)),
    ];
    let mut proved = 0;
    for (n, hosts) in layouts {
        for coll in Collective::ALL {
            let count = if whole(coll) { n + 2 } else { 1 };
            let p = Problem::new(coll, n, count).with_root(n - 2);
            let flat = Options {
                hosts,
                ..Options::default()
            };
            if n < 520 {
                for algo in [
                    Algorithm::Rdh,
                    Algorithm::Bruck,
                    Algorithm::Ring,
                    Algorithm::BidirRing,
                    Algorithm::Mesh,
                    Algorithm::Mesh1,
                    Algorithm::Pairwise,
                ] {
                    // rdh and bruck where their steps are O(N) per rank: AllGather and
                    // ReduceScatter on the round-robin layout, bruck's AllToAll.
                    let linear = match algo {
                        Algorithm::Rdh => {
                            !hosts.is_one()
                                && matches!(coll, Collective::AllGather | Collective::ReduceScatter)
                        }
                        Algorithm::Bruck => {
                            coll == Collective::AllToAll
                                || (!hosts.is_one() && coll == Collective::AllGather)
                        }
                        _ => true,
                    };
                    if linear {
                        proved += usize::from(prove(algo, p, &flat));
                    }
                }
            }
            if hosts.is_one() {
                continue;
            }
            for (algo, intra, inter) in [
                (Algorithm::Hier, Algorithm::Rdh, Algorithm::Rdh),
                (Algorithm::Hier, Algorithm::Ring, Algorithm::Bruck),
                (Algorithm::Swizzle, Algorithm::Rdh, Algorithm::Ring),
            ] {
                let o = Options {
                    slice: 1,
                    intra,
                    inter,
                    ..flat
                };
                let linear = match algo {
                    Algorithm::Hier => {
                        matches!(coll, Collective::AllGather | Collective::ReduceScatter)
                    }
                    _ => true,
                };
                if linear {
                    proved += usize::from(prove(algo, p, &o));
                }
            }
        }
    }
    // Flat: ring 5, bidir_ring 3, mesh 6, mesh1 1, pairwise 1, bruck 1, at 257 and 300, and
    // rdh 2, bruck 1 at 300; two-level: hier AG + RS, hier (ring x bruck) AG, swizzle AR + AG
    // + RS, at 300 and 520.
    assert_eq!(proved, 2 * 17 + 3 + 2 * 6);
}

/// The checker's verdicts past 64 ranks: a contribution missing from rank 69 and one counted
/// twice (rank 65's, whose bit a 64-bit mask would share with rank 1's) are named.
#[test]
fn wrong_schedules_past_64_ranks_are_caught() {
    let n = 70;
    let reduce = |skip: Option<usize>, twice: bool| {
        let mut b = Builder::new(n);
        let inp = Span::new(Buf::In, 0, 2);
        let out = Span::new(Buf::Out, 0, 2);
        let mut last = b.copy(0, inp, out, &[]).into_iter().collect::<Vec<_>>();
        for r in 1..n {
            if Some(r) == skip {
                continue;
            }
            b.send(r, 0, inp, &[]);
            last = vec![b.recv_reduce(0, r, out, out, &last)];
        }
        if twice {
            // Rank 65 also receives rank 1's input, adds its own and sends the sum to the root.
            b.send(1, 65, inp, &[]);
            let t = b.tmp(65, 2);
            let rv = b.recv_reduce(65, 1, inp, t, &[]);
            b.send(65, 0, t, &[rv]);
            b.recv_reduce(0, 65, out, out, &last);
        }
        b.finish(Problem::new(Collective::Reduce, n, 2), Algorithm::Mesh)
    };
    check(&reduce(None, false)).unwrap();
    let e = check(&reduce(Some(69), false)).unwrap_err();
    assert!(
        e.contains("from ranks {0-68}") && e.contains("every rank"),
        "{e}"
    );
    let e = check(&reduce(None, true)).unwrap_err();
    assert!(e.contains("Bad"), "{e}");
}

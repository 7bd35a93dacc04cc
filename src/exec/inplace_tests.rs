//! The in-place analysis over every collective and algorithm: which read their input after
//! writing over it, and how much of the input each such call copies aside.
use super::analyse;
use crate::algo::{self, Algorithm, Buf, Collective, Hosts, Op, Options, Problem};

/// The input's offset from the output's start, in elements, in NCCL's in-place layouts.
fn shift(coll: Collective, rank: usize, count: usize) -> isize {
    match coll {
        Collective::AllGather => (rank * count) as isize,
        Collective::ReduceScatter => -((rank * count) as isize),
        _ => 0,
    }
}

/// Whether an in-place `coll` by `algo` reads no input after writing over it, so copies
/// nothing aside (docs/architecture.md, "Not restoring"): ring, bidir_ring, rdh, tree, dbtree,
/// hier and swizzle AllReduce, every ReduceScatter but mesh's, and the collectives that write
/// nothing over their input (AllGather, Broadcast, Reduce).
fn copies_nothing(coll: Collective, algo: Algorithm) -> bool {
    use Algorithm::*;
    match coll {
        Collective::AllReduce => matches!(
            algo,
            Ring | BidirRing | Rdh | Tree | DbTree | Hier | Swizzle
        ),
        Collective::ReduceScatter => algo != Mesh,
        Collective::AllGather | Collective::Broadcast | Collective::Reduce => true,
        _ => false,
    }
}

/// Every algorithm x collective that builds: the share of its input a call copies aside is
/// nothing where the architecture promises it, and never more than the whole input.
#[test]
fn classify_every_algorithm() {
    let el = 4;
    let mut lines = Vec::new();
    for coll in Collective::ALL {
        for algo in Algorithm::ALL {
            let mut worst = 0f64;
            let mut any = false;
            for n in 2..=5 {
                for count in [7usize, 1001] {
                    for slice in [0usize, 64] {
                        let hosts = if matches!(algo, Algorithm::Hier | Algorithm::Swizzle) {
                            Hosts::blocks(n, 2)
                        } else {
                            Hosts::ONE
                        };
                        let opts = Options {
                            slice,
                            hosts,
                            ..Options::default()
                        };
                        let Ok(s) = algo::build(Problem::new(coll, n, count), algo, &opts) else {
                            continue;
                        };
                        any = true;
                        for r in 0..n {
                            let ip = analyse(&s, r, el, shift(coll, r, count) * el as isize);
                            let inb = s.problem.in_len_of(r) * el;
                            if inb > 0 {
                                worst = worst.max((ip.hi - ip.lo) as f64 / inb as f64);
                            }
                        }
                    }
                }
            }
            if any {
                lines.push(format!(
                    "{coll:?} {algo}: worst backup {:.0}%",
                    worst * 100.0
                ));
                assert!(worst <= 1.0, "{coll:?} {algo}: copies {worst} of its input");
                if copies_nothing(coll, algo) {
                    assert_eq!(worst, 0.0, "{coll:?} {algo}: copies part of its input");
                }
            }
        }
    }
    assert!(lines.len() > 20, "too few pairs built: {lines:?}");
    println!("{}", lines.join("\n"));
}

#[test]
fn a_hazard_is_found_an_ordered_write_is_not_and_a_delivered_send_waits() {
    use crate::algo::{Schedule, Span, Step};
    let sp = |b, off, len| Span::new(b, off, len);
    let step = |op, deps: &[usize]| Step {
        op,
        deps: deps.to_vec(),
    };
    // Rank 0 sends In[0..4) and receives into Out[0..4) what rank 1 sends after receiving it
    // (causally after the delivery: a dependency, no copy); it receives into Out[4..8) what
    // rank 1 sends at once while it sends In[4..8) (a hazard: a copy).
    let ranks = vec![
        vec![
            step(
                Op::Send {
                    peer: 1,
                    src: sp(Buf::In, 0, 4),
                },
                &[],
            ),
            step(
                Op::Recv {
                    peer: 1,
                    dst: sp(Buf::Out, 0, 4),
                },
                &[],
            ),
            step(
                Op::Recv {
                    peer: 1,
                    dst: sp(Buf::Out, 4, 4),
                },
                &[],
            ),
            step(
                Op::Send {
                    peer: 1,
                    src: sp(Buf::In, 4, 4),
                },
                &[],
            ),
        ],
        vec![
            step(
                Op::Recv {
                    peer: 0,
                    dst: sp(Buf::Tmp, 0, 4),
                },
                &[],
            ),
            step(
                Op::Send {
                    peer: 0,
                    src: sp(Buf::Tmp, 0, 4),
                },
                &[0],
            ),
            step(
                Op::Send {
                    peer: 0,
                    src: sp(Buf::In, 0, 4),
                },
                &[],
            ),
            step(
                Op::Recv {
                    peer: 0,
                    dst: sp(Buf::Tmp, 4, 4),
                },
                &[],
            ),
        ],
    ];
    let s = Schedule {
        problem: Problem::new(Collective::AllReduce, 2, 8),
        algo: Algorithm::Ring,
        tmp_len: vec![0, 8],
        ranks,
    };
    let ip = analyse(&s, 0, 4, 0);
    assert_eq!(ip.from_backup, [false, false, false, true]);
    assert_eq!((ip.lo, ip.hi), (16, 32));
    let g = ip.graph.expect("the delivered send gains a dependent");
    assert_eq!(g.dependents[0], [1]);
    assert_eq!(g.pending, [0, 1, 0, 0]);
    assert_eq!(g.ready, [0, 2, 3]);
    // Moved by 8 elements, nothing overlaps.
    assert!(!analyse(&s, 0, 4, 32).changes_anything());
    // A reduction into its own operand is element by element: no hazard.
    let red = Schedule {
        ranks: vec![
            vec![step(
                Op::Reduce {
                    a: sp(Buf::In, 0, 4),
                    b: sp(Buf::Tmp, 0, 4),
                    dst: sp(Buf::Out, 0, 4),
                },
                &[],
            )],
            vec![],
        ],
        ..s
    };
    assert!(!analyse(&red, 0, 4, 0).changes_anything());
    assert!(
        analyse(&red, 0, 4, 4).needs_backup(),
        "shifted by one element it overlaps itself"
    );
}

/// The share of the input each rank copies aside at a large count (64 MiB of floats in 1 MiB
/// slices), and which kinds of step read it: nothing where the architecture promises it, some
/// for AllToAll, whose exchanges read copies, and never more than the whole input.
#[test]
fn large_counts_copy_a_part_of_the_input() {
    let (el, count, slice) = (4usize, 16 << 20, 1 << 18);
    let mut alltoall_seen = 0;
    for coll in [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllToAll,
    ] {
        for algo in Algorithm::ALL {
            for n in [2usize, 4] {
                let c = if coll == Collective::AllReduce {
                    count
                } else {
                    count / n
                };
                let opts = Options {
                    slice,
                    ..Options::default()
                };
                let Ok(s) = algo::build(Problem::new(coll, n, c), algo, &opts) else {
                    continue;
                };
                let mut share = 0f64;
                let mut kinds = std::collections::BTreeSet::new();
                for r in 0..n {
                    let ip = analyse(&s, r, el, shift(coll, r, c) * el as isize);
                    share =
                        share.max((ip.hi - ip.lo) as f64 / (s.problem.in_len_of(r) * el) as f64);
                    for (i, st) in s.ranks[r].iter().enumerate() {
                        if ip.from_backup[i] {
                            kinds.insert(
                                format!("{:?}", st.op)
                                    .split(' ')
                                    .next()
                                    .unwrap()
                                    .to_string(),
                            );
                        }
                    }
                }
                println!(
                    "{coll:?} {algo} n={n}: copies {:.0}% ({} steps) {kinds:?}",
                    share * 100.0,
                    s.ranks[0].len()
                );
                assert!(share <= 1.0, "{coll:?} {algo} n={n}: {share}");
                assert_eq!(share > 0.0, !kinds.is_empty(), "{coll:?} {algo} n={n}");
                if copies_nothing(coll, algo) {
                    assert_eq!(share, 0.0, "{coll:?} {algo} n={n}: copies {kinds:?}");
                }
                if coll == Collective::AllToAll {
                    // Every step of an in-place AllToAll exchange reads input that another
                    // step overwrites: some of it is read from a copy.
                    assert!(share > 0.0, "{algo} n={n}: copies nothing");
                    alltoall_seen += 1;
                }
            }
        }
    }
    assert!(
        alltoall_seen >= 4,
        "AllToAll by two algorithms at 2 and 4 ranks"
    );
}

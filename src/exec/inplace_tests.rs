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
                            let ip = analyse(&s.ranks[r], el, shift(coll, r, count) * el as isize);
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
            }
        }
    }
    println!("{}", lines.join("\n"));
}

#[test]
fn a_hazard_is_found_and_an_ordered_write_is_not() {
    use crate::algo::{Span, Step};
    let sp = |b, off, len| Span::new(b, off, len);
    // Step 0 sends In[0..4); step 1 receives into Out[0..4) after it: safe. Step 2 receives
    // into Out[4..8) with no dependency while step 3 sends In[4..8): a hazard on step 3.
    let steps = vec![
        Step {
            op: Op::Send {
                peer: 1,
                src: sp(Buf::In, 0, 4),
            },
            deps: vec![],
        },
        Step {
            op: Op::Recv {
                peer: 1,
                dst: sp(Buf::Out, 0, 4),
            },
            deps: vec![0],
        },
        Step {
            op: Op::Recv {
                peer: 1,
                dst: sp(Buf::Out, 4, 4),
            },
            deps: vec![],
        },
        Step {
            op: Op::Send {
                peer: 1,
                src: sp(Buf::In, 4, 4),
            },
            deps: vec![],
        },
    ];
    let ip = analyse(&steps, 4, 0);
    assert_eq!(ip.from_backup, [false, false, false, true]);
    assert_eq!((ip.lo, ip.hi), (16, 32));
    // Moved by 8 elements, nothing overlaps.
    assert!(!analyse(&steps, 4, 32).needs_backup());
    // A reduction into its own operand is element by element: no hazard.
    let red = vec![Step {
        op: Op::Reduce {
            a: sp(Buf::In, 0, 4),
            b: sp(Buf::Tmp, 0, 4),
            dst: sp(Buf::Out, 0, 4),
        },
        deps: vec![],
    }];
    assert!(!analyse(&red, 4, 0).needs_backup());
    assert!(
        analyse(&red, 4, 4).needs_backup(),
        "shifted by one element it overlaps itself"
    );
}

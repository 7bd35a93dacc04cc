//! The varied collectives (`varied`) for 1..=8 ranks and uneven counts with zeros, proven by
//! the symbolic checker with the expected outputs computed here from the specs.
use super::check::{check_with, Ranks};
use super::varied::{schedule, Block, Spec};
use super::AlgoError;

/// Uneven count patterns for n ranks, zeros included.
fn patterns(n: usize) -> Vec<Vec<usize>> {
    vec![
        vec![0; n],
        (0..n).map(|i| i + 1).collect(),
        (0..n).map(|i| (i * 7 + 3) % 5).collect(),
        (0..n).map(|i| if i % 2 == 0 { 0 } else { 9 - i }).collect(),
    ]
}

/// Blocks of `counts` packed in rank order, or (`spread`) in reverse order with a gap of one
/// element before each.
fn blocks(counts: &[usize], spread: bool) -> Vec<Block> {
    let mut b = vec![(0, 0); counts.len()];
    let mut off = 0;
    let order: Vec<usize> = if spread {
        (0..counts.len()).rev().collect()
    } else {
        (0..counts.len()).collect()
    };
    for i in order {
        off += usize::from(spread);
        b[i] = (off, counts[i]);
        off += counts[i];
    }
    b
}

/// Build every rank of `specs` and check it against `want(rank, output element)`.
fn prove(specs: &[Spec], want: &dyn Fn(usize, usize) -> Option<(usize, Ranks)>) {
    let n = specs.len();
    let ranks: Vec<(usize, &Spec)> = specs.iter().enumerate().collect();
    let s = schedule(n, &ranks).unwrap_or_else(|e| panic!("{:?}: {e}", specs[0]));
    if let Err(e) = check_with(&s, &|r| specs[r].lens(r, n), want) {
        panic!("{specs:?}: {e}");
    }
}

#[test]
fn gather_scatter_and_barrier_are_correct_for_every_root() {
    for n in 1..=8 {
        prove(&vec![Spec::Barrier; n], &|_, _| None);
        for c in [0, 1, 5] {
            for root in 0..n {
                let g = vec![Spec::Gather { count: c, root }; n];
                prove(&g, &|r, j| (r == root).then(|| (j % c, Ranks::One(j / c))));
                let s = vec![Spec::Scatter { count: c, root }; n];
                prove(&s, &|r, j| Some((r * c + j, Ranks::One(root))));
            }
        }
    }
}

#[test]
fn allgatherv_and_reducescatterv_are_correct_for_uneven_counts() {
    for n in 1..=8 {
        for counts in patterns(n) {
            for spread in [false, true] {
                let bs = blocks(&counts, spread);
                let specs = vec![Spec::AllGatherV { blocks: bs.clone() }; n];
                prove(&specs, &|_, j| {
                    let i = bs.iter().position(|b| b.0 <= j && j < b.0 + b.1)?;
                    Some((j - bs[i].0, Ranks::One(i)))
                });
            }
            let specs = vec![
                Spec::ReduceScatterV {
                    counts: counts.clone()
                };
                n
            ];
            let packed = blocks(&counts, false);
            prove(&specs, &|r, j| Some((packed[r].0 + j, Ranks::All)));
        }
    }
}

#[test]
fn alltoallv_is_correct_for_uneven_counts() {
    for n in 1..=8 {
        for seed in 0..4 {
            // m[i][j]: elements rank i sends to rank j.
            let m: Vec<Vec<usize>> = (0..n)
                .map(|i| (0..n).map(|j| (i * 3 + j * 5 + seed) % 4).collect())
                .collect();
            let send: Vec<Vec<Block>> = (0..n).map(|i| blocks(&m[i], seed % 2 == 1)).collect();
            let recv: Vec<Vec<Block>> = (0..n)
                .map(|j| {
                    let col: Vec<usize> = (0..n).map(|i| m[i][j]).collect();
                    blocks(&col, seed >= 2)
                })
                .collect();
            let specs: Vec<Spec> = (0..n)
                .map(|r| Spec::AllToAllV {
                    send: send[r].clone(),
                    recv: recv[r].clone(),
                })
                .collect();
            prove(&specs, &|r, j| {
                let i = recv[r].iter().position(|b| b.0 <= j && j < b.0 + b.1)?;
                Some((send[i][r].0 + j - recv[r][i].0, Ranks::One(i)))
            });
        }
    }
}

#[test]
fn bad_specs_name_the_argument() {
    let err = |spec: Spec, n: usize| match schedule(n, &[(0, &spec)]) {
        Err(AlgoError::Invalid(s)) => s,
        other => panic!("{spec:?}: {other:?}"),
    };
    let e = err(Spec::Gather { count: 1, root: 4 }, 4);
    assert!(e.starts_with("root:"), "{e}");
    let e = err(
        Spec::AllGatherV {
            blocks: vec![(0, 2), (1, 2)],
        },
        2,
    );
    assert!(e.starts_with("displs:") && e.contains("overlap"), "{e}");
    let e = err(Spec::ReduceScatterV { counts: vec![1; 3] }, 4);
    assert!(e.starts_with("recvcounts:"), "{e}");
    let e = err(
        Spec::AllToAllV {
            send: vec![(0, 1), (1, 1)],
            recv: vec![(0, 2), (2, 1)],
        },
        2,
    );
    assert!(e.starts_with("sendcounts:"), "{e}");
    let e = err(
        Spec::AllToAllV {
            send: vec![(0, 1), (1, 1)],
            recv: vec![(0, 1), (usize::MAX, 1)],
        },
        2,
    );
    assert!(e.starts_with("rdispls:"), "{e}");
}

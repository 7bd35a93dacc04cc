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
    check_algorithm(Algorithm::BidirRing, |_| Some(Options::default()));
}

#[test]
fn mesh() {
    check_algorithm(Algorithm::Mesh, |_| Some(Options::default()));
}

#[test]
fn mesh1() {
    check_algorithm(Algorithm::Mesh1, |_| Some(Options::default()));
}

#[test]
fn rdh() {
    check_algorithm(Algorithm::Rdh, |_| Some(Options::default()));
}

#[test]
fn rd() {
    check_algorithm(Algorithm::Rd, |_| Some(Options::default()));
}

#[test]
fn tree() {
    check_algorithm(Algorithm::Tree, |_| Some(Options::default()));
}

#[test]
fn dbtree() {
    check_algorithm(Algorithm::DbTree, |_| Some(Options::default()));
}

#[test]
fn bruck() {
    check_algorithm(Algorithm::Bruck, |_| Some(Options::default()));
}

#[test]
fn pairwise() {
    check_algorithm(Algorithm::Pairwise, |_| Some(Options::default()));
}

#[test]
fn hier() {
    check_algorithm(Algorithm::Hier, |n| {
        (n % 2 == 0).then_some(Options {
            local: 2,
            ..Options::default()
        })
    });
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

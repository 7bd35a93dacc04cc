//! Calls back to back, as a benchmark loop times them: each rank starts its next call once its
//! own steps of the last one are done, while other ranks may still be finishing that one. Where
//! ranks finish a call at different times (a tree's leaves after its root, a delay crossed
//! twice), consecutive calls overlap, and the time per call in a loop is less than one call's
//! time alone; `fabricoll-perf` and nccl-tests report the loop's.
#![forbid(unsafe_code)]

use crate::algo::{Op, Schedule, Step};

/// `s` made `calls` times in a row on every rank: copy k+1's steps that wait for nothing in
/// their own call wait for the end of copy k on the same rank (a `Nop` after each copy that
/// waits for all of its steps). Messages still match in program order per pair, as the
/// executor's sequence numbers do.
pub fn back_to_back(s: &Schedule, calls: usize) -> Schedule {
    let ranks = s
        .ranks
        .iter()
        .map(|steps| {
            let len = steps.len();
            let mut out = Vec::with_capacity(calls * (len + 1));
            let mut last_end: Option<usize> = None;
            for _ in 0..calls {
                let base = out.len();
                for st in steps {
                    let mut deps: Vec<usize> = st.deps.iter().map(|d| d + base).collect();
                    if deps.is_empty() {
                        deps.extend(last_end);
                    }
                    out.push(Step {
                        op: st.op.clone(),
                        deps,
                    });
                }
                out.push(Step {
                    op: Op::Nop,
                    deps: (base..base + len).collect(),
                });
                last_end = Some(out.len() - 1);
            }
            out
        })
        .collect();
    Schedule {
        problem: s.problem,
        algo: s.algo,
        tmp_len: s.tmp_len.clone(),
        ranks,
    }
}

/// The time per call of `calls` calls back to back in a loop's steady state: what `calls` add
/// to the first, per call, from the times of one call (`one_us`) and of all (`all_us`).
pub fn per_call_us(one_us: f64, all_us: f64, calls: usize) -> f64 {
    if calls <= 1 {
        one_us
    } else {
        (all_us - one_us) / (calls - 1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{self, Algorithm, Collective, Hosts, Options, Problem};
    use crate::sim::{simulate, Params};
    use crate::tune::Model;

    fn times(a: Algorithm, n: usize, count: usize, calls: usize) -> (f64, f64) {
        let m = Model::new(10.0, 2.0, 8.0).with_slice(usize::MAX);
        let params = Params::from_model(&m, Hosts::ONE);
        let s = algo::build(
            Problem::new(Collective::AllReduce, n, count),
            a,
            &Options::default(),
        )
        .unwrap();
        let one = simulate(&s, 4, Hosts::ONE, &params).unwrap().time_us;
        let all = simulate(&back_to_back(&s, calls), 4, Hosts::ONE, &params)
            .unwrap()
            .time_us;
        (one, all)
    }

    #[test]
    fn one_call_in_a_row_is_the_call() {
        for a in [Algorithm::Ring, Algorithm::Tree, Algorithm::Rdh] {
            let (one, all) = times(a, 4, 65536, 1);
            assert!((one - all).abs() < 1e-9, "{a}: {one} against {all}");
        }
    }

    #[test]
    fn a_trees_calls_do_not_overlap() {
        // NCCL's in-order tree on 4 ranks: 0 <- 2 <- {1, 3}. A leaf starts its next call only
        // once it has the last call's result, the end of the whole chain: calls in a row cost
        // what one costs alone.
        let (one, all) = times(Algorithm::Tree, 4, 65536, 6);
        let per = per_call_us(one, all, 6);
        assert!(
            (per - one).abs() < 0.02 * one,
            "per call {per} us, one call {one} us"
        );
    }
}

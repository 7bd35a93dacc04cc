//! Double binary tree AllReduce (NCCL): two complementary binary trees over the members, each
//! carrying half of the buffer (tree 1 the first half, tree 2 the second), both at once.
//! Tree 1 is NCCL's in-order binary tree (odd members are leaves); tree 2 is its mirror
//! (member i plays node N-1-i) when N is even, or tree 1 shifted by one (member i plays node
//! i-1) when N is odd, so that every interior node of one tree is a leaf of the other (but for
//! at most one member when N is odd) and each member sends and receives about B in all, instead
//! of up to 3B with a single tree. Each half is reduced up its tree and broadcast down,
//! pipelined by slices, exactly as `tree::all_reduce_on` does; no Tmp. AllReduce only.
#![forbid(unsafe_code)]

use super::tree::{all_reduce_on, btree, Shape};
use super::{AlgoResult, Algorithm, Builder, Collectives, Deps, Options, Span};

pub struct DbTree;

/// NCCL's pair of trees (`ncclGetDtree`) over m members.
pub(crate) fn trees(m: usize) -> (Shape, Shape) {
    let t1 = btree(m);
    let t2 = if m.is_multiple_of(2) {
        t1.relabel(|x| m - 1 - x)
    } else {
        t1.relabel(|x| (x + 1) % m)
    };
    (t1, t2)
}

impl Collectives for DbTree {
    fn algorithm(&self) -> Algorithm {
        Algorithm::DbTree
    }

    fn all_reduce(
        &self,
        b: &mut Builder,
        g: &[usize],
        src: &[Span],
        dst: &[Span],
        start: &Deps,
        o: &Options,
    ) -> AlgoResult<()> {
        let len = src[0].len;
        let h = len.div_ceil(2);
        let (t1, t2) = trees(g.len());
        let half = |s: &[Span], second: bool| -> Vec<Span> {
            s.iter()
                .map(|x| {
                    if second {
                        x.sub(h, len - h)
                    } else {
                        x.sub(0, h)
                    }
                })
                .collect()
        };
        all_reduce_on(b, g, &t1, &half(src, false), &half(dst, false), start, o);
        all_reduce_on(b, g, &t2, &half(src, true), &half(dst, true), start, o);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trees_are_complementary() {
        for m in 1..=130 {
            let (t1, t2) = trees(m);
            let interior = |t: &Shape, v: usize| !t.children[v].is_empty();
            let both = (0..m).filter(|&v| interior(&t1, v) && interior(&t2, v));
            assert!(both.count() <= m % 2, "m={m}");
            for v in 0..m {
                assert!(t2.children[v].len() <= 2);
                for &c in &t2.children[v] {
                    assert_eq!(t2.parent[c], Some(v));
                }
            }
            assert_eq!(t2.parent.iter().filter(|p| p.is_none()).count(), 1);
        }
    }
}

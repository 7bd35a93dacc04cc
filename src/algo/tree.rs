//! Tree: AllReduce over a binary tree, Broadcast and Reduce over binomial trees, all pipelined
//! by slices (slice j moves on while slice j+1 is still in flight).
//!
//! AllReduce uses NCCL's in-order binary tree over member indices (root 0 with one child, odd
//! members are leaves, depth about log2 N): each slice is reduced up the tree (an interior node
//! folds its children, in a fixed order, into its own contribution with receive-reduces into its
//! output) and the root's result is sent back down, so every element is computed once and is
//! bit-identical everywhere. No Tmp: a node's output holds its partial until the final value
//! overwrites it. Broadcast and Reduce use binomial trees rooted at the given root (ceil(log2 N)
//! rounds; relative rank v's parent is v minus its lowest set bit); Reduce folds children
//! smallest subtree first and needs Tmp B on interior non-root members (their output is not
//! theirs to use). `Shape` and `all_reduce_on` are shared with the double binary tree.
#![forbid(unsafe_code)]

use super::{slices, AlgoResult, Algorithm, Builder, Collectives, Deps, Options, Span};

pub struct Tree;

/// A rooted tree over member indices: each member's parent and its children, in the order
/// their contributions are reduced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub parent: Vec<Option<usize>>,
    pub children: Vec<Vec<usize>>,
}

impl Shape {
    fn from_parents(parent: Vec<Option<usize>>) -> Shape {
        let mut children = vec![Vec::new(); parent.len()];
        for (v, p) in parent.iter().enumerate() {
            if let Some(p) = p {
                children[*p].push(v);
            }
        }
        Shape { parent, children }
    }

    /// The same tree with node x renamed `f(x)` (`f` a permutation of 0..m).
    pub(crate) fn relabel(&self, f: impl Fn(usize) -> usize) -> Shape {
        let m = self.parent.len();
        let mut parent = vec![None; m];
        let mut children = vec![Vec::new(); m];
        for x in 0..m {
            parent[f(x)] = self.parent[x].map(&f);
            children[f(x)] = self.children[x].iter().map(|&c| f(c)).collect();
        }
        Shape { parent, children }
    }
}

/// NCCL's in-order binary tree over 0..m (`ncclGetBtree`): node r with lowest set bit `bit`
/// hangs under `(r ^ bit) | (bit << 1)`, or under `r ^ bit` when that is out of range; 0 is the
/// root with a single child. Every odd node is a leaf.
pub(crate) fn btree(m: usize) -> Shape {
    let parent = (0..m)
        .map(|r| {
            if r == 0 {
                return None;
            }
            let bit = 1usize << r.trailing_zeros();
            let up = (r ^ bit) | (bit << 1);
            Some(if up < m { up } else { r ^ bit })
        })
        .collect();
    Shape::from_parents(parent)
}

/// Pipelined AllReduce of `src` into `dst` (per member; equal lengths) over tree `t`: each
/// slice is reduced up to the root and its result sent back down. No Tmp.
pub(crate) fn all_reduce_on(
    b: &mut Builder,
    g: &[usize],
    t: &Shape,
    src: &[Span],
    dst: &[Span],
    start: &Deps,
    o: &Options,
) {
    for v in 0..g.len() {
        let r = g[v];
        let (parent, children) = (t.parent[v].map(|p| g[p]), &t.children[v]);
        for (sl, dl) in slices(src[v], o.slice)
            .into_iter()
            .zip(slices(dst[v], o.slice))
        {
            // Up: own contribution, then each child's partial, in the children's order.
            let mut acc = None;
            for &c in children {
                let (from, deps) = match acc {
                    None => (sl, start[r].clone()),
                    Some(a) => (dl, vec![a]),
                };
                acc = Some(b.recv_reduce(r, g[c], from, dl, &deps));
            }
            let have = match (parent, acc) {
                // Leaf: its input goes up; the result comes down.
                (Some(p), None) => {
                    b.send(r, p, sl, &start[r]);
                    b.recv(r, p, dl, &start[r])
                }
                (Some(p), Some(a)) => {
                    let up = b.send(r, p, dl, &[a]);
                    b.recv(r, p, dl, &[up])
                }
                (None, Some(a)) => a,
                // A lone member.
                (None, None) => {
                    b.copy(r, sl, dl, &start[r]);
                    continue;
                }
            };
            // Down.
            for &c in children {
                b.send(r, g[c], dl, &[have]);
            }
        }
    }
}

/// Binomial tree rooted at member `root`: relative rank v = (i - root) mod m hangs under v minus
/// its lowest set bit; its children are v + 2^k for 2^k below that bit (the root: below m),
/// listed smallest subtree first. Returns (parent, children) as member indices.
fn binomial(m: usize, root: usize, i: usize) -> (Option<usize>, Vec<usize>) {
    let v = (i + m - root) % m;
    let member = |x: usize| (x + root) % m;
    let low = if v == 0 {
        m.next_power_of_two()
    } else {
        1 << v.trailing_zeros()
    };
    let parent = (v != 0).then(|| member(v - low));
    let children = (0..usize::BITS)
        .map(|k| 1usize << k)
        .take_while(|&d| d < low && v + d < m)
        .map(|d| member(v + d))
        .collect();
    (parent, children)
}

impl Collectives for Tree {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Tree
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
        all_reduce_on(b, g, &btree(g.len()), src, dst, start, o);
        Ok(())
    }

    fn broadcast(
        &self,
        b: &mut Builder,
        g: &[usize],
        root: usize,
        src: &[Span],
        dst: &[Span],
        start: &Deps,
        o: &Options,
    ) -> AlgoResult<()> {
        let m = g.len();
        for i in 0..m {
            let r = g[i];
            let (parent, children) = binomial(m, root, i);
            let from = match parent {
                None => {
                    b.copy(r, src[i], dst[i], &start[r]);
                    src[i]
                }
                Some(_) => dst[i],
            };
            for sl in slices(from, o.slice) {
                let deps = match parent {
                    None => start[r].clone(),
                    Some(p) => vec![b.recv(r, g[p], sl, &start[r])],
                };
                // Largest subtree first.
                for &c in children.iter().rev() {
                    b.send(r, g[c], sl, &deps);
                }
            }
        }
        Ok(())
    }

    fn reduce(
        &self,
        b: &mut Builder,
        g: &[usize],
        root: usize,
        src: &[Span],
        dst: &[Span],
        start: &Deps,
        o: &Options,
    ) -> AlgoResult<()> {
        let m = g.len();
        for i in 0..m {
            let r = g[i];
            let (parent, children) = binomial(m, root, i);
            let acc = match (parent, children.is_empty()) {
                (None, _) => dst[i],
                (Some(_), true) => src[i],
                (Some(_), false) => b.tmp(r, src[i].len),
            };
            for (sl, al) in slices(src[i], o.slice)
                .into_iter()
                .zip(slices(acc, o.slice))
            {
                let mut last = None;
                for &c in &children {
                    let (from, deps) = match last {
                        None => (sl, start[r].clone()),
                        Some(a) => (al, vec![a]),
                    };
                    last = Some(b.recv_reduce(r, g[c], from, al, &deps));
                }
                match (parent, last) {
                    (Some(p), Some(a)) => {
                        b.send(r, g[p], al, &[a]);
                    }
                    (Some(p), None) => {
                        b.send(r, g[p], sl, &start[r]);
                    }
                    (None, None) => {
                        b.copy(r, sl, al, &start[r]);
                    }
                    (None, Some(_)) => {}
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_shape(t: &Shape, max_children: usize) {
        let m = t.parent.len();
        assert_eq!(t.parent.iter().filter(|p| p.is_none()).count(), 1);
        for v in 0..m {
            assert!(t.children[v].len() <= max_children, "m={m} v={v}");
            for &c in &t.children[v] {
                assert_eq!(t.parent[c], Some(v));
            }
            // Every node reaches the root within m hops (no cycles).
            let (mut x, mut hops) = (v, 0);
            while let Some(p) = t.parent[x] {
                x = p;
                hops += 1;
                assert!(hops < m, "cycle at m={m}");
            }
        }
    }

    fn depth(t: &Shape) -> usize {
        (0..t.parent.len())
            .map(|mut x| {
                let mut d = 0;
                while let Some(p) = t.parent[x] {
                    x = p;
                    d += 1;
                }
                d
            })
            .max()
            .unwrap_or(0)
    }

    #[test]
    fn btree_is_a_balanced_binary_tree() {
        for m in 1..=130 {
            let t = btree(m);
            check_shape(&t, 2);
            assert_eq!(t.children[0].len(), usize::from(m > 1));
            assert!(depth(&t) <= (m as f64).log2().ceil() as usize + 1, "m={m}");
            for v in (1..m).step_by(2) {
                assert!(
                    t.children[v].is_empty(),
                    "odd node {v} of {m} is not a leaf"
                );
            }
        }
    }

    #[test]
    fn binomial_trees_are_trees() {
        for m in 1..=70 {
            for root in [0, m / 2, m - 1] {
                let parent = (0..m).map(|i| binomial(m, root, i).0).collect();
                let t = Shape::from_parents(parent);
                check_shape(&t, usize::MAX);
                assert_eq!(t.parent[root], None);
                for i in 0..m {
                    let mut c = binomial(m, root, i).1;
                    c.sort_unstable();
                    let mut want = t.children[i].clone();
                    want.sort_unstable();
                    assert_eq!(c, want);
                }
                assert!(depth(&t) <= (m as f64).log2().ceil() as usize);
            }
        }
    }
}

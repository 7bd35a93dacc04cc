//! Single-step mesh AllReduce: every member sends its whole input to every peer (one hop, N-1
//! messages of B each) and reduces all N copies itself. The copies are combined slice by slice
//! in member order 0..N-1 (((c0 ⊕ c1) ⊕ c2) ⊕ ..., its own input at its own position), so every
//! rank builds the same reduction tree: bit-identical results without a broadcast. Each peer's
//! copy is received (sliced) into its own Tmp slot, so all receives run at once, and the chain
//! folds each copy in as soon as it has fully arrived (N-1 reductions of B, overlapping the
//! receives still in flight). Tmp: (N-1) x B per member. For tiny buffers, where one latency
//! beats bandwidth; AllReduce only.
#![forbid(unsafe_code)]

use super::mesh::{recv_slot, reduce_in_order, Ready};
use super::{slices, AlgoResult, Algorithm, Builder, Collectives, Deps, Options, Span};

pub struct Mesh1;

impl Collectives for Mesh1 {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Mesh1
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
        let m = g.len();
        for i in 0..m {
            let r = g[i];
            for p in 1..m {
                let j = (i + p) % m;
                for sl in slices(src[i], o.slice) {
                    b.send(r, g[j], sl, &start[r]);
                }
            }
        }
        for i in 0..m {
            let r = g[i];
            let parts: Vec<(Span, Ready)> = (0..m)
                .map(|k| {
                    if k == i {
                        (src[i], vec![Vec::new()])
                    } else {
                        let (slot, ready) = recv_slot(b, r, g[k], src[i].len, &start[r], o);
                        let all: Vec<usize> = ready.into_iter().flatten().collect();
                        (slot, vec![b.join(r, &all)])
                    }
                })
                .collect();
            // Messages are sliced; each copy is reduced whole once all its slices are in.
            let whole = Options { slice: 0, ..*o };
            reduce_in_order(b, r, &parts, dst[i], &start[r], &whole);
        }
        Ok(())
    }
}

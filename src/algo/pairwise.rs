//! Pairwise AllToAll: N-1 steps; at step s member i sends its block i+s to member i+s and
//! receives block i-s of its output from member i-s (all indices mod N), after copying its own
//! block locally. Every step touches its own blocks, so steps could all run at once; to avoid
//! bursts of N-1 simultaneous messages at every member (ingress congestion), step s waits for
//! step s - WINDOW to finish, keeping at most WINDOW exchanges in flight per member.
//! Blocks are sliced by `slice`. Tmp: none.
#![forbid(unsafe_code)]

use super::rdh::{grid, Sched};
use super::{AlgoResult, Algorithm, Builder, Collectives, Deps, Op, Options, Span};

pub struct Pairwise;

/// Exchanges in flight per member.
pub const WINDOW: usize = 4;

impl Collectives for Pairwise {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Pairwise
    }

    fn all_to_all(
        &self,
        b: &mut Builder,
        g: &[usize],
        src: &[Span],
        dst: &[Span],
        count: usize,
        start: &Deps,
        o: &Options,
    ) -> AlgoResult<()> {
        let n = g.len();
        let mut s = Sched::new(b, start);
        let blk = |sp: Span, k: usize| sp.sub(k * count, count);
        for i in 0..n {
            s.copy(g[i], blk(src[i], i), blk(dst[i], i));
        }
        if count == 0 {
            return Ok(());
        }
        // done[i][s]: one step joining member i's operations of step s.
        let mut done: Vec<Vec<Vec<usize>>> = vec![Vec::new(); n];
        for st in 1..n {
            for i in 0..n {
                let (to, from) = ((i + st) % n, (i + n - st) % n);
                let gate: Vec<usize> = if st > WINDOW {
                    done[i][st - 1 - WINDOW].clone()
                } else {
                    Vec::new()
                };
                let mut ops = Vec::new();
                for (po, pl) in grid(0, count, o.slice) {
                    let send = Op::Send {
                        peer: g[to],
                        src: blk(src[i], to).sub(po, pl),
                    };
                    ops.push(s.op(g[i], send, &gate));
                    let recv = Op::Recv {
                        peer: g[from],
                        dst: blk(dst[i], from).sub(po, pl),
                    };
                    ops.push(s.op(g[i], recv, &gate));
                }
                let joined = if st + WINDOW < n {
                    s.b.join(g[i], &ops)
                } else {
                    Vec::new()
                };
                done[i].push(joined);
            }
        }
        Ok(())
    }
}

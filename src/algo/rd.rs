//! Recursive-doubling AllReduce for tiny messages: log2 N exchanges of the whole buffer. At step k
//! member i swaps its partial result with i XOR 2^k and both compute (lower member's partial) ⊕
//! (higher member's partial): the same tree on both, so all results are bit-identical. Other N
//! (Thakur et al.): with P = 2^floor(log2 N), r = N - P, member 2v (v < r) first hands its input
//! to 2v+1, the P survivors exchange, and 2v+1 finally sends 2v the result. An exchange receives
//! into scratch (the partial being sent must stay intact) and reduces into the output once both
//! the send and the receive of a slice are done. Tmp: one buffer per exchanging member, reused by
//! every step (the dependencies order the reuse).
#![forbid(unsafe_code)]

use super::rdh::{fold, grid, real, Sched};
use super::{AlgoResult, Algorithm, Builder, Collectives, Deps, Options, Span};

pub struct Rd;

impl Collectives for Rd {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Rd
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
        let n = g.len();
        let mut s = Sched::new(b, start);
        if n == 1 {
            s.copy(g[0], src[0], dst[0]);
            return Ok(());
        }
        let (p, r) = fold(n);
        let len = src[0].len;
        let pieces = grid(0, len, o.slice);
        // Fold: 2v's input is reduced into 2v+1's output.
        for v in 0..r {
            let (m, e) = (2 * v + 1, 2 * v);
            for &(po, pl) in &pieces {
                s.send(g[e], g[m], src[e].sub(po, pl));
                s.recv_reduce(g[m], g[e], src[m].sub(po, pl), dst[m].sub(po, pl));
            }
        }
        let who: Vec<usize> = (0..p).map(|v| real(v, r)).collect();
        let tmp: Vec<Span> = who.iter().map(|&m| s.b.tmp(g[m], len)).collect();
        // Where each virtual member's partial result is.
        let mut cur: Vec<Span> = (0..p)
            .map(|v| if v < r { dst } else { src }[who[v]])
            .collect();
        for k in 0..p.trailing_zeros() {
            let bit = 1usize << k;
            for v in 0..p {
                let w = v ^ bit;
                let (m, pm) = (who[v], who[w]);
                for &(po, pl) in &pieces {
                    let (mine, theirs) = (cur[v].sub(po, pl), tmp[v].sub(po, pl));
                    s.send(g[m], g[pm], mine);
                    s.recv(g[m], g[pm], theirs);
                    let (a, bb) = if v < w {
                        (mine, theirs)
                    } else {
                        (theirs, mine)
                    };
                    s.reduce(g[m], a, bb, dst[m].sub(po, pl));
                }
            }
            cur = who.iter().map(|&m| dst[m]).collect();
        }
        // Unfold: 2v+1 sends the result to 2v.
        for v in 0..r {
            let (m, e) = (2 * v + 1, 2 * v);
            for &(po, pl) in &pieces {
                s.send(g[m], g[e], dst[m].sub(po, pl));
                s.recv(g[e], g[m], dst[e].sub(po, pl));
            }
        }
        Ok(())
    }
}

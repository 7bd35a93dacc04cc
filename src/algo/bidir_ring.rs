//! Bidirectional ring: two rings in opposite directions at once, each on half of the data, so
//! both directions of every link carry traffic (half the bytes per direction of one ring, same
//! 2(N-1) steps). The clockwise ring runs over the group, the counter-clockwise one over the
//! group reversed, both with `ring.rs`'s ReduceScatter and AllGather.
//!
//! AllReduce: the first half of the buffer goes clockwise, the second half counter-clockwise;
//! each ring reduce-scatters its half in the output and all-gathers it in place, its AllGather
//! waiting only for the steps of its own ReduceScatter that touch each slice. No Tmp. AllGather
//! and ReduceScatter: every chunk is split in two, first halves clockwise, second halves
//! counter-clockwise (each ring's chunk list describes its halves). ReduceScatter accumulates
//! in one Tmp workspace of the input's length per member (as the ring does), each ring in its
//! own halves of the chunks, so they never touch the same elements.
#![forbid(unsafe_code)]

use super::ring::{all_gather, reduce_scatter};
use super::{AlgoResult, Algorithm, Builder, Collectives, Deps, Options, Span};

pub struct BidirRing;

/// The first and second halves of each chunk: (offset, length) lists.
type Halves = (Vec<(usize, usize)>, Vec<(usize, usize)>);

fn split(chunks: &[(usize, usize)]) -> Halves {
    chunks
        .iter()
        .map(|&(off, len)| {
            let h = len.div_ceil(2);
            ((off, h), (off + h, len - h))
        })
        .unzip()
}

/// The group and per-member values in reverse order (the counter-clockwise ring).
fn rev<T: Clone>(v: &[T]) -> Vec<T> {
    v.iter().rev().cloned().collect()
}

impl Collectives for BidirRing {
    fn algorithm(&self) -> Algorithm {
        Algorithm::BidirRing
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
        let len = src[0].len;
        let h = len.div_ceil(2);
        let halves = [(0, h), (h, len - h)];
        // Both ReduceScatters first (each rank's steps of a ring form one phase), then both
        // AllGathers, each after its own ReduceScatter only.
        let mut phases = Vec::new();
        for (dir, &(off, l)) in halves.iter().enumerate() {
            let gg: Vec<usize> = if dir == 0 { g.to_vec() } else { rev(g) };
            let pick = |s: &[Span]| -> Vec<Span> {
                let v: Vec<Span> = s.iter().map(|x| x.sub(off, l)).collect();
                if dir == 0 {
                    v
                } else {
                    rev(&v)
                }
            };
            let (s, d) = (pick(src), pick(dst));
            let chunks = super::chunks(l, m);
            let mine: Vec<Span> = (0..m).map(|i| d[i].sub(chunks[i].0, chunks[i].1)).collect();
            let rs = reduce_scatter(b, &gg, &s, &mine, &chunks, start, o, Some(&d));
            phases.push((gg, d, chunks, mine, rs));
        }
        for (gg, d, chunks, mine, rs) in phases {
            all_gather(b, &gg, &mine, &d, &chunks, start, o, Some(&rs));
        }
        Ok(())
    }

    fn all_gather(
        &self,
        b: &mut Builder,
        g: &[usize],
        src: &[Span],
        dst: &[Span],
        chunks: &[(usize, usize)],
        start: &Deps,
        o: &Options,
    ) -> AlgoResult<()> {
        let (c1, c2) = split(chunks);
        let s1: Vec<Span> = (0..g.len()).map(|i| src[i].sub(0, c1[i].1)).collect();
        let s2: Vec<Span> = (0..g.len()).map(|i| src[i].sub(c1[i].1, c2[i].1)).collect();
        all_gather(b, g, &s1, dst, &c1, start, o, None);
        all_gather(b, &rev(g), &rev(&s2), &rev(dst), &rev(&c2), start, o, None);
        Ok(())
    }

    fn reduce_scatter(
        &self,
        b: &mut Builder,
        g: &[usize],
        src: &[Span],
        dst: &[Span],
        chunks: &[(usize, usize)],
        start: &Deps,
        o: &Options,
    ) -> AlgoResult<()> {
        let (c1, c2) = split(chunks);
        let d1: Vec<Span> = (0..g.len()).map(|i| dst[i].sub(0, c1[i].1)).collect();
        let d2: Vec<Span> = (0..g.len()).map(|i| dst[i].sub(c1[i].1, c2[i].1)).collect();
        let work: Vec<Span> = g.iter().zip(src).map(|(&r, s)| b.tmp(r, s.len)).collect();
        reduce_scatter(b, g, src, &d1, &c1, start, o, Some(&work));
        let (gr, sr, dr, cr, wr) = (rev(g), rev(src), rev(&d2), rev(&c2), rev(&work));
        reduce_scatter(b, &gr, &sr, &dr, &cr, start, o, Some(&wr));
        Ok(())
    }
}

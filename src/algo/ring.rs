//! Ring: N-1 steps each way, every rank talks to its two fixed neighbours (no ingress
//! congestion), bandwidth-optimal for large messages. Chunks are sliced so that receive,
//! reduce and send of consecutive slices overlap.
//!
//! ReduceScatter: at step s, member i sends its partial of chunk (i-s-1) to i+1 and receives
//! chunk (i-s-2) from i-1, reducing it with its own contribution; after N-1 steps member i holds
//! chunk i. AllGather: at step s member i forwards chunk (i-s) and receives chunk (i-s-1).
//! AllReduce = ReduceScatter into the output, then AllGather in place, each slice of which waits
//! only for the ReduceScatter steps that touch it (no barrier between the phases). Broadcast and
//! Reduce are pipelined chains starting (ending) at the root.
#![forbid(unsafe_code)]

use super::{slices, AlgoResult, Algorithm, Builder, Collectives, Deps, Options, Span};

pub struct Ring;

fn md(a: isize, m: usize) -> usize {
    a.rem_euclid(m as isize) as usize
}

/// The steps of a ring ReduceScatter that a following in-place AllGather must wait for, per
/// member (position in the group) and slice: nothing else of the ReduceScatter touches what
/// the AllGather reads or writes, so the two phases overlap instead of meeting at a barrier.
pub(crate) struct RsSteps {
    /// `sends[i][s]`: member i's sends at step s. From step 1 on they read the workspace chunk
    /// (i-s-1), which the AllGather's receive of its step s overwrites.
    sends: Vec<Vec<Vec<usize>>>,
    /// `last[i]`: member i's final receive-reduces, which write its own chunk (the AllGather's
    /// first send).
    last: Vec<Vec<usize>>,
}

/// The steps among `ids` that slice `j` of `n` must wait for: the matching slice when both
/// sides are cut alike, else all of them.
fn slice_deps(ids: &[usize], j: usize, n: usize) -> &[usize] {
    if ids.len() == n {
        &ids[j..=j]
    } else {
        ids
    }
}

/// Ring ReduceScatter over group `g`. Each member accumulates chunk c at offset `chunks[c].0`
/// of its workspace `work[m]` (a full-length span: the output vector for AllReduce, else
/// scratch), so every accumulator is written once and read once: no reuse, no hazards.
#[allow(clippy::too_many_arguments)]
pub(crate) fn reduce_scatter(
    b: &mut Builder,
    g: &[usize],
    src: &[Span],
    dst: &[Span],
    chunks: &[(usize, usize)],
    start: &Deps,
    o: &Options,
    work: Option<&[Span]>,
) -> RsSteps {
    let m = g.len();
    if m == 1 {
        let c = b.copy(
            g[0],
            src[0].sub(chunks[0].0, chunks[0].1),
            dst[0],
            &start[g[0]],
        );
        return RsSteps {
            sends: vec![Vec::new()],
            last: vec![c.into_iter().collect()],
        };
    }
    let len = src[0].len;
    let work: Vec<Span> = match work {
        Some(w) => w.to_vec(),
        None => g.iter().map(|&r| b.tmp(r, len)).collect(),
    };
    // prev[i][j]: member i's receive-reduce of slice j at the previous step (the data it sends now).
    let mut prev: Vec<Vec<usize>> = vec![Vec::new(); m];
    let mut sends: Vec<Vec<Vec<usize>>> = vec![Vec::new(); m];
    for s in 0..m - 1 {
        for i in 0..m {
            let r = g[i];
            let (next, pv) = (g[(i + 1) % m], g[(i + m - 1) % m]);
            let cs = md(i as isize - s as isize - 1, m);
            let cr = md(i as isize - s as isize - 2, m);
            let send_from = if s == 0 { src[i] } else { work[i] }.sub(chunks[cs].0, chunks[cs].1);
            let into = if s == m - 2 {
                dst[i]
            } else {
                work[i].sub(chunks[cr].0, chunks[cr].1)
            };
            let mine = src[i].sub(chunks[cr].0, chunks[cr].1);
            let mut step = Vec::new();
            for (j, sl) in slices(send_from, o.slice).into_iter().enumerate() {
                let mut deps = start[r].clone();
                deps.extend(prev[i].get(j));
                step.push(b.send(r, next, sl, &deps));
            }
            sends[i].push(step);
            prev[i] = slices(into, o.slice)
                .into_iter()
                .zip(slices(mine, o.slice))
                .map(|(il, ml)| b.recv_reduce(r, pv, ml, il, &start[r]))
                .collect();
        }
    }
    RsSteps { sends, last: prev }
}

/// Ring AllGather over group `g`. With `after`, it runs in place after that ReduceScatter
/// (AllReduce): each send and receive waits for the ReduceScatter steps that touch its slice,
/// not for the whole phase.
#[allow(clippy::too_many_arguments)]
pub(crate) fn all_gather(
    b: &mut Builder,
    g: &[usize],
    src: &[Span],
    dst: &[Span],
    chunks: &[(usize, usize)],
    start: &Deps,
    o: &Options,
    after: Option<&RsSteps>,
) {
    let m = g.len();
    let chunk = |i: usize, c: usize| dst[i].sub(chunks[c].0, chunks[c].1);
    // prev_recv[i][j]: the receive of slice j of the chunk member i forwards next.
    let mut prev: Vec<Vec<usize>> = vec![Vec::new(); m];
    for i in 0..m {
        let r = g[i];
        let own = chunk(i, i);
        let c = b.copy(r, src[i], own, &start[r]);
        let n = slices(own, o.slice).len();
        prev[i] = match c {
            Some(c) => vec![c; n],
            None => vec![usize::MAX; n],
        };
    }
    for s in 0..m.saturating_sub(1) {
        for i in 0..m {
            let r = g[i];
            let (next, pv) = (g[(i + 1) % m], g[(i + m - 1) % m]);
            let cs = md(i as isize - s as isize, m);
            let cr = md(i as isize - s as isize - 1, m);
            let mut new_prev = Vec::new();
            if s == 0 {
                // The own chunk goes straight from the input: the first send waits for
                // nothing, not for the local copy into the output.
                let own = slices(src[i], o.slice);
                let n = own.len();
                for (j, sl) in own.into_iter().enumerate() {
                    let mut deps = start[r].clone();
                    if let Some(rs) = after {
                        deps.extend_from_slice(slice_deps(&rs.last[i], j, n));
                    }
                    b.send(r, next, sl, &deps);
                }
            } else {
                for (j, sl) in slices(chunk(i, cs), o.slice).into_iter().enumerate() {
                    let mut deps = start[r].clone();
                    if let Some(&d) = prev[i].get(j) {
                        if d != usize::MAX {
                            deps.push(d);
                        }
                    }
                    b.send(r, next, sl, &deps);
                }
            }
            let into = slices(chunk(i, cr), o.slice);
            let n = into.len();
            for (j, rl) in into.into_iter().enumerate() {
                let mut deps = start[r].clone();
                if let (Some(rs), true) = (after, s > 0) {
                    deps.extend_from_slice(slice_deps(&rs.sends[i][s], j, n));
                }
                new_prev.push(b.recv(r, pv, rl, &deps));
            }
            prev[i] = new_prev;
        }
    }
}

impl Collectives for Ring {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Ring
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
        let chunks = super::chunks(len, g.len());
        let mine: Vec<Span> = (0..g.len())
            .map(|i| dst[i].sub(chunks[i].0, chunks[i].1))
            .collect();
        let rs = reduce_scatter(b, g, src, &mine, &chunks, start, o, Some(dst));
        all_gather(b, g, &mine, dst, &chunks, start, o, Some(&rs));
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
        all_gather(b, g, src, dst, chunks, start, o, None);
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
        reduce_scatter(b, g, src, dst, chunks, start, o, None);
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
        // Position along the chain: the root first.
        for p in 0..m {
            let i = (root + p) % m;
            let r = g[i];
            let next = g[(i + 1) % m];
            if p == 0 {
                b.copy(r, src[i], dst[i], &start[r]);
                if m > 1 {
                    for sl in slices(src[i], o.slice) {
                        b.send(r, next, sl, &start[r]);
                    }
                }
                continue;
            }
            for sl in slices(dst[i], o.slice) {
                let rv = b.recv(r, g[(i + m - 1) % m], sl, &start[r]);
                if p < m - 1 {
                    b.send(r, next, sl, &[rv]);
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
        if m == 1 {
            b.copy(g[0], src[0], dst[0], &start[g[0]]);
            return Ok(());
        }
        // The chain ends at the root: position p = 0 is the root's successor.
        for p in 0..m {
            let i = (root + 1 + p) % m;
            let r = g[i];
            let (next, prev) = (g[(i + 1) % m], g[(i + m - 1) % m]);
            if p == 0 {
                for sl in slices(src[i], o.slice) {
                    b.send(r, next, sl, &start[r]);
                }
                continue;
            }
            let acc = if p == m - 1 {
                dst[i]
            } else {
                b.tmp(r, src[i].len)
            };
            for (al, ml) in slices(acc, o.slice)
                .into_iter()
                .zip(slices(src[i], o.slice))
            {
                let rr = b.recv_reduce(r, prev, ml, al, &start[r]);
                if p < m - 1 {
                    b.send(r, next, al, &[rr]);
                }
            }
        }
        Ok(())
    }
}

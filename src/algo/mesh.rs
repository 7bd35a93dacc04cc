//! Mesh: every member exchanges with all its peers at once, one step per phase (fewest hops,
//! but every member receives from N-1 peers at once: ingress congestion at large N).
//!
//! ReduceScatter: member i sends chunk j of its input to member j and receives chunk i of every
//! peer's input into its own Tmp slot, then reduces the N contributions slice by slice in member
//! order 0..N-1 (its own input at position i): deterministic and the same on every rank. Tmp:
//! (N-1) x its chunk. AllGather: member i sends its chunk to every peer and receives theirs (no
//! Tmp). AllReduce = mesh ReduceScatter into its chunk of the output, then mesh AllGather of it,
//! each slice forwarded as soon as it is reduced; Tmp (N-1) x chunk (about B). Broadcast: the root
//! sends to every member. Reduce: every member sends to the root, which reduces in member order
//! (Tmp (N-1) x B on the root only). AllToAll: block j of member i goes straight to member j.
//! Peers are visited in a staggered order (i+1, i+2, ...) so that no member is everyone's first.
#![forbid(unsafe_code)]

use super::{slices, AlgoResult, Algorithm, Builder, Collectives, Deps, Options, Span};

pub struct Mesh;

/// For each slice of a span (as `slices` cuts it), the steps after which that slice is ready.
pub(crate) type Ready = Vec<Vec<usize>>;

/// `dst = parts[0] ⊕ parts[1] ⊕ ...`, combined left to right slice by slice (one part: a copy),
/// so that the reduction tree is the same wherever the same parts are combined. Each part is a
/// span of `dst`'s length with the steps each of its slices waits for. Returns, per slice, the
/// steps after which that slice of `dst` holds the result.
pub(crate) fn reduce_in_order(
    b: &mut Builder,
    r: usize,
    parts: &[(Span, Ready)],
    dst: Span,
    start: &[usize],
    o: &Options,
) -> Ready {
    let dsl = slices(dst, o.slice);
    let psl: Vec<Vec<Span>> = parts.iter().map(|(s, _)| slices(*s, o.slice)).collect();
    (0..dsl.len())
        .map(|j| {
            let d = dsl[j];
            let mut deps = start.to_vec();
            deps.extend(&parts[0].1[j]);
            if parts.len() == 1 {
                return match b.copy(r, psl[0][j], d, &deps) {
                    Some(c) => vec![c],
                    None => deps,
                };
            }
            deps.extend(&parts[1].1[j]);
            let mut last = b.reduce(r, psl[0][j], psl[1][j], d, &deps);
            for k in 2..parts.len() {
                let mut deps = vec![last];
                deps.extend(&parts[k].1[j]);
                last = b.reduce(r, d, psl[k][j], d, &deps);
            }
            vec![last]
        })
        .collect()
}

/// A part that is ready from the start of the phase (an input span).
pub(crate) fn at_once(s: Span, o: &Options) -> (Span, Ready) {
    (s, vec![Vec::new(); slices(s, o.slice).len()])
}

/// Receive `len` elements from `peer` (global rank) into a fresh Tmp slot of rank `r`, slice by
/// slice; returns the slot and its per-slice readiness.
pub(crate) fn recv_slot(
    b: &mut Builder,
    r: usize,
    peer: usize,
    len: usize,
    start: &[usize],
    o: &Options,
) -> (Span, Ready) {
    let slot = b.tmp(r, len);
    let ready = slices(slot, o.slice)
        .into_iter()
        .map(|sl| vec![b.recv(r, peer, sl, start)])
        .collect();
    (slot, ready)
}

/// Mesh ReduceScatter over `g` (see the module doc). Returns, per member, the per-slice steps
/// after which its `dst` slices hold the result.
pub(crate) fn reduce_scatter(
    b: &mut Builder,
    g: &[usize],
    src: &[Span],
    dst: &[Span],
    chunks: &[(usize, usize)],
    start: &Deps,
    o: &Options,
) -> Vec<Ready> {
    let m = g.len();
    for i in 0..m {
        let r = g[i];
        for p in 1..m {
            let j = (i + p) % m;
            for sl in slices(src[i].sub(chunks[j].0, chunks[j].1), o.slice) {
                b.send(r, g[j], sl, &start[r]);
            }
        }
    }
    (0..m)
        .map(|i| {
            let r = g[i];
            let (off, len) = chunks[i];
            let parts: Vec<(Span, Ready)> = (0..m)
                .map(|k| {
                    if k == i {
                        at_once(src[i].sub(off, len), o)
                    } else {
                        recv_slot(b, r, g[k], len, &start[r], o)
                    }
                })
                .collect();
            reduce_in_order(b, r, &parts, dst[i], &start[r], o)
        })
        .collect()
}

/// Mesh AllGather over `g`: slice s of member i's `src` may go once `ready[i][s]` (and
/// `start`) have completed. Nothing is copied when `src` already is the member's chunk of `dst`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn all_gather(
    b: &mut Builder,
    g: &[usize],
    src: &[Span],
    dst: &[Span],
    chunks: &[(usize, usize)],
    ready: &[Ready],
    start: &Deps,
    o: &Options,
) {
    let m = g.len();
    for i in 0..m {
        let r = g[i];
        let own = dst[i].sub(chunks[i].0, chunks[i].1);
        let mut deps = start[r].clone();
        deps.extend(ready[i].iter().flatten());
        b.copy(r, src[i], own, &deps);
        for p in 1..m {
            let j = (i + p) % m;
            for (s, sl) in slices(src[i], o.slice).into_iter().enumerate() {
                let mut deps = start[r].clone();
                deps.extend(&ready[i][s]);
                b.send(r, g[j], sl, &deps);
            }
        }
        for p in 1..m {
            let j = (i + m - p) % m;
            for sl in slices(dst[i].sub(chunks[j].0, chunks[j].1), o.slice) {
                b.recv(r, g[j], sl, &start[r]);
            }
        }
    }
}

impl Collectives for Mesh {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Mesh
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
        let chunks = super::chunks(src[0].len, m);
        let mine: Vec<Span> = (0..m)
            .map(|i| dst[i].sub(chunks[i].0, chunks[i].1))
            .collect();
        let ready = reduce_scatter(b, g, src, &mine, &chunks, start, o);
        all_gather(b, g, &mine, dst, &chunks, &ready, start, o);
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
        let ready: Vec<Ready> = src.iter().map(|s| at_once(*s, o).1).collect();
        all_gather(b, g, src, dst, chunks, &ready, start, o);
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
        reduce_scatter(b, g, src, dst, chunks, start, o);
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
        let rr = g[root];
        b.copy(rr, src[root], dst[root], &start[rr]);
        for p in 1..m {
            let j = (root + p) % m;
            for sl in slices(src[root], o.slice) {
                b.send(rr, g[j], sl, &start[rr]);
            }
            for sl in slices(dst[j], o.slice) {
                b.recv(g[j], rr, sl, &start[g[j]]);
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
        let rr = g[root];
        for i in (0..m).filter(|&i| i != root) {
            for sl in slices(src[i], o.slice) {
                b.send(g[i], rr, sl, &start[g[i]]);
            }
        }
        let len = src[root].len;
        let parts: Vec<(Span, Ready)> = (0..m)
            .map(|k| {
                if k == root {
                    at_once(src[root], o)
                } else {
                    recv_slot(b, rr, g[k], len, &start[rr], o)
                }
            })
            .collect();
        reduce_in_order(b, rr, &parts, dst[root], &start[rr], o);
        Ok(())
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
        let m = g.len();
        for i in 0..m {
            let r = g[i];
            b.copy(
                r,
                src[i].sub(i * count, count),
                dst[i].sub(i * count, count),
                &start[r],
            );
            for p in 1..m {
                let j = (i + p) % m;
                for sl in slices(src[i].sub(j * count, count), o.slice) {
                    b.send(r, g[j], sl, &start[r]);
                }
            }
            for p in 1..m {
                let j = (i + m - p) % m;
                for sl in slices(dst[i].sub(j * count, count), o.slice) {
                    b.recv(r, g[j], sl, &start[r]);
                }
            }
        }
        Ok(())
    }
}

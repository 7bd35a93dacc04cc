//! Hierarchical: an intra-host algorithm composed with an inter-host one, for any layout. The
//! hosts are those of the group's members (`Options::hosts`), in order of first appearance;
//! `H[h][k]` is the k-th member of host h (any placement, any counts). With L the smallest
//! host's size, the members of local index k < L form lane k, an inter-host group of one member
//! per host; on a larger host, member k >= L is an *extra* served by lane k mod L (its leader is
//! `H[h][k mod L]`), in round k / L.
//!
//! - AllReduce: each host reduce-scatters (intra) the buffer into L parts, held by its first L
//!   members (extras get empty parts); lane k all-reduces (inter) part k; each host all-gathers
//!   (intra) the parts.
//! - ReduceScatter: for every destination host x' and round q, each host reduce-scatters (intra)
//!   the chunks of `H[x'][qL..qL+L]`, lane member k keeping the chunk of `H[x'][qL+k]` in its
//!   lane buffer (all hosts' chunks of its lane, host-major); lane k reduce-scatters (inter)
//!   these buffers; a leader keeps its own chunk and sends the extras theirs (intra, one hop).
//! - AllGather, the mirror: extras send their chunk to their leader; lane k all-gathers (inter)
//!   its blocks; for every source host x' and round q each host all-gathers (intra) the chunks
//!   of `H[x'][qL..qL+L]` from its lane members.
//! - Broadcast: the root and, on every other host, the member of the root's local index (mod
//!   the host's size) broadcast (inter); then each host broadcasts (intra) from it. Reduce is the
//!   reverse, through scratch on those members.
//!
//! With equal counts (L = Y, no extras) this is the classic composition: no scatter or gather
//! hop, inter AllGather and intra ReduceScatter write their final places directly. Frontiers
//! separate phases; one member per host (one host) runs the inter (intra) algorithm alone. Tmp:
//! AllReduce 1/L of the buffer; ReduceScatter the chunks of the member's lane (1/Y of the input
//! when even); AllGather (uneven only) its lane's blocks; Reduce a buffer on each inter reducer.
#![forbid(unsafe_code)]

use super::{
    slices, AlgoError, AlgoResult, Algorithm, Builder, Collective, Collectives, Deps, Options, Span,
};

pub struct Hier;

/// The hosts (member indices per host) and the two levels.
type Levels = (
    Vec<Vec<usize>>,
    &'static dyn Collectives,
    &'static dyn Collectives,
);

pub(crate) fn level(name: &str, a: Algorithm) -> AlgoResult<&'static dyn Collectives> {
    if matches!(a, Algorithm::Hier | Algorithm::Swizzle) {
        return Err(AlgoError::Invalid(format!(
            "{name}: the {name}-host algorithm cannot be {a} itself"
        )));
    }
    super::implementation(a)
        .ok_or_else(|| AlgoError::Invalid(format!("{name}: {a} has no implementation")))
}

fn levels(g: &[usize], o: &Options) -> AlgoResult<Levels> {
    Ok((
        o.hosts.groups(g),
        level("intra", o.intra)?,
        level("inter", o.inter)?,
    ))
}

/// The smallest range `(lo, hi)` covering the non-empty chunks (`(0, 0)` if none).
pub(crate) fn cover(ch: &[(usize, usize)]) -> (usize, usize) {
    let ne = || ch.iter().filter(|c| c.1 > 0);
    let lo = ne().map(|c| c.0).min().unwrap_or(0);
    let hi = ne().map(|c| c.0 + c.1).max().unwrap_or(lo);
    (lo, hi)
}

/// `chs` relative to their cover: (cover, relative chunks; empty ones at 0).
pub(crate) fn relative(chs: &[(usize, usize)]) -> ((usize, usize), Vec<(usize, usize)>) {
    let (lo, hi) = cover(chs);
    let rel = chs
        .iter()
        .map(|&(off, l)| if l == 0 { (0, 0) } else { (off - lo, l) })
        .collect();
    ((lo, hi), rel)
}

/// One intra-host collective over the chunks of (some of) the members of host `to`: member k
/// of the host that runs it holds (reduces or contributes) the chunk of `tgt[k]`; `cover` is the
/// range of the vector these chunks span and `rel` the chunks relative to it (empty at 0).
pub(crate) struct Round {
    pub tgt: Vec<Option<usize>>,
    pub cover: (usize, usize),
    pub rel: Vec<(usize, usize)>,
}

/// The rounds in which a host of `size` members serves the members of host `to`, `per` at a
/// time: in round q, its member k < per serves `to[q * per + k]`; the others serve nothing.
pub(crate) fn rounds(
    size: usize,
    to: &[usize],
    per: usize,
    chunks: &[(usize, usize)],
) -> Vec<Round> {
    (0..to.len().div_ceil(per))
        .map(|q| {
            let tgt: Vec<Option<usize>> = (0..size)
                .map(|k| to.get(q * per + k).copied().filter(|_| k < per))
                .collect();
            let cs: Vec<(usize, usize)> = tgt
                .iter()
                .map(|t| t.map_or((0, 0), |e| chunks[e]))
                .collect();
            let (cover, rel) = relative(&cs);
            Round { tgt, cover, rel }
        })
        .collect()
}

/// The members of lane `k` on host `h` (its leader first, then the extras it serves).
fn lane(h: &[usize], l: usize, k: usize) -> Vec<usize> {
    (k..h.len()).step_by(l).collect::<Vec<_>>()
}

/// Per lane: where each member's chunk sits in the lane buffer (host-major, round-minor), and
/// the extent of each host's block. `at[m]` is member m's offset in its lane's buffer.
struct LaneBufs {
    at: Vec<usize>,
    block: Vec<Vec<(usize, usize)>>,
    total: Vec<usize>,
}

fn lane_bufs(hs: &[Vec<usize>], l: usize, chunks: &[(usize, usize)]) -> LaneBufs {
    let mut at = vec![0; chunks.len()];
    let mut block = vec![Vec::new(); l];
    let mut total = vec![0; l];
    for (k, blk) in block.iter_mut().enumerate() {
        let mut off = 0;
        for h in hs {
            let start = off;
            for i in lane(h, l, k) {
                at[h[i]] = off;
                off += chunks[h[i]].1;
            }
            blk.push((start, off - start));
        }
        total[k] = off;
    }
    LaneBufs { at, block, total }
}

/// Global ranks and per-member values of a subset of members.
fn pick<T: Copy>(ms: &[usize], v: &[T]) -> Vec<T> {
    ms.iter().map(|&m| v[m]).collect()
}

impl Collectives for Hier {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Hier
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
        let c = Collective::AllReduce;
        let (hs, intra, inter) = levels(g, o)?;
        let l = hs.iter().map(Vec::len).min().unwrap_or(1);
        if hs.len() == 1 {
            return self.as_own(c, intra.all_reduce(b, g, src, dst, start, o));
        }
        if hs.iter().all(|h| h.len() == 1) {
            return self.as_own(c, inter.all_reduce(b, g, src, dst, start, o));
        }
        let len = src[0].len;
        let ch = super::chunks(len, l);
        // Local index k's part: chunk k for the first L members, nothing for the extras.
        let lc = |k: usize| if k < l { ch[k] } else { (len, 0) };
        let mut part = vec![Span::new(super::Buf::Tmp, 0, 0); g.len()];
        for h in &hs {
            for (k, &m) in h.iter().enumerate() {
                part[m] = b.tmp(g[m], lc(k).1);
            }
        }
        for h in &hs {
            let cs: Vec<(usize, usize)> = (0..h.len()).map(lc).collect();
            let rs = intra.reduce_scatter(
                b,
                &pick(h, g),
                &pick(h, src),
                &pick(h, &part),
                &cs,
                start,
                o,
            );
            self.as_own(c, rs)?;
        }
        let mid = b.frontiers();
        for (k, &(off, len)) in ch.iter().enumerate() {
            let ms: Vec<usize> = hs.iter().map(|h| h[k]).collect();
            let dl: Vec<Span> = ms.iter().map(|&m| dst[m].sub(off, len)).collect();
            let ar = inter.all_reduce(b, &pick(&ms, g), &pick(&ms, &part), &dl, &mid, o);
            self.as_own(c, ar)?;
        }
        let mid = b.frontiers();
        for h in &hs {
            let cs: Vec<(usize, usize)> = (0..h.len()).map(lc).collect();
            let own: Vec<Span> = h
                .iter()
                .enumerate()
                .map(|(k, &m)| dst[m].sub(cs[k].0, cs[k].1))
                .collect();
            let ag = intra.all_gather(b, &pick(h, g), &own, &pick(h, dst), &cs, &mid, o);
            self.as_own(c, ag)?;
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
        let c = Collective::AllGather;
        let (hs, intra, inter) = levels(g, o)?;
        let l = hs.iter().map(Vec::len).min().unwrap_or(1);
        if hs.len() == 1 {
            return self.as_own(c, intra.all_gather(b, g, src, dst, chunks, start, o));
        }
        if hs.iter().all(|h| h.len() == 1) {
            return self.as_own(c, inter.all_gather(b, g, src, dst, chunks, start, o));
        }
        // A lane is direct when it serves no extra: its AllGather writes the output itself.
        let direct = |k: usize| hs.iter().all(|h| h.len() <= k + l);
        let lb = lane_bufs(&hs, l, chunks);
        let mut buf: Vec<Option<Span>> = vec![None; g.len()];
        let mut mid = start.clone();
        if (0..l).any(|k| !direct(k)) {
            // The extras hand their chunk to their leader, which gathers its lane's block.
            for k in (0..l).filter(|&k| !direct(k)) {
                for h in &hs {
                    let lead = h[k];
                    let t = b.tmp(g[lead], lb.total[k]);
                    buf[lead] = Some(t);
                    for &i in &lane(h, l, k)[1..] {
                        let e = h[i];
                        let into = t.sub(lb.at[e], chunks[e].1);
                        for (sl, rl) in slices(src[e], o.slice)
                            .into_iter()
                            .zip(slices(into, o.slice))
                        {
                            b.send(g[e], g[lead], sl, &start[g[e]]);
                            b.recv(g[lead], g[e], rl, &start[g[lead]]);
                        }
                    }
                    let own = t.sub(lb.at[lead], chunks[lead].1);
                    b.copy(g[lead], src[lead], own, &start[g[lead]]);
                }
            }
            mid = b.frontiers();
        }
        for k in 0..l {
            let ms: Vec<usize> = hs.iter().map(|h| h[k]).collect();
            let gl = pick(&ms, g);
            let ag = if direct(k) {
                let cl: Vec<(usize, usize)> = pick(&ms, chunks);
                inter.all_gather(b, &gl, &pick(&ms, src), &pick(&ms, dst), &cl, &mid, o)
            } else {
                let tl: Vec<Span> = ms.iter().map(|&m| buf[m].expect("lane buffer")).collect();
                let sl: Vec<Span> = (0..ms.len())
                    .map(|x| tl[x].sub(lb.block[k][x].0, lb.block[k][x].1))
                    .collect();
                inter.all_gather(b, &gl, &sl, &tl, &lb.block[k], &mid, o)
            };
            self.as_own(c, ag)?;
        }
        let mid = b.frontiers();
        for node in &hs {
            for xp in &hs {
                // Lane member k of `node` holds the chunk of xp's member qL+k.
                for rd in rounds(node.len(), xp, l, chunks) {
                    let ((lo, hi), ci) = (rd.cover, rd.rel);
                    let di: Vec<Span> = node.iter().map(|&m| dst[m].sub(lo, hi - lo)).collect();
                    let si: Vec<Span> = (0..node.len())
                        .map(|k| match (rd.tgt[k], buf[node[k]]) {
                            (None, _) => di[k].sub(0, 0),
                            (Some(e), Some(t)) if !direct(k) => t.sub(lb.at[e], chunks[e].1),
                            (Some(_), _) => di[k].sub(ci[k].0, ci[k].1),
                        })
                        .collect();
                    let ag = intra.all_gather(b, &pick(node, g), &si, &di, &ci, &mid, o);
                    self.as_own(c, ag)?;
                }
            }
        }
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
        let c = Collective::ReduceScatter;
        let (hs, intra, inter) = levels(g, o)?;
        let l = hs.iter().map(Vec::len).min().unwrap_or(1);
        if hs.len() == 1 {
            return self.as_own(c, intra.reduce_scatter(b, g, src, dst, chunks, start, o));
        }
        if hs.iter().all(|h| h.len() == 1) {
            return self.as_own(c, inter.reduce_scatter(b, g, src, dst, chunks, start, o));
        }
        let direct = |k: usize| hs.iter().all(|h| h.len() <= k + l);
        let lb = lane_bufs(&hs, l, chunks);
        // Lane leaders accumulate their lane's chunks of every host; extras hold nothing.
        let mut part = vec![Span::new(super::Buf::Tmp, 0, 0); g.len()];
        for h in &hs {
            for (k, &m) in h.iter().enumerate().take(l) {
                part[m] = b.tmp(g[m], lb.total[k]);
            }
        }
        for node in &hs {
            for xp in &hs {
                for rd in rounds(node.len(), xp, l, chunks) {
                    let ((lo, hi), ci) = (rd.cover, rd.rel);
                    let si: Vec<Span> = node.iter().map(|&m| src[m].sub(lo, hi - lo)).collect();
                    let di: Vec<Span> = (0..node.len())
                        .map(|k| match rd.tgt[k] {
                            Some(e) => part[node[k]].sub(lb.at[e], chunks[e].1),
                            None => part[node[k]].sub(0, 0),
                        })
                        .collect();
                    let rs = intra.reduce_scatter(b, &pick(node, g), &si, &di, &ci, start, o);
                    self.as_own(c, rs)?;
                }
            }
        }
        let mid = b.frontiers();
        // Where each leader receives its lane's block: its output when it serves no extra.
        let mut got: Vec<Option<Span>> = vec![None; g.len()];
        for k in 0..l {
            let ms: Vec<usize> = hs.iter().map(|h| h[k]).collect();
            let dl: Vec<Span> = ms
                .iter()
                .enumerate()
                .map(|(x, &m)| {
                    if direct(k) {
                        dst[m]
                    } else {
                        let t = b.tmp(g[m], lb.block[k][x].1);
                        got[m] = Some(t);
                        t
                    }
                })
                .collect();
            let rs = inter.reduce_scatter(
                b,
                &pick(&ms, g),
                &pick(&ms, &part),
                &dl,
                &lb.block[k],
                &mid,
                o,
            );
            self.as_own(c, rs)?;
        }
        if got.iter().any(Option::is_some) {
            let mid = b.frontiers();
            for (x, h) in hs.iter().enumerate() {
                for (k, &lead) in h.iter().enumerate().take(l) {
                    let Some(t) = got[lead] else { continue };
                    let base = lb.block[k][x].0;
                    let own = t.sub(lb.at[lead] - base, chunks[lead].1);
                    b.copy(g[lead], own, dst[lead], &mid[g[lead]]);
                    for &i in &lane(h, l, k)[1..] {
                        let e = h[i];
                        let from = t.sub(lb.at[e] - base, chunks[e].1);
                        for (sl, rl) in slices(from, o.slice)
                            .into_iter()
                            .zip(slices(dst[e], o.slice))
                        {
                            b.send(g[lead], g[e], sl, &mid[g[lead]]);
                            b.recv(g[e], g[lead], rl, &mid[g[e]]);
                        }
                    }
                }
            }
        }
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
        let c = Collective::Broadcast;
        let (hs, intra, inter) = levels(g, o)?;
        if hs.len() == 1 {
            return self.as_own(c, intra.broadcast(b, g, root, src, dst, start, o));
        }
        if hs.iter().all(|h| h.len() == 1) {
            return self.as_own(c, inter.broadcast(b, g, root, src, dst, start, o));
        }
        let (xr, reps) = reps(&hs, root);
        let ms: Vec<usize> = hs.iter().zip(&reps).map(|(h, &k)| h[k]).collect();
        let bc = inter.broadcast(
            b,
            &pick(&ms, g),
            xr,
            &pick(&ms, src),
            &pick(&ms, dst),
            start,
            o,
        );
        self.as_own(c, bc)?;
        let mid = b.frontiers();
        for (h, &k) in hs.iter().zip(&reps) {
            // The host's root sends what it has in its output (the global root's input is
            // there too, since the inter-host broadcast put it there).
            let si: Vec<Span> = h
                .iter()
                .map(|&m| if m == h[k] { dst[m] } else { src[m] })
                .collect();
            let bc = intra.broadcast(b, &pick(h, g), k, &si, &pick(h, dst), &mid, o);
            self.as_own(c, bc)?;
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
        let c = Collective::Reduce;
        let (hs, intra, inter) = levels(g, o)?;
        if hs.len() == 1 {
            return self.as_own(c, intra.reduce(b, g, root, src, dst, start, o));
        }
        if hs.iter().all(|h| h.len() == 1) {
            return self.as_own(c, inter.reduce(b, g, root, src, dst, start, o));
        }
        let (xr, reps) = reps(&hs, root);
        let len = src[0].len;
        // The host's sum, on its representative.
        let mut part = Vec::new();
        for (h, &k) in hs.iter().zip(&reps) {
            let acc = b.tmp(g[h[k]], len);
            part.push(acc);
            let di: Vec<Span> = h
                .iter()
                .map(|&m| if m == h[k] { acc } else { dst[m] })
                .collect();
            let rd = intra.reduce(b, &pick(h, g), k, &pick(h, src), &di, start, o);
            self.as_own(c, rd)?;
        }
        let mid = b.frontiers();
        let ms: Vec<usize> = hs.iter().zip(&reps).map(|(h, &k)| h[k]).collect();
        let rd = inter.reduce(b, &pick(&ms, g), xr, &part, &pick(&ms, dst), &mid, o);
        self.as_own(c, rd)
    }
}

/// The root's host and, per host, the local index of its representative in a rooted
/// collective: the root itself on its host, elsewhere the member of the root's local index
/// (modulo the host's size).
fn reps(hs: &[Vec<usize>], root: usize) -> (usize, Vec<usize>) {
    let (xr, lr) = hs
        .iter()
        .enumerate()
        .find_map(|(x, h)| h.iter().position(|&m| m == root).map(|k| (x, k)))
        .expect("the root is a member");
    (xr, hs.iter().map(|h| lr % h.len()).collect())
}

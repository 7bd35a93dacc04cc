//! Hierarchical: X hosts of Y members (`Options::hosts`) (member m = node*Y + local index l); an intra-node
//! algorithm composed with an inter-node one (the members with the same l form an inter group).
//! AllGather: inter-node AllGather, then per node one intra-node AllGather per source node x'
//! (chunks x'Y..x'Y+Y are contiguous; the X instances run concurrently). ReduceScatter: per node
//! one intra-node ReduceScatter per x' (l gets chunk x'Y+l, kept in scratch in node order), then an
//! inter-node ReduceScatter of that scratch: member m ends with chunk m. AllReduce: intra-node
//! ReduceScatter (l gets 1/Y, in scratch), inter-node AllReduce of it into the output, intra-node
//! AllGather. Broadcast: inter-node in the root's group, then intra-node; Reduce the reverse.
//! Frontiers separate phases; Y = 1 (X = 1) runs the inter (intra) algorithm alone. Tmp: AllReduce
//! 1/Y of the buffer, ReduceScatter 1/Y of the input, Reduce a buffer per inter-node reducer.
#![forbid(unsafe_code)]

use super::{
    AlgoError, AlgoResult, Algorithm, Builder, Collective, Collectives, Deps, Options, Span,
};

pub struct Hier;

/// The shape and the two levels: (X, Y, intra, inter).
type Levels = (
    usize,
    usize,
    &'static dyn Collectives,
    &'static dyn Collectives,
);

fn levels(g: &[usize], o: &Options) -> AlgoResult<Levels> {
    let n = g.len();
    // Members per host, in the group's order: each host's members must be consecutive and
    // every host must hold as many.
    let mut runs: Vec<usize> = Vec::new();
    for (m, &r) in g.iter().enumerate() {
        if m > 0 && o.hosts.host_of(r) == o.hosts.host_of(g[m - 1]) {
            *runs.last_mut().expect("one run per host") += 1;
        } else {
            runs.push(1);
        }
    }
    let y = runs[0];
    let mut hosts: Vec<usize> = g.iter().map(|&r| o.hosts.host_of(r)).collect();
    hosts.sort_unstable();
    hosts.dedup();
    if runs.iter().any(|&r| r != y) || runs.len() != hosts.len() {
        return Err(AlgoError::Invalid(format!(
            "hosts: hier needs the same number of ranks on every host, each host's ranks \
             consecutive (ranks per host in rank order: {runs:?})"
        )));
    }
    let level = |name: &str, a: Algorithm| {
        if matches!(a, Algorithm::Hier | Algorithm::Swizzle) {
            return Err(AlgoError::Invalid(format!(
                "{name}: the {name}-host algorithm cannot be {a} itself"
            )));
        }
        super::implementation(a)
            .ok_or_else(|| AlgoError::Invalid(format!("{name}: {a} has no implementation")))
    };
    Ok((n / y, y, level("intra", o.intra)?, level("inter", o.inter)?))
}

/// The smallest range `(lo, hi)` covering the given chunks.
fn cover(ch: &[(usize, usize)]) -> (usize, usize) {
    let lo = ch.iter().map(|c| c.0).min().unwrap_or(0);
    let hi = ch.iter().map(|c| c.0 + c.1).max().unwrap_or(lo);
    (lo, hi)
}

impl Hier {
    /// A sub-algorithm's "not applicable" is reported as hier's.
    fn sub(&self, coll: Collective, r: AlgoResult<()>) -> AlgoResult<()> {
        r.map_err(|e| match e {
            AlgoError::NotApplicable { .. } => self.na(coll),
            e => e,
        })
    }
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
        let (x, y, intra, inter) = levels(g, o)?;
        if y == 1 {
            return self.sub(c, inter.all_reduce(b, g, src, dst, start, o));
        }
        if x == 1 {
            return self.sub(c, intra.all_reduce(b, g, src, dst, start, o));
        }
        let ch = super::chunks(src[0].len, y);
        let part: Vec<Span> = (0..g.len()).map(|m| b.tmp(g[m], ch[m % y].1)).collect();
        for node in 0..x {
            let r = node * y..(node + 1) * y;
            let rs =
                intra.reduce_scatter(b, &g[r.clone()], &src[r.clone()], &part[r], &ch, start, o);
            self.sub(c, rs)?;
        }
        let mid = b.frontiers();
        for (l, &(off, len)) in ch.iter().enumerate() {
            let ms: Vec<usize> = (0..x).map(|node| node * y + l).collect();
            let gl: Vec<usize> = ms.iter().map(|&m| g[m]).collect();
            let sl: Vec<Span> = ms.iter().map(|&m| part[m]).collect();
            let dl: Vec<Span> = ms.iter().map(|&m| dst[m].sub(off, len)).collect();
            self.sub(c, inter.all_reduce(b, &gl, &sl, &dl, &mid, o))?;
        }
        let mid = b.frontiers();
        for node in 0..x {
            let r = node * y..(node + 1) * y;
            let own: Vec<Span> = r
                .clone()
                .map(|m| dst[m].sub(ch[m % y].0, ch[m % y].1))
                .collect();
            let ag = intra.all_gather(b, &g[r.clone()], &own, &dst[r], &ch, &mid, o);
            self.sub(c, ag)?;
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
        let (x, y, intra, inter) = levels(g, o)?;
        if y == 1 {
            return self.sub(c, inter.all_gather(b, g, src, dst, chunks, start, o));
        }
        if x == 1 {
            return self.sub(c, intra.all_gather(b, g, src, dst, chunks, start, o));
        }
        for l in 0..y {
            let ms: Vec<usize> = (0..x).map(|node| node * y + l).collect();
            let gl: Vec<usize> = ms.iter().map(|&m| g[m]).collect();
            let sl: Vec<Span> = ms.iter().map(|&m| src[m]).collect();
            let dl: Vec<Span> = ms.iter().map(|&m| dst[m]).collect();
            let cl: Vec<(usize, usize)> = ms.iter().map(|&m| chunks[m]).collect();
            self.sub(c, inter.all_gather(b, &gl, &sl, &dl, &cl, start, o))?;
        }
        let mid = b.frontiers();
        for node in 0..x {
            let r = node * y..(node + 1) * y;
            for xp in 0..x {
                // The chunks of node xp's members, which every member of `node` now has its own of.
                let cs = &chunks[xp * y..(xp + 1) * y];
                let (lo, hi) = cover(cs);
                let ci: Vec<(usize, usize)> = cs.iter().map(|&(off, l)| (off - lo, l)).collect();
                let di: Vec<Span> = r.clone().map(|m| dst[m].sub(lo, hi - lo)).collect();
                let si: Vec<Span> = (0..y).map(|l| di[l].sub(ci[l].0, ci[l].1)).collect();
                let ag = intra.all_gather(b, &g[r.clone()], &si, &di, &ci, &mid, o);
                self.sub(c, ag)?;
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
        let (x, y, intra, inter) = levels(g, o)?;
        if y == 1 {
            return self.sub(c, inter.reduce_scatter(b, g, src, dst, chunks, start, o));
        }
        if x == 1 {
            return self.sub(c, intra.reduce_scatter(b, g, src, dst, chunks, start, o));
        }
        // Local index l keeps chunks l, Y+l, 2Y+l, .. (node order) in scratch: pos[l][x'].
        let pos: Vec<Vec<usize>> = (0..y)
            .map(|l| {
                let mut v = vec![0];
                for xp in 0..x {
                    v.push(v[xp] + chunks[xp * y + l].1);
                }
                v
            })
            .collect();
        let part: Vec<Span> = (0..g.len()).map(|m| b.tmp(g[m], pos[m % y][x])).collect();
        for node in 0..x {
            let r = node * y..(node + 1) * y;
            for xp in 0..x {
                let cs = &chunks[xp * y..(xp + 1) * y];
                let (lo, hi) = cover(cs);
                let ci: Vec<(usize, usize)> = cs.iter().map(|&(off, l)| (off - lo, l)).collect();
                let si: Vec<Span> = r.clone().map(|m| src[m].sub(lo, hi - lo)).collect();
                let di: Vec<Span> = r
                    .clone()
                    .map(|m| part[m].sub(pos[m % y][xp], chunks[xp * y + m % y].1))
                    .collect();
                let rs = intra.reduce_scatter(b, &g[r.clone()], &si, &di, &ci, start, o);
                self.sub(c, rs)?;
            }
        }
        let mid = b.frontiers();
        for l in 0..y {
            let ms: Vec<usize> = (0..x).map(|node| node * y + l).collect();
            let gl: Vec<usize> = ms.iter().map(|&m| g[m]).collect();
            let sl: Vec<Span> = ms.iter().map(|&m| part[m]).collect();
            let dl: Vec<Span> = ms.iter().map(|&m| dst[m]).collect();
            let cl: Vec<(usize, usize)> = (0..x)
                .map(|node| (pos[l][node], chunks[node * y + l].1))
                .collect();
            self.sub(c, inter.reduce_scatter(b, &gl, &sl, &dl, &cl, &mid, o))?;
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
        let (x, y, intra, inter) = levels(g, o)?;
        if y == 1 {
            return self.sub(c, inter.broadcast(b, g, root, src, dst, start, o));
        }
        if x == 1 {
            return self.sub(c, intra.broadcast(b, g, root, src, dst, start, o));
        }
        let (xr, lr) = (root / y, root % y);
        let ms: Vec<usize> = (0..x).map(|node| node * y + lr).collect();
        let gl: Vec<usize> = ms.iter().map(|&m| g[m]).collect();
        let sl: Vec<Span> = ms.iter().map(|&m| src[m]).collect();
        let dl: Vec<Span> = ms.iter().map(|&m| dst[m]).collect();
        self.sub(c, inter.broadcast(b, &gl, xr, &sl, &dl, start, o))?;
        let mid = b.frontiers();
        for node in 0..x {
            let r = node * y..(node + 1) * y;
            // The node's root sends what it has in its output (the global root's input is
            // there too, since the inter-node broadcast put it there).
            let si: Vec<Span> = r
                .clone()
                .map(|m| if m % y == lr { dst[m] } else { src[m] })
                .collect();
            let bc = intra.broadcast(b, &g[r.clone()], lr, &si, &dst[r], &mid, o);
            self.sub(c, bc)?;
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
        let (x, y, intra, inter) = levels(g, o)?;
        if y == 1 {
            return self.sub(c, inter.reduce(b, g, root, src, dst, start, o));
        }
        if x == 1 {
            return self.sub(c, intra.reduce(b, g, root, src, dst, start, o));
        }
        let (xr, lr) = (root / y, root % y);
        let len = src[0].len;
        // The node's sum, on its member with the root's local index.
        let part: Vec<Span> = (0..x).map(|node| b.tmp(g[node * y + lr], len)).collect();
        for (node, &acc) in part.iter().enumerate() {
            let r = node * y..(node + 1) * y;
            let di: Vec<Span> = r
                .clone()
                .map(|m| if m % y == lr { acc } else { dst[m] })
                .collect();
            let rd = intra.reduce(b, &g[r.clone()], lr, &src[r], &di, start, o);
            self.sub(c, rd)?;
        }
        let mid = b.frontiers();
        let ms: Vec<usize> = (0..x).map(|node| node * y + lr).collect();
        let gl: Vec<usize> = ms.iter().map(|&m| g[m]).collect();
        let dl: Vec<Span> = ms.iter().map(|&m| dst[m]).collect();
        self.sub(c, inter.reduce(b, &gl, xr, &part, &dl, &mid, o))?;
        Ok(())
    }
}

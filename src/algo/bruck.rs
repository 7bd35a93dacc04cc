//! Bruck AllGather and AllToAll: ceil(log2 N) steps, one message each, at any member count.
//! AllGather: member i keeps its blocks in scratch in rotated order (chunk i+j at slot j); at step
//! k it sends its first min(2^k, N-2^k) blocks to i-2^k and receives as many from i+2^k behind
//! them; received blocks are copied to their place as they land (the final rotation, overlapped).
//! AllToAll: slot j of member i starts as its input block i+j; at step k the slots with bit k set
//! move to member i+2^k, so slot j travels j members and ends in output block i-j, which serves as
//! the slot's home (no rotation copies); slots that are not contiguous are packed into scratch
//! before the send and unpacked after the receive.
//! Tmp: AllGather the output's size; AllToAll two areas of at most N/2 blocks (none for N <= 3).
#![forbid(unsafe_code)]

use super::rdh::{grid, Sched};
use super::{AlgoResult, Algorithm, Builder, Collectives, Deps, Options, Span};

pub struct Bruck;

/// Merge spans that follow each other in memory.
fn coalesce(spans: impl IntoIterator<Item = Span>) -> Vec<Span> {
    let mut v: Vec<Span> = Vec::new();
    for sp in spans {
        if sp.len == 0 {
            continue;
        }
        match v.last_mut() {
            Some(l) if l.buf == sp.buf && l.end() == sp.off => l.len += sp.len,
            _ => v.push(sp),
        }
    }
    v
}

impl Collectives for Bruck {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Bruck
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
        let n = g.len();
        let mut s = Sched::new(b, start);
        for i in 0..n {
            s.copy(g[i], src[i], dst[i].sub(chunks[i].0, chunks[i].1));
        }
        if n == 1 {
            return Ok(());
        }
        let total: usize = chunks.iter().map(|c| c.1).sum();
        // tpos[i][j]: where member i keeps block j (chunk i+j) in its scratch.
        let tpos: Vec<Vec<usize>> = (0..n)
            .map(|i| {
                let mut v = vec![0];
                for j in 0..n {
                    v.push(v[j] + chunks[(i + j) % n].1);
                }
                v
            })
            .collect();
        let tmp: Vec<Span> = (0..n).map(|i| s.b.tmp(g[i], total)).collect();
        // Scratch `[a, b)` of member i as (scratch offset, output offset, len) pieces.
        let place = |i: usize, a: usize, b: usize| {
            let t = &tpos[i];
            let mut v: Vec<(usize, usize, usize)> = Vec::new();
            let mut j = t.partition_point(|&x| x <= a).saturating_sub(1);
            while j < n && t[j] < b {
                let (x0, x1) = (a.max(t[j]), b.min(t[j + 1]));
                if x1 > x0 {
                    let d = chunks[(i + j) % n].0 + x0 - t[j];
                    match v.last_mut() {
                        Some(l) if l.0 + l.2 == x0 && l.1 + l.2 == d => l.2 += x1 - x0,
                        _ => v.push((x0, d, x1 - x0)),
                    }
                }
                j += 1;
            }
            v
        };
        // Steps that send more than the own block read it from scratch.
        if n >= 4 {
            for i in 0..n {
                s.copy(g[i], src[i], tmp[i].sub(0, chunks[i].1));
            }
        }
        let mut d = 1;
        while d < n {
            let cnt = d.min(n - d);
            for i in 0..n {
                let (to, from) = ((i + n - d) % n, (i + d) % n);
                let out = if cnt == 1 {
                    src[i]
                } else {
                    tmp[i].sub(0, tpos[i][cnt])
                };
                for (po, pl) in grid(0, out.len, o.slice) {
                    s.send(g[i], g[to], out.sub(po, pl));
                }
                let (lo, hi) = (tpos[i][d], tpos[i][d + cnt]);
                for (po, pl) in grid(0, hi - lo, o.slice) {
                    s.recv(g[i], g[from], tmp[i].sub(lo + po, pl));
                }
                // Into place once all their slices are in: whole blocks, grouped up to a slice.
                let mut groups = Vec::new();
                let mut ga = lo;
                for j in d..d + cnt {
                    let e = tpos[i][j + 1];
                    if o.slice > 0 && e - ga >= o.slice {
                        groups.push((ga, e));
                        ga = e;
                    }
                }
                if ga < hi {
                    groups.push((ga, hi));
                }
                for (a, e) in groups {
                    for (t_off, d_off, l) in place(i, a, e) {
                        s.copy(g[i], tmp[i].sub(t_off, l), dst[i].sub(d_off, l));
                    }
                }
            }
            d *= 2;
        }
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
        let n = g.len();
        let mut s = Sched::new(b, start);
        let blk = |sp: Span, k: usize| sp.sub(k * count, count);
        for t in 0..n {
            s.copy(g[t], blk(src[t], t), blk(dst[t], t));
        }
        if n == 1 || count == 0 {
            return Ok(());
        }
        // loc[t][j]: where position j of member t is now; its home is output block t-j.
        let mut loc: Vec<Vec<Span>> = (0..n)
            .map(|t| (0..n).map(|j| blk(src[t], (t + j) % n)).collect())
            .collect();
        let home = |t: usize, j: usize| blk(dst[t], (t + n - j) % n);
        let moving = |d: usize| -> Vec<usize> { (1..n).filter(|j| j & d != 0).collect() };
        let mut most = 0;
        let mut d = 1;
        while d < n {
            most = most.max(moving(d).len());
            d *= 2;
        }
        let (mut pack, mut unpack): (Vec<Option<Span>>, Vec<Option<Span>>) =
            (vec![None; n], vec![None; n]);
        let mut d = 1;
        while d < n {
            let js = moving(d);
            let len = js.len() * count;
            for t in 0..n {
                let (to, from) = ((t + d) % n, (t + n - d) % n);
                let runs = coalesce(js.iter().map(|&j| loc[t][j]));
                let out = if runs.len() == 1 {
                    runs[0]
                } else {
                    let sb = *pack[t].get_or_insert_with(|| s.b.tmp(g[t], most * count));
                    let mut at = 0;
                    for r in &runs {
                        s.copy(g[t], *r, sb.sub(at, r.len));
                        at += r.len;
                    }
                    sb.sub(0, len)
                };
                for (po, pl) in grid(0, len, o.slice) {
                    s.send(g[t], g[to], out.sub(po, pl));
                }
                let homes: Vec<Span> = js.iter().map(|&j| home(t, j)).collect();
                let hruns = coalesce(homes.iter().copied());
                // Receive in place unless the home is what this step sends (the receive would
                // then wait for the send: a cycle under rendezvous).
                if hruns.len() == 1 && !(runs.len() == 1 && runs[0].overlaps(&hruns[0])) {
                    for (po, pl) in grid(0, len, o.slice) {
                        s.recv(g[t], g[from], hruns[0].sub(po, pl));
                    }
                } else {
                    let rb = *unpack[t].get_or_insert_with(|| s.b.tmp(g[t], most * count));
                    for (po, pl) in grid(0, len, o.slice) {
                        s.recv(g[t], g[from], rb.sub(po, pl));
                    }
                    for (q, h) in homes.iter().enumerate() {
                        s.copy(g[t], rb.sub(q * count, count), *h);
                    }
                }
                for &j in &js {
                    loc[t][j] = home(t, j);
                }
            }
            d *= 2;
        }
        Ok(())
    }
}

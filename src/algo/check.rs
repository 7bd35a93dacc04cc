//! The symbolic checker: executes a schedule on symbols instead of numbers and proves that
//! - every message matches (k-th send a->b with the k-th receive at b from a, equal lengths),
//! - no two steps of a rank touch overlapping memory, one writing, unless ordered by
//!   dependencies (no races, whatever order the executor picks),
//! - the schedule completes under rendezvous semantics (no deadlock; eager is easier),
//! - every output element is the reduction of exactly the right contributions, each once,
//! - and every rank holds the same reduction *tree* for each element (bit-identical results).
#![forbid(unsafe_code)]
// Index loops mirror the per-rank, per-step tables they walk.
#![allow(clippy::needless_range_loop)]

use super::{Buf, Collective, Op, Schedule, Span};
use std::collections::VecDeque;

/// A symbolic element: the input index it derives from, the ranks whose contributions it sums,
/// and a hash of the reduction tree (order of combination) that produced it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sym {
    Undef,
    Val { idx: u32, mask: u64, tree: u64 },
    Bad,
}

fn mix(a: u64, b: u64) -> u64 {
    let mut x = a ^ b.rotate_left(17) ^ 0x9e37_79b9_7f4a_7c15;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

fn leaf(idx: usize, rank: usize) -> Sym {
    Sym::Val {
        idx: idx as u32,
        mask: 1u64 << rank,
        tree: mix(idx as u64 + 1, rank as u64 + 1),
    }
}

/// `a ⊕ b`: the same element from disjoint sets of ranks. Commutative (IEEE addition is), so the
/// tree hash orders its operands; associativity is not assumed.
fn combine(a: Sym, b: Sym) -> Sym {
    match (a, b) {
        (
            Sym::Val {
                idx: i,
                mask: m,
                tree: t,
            },
            Sym::Val {
                idx: j,
                mask: n,
                tree: u,
            },
        ) if i == j && m & n == 0 => Sym::Val {
            idx: i,
            mask: m | n,
            tree: mix(t.min(u), t.max(u)),
        },
        _ => Sym::Bad,
    }
}

/// One rank's buffers during a symbolic run.
pub struct Mem {
    inp: Vec<Sym>,
    out: Vec<Sym>,
    tmp: Vec<Sym>,
}

impl Mem {
    fn buf(&self, b: Buf) -> &Vec<Sym> {
        match b {
            Buf::In => &self.inp,
            Buf::Out => &self.out,
            Buf::Tmp => &self.tmp,
        }
    }

    fn read(&self, s: Span) -> Vec<Sym> {
        self.buf(s.buf)[s.off..s.end()].to_vec()
    }

    fn write(&mut self, s: Span, v: &[Sym]) {
        let b = match s.buf {
            Buf::In => &mut self.inp,
            Buf::Out => &mut self.out,
            Buf::Tmp => &mut self.tmp,
        };
        b[s.off..s.end()].copy_from_slice(v);
    }
}

fn reduce_vec(a: &[Sym], b: &[Sym]) -> Vec<Sym> {
    a.iter().zip(b).map(|(x, y)| combine(*x, *y)).collect()
}

/// Structural checks: bounds, peers, lengths, dependency order, no writes to `In`.
fn check_structure(s: &Schedule, lens: &dyn Fn(usize) -> (usize, usize)) -> Result<(), String> {
    let p = &s.problem;
    let n = p.nranks;
    if s.ranks.len() != n || s.tmp_len.len() != n {
        return Err(format!(
            "schedule has {} rank lists for {n} ranks",
            s.ranks.len()
        ));
    }
    for (r, steps) in s.ranks.iter().enumerate() {
        let bound = |sp: &Span| match sp.buf {
            Buf::In => lens(r).0,
            Buf::Out => lens(r).1,
            Buf::Tmp => s.tmp_len[r],
        };
        for (i, st) in steps.iter().enumerate() {
            let here = || format!("rank {r} step {i} {:?}", st.op);
            for d in &st.deps {
                if *d >= i {
                    return Err(format!("{}: depends on later step {d}", here()));
                }
            }
            let mut spans = st.op.reads();
            spans.extend(st.op.writes());
            for sp in &spans {
                if sp.end() > bound(sp) {
                    return Err(format!(
                        "{}: span beyond its buffer (len {})",
                        here(),
                        bound(sp)
                    ));
                }
            }
            if let Some(w) = st.op.writes() {
                if w.buf == Buf::In {
                    return Err(format!("{}: writes the input buffer", here()));
                }
            }
            if let Some(peer) = st.op.peer() {
                if peer >= n || peer == r {
                    return Err(format!("{}: bad peer", here()));
                }
            }
            match &st.op {
                Op::Copy { src, dst } if src.len != dst.len => {
                    return Err(format!("{}: length mismatch", here()))
                }
                Op::RecvReduce { src, dst, .. } if src.len != dst.len => {
                    return Err(format!("{}: length mismatch", here()))
                }
                Op::Reduce { a, b, dst } if a.len != dst.len || b.len != dst.len => {
                    return Err(format!("{}: length mismatch", here()))
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Every pair of steps of a rank that touch overlapping memory, one writing, must be ordered.
fn check_races(s: &Schedule) -> Result<(), String> {
    for (r, steps) in s.ranks.iter().enumerate() {
        let n = steps.len();
        let words = n.div_ceil(64);
        // reach[i] = the set of steps that finish before step i starts.
        let mut reach = vec![0u64; n * words];
        for i in 0..n {
            for &d in &steps[i].deps {
                let (lo, hi) = reach.split_at_mut(i * words);
                let src = &lo[d * words..(d + 1) * words];
                let dst = &mut hi[..words];
                for w in 0..words {
                    dst[w] |= src[w];
                }
                dst[d / 64] |= 1 << (d % 64);
            }
        }
        let ordered = |a: usize, b: usize| {
            let (a, b) = if a < b { (a, b) } else { (b, a) };
            reach[b * words + a / 64] & (1 << (a % 64)) != 0
        };
        // Accesses sorted by (buffer, offset), swept for overlaps.
        let mut acc: Vec<(Span, usize, bool)> = Vec::new();
        for (i, st) in steps.iter().enumerate() {
            for sp in st.op.reads() {
                if sp.len > 0 {
                    acc.push((sp, i, false));
                }
            }
            if let Some(sp) = st.op.writes() {
                if sp.len > 0 {
                    acc.push((sp, i, true));
                }
            }
        }
        acc.sort_by_key(|(sp, i, _)| (sp.buf, sp.off, *i));
        let mut active: Vec<(Span, usize, bool)> = Vec::new();
        for a in acc {
            active.retain(|(sp, _, _)| sp.buf == a.0.buf && sp.end() > a.0.off);
            for b in &active {
                if (a.2 || b.2) && a.1 != b.1 && !ordered(a.1, b.1) {
                    return Err(format!(
                        "rank {r}: steps {} {:?} and {} {:?} touch {:?} and {:?} concurrently (one writes) without a dependency",
                        b.1, steps[b.1].op, a.1, steps[a.1].op, b.0, a.0
                    ));
                }
            }
            active.push(a);
        }
    }
    Ok(())
}

/// Execute symbolically with rendezvous matching; returns each rank's memory.
fn execute(s: &Schedule, lens: &dyn Fn(usize) -> (usize, usize)) -> Result<Vec<Mem>, String> {
    let p = &s.problem;
    let n = p.nranks;
    assert!(n <= 64, "the checker handles up to 64 ranks");
    let mut mem: Vec<Mem> = (0..n)
        .map(|r| Mem {
            inp: (0..lens(r).0)
                .map(|i| leaf(input_index(p, r, i), r))
                .collect(),
            out: vec![Sym::Undef; lens(r).1],
            tmp: vec![Sym::Undef; s.tmp_len[r]],
        })
        .collect();
    // Message matching: position k among a's sends to b / b's receives from a.
    let mut key = vec![Vec::new(); n];
    let mut sends = vec![vec![Vec::new(); n]; n];
    let mut recvs = vec![vec![Vec::new(); n]; n];
    for (r, steps) in s.ranks.iter().enumerate() {
        key[r] = vec![0usize; steps.len()];
        for (i, st) in steps.iter().enumerate() {
            match &st.op {
                Op::Send { peer, .. } => {
                    key[r][i] = sends[r][*peer].len();
                    sends[r][*peer].push(i);
                }
                Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => {
                    key[r][i] = recvs[r][*peer].len();
                    recvs[r][*peer].push(i);
                }
                _ => {}
            }
        }
    }
    for a in 0..n {
        for b in 0..n {
            let (sa, rb) = (&sends[a][b], &recvs[b][a]);
            if sa.len() != rb.len() {
                return Err(format!(
                    "rank {a} sends {} messages to rank {b}, which receives {}",
                    sa.len(),
                    rb.len()
                ));
            }
            for (k, (&i, &j)) in sa.iter().zip(rb).enumerate() {
                let sl = s.ranks[a][i].op.reads()[0].len;
                let rl = s.ranks[b][j].op.writes().map_or(0, |w| w.len);
                if sl != rl {
                    return Err(format!(
                        "message {k} from rank {a} to {b}: {sl} elements sent, {rl} expected"
                    ));
                }
            }
        }
    }
    let mut pending: Vec<Vec<usize>> = s
        .ranks
        .iter()
        .map(|st| st.iter().map(|x| x.deps.len()).collect())
        .collect();
    let mut dependents: Vec<Vec<Vec<usize>>> = s
        .ranks
        .iter()
        .map(|st| vec![Vec::new(); st.len()])
        .collect();
    for (r, steps) in s.ranks.iter().enumerate() {
        for (i, st) in steps.iter().enumerate() {
            for &d in &st.deps {
                dependents[r][d].push(i);
            }
        }
    }
    let mut posted: Vec<Vec<bool>> = s.ranks.iter().map(|st| vec![false; st.len()]).collect();
    let mut done: Vec<Vec<bool>> = posted.clone();
    let mut ready: VecDeque<(usize, usize)> = VecDeque::new();
    for r in 0..n {
        for i in 0..s.ranks[r].len() {
            if pending[r][i] == 0 {
                ready.push_back((r, i));
            }
        }
    }
    let mut finished = 0usize;
    let total: usize = s.ranks.iter().map(Vec::len).sum();
    let mut complete =
        |r: usize, i: usize, ready: &mut VecDeque<(usize, usize)>, done: &mut Vec<Vec<bool>>| {
            done[r][i] = true;
            for &d in &dependents[r][i] {
                pending[r][d] -= 1;
                if pending[r][d] == 0 {
                    ready.push_back((r, d));
                }
            }
        };
    while let Some((r, i)) = ready.pop_front() {
        let op = s.ranks[r][i].op.clone();
        match op {
            Op::Nop => {}
            Op::Copy { src, dst } => {
                let v = mem[r].read(src);
                mem[r].write(dst, &v);
            }
            Op::Reduce { a, b, dst } => {
                let v = reduce_vec(&mem[r].read(a), &mem[r].read(b));
                mem[r].write(dst, &v);
            }
            Op::Send { peer, .. } | Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => {
                posted[r][i] = true;
                let k = key[r][i];
                let (sr, si, rr, ri) = if matches!(op, Op::Send { .. }) {
                    (r, i, peer, recvs[peer][r][k])
                } else {
                    (peer, sends[peer][r][k], r, i)
                };
                if !(posted[sr][si] && posted[rr][ri]) {
                    continue; // the partner will complete the pair
                }
                let src = s.ranks[sr][si].op.reads()[0];
                let msg = mem[sr].read(src);
                match s.ranks[rr][ri].op {
                    Op::Recv { dst, .. } => mem[rr].write(dst, &msg),
                    Op::RecvReduce { src, dst, .. } => {
                        let v = reduce_vec(&mem[rr].read(src), &msg);
                        mem[rr].write(dst, &v);
                    }
                    _ => unreachable!("matched a non-receive"),
                }
                complete(sr, si, &mut ready, &mut done);
                complete(rr, ri, &mut ready, &mut done);
                finished += 2;
                continue;
            }
        }
        complete(r, i, &mut ready, &mut done);
        finished += 1;
    }
    if finished != total {
        let stuck: Vec<String> = (0..n)
            .flat_map(|r| {
                let done = &done;
                s.ranks[r]
                    .iter()
                    .enumerate()
                    .filter(move |(i, _)| !done[r][*i])
                    .take(3)
                    .map(move |(i, st)| format!("rank {r} step {i} {:?}", st.op))
            })
            .take(8)
            .collect();
        return Err(format!(
            "deadlock: {} of {total} steps never ran, e.g. {}",
            total - finished,
            stuck.join("; ")
        ));
    }
    Ok(mem)
}

/// The global index of rank r's input element i (windows shift it).
fn input_index(p: &super::Problem, r: usize, i: usize) -> usize {
    match (p.window, p.coll) {
        (Some(_), Collective::AllGather) => p.slice_start(r) + i,
        (Some((off, _)), Collective::ReduceScatter) => off + i,
        _ => i,
    }
}

fn expected(s: &Schedule, r: usize, j: usize) -> Option<(usize, u64)> {
    let p = &s.problem;
    let c = p.count;
    let all = if p.nranks == 64 {
        u64::MAX
    } else {
        (1u64 << p.nranks) - 1
    };
    if let Some((off, _)) = p.window {
        return Some(match p.coll {
            // Output j is global element off + j, from the rank whose slice holds it.
            Collective::AllGather => {
                let g = off + j;
                (g % c.max(1), 1 << (g / c.max(1)))
            }
            // Rank r's output j is global element (start of its windowed slice) + j.
            _ => (r * c + p.slice_start(r) + j, all),
        });
    }
    match p.coll {
        Collective::AllReduce => Some((j, all)),
        Collective::AllGather => Some((j % c, 1 << (j / c))),
        Collective::ReduceScatter => Some((r * c + j, all)),
        Collective::Broadcast => Some((j, 1 << p.root)),
        Collective::Reduce => (r == p.root).then_some((j, all)),
        Collective::AllToAll => Some((r * c + j % c, 1 << (j / c))),
    }
}

/// Check a schedule; the error says what is wrong and where.
pub fn check(s: &Schedule) -> Result<(), String> {
    let p = &s.problem;
    // Spans are bounded by the longest buffer of any rank (windows make them differ).
    check_structure(s, &|_| (p.in_len(), p.out_len()))?;
    let mem = verify(s, &|r| (p.in_len_of(r), p.out_len_of(r)), &|r, j| {
        expected(s, r, j)
    })?;
    check_trees(s, &mem)
}

/// `check` of a schedule whose buffer lengths per rank (input, output) and expected outputs
/// (rank, output element) -> (input element, mask of the ranks reduced into it) the caller
/// gives (the problem cannot tell them for `varied` collectives); returns each rank's memory.
pub fn check_with(
    s: &Schedule,
    lens: &dyn Fn(usize) -> (usize, usize),
    expected: &dyn Fn(usize, usize) -> Option<(usize, u64)>,
) -> Result<Vec<Mem>, String> {
    check_structure(s, lens)?;
    verify(s, lens, expected)
}

/// Races, the symbolic run and the outputs (`check_with` after the structure).
fn verify(
    s: &Schedule,
    lens: &dyn Fn(usize) -> (usize, usize),
    expected: &dyn Fn(usize, usize) -> Option<(usize, u64)>,
) -> Result<Vec<Mem>, String> {
    check_races(s)?;
    let mem = execute(s, lens)?;
    let p = &s.problem;
    for (r, m) in mem.iter().enumerate() {
        for j in 0..lens(r).1 {
            let Some((idx, mask)) = expected(r, j) else {
                continue;
            };
            match m.out[j] {
                Sym::Val { idx: i, mask: k, .. } if i as usize == idx && k == mask => {}
                got => {
                    return Err(format!(
                        "{:?} n={} count={}: rank {r} output[{j}] is {got:?}, expected element {idx} from ranks {mask:#x}",
                        p.coll, p.nranks, p.count
                    ))
                }
            }
        }
    }
    Ok(mem)
}

/// Bit-identical: where several ranks hold the same element, the reduction trees agree.
fn check_trees(s: &Schedule, mem: &[Mem]) -> Result<(), String> {
    let p = &s.problem;
    if matches!(p.coll, Collective::AllReduce) {
        for j in 0..p.out_len() {
            let t0 = mem[0].out[j];
            for (r, m) in mem.iter().enumerate().skip(1) {
                if m.out[j] != t0 {
                    return Err(format!(
                        "AllReduce n={} count={}: element {j} was reduced in a different order on rank {r} than on rank 0",
                        p.nranks, p.count
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{Algorithm, Builder, Problem};

    fn two_rank_allreduce(racy: bool) -> Schedule {
        // Each rank sends its input and reduces the peer's into its output.
        let mut b = Builder::new(2);
        for r in 0..2 {
            let inp = Span::new(Buf::In, 0, 4);
            let out = Span::new(Buf::Out, 0, 4);
            let s = b.send(r, 1 - r, inp, &[]);
            let c = b.copy(r, inp, out, &[]).unwrap();
            let deps = if racy { vec![] } else { vec![c] };
            b.recv_reduce(r, 1 - r, out, out, &deps);
            let _ = s;
        }
        b.finish(Problem::new(Collective::AllReduce, 2, 4), Algorithm::Mesh)
    }

    #[test]
    fn accepts_a_correct_schedule_and_finds_a_race() {
        check(&two_rank_allreduce(false)).unwrap();
        let e = check(&two_rank_allreduce(true)).unwrap_err();
        assert!(e.contains("concurrently"), "{e}");
    }

    #[test]
    fn finds_deadlock_wrong_data_and_unmatched_messages() {
        // Both ranks receive before sending, with the send waiting for the receive.
        let mut b = Builder::new(2);
        for r in 0..2 {
            let rv = b.recv(r, 1 - r, Span::new(Buf::Out, 0, 1), &[]);
            b.send(r, 1 - r, Span::new(Buf::In, 0, 1), &[rv]);
        }
        let e = check(&b.finish(Problem::new(Collective::AllGather, 2, 1), Algorithm::Mesh))
            .unwrap_err();
        assert!(e.contains("deadlock"), "{e}");

        let mut b = Builder::new(2);
        b.send(0, 1, Span::new(Buf::In, 0, 1), &[]);
        let e = check(&b.finish(Problem::new(Collective::Broadcast, 2, 1), Algorithm::Mesh))
            .unwrap_err();
        assert!(e.contains("receives 0"), "{e}");

        // A "broadcast" that forgets rank 0's own output.
        let mut b = Builder::new(2);
        b.send(0, 1, Span::new(Buf::In, 0, 1), &[]);
        b.recv(1, 0, Span::new(Buf::Out, 0, 1), &[]);
        let e = check(&b.finish(Problem::new(Collective::Broadcast, 2, 1), Algorithm::Mesh))
            .unwrap_err();
        assert!(e.contains("rank 0 output[0]"), "{e}");
    }

    #[test]
    fn double_counting_is_caught() {
        let mut b = Builder::new(1);
        let inp = Span::new(Buf::In, 0, 2);
        let out = Span::new(Buf::Out, 0, 2);
        b.reduce(0, inp, inp, out, &[]);
        let e = check(&b.finish(Problem::new(Collective::AllReduce, 1, 2), Algorithm::Mesh))
            .unwrap_err();
        assert!(e.contains("Bad"), "{e}");
    }
}

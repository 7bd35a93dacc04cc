//! The symbolic checker: executes a schedule on symbols instead of numbers and proves that
//! - every message matches (k-th send a->b with the k-th receive at b from a, equal lengths),
//! - no two steps of a rank touch overlapping memory, one writing, unless ordered by
//!   dependencies (no races, whatever order the executor picks),
//! - the schedule completes under rendezvous semantics (no deadlock; eager is easier),
//! - every output element is the reduction of exactly the right contributions, each once,
//! - and every rank holds the same reduction *tree* for each element (bit-identical results).
//!
//! Exact at any rank count: contributions are interned sets of ranks (`sets`), messages are
//! matched from sorted lists (no table per pair of ranks), and the input buffers are not stored.
//! What grows with the ranks is the memory of the outputs and scratch (one 16-byte symbol per
//! element) and `check_races`, quadratic in one rank's steps.
#![forbid(unsafe_code)]
// Index loops mirror the per-rank, per-step tables they walk.
#![allow(clippy::needless_range_loop)]

mod sets;

use super::{Buf, Collective, Op, Schedule, Span};
pub use sets::Ranks;
use sets::{SetId, Sets};
use std::collections::VecDeque;

/// A symbolic element: the input index it derives from, the set of ranks whose contributions it
/// sums (interned: see `sets`), and a hash of the reduction tree (order of combination) that
/// produced it. `set` is `UNDEF` for memory never written and `BAD` for a wrong combination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sym {
    idx: u32,
    set: SetId,
    tree: u64,
}

const UNDEF: SetId = SetId::MAX;
const BAD: SetId = SetId::MAX - 1;

impl Sym {
    const UNDEF: Sym = Sym {
        idx: 0,
        set: UNDEF,
        tree: 0,
    };
    const BAD: Sym = Sym {
        idx: 0,
        set: BAD,
        tree: 0,
    };

    fn show(&self, sets: &Sets) -> String {
        match self.set {
            UNDEF => "undefined".into(),
            BAD => "Bad (a combination of different elements or overlapping ranks)".into(),
            s => format!("element {} from ranks {}", self.idx, sets.describe(s)),
        }
    }
}

fn mix(a: u64, b: u64) -> u64 {
    let mut x = a ^ b.rotate_left(17) ^ 0x9e37_79b9_7f4a_7c15;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

fn leaf(idx: usize, rank: usize, one: SetId) -> Sym {
    Sym {
        idx: u32::try_from(idx).expect("element index below 2^32"),
        set: one,
        tree: mix(idx as u64 + 1, rank as u64 + 1),
    }
}

/// `a ⊕ b`: the same element from disjoint sets of ranks. Commutative (IEEE addition is), so the
/// tree hash orders its operands; associativity is not assumed.
fn combine(a: Sym, b: Sym, sets: &mut Sets) -> Sym {
    if a.set >= BAD || b.set >= BAD || a.idx != b.idx {
        return Sym::BAD;
    }
    match sets.union(a.set, b.set) {
        Some(set) => Sym {
            idx: a.idx,
            set,
            tree: mix(a.tree.min(b.tree), a.tree.max(b.tree)),
        },
        None => Sym::BAD,
    }
}

/// One rank's buffers during a symbolic run. The input is never written, so it is not stored:
/// its element i is rank r's leaf of `input_index(i)`.
struct Mem {
    rank: usize,
    one: SetId,
    out: Vec<Sym>,
    tmp: Vec<Sym>,
}

impl Mem {
    /// Replace `v`'s contents with the span's symbols.
    fn read(&self, p: &super::Problem, s: Span, v: &mut Vec<Sym>) {
        v.clear();
        match s.buf {
            Buf::In => v.extend(
                (s.off..s.end()).map(|i| leaf(input_index(p, self.rank, i), self.rank, self.one)),
            ),
            Buf::Out => v.extend_from_slice(&self.out[s.off..s.end()]),
            Buf::Tmp => v.extend_from_slice(&self.tmp[s.off..s.end()]),
        }
    }

    /// The span's symbols: a slice of the memory, or (input) generated into `v`.
    fn view<'a>(&'a self, p: &super::Problem, s: Span, v: &'a mut Vec<Sym>) -> &'a [Sym] {
        match s.buf {
            Buf::In => {
                self.read(p, s, v);
                v
            }
            Buf::Out => &self.out[s.off..s.end()],
            Buf::Tmp => &self.tmp[s.off..s.end()],
        }
    }

    /// The span's memory, to write (never the input: check_structure refuses writes to it).
    fn slot(&mut self, s: Span) -> &mut [Sym] {
        let b = match s.buf {
            Buf::In => unreachable!("check_structure refuses writes to In"),
            Buf::Out => &mut self.out,
            Buf::Tmp => &mut self.tmp,
        };
        &mut b[s.off..s.end()]
    }

    fn write(&mut self, s: Span, v: &[Sym]) {
        self.slot(s).copy_from_slice(v);
    }
}

/// `a[i] = a[i] ⊕ b[i]`.
fn reduce_into(a: &mut [Sym], b: &[Sym], sets: &mut Sets) {
    for (x, y) in a.iter_mut().zip(b) {
        *x = combine(*x, *y, sets);
    }
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

/// The partner of every send and receive: (rank, step) of the k-th receive at b from a for the
/// k-th send from a to b, and back. Sparse: sorted lists of messages, not an n x n table.
type Partners = Vec<Vec<(u32, u32)>>;

fn match_messages(s: &Schedule) -> Result<Partners, String> {
    let n = s.problem.nranks;
    // (from, to, k, step of the side that holds it).
    let mut sends: Vec<(u32, u32, u32, u32)> = Vec::new();
    let mut recvs: Vec<(u32, u32, u32, u32)> = Vec::new();
    let (mut ns, mut nr) = (vec![0u32; n], vec![0u32; n]);
    let mut touched: Vec<usize> = Vec::new();
    for (r, steps) in s.ranks.iter().enumerate() {
        for (i, st) in steps.iter().enumerate() {
            let Some(peer) = st.op.peer() else { continue };
            touched.push(peer);
            let (r32, p32, i32) = (r as u32, peer as u32, i as u32);
            if st.op.is_recv() {
                recvs.push((p32, r32, nr[peer], i32));
                nr[peer] += 1;
            } else {
                sends.push((r32, p32, ns[peer], i32));
                ns[peer] += 1;
            }
        }
        for &p in &touched {
            ns[p] = 0;
            nr[p] = 0;
        }
        touched.clear();
    }
    sends.sort_unstable();
    recvs.sort_unstable();
    let mut partner: Partners = s.ranks.iter().map(|st| vec![(0, 0); st.len()]).collect();
    let pair = |v: &[(u32, u32, u32, u32)], at: usize| v.get(at).map(|m| (m.0, m.1));
    let run = |v: &[(u32, u32, u32, u32)], at: usize| {
        let key = pair(v, at);
        (at..v.len()).take_while(|&j| pair(v, j) == key).count()
    };
    let (mut i, mut j) = (0, 0);
    while i < sends.len() || j < recvs.len() {
        let (ks, kr) = (pair(&sends, i), pair(&recvs, j));
        // The smaller (from, to) pair; a missing side has no messages.
        let key = match (ks, kr) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (None, None) => unreachable!("loop condition"),
        };
        let cs = if ks == Some(key) { run(&sends, i) } else { 0 };
        let cr = if kr == Some(key) { run(&recvs, j) } else { 0 };
        let (a, b) = (key.0 as usize, key.1 as usize);
        if cs != cr {
            return Err(format!(
                "rank {a} sends {cs} messages to rank {b}, which receives {cr}"
            ));
        }
        for k in 0..cs {
            let (si, ri) = (sends[i + k].3, recvs[j + k].3);
            let sl = s.ranks[a][si as usize].op.reads()[0].len;
            let rl = s.ranks[b][ri as usize].op.writes().map_or(0, |w| w.len);
            if sl != rl {
                return Err(format!(
                    "message {k} from rank {a} to {b}: {sl} elements sent, {rl} expected"
                ));
            }
            partner[a][si as usize] = (b as u32, ri);
            partner[b][ri as usize] = (a as u32, si);
        }
        i += cs;
        j += cr;
    }
    Ok(partner)
}

/// Execute symbolically with rendezvous matching; returns each rank's memory.
fn execute(
    s: &Schedule,
    lens: &dyn Fn(usize) -> (usize, usize),
    sets: &mut Sets,
) -> Result<Vec<Mem>, String> {
    let p = &s.problem;
    let n = p.nranks;
    let mut mem: Vec<Mem> = (0..n)
        .map(|r| Mem {
            rank: r,
            one: sets.one(r),
            out: vec![Sym::UNDEF; lens(r).1],
            tmp: vec![Sym::UNDEF; s.tmp_len[r]],
        })
        .collect();
    let partner = match_messages(s)?;
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
    // Scratch for the symbols a step reads, reused.
    let (mut va, mut vb) = (Vec::new(), Vec::new());
    while let Some((r, i)) = ready.pop_front() {
        let op = &s.ranks[r][i].op;
        match *op {
            Op::Nop => {}
            Op::Copy { src, dst } => {
                mem[r].read(p, src, &mut va);
                mem[r].write(dst, &va);
            }
            Op::Reduce { a, b, dst } => {
                mem[r].read(p, a, &mut va);
                mem[r].read(p, b, &mut vb);
                reduce_into(&mut va, &vb, sets);
                mem[r].write(dst, &va);
            }
            Op::Send { .. } | Op::Recv { .. } | Op::RecvReduce { .. } => {
                posted[r][i] = true;
                let (q, j) = partner[r][i];
                let (q, j) = (q as usize, j as usize);
                if !posted[q][j] {
                    continue; // the partner will complete the pair
                }
                let ((sr, si), (rr, ri)) = if op.is_recv() {
                    ((q, j), (r, i))
                } else {
                    ((r, i), (q, j))
                };
                let src = s.ranks[sr][si].op.reads()[0];
                // The message straight from the sender's memory (check_structure: sr != rr).
                let (from, to) = if sr < rr {
                    let (lo, hi) = mem.split_at_mut(rr);
                    (&lo[sr], &mut hi[0])
                } else {
                    let (lo, hi) = mem.split_at_mut(sr);
                    (&hi[0], &mut lo[rr])
                };
                let msg = from.view(p, src, &mut vb);
                match s.ranks[rr][ri].op {
                    Op::Recv { dst, .. } => to.write(dst, msg),
                    Op::RecvReduce { src, dst, .. } if src == dst => {
                        reduce_into(to.slot(dst), msg, sets);
                    }
                    Op::RecvReduce { src, dst, .. } => {
                        to.read(p, src, &mut va);
                        reduce_into(&mut va, msg, sets);
                        to.write(dst, &va);
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

fn expected(s: &Schedule, r: usize, j: usize) -> Option<(usize, Ranks)> {
    let p = &s.problem;
    let c = p.count;
    if let Some((off, _)) = p.window {
        return Some(match p.coll {
            // Output j is global element off + j, from the rank whose slice holds it.
            Collective::AllGather => {
                let g = off + j;
                (g % c.max(1), Ranks::One(g / c.max(1)))
            }
            // Rank r's output j is global element (start of its windowed slice) + j.
            _ => (r * c + p.slice_start(r) + j, Ranks::All),
        });
    }
    match p.coll {
        Collective::AllReduce => Some((j, Ranks::All)),
        Collective::AllGather => Some((j % c, Ranks::One(j / c))),
        Collective::ReduceScatter => Some((r * c + j, Ranks::All)),
        Collective::Broadcast => Some((j, Ranks::One(p.root))),
        Collective::Reduce => (r == p.root).then_some((j, Ranks::All)),
        Collective::AllToAll => Some((r * c + j % c, Ranks::One(j / c))),
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
/// (rank, output element) -> (input element, the ranks reduced into it) the caller gives (the
/// problem cannot tell them for `varied` collectives).
pub fn check_with(
    s: &Schedule,
    lens: &dyn Fn(usize) -> (usize, usize),
    expected: &dyn Fn(usize, usize) -> Option<(usize, Ranks)>,
) -> Result<(), String> {
    check_structure(s, lens)?;
    verify(s, lens, expected).map(|_| ())
}

/// Races, the symbolic run and the outputs (`check_with` after the structure).
fn verify(
    s: &Schedule,
    lens: &dyn Fn(usize) -> (usize, usize),
    expected: &dyn Fn(usize, usize) -> Option<(usize, Ranks)>,
) -> Result<Vec<Mem>, String> {
    check_races(s)?;
    let mut sets = Sets::new(s.problem.nranks);
    let mem = execute(s, lens, &mut sets)?;
    let p = &s.problem;
    for (r, m) in mem.iter().enumerate() {
        for j in 0..lens(r).1 {
            let Some((idx, want)) = expected(r, j) else {
                continue;
            };
            let set = sets.of(want);
            let got = m.out[j];
            if got.set != set || got.idx as usize != idx {
                return Err(format!(
                    "{:?} n={} count={}: rank {r} output[{j}] is {}, expected element {idx} from {}",
                    p.coll,
                    p.nranks,
                    p.count,
                    got.show(&sets),
                    match want {
                        Ranks::One(q) => format!("rank {q}"),
                        Ranks::All => "every rank".into(),
                    }
                ));
            }
        }
    }
    Ok(mem)
}

/// Bit-identical: where several ranks hold the same element, the reduction trees agree.
fn check_trees(s: &Schedule, mem: &[Mem]) -> Result<(), String> {
    let p = &s.problem;
    if matches!(p.coll, Collective::AllReduce) {
        for (r, m) in mem.iter().enumerate().skip(1) {
            if let Some(j) = (0..p.out_len()).find(|&j| m.out[j] != mem[0].out[j]) {
                return Err(format!(
                    "AllReduce n={} count={}: element {j} was reduced in a different order on rank {r} than on rank 0",
                    p.nranks, p.count
                ));
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

//! What an in-place call needs when its caller waives the restore of its input on failure:
//! which steps read input that another step may already have written over (a hazard), and
//! so must read a copy of it taken before the call starts. Every other step reads and writes
//! the caller's buffer itself.
//!
//! A read step R of input bytes that some step W writes (in place, the input lies inside the
//! output, `shift` bytes from its start) is safe when W runs only after R has completed: W
//! depends on R, directly or through other steps of the rank (a send completes when the
//! transport is done with its buffer, a receive is posted only when its dependencies are
//! done). R and W may be one step when it reads and writes the same bytes element by element
//! (a reduction into its own operand). A copy of the input onto itself is skipped by the
//! executor, so it writes nothing; it still reads, so a hazard on it makes it a real copy
//! from the backup.

use crate::algo::{Buf, Op, Schedule, Span, Step};

/// Steps (of all ranks) beyond which the analysis is not run: every In-reading step then
/// reads the backup, which is always correct (the reachability checks are quadratic in the
/// worst case).
const MAX_STEPS: usize = 1 << 16;

/// One in-place layout's needs: the byte range of In to copy aside (empty when none) and,
/// per step, whether it reads In from that copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InPlace {
    pub lo: usize,
    pub hi: usize,
    pub from_backup: Vec<bool>,
    /// The step graph with the dependencies that make some sends safe, where there are any.
    pub graph: Option<Graph>,
}

impl InPlace {
    /// Whether a copy is needed at all.
    pub fn needs_backup(&self) -> bool {
        self.lo < self.hi
    }

    /// Whether the call runs differently from the plan at all.
    pub fn changes_anything(&self) -> bool {
        self.needs_backup() || self.graph.is_some()
    }
}

/// `[off, end)` in bytes of span `s` in the output's coordinates: In spans moved by `shift`.
fn at(s: &Span, elem: usize, shift: isize) -> (isize, isize) {
    let (a, b) = ((s.off * elem) as isize, (s.end() * elem) as isize);
    match s.buf {
        Buf::In => (a + shift, b + shift),
        _ => (a, b),
    }
}

fn overlap(x: (isize, isize), y: (isize, isize)) -> bool {
    x.0 < x.1 && y.0 < y.1 && x.0 < y.1 && y.0 < x.1
}

/// The bytes step `op` writes over the output, None where it writes none there (a copy of
/// the input onto itself is skipped by the executor, so it writes nothing).
fn write_of(op: &Op, elem: usize, shift: isize) -> Option<(isize, isize)> {
    let w = op.writes().filter(|w| w.buf == Buf::Out && w.len > 0)?;
    if let Op::Copy { src, .. } = op {
        if src.buf == Buf::In && at(src, elem, shift) == at(&w, elem, 0) {
            return None;
        }
    }
    Some(at(&w, elem, 0))
}

/// Whether step `i` may read In span `r` while writing `w` itself: only element by element
/// on the same bytes (a reduction into its operand, a receive-and-reduce onto its source).
fn own_write_ok(op: &Op, r: (isize, isize), w: (isize, isize)) -> bool {
    r == w && matches!(op, Op::Reduce { .. } | Op::RecvReduce { .. })
}

/// Extra dependencies of an in-place call: its own copy of the plan's step graph with them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Graph {
    pub pending: Vec<u32>,
    pub dependents: Vec<Vec<u32>>,
    pub ready: Vec<usize>,
}

/// Every rank's steps as one graph: a step's successors are its rank's steps that depend on
/// it and, for a send, the receive that matches it (the k-th send from a to b is the k-th
/// receive from a on b). A step reachable from a receive starts only after that message was
/// received whole, so after its sender's transport read the send's buffer.
struct Global {
    base: Vec<usize>,
    next: Vec<Vec<usize>>,
    /// Per send step (global index), its matching receive (global index).
    matched: Vec<Option<usize>>,
}

impl Global {
    fn new(schedule: &Schedule) -> Global {
        let nr = schedule.ranks.len();
        let mut base = Vec::with_capacity(nr + 1);
        let mut total = 0;
        for st in &schedule.ranks {
            base.push(total);
            total += st.len();
        }
        base.push(total);
        let mut next = vec![Vec::new(); total];
        let mut matched = vec![None; total];
        // recvs[b][a]: rank b's receives from a, in program order.
        let mut recvs = vec![vec![Vec::new(); nr]; nr];
        for (b, st) in schedule.ranks.iter().enumerate() {
            for (i, s) in st.iter().enumerate() {
                for &d in &s.deps {
                    next[base[b] + d].push(base[b] + i);
                }
                if let Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } = s.op {
                    recvs[b][peer].push(base[b] + i);
                }
            }
        }
        for (a, st) in schedule.ranks.iter().enumerate() {
            let mut k = vec![0usize; nr];
            for (i, s) in st.iter().enumerate() {
                if let Op::Send { peer, .. } = s.op {
                    if let Some(&v) = recvs[peer][a].get(k[peer]) {
                        matched[base[a] + i] = Some(v);
                        next[base[a] + i].push(v);
                    }
                    k[peer] += 1;
                }
            }
        }
        Global {
            base,
            next,
            matched,
        }
    }

    /// Whether every one of rank `rank`'s steps `ws` starts only after the receive matching
    /// its send step `i` is complete.
    fn after_delivery(&self, rank: usize, i: usize, ws: &[usize]) -> bool {
        let Some(v) = self.matched[self.base[rank] + i] else {
            return false;
        };
        let mut seen = vec![false; self.next.len()];
        let mut stack = vec![v];
        while let Some(k) = stack.pop() {
            for &d in &self.next[k] {
                if !seen[d] {
                    seen[d] = true;
                    stack.push(d);
                }
            }
        }
        ws.iter().all(|&j| seen[self.base[rank] + j])
    }
}

/// The needs of rank `rank` of `schedule` run in place with In `shift` bytes after the
/// output's start (negative: before it), for elements of `elem` bytes.
///
/// A send whose input bytes a later write overwrites, without that write depending on the
/// send, is safe if the write is causally after the send's message was delivered (the bytes
/// it writes derive from what the peer received, as in a ring's AllGather phase): the call
/// then adds the dependency send -> write, which costs no wait since the send's completion
/// has come by then, and copies nothing. Other hazards read a backup.
pub fn analyse(schedule: &Schedule, rank: usize, elem: usize, shift: isize) -> InPlace {
    let steps = &schedule.ranks[rank];
    let n = steps.len();
    let reads_in = |s: &Step| -> Vec<(isize, isize)> {
        s.op.reads()
            .iter()
            .filter(|r| r.buf == Buf::In && r.len > 0)
            .map(|r| at(r, elem, shift))
            .collect()
    };
    let mut hazard = vec![false; n];
    let mut extra: Vec<(usize, usize)> = Vec::new();
    let mut dependents: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (i, s) in steps.iter().enumerate() {
        for &d in &s.deps {
            dependents[d].push(i as u32);
        }
    }
    let total: usize = schedule.ranks.iter().map(Vec::len).sum();
    if total > MAX_STEPS {
        for (i, s) in steps.iter().enumerate() {
            hazard[i] = !reads_in(s).is_empty();
        }
    } else {
        let mut writes: Vec<(isize, isize, usize)> = steps
            .iter()
            .enumerate()
            .filter_map(|(i, s)| write_of(&s.op, elem, shift).map(|(a, b)| (a, b, i)))
            .collect();
        writes.sort_unstable();
        let longest = writes.iter().map(|w| w.1 - w.0).max().unwrap_or(0);
        let mut global: Option<Global> = None;
        let mut seen = vec![false; n];
        for (i, s) in steps.iter().enumerate() {
            let reads = reads_in(s);
            // Writes that overlap a read.
            let mut candidates = Vec::new();
            for &r in &reads {
                // Writes start at most `longest` bytes before a byte they cover.
                let from = writes.partition_point(|w| w.0 + longest <= r.0);
                for &(a, b, j) in &writes[from..] {
                    if a >= r.1 {
                        break;
                    }
                    if !overlap(r, (a, b)) || (j == i && own_write_ok(&s.op, r, (a, b))) {
                        continue;
                    }
                    candidates.push(j);
                }
            }
            if candidates.is_empty() {
                continue;
            }
            // Those that do not surely run after the read: not its descendants.
            seen.iter_mut().for_each(|v| *v = false);
            let mut stack = vec![i];
            while let Some(k) = stack.pop() {
                for &d in &dependents[k] {
                    let d = d as usize;
                    if !seen[d] {
                        seen[d] = true;
                        stack.push(d);
                    }
                }
            }
            candidates.retain(|&j| !seen[j]);
            if candidates.is_empty() {
                continue;
            }
            if matches!(s.op, Op::Send { .. }) {
                let g = global.get_or_insert_with(|| Global::new(schedule));
                if g.after_delivery(rank, i, &candidates) {
                    candidates.sort_unstable();
                    candidates.dedup();
                    extra.extend(candidates.iter().map(|&j| (i, j)));
                    continue;
                }
            }
            hazard[i] = true;
        }
    }
    let (mut lo, mut hi) = (usize::MAX, 0);
    for (i, s) in steps.iter().enumerate() {
        if hazard[i] {
            for r in s.op.reads().iter().filter(|r| r.buf == Buf::In) {
                lo = lo.min(r.off * elem);
                hi = hi.max(r.end() * elem);
            }
        }
    }
    if lo >= hi {
        (lo, hi) = (0, 0);
    }
    let graph = (!extra.is_empty()).then(|| {
        let mut pending: Vec<u32> = steps.iter().map(|s| s.deps.len() as u32).collect();
        for &(r, w) in &extra {
            dependents[r].push(w as u32);
            pending[w] += 1;
        }
        let ready = (0..n).filter(|&i| pending[i] == 0).collect();
        Graph {
            pending,
            dependents,
            ready,
        }
    });
    InPlace {
        lo,
        hi,
        from_backup: hazard,
        graph,
    }
}

#[cfg(test)]
#[path = "inplace_tests.rs"]
mod tests;

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

use crate::algo::{Buf, Op, Span, Step};

/// Steps beyond which the analysis is not run: every In-reading step then reads the backup,
/// which is always correct (the reachability check is quadratic in the worst case).
const MAX_STEPS: usize = 1 << 16;

/// One in-place layout's needs: the byte range of In to copy aside (empty when none) and,
/// per step, whether it reads In from that copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InPlace {
    pub lo: usize,
    pub hi: usize,
    pub from_backup: Vec<bool>,
}

impl InPlace {
    /// Whether a copy is needed at all.
    pub fn needs_backup(&self) -> bool {
        self.lo < self.hi
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

/// The needs of rank `steps` run in place with In `shift` bytes after the output's start
/// (negative: before it), for elements of `elem` bytes.
pub fn analyse(steps: &[Step], elem: usize, shift: isize) -> InPlace {
    let n = steps.len();
    let reads_in = |s: &Step| -> Vec<(isize, isize)> {
        s.op.reads()
            .iter()
            .filter(|r| r.buf == Buf::In && r.len > 0)
            .map(|r| at(r, elem, shift))
            .collect()
    };
    let mut hazard = vec![false; n];
    if n > MAX_STEPS {
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
        let mut dependents = vec![Vec::new(); n];
        for (i, s) in steps.iter().enumerate() {
            for &d in &s.deps {
                dependents[d].push(i);
            }
        }
        let mut seen = vec![false; n];
        for (i, s) in steps.iter().enumerate() {
            let reads = reads_in(s);
            // Writes that overlap a read and do not surely run after it.
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
            if candidates.iter().any(|&j| j <= i) {
                hazard[i] = true;
                continue;
            }
            // Which candidates are the read's descendants.
            seen.iter_mut().for_each(|v| *v = false);
            let mut stack = vec![i];
            while let Some(k) = stack.pop() {
                for &d in &dependents[k] {
                    if !seen[d] {
                        seen[d] = true;
                        stack.push(d);
                    }
                }
            }
            hazard[i] = candidates.iter().any(|&j| !seen[j]);
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
    InPlace {
        lo,
        hi,
        from_backup: hazard,
    }
}

#[cfg(test)]
#[path = "inplace_tests.rs"]
mod tests;

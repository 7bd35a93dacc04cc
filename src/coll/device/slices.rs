//! How a call on device buffers is cut into slices that are staged through page-locked host
//! memory: for each slice, the copies from the caller's buffers into the slot's input, the
//! collective that runs on the slot, and the copies from the slot's output back: element and
//! byte offsets only; and the host call of a slice (`call`) on buffers that hold its blocks
//! back to back: a slot's, or on the direct path the caller's device buffers, whole.
//!
//! A call's buffers are lists of blocks (`Blocks`): one block for AllReduce, Broadcast, Reduce
//! and send/recv; `nranks` on the gathered side of AllGather (output), ReduceScatter (input),
//! AllToAll (both), Gather (the root's output) and Scatter (the root's input); and the caller's
//! per-rank counts and displacements for AllGatherV, ReduceScatterV and AllToAllV. Slice `i`
//! takes elements `[i * per, (i + 1) * per)` of every block, clipped to the block's length (an
//! uneven block may have nothing left), and the slot packs a slice's blocks in rank order. So
//! the collective on the slot is the same collective with the slice's per-block lengths as its
//! counts, and the result is the caller's collective, element range by element range. A
//! slice's outputs overlap (in place) only its own inputs, which are read before its collective
//! starts, so slices may be in flight together.
//!
//! Every rank must cut a call into the same number of slices: it depends only on the longest
//! block, which the ranks agree on for every call but AllToAllV (whose caller passes that
//! number, agreed at run time).
use super::super::{Call, Kind, Layout};
use super::DevCall;
use crate::algo::varied::{Block, Spec, Varied};
use crate::algo::Collective;
use crate::transport::Region;

/// One copy between a caller's buffer and a slot: `len` bytes at offset `user` of the buffer
/// and `slot` of the slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub user: usize,
    pub slot: usize,
    pub len: usize,
}

/// The blocks (element offset, element count) of a call's input and output buffers, in rank
/// order where a side has one per rank.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Blocks {
    pub input: Vec<Block>,
    pub output: Vec<Block>,
}

/// One slice: its first element of each block, the length it takes of each block (input and
/// output, in block order), and the copies in and out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slice {
    pub first: usize,
    /// The longest of its block lengths (a uniform call's count per block).
    pub count: usize,
    pub in_lens: Vec<usize>,
    pub out_lens: Vec<usize>,
    pub input: Vec<Piece>,
    pub output: Vec<Piece>,
}

/// How many blocks each side of a uniform call `kind` has on `nranks` ranks: (input, output);
/// 0 for a side the call does not have.
pub fn block_counts(kind: Kind, nranks: usize) -> (usize, usize) {
    match kind {
        Kind::Coll(Collective::AllGather) => (1, nranks),
        Kind::Coll(Collective::ReduceScatter) => (nranks, 1),
        Kind::Coll(Collective::AllToAll) => (nranks, nranks),
        Kind::Send { .. } | Kind::Tagged { send: true, .. } => (1, 0),
        Kind::Recv { .. } | Kind::Tagged { send: false, .. } => (0, 1),
        _ => (1, 1),
    }
}

/// The blocks of a uniform call of `count` elements per block.
pub fn uniform(kind: Kind, nranks: usize, count: usize) -> Blocks {
    let (ins, outs) = block_counts(kind, nranks);
    let packed = |n: usize| (0..n).map(|b| (b * count, count)).collect();
    Blocks {
        input: packed(ins),
        output: packed(outs),
    }
}

/// The blocks of rank `rank`'s side of a varied collective on `nranks` ranks (None: Barrier,
/// which moves no data).
pub fn varied(spec: &Spec, nranks: usize, rank: usize) -> Option<Blocks> {
    let packed = |counts: &[usize]| -> Vec<Block> {
        let mut off = 0;
        counts
            .iter()
            .map(|&c| {
                let b = (off, c);
                off += c;
                b
            })
            .collect()
    };
    let rooted = |count: usize, root: usize| -> Vec<Block> {
        if rank == root {
            packed(&vec![count; nranks])
        } else {
            Vec::new()
        }
    };
    Some(match spec {
        Spec::Gather { count, root } => Blocks {
            input: vec![(0, *count)],
            output: rooted(*count, *root),
        },
        Spec::Scatter { count, root } => Blocks {
            input: rooted(*count, *root),
            output: vec![(0, *count)],
        },
        Spec::Barrier => return None,
        Spec::AllGatherV { blocks } => Blocks {
            input: vec![(0, blocks[rank].1)],
            output: blocks.clone(),
        },
        Spec::ReduceScatterV { counts } => Blocks {
            input: packed(counts),
            output: vec![(0, counts[rank])],
        },
        Spec::AllToAllV { send, recv } => Blocks {
            input: send.clone(),
            output: recv.clone(),
        },
    })
}

impl Blocks {
    /// The longest block, in elements.
    pub fn longest(&self) -> usize {
        self.input
            .iter()
            .chain(&self.output)
            .map(|b| b.1)
            .max()
            .unwrap_or(0)
    }

    /// Elements of the caller's (input, output) buffers the blocks span.
    pub fn extent(&self) -> (usize, usize) {
        let end = |v: &[Block]| v.iter().map(|b| b.0 + b.1).max().unwrap_or(0);
        (end(&self.input), end(&self.output))
    }

    /// The most blocks on one side (the slot holds one slice of each).
    pub fn widest(&self) -> usize {
        self.input.len().max(self.output.len())
    }

    /// Bytes of a slot for slices of `per` elements per block: (input, output).
    pub fn slot_bytes(&self, elem: usize, per: usize) -> (usize, usize) {
        let side = |v: &[Block]| v.iter().map(|b| b.1.min(per)).sum::<usize>() * elem;
        (side(&self.input), side(&self.output))
    }
}

/// How many slices of `per` elements per block a call whose longest block is `longest` takes:
/// at least one, so that a call of no elements still runs (and checks its arguments) once.
pub fn count_of(longest: usize, per: usize) -> usize {
    longest.div_ceil(per.max(1)).max(1)
}

/// The `n` slices of `blocks` with elements of `elem` bytes, at most `per` elements per block
/// each.
pub fn slices(blocks: &Blocks, elem: usize, per: usize, n: usize) -> Vec<Slice> {
    let per = per.max(1);
    let lens = |v: &[Block], first: usize| -> Vec<usize> {
        v.iter()
            .map(|b| b.1.saturating_sub(first).min(per))
            .collect()
    };
    let pieces = |v: &[Block], lens: &[usize], first: usize| -> Vec<Piece> {
        let mut slot = 0;
        v.iter()
            .zip(lens)
            .filter_map(|(b, &len)| {
                let p = Piece {
                    user: (b.0 + first) * elem,
                    slot,
                    len: len * elem,
                };
                slot += p.len;
                (len > 0).then_some(p)
            })
            .collect()
    };
    (0..n.max(1))
        .map(|i| {
            let first = i * per;
            let (in_lens, out_lens) = (lens(&blocks.input, first), lens(&blocks.output, first));
            Slice {
                first,
                count: in_lens.iter().chain(&out_lens).copied().max().unwrap_or(0),
                input: pieces(&blocks.input, &in_lens, first),
                output: pieces(&blocks.output, &out_lens, first),
                in_lens,
                out_lens,
            }
        })
        .collect()
}

/// A region over `v` (a slice's per-block counts, read by `Comm::start`).
fn counts(v: &[usize]) -> Region {
    // SAFETY: the slice outlives the call's start, the only time its counts are read
    // (`Layout`'s contract); the engine reads them, never writes.
    unsafe { Region::from_raw(v.as_ptr() as *mut u8, std::mem::size_of_val(v)) }
}

/// The host call of slice `s` on buffers that hold its blocks back to back from `send` and
/// `recv` (None or 0: the side is absent): a staging slot's, or the caller's device buffers
/// on the direct path.
pub(super) fn call(call: &DevCall, s: &Slice, send: Option<u64>, recv: Option<u64>) -> Call {
    let elem = call.dtype.size();
    let region = |base: Option<u64>, lens: &[usize]| -> Region {
        let bytes = lens.iter().sum::<usize>() * elem;
        match base {
            Some(a) if a != 0 && bytes > 0 => {
                // SAFETY: the buffer outlives the collective: the pool keeps the slots until
                // the communicator is destroyed (and leaks those of a failed call), and the
                // caller's buffers are valid until the call completes (`DevCall::classify`).
                unsafe { Region::from_raw(a as *mut u8, bytes) }
            }
            _ => Region::empty(),
        }
    };
    let (kind, count) = match call.kind {
        Kind::Varied(l) => {
            let mut layout = Layout::new(l.coll);
            let count = match l.coll {
                Varied::AllGatherV => {
                    layout.counts = counts(&s.out_lens);
                    s.in_lens.first().copied().unwrap_or(0)
                }
                Varied::ReduceScatterV => {
                    layout.counts = counts(&s.in_lens);
                    0
                }
                Varied::AllToAllV => {
                    layout.counts = counts(&s.in_lens);
                    layout.recv_counts = counts(&s.out_lens);
                    0
                }
                _ => s.count,
            };
            (Kind::Varied(layout), count)
        }
        k => (k, s.count),
    };
    Call {
        kind,
        send: region(send, &s.in_lens),
        recv: region(recv, &s.out_lens),
        count,
        dtype: call.dtype,
        op: call.op,
        root: call.root,
        algo: call.algo,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Collective::*;

    /// Every byte of every block is copied exactly once, to the slot position its slice
    /// gives it, and no byte outside the blocks.
    fn covers(b: &Blocks, elem: usize, per: usize) {
        let s = slices(b, elem, per, count_of(b.longest(), per));
        let (ie, oe) = b.extent();
        for (side, blocks, extent) in [(0, &b.input, ie), (1, &b.output, oe)] {
            let mut seen = vec![0u8; extent * elem];
            for sl in &s {
                let (pieces, lens) = if side == 0 {
                    (&sl.input, &sl.in_lens)
                } else {
                    (&sl.output, &sl.out_lens)
                };
                let slot_len: usize = lens.iter().sum::<usize>() * elem;
                for p in pieces {
                    assert!(p.slot + p.len <= slot_len);
                    for x in &mut seen[p.user..p.user + p.len] {
                        *x += 1;
                    }
                }
            }
            let mut want = vec![0u8; extent * elem];
            for &(off, len) in blocks.iter() {
                want[off * elem..(off + len) * elem].fill(1);
            }
            assert_eq!(seen, want, "{b:?} per={per}");
        }
    }

    #[test]
    fn every_byte_is_staged_once() {
        let kinds = [
            Kind::Coll(AllReduce),
            Kind::Coll(AllGather),
            Kind::Coll(ReduceScatter),
            Kind::Coll(Broadcast),
            Kind::Coll(Reduce),
            Kind::Coll(AllToAll),
            Kind::Send { peer: 0 },
            Kind::Recv { peer: 0 },
            Kind::Tagged {
                send: true,
                peer: 0,
                tag: 3,
            },
        ];
        for k in kinds {
            for n in [1, 2, 3, 5] {
                for count in [0, 1, 7, 64, 65, 1000] {
                    for per in [1, 3, 64, 4096] {
                        covers(&uniform(k, n, count), 4, per);
                    }
                }
            }
        }
    }

    #[test]
    fn uneven_blocks_are_staged_once_and_packed() {
        let specs = [
            Spec::Gather { count: 5, root: 1 },
            Spec::Scatter { count: 5, root: 0 },
            Spec::AllGatherV {
                blocks: vec![(10, 3), (0, 0), (3, 7)],
            },
            Spec::ReduceScatterV {
                counts: vec![4, 0, 9],
            },
            Spec::AllToAllV {
                send: vec![(0, 2), (2, 0), (5, 6)],
                recv: vec![(6, 1), (0, 6), (7, 0)],
            },
        ];
        for spec in &specs {
            for rank in 0..3 {
                let b = varied(spec, 3, rank).unwrap();
                for per in [1, 2, 4, 100] {
                    covers(&b, 8, per);
                }
            }
        }
        // Slice 1 of 4 per block: block lengths 0, 0, 3 of (3, 0, 7); packed from 0.
        let b = varied(&specs[2], 3, 0).unwrap();
        let s = slices(&b, 1, 4, count_of(b.longest(), 4));
        assert_eq!(s.len(), 2);
        assert_eq!(s[1].out_lens, vec![0, 0, 3]);
        assert_eq!(
            s[1].output,
            vec![Piece {
                user: 7,
                slot: 0,
                len: 3
            }]
        );
        assert!(varied(&Spec::Barrier, 3, 0).is_none());
    }

    #[test]
    fn an_empty_call_is_one_empty_slice() {
        let b = uniform(Kind::Coll(AllReduce), 2, 0);
        let s = slices(&b, 4, 16, count_of(b.longest(), 16));
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].count, 0);
        assert!(s[0].input.is_empty() && s[0].output.is_empty());
    }

    #[test]
    fn gathered_blocks_are_packed_in_rank_order() {
        let b = uniform(Kind::Coll(AllGather), 3, 10);
        let s = slices(&b, 2, 4, count_of(b.longest(), 4));
        assert_eq!(s.len(), 3);
        assert_eq!(
            s[1].input,
            vec![Piece {
                user: 8,
                slot: 0,
                len: 8
            }]
        );
        let out: Vec<_> = s[2]
            .output
            .iter()
            .map(|p| (p.user, p.slot, p.len))
            .collect();
        assert_eq!(out, vec![(16, 0, 4), (36, 4, 4), (56, 8, 4)]);
        assert_eq!(b.slot_bytes(2, 4), (8, 24));
    }
}

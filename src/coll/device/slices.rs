//! How a call on device buffers is cut into slices that are staged through page-locked host
//! memory: for each slice, the copies from the caller's buffers into the slot's input, the
//! collective that runs on the slot, and the copies from the slot's output back. Pure: byte
//! offsets only.
//!
//! A slice takes elements `[first, first + count)` of every block of the call: one block for
//! AllReduce, Broadcast, Reduce and send/recv; `nranks` blocks on the gathered side of
//! AllGather (output), ReduceScatter (input) and AllToAll (both). The slot packs a slice's
//! blocks in rank order, so the collective on the slot is the same collective with `count`
//! elements, and the result is the caller's collective, element range by element range. A
//! slice's outputs overlap (in place) only its own inputs, which are read before its collective
//! starts, so slices may be in flight together.
use super::super::Kind;
use crate::algo::Collective;

/// One copy between a caller's buffer and a slot: `len` bytes at offset `user` of the buffer
/// and `slot` of the slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub user: usize,
    pub slot: usize,
    pub len: usize,
}

/// One slice: its element range of each block, and the copies in and out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slice {
    pub first: usize,
    pub count: usize,
    pub input: Vec<Piece>,
    pub output: Vec<Piece>,
}

/// How many blocks each side of `kind` has on `nranks` ranks: (input, output); 0 for a side
/// the call does not have.
pub fn blocks(kind: Kind, nranks: usize) -> (usize, usize) {
    match kind {
        Kind::Coll(Collective::AllGather) => (1, nranks),
        Kind::Coll(Collective::ReduceScatter) => (nranks, 1),
        Kind::Coll(Collective::AllToAll) => (nranks, nranks),
        Kind::Send { .. } => (1, 0),
        Kind::Recv { .. } => (0, 1),
        _ => (1, 1),
    }
}

/// The slices of a call of `count` elements per block of `elem` bytes, at most `per_slice`
/// elements per block each. A call of no elements has one empty slice, so that it still runs
/// (and checks its arguments) once.
pub fn slices(
    kind: Kind,
    nranks: usize,
    count: usize,
    elem: usize,
    per_slice: usize,
) -> Vec<Slice> {
    let (ins, outs) = blocks(kind, nranks);
    let per = per_slice.max(1);
    let pieces = |n: usize, first: usize, len: usize| -> Vec<Piece> {
        (0..n)
            .map(|b| Piece {
                user: (b * count + first) * elem,
                slot: b * len * elem,
                len: len * elem,
            })
            .filter(|p| p.len > 0)
            .collect()
    };
    let n = count.div_ceil(per).max(1);
    (0..n)
        .map(|i| {
            let first = i * per;
            let len = per.min(count - first.min(count));
            Slice {
                first,
                count: len,
                input: pieces(ins, first, len),
                output: pieces(outs, first, len),
            }
        })
        .collect()
}

/// The bytes of a slot for slices of `per_slice` elements: (input, output).
pub fn slot_bytes(kind: Kind, nranks: usize, elem: usize, per_slice: usize) -> (usize, usize) {
    let (ins, outs) = blocks(kind, nranks);
    (ins * per_slice * elem, outs * per_slice * elem)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Collective::*;

    /// Every byte of every block is copied exactly once, to the slot position its slice
    /// gives it.
    fn covers(kind: Kind, n: usize, count: usize, elem: usize, per: usize) {
        let s = slices(kind, n, count, elem, per);
        let (ins, outs) = blocks(kind, n);
        for (side, blocks) in [(0, ins), (1, outs)] {
            let mut seen = vec![0u8; blocks * count * elem];
            for sl in &s {
                let pieces = if side == 0 { &sl.input } else { &sl.output };
                for p in pieces {
                    assert!(p.slot + p.len <= blocks * sl.count * elem);
                    for b in &mut seen[p.user..p.user + p.len] {
                        *b += 1;
                    }
                }
            }
            assert!(
                seen.iter().all(|&c| c == 1),
                "{kind:?} n={n} count={count} per={per}"
            );
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
        ];
        for k in kinds {
            for n in [1, 2, 3, 5] {
                for count in [0, 1, 7, 64, 65, 1000] {
                    for per in [1, 3, 64, 4096] {
                        covers(k, n, count, 4, per);
                    }
                }
            }
        }
    }

    #[test]
    fn an_empty_call_is_one_empty_slice() {
        let s = slices(Kind::Coll(AllReduce), 2, 0, 4, 16);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].count, 0);
        assert!(s[0].input.is_empty() && s[0].output.is_empty());
    }

    #[test]
    fn gathered_blocks_are_packed_in_rank_order() {
        let s = slices(Kind::Coll(AllGather), 3, 10, 2, 4);
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
    }
}

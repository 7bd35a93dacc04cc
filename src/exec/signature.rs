//! The call signature every collective message carries, so that ranks whose calls differ fail
//! instead of exchanging bytes that mean different things.
//!
//! A collective's signature is a 12-bit hash of what every rank must agree on: the collective,
//! the count, the element type, the reduction op (for collectives that reduce), the root (for
//! rooted ones) and the algorithm that runs it (ranks forced to different algorithms exchange
//! messages that mean different things, and would otherwise find out only at the deadline). It travels in the low bits of each message's tag (`tags::coll_tag`), so it
//! costs no bytes and no work on the wire. Receives ignore those bits when matching and compare
//! them when the message is in: a message whose signature differs from the receiver's fails the
//! collective at once with an error that says how the calls differ. When exactly one argument
//! differs, the receiver finds which by hashing its own call with that argument changed.
//! A compressed collective's byte exchanges carry the caller's call with its format and block
//! size (`compress`), so that ranks asking for different ones are told which differs.
use crate::algo::varied::{Shape, Varied};
use crate::algo::{Algorithm, Collective, Problem};
use crate::compress::{Format, DEFAULT_BLOCK, MAX_BLOCK};
use crate::error::Error;
use crate::reduce::{DataType, RedOp};
use std::hash::Hasher;

/// Tag bits that carry the signature.
pub const SIG_BITS: u32 = 12;

/// The signature's bits in a collective tag (the lowest `SIG_BITS`).
pub const SIG_MASK: u64 = (1 << SIG_BITS) - 1;

/// What all ranks of one collective call must agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signature {
    pub coll: Collective,
    pub count: usize,
    pub dtype: DataType,
    pub op: RedOp,
    pub root: usize,
    /// The varied collective and the hash of its counts (`algo::varied::Shape`).
    pub shape: Option<Shape>,
    /// The algorithm of the rank's schedule.
    pub algo: Algorithm,
    /// A compressed collective's format and block size (None: the data as it is).
    pub compress: Option<(Format, usize)>,
}

/// The algorithm a compressed collective's signature names, whichever algorithms run its
/// exchanges (`coll` compressed): every rank chooses those alike, and a rank that compresses
/// is told from one that does not by the format the signature carries.
pub const COMPRESSED_ALGO: Algorithm = Algorithm::Mesh;

/// Most roots tried when looking for the one argument that differs.
const ROOTS_TRIED: usize = 4096;

impl Signature {
    /// The signature of a call of `problem` run by `algo`, with `dtype` and `op`.
    pub fn of(problem: &Problem, algo: Algorithm, dtype: DataType, op: RedOp) -> Signature {
        Signature {
            coll: problem.coll,
            count: problem.count,
            dtype,
            op,
            root: problem.root,
            shape: problem.shape,
            algo,
            compress: None,
        }
    }

    fn rooted(&self) -> bool {
        match self.shape {
            Some(s) => matches!(s.coll, Varied::Gather | Varied::Scatter),
            None => matches!(self.coll, Collective::Broadcast | Collective::Reduce),
        }
    }

    /// The signature's tag bits. The op counts only where the collective reduces and the root
    /// only where it has one: other ranks may pass anything there.
    pub fn bits(&self) -> u64 {
        let mut h = rustc_hash::FxHasher::default();
        h.write_u8(self.coll as u8);
        h.write_u64(self.count as u64);
        h.write_u8(self.dtype as u8);
        h.write_u8(if self.coll.reduces() {
            self.op as u8
        } else {
            u8::MAX
        });
        h.write_u64(if self.rooted() { self.root as u64 } else { 0 });
        if let Some(s) = self.shape {
            h.write_u8(s.coll as u8 + 1);
            h.write_u64(s.hash);
        }
        h.write_u8(self.algo as u8);
        if let Some((f, block)) = self.compress {
            h.write_u8(f.id());
            h.write_u64(block as u64);
        }
        let x = h.finish();
        // Fold all 64 bits into the tag's 12, so that every field reaches them.
        (x ^ (x >> 12) ^ (x >> 24) ^ (x >> 36) ^ (x >> 48) ^ (x >> 60)) & SIG_MASK
    }

    /// The error of a rank whose call has this signature on receiving from rank `peer` a
    /// message with signature bits `theirs`: it names the argument that differs where a
    /// single changed argument explains the peer's bits.
    pub fn mismatch(&self, peer: usize, nranks: usize, theirs: u64) -> Error {
        let mine = self.describe();
        let what = match self.differing(nranks, theirs) {
            Some(d) => format!("rank {peer} {d}"),
            None => format!(
                "rank {peer}'s count{} or several of its arguments differ (signature {theirs:#05x}, this rank's {:#05x})",
                if self.shape.is_some() { "s (or its collective)" } else { "" },
                self.bits()
            ),
        };
        Error::InvalidUsage(format!(
            "the ranks' calls differ: this rank called {mine}; {what}"
        ))
    }

    /// The call in words: collective, count, type, algorithm, and op, root or compression.
    pub fn describe(&self) -> String {
        let mut s = match self.shape {
            Some(v) => format!(
                "{:?} of {} x {} in all (counts hash {:#x})",
                v.coll, self.count, self.dtype, v.hash
            ),
            None => format!("{:?} of {} x {}", self.coll, self.count, self.dtype),
        };
        s += &format!(" by {}", self.algo);
        if self.coll.reduces() {
            s += &format!(" with op {}", self.op);
        }
        if self.rooted() {
            s += &format!(" at root {}", self.root);
        }
        if let Some((f, b)) = self.compress {
            s += &format!(" compressed as {f} in blocks of {b}");
        }
        s
    }

    /// The compression setting that turns this call's bits into `theirs`, described: another
    /// format or block size, none at all (the peer ran the call uncompressed, by any
    /// algorithm), or compression where this rank has none. Block sizes tried: powers of two
    /// and the default where this rank compresses, the default where it does not.
    fn differing_compression(&self, theirs: u64) -> Option<String> {
        let hit = |s: Signature| s.bits() == theirs;
        let blocks = || {
            std::iter::once(DEFAULT_BLOCK)
                .chain((0..=MAX_BLOCK.trailing_zeros()).map(|k| 1usize << k))
        };
        let formats = || Format::ALL.into_iter().filter(|&f| f != Format::Off);
        match self.compress {
            Some((format, block)) => {
                let plain = Algorithm::ALL
                    .into_iter()
                    .filter(|&a| crate::algo::supports(a, self.coll))
                    .any(|algo| {
                        hit(Signature {
                            algo,
                            compress: None,
                            ..*self
                        })
                    });
                if plain {
                    return Some("runs it uncompressed (compress off)".into());
                }
                if let Some(f) = formats().find(|&f| {
                    f != format
                        && hit(Signature {
                            compress: Some((f, block)),
                            ..*self
                        })
                }) {
                    return Some(format!("passed compress {f}"));
                }
                blocks()
                    .find(|&b| {
                        b != block
                            && hit(Signature {
                                compress: Some((format, b)),
                                ..*self
                            })
                    })
                    .map(|b| format!("passed compress block {b}"))
            }
            // Each guess is a 12-bit match that chance can make: a rank without compression
            // tries each format at the default block size only, not every block size, so
            // that a peer whose count differs is not said to compress.
            None => formats()
                .find(|&f| {
                    hit(Signature {
                        algo: COMPRESSED_ALGO,
                        compress: Some((f, DEFAULT_BLOCK)),
                        ..*self
                    })
                })
                .map(|f| format!("passed compress {f} (blocks of {DEFAULT_BLOCK})")),
        }
    }

    /// The one argument whose change turns this call's bits into `theirs`, described. A peer
    /// that called another collective may also run another algorithm (the cost model chose for
    /// its call): that collective is found whatever the peer's algorithm; the algorithm alone
    /// is tried last.
    fn differing(&self, nranks: usize, theirs: u64) -> Option<String> {
        if theirs == self.bits() {
            return None;
        }
        let hit = |s: Signature| s.bits() == theirs;
        // Another collective, run by any algorithm that implements it.
        let hit_any_algo = |s: Signature| {
            Algorithm::ALL
                .iter()
                .filter(|&&a| crate::algo::supports(a, s.coll))
                .any(|&algo| hit(Signature { algo, ..s }))
        };
        let others_algo = Algorithm::ALL
            .into_iter()
            .find(|&algo| algo != self.algo && Signature { algo, ..*self }.bits() == theirs);
        for coll in Collective::ALL {
            let ops: &[RedOp] = if coll.reduces() && !self.coll.reduces() {
                &RedOp::ALL
            } else {
                std::slice::from_ref(&self.op)
            };
            for &op in ops {
                if coll != self.coll && hit_any_algo(Signature { coll, op, ..*self }) {
                    return Some(format!("called {coll:?}"));
                }
            }
        }
        for dtype in DataType::ALL {
            if dtype == self.dtype {
                continue;
            }
            let bytes = self.count as u128 * self.dtype.size() as u128;
            let same_bytes = bytes
                .is_multiple_of(dtype.size() as u128)
                .then(|| (bytes / dtype.size() as u128) as usize);
            for count in [Some(self.count), same_bytes].into_iter().flatten() {
                if hit(Signature {
                    dtype,
                    count,
                    ..*self
                }) {
                    return Some(format!("passed {count} x {dtype}"));
                }
            }
        }
        if self.coll.reduces() {
            for op in RedOp::ALL {
                if op != self.op && hit(Signature { op, ..*self }) {
                    return Some(format!("passed op {op}"));
                }
            }
        }
        if self.rooted() {
            for root in 0..nranks.min(ROOTS_TRIED) {
                if root != self.root && hit(Signature { root, ..*self }) {
                    return Some(format!("named root {root}"));
                }
            }
        }
        if let Some(d) = self.differing_compression(theirs) {
            return Some(d);
        }
        others_algo.map(|a| format!("runs algorithm {a}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(coll: Collective, count: usize, dtype: DataType, op: RedOp, root: usize) -> Signature {
        Signature {
            coll,
            count,
            dtype,
            op,
            root,
            shape: None,
            algo: Algorithm::Ring,
            compress: None,
        }
    }

    fn said(mine: Signature, theirs: Signature) -> String {
        mine.mismatch(1, 4, theirs.bits()).to_string()
    }

    #[test]
    fn bits_fit_their_mask_and_ignore_what_the_collective_does_not_use() {
        use Collective::*;
        let f = DataType::Float32;
        let a = sig(AllGather, 1024, f, RedOp::Sum, 0);
        assert!(a.bits() <= SIG_MASK);
        // AllGather neither reduces nor has a root: ranks may pass any op and root.
        assert_eq!(a.bits(), sig(AllGather, 1024, f, RedOp::Max, 3).bits());
        // AllReduce reduces but has no root.
        let r = sig(AllReduce, 1024, f, RedOp::Sum, 0);
        assert_eq!(r.bits(), sig(AllReduce, 1024, f, RedOp::Sum, 2).bits());
        assert_ne!(r.bits(), sig(AllReduce, 1024, f, RedOp::Max, 0).bits());
        // Broadcast has a root and no op.
        let b = sig(Broadcast, 8, f, RedOp::Sum, 0);
        assert_eq!(b.bits(), sig(Broadcast, 8, f, RedOp::Prod, 0).bits());
        assert_ne!(b.bits(), sig(Broadcast, 8, f, RedOp::Sum, 1).bits());
    }

    #[test]
    fn the_cases_the_outside_test_found_name_the_argument_that_differs() {
        use Collective::*;
        let (f32_, f64_) = (DataType::Float32, DataType::Float64);
        let ar = sig(AllReduce, 1024, f32_, RedOp::Sum, 0);
        let e = said(ar, sig(ReduceScatter, 1024, f32_, RedOp::Sum, 0));
        assert!(e.contains("rank 1 called ReduceScatter"), "{e}");
        assert!(
            e.contains("this rank called AllReduce of 1024 x float"),
            "{e}"
        );
        let e = said(ar, sig(AllReduce, 512, f64_, RedOp::Sum, 0));
        assert!(e.contains("rank 1 passed 512 x double"), "{e}");
        let e = said(ar, sig(AllReduce, 1024, f32_, RedOp::Max, 0));
        assert!(e.contains("rank 1 passed op max"), "{e}");
        let bc = sig(Broadcast, 64, f32_, RedOp::Sum, 0);
        let e = said(bc, sig(Broadcast, 64, f32_, RedOp::Sum, 1));
        assert!(e.contains("rank 1 named root 1"), "{e}");
        let e = said(bc, sig(Reduce, 64, f32_, RedOp::Sum, 0));
        assert!(e.contains("rank 1 called Reduce"), "{e}");
        let e = said(ar, sig(AllReduce, 1000, f32_, RedOp::Sum, 0));
        assert!(e.contains("count or several"), "{e}");
    }

    /// All 8 ops hash apart, and a differing op is named. 12 bits cannot keep every other
    /// single change apart from an op change: where another explanation (checked first: the
    /// collective, then the type) gives the same bits, that one is named, and it must still be
    /// a single named argument. AllReduce, the bitwise ops' main user, names the op for every
    /// pair at this size.
    #[test]
    fn every_op_pair_differs_and_a_differing_op_is_named() {
        use Collective::*;
        let i = DataType::Int32;
        let (mut pairs, mut named) = (0, 0);
        for coll in [AllReduce, ReduceScatter, Reduce] {
            for a in RedOp::ALL {
                for b in RedOp::ALL {
                    if a == b {
                        continue;
                    }
                    let (x, y) = (sig(coll, 1024, i, a, 0), sig(coll, 1024, i, b, 0));
                    assert_ne!(x.bits(), y.bits(), "{coll:?} {a} vs {b}");
                    let e = said(x, y);
                    pairs += 1;
                    if e.contains(&format!("rank 1 passed op {b}")) {
                        named += 1;
                    } else {
                        assert!(coll != AllReduce, "{e}");
                        assert!(
                            e.contains("rank 1 passed ") || e.contains("rank 1 called "),
                            "{e}"
                        );
                    }
                }
            }
        }
        assert!(named * 20 >= pairs * 19, "{named} of {pairs} name the op");
    }

    #[test]
    fn ranks_forced_to_different_algorithms_differ_and_are_told_so() {
        use Collective::*;
        let f = DataType::Float32;
        let mine = sig(AllReduce, 4096, f, RedOp::Sum, 0);
        let mut named = 0;
        for algo in Algorithm::ALL {
            if algo == mine.algo || !crate::algo::supports(algo, AllReduce) {
                continue;
            }
            let theirs = Signature { algo, ..mine };
            assert_ne!(mine.bits(), theirs.bits(), "ring vs {algo}");
            let e = said(mine, theirs);
            assert!(e.contains("by ring"), "{e}");
            if e.contains(&format!("rank 1 runs algorithm {algo}")) {
                named += 1;
            }
        }
        assert!(named >= 6, "{named} named");
    }

    #[test]
    fn ranks_asking_for_other_compression_are_told_which_setting_differs() {
        use Collective::*;
        let f = DataType::Float32;
        let plain = sig(AllReduce, 4096, f, RedOp::Sum, 0);
        let mine = Signature {
            algo: COMPRESSED_ALGO,
            compress: Some((Format::Fp8E4m3, 256)),
            ..plain
        };
        let other = |f: Format, b: usize| Signature {
            compress: Some((f, b)),
            ..mine
        };
        let e = said(mine, other(Format::Fp16, 256));
        assert!(e.contains("rank 1 passed compress fp16"), "{e}");
        assert!(e.contains("compressed as fp8e4m3 in blocks of 256"), "{e}");
        let e = said(mine, other(Format::Fp8E4m3, 64));
        assert!(e.contains("rank 1 passed compress block 64"), "{e}");
        let e = said(mine, plain);
        assert!(e.contains("rank 1 runs it uncompressed"), "{e}");
        let e = said(plain, other(Format::Int8, 256));
        assert!(
            e.contains("rank 1 passed compress int8 (blocks of 256)"),
            "{e}"
        );
    }
}

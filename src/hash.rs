//! A fast hasher for the maps on the per-call path (operation contexts, requests, schedules).
//! Their keys are addresses, small integers and plain-data problem descriptions chosen by this
//! library, never by a remote party, so they need no protection against collision attacks,
//! and std's SipHash costs more than the rest of a small collective's bookkeeping.
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The multiply-rotate hash of rustc and Firefox (FxHash).
#[derive(Default, Clone, Copy)]
pub struct FastHasher(u64);

const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FastHasher {
    #[inline]
    fn add(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(K);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut b = [0u8; 8];
            b[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(b));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        // The product's high bits are the well mixed ones; hashbrown indexes buckets with the
        // low bits (and aligned addresses have zero low bits): rotate the high ones down.
        self.0.rotate_left(26)
    }
}

/// A `HashMap` with `FastHasher`.
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_aligned_addresses_and_small_integers() {
        use std::collections::HashSet;
        use std::hash::BuildHasher;
        let b = BuildHasherDefault::<FastHasher>::default();
        // Box addresses are 16-byte aligned: the low bits of the hashes must still differ.
        let low: HashSet<u64> = (0..1024usize)
            .map(|i| b.hash_one(0x5555_0000_0000usize + 16 * i) & 0x3ff)
            .collect();
        assert!(
            low.len() > 600,
            "only {} distinct low bit patterns",
            low.len()
        );
        let m: FastMap<u32, u32> = (0..1000).map(|i| (i, i * 2)).collect();
        assert!((0..1000).all(|i| m[&i] == i * 2));
    }
}

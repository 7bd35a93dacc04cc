//! Input values for checked collectives: each rank's value at each element, such that a block
//! delivered to the wrong rank or at the wrong offset shows, and every sum the check makes is
//! exact in the element type.
//!
//! `value(range, r, i)` is `1 + (mix(i) + r) mod range`: at one element the ranks' values
//! differ whenever `range >= n` (a block from another rank differs at every element), and along
//! the elements they follow a hash, not a period (a block shifted by any offset differs at
//! about `1 - 1/range` of its elements). A repeating pattern such as `(r*7 + i*3) % 5` cannot
//! tell rank r from rank r+5, nor element i from i+5. `range(dt, n, sums)` is the largest range
//! whose values (summed over `n` ranks when `sums`) stay exact integers in `dt`; the values stay
//! small integers so that every integer type holds them as they are.
use crate::reduce::DataType;

/// The largest integer `m` such that every integer in 0..=m is exact in `dt` (and fits it).
pub fn exact_max(dt: DataType) -> u64 {
    match dt {
        DataType::Int8 => i8::MAX as u64,
        DataType::Uint8 => u8::MAX as u64,
        DataType::Float8E5M2 => 1 << 3,
        DataType::Float8E4M3 => 1 << 4,
        DataType::Bfloat16 => 1 << 8,
        DataType::Float16 => 1 << 11,
        DataType::Int32 => i32::MAX as u64,
        DataType::Uint32 => u32::MAX as u64,
        DataType::Float32 => 1 << 24,
        // More than any test's count needs, and exact in every 64-bit type.
        DataType::Int64 | DataType::Uint64 | DataType::Float64 => 1 << 40,
    }
}

/// How many distinct values `value` may use for `dt` over `n` ranks: `exact_max / n` when the
/// check sums the ranks' values (so every partial sum is exact), else `exact_max`; at least 1.
pub fn range(dt: DataType, n: usize, sums: bool) -> u64 {
    let m = exact_max(dt);
    let r = if sums { m / n.max(1) as u64 } else { m };
    r.max(1)
}

/// A 64-bit mix of `i` (splitmix64's finaliser): neighbouring elements get unrelated values.
fn mix(i: usize) -> u64 {
    let mut x = (i as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Rank `r`'s value at element `i`, in 1..=range.
pub fn value(range: u64, r: usize, i: usize) -> u64 {
    let range = range.max(1);
    1 + (mix(i) % range + r as u64 % range) % range
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The repeating pattern this replaces let a block of rank r+5 pass for rank r's, and a
    /// block shifted by 5 elements pass for the right one; these values do not.
    #[test]
    fn blocks_of_other_ranks_or_offsets_differ() {
        let wide = range(DataType::Float32, 8, true);
        let block = 5 * 64;
        for (p, q) in [(0usize, 5usize), (1, 6), (0, 1), (2, 7)] {
            for shift in [0usize, 5, 10, 64, 320] {
                if p == q && shift == 0 {
                    continue;
                }
                let same = (0..block)
                    .filter(|&i| value(wide, p, i) == value(wide, q, i + shift))
                    .count();
                assert!(
                    same * 100 < block,
                    "rank {p} vs {q} shifted {shift}: {same} equal"
                );
            }
        }
        // At one element, the ranks' values all differ while range >= n.
        for dt in [DataType::Int8, DataType::Bfloat16, DataType::Float16] {
            let n = 8;
            let k = range(dt, n, true);
            assert!(k >= n as u64, "{dt:?}");
            for i in 0..1000 {
                let mut v: Vec<u64> = (0..n).map(|r| value(k, r, i)).collect();
                v.sort_unstable();
                v.dedup();
                assert_eq!(v.len(), n, "{dt:?} element {i}");
            }
        }
    }

    /// Sums over n ranks stay exact: the largest value times n is within the type's exact
    /// integers, and every value is at least 1 (so the bitwise and product checks stay apart).
    #[test]
    fn sums_stay_exact_in_every_type() {
        for dt in DataType::ALL {
            for n in [1usize, 2, 3, 6, 8, 64] {
                let k = range(dt, n, true);
                let top = (0..10_000).map(|i| value(k, n - 1, i)).max().unwrap();
                assert!(top >= 1 && top <= k, "{dt:?} n={n}");
                if k > 1 || exact_max(dt) >= n as u64 {
                    assert!(top * n as u64 <= exact_max(dt), "{dt:?} n={n}: {top} x {n}");
                }
            }
        }
    }
}

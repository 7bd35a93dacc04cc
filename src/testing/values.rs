//! Pseudo-random f32 values for the compressed collectives' tests (`compress`, `coll`): the
//! same sequence for a seed, either within +-10 or over a wide range of exponents, so that one
//! block of a codec holds magnitudes far apart.

/// `n` values from `seed`: uniform in (-10, 10), or, with `spread` Some(e), uniform in (-1, 1)
/// times 2^k for k spread over -e..e.
pub fn values(seed: u64, n: usize, spread: Option<i32>) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            match spread {
                Some(e) => u * 2f32.powi((s % (2 * e as u64)) as i32 - e),
                None => u * 10.0,
            }
        })
        .collect()
}

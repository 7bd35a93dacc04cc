//! The codec's loops compiled for AVX2: the same Rust as the portable path (`Codec`'s block
//! loops, inlined here), so the compiler vectorizes them 8 wide; no FMA and no reassociation, so
//! both paths give the same bits. Each function returns false where the CPU lacks AVX2, and the
//! caller then runs the portable loops.
use super::{block, Codec};

fn avx2() -> bool {
    is_x86_feature_detected!("avx2")
}

#[target_feature(enable = "avx2")]
fn quantize_avx2(c: &Codec, src: &[f32], dst: &mut [u8]) {
    c.quantize_blocks(src, dst)
}

#[target_feature(enable = "avx2")]
#[allow(clippy::redundant_closure)] // the closure is the point (below)
fn dequantize_avx2(c: &Codec, src: &[u8], dst: &mut [f32]) {
    // Closures, not the functions themselves: a function item is called through a shim
    // compiled without AVX2, which the compiler does not inline here.
    c.blocks(src, dst, |f, s, k, d| block::decode(f, s, k, d))
}

#[target_feature(enable = "avx2")]
#[allow(clippy::redundant_closure)] // as in dequantize_avx2
fn accumulate_avx2(c: &Codec, src: &[u8], acc: &mut [f32]) {
    c.blocks(src, acc, |f, s, k, a| block::accumulate(f, s, k, a))
}

/// `c.quantize` on AVX2; false (nothing done) without it. Lengths are checked by the caller.
pub fn quantize(c: &Codec, src: &[f32], dst: &mut [u8]) -> bool {
    if !avx2() {
        return false;
    }
    // SAFETY: the CPU has AVX2 (checked above), the only requirement of the target feature.
    unsafe { quantize_avx2(c, src, dst) };
    true
}

/// `c.dequantize` on AVX2; false (nothing done) without it.
pub fn dequantize(c: &Codec, src: &[u8], dst: &mut [f32]) -> bool {
    if !avx2() {
        return false;
    }
    // SAFETY: the CPU has AVX2 (checked above), the only requirement of the target feature.
    unsafe { dequantize_avx2(c, src, dst) };
    true
}

/// `c.accumulate` on AVX2; false (nothing done) without it.
pub fn accumulate(c: &Codec, src: &[u8], acc: &mut [f32]) -> bool {
    if !avx2() {
        return false;
    }
    // SAFETY: the CPU has AVX2 (checked above), the only requirement of the target feature.
    unsafe { accumulate_avx2(c, src, acc) };
    true
}

//! IEEE binary16 (f16) and bfloat16 conversions to and from f32, written out (no `half` crate).
//!
//! f32 -> f16 / bf16 rounds to nearest, ties to even; overflow gives infinity; a NaN stays a
//! quiet NaN (sign kept, top payload bits kept). f16 / bf16 -> f32 is exact. The f16 functions
//! give the same bits as x86 F16C (`vcvtph2ps`, `vcvtps2ph` with round-to-nearest-even) for
//! every non-NaN input, which the tests check against the instructions where present.
#![forbid(unsafe_code)]

/// `if c { a } else { b }` without a branch, so that loops over conversions vectorize.
#[inline(always)]
fn sel(c: bool, a: u32, b: u32) -> u32 {
    let m = u32::from(c).wrapping_neg();
    (a & m) | (b & !m)
}

/// f16 bits -> f32 (exact; a NaN comes back quiet).
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    // Normal: exponent and mantissa move up, the bias goes from 15 to 127.
    let normal = (em << 13) + (112 << 23);
    // Subnormal (and zero): em * 2^-24, exact in f32.
    let sub = (em as f32 * f32::from_bits(103 << 23)).to_bits();
    // Infinity, or NaN made quiet.
    let inf_nan = (em << 13) | 0x7f80_0000 | sel(em > 0x7c00, 0x40_0000, 0);
    f32::from_bits(sign | sel(em < 0x400, sub, sel(em >= 0x7c00, inf_nan, normal)))
}

/// f32 -> f16 bits, round to nearest even; overflow to infinity; NaN -> quiet NaN.
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = (bits >> 16) & 0x8000;
    let abs = bits & 0x7fff_ffff;
    // NaN keeps its top payload bits, made quiet; >= 65536 (past the largest value that rounds
    // to 65504) or infinity: infinity.
    let nan_inf = sel(abs > 0x7f80_0000, 0x7e00 | ((abs >> 13) & 0x3ff), 0x7c00);
    // Normal range (>= 2^-14): round the f32 pattern to 10 mantissa bits, re-bias. The carry may
    // step into the exponent, up to infinity (65520 and above), which is right.
    let normal = ((abs + 0x0fff + ((abs >> 13) & 1)) >> 13).wrapping_sub(112 << 10);
    // Subnormal range: adding 0.5, whose ulp is 2^-24 (the f16 subnormal quantum), rounds to
    // nearest even in the f32 adder; the low bits are then the f16 code.
    let sub = (f32::from_bits(abs) + 0.5)
        .to_bits()
        .wrapping_sub(0x3f00_0000);
    let r = sel(
        abs >= 0x4780_0000,
        nan_inf,
        sel(abs < 0x3880_0000, sub, normal),
    );
    (sign | r) as u16
}

/// bf16 bits -> f32 (exact).
#[inline]
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// f32 -> bf16 bits, round to nearest even; overflow to infinity; NaN -> quiet NaN.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
    sel(
        bits & 0x7fff_ffff > 0x7f80_0000,
        (bits >> 16) | 0x40,
        rounded,
    ) as u16
}

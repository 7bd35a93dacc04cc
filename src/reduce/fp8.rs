//! OCP FP8 conversions: E4M3 and E5M2, to and from f32.
//!
//! - **E4M3**: 1 sign, 4 exponent (bias 7), 3 mantissa bits. No infinities; `S.1111.111` is
//!   NaN; the largest finite value is 448 (`0x7e`); the smallest subnormal is 2^-9.
//! - **E5M2**: 1 sign, 5 exponent (bias 15), 2 mantissa bits, IEEE-like: `S.11111.00` is
//!   infinity, `S.11111.{01,10,11}` are NaN; the largest finite value is 57344 (`0x7b`); the
//!   smallest subnormal is 2^-16.
//!
//! fp8 -> f32 is exact (a table). f32 -> fp8 rounds to nearest, ties to even. The saturating
//! conversions (`f32_to_e4m3`, `f32_to_e5m2`) are CUDA's `__nv_cvt_float_to_fp8(x,
//! __NV_SATFINITE, ...)`, which NCCL's fp8 reductions use: any value above the largest finite
//! value, infinity included, becomes the signed largest finite value; NaN becomes the canonical
//! NaN (`0x7f` for E4M3, `0x7e` for E5M2). The `_nosat` variants overflow (after rounding) to
//! NaN (E4M3) or signed infinity (E5M2) instead, as `__NV_NOSAT`.
#![forbid(unsafe_code)]

#[derive(Clone, Copy)]
struct Format {
    man_bits: u32,
    bias: u32,
    /// Largest finite code (positive).
    max_code: u32,
    /// Canonical NaN code.
    nan_code: u8,
    /// E5M2 has infinities.
    has_inf: bool,
}

const E4M3: Format = Format {
    man_bits: 3,
    bias: 7,
    max_code: 0x7e,
    nan_code: 0x7f,
    has_inf: false,
};
const E5M2: Format = Format {
    man_bits: 2,
    bias: 15,
    max_code: 0x7b,
    nan_code: 0x7e,
    has_inf: true,
};

/// The f32 bit pattern of an fp8 code (a quiet NaN for NaN codes).
const fn decode_bits(code: u8, f: Format) -> u32 {
    let code = code as u32;
    let sign = (code & 0x80) << 24;
    let exp_mask = (1 << (7 - f.man_bits)) - 1;
    let man_mask = (1 << f.man_bits) - 1;
    let e = (code >> f.man_bits) & exp_mask;
    let m = code & man_mask;
    let is_special = if f.has_inf {
        e == exp_mask
    } else {
        e == exp_mask && m == man_mask
    };
    if is_special {
        if m == 0 {
            sign | 0x7f80_0000
        } else {
            sign | 0x7fc0_0000 | (m << (23 - f.man_bits))
        }
    } else if e == 0 {
        if m == 0 {
            sign
        } else {
            // Subnormal: m * 2^(1 - bias - man_bits); p = leading one of m.
            let p = 31 - m.leading_zeros();
            let biased = p + 128 - f.bias - f.man_bits; // p + (1 - bias - man_bits) + 127
            sign | (biased << 23) | ((m << (23 - p)) & 0x7f_ffff)
        }
    } else {
        sign | ((e + 127 - f.bias) << 23) | (m << (23 - f.man_bits))
    }
}

const fn table(f: Format) -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = decode_bits(i as u8, f);
        i += 1;
    }
    t
}

static E4M3_TO_F32: [u32; 256] = table(E4M3);
static E5M2_TO_F32: [u32; 256] = table(E5M2);

/// f32 -> fp8, round to nearest even. `sat`: saturate to the largest finite value, else
/// overflow to infinity (E5M2) or NaN (E4M3).
#[inline]
fn encode(x: f32, f: Format, sat: bool) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let abs = bits & 0x7fff_ffff;
    if abs > 0x7f80_0000 {
        return f.nan_code;
    }
    // The overflow code: what a result above the largest finite value becomes.
    let over = if sat {
        sign | f.max_code as u8
    } else if f.has_inf {
        sign | (f.max_code as u8 + 1)
    } else {
        f.nan_code
    };
    let shift = 23 - f.man_bits;
    // f32 biased exponent of the smallest fp8 normal.
    let min_normal = 128 - f.bias;
    let e = abs >> 23;
    if e >= min_normal {
        // The f32 pattern of the largest finite value.
        let max_bits = (f.max_code + ((127 - f.bias) << f.man_bits)) << shift;
        if sat && abs > max_bits {
            return over;
        }
        let r = abs + (1 << (shift - 1)) - 1 + ((abs >> shift) & 1);
        let code = (r >> shift) - ((127 - f.bias) << f.man_bits);
        if code > f.max_code {
            return over; // rounded past the largest finite value
        }
        return sign | code as u8;
    }
    // Subnormal or zero: x / 2^(1 - bias - man_bits) = m >> s.
    // e < min_normal, so s > 23 - man_bits; s > 24 means |x| < 2^-1 quantum: zero.
    let s = 151 - f.bias - f.man_bits - e;
    if s > 24 {
        return sign;
    }
    let m = (abs & 0x7f_ffff) | 0x80_0000;
    sign | ((m + (1 << (s - 1)) - 1 + ((m >> s) & 1)) >> s) as u8
}

/// E4M3 code -> f32 (exact; NaN codes give a quiet NaN).
#[inline]
pub fn e4m3_to_f32(c: u8) -> f32 {
    f32::from_bits(E4M3_TO_F32[c as usize])
}

/// E5M2 code -> f32 (exact; infinities stay infinite; NaN codes give a quiet NaN).
#[inline]
pub fn e5m2_to_f32(c: u8) -> f32 {
    f32::from_bits(E5M2_TO_F32[c as usize])
}

/// f32 -> E4M3, round to nearest even, saturating (`__NV_SATFINITE`): |x| > 448 (infinity
/// included) gives ±448; NaN gives `0x7f`.
#[inline]
pub fn f32_to_e4m3(x: f32) -> u8 {
    encode(x, E4M3, true)
}

/// f32 -> E5M2, round to nearest even, saturating (`__NV_SATFINITE`): |x| > 57344 (infinity
/// included) gives ±57344; NaN gives `0x7e`.
#[inline]
pub fn f32_to_e5m2(x: f32) -> u8 {
    encode(x, E5M2, true)
}

/// f32 -> E4M3, round to nearest even, non-saturating (`__NV_NOSAT`): a value that rounds
/// above 448, or infinity, gives NaN (`0x7f`).
#[inline]
pub fn f32_to_e4m3_nosat(x: f32) -> u8 {
    encode(x, E4M3, false)
}

/// f32 -> E5M2, round to nearest even, non-saturating (`__NV_NOSAT`): a value that rounds
/// above 57344 gives signed infinity (`0x7c` / `0xfc`); NaN gives `0x7e`.
#[inline]
pub fn f32_to_e5m2_nosat(x: f32) -> u8 {
    encode(x, E5M2, false)
}

//! One block of a compressed buffer: its scale, and the loops that quantize, dequantize and
//! dequantize-and-accumulate its elements. The loops are branch-free over the block (the block's
//! scale and special values are decided once, before them) so that the compiler vectorizes them;
//! the fp8 and fp16 encoders are written out here for that reason (the element-wise converters of
//! `reduce` take every input, NaN and overflow included, and branch on them).
#![forbid(unsafe_code)]

use super::format::Format;
use crate::reduce::{conv, fp8};

/// The scale of a block holding NaN or an infinity: its elements all decode to NaN.
pub const MARKER: f32 = f32::NAN;

/// The f32 bit pattern of a block's largest magnitude (`0x7f80_0000` and above: non-finite).
#[inline(always)]
pub fn amax_bits(x: &[f32]) -> u32 {
    x.iter().fold(0u32, |m, v| m.max(v.to_bits() & 0x7fff_ffff))
}

/// The block's (dequantization scale, quantization multiplier) for largest magnitude bits
/// `amax`: None for a block with NaN or an infinity.
#[inline(always)]
pub fn scales(f: Format, amax: u32) -> Option<(f32, f32)> {
    if amax >= 0x7f80_0000 {
        return None;
    }
    let a = f32::from_bits(amax);
    match f {
        Format::Off | Format::Bf16 => Some((1.0, 1.0)),
        Format::Int8 | Format::Int4 => {
            // At least the smallest normal, so that 1 / s stays finite.
            let s = (a / f.max_code_value()).max(f32::MIN_POSITIVE);
            Some((s, 1.0 / s))
        }
        Format::Fp16 | Format::Fp8E4m3 | Format::Fp8E5m2 => {
            // The largest k with a * 2^k <= the format's largest value M, within the exponents
            // whose 2^k and 2^-k f32 holds (2^-127 as a subnormal): scaling by it is exact.
            // With a = 1.ma * 2^ea and M = 1.mm * 2^em, k = em - ea, less one if ma > mm.
            let m = f.max_code_value().to_bits();
            let (em, mm) = ((m >> 23) as i32 - 127, m & 0x7f_ffff);
            let (ea, ma) = if amax >= 0x80_0000 {
                ((amax >> 23) as i32 - 127, amax & 0x7f_ffff)
            } else if amax == 0 {
                (-1000, 0)
            } else {
                let p = 31 - amax.leading_zeros() as i32;
                (p - 149, (amax << (23 - p)) & 0x7f_ffff)
            };
            let k = (em - ea - i32::from(ma > mm)).clamp(-126, 127);
            Some((pow2(-k), pow2(k)))
        }
    }
}

/// 2^k for k in -127..=127.
fn pow2(k: i32) -> f32 {
    if k >= -126 {
        f32::from_bits(((k + 127) as u32) << 23)
    } else {
        f32::from_bits(1 << 22)
    }
}

/// The constants of a branch-free fp8 or fp16 encoder for finite inputs.
#[derive(Clone, Copy)]
struct Mini {
    /// Right shift that moves f32's sign bit to the code's.
    sign_shift: u32,
    /// 23 - mantissa bits.
    shift: u32,
    /// (127 - bias) << mantissa bits: the exponent re-bias, in code units.
    rebias: u32,
    /// f32 bits of the largest finite value (inputs are clamped to it: saturation).
    max_bits: u32,
    /// f32 bits of the smallest normal.
    min_normal: u32,
    /// A power of two whose f32 ulp is the subnormal quantum: adding it rounds to that quantum.
    magic: f32,
}

const E4M3: Mini = Mini {
    sign_shift: 24,
    shift: 20,
    rebias: 120 << 3,
    max_bits: 0x43e0_0000,   // 448
    min_normal: 0x3c80_0000, // 2^-6
    magic: 16384.0,          // ulp 2^-9
};
const E5M2: Mini = Mini {
    sign_shift: 24,
    shift: 21,
    rebias: 112 << 2,
    max_bits: 0x4760_0000,   // 57344
    min_normal: 0x3880_0000, // 2^-14
    magic: 128.0,            // ulp 2^-16
};
const F16: Mini = Mini {
    sign_shift: 16,
    shift: 13,
    rebias: 112 << 10,
    max_bits: 0x477f_e000,   // 65504
    min_normal: 0x3880_0000, // 2^-14
    magic: 0.5,              // ulp 2^-24
};

#[inline(always)]
fn sel(c: bool, a: u32, b: u32) -> u32 {
    let m = u32::from(c).wrapping_neg();
    (a & m) | (b & !m)
}

/// f32 -> fp8 or fp16 code, round to nearest even, saturating; `y` finite.
#[inline(always)]
fn mini_encode(y: f32, c: Mini) -> u32 {
    let bits = y.to_bits();
    let sign = (bits & 0x8000_0000) >> c.sign_shift;
    let abs = (bits & 0x7fff_ffff).min(c.max_bits);
    let r = abs + (1 << (c.shift - 1)) - 1 + ((abs >> c.shift) & 1);
    let normal = (r >> c.shift).wrapping_sub(c.rebias);
    let sub = (f32::from_bits(abs) + c.magic)
        .to_bits()
        .wrapping_sub(c.magic.to_bits());
    sign | sel(abs < c.min_normal, sub, normal)
}

/// f32 -> int8 code (-127..=127), round to nearest even; `|y| <= 127` up to rounding.
#[inline(always)]
fn int8_encode(y: f32) -> u8 {
    // Adding 1.5 * 2^23 rounds to an integer (ties to even) for |y| < 2^22, which then sits
    // in the low mantissa bits, two's complement from 0x4b40_0000: its low byte is the code.
    // |y| <= 127 (1 + 2^-22) rounds to at most 127, so nothing saturates.
    const MAGIC: f32 = 12_582_912.0;
    (y + MAGIC).to_bits() as u8
}

/// f32 -> int4 code (-7..=7, in the low nibble, two's complement), round to nearest even;
/// `|y| <= 7` up to rounding (as `int8_encode`, whose low nibble it is).
#[inline(always)]
fn int4_encode(y: f32) -> u8 {
    int8_encode(y) & 0x0f
}

/// The value of an int4 code (the low nibble of `c`).
#[inline(always)]
fn int4_value(c: u8) -> f32 {
    f32::from(((c << 4) as i8) >> 4)
}

/// Writes the codes of `x` (multiplied by `mul`) into `out` (`codes_len(x.len())` bytes).
#[inline(always)]
pub fn encode(f: Format, x: &[f32], mul: f32, out: &mut [u8]) {
    match f {
        Format::Off => {}
        Format::Bf16 => {
            for (v, o) in x.iter().zip(out.chunks_exact_mut(2)) {
                o.copy_from_slice(&conv::f32_to_bf16(*v).to_le_bytes());
            }
        }
        Format::Fp16 => {
            for (v, o) in x.iter().zip(out.chunks_exact_mut(2)) {
                o.copy_from_slice(&(mini_encode(*v * mul, F16) as u16).to_le_bytes());
            }
        }
        Format::Fp8E4m3 => {
            for (v, o) in x.iter().zip(out.iter_mut()) {
                *o = mini_encode(*v * mul, E4M3) as u8;
            }
        }
        Format::Fp8E5m2 => {
            for (v, o) in x.iter().zip(out.iter_mut()) {
                *o = mini_encode(*v * mul, E5M2) as u8;
            }
        }
        Format::Int8 => {
            for (v, o) in x.iter().zip(out.iter_mut()) {
                *o = int8_encode(*v * mul);
            }
        }
        // Element 2j in the low nibble of byte j, element 2j + 1 in the high one.
        Format::Int4 => {
            let pairs = x.chunks_exact(2);
            let tail = pairs.remainder();
            for (p, o) in pairs.zip(out.iter_mut()) {
                *o = int4_encode(p[0] * mul) | (int4_encode(p[1] * mul) << 4);
            }
            if let [v] = tail {
                out[x.len() / 2] = int4_encode(*v * mul);
            }
        }
    }
}

/// 2^112: moves an f16 exponent's bias (15) to f32's (127).
const F16_REBIAS: f32 = f32::from_bits((127 + 112) << 23);

/// The value of one code (before the block's scale).
#[inline(always)]
fn decode_one(f: Format, c: &[u8]) -> f32 {
    match f {
        Format::Off => 0.0,
        Format::Bf16 => conv::bf16_to_f32(u16::from_le_bytes([c[0], c[1]])),
        // The encoder writes no infinity or NaN codes, so the code's bits moved to f32's place
        // and multiplied by 2^(127 - 15) are its value, subnormals included (exactly).
        Format::Fp16 => {
            let h = u32::from(u16::from_le_bytes([c[0], c[1]]));
            f32::from_bits(((h & 0x8000) << 16) | ((h & 0x7fff) << 13)) * F16_REBIAS
        }
        Format::Fp8E4m3 => fp8::e4m3_to_f32(c[0]),
        Format::Fp8E5m2 => fp8::e5m2_to_f32(c[0]),
        Format::Int8 => f32::from(c[0] as i8),
        Format::Int4 => int4_value(c[0]),
    }
}

/// `op(&mut out[i], code value i * scale)` over the block's codes; monomorphized per format so
/// each loop is straight-line.
#[inline(always)]
fn decode_with(f: Format, codes: &[u8], scale: f32, out: &mut [f32], op: impl Fn(&mut f32, f32)) {
    macro_rules! each {
        ($w:expr, $fmt:expr) => {
            for (c, o) in codes.chunks_exact($w).zip(out.iter_mut()) {
                op(o, decode_one($fmt, c) * scale)
            }
        };
    }
    match f {
        Format::Off => {}
        // bf16 has no scale: no multiplication, so a NaN or infinity decodes as itself.
        Format::Bf16 => {
            for (c, o) in codes.chunks_exact(2).zip(out.iter_mut()) {
                op(o, decode_one(Format::Bf16, c))
            }
        }
        Format::Fp16 => each!(2, Format::Fp16),
        Format::Fp8E4m3 => each!(1, Format::Fp8E4m3),
        Format::Fp8E5m2 => each!(1, Format::Fp8E5m2),
        Format::Int8 => each!(1, Format::Int8),
        Format::Int4 => {
            let mut pairs = out.chunks_exact_mut(2);
            for (c, o) in codes.iter().zip(&mut pairs) {
                op(&mut o[0], int4_value(*c) * scale);
                op(&mut o[1], int4_value(*c >> 4) * scale);
            }
            if let [o] = pairs.into_remainder() {
                op(o, int4_value(codes[codes.len() - 1]) * scale);
            }
        }
    }
}

/// `out[i] = code value i * scale`.
#[inline(always)]
pub fn decode(f: Format, codes: &[u8], scale: f32, out: &mut [f32]) {
    decode_with(f, codes, scale, out, |o, v| *o = v);
}

/// `acc[i] += code value i * scale` (a multiplication and an addition, never fused, so that
/// every build computes the same bits).
#[inline(always)]
pub fn accumulate(f: Format, codes: &[u8], scale: f32, acc: &mut [f32]) {
    decode_with(f, codes, scale, acc, |o, v| *o += v);
}

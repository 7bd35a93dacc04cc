//! Tests of the reduction kernels against independent references: integers through i128,
//! floats through f64 with a rounding function written here from the formats' definitions.
#![forbid(unsafe_code)]

use super::conv::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use super::fp8::{
    e4m3_to_f32, e5m2_to_f32, f32_to_e4m3, f32_to_e4m3_nosat, f32_to_e5m2, f32_to_e5m2_nosat,
};
use super::*;

// ---------------------------------------------------------------------------------------------
// Helpers

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A binary floating-point format for the reference rounding.
#[derive(Clone, Copy, Debug)]
struct Fmt {
    /// Total bits, mantissa bits (explicit), exponent bias.
    bits: u32,
    man: u32,
    bias: i32,
    /// Largest finite value.
    max: f64,
    /// Saturate (fp8 SATFINITE) instead of overflowing to infinity.
    sat: bool,
    /// Has infinities (all but e4m3).
    has_inf: bool,
}

const FMT_F16: Fmt = Fmt {
    bits: 16,
    man: 10,
    bias: 15,
    max: 65504.0,
    sat: false,
    has_inf: true,
};
const FMT_BF16: Fmt = Fmt {
    bits: 16,
    man: 7,
    bias: 127,
    max: 3.3895313892515355e38,
    sat: false,
    has_inf: true,
};
const FMT_F32: Fmt = Fmt {
    bits: 32,
    man: 23,
    bias: 127,
    max: f32::MAX as f64,
    sat: false,
    has_inf: true,
};
const FMT_E4M3: Fmt = Fmt {
    bits: 8,
    man: 3,
    bias: 7,
    max: 448.0,
    sat: true,
    has_inf: false,
};
const FMT_E5M2: Fmt = Fmt {
    bits: 8,
    man: 2,
    bias: 15,
    max: 57344.0,
    sat: true,
    has_inf: true,
};
const FMT_F64: Fmt = Fmt {
    bits: 64,
    man: 52,
    bias: 1023,
    max: f64::MAX,
    sat: false,
    has_inf: true,
};

fn fmt_of(dt: DataType) -> Option<Fmt> {
    match dt {
        DataType::Float16 => Some(FMT_F16),
        DataType::Bfloat16 => Some(FMT_BF16),
        DataType::Float32 => Some(FMT_F32),
        DataType::Float64 => Some(FMT_F64),
        DataType::Float8E4M3 => Some(FMT_E4M3),
        DataType::Float8E5M2 => Some(FMT_E5M2),
        _ => None,
    }
}

fn pow2(e: i32) -> f64 {
    assert!((-1022..=1023).contains(&e));
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// Rounds `x` to the format, to nearest, ties to even, from the definition: quantum
/// 2^(max(e, emin) - man), overflow (after rounding) to infinity or, saturating, to the largest
/// finite value.
fn round_to(x: f64, f: Fmt) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    if f.bits == 64 {
        return x;
    }
    if x.is_infinite() {
        return if f.sat { f.max.copysign(x) } else { x };
    }
    if x == 0.0 {
        return x;
    }
    let ax = x.abs();
    let e = ((ax.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    let emin = 1 - f.bias;
    let q = pow2(e.max(emin) - f.man as i32);
    let v = (ax / q).round_ties_even() * q;
    let v = if v > f.max {
        if f.sat {
            f.max
        } else {
            f64::INFINITY
        }
    } else {
        v
    };
    v.copysign(x)
}

/// The value of a float code, from the definition.
fn decode_ref(code: u64, f: Fmt) -> f64 {
    let sign = if code >> (f.bits - 1) & 1 == 1 {
        -1.0
    } else {
        1.0
    };
    let ebits = f.bits - 1 - f.man;
    let e = ((code >> f.man) & ((1 << ebits) - 1)) as i32;
    let m = (code & ((1 << f.man) - 1)) as f64;
    let emax_field = (1 << ebits) - 1;
    if f.has_inf && e == emax_field {
        return if m == 0.0 {
            sign * f64::INFINITY
        } else {
            f64::NAN
        };
    }
    if !f.has_inf && e == emax_field && m as u64 == (1 << f.man) - 1 {
        return f64::NAN;
    }
    let frac = m / (1u64 << f.man) as f64;
    if e == 0 {
        sign * frac * pow2(1 - f.bias)
    } else {
        sign * (1.0 + frac) * pow2(e - f.bias)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum V {
    I(i128),
    F(f64),
}

fn get(dt: DataType, buf: &[u8], i: usize) -> V {
    let s = dt.size();
    let b = &buf[i * s..(i + 1) * s];
    match dt {
        DataType::Int8 => V::I(b[0] as i8 as i128),
        DataType::Uint8 => V::I(b[0] as i128),
        DataType::Int32 => V::I(i32::from_ne_bytes(b.try_into().unwrap()) as i128),
        DataType::Uint32 => V::I(u32::from_ne_bytes(b.try_into().unwrap()) as i128),
        DataType::Int64 => V::I(i64::from_ne_bytes(b.try_into().unwrap()) as i128),
        DataType::Uint64 => V::I(u64::from_ne_bytes(b.try_into().unwrap()) as i128),
        DataType::Float16 => V::F(f16_to_f32(u16::from_ne_bytes(b.try_into().unwrap())) as f64),
        DataType::Bfloat16 => V::F(bf16_to_f32(u16::from_ne_bytes(b.try_into().unwrap())) as f64),
        DataType::Float32 => V::F(f32::from_ne_bytes(b.try_into().unwrap()) as f64),
        DataType::Float64 => V::F(f64::from_ne_bytes(b.try_into().unwrap())),
        DataType::Float8E4M3 => V::F(e4m3_to_f32(b[0]) as f64),
        DataType::Float8E5M2 => V::F(e5m2_to_f32(b[0]) as f64),
    }
}

fn code_at(dt: DataType, buf: &[u8], i: usize) -> u64 {
    let s = dt.size();
    let mut c = [0u8; 8];
    c[..s].copy_from_slice(&buf[i * s..(i + 1) * s]);
    u64::from_le_bytes(c)
}

fn canonical_nan(dt: DataType) -> u64 {
    match dt {
        DataType::Float16 => 0x7e00,
        DataType::Bfloat16 => 0x7fc0,
        DataType::Float32 => 0x7fc0_0000,
        DataType::Float64 => 0x7ff8_0000_0000_0000,
        DataType::Float8E4M3 => 0x7f,
        DataType::Float8E5M2 => 0x7e,
        _ => unreachable!(),
    }
}

fn wrap(dt: DataType, v: i128) -> i128 {
    match dt {
        DataType::Int8 => v as i8 as i128,
        DataType::Uint8 => v as u8 as i128,
        DataType::Int32 => v as i32 as i128,
        DataType::Uint32 => v as u32 as i128,
        DataType::Int64 => v as i64 as i128,
        DataType::Uint64 => v as u64 as i128,
        _ => unreachable!(),
    }
}

fn ref_max(x: f64, y: f64) -> f64 {
    match (x.is_nan(), y.is_nan()) {
        (true, true) => f64::NAN,
        (true, false) => y,
        (false, true) => x,
        _ if x == 0.0 && y == 0.0 => {
            if x.is_sign_positive() || y.is_sign_positive() {
                0.0
            } else {
                -0.0
            }
        }
        _ => {
            if x > y {
                x
            } else {
                y
            }
        }
    }
}

fn ref_min(x: f64, y: f64) -> f64 {
    match (x.is_nan(), y.is_nan()) {
        (true, true) => f64::NAN,
        (true, false) => y,
        (false, true) => x,
        _ if x == 0.0 && y == 0.0 => {
            if x.is_sign_negative() || y.is_sign_negative() {
                -0.0
            } else {
                0.0
            }
        }
        _ => {
            if x < y {
                x
            } else {
                y
            }
        }
    }
}

/// The expected `x op y` of type `dt`.
fn reference(dt: DataType, op: RedOp, x: V, y: V) -> V {
    match (x, y) {
        (V::I(x), V::I(y)) => V::I(wrap(
            dt,
            match op {
                RedOp::Sum | RedOp::Avg => x + y,
                RedOp::Prod => x.wrapping_mul(y),
                RedOp::Max => x.max(y),
                RedOp::Min => x.min(y),
                // i128 holds each type's value sign- or zero-extended: its bits are the type's.
                RedOp::BAnd => x & y,
                RedOp::BOr => x | y,
                RedOp::BXor => x ^ y,
            },
        )),
        (V::F(x), V::F(y)) => {
            let r = match op {
                RedOp::Sum | RedOp::Avg => x + y,
                RedOp::Prod => x * y,
                RedOp::Max => ref_max(x, y),
                RedOp::Min => ref_min(x, y),
                RedOp::BAnd | RedOp::BOr | RedOp::BXor => unreachable!("{op} on {dt}"),
            };
            V::F(round_to(r, fmt_of(dt).unwrap()))
        }
        _ => unreachable!(),
    }
}

/// Checks element `i` of `buf` against the expected value: equal integers; equal float bits
/// (so -0 and +0 differ) or, for NaN, the canonical NaN code.
fn check_elem(dt: DataType, buf: &[u8], i: usize, expected: V, what: &dyn Fn() -> String) {
    match (get(dt, buf, i), expected) {
        (V::I(g), V::I(e)) => assert_eq!(g, e, "{dt} element {i}: {}", what()),
        (V::F(g), V::F(e)) => {
            if e.is_nan() {
                assert_eq!(
                    code_at(dt, buf, i),
                    canonical_nan(dt),
                    "{dt} element {i}: want canonical NaN; {}",
                    what()
                );
            } else {
                assert_eq!(
                    g.to_bits(),
                    e.to_bits(),
                    "{dt} element {i}: got {g:e}, want {e:e}; {}",
                    what()
                );
            }
        }
        _ => unreachable!(),
    }
}

/// A random float code of the format: all bit patterns, values near 1 (so sums round), the
/// subnormal and overflow ends, and specials.
fn float_code(rng: &mut Rng, f: Fmt) -> u64 {
    let ebits = f.bits - 1 - f.man;
    let emax_field = (1u64 << ebits) - 1;
    let mask = if f.bits == 64 {
        u64::MAX
    } else {
        (1u64 << f.bits) - 1
    };
    let sign = (rng.next() & 1) << (f.bits - 1);
    let man = rng.next() & ((1 << f.man) - 1);
    let with_exp = |e: u64| sign | (e << f.man) | man;
    match rng.below(20) {
        0..=4 => rng.next() & mask,
        5..=13 => with_exp((f.bias as i64 + rng.below(7) as i64 - 3) as u64),
        14 | 15 => with_exp(rng.below(3)),
        16 => with_exp(emax_field - 1 - rng.below(2)),
        17 => sign | (emax_field << f.man), // infinity (e4m3: 256 or 480 → NaN code if man=7)
        18 => sign,                         // ±0
        _ => sign | (emax_field << f.man) | man | 1, // NaN (e4m3: maybe a finite code)
    }
}

/// `n` random elements of `dt`.
fn random_elems(rng: &mut Rng, dt: DataType, n: usize) -> Vec<u8> {
    let s = dt.size();
    let mut out = Vec::with_capacity(n * s);
    for _ in 0..n {
        let c = match fmt_of(dt) {
            Some(f) => float_code(rng, f),
            None => match rng.below(4) {
                0 => rng.below(9).wrapping_sub(4), // small, both signs
                1 => [0u64, u64::MAX, 1 << (8 * s - 1), (1 << (8 * s - 1)) - 1]
                    [rng.below(4) as usize],
                _ => rng.next(),
            },
        };
        out.extend_from_slice(&c.to_le_bytes()[..s]);
    }
    out
}

/// `data` copied to offset `off` of a fresh buffer (unaligned views).
fn at_offset(data: &[u8], off: usize) -> Vec<u8> {
    let mut v = vec![0xa5; off];
    v.extend_from_slice(data);
    v
}

// ---------------------------------------------------------------------------------------------
// Types

#[test]
fn datatype_values_names_sizes() {
    for (i, dt) in DataType::ALL.iter().enumerate() {
        assert_eq!(dt.to_nccl(), i as i32);
        assert_eq!(DataType::from_nccl(i as i32), Some(*dt));
        assert_eq!(DataType::from_name(dt.name()), Some(*dt));
        assert_eq!(DataType::from_name(&dt.name().to_uppercase()), Some(*dt));
    }
    assert_eq!(DataType::from_nccl(12), None);
    assert_eq!(DataType::from_nccl(-1), None);
    let sizes: Vec<usize> = DataType::ALL.iter().map(|d| d.size()).collect();
    assert_eq!(sizes, [1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1]);
    let names: Vec<&str> = DataType::ALL.iter().map(|d| d.name()).collect();
    assert_eq!(
        names,
        [
            "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double",
            "bfloat16", "fp8_e4m3", "fp8_e5m2"
        ]
    );
    for (name, dt) in [
        ("float", DataType::Float32),
        ("f32", DataType::Float32),
        ("ncclFloat", DataType::Float32),
        ("half", DataType::Float16),
        ("f16", DataType::Float16),
        ("ncclFloat16", DataType::Float16),
        ("bf16", DataType::Bfloat16),
        ("ncclBfloat16", DataType::Bfloat16),
        ("int", DataType::Int32),
        ("ncclInt", DataType::Int32),
        ("char", DataType::Int8),
        ("double", DataType::Float64),
        ("f64", DataType::Float64),
        ("f8e4m3", DataType::Float8E4M3),
        ("ncclFloat8e4m3", DataType::Float8E4M3),
        ("f8e5m2", DataType::Float8E5M2),
        ("e5m2", DataType::Float8E5M2),
        ("u64", DataType::Uint64),
    ] {
        assert_eq!(DataType::from_name(name), Some(dt), "{name}");
    }
    assert_eq!(DataType::from_name("float128"), None);
    assert_eq!(DataType::from_name(""), None);
    assert!(DataType::Float8E5M2.is_float() && !DataType::Uint64.is_float());
}

#[test]
fn redop_values_names() {
    for (i, op) in RedOp::ALL.iter().enumerate() {
        assert_eq!(op.to_nccl(), i as i32);
        assert_eq!(RedOp::from_c(i as i32), Some(*op));
        let nccl = (i < 5).then_some(*op);
        assert_eq!(RedOp::from_nccl(i as i32), nccl);
        assert_eq!(RedOp::from_name(op.name()), Some(*op));
    }
    let names: Vec<&str> = RedOp::ALL.iter().map(|o| o.name()).collect();
    assert_eq!(
        names,
        ["sum", "prod", "max", "min", "avg", "band", "bor", "bxor"]
    );
    // NCCL's values 5 and up are user-created ops, never the bitwise ones.
    assert_eq!(RedOp::NCCL[..], RedOp::ALL[..5]);
    for v in [5, 6, 7, 8, -1] {
        assert_eq!(RedOp::from_nccl(v), None);
    }
    assert_eq!(RedOp::from_c(7), Some(RedOp::BXor));
    assert_eq!(RedOp::from_c(8), None);
    assert_eq!(RedOp::from_name("BXor"), Some(RedOp::BXor));
    assert_eq!(RedOp::from_name("ncclSum"), Some(RedOp::Sum));
    assert_eq!(RedOp::from_name("MAX"), Some(RedOp::Max));
    assert_eq!(RedOp::from_name("premulsum"), None);
}

// ---------------------------------------------------------------------------------------------
// Conversions

/// Decoding every code agrees with the definition, and encoding gives the code back.
fn check_all_codes(
    f: Fmt,
    dec: impl Fn(u32) -> f32,
    enc: impl Fn(f32) -> u32,
    canon: Option<u32>,
    roundtrip_inf: bool,
) {
    for c in 0..(1u32 << f.bits) {
        let want = decode_ref(c as u64, f);
        let got = dec(c);
        if want.is_nan() {
            assert!(got.is_nan(), "code {c:#x}");
            match canon {
                // fp8: every NaN encodes to the one canonical NaN.
                Some(canon) => assert_eq!(
                    enc(got),
                    canon,
                    "NaN code {c:#x} encodes to the canonical NaN"
                ),
                // f16 / bf16: NaN stays NaN (payload kept).
                None => assert!(decode_ref(enc(got) as u64, f).is_nan(), "NaN code {c:#x}"),
            }
            continue;
        }
        assert_eq!((got as f64).to_bits(), want.to_bits(), "code {c:#x}");
        if got.is_infinite() && !roundtrip_inf {
            continue;
        }
        assert_eq!(enc(got), c, "round trip of code {c:#x} ({got})");
    }
}

/// Around every pair of adjacent finite codes: the midpoint rounds to the even code, the f32
/// values just off it to the nearer code.
fn check_midpoints(f: Fmt, dec: impl Fn(u32) -> f32, enc: impl Fn(f32) -> u32) {
    let sign = 1u32 << (f.bits - 1);
    let mut c = 0u32;
    loop {
        let (lo, hi) = (dec(c), dec(c + 1));
        if !hi.is_finite() || (hi as f64) > f.max {
            break;
        }
        let mid = ((lo as f64 + hi as f64) / 2.0) as f32;
        assert_eq!(
            mid as f64,
            (lo as f64 + hi as f64) / 2.0,
            "midpoint exact in f32"
        );
        let even = if c.is_multiple_of(2) { c } else { c + 1 };
        for (x, want) in [
            (mid, even),
            (f32::from_bits(mid.to_bits() - 1), c),
            (f32::from_bits(mid.to_bits() + 1), c + 1),
            (lo, c),
            (hi, c + 1),
        ] {
            assert_eq!(enc(x), want, "{x:e} between codes {c:#x} and {:#x}", c + 1);
            assert_eq!(enc(-x), want | sign, "{:e}", -x);
        }
        c += 1;
    }
}

#[test]
fn f16_all_codes_and_midpoints() {
    check_all_codes(
        FMT_F16,
        |c| f16_to_f32(c as u16),
        |x| f32_to_f16(x) as u32,
        None,
        true,
    );
    check_midpoints(FMT_F16, |c| f16_to_f32(c as u16), |x| f32_to_f16(x) as u32);
    // Overflow: 65504 is the largest; the midpoint to 65536 (65520) ties to even: infinity.
    assert_eq!(f32_to_f16(65519.996), 0x7bff);
    assert_eq!(f32_to_f16(65520.0), 0x7c00);
    assert_eq!(f32_to_f16(-1e30), 0xfc00);
    assert_eq!(f32_to_f16(f32::INFINITY), 0x7c00);
    // Below half the smallest subnormal: zero, sign kept; the tie at exactly half: zero (even).
    assert_eq!(f32_to_f16(2f32.powi(-25)), 0);
    assert_eq!(f32_to_f16(f32::from_bits(2f32.powi(-25).to_bits() + 1)), 1);
    assert_eq!(f32_to_f16(-1e-30), 0x8000);
    assert_eq!(f32_to_f16(f32::from_bits(1)), 0);
}

#[test]
fn bf16_all_codes_and_midpoints() {
    check_all_codes(
        FMT_BF16,
        |c| bf16_to_f32(c as u16),
        |x| f32_to_bf16(x) as u32,
        None,
        true,
    );
    check_midpoints(
        FMT_BF16,
        |c| bf16_to_f32(c as u16),
        |x| f32_to_bf16(x) as u32,
    );
    assert_eq!(f32_to_bf16(f32::MAX), 0x7f80); // rounds past the largest bf16: infinity
    assert_eq!(f32_to_bf16(f32::from_bits(0x7f7f_7fff)), 0x7f7f);
    assert_eq!(f32_to_bf16(f32::from_bits(0x7f7f_8000)), 0x7f80); // tie, odd: up to infinity
    assert_eq!(f32_to_bf16(f32::from_bits(0x0000_8000)), 0); // subnormal tie to even
    assert_eq!(f32_to_bf16(f32::from_bits(0x0001_8000)), 2);
}

#[test]
fn e4m3_all_codes_midpoints_saturation() {
    let dec = |c: u32| e4m3_to_f32(c as u8);
    check_all_codes(FMT_E4M3, dec, |x| f32_to_e4m3(x) as u32, Some(0x7f), true);
    check_all_codes(
        FMT_E4M3,
        dec,
        |x| f32_to_e4m3_nosat(x) as u32,
        Some(0x7f),
        true,
    );
    check_midpoints(FMT_E4M3, dec, |x| f32_to_e4m3(x) as u32);
    check_midpoints(FMT_E4M3, dec, |x| f32_to_e4m3_nosat(x) as u32);
    assert_eq!(e4m3_to_f32(0x7e), 448.0);
    assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
    assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
    assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
    // S.1111.000 is a number, not infinity.
    assert_eq!(e4m3_to_f32(0x78), 256.0);
    // SATFINITE: above 448 (infinity included) -> ±448; NaN -> 0x7f.
    for x in [448.5f32, 463.9, 464.0, 480.0, 1e6, f32::MAX, f32::INFINITY] {
        assert_eq!(f32_to_e4m3(x), 0x7e, "{x}");
        assert_eq!(f32_to_e4m3(-x), 0xfe, "{x}");
    }
    assert_eq!(f32_to_e4m3(f32::NAN), 0x7f);
    assert_eq!(f32_to_e4m3(-f32::NAN), 0x7f);
    // NOSAT: rounds first; above 448 after rounding -> NaN. 464 ties between 448 (even
    // mantissa 110) and 480: 448.
    assert_eq!(f32_to_e4m3_nosat(464.0), 0x7e);
    assert_eq!(f32_to_e4m3_nosat(464.1), 0x7f);
    assert_eq!(f32_to_e4m3_nosat(-1e6), 0x7f);
    assert_eq!(f32_to_e4m3_nosat(f32::INFINITY), 0x7f);
    // Underflow: half the smallest subnormal ties to zero; just above goes to it.
    assert_eq!(f32_to_e4m3(2f32.powi(-10)), 0);
    assert_eq!(f32_to_e4m3(f32::from_bits(2f32.powi(-10).to_bits() + 1)), 1);
    assert_eq!(f32_to_e4m3(-2f32.powi(-11)), 0x80);
    assert_eq!(f32_to_e4m3(1.5 * 2f32.powi(-9)), 2); // tie between 1 and 2 subnormal: even
}

#[test]
fn e5m2_all_codes_midpoints_saturation() {
    let dec = |c: u32| e5m2_to_f32(c as u8);
    // SATFINITE maps the infinity codes to ±57344, so their round trip is checked only NOSAT.
    check_all_codes(FMT_E5M2, dec, |x| f32_to_e5m2(x) as u32, Some(0x7e), false);
    check_all_codes(
        FMT_E5M2,
        dec,
        |x| f32_to_e5m2_nosat(x) as u32,
        Some(0x7e),
        true,
    );
    check_midpoints(FMT_E5M2, dec, |x| f32_to_e5m2(x) as u32);
    check_midpoints(FMT_E5M2, dec, |x| f32_to_e5m2_nosat(x) as u32);
    assert_eq!(e5m2_to_f32(0x7b), 57344.0);
    assert_eq!(e5m2_to_f32(0x7c), f32::INFINITY);
    assert_eq!(e5m2_to_f32(0xfc), f32::NEG_INFINITY);
    assert_eq!(e5m2_to_f32(0x01), 2f32.powi(-16));
    for c in [0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff] {
        assert!(e5m2_to_f32(c).is_nan());
    }
    for x in [57345.0f32, 61439.0, 61440.0, 1e9, f32::INFINITY] {
        assert_eq!(f32_to_e5m2(x), 0x7b, "{x}");
        assert_eq!(f32_to_e5m2(-x), 0xfb, "{x}");
    }
    assert_eq!(f32_to_e5m2(f32::NAN), 0x7e);
    assert_eq!(f32_to_e5m2_nosat(61439.0), 0x7b);
    assert_eq!(f32_to_e5m2_nosat(61440.0), 0x7c); // tie, odd mantissa: up to infinity
    assert_eq!(f32_to_e5m2_nosat(-1e9), 0xfc);
    assert_eq!(f32_to_e5m2(2f32.powi(-17)), 0);
    assert_eq!(f32_to_e5m2(-3.0 * 2f32.powi(-17)), 0x82);
}

/// f32 -> each format on a sweep of f32 patterns, against the reference rounding.
#[test]
fn encoders_match_reference_on_f32_sweep() {
    let mut rng = Rng(7);
    let mut xs: Vec<f32> = (0..(1u64 << 32))
        .step_by(4099)
        .map(|b| f32::from_bits(b as u32))
        .collect();
    xs.extend((0..200_000).map(|_| f32::from_bits(rng.next() as u32)));
    type Enc = fn(f32) -> u64;
    let encs: [(Fmt, Enc, u64); 4] = [
        (FMT_F16, |x| f32_to_f16(x) as u64, 0x7e00),
        (FMT_BF16, |x| f32_to_bf16(x) as u64, 0x7fc0),
        (FMT_E4M3, |x| f32_to_e4m3(x) as u64, 0x7f),
        (FMT_E5M2, |x| f32_to_e5m2(x) as u64, 0x7e),
    ];
    for (f, enc, _) in encs {
        for &x in &xs {
            let got = enc(x);
            let want = round_to(x as f64, f);
            if want.is_nan() {
                // f16 / bf16 keep the NaN's sign and payload top bits; fp8 gives its one NaN.
                assert!(decode_ref(got, f).is_nan(), "{f:?} {x:e}");
            } else {
                assert_eq!(
                    decode_ref(got, f).to_bits(),
                    want.to_bits(),
                    "{f:?} {x:e}: code {got:#x}"
                );
            }
        }
    }
    for (f, enc, canon) in encs {
        if f.bits == 8 {
            assert_eq!(enc(f32::from_bits(0xffc1_2345)), canon);
        }
    }
}

/// The scalar f16 conversions give F16C's bits (NaNs: both NaN).
#[cfg(target_arch = "x86_64")]
#[test]
fn f16_conversions_match_f16c() {
    let codes: Vec<u16> = (0..=u16::MAX).collect();
    let Some(hw) = super::simd::hw::f16_to_f32(&codes) else {
        return crate::testing::skip("f16_conversions_match_f16c", "this CPU has no F16C");
    };
    for (&c, &h) in codes.iter().zip(&hw) {
        let s = f16_to_f32(c);
        assert!(
            s.to_bits() == h.to_bits() || (s.is_nan() && h.is_nan()),
            "{c:#x}"
        );
    }
    let mut rng = Rng(3);
    let mut xs: Vec<f32> = (0..(1u64 << 32))
        .step_by(1021)
        .map(|b| f32::from_bits(b as u32))
        .collect();
    // Dense around the f16 range: every pattern with the low 9 bits random.
    xs.extend(
        (0x3300_0000u32..0x4790_0000)
            .step_by(512)
            .map(|b| f32::from_bits(b | (rng.next() as u32 & 0x1ff))),
    );
    let hw = super::simd::hw::f32_to_f16(&xs).unwrap();
    for (&x, &h) in xs.iter().zip(&hw) {
        let s = f32_to_f16(x);
        assert!(
            s == h || (x.is_nan() && s & 0x7fff > 0x7c00 && h & 0x7fff > 0x7c00),
            "{x:e}: {s:#x} vs F16C {h:#x}"
        );
    }
}

/// Every f32 pattern against F16C (about a minute): `cargo test --release -- --ignored f16c_exhaustive`.
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore]
fn f16c_exhaustive() {
    let mut block = Vec::with_capacity(1 << 24);
    for hi in 0..256u32 {
        block.clear();
        block.extend((0..1u32 << 24).map(|lo| f32::from_bits(hi << 24 | lo)));
        let Some(hw) = super::simd::hw::f32_to_f16(&block) else {
            return;
        };
        for (&x, &h) in block.iter().zip(&hw) {
            let s = f32_to_f16(x);
            assert!(
                s == h || (x.is_nan() && s & 0x7fff > 0x7c00 && h & 0x7fff > 0x7c00),
                "{x:e}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Kernels against the reference

/// Every dtype x op on random data: `reduce` against the reference element by element, and
/// `reduce_inplace` and the pure scalar path against `reduce`, bit for bit, at unaligned offsets.
#[test]
fn every_dtype_and_op_matches_reference() {
    let mut rng = Rng(42);
    for dt in DataType::ALL {
        for op in RedOp::ALL {
            for &n in &[0usize, 1, 7, 8, 15, 16, 17, 33, 100, 1000, 4099] {
                let s = dt.size();
                let (oa, ob, od) = (
                    rng.below(4) as usize,
                    rng.below(4) as usize,
                    rng.below(4) as usize,
                );
                let a = at_offset(&random_elems(&mut rng, dt, n), oa);
                let b = at_offset(&random_elems(&mut rng, dt, n), ob);
                let (a, b) = (&a[oa..], &b[ob..]);
                let mut dbuf = vec![0x5a; od + n * s];
                let dst = &mut dbuf[od..];
                if !op.supports(dt) {
                    let e = reduce(dt, op, a, b, dst).unwrap_err();
                    assert_eq!(e, ReduceError::Unsupported { op, dtype: dt });
                    continue;
                }
                reduce(dt, op, a, b, dst).unwrap();
                for i in 0..n {
                    let (x, y) = (get(dt, a, i), get(dt, b, i));
                    check_elem(dt, dst, i, reference(dt, op, x, y), &|| {
                        format!("{op} of {x:?} and {y:?}")
                    });
                }
                let mut acc = at_offset(a, od);
                reduce_inplace(dt, op, &mut acc[od..], b).unwrap();
                assert_eq!(
                    &acc[od..],
                    &dst[..],
                    "{dt} {op} n={n}: reduce_inplace differs from reduce"
                );
                let mut sc = vec![0u8; n * s];
                binary(dt, Kind::of(op), a, b, &mut sc, false);
                assert_eq!(sc, dst, "{dt} {op} n={n}: scalar path differs");
                let mut sc = a.to_vec();
                inplace(dt, Kind::of(op), &mut sc, b, false);
                assert_eq!(sc, dst, "{dt} {op} n={n}: scalar in-place path differs");
            }
        }
    }
}

/// The SIMD kernels (f32, f16, bf16) against the scalar reference, bit for bit: every length up
/// to 70 and some larger, every offset combination, binary and in place; NaN, inf, ±0 and
/// subnormals included (random codes).
#[test]
fn simd_matches_scalar_bit_exact() {
    let mut rng = Rng(1234);
    for dt in [DataType::Float32, DataType::Float16, DataType::Bfloat16] {
        let s = dt.size();
        for k in [Kind::Sum, Kind::Prod, Kind::Max, Kind::Min] {
            let lens = (0..=70).chain([127, 128, 129, 1000, 4096 + 13]);
            for n in lens {
                for off in 0..8 {
                    let (oa, ob, od) = (off & 1, (off >> 1) & 1, (off >> 2) * 3);
                    let a = at_offset(&random_elems(&mut rng, dt, n), oa);
                    let b = at_offset(&random_elems(&mut rng, dt, n), ob);
                    let (a, b) = (&a[oa..], &b[ob..]);
                    let mut want = vec![0u8; n * s];
                    binary(dt, k, a, b, &mut want, false);
                    let mut got = vec![0u8; od + n * s];
                    binary(dt, k, a, b, &mut got[od..], true);
                    assert_eq!(&got[od..], &want[..], "{dt} {k:?} n={n} off={off}");
                    let mut acc = at_offset(a, od);
                    inplace(dt, k, &mut acc[od..], b, true);
                    assert_eq!(&acc[od..], &want[..], "{dt} {k:?} n={n} off={off} in place");
                }
            }
        }
        for n in [0usize, 5, 8, 9, 31, 1000] {
            for d in [1usize, 2, 3, 7, 1000] {
                let data = random_elems(&mut rng, dt, n);
                let mut want = data.clone();
                scale(dt, &mut want, d, false);
                let mut got = at_offset(&data, 1);
                scale(dt, &mut got[1..], d, true);
                assert_eq!(&got[1..], &want[..], "{dt} scale n={n} d={d}");
            }
        }
    }
}

/// fp8: the 64 KiB tables equal the scalar reference for every pair of codes, and the reference
/// equals the f64 reference.
#[test]
fn fp8_every_pair_of_codes() {
    let a: Vec<u8> = (0..=0xffffu32).map(|i| (i >> 8) as u8).collect();
    let b: Vec<u8> = (0..=0xffffu32).map(|i| i as u8).collect();
    for dt in [DataType::Float8E4M3, DataType::Float8E5M2] {
        for op in [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min] {
            let mut fast = vec![0u8; a.len()];
            reduce(dt, op, &a, &b, &mut fast).unwrap();
            let mut slow = vec![0u8; a.len()];
            binary(dt, Kind::of(op), &a, &b, &mut slow, false);
            assert_eq!(fast, slow, "{dt} {op}: fast path");
            let t = fp8_table(dt, Kind::of(op));
            assert_eq!(t, &slow[..], "{dt} {op}: table");
            for i in 0..a.len() {
                let (x, y) = (get(dt, &a, i), get(dt, &b, i));
                check_elem(dt, &fast, i, reference(dt, op, x, y), &|| {
                    format!("{op} of {x:?} and {y:?}")
                });
            }
        }
    }
}

/// Every op is commutative bit for bit (canonical NaN, +0 > -0), on every type.
#[test]
fn ops_commute_bitwise() {
    let mut rng = Rng(99);
    for dt in DataType::ALL {
        let ops = RedOp::ALL
            .into_iter()
            .filter(|&o| o != RedOp::Avg && o.supports(dt));
        for op in ops {
            let a = random_elems(&mut rng, dt, 2000);
            let b = random_elems(&mut rng, dt, 2000);
            let mut ab = vec![0u8; a.len()];
            let mut ba = vec![0u8; a.len()];
            reduce(dt, op, &a, &b, &mut ab).unwrap();
            reduce(dt, op, &b, &a, &mut ba).unwrap();
            assert_eq!(ab, ba, "{dt} {op}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Edge cases

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn to_f32s(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_ne_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn float_nan_inf_zero_rules() {
    let nan_payload = f32::from_bits(0xffc1_2345); // negative NaN with a payload
    let inf = f32::INFINITY;
    // (a, b, sum, prod, max, min); None = canonical NaN.
    #[allow(clippy::type_complexity)]
    let cases: [(f32, f32, Option<f32>, Option<f32>, Option<f32>, Option<f32>); 8] = [
        (inf, -inf, None, Some(-inf), Some(inf), Some(-inf)),
        (nan_payload, 1.0, None, None, Some(1.0), Some(1.0)),
        (1.0, nan_payload, None, None, Some(1.0), Some(1.0)),
        (nan_payload, f32::NAN, None, None, None, None),
        (-0.0, 0.0, Some(0.0), Some(-0.0), Some(0.0), Some(-0.0)),
        (0.0, -0.0, Some(0.0), Some(-0.0), Some(0.0), Some(-0.0)),
        (0.0, inf, Some(inf), None, Some(inf), Some(0.0)),
        (
            f32::MAX,
            f32::MAX,
            Some(inf),
            Some(inf),
            Some(f32::MAX),
            Some(f32::MAX),
        ),
    ];
    // Repeat each case 19 times so the SIMD body and the scalar tail both see it.
    for (x, y, sum, prod, max, min) in cases {
        let a = f32s(&[x; 19]);
        let b = f32s(&[y; 19]);
        for (op, want) in [
            (RedOp::Sum, sum),
            (RedOp::Prod, prod),
            (RedOp::Max, max),
            (RedOp::Min, min),
        ] {
            let want = want.map_or(0x7fc0_0000, f32::to_bits);
            let mut d = vec![0u8; a.len()];
            reduce(DataType::Float32, op, &a, &b, &mut d).unwrap();
            assert_eq!(to_f32s(&d), vec![want; 19], "{x} {op} {y}");
            for dt in [DataType::Float16, DataType::Bfloat16] {
                let enc = |v: f32| {
                    if dt == DataType::Float16 {
                        f32_to_f16(v)
                    } else {
                        f32_to_bf16(v)
                    }
                };
                let a16: Vec<u8> = (0..19).flat_map(|_| enc(x).to_ne_bytes()).collect();
                let b16: Vec<u8> = (0..19).flat_map(|_| enc(y).to_ne_bytes()).collect();
                let mut d16 = vec![0u8; a16.len()];
                reduce(dt, op, &a16, &b16, &mut d16).unwrap();
                let w = enc(f32::from_bits(want));
                for c in d16.chunks_exact(2) {
                    assert_eq!(
                        u16::from_ne_bytes(c.try_into().unwrap()),
                        w,
                        "{dt} {x} {op} {y}"
                    );
                }
            }
        }
    }
    // f64
    let a: Vec<u8> = f64::from_bits(0xfff8_0000_0000_0123).to_ne_bytes().to_vec();
    let b: Vec<u8> = 2.0f64.to_ne_bytes().to_vec();
    let mut d = vec![0u8; 8];
    reduce(DataType::Float64, RedOp::Sum, &a, &b, &mut d).unwrap();
    assert_eq!(
        u64::from_ne_bytes(d.clone().try_into().unwrap()),
        0x7ff8_0000_0000_0000
    );
    reduce(DataType::Float64, RedOp::Min, &a, &b, &mut d).unwrap();
    assert_eq!(f64::from_ne_bytes(d.try_into().unwrap()), 2.0);
}

#[test]
fn fp8_saturates_and_canonicalizes() {
    let e4 = DataType::Float8E4M3;
    let e5 = DataType::Float8E5M2;
    let mut d = [0u8; 4];
    // 448 + 448 saturates; -448 * 2 saturates; NaN + 1 -> canonical NaN; max(NaN, 1) = 1.
    reduce(
        e4,
        RedOp::Sum,
        &[0x7e, 0xfe, 0xff, 0x7f],
        &[0x7e, 0xfe, 0x38, 0x7f],
        &mut d,
    )
    .unwrap();
    assert_eq!(d, [0x7e, 0xfe, 0x7f, 0x7f]);
    reduce(
        e4,
        RedOp::Max,
        &[0xff, 0x38, 0x00, 0x80],
        &[0x38, 0xff, 0x80, 0x00],
        &mut d,
    )
    .unwrap();
    assert_eq!(d, [0x38, 0x38, 0x00, 0x00]);
    reduce(
        e4,
        RedOp::Min,
        &[0xff, 0x38, 0x00, 0x80],
        &[0x38, 0xff, 0x80, 0x00],
        &mut d,
    )
    .unwrap();
    assert_eq!(d, [0x38, 0x38, 0x80, 0x80]);
    // e5m2: inf + 1 -> 57344 (SATFINITE); inf + -inf -> NaN; 57344 + 57344 -> 57344.
    reduce(
        e5,
        RedOp::Sum,
        &[0x7c, 0x7c, 0x7b, 0xfc],
        &[0x3c, 0xfc, 0x7b, 0x3c],
        &mut d,
    )
    .unwrap();
    assert_eq!(d, [0x7b, 0x7e, 0x7b, 0xfb]);
    // 1 + 1 = 2 exactly; 1.5 (e4m3 0x3c) + 0.0625 (0x18) = 1.5625: tie between 1.5 and 1.625
    // -> 1.5 (even); 1.5 + 0.25 (0x28) = 1.75.
    reduce(
        e4,
        RedOp::Sum,
        &[0x38, 0x3c, 0x3c, 0x00],
        &[0x38, 0x18, 0x28, 0x00],
        &mut d,
    )
    .unwrap();
    assert_eq!(d, [0x40, 0x3c, 0x3e, 0x00]);
}

#[test]
fn integers_wrap() {
    let mut d = [0u8; 2];
    reduce(DataType::Int8, RedOp::Sum, &[127, 0x80], &[1, 0xff], &mut d).unwrap();
    assert_eq!(d, [0x80, 0x7f]); // 127 + 1 = -128; -128 + -1 = 127
    reduce(DataType::Uint8, RedOp::Prod, &[16, 255], &[16, 255], &mut d).unwrap();
    assert_eq!(d, [0, 1]);
    let mut d = [0u8; 8];
    reduce(
        DataType::Int64,
        RedOp::Prod,
        &i64::MIN.to_ne_bytes(),
        &(-1i64).to_ne_bytes(),
        &mut d,
    )
    .unwrap();
    assert_eq!(i64::from_ne_bytes(d), i64::MIN);
    reduce(
        DataType::Uint64,
        RedOp::Sum,
        &u64::MAX.to_ne_bytes(),
        &2u64.to_ne_bytes(),
        &mut d,
    )
    .unwrap();
    assert_eq!(u64::from_ne_bytes(d), 1);
    let mut d = [0u8; 4];
    reduce(
        DataType::Int32,
        RedOp::Sum,
        &i32::MAX.to_ne_bytes(),
        &i32::MAX.to_ne_bytes(),
        &mut d,
    )
    .unwrap();
    assert_eq!(i32::from_ne_bytes(d), -2);
    reduce(
        DataType::Uint32,
        RedOp::Max,
        &u32::MAX.to_ne_bytes(),
        &1u32.to_ne_bytes(),
        &mut d,
    )
    .unwrap();
    assert_eq!(u32::from_ne_bytes(d), u32::MAX);
    reduce(
        DataType::Int32,
        RedOp::Min,
        &(-1i32).to_ne_bytes(),
        &1i32.to_ne_bytes(),
        &mut d,
    )
    .unwrap();
    assert_eq!(i32::from_ne_bytes(d), -1);
}

#[test]
fn avg_scaling() {
    let mut rng = Rng(5);
    for dt in DataType::ALL {
        for &n in &[1usize, 2, 3, 7, 8, 100, 1 << 20, usize::MAX] {
            let data = random_elems(&mut rng, dt, 257);
            let mut acc = at_offset(&data, 3);
            scale_avg(dt, &mut acc[3..], n).unwrap();
            for i in 0..257 {
                let want = match get(dt, &data, i) {
                    V::I(x) => V::I(x / n as i128),
                    V::F(x) => {
                        let d = match dt {
                            DataType::Float64 => n as f64,
                            _ => n as f32 as f64, // the divisor in f32 arithmetic
                        };
                        V::F(round_to(x / d, fmt_of(dt).unwrap()))
                    }
                };
                check_elem(dt, &acc[3..], i, want, &|| {
                    format!("{:?} / {n}", get(dt, &data, i))
                });
            }
            let mut sc = data.clone();
            scale(dt, &mut sc, n, false);
            assert_eq!(sc, &acc[3..], "{dt} / {n}: scalar path differs");
        }
    }
    let mut v = (-7i32).to_ne_bytes();
    scale_avg(DataType::Int32, &mut v, 2).unwrap();
    assert_eq!(i32::from_ne_bytes(v), -3);
    let mut v = [255u8, 0x80];
    scale_avg(DataType::Uint8, &mut v, 2).unwrap();
    assert_eq!(v, [127, 64]);
    let mut v = [0x80u8, 0x81];
    scale_avg(DataType::Int8, &mut v, 3).unwrap();
    assert_eq!(v, [(-42i8) as u8, (-42i8) as u8]);
    let mut v = i64::MIN.to_ne_bytes();
    scale_avg(DataType::Int64, &mut v, 1 << 63).unwrap();
    assert_eq!(i64::from_ne_bytes(v), -1);
    let mut v = f32s(&[1.0, 3.0]);
    scale_avg(DataType::Float32, &mut v, 3).unwrap();
    assert_eq!(to_f32s(&v), [(1.0f32 / 3.0).to_bits(), 1.0f32.to_bits()]);
}

/// The multiply-shift division of 32-bit integers against plain division.
#[test]
fn div32_is_exact() {
    use super::scalar::Div32;
    let mut rng = Rng(11);
    let mut ds: Vec<usize> = (1..=1000).collect();
    for k in 1..=33 {
        ds.extend([(1usize << k) - 1, 1 << k, (1 << k) + 1]);
    }
    ds.extend((0..2000).map(|_| rng.next() as u32 as usize >> rng.below(32)));
    ds.extend([u32::MAX as usize, usize::MAX, 0x7fff_ffff, 0x8000_0001]);
    ds.retain(|&d| d >= 1);
    let mut xs: Vec<u32> = vec![
        0,
        1,
        2,
        u32::MAX,
        u32::MAX - 1,
        0x7fff_ffff,
        0x8000_0000,
        0x8000_0001,
    ];
    xs.extend((0..300).map(|_| rng.next() as u32));
    for &d in &ds {
        let div = Div32::new(d);
        for &x in &xs {
            assert_eq!(div.div(x) as u64, x as u64 / d as u64, "{x} / {d}");
            let y = x as i32;
            assert_eq!(
                div.div_signed(y) as i64,
                y as i64 / d.min(1 << 40) as i64,
                "{y} / {d}"
            );
        }
        // Multiples of d and their neighbours: where a wrong quotient would show first.
        for k in [1u64, 2, 3, (u32::MAX as u64) / d as u64] {
            // d may be usize::MAX: products and neighbours past u64 are skipped, not wrapped.
            let Some(m) = k.checked_mul(d as u64) else {
                continue;
            };
            for x in [m.checked_sub(1), Some(m), m.checked_add(1)]
                .into_iter()
                .flatten()
            {
                if x <= u32::MAX as u64 {
                    assert_eq!(div.div(x as u32) as u64, x / d as u64, "{x} / {d}");
                }
            }
        }
    }
}

#[test]
fn bad_lengths_name_the_argument() {
    let dt = DataType::Float32;
    let e = reduce(dt, RedOp::Sum, &[0; 6], &[0; 8], &mut [0; 8]).unwrap_err();
    assert_eq!(
        e,
        ReduceError::NotMultiple {
            arg: "a",
            len: 6,
            dtype: dt
        }
    );
    assert!(
        e.to_string().contains("'a'") && e.to_string().contains("float"),
        "{e}"
    );
    assert_eq!(
        reduce(dt, RedOp::Sum, &[0; 8], &[0; 7], &mut [0; 8])
            .unwrap_err()
            .arg(),
        "b"
    );
    assert_eq!(
        reduce(dt, RedOp::Sum, &[0; 8], &[0; 8], &mut [0; 9])
            .unwrap_err()
            .arg(),
        "dst"
    );
    let e = reduce(dt, RedOp::Sum, &[0; 8], &[0; 4], &mut [0; 8]).unwrap_err();
    assert_eq!(
        e,
        ReduceError::LengthMismatch {
            arg: "b",
            len: 4,
            expected: 8
        }
    );
    assert_eq!(
        reduce(dt, RedOp::Sum, &[0; 8], &[0; 8], &mut [0; 12])
            .unwrap_err()
            .arg(),
        "dst"
    );
    assert_eq!(
        reduce_inplace(dt, RedOp::Max, &mut [0; 3], &[0; 3])
            .unwrap_err()
            .arg(),
        "acc"
    );
    assert_eq!(
        reduce_inplace(dt, RedOp::Max, &mut [0; 4], &[0; 3])
            .unwrap_err()
            .arg(),
        "b"
    );
    assert_eq!(
        reduce_inplace(dt, RedOp::Max, &mut [0; 4], &[0; 8])
            .unwrap_err()
            .arg(),
        "b"
    );
    assert_eq!(
        scale_avg(DataType::Float16, &mut [0; 3], 2)
            .unwrap_err()
            .arg(),
        "acc"
    );
    assert_eq!(
        scale_avg(DataType::Float16, &mut [0; 4], 0).unwrap_err(),
        ReduceError::ZeroDivisor
    );
    // One-byte types accept any length; 8-byte types need multiples of 8.
    assert!(reduce(DataType::Uint8, RedOp::Sum, &[1; 3], &[1; 3], &mut [0; 3]).is_ok());
    assert!(reduce(
        DataType::Float64,
        RedOp::Sum,
        &[0; 12],
        &[0; 12],
        &mut [0; 12]
    )
    .is_err());
    let e: crate::Error = reduce(dt, RedOp::Sum, &[0; 6], &[0; 6], &mut [0; 6])
        .unwrap_err()
        .into();
    assert_eq!(e.nccl_code(), crate::error::nccl::INVALID_ARGUMENT);
}

/// The bitwise ops on every integer type, against the type's own `&`, `|` and `^`, at unaligned
/// offsets, with both entry points and the scalar path.
#[test]
fn bitwise_ops_on_every_integer_type() {
    fn check<T: Copy + PartialEq + std::fmt::Debug, const N: usize>(
        dt: DataType,
        rng: &mut Rng,
        from: fn([u8; N]) -> T,
        ops: [fn(T, T) -> T; 3],
    ) {
        assert_eq!(dt.size(), N);
        let bit_ops = [RedOp::BAnd, RedOp::BOr, RedOp::BXor];
        for (op, f) in bit_ops.into_iter().zip(ops) {
            for n in [0usize, 1, 3, 31, 64, 1000] {
                let a: Vec<u8> = (0..n * N).map(|_| rng.next() as u8).collect();
                let b: Vec<u8> = (0..n * N).map(|_| rng.next() as u8).collect();
                let b1 = at_offset(&b, 1);
                let mut dst = vec![0u8; n * N + 3];
                reduce(dt, op, &a, &b1[1..], &mut dst[3..]).unwrap();
                let mut acc = at_offset(&a, 2);
                reduce_inplace(dt, op, &mut acc[2..], &b).unwrap();
                let mut sc = vec![0u8; n * N];
                binary(dt, Kind::of(op), &a, &b, &mut sc, false);
                for i in 0..n {
                    let at = |v: &[u8]| from(v[i * N..(i + 1) * N].try_into().unwrap());
                    let want = f(at(&a), at(&b));
                    assert_eq!(at(&dst[3..]), want, "{dt} {op} element {i}");
                    assert_eq!(at(&acc[2..]), want, "{dt} {op} element {i} in place");
                    assert_eq!(at(&sc), want, "{dt} {op} element {i} scalar");
                }
            }
        }
        // Known values: all ones, zero, and a pattern.
        let (x, y) = (vec![0xffu8; N], vec![0xa5u8; N]);
        let mut d = vec![0u8; N];
        reduce(dt, RedOp::BAnd, &x, &y, &mut d).unwrap();
        assert_eq!(d, y, "{dt} band");
        reduce(dt, RedOp::BOr, &[0; N], &y, &mut d).unwrap();
        assert_eq!(d, y, "{dt} bor");
        reduce(dt, RedOp::BXor, &x, &y, &mut d).unwrap();
        assert_eq!(d, vec![0x5au8; N], "{dt} bxor");
    }
    let mut rng = Rng(7);
    check(
        DataType::Int8,
        &mut rng,
        i8::from_ne_bytes,
        [|x, y| x & y, |x, y| x | y, |x, y| x ^ y],
    );
    check(
        DataType::Uint8,
        &mut rng,
        u8::from_ne_bytes,
        [|x, y| x & y, |x, y| x | y, |x, y| x ^ y],
    );
    check(
        DataType::Int32,
        &mut rng,
        i32::from_ne_bytes,
        [|x, y| x & y, |x, y| x | y, |x, y| x ^ y],
    );
    check(
        DataType::Uint32,
        &mut rng,
        u32::from_ne_bytes,
        [|x, y| x & y, |x, y| x | y, |x, y| x ^ y],
    );
    check(
        DataType::Int64,
        &mut rng,
        i64::from_ne_bytes,
        [|x, y| x & y, |x, y| x | y, |x, y| x ^ y],
    );
    check(
        DataType::Uint64,
        &mut rng,
        u64::from_ne_bytes,
        [|x, y| x & y, |x, y| x | y, |x, y| x ^ y],
    );
}

/// The bitwise ops on floating-point types are an error naming the op and the type, and write
/// nothing.
#[test]
fn bitwise_ops_on_floats_are_an_error_naming_op_and_type() {
    for dt in DataType::ALL.into_iter().filter(|d| d.is_float()) {
        for op in [RedOp::BAnd, RedOp::BOr, RedOp::BXor] {
            assert!(!op.supports(dt));
            let n = 4 * dt.size();
            let mut dst = vec![0x11u8; n];
            let e = reduce(dt, op, &vec![0xff; n], &vec![0xff; n], &mut dst).unwrap_err();
            assert_eq!(e, ReduceError::Unsupported { op, dtype: dt });
            assert_eq!(e.arg(), "op");
            let msg = e.to_string();
            assert!(
                msg.contains("'op'") && msg.contains(op.name()) && msg.contains(dt.name()),
                "{msg}"
            );
            assert!(dst.iter().all(|&x| x == 0x11), "{dt} {op}: wrote");
            let e = reduce_inplace(dt, op, &mut dst, &vec![0xff; n]).unwrap_err();
            assert_eq!(e.arg(), "op");
            assert!(dst.iter().all(|&x| x == 0x11), "{dt} {op}: wrote in place");
            let e: crate::Error = e.into();
            assert_eq!(e.nccl_code(), crate::error::nccl::INVALID_ARGUMENT);
        }
    }
    for dt in DataType::ALL.into_iter().filter(|d| !d.is_float()) {
        for op in RedOp::ALL {
            assert!(op.supports(dt), "{op} on {dt}");
        }
    }
}

#[test]
fn empty_slices_are_a_no_op() {
    for dt in DataType::ALL {
        for op in RedOp::ALL {
            if op.supports(dt) {
                reduce(dt, op, &[], &[], &mut []).unwrap();
                reduce_inplace(dt, op, &mut [], &[]).unwrap();
            } else {
                assert_eq!(reduce(dt, op, &[], &[], &mut []).unwrap_err().arg(), "op");
            }
        }
        scale_avg(dt, &mut [], 4).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// Throughput (not a test):
// `cargo test --release --lib reduce::tests::throughput -- --ignored --nocapture`

/// `n` elements of ordinary data: floats uniform in [-1, 1), integers random.
fn ordinary_elems(rng: &mut Rng, dt: DataType, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * dt.size());
    for _ in 0..n {
        let x = (rng.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0;
        let c = match dt {
            DataType::Float16 => f32_to_f16(x as f32) as u64,
            DataType::Bfloat16 => f32_to_bf16(x as f32) as u64,
            DataType::Float32 => (x as f32).to_bits() as u64,
            DataType::Float64 => x.to_bits(),
            DataType::Float8E4M3 => f32_to_e4m3(x as f32) as u64,
            DataType::Float8E5M2 => f32_to_e5m2(x as f32) as u64,
            _ => rng.next(),
        };
        out.extend_from_slice(&c.to_le_bytes()[..dt.size()]);
    }
    out
}

#[test]
#[ignore]
fn throughput() {
    use std::time::Instant;
    fn rate(bytes: usize, mut f: impl FnMut()) -> f64 {
        f();
        let mut best = 0f64;
        for _ in 0..5 {
            let (mut reps, start) = (0usize, Instant::now());
            while start.elapsed().as_secs_f64() < 0.05 {
                f();
                reps += 1;
            }
            best = best.max((bytes * reps) as f64 / start.elapsed().as_secs_f64() / 1e9);
        }
        best
    }
    let only: Option<Vec<DataType>> = std::env::var("REDUCE_BENCH_TYPES")
        .ok()
        .map(|v| v.split(',').filter_map(DataType::from_name).collect());
    let mut rng = Rng(1);
    println!("GB/s of output, best of 5 (each element also reads two inputs: traffic is 3x)");
    println!(
        "{:<10} {:>5} {:>8} {:>10} {:>10} {:>12} {:>10}",
        "type", "op", "size", "scalar", "fast", "scalar-inpl", "fast-inpl"
    );
    for &bytes in &[8usize << 10, 256 << 10, 64 << 20] {
        for dt in DataType::ALL {
            if only.as_ref().is_some_and(|o| !o.contains(&dt)) {
                continue;
            }
            for op in [RedOp::Sum, RedOp::Max] {
                let n = bytes / dt.size();
                let a = ordinary_elems(&mut rng, dt, n);
                let b = ordinary_elems(&mut rng, dt, n);
                let mut d = vec![0u8; bytes];
                let k = Kind::of(op);
                let s = rate(bytes, || binary(dt, k, &a, &b, &mut d, false));
                let f = rate(bytes, || reduce(dt, op, &a, &b, &mut d).unwrap());
                // In place, into a copy of `a`: sums of values in [-1, 1) grow like a random
                // walk, so they stay ordinary (fp8 saturates, which costs the same).
                let mut acc = a.clone();
                let si = rate(bytes, || inplace(dt, k, &mut acc, &b, false));
                let fi = rate(bytes, || reduce_inplace(dt, op, &mut acc, &b).unwrap());
                println!(
                    "{:<10} {:>5} {:>7}K {s:>10.2} {f:>10.2} {si:>12.2} {fi:>10.2}",
                    dt.name(),
                    op.name(),
                    bytes >> 10
                );
            }
        }
    }
    // n = 1 keeps the values ordinary over the repetitions (dividing by 7 again and again would
    // reach subnormals); a division by 1 costs the same.
    println!("scale_avg, GB/s of buffer:");
    for dt in DataType::ALL {
        let bytes = 256 << 10;
        let mut acc = ordinary_elems(&mut rng, dt, bytes / dt.size());
        let s = rate(bytes, || scale(dt, &mut acc, 1, false));
        let f = rate(bytes, || scale_avg(dt, &mut acc, 1).unwrap());
        println!(
            "{:<10} {:>7}K scalar {s:>8.2} fast {f:>8.2}",
            dt.name(),
            bytes >> 10
        );
    }
}

#[test]
fn copy_matches_copy_from_slice_at_every_gap_class() {
    // Source and destination in one allocation, so that every gap modulo 4 KiB can be made.
    let mut mem = vec![0u8; 3 * 8192 + 4096];
    for len in [0usize, 1, 31, 33, 1023, 1024, 1025, 4096, 5000, 8192] {
        for gap in [0usize, 1, 8, 16, 31, 63, 64, 100, 4080] {
            for (i, b) in mem.iter_mut().enumerate() {
                *b = (i * 7 + len + gap) as u8;
            }
            let want: Vec<u8> = mem[0..len].to_vec();
            let (src, dst) = mem.split_at_mut(8192 + 4096);
            let d = &mut dst[gap..gap + len];
            super::copy(d, &src[..len]);
            assert_eq!(d, &want[..], "len {len} gap {gap}");
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn streaming_copy_matches_copy_from_slice_at_every_alignment_and_leaves_neighbours_alone() {
    if !is_x86_feature_detected!("avx2") {
        // `copy` uses memcpy there, and nothing here would run.
        return crate::testing::skip(
            "streaming_copy_matches_copy_from_slice_at_every_alignment_and_leaves_neighbours_alone",
            "this CPU has no AVX2",
        );
    }
    // Lengths around the 128-byte loop and the 32-byte head; destinations at every offset
    // within a line, so the aligned head takes 0 to 31 bytes.
    let src: Vec<u8> = (0..70_000u32).map(|i| (i * 13 + 5) as u8).collect();
    for len in [0usize, 1, 31, 32, 33, 127, 128, 129, 160, 4095, 65_536 + 17] {
        for (soff, doff) in [(0, 0), (1, 0), (0, 1), (3, 17), (31, 31), (32, 7), (5, 63)] {
            let mut dst = vec![0xA5u8; len + 128];
            let s = &src[soff..soff + len];
            let done = super::simd::copy_stream(&mut dst[doff..doff + len], s);
            assert!(done, "AVX2 is here, yet the streaming copy declined");
            assert_eq!(
                &dst[doff..doff + len],
                s,
                "len {len} src +{soff} dst +{doff}"
            );
            assert!(
                dst[..doff]
                    .iter()
                    .chain(&dst[doff + len..])
                    .all(|&b| b == 0xA5),
                "len {len} src +{soff} dst +{doff}: wrote outside the destination"
            );
        }
    }
}

#[test]
fn copy_at_the_streaming_threshold_and_above_is_exact() {
    let t = super::stream_threshold();
    assert!(t >= 1 << 20, "threshold {t}");
    for len in [t, t + 33] {
        let src: Vec<u8> = (0..len).map(|i| (i * 31 + i / 4096) as u8).collect();
        let mut dst = vec![0u8; len + 8];
        super::copy(&mut dst[3..3 + len], &src);
        assert!(dst[3..3 + len] == src[..], "len {len}");
        assert_eq!(&dst[..3], &[0, 0, 0]);
        assert_eq!(&dst[3 + len..], &[0; 5]);
    }
}

#[test]
fn cache_sizes_are_read_from_sysfs_entries() {
    assert_eq!(super::parse_cache_size("32768K"), Some(32 << 20));
    assert_eq!(super::parse_cache_size("2M"), Some(2 << 20));
    assert_eq!(super::parse_cache_size("1G"), Some(1 << 30));
    assert_eq!(super::parse_cache_size("512"), Some(512));
    assert_eq!(super::parse_cache_size(""), None);
    assert_eq!(super::parse_cache_size("K"), None);
    assert_eq!(super::parse_cache_size("12Q"), None);
    assert_eq!(super::parse_cache_size("99999999999999999999G"), None);

    let dir = std::env::temp_dir().join(format!("fabricoll-cache-{}", std::process::id()));
    for (idx, level, size) in [(0, "1", "48K"), (2, "2", "2048K"), (3, "3", "32768K")] {
        let d = dir.join(format!("index{idx}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("level"), format!("{level}\n")).unwrap();
        std::fs::write(d.join("size"), format!("{size}\n")).unwrap();
    }
    // An entry without a readable size is skipped, not an error.
    std::fs::create_dir_all(dir.join("index4")).unwrap();
    std::fs::write(dir.join("index4").join("level"), "4\n").unwrap();
    let found = super::last_level_cache(dir.to_str().unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found, Some(32 << 20));
    assert_eq!(super::last_level_cache("/nonexistent/fabricoll"), None);
}

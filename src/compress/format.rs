//! The wire formats of compressed collectives: their names (`FABRICOLL_COMPRESS`), code sizes,
//! the largest value a code holds, and the per-format round-trip error bound that the tests
//! and docs/compression.md state.
#![forbid(unsafe_code)]

use std::fmt;

/// One wire format. `Off` sends the data as it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    Off,
    /// bfloat16 codes, no scale (bf16 has f32's range).
    Bf16,
    /// IEEE binary16 codes with a power-of-two scale per block.
    Fp16,
    /// OCP fp8 E4M3 codes with a power-of-two scale per block.
    Fp8E4m3,
    /// OCP fp8 E5M2 codes with a power-of-two scale per block.
    Fp8E5m2,
    /// Symmetric int8 codes (-127..=127) with an f32 scale `amax / 127` per block.
    Int8,
    /// Symmetric int4 codes (-7..=7), two per byte, with an f32 scale `amax / 7` per block.
    Int4,
}

/// The accepted names, in the order the error message lists them.
pub const NAMES: &str = "off, bf16, fp16, fp8e4m3, fp8e5m2, int8, int4";

impl Format {
    pub const ALL: [Format; 7] = [
        Format::Off,
        Format::Bf16,
        Format::Fp16,
        Format::Fp8E4m3,
        Format::Fp8E5m2,
        Format::Int8,
        Format::Int4,
    ];

    /// The formats that send codes (all but `Off`).
    pub const CODED: [Format; 6] = [
        Format::Bf16,
        Format::Fp16,
        Format::Fp8E4m3,
        Format::Fp8E5m2,
        Format::Int8,
        Format::Int4,
    ];

    /// The format named `s` (`FABRICOLL_COMPRESS`'s values), or None.
    pub fn parse(s: &str) -> Option<Format> {
        Format::ALL.into_iter().find(|f| f.name() == s)
    }

    pub fn name(self) -> &'static str {
        match self {
            Format::Off => "off",
            Format::Bf16 => "bf16",
            Format::Fp16 => "fp16",
            Format::Fp8E4m3 => "fp8e4m3",
            Format::Fp8E5m2 => "fp8e5m2",
            Format::Int8 => "int8",
            Format::Int4 => "int4",
        }
    }

    /// The number that identifies the format on the wire and in the call agreement (stable).
    pub fn id(self) -> u8 {
        match self {
            Format::Off => 0,
            Format::Bf16 => 1,
            Format::Fp16 => 2,
            Format::Fp8E4m3 => 3,
            Format::Fp8E5m2 => 4,
            Format::Int8 => 5,
            Format::Int4 => 6,
        }
    }

    /// Bits per element code (0 for `Off`, which has no codes).
    pub fn code_bits(self) -> usize {
        match self {
            Format::Off => 0,
            Format::Bf16 | Format::Fp16 => 16,
            Format::Fp8E4m3 | Format::Fp8E5m2 | Format::Int8 => 8,
            Format::Int4 => 4,
        }
    }

    /// Bytes of the codes of a block of `n` elements: int4's two codes per byte, the last
    /// byte of an odd block half used (its high nibble zero).
    pub fn codes_len(self, n: usize) -> usize {
        (n * self.code_bits()).div_ceil(8)
    }

    /// Whether each block carries an f32 scale.
    pub fn scaled(self) -> bool {
        !matches!(self, Format::Off | Format::Bf16)
    }

    /// The largest magnitude a code represents (the scaled value of a block's largest element
    /// stays at or below it).
    pub fn max_code_value(self) -> f32 {
        match self {
            Format::Off | Format::Bf16 => f32::MAX,
            Format::Fp16 => 65504.0,
            Format::Fp8E4m3 => 448.0,
            Format::Fp8E5m2 => 57344.0,
            Format::Int8 => 127.0,
            Format::Int4 => 7.0,
        }
    }

    /// The round trip's error bound for one element `x` of a block whose dequantization scale
    /// is `scale` (1 for bf16): `|dequant(quant(x)) - x| <= rel * |x| + abs * scale + 2^-149`.
    /// `rel` is half an ulp of the code's significand (round to nearest even); `abs` is half
    /// the code's smallest step (its subnormal quantum, int8's unit); the last term is the f32
    /// rounding of a product that lands among f32's subnormals.
    pub fn error_terms(self) -> (f64, f64) {
        match self {
            Format::Off => (0.0, 0.0),
            // 8 significant bits; below 2^-126 bf16 keeps f32's subnormals down to 2^-133.
            Format::Bf16 => (2f64.powi(-8), 2f64.powi(-134)),
            Format::Fp16 => (2f64.powi(-11), 2f64.powi(-25)),
            Format::Fp8E4m3 => (2f64.powi(-4), 2f64.powi(-10)),
            Format::Fp8E5m2 => (2f64.powi(-3), 2f64.powi(-17)),
            // x * (1/s) is within 2^-22 of x/s (|x/s| <= 127); q * s rounds once more.
            Format::Int8 => (2f64.powi(-24), 0.5 + 2f64.powi(-16)),
            // The same with |x/s| <= 7.
            Format::Int4 => (2f64.powi(-24), 0.5 + 2f64.powi(-16)),
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

//! The codec against a scalar reference written from the definitions (the element converters of
//! `reduce`, scales found by search), over random data, wide dynamic range within a block, all
//! zeros, subnormals, specials; and the round trip's error bound against f64.
use super::*;
use crate::reduce::{conv, fp8};

/// xorshift64*: deterministic data without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

const SCALED: [Format; 6] = Format::CODED;

/// The reference encoding of one block: (scale, codes), the scale found by searching k.
fn reference_block(f: Format, x: &[f32]) -> (Option<f32>, Vec<u8>) {
    if f == Format::Bf16 {
        let codes = x
            .iter()
            .flat_map(|v| conv::f32_to_bf16(*v).to_le_bytes())
            .collect();
        return (None, codes);
    }
    if x.iter().any(|v| !v.is_finite()) {
        return (Some(f32::NAN), vec![0; f.codes_len(x.len())]);
    }
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let (scale, mul) = if matches!(f, Format::Int8 | Format::Int4) {
        let s = (amax / f.max_code_value()).max(f32::MIN_POSITIVE);
        (s, 1.0 / s)
    } else {
        let m = f64::from(f.max_code_value());
        let mut k = 127i32;
        while k > -126 && f64::from(amax) * 2f64.powi(k) > m {
            k -= 1;
        }
        (2f64.powi(-k) as f32, 2f64.powi(k) as f32)
    };
    if f == Format::Int4 {
        // Two codes per byte, element 2j low: the integers rounded and clamped to -7..=7.
        let q: Vec<u8> = x
            .iter()
            .map(|v| ((v * mul).round_ties_even().clamp(-7.0, 7.0) as i32 as u8) & 0x0f)
            .collect();
        let codes = q
            .chunks(2)
            .map(|p| p[0] | p.get(1).map_or(0, |h| h << 4))
            .collect();
        return (Some(scale), codes);
    }
    let codes = x
        .iter()
        .flat_map(|v| {
            let y = v * mul;
            match f {
                Format::Fp16 => conv::f32_to_f16(y).to_le_bytes().to_vec(),
                Format::Fp8E4m3 => vec![fp8::f32_to_e4m3(y)],
                Format::Fp8E5m2 => vec![fp8::f32_to_e5m2(y)],
                _ => vec![(y.round_ties_even().clamp(-127.0, 127.0) as i32) as u8],
            }
        })
        .collect();
    (Some(scale), codes)
}

fn reference(c: &Codec, x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    for b in x.chunks(c.block) {
        let (scale, codes) = reference_block(c.format, b);
        if let Some(s) = scale {
            out.extend_from_slice(&s.to_le_bytes());
        }
        out.extend_from_slice(&codes);
    }
    out
}

/// Element `j`'s code among a block's `codes`: its bytes (int4: its nibble, in the low bits).
fn code_of(f: Format, codes: &[u8], j: usize) -> Vec<u8> {
    if f == Format::Int4 {
        return vec![(codes[j / 2] >> (4 * (j % 2))) & 0x0f];
    }
    let w = f.code_bits() / 8;
    codes[j * w..(j + 1) * w].to_vec()
}

fn reference_decode(f: Format, code: &[u8], scale: f32) -> f32 {
    let v = match f {
        Format::Int4 => f32::from(((code[0] << 4) as i8) >> 4),
        Format::Bf16 => return conv::bf16_to_f32(u16::from_le_bytes([code[0], code[1]])),
        Format::Fp16 => conv::f16_to_f32(u16::from_le_bytes([code[0], code[1]])),
        Format::Fp8E4m3 => fp8::e4m3_to_f32(code[0]),
        Format::Fp8E5m2 => fp8::e5m2_to_f32(code[0]),
        _ => f32::from(code[0] as i8),
    };
    v * scale
}

/// Checks codes, decoding, accumulation and the error bound of `x` under every format.
fn check(x: &[f32], block: usize, what: &str) {
    for f in SCALED {
        let c = Codec::new(f, block).unwrap();
        let mut wire = vec![0xa5u8; c.wire_len(x.len())];
        c.quantize(x, &mut wire).unwrap();
        assert_eq!(wire, reference(&c, x), "{what}: {f} K={block}: codes");
        let mut back = vec![0f32; x.len()];
        c.dequantize(&wire, &mut back).unwrap();
        let mut acc: Vec<f32> = (0..x.len()).map(|i| i as f32 * 0.25 - 3.0).collect();
        let before = acc.clone();
        c.accumulate(&wire, &mut acc).unwrap();
        let (rel, abs) = f.error_terms();
        let h = if f.scaled() { 4 } else { 0 };
        for (bi, xb) in x.chunks(block).enumerate() {
            let base = bi * c.block_len(block);
            let scale = if h == 4 {
                f32::from_le_bytes(wire[base..base + 4].try_into().unwrap())
            } else {
                1.0
            };
            let special = xb.iter().any(|v| !v.is_finite());
            for (j, v) in xb.iter().enumerate() {
                let i = bi * block + j;
                let codes = &wire[base + h..base + c.block_len(xb.len())];
                let want = reference_decode(f, &code_of(f, codes, j), scale);
                assert_eq!(back[i].to_bits(), want.to_bits(), "{what}: {f}: decode {i}");
                let sum = before[i] + want;
                assert_eq!(
                    acc[i].to_bits(),
                    sum.to_bits(),
                    "{what}: {f}: accumulate {i}"
                );
                if special {
                    if f == Format::Bf16 {
                        assert!(
                            !back[i].is_finite() || v.is_finite(),
                            "{what}: {f}: {v} at {i} came back {}",
                            back[i]
                        );
                    } else {
                        assert!(
                            back[i].is_nan(),
                            "{what}: {f}: a special block decodes to NaN"
                        );
                    }
                    continue;
                }
                let err = (f64::from(back[i]) - f64::from(*v)).abs();
                let bound = rel * f64::from(v.abs()) + abs * f64::from(scale) + 2f64.powi(-149);
                // A value from 2^127 up may round past f32's largest finite value: infinity of
                // its sign (documented).
                if back[i].is_infinite() {
                    assert!(
                        v.abs() >= 2f32.powi(127) && back[i].signum() == v.signum(),
                        "{what}: {f}: {v} overflowed"
                    );
                    continue;
                }
                assert!(
                    err <= bound,
                    "{what}: {f} K={block}: x={v:e} got {:e}, error {err:e} > bound {bound:e}",
                    back[i]
                );
            }
        }
    }
}

#[test]
fn random_uniform() {
    let mut r = Rng(1);
    for &(n, k) in &[
        (1000, 256),
        (1, 256),
        (255, 256),
        (257, 256),
        (4096, 32),
        (999, 1),
        (77, 1000),
    ] {
        let x: Vec<f32> = (0..n).map(|_| r.unit() * 100.0).collect();
        check(&x, k, "uniform");
    }
}

#[test]
fn wide_dynamic_range_within_a_block() {
    let mut r = Rng(2);
    for n in [256usize, 1000, 3000] {
        let x: Vec<f32> = (0..n)
            .map(|_| {
                let e = (r.next() % 250) as i32 - 125;
                r.unit() * 2f32.powi(e)
            })
            .collect();
        check(&x, 256, "wide");
        check(&x, 64, "wide");
    }
    // Every f32 exponent, extremes included, one block.
    let x: Vec<f32> = (0..512)
        .map(|i| f32::from_bits((i as u32 % 255) << 23 | 0x12_3456 | ((i as u32 & 1) << 31)))
        .collect();
    check(&x, 512, "every exponent");
}

#[test]
fn zeros_and_subnormals() {
    check(&vec![0.0; 700], 256, "zeros");
    check(&[0.0, -0.0, 0.0, -0.0], 2, "signed zeros");
    let mut r = Rng(3);
    let sub: Vec<f32> = (0..600)
        .map(|_| f32::from_bits((r.next() as u32) & 0x807f_ffff))
        .collect();
    check(&sub, 256, "subnormals");
    let tiny: Vec<f32> = (0..300)
        .map(|i| f32::from_bits(i % 3) * if i % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    check(&tiny, 100, "smallest subnormals");
    let mixed: Vec<f32> = (0..512)
        .map(|i| if i % 7 == 0 { 3.0e-39 } else { r.unit() * 1e-3 })
        .collect();
    check(&mixed, 256, "subnormals among normals");
}

#[test]
fn extremes_saturate_and_specials_are_never_finite() {
    check(&[f32::MAX, -f32::MAX, 1.0, -1.0e30], 4, "max");
    let mut x: Vec<f32> = (0..1024).map(|i| i as f32).collect();
    x[3] = f32::NAN;
    x[300] = f32::INFINITY;
    x[600] = f32::NEG_INFINITY;
    x[900] = -f32::NAN;
    check(&x, 256, "specials");
    // The special blocks come back NaN, the others finite.
    let c = Codec::new(Format::Fp8E4m3, 256).unwrap();
    let mut wire = vec![0; c.wire_len(1280)];
    let mut y = x.clone();
    y.extend((0..256).map(|i| i as f32));
    c.quantize(&y, &mut wire).unwrap();
    let mut back = vec![0.0; 1280];
    c.dequantize(&wire, &mut back).unwrap();
    assert!(back[..1024].iter().all(|v| v.is_nan()));
    assert!(back[1024..].iter().all(|v| v.is_finite()));
}

#[test]
fn fp8_and_fp16_encoders_match_the_converters_everywhere() {
    // Every finite f32 whose scaled value may reach the encoder (|y| <= max), in steps.
    for f in [Format::Fp8E4m3, Format::Fp8E5m2, Format::Fp16] {
        let c = Codec::new(f, 1).unwrap();
        let mut bits = 0u32;
        while bits < 0x7f80_0000 {
            for s in [0, 0x8000_0000] {
                let y = f32::from_bits(bits | s);
                if y.abs() > f.max_code_value() {
                    continue;
                }
                let mut w = vec![0u8; c.wire_len(1)];
                c.quantize(&[y], &mut w).unwrap();
                let want = reference(&c, &[y]);
                assert_eq!(&w[..], &want[..], "{f}: {y:e}");
            }
            bits += 0x1357;
        }
    }
}

#[test]
fn lengths_and_block_are_checked() {
    let e = Codec::new(Format::Int8, 0).unwrap_err().to_string();
    assert!(e.contains("'block'"), "{e}");
    let c = Codec::new(Format::Int8, 4).unwrap();
    assert_eq!(c.wire_len(9), 9 + 3 * 4);
    assert_eq!(Codec::new(Format::Bf16, 4).unwrap().wire_len(9), 18);
    let e = c.quantize(&[1.0; 9], &mut [0; 20]).unwrap_err().to_string();
    assert!(e.contains("'dst'") && e.contains("expected 21"), "{e}");
    let e = c
        .dequantize(&[0; 20], &mut [0.0; 9])
        .unwrap_err()
        .to_string();
    assert!(e.contains("'src'"), "{e}");
    for f in Format::ALL {
        assert_eq!(Format::parse(f.name()), Some(f));
    }
    assert_eq!(Format::parse("fp8"), None);
}

#[test]
fn the_simd_path_gives_the_portable_bits() {
    let mut r = Rng(4);
    let x: Vec<f32> = (0..5000)
        .map(|i| {
            let e = (r.next() % 60) as i32 - 30;
            if i % 1999 == 5 {
                f32::INFINITY
            } else {
                r.unit() * 2f32.powi(e)
            }
        })
        .collect();
    for f in SCALED {
        for k in [1, 7, 256, 4096] {
            let c = Codec::new(f, k).unwrap();
            let (mut a, mut b) = (
                vec![0u8; c.wire_len(x.len())],
                vec![1u8; c.wire_len(x.len())],
            );
            c.quantize(&x, &mut a).unwrap();
            c.portable().quantize(&x, &mut b);
            assert_eq!(a, b, "{f} K={k}: quantize");
            let mut acc1: Vec<f32> = x.iter().map(|v| v * 0.5).collect();
            let mut acc2 = acc1.clone();
            c.accumulate(&a, &mut acc1).unwrap();
            c.portable().accumulate(&a, &mut acc2);
            let same = acc1
                .iter()
                .zip(&acc2)
                .all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(same, "{f} K={k}: accumulate");
        }
    }
}

//! The caller's float, bfloat16 and half data as the codec's f32 values and back: read and
//! written where they lie when they are aligned f32, else converted exactly (bf16 and f16 to
//! f32) or rounded once to nearest even (f32 to bf16 and f16).
use crate::compress::{owner, Codec};
use crate::error::{Error, Result};
use crate::reduce::conv::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::reduce::DataType;
use crate::transport::Region;
use std::ops::Range;

/// Decode `codes` into elements `at` of `out` (elements of `dtype`, rounded once from f32).
pub(super) fn decode_into(
    codec: &Codec,
    dtype: DataType,
    out: Region,
    at: Range<usize>,
    codes: &[u8],
) -> Result<()> {
    let el = dtype.size();
    let dst = out.sub(at.start * el, at.len() * el).ok_or_else(|| {
        Error::arg(
            "recvbuff",
            format!("{} bytes, the collective writes more", out.len()),
        )
    })?;
    dst.with_mut(|d| into_f32(dtype, d, |v| owner::finish(codec, codes, v)))
}

/// `f` of the f32 values of `b`, elements of `dtype` (float, bfloat16 or half): float data
/// on a 4-byte boundary where it lies (the codec's work is then the only pass over the
/// caller's buffer), anything else converted exactly into a vector first.
pub(super) fn with_f32<R>(dtype: DataType, b: &[u8], f: impl FnOnce(&[f32]) -> R) -> R {
    if dtype == DataType::Float32 {
        // SAFETY: every 4-byte pattern is a valid f32, and `align_to` puts in the middle slice
        // only whole, aligned elements of the same memory, borrowed as `b` is.
        let (head, mid, tail) = unsafe { b.align_to::<f32>() };
        if head.is_empty() && tail.is_empty() {
            return f(mid);
        }
    }
    f(&to_f32(dtype, b))
}

/// `f` writing f32 values into `d`, elements of `dtype`: float data on a 4-byte boundary in
/// place, anything else into a vector first, then rounded into `d` (`from_f32`).
pub(super) fn into_f32(
    dtype: DataType,
    d: &mut [u8],
    f: impl FnOnce(&mut [f32]) -> Result<()>,
) -> Result<()> {
    if dtype == DataType::Float32 {
        // SAFETY: as in `with_f32`; any f32 written is 4 valid bytes of `d`.
        let (head, mid, tail) = unsafe { d.align_to_mut::<f32>() };
        if head.is_empty() && tail.is_empty() {
            return f(mid);
        }
    }
    let mut v = vec![0f32; d.len() / dtype.size()];
    f(&mut v)?;
    from_f32(dtype, &v, d);
    Ok(())
}

/// f32 values of `b`, elements of `dtype` (float, bfloat16 or half), converted exactly.
fn to_f32(dtype: DataType, b: &[u8]) -> Vec<f32> {
    match dtype {
        DataType::Float32 => b
            .chunks_exact(4)
            .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DataType::Bfloat16 => b
            .chunks_exact(2)
            .map(|c| bf16_to_f32(u16::from_ne_bytes([c[0], c[1]])))
            .collect(),
        _ => b
            .chunks_exact(2)
            .map(|c| f16_to_f32(u16::from_ne_bytes([c[0], c[1]])))
            .collect(),
    }
}

/// `v` as elements of `dtype` into `d` (bfloat16 and half rounded to nearest even).
fn from_f32(dtype: DataType, v: &[f32], d: &mut [u8]) {
    match dtype {
        DataType::Float32 => {
            for (o, x) in d.chunks_exact_mut(4).zip(v) {
                o.copy_from_slice(&x.to_ne_bytes());
            }
        }
        DataType::Bfloat16 => {
            for (o, x) in d.chunks_exact_mut(2).zip(v) {
                o.copy_from_slice(&f32_to_bf16(*x).to_ne_bytes());
            }
        }
        _ => {
            for (o, x) in d.chunks_exact_mut(2).zip(v) {
                o.copy_from_slice(&f32_to_f16(*x).to_ne_bytes());
            }
        }
    }
}

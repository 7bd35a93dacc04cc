//! Reduction kernels: element-wise `dst = a ⊕ b` for every NCCL data type and op, on byte slices
//! at any alignment (they come from user buffers at arbitrary offsets).
//!
//! # API
//! - [`reduce`]`(dt, op, a, b, dst)`: `dst[i] = a[i] ⊕ b[i]`.
//! - [`reduce_inplace`]`(dt, op, acc, b)`: `acc[i] = acc[i] ⊕ b[i]` (receive-and-reduce into an
//!   accumulator).
//! - [`scale_avg`]`(dt, acc, n)`: `acc[i] = acc[i] / n`, once at the end of an Avg.
//!
//! Lengths are in bytes, must be multiples of the type size and equal; a violation is a
//! [`ReduceError`] naming the argument. Empty slices are a no-op.
//!
//! # Semantics
//! - **Avg** reduces as Sum; [`scale_avg`] divides at the end (NCCL's network plugins likewise
//!   see Avg as Sum).
//! - **Integers** wrap on overflow (sum, prod), as NCCL. Integer Avg divides truncating toward
//!   zero (`-7 / 2 == -3`).
//! - **Bitwise ops** (BAnd, BOr, BXor) combine the raw bits of integer types; on floating-point
//!   types they are a [`ReduceError::Unsupported`] naming the op (argument `op`).
//! - **Floats: NaN.** Every NaN a kernel writes is the canonical positive quiet NaN (f32
//!   `0x7fc00000`, f64 `0x7ff8000000000000`, f16 `0x7e00`, bf16 `0x7fc0`, e4m3 `0x7f`, e5m2
//!   `0x7e`): payloads and signs of NaNs never propagate, so results do not depend on the CPU,
//!   the code path (SIMD or scalar) or the operand order. Sum and Prod give NaN when IEEE
//!   arithmetic does (a NaN operand, `inf - inf`, `0 * inf`).
//! - **Floats: Max / Min** are IEEE 754-2008 maxNum / minNum, like CUDA's `fmaxf` / `fminf` and
//!   `__hmax` that NCCL uses: if exactly one operand is NaN, the other is the result; if both
//!   are, the canonical NaN. +0 counts as larger than -0 (`max(-0, +0) = +0`, `min = -0`).
//!   With the canonical NaN this makes every op exactly commutative, bit for bit.
//! - **Reduced precision (f16, bf16, fp8).** Each element is converted to f32 (exactly),
//!   combined in f32 with the f32 rules, and rounded back to the type once per ⊕, to nearest,
//!   ties to even. (f32 has at least 2p+2 bits for each of these formats' p, so this equals
//!   the correctly rounded operation in the type itself: no double-rounding error.) f16 and
//!   bf16 overflow to infinity. fp8 uses CUDA's `__NV_SATFINITE` conversion, as NCCL's fp8
//!   reductions do: results beyond the largest finite value, infinities included, become
//!   ±448 (e4m3) or ±57344 (e5m2), so an e5m2 infinity in an input comes out as ±57344.
//!   Avg's scaling of these types is `x / n` in f32, rounded once the same way.
//! - **Subnormals** are kept. The kernels assume the default floating-point environment (round
//!   to nearest even, no flush-to-zero / denormals-are-zero in MXCSR).
//!
//! # Paths
//! f32, f16 and bf16 use AVX2 (+F16C) kernels on x86_64 when the CPU has them (runtime
//! detection), and the scalar kernels otherwise and for tails; the two agree bit for bit (the
//! tests check). Large fp8 slices go through a 64 KiB table per (type, op), `t[a << 8 | b]`,
//! built on first use from the scalar reference: exact by construction, and an AVX2 fp8 kernel
//! was no faster. Integers and f64 use scalar loops that the compiler vectorizes.
#![deny(unsafe_code)]

pub mod conv;
pub mod fp8;
mod scalar;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod simd;
#[cfg(test)]
mod tests;
mod types;

use std::fmt;
use std::sync::OnceLock;

use scalar::{Bf16, E4m3, E5m2, Elem, F16};
pub use types::{DataType, RedOp};

/// A kernel call with bad arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReduceError {
    /// The length (bytes) of argument `arg` is not a multiple of the element size.
    NotMultiple {
        arg: &'static str,
        len: usize,
        dtype: DataType,
    },
    /// The length (bytes) of argument `arg` differs from that of the first operand.
    LengthMismatch {
        arg: &'static str,
        len: usize,
        expected: usize,
    },
    /// `scale_avg` with `n == 0` (argument `n`).
    ZeroDivisor,
    /// An op that `dtype` does not have (a bitwise op on a floating-point type; argument `op`).
    Unsupported { op: RedOp, dtype: DataType },
}

impl ReduceError {
    /// The name of the offending argument.
    pub fn arg(&self) -> &'static str {
        match self {
            ReduceError::NotMultiple { arg, .. } | ReduceError::LengthMismatch { arg, .. } => arg,
            ReduceError::ZeroDivisor => "n",
            ReduceError::Unsupported { .. } => "op",
        }
    }
}

impl fmt::Display for ReduceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReduceError::NotMultiple { arg, len, dtype } => write!(
                f,
                "argument '{arg}': length {len} bytes is not a multiple of {} (the size of {dtype})",
                dtype.size()
            ),
            ReduceError::LengthMismatch { arg, len, expected } => {
                write!(f, "argument '{arg}': length {len} bytes, expected {expected} (the other operands' length)")
            }
            ReduceError::ZeroDivisor => write!(f, "argument 'n': the Avg divisor must be at least 1"),
            ReduceError::Unsupported { op, dtype } => write!(
                f,
                "argument 'op': {op} is a bitwise op, for integer types only, not {dtype}"
            ),
        }
    }
}

impl std::error::Error for ReduceError {}

impl From<ReduceError> for crate::Error {
    fn from(e: ReduceError) -> crate::Error {
        crate::Error::InvalidArgument(e.to_string())
    }
}

/// The combining operation a kernel runs (Avg is Sum).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    Sum,
    Prod,
    Max,
    Min,
    BAnd,
    BOr,
    BXor,
}

impl Kind {
    /// How many kinds there are (`k as usize < COUNT`).
    const COUNT: usize = 7;

    fn of(op: RedOp) -> Kind {
        match op {
            RedOp::Sum | RedOp::Avg => Kind::Sum,
            RedOp::Prod => Kind::Prod,
            RedOp::Max => Kind::Max,
            RedOp::Min => Kind::Min,
            RedOp::BAnd => Kind::BAnd,
            RedOp::BOr => Kind::BOr,
            RedOp::BXor => Kind::BXor,
        }
    }
}

fn check_op(dt: DataType, op: RedOp) -> Result<(), ReduceError> {
    if !op.supports(dt) {
        return Err(ReduceError::Unsupported { op, dtype: dt });
    }
    Ok(())
}

fn check_multiple(dt: DataType, arg: &'static str, s: &[u8]) -> Result<(), ReduceError> {
    if !s.len().is_multiple_of(dt.size()) {
        return Err(ReduceError::NotMultiple {
            arg,
            len: s.len(),
            dtype: dt,
        });
    }
    Ok(())
}

fn check_same(arg: &'static str, s: &[u8], expected: usize) -> Result<(), ReduceError> {
    if s.len() != expected {
        return Err(ReduceError::LengthMismatch {
            arg,
            len: s.len(),
            expected,
        });
    }
    Ok(())
}

/// `dst[i] = a[i] ⊕ b[i]` for every element. `a`, `b` and `dst` have the same length in bytes,
/// a multiple of `dt.size()`; any alignment. See the module documentation for the semantics.
pub fn reduce(
    dt: DataType,
    op: RedOp,
    a: &[u8],
    b: &[u8],
    dst: &mut [u8],
) -> Result<(), ReduceError> {
    check_multiple(dt, "a", a)?;
    check_multiple(dt, "b", b)?;
    check_multiple(dt, "dst", dst)?;
    check_same("b", b, a.len())?;
    check_same("dst", dst, a.len())?;
    check_op(dt, op)?;
    binary(dt, Kind::of(op), a, b, dst, true);
    Ok(())
}

/// `acc[i] = acc[i] ⊕ b[i]` for every element. `acc` and `b` have the same length in bytes, a
/// multiple of `dt.size()`; any alignment.
pub fn reduce_inplace(
    dt: DataType,
    op: RedOp,
    acc: &mut [u8],
    b: &[u8],
) -> Result<(), ReduceError> {
    check_multiple(dt, "acc", acc)?;
    check_multiple(dt, "b", b)?;
    check_same("b", b, acc.len())?;
    check_op(dt, op)?;
    inplace(dt, Kind::of(op), acc, b, true);
    Ok(())
}

/// `dst = src` (same length). Equivalent to `copy_from_slice`, but it avoids a cliff of
/// glibc's memcpy: from 2 KiB up it uses `rep movsb` on CPUs with ERMS/FSRM, which runs an
/// order of magnitude slower when the destination lies 1 to 63 bytes past the source modulo
/// 4 KiB (docs/performance.md, "Copies").
/// Two buffers that `malloc` placed one after the other are exactly that far apart (its 16-byte
/// chunk header) whenever the first one's size is a multiple of 4 KiB, so the case is common.
/// In that window the copy uses plain vector loads and stores instead.
///
/// From `stream_threshold()` bytes up it uses streaming stores (`simd::copy_stream`): a copy
/// that large cannot stay in the cache, and ordinary stores first read every destination line
/// that they then overwrite, so streaming wins once both cores copy more than the cache holds
/// (docs/performance.md, "Copies").
pub fn copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy of unequal lengths");
    #[cfg(target_arch = "x86_64")]
    {
        // The first test keeps small copies (every fastbox frame) off the threshold's lookup.
        if src.len() >= STREAM_MIN && src.len() >= stream_threshold() && simd::copy_stream(dst, src)
        {
            return;
        }
        let gap = (dst.as_ptr() as usize).wrapping_sub(src.as_ptr() as usize) & 4095;
        if src.len() >= 1024 && (1..64).contains(&gap) && simd::copy(dst, src) {
            return;
        }
    }
    dst.copy_from_slice(src);
}

/// The smallest `stream_threshold()`.
const STREAM_MIN: usize = 1 << 20;

/// The size from which `copy` streams: a quarter of the last-level cache (every core of a
/// collective copies at once, and each copy needs its source and its destination), 8 MiB where
/// the cache's size is unknown, never below `STREAM_MIN`.
pub fn stream_threshold() -> usize {
    static T: OnceLock<usize> = OnceLock::new();
    *T.get_or_init(|| {
        last_level_cache("/sys/devices/system/cpu/cpu0/cache")
            .map_or(8 << 20, |c| (c / 4).max(STREAM_MIN))
    })
}

/// The size of the highest-level cache listed under `dir` (sysfs: `index*/level`, `size` as
/// "32768K"), if any.
fn last_level_cache(dir: &str) -> Option<usize> {
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok();
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let level: u32 = read(e.path().join("level"))?.trim().parse().ok()?;
            let size = read(e.path().join("size"))?;
            Some((level, parse_cache_size(size.trim())?))
        })
        .max()
        .map(|(_, size)| size)
}

/// "32768K", "2M", "512" (bytes) as bytes.
fn parse_cache_size(s: &str) -> Option<usize> {
    let (num, unit) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 1 << 10),
        b'M' | b'm' => (&s[..s.len() - 1], 1 << 20),
        b'G' | b'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok()?.checked_mul(unit)
}

/// Avg's final step: `acc[i] = acc[i] / n` in the type's arithmetic (integers truncate toward
/// zero; floats divide by `n` converted to the type's computation type, f32 for f16, bf16 and
/// fp8, with one rounding). `n >= 1`.
pub fn scale_avg(dt: DataType, acc: &mut [u8], n: usize) -> Result<(), ReduceError> {
    check_multiple(dt, "acc", acc)?;
    if n == 0 {
        return Err(ReduceError::ZeroDivisor);
    }
    scale(dt, acc, n, true);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Dispatch. `fast == false` forces the scalar reference (for the tests): no SIMD, no tables.

fn binary(dt: DataType, k: Kind, a: &[u8], b: &[u8], dst: &mut [u8], fast: bool) {
    #[cfg(target_arch = "x86_64")]
    if fast {
        let done = match dt {
            DataType::Float32 => simd::binary::<{ simd::F32 }>(k, a, b, dst),
            DataType::Float16 => simd::binary::<{ simd::F16 }>(k, a, b, dst),
            DataType::Bfloat16 => simd::binary::<{ simd::BF16 }>(k, a, b, dst),
            _ => 0,
        };
        if done > 0 {
            return binary(dt, k, &a[done..], &b[done..], &mut dst[done..], false);
        }
    }
    match dt {
        DataType::Int8 => scalar::binary::<i8>(k, a, b, dst),
        DataType::Uint8 => scalar::binary::<u8>(k, a, b, dst),
        DataType::Int32 => scalar::binary::<i32>(k, a, b, dst),
        DataType::Uint32 => scalar::binary::<u32>(k, a, b, dst),
        DataType::Int64 => scalar::binary::<i64>(k, a, b, dst),
        DataType::Uint64 => scalar::binary::<u64>(k, a, b, dst),
        DataType::Float16 => scalar::binary::<F16>(k, a, b, dst),
        DataType::Float32 => scalar::binary::<f32>(k, a, b, dst),
        DataType::Float64 => scalar::binary::<f64>(k, a, b, dst),
        DataType::Bfloat16 => scalar::binary::<Bf16>(k, a, b, dst),
        DataType::Float8E4M3 | DataType::Float8E5M2 if fast && dst.len() >= FP8_TABLE_MIN => {
            let t = fp8_table(dt, k);
            for ((d, &x), &y) in dst.iter_mut().zip(a).zip(b) {
                *d = t[usize::from(x) << 8 | usize::from(y)];
            }
        }
        DataType::Float8E4M3 => scalar::binary::<E4m3>(k, a, b, dst),
        DataType::Float8E5M2 => scalar::binary::<E5m2>(k, a, b, dst),
    }
}

fn inplace(dt: DataType, k: Kind, acc: &mut [u8], b: &[u8], fast: bool) {
    #[cfg(target_arch = "x86_64")]
    if fast {
        let done = match dt {
            DataType::Float32 => simd::inplace::<{ simd::F32 }>(k, acc, b),
            DataType::Float16 => simd::inplace::<{ simd::F16 }>(k, acc, b),
            DataType::Bfloat16 => simd::inplace::<{ simd::BF16 }>(k, acc, b),
            _ => 0,
        };
        if done > 0 {
            return inplace(dt, k, &mut acc[done..], &b[done..], false);
        }
    }
    match dt {
        DataType::Int8 => scalar::inplace::<i8>(k, acc, b),
        DataType::Uint8 => scalar::inplace::<u8>(k, acc, b),
        DataType::Int32 => scalar::inplace::<i32>(k, acc, b),
        DataType::Uint32 => scalar::inplace::<u32>(k, acc, b),
        DataType::Int64 => scalar::inplace::<i64>(k, acc, b),
        DataType::Uint64 => scalar::inplace::<u64>(k, acc, b),
        DataType::Float16 => scalar::inplace::<F16>(k, acc, b),
        DataType::Float32 => scalar::inplace::<f32>(k, acc, b),
        DataType::Float64 => scalar::inplace::<f64>(k, acc, b),
        DataType::Bfloat16 => scalar::inplace::<Bf16>(k, acc, b),
        DataType::Float8E4M3 | DataType::Float8E5M2 if fast && acc.len() >= FP8_TABLE_MIN => {
            let t = fp8_table(dt, k);
            for (d, &y) in acc.iter_mut().zip(b) {
                *d = t[usize::from(*d) << 8 | usize::from(y)];
            }
        }
        DataType::Float8E4M3 => scalar::inplace::<E4m3>(k, acc, b),
        DataType::Float8E5M2 => scalar::inplace::<E5m2>(k, acc, b),
    }
}

fn scale(dt: DataType, acc: &mut [u8], n: usize, fast: bool) {
    #[cfg(target_arch = "x86_64")]
    if fast {
        let d = n as f32;
        let done = match dt {
            DataType::Float32 => simd::scale::<{ simd::F32 }>(acc, d),
            DataType::Float16 => simd::scale::<{ simd::F16 }>(acc, d),
            DataType::Bfloat16 => simd::scale::<{ simd::BF16 }>(acc, d),
            _ => 0,
        };
        if done > 0 {
            return scale(dt, &mut acc[done..], n, false);
        }
    }
    match dt {
        // One-byte types: a 256-entry table for this n, from the scalar rule.
        DataType::Int8 | DataType::Uint8 | DataType::Float8E4M3 | DataType::Float8E5M2 if fast => {
            let mut map = [0u8; 256];
            for (c, m) in map.iter_mut().enumerate() {
                let mut one = [c as u8];
                scale(dt, &mut one, n, false);
                *m = one[0];
            }
            scalar::map_bytes(acc, &map);
        }
        DataType::Int8 => scalar::scale::<i8>(acc, n),
        DataType::Uint8 => scalar::scale::<u8>(acc, n),
        DataType::Int32 if fast => scalar::scale_i32(acc, n),
        DataType::Uint32 if fast => scalar::scale_u32(acc, n),
        DataType::Int32 => scalar::scale::<i32>(acc, n),
        DataType::Uint32 => scalar::scale::<u32>(acc, n),
        DataType::Int64 => scalar::scale::<i64>(acc, n),
        DataType::Uint64 => scalar::scale::<u64>(acc, n),
        DataType::Float16 => scalar::scale::<F16>(acc, n),
        DataType::Float32 => scalar::scale::<f32>(acc, n),
        DataType::Float64 => scalar::scale::<f64>(acc, n),
        DataType::Bfloat16 => scalar::scale::<Bf16>(acc, n),
        DataType::Float8E4M3 => scalar::scale::<E4m3>(acc, n),
        DataType::Float8E5M2 => scalar::scale::<E5m2>(acc, n),
    }
}

/// fp8 slices of at least this many elements go through a table (smaller ones are not worth
/// building it for).
const FP8_TABLE_MIN: usize = 4096;

/// The 64 KiB table `t[a << 8 | b] = a ⊕ b` of an fp8 type and op, built once from the scalar
/// reference.
fn fp8_table(dt: DataType, k: Kind) -> &'static [u8] {
    static TABLES: [OnceLock<Box<[u8]>>; 2 * Kind::COUNT] =
        [const { OnceLock::new() }; 2 * Kind::COUNT];
    let (slot, build): (usize, fn(Kind, u8, u8) -> u8) = match dt {
        DataType::Float8E4M3 => (0, |k, x, y| fp8_op::<E4m3>(k, E4m3(x), E4m3(y)).0),
        _ => (Kind::COUNT, |k, x, y| fp8_op::<E5m2>(k, E5m2(x), E5m2(y)).0),
    };
    let slot = slot + k as usize;
    TABLES[slot].get_or_init(|| {
        (0..=0xffffu32)
            .map(|i| build(k, (i >> 8) as u8, i as u8))
            .collect()
    })
}

fn fp8_op<T: Elem>(k: Kind, x: T, y: T) -> T {
    match k {
        Kind::Sum => x.op_sum(y),
        Kind::Prod => x.op_prod(y),
        Kind::Max => x.op_max(y),
        Kind::Min => x.op_min(y),
        Kind::BAnd => x.op_band(y),
        Kind::BOr => x.op_bor(y),
        Kind::BXor => x.op_bxor(y),
    }
}

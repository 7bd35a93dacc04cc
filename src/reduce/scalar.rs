//! The scalar kernels: the reference semantics of every dtype x op, on unaligned byte slices.
//! Safe code; the integer and f32 / f64 loops are left for the compiler to vectorize.
#![forbid(unsafe_code)]

use super::conv::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use super::fp8::{e4m3_to_f32, e5m2_to_f32, f32_to_e4m3, f32_to_e5m2};
use super::Kind;

/// The canonical NaNs: every NaN a kernel writes is one of these.
pub(super) const CANON_F32: u32 = 0x7fc0_0000;
pub(super) const CANON_F64: u64 = 0x7ff8_0000_0000_0000;

/// One element type: unaligned load and store, and the combining ops.
///
/// The bitwise ops combine the raw bits. `reduce` allows them on integer types only; the
/// floating-point types have them (on their codes) only so that every kernel is total.
pub(super) trait Elem: Copy {
    const SIZE: usize;
    /// `b.len() == SIZE`.
    fn read(b: &[u8]) -> Self;
    /// `out.len() == SIZE`.
    fn write(self, out: &mut [u8]);
    fn op_sum(self, o: Self) -> Self;
    fn op_prod(self, o: Self) -> Self;
    fn op_max(self, o: Self) -> Self;
    fn op_min(self, o: Self) -> Self;
    fn op_band(self, o: Self) -> Self;
    fn op_bor(self, o: Self) -> Self;
    fn op_bxor(self, o: Self) -> Self;
    /// `self / n` for Avg (n >= 1).
    fn div_n(self, n: usize) -> Self;
}

macro_rules! int_elem {
    ($t:ty, $n:expr, $div:ident) => {
        impl Elem for $t {
            const SIZE: usize = $n;
            #[inline(always)]
            fn read(b: &[u8]) -> Self {
                <$t>::from_ne_bytes(b.try_into().unwrap())
            }
            #[inline(always)]
            fn write(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_ne_bytes())
            }
            #[inline(always)]
            fn op_sum(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn op_prod(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline(always)]
            fn op_max(self, o: Self) -> Self {
                Ord::max(self, o)
            }
            #[inline(always)]
            fn op_min(self, o: Self) -> Self {
                Ord::min(self, o)
            }
            #[inline(always)]
            fn op_band(self, o: Self) -> Self {
                self & o
            }
            #[inline(always)]
            fn op_bor(self, o: Self) -> Self {
                self | o
            }
            #[inline(always)]
            fn op_bxor(self, o: Self) -> Self {
                self ^ o
            }
            #[inline(always)]
            fn div_n(self, n: usize) -> Self {
                $div(self, n)
            }
        }
    };
}

// Integer Avg: truncating division toward zero. n >= 1, so no division overflows.
#[inline(always)]
fn div_i8(x: i8, n: usize) -> i8 {
    (i64::from(x) / n.min(1 << 20) as i64) as i8
}
#[inline(always)]
fn div_u8(x: u8, n: usize) -> u8 {
    (u64::from(x) / n as u64) as u8
}
#[inline(always)]
fn div_i32(x: i32, n: usize) -> i32 {
    (i64::from(x) / n.min(1 << 40) as i64) as i32
}
#[inline(always)]
fn div_u32(x: u32, n: usize) -> u32 {
    (u64::from(x) / n as u64) as u32
}
#[inline(always)]
fn div_i64(x: i64, n: usize) -> i64 {
    match i64::try_from(n) {
        Ok(n) => x / n,
        Err(_) => (i128::from(x) / n as i128) as i64,
    }
}
#[inline(always)]
fn div_u64(x: u64, n: usize) -> u64 {
    x / n as u64
}

int_elem!(i8, 1, div_i8);
int_elem!(u8, 1, div_u8);
int_elem!(i32, 4, div_i32);
int_elem!(u32, 4, div_u32);
int_elem!(i64, 8, div_i64);
int_elem!(u64, 8, div_u64);

/// NaN -> the canonical quiet NaN.
#[inline(always)]
pub(super) fn canon32(x: f32) -> f32 {
    if x.is_nan() {
        f32::from_bits(CANON_F32)
    } else {
        x
    }
}

#[inline(always)]
fn canon64(x: f64) -> f64 {
    if x.is_nan() {
        f64::from_bits(CANON_F64)
    } else {
        x
    }
}

/// Max for floats: if exactly one operand is NaN the other is returned (IEEE maxNum, CUDA
/// `fmaxf`); two NaNs give the canonical NaN; +0 is larger than -0.
#[inline(always)]
pub(super) fn fmax32(a: f32, b: f32) -> f32 {
    if a.is_nan() {
        canon32(b)
    } else if b.is_nan() {
        a
    } else if a == b {
        f32::from_bits(a.to_bits() & b.to_bits()) // +0 if either is +0
    } else if a > b {
        a
    } else {
        b
    }
}

/// Min for floats: as `fmax32`, with -0 smaller than +0.
#[inline(always)]
pub(super) fn fmin32(a: f32, b: f32) -> f32 {
    if a.is_nan() {
        canon32(b)
    } else if b.is_nan() {
        a
    } else if a == b {
        f32::from_bits(a.to_bits() | b.to_bits()) // -0 if either is -0
    } else if a < b {
        a
    } else {
        b
    }
}

#[inline(always)]
fn fmax64(a: f64, b: f64) -> f64 {
    if a.is_nan() {
        canon64(b)
    } else if b.is_nan() {
        a
    } else if a == b {
        f64::from_bits(a.to_bits() & b.to_bits())
    } else if a > b {
        a
    } else {
        b
    }
}

#[inline(always)]
fn fmin64(a: f64, b: f64) -> f64 {
    if a.is_nan() {
        canon64(b)
    } else if b.is_nan() {
        a
    } else if a == b {
        f64::from_bits(a.to_bits() | b.to_bits())
    } else if a < b {
        a
    } else {
        b
    }
}

impl Elem for f32 {
    const SIZE: usize = 4;
    #[inline(always)]
    fn read(b: &[u8]) -> Self {
        f32::from_ne_bytes(b.try_into().unwrap())
    }
    #[inline(always)]
    fn write(self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_ne_bytes())
    }
    #[inline(always)]
    fn op_sum(self, o: Self) -> Self {
        canon32(self + o)
    }
    #[inline(always)]
    fn op_prod(self, o: Self) -> Self {
        canon32(self * o)
    }
    #[inline(always)]
    fn op_max(self, o: Self) -> Self {
        fmax32(self, o)
    }
    #[inline(always)]
    fn op_min(self, o: Self) -> Self {
        fmin32(self, o)
    }
    #[inline(always)]
    fn op_band(self, o: Self) -> Self {
        f32::from_bits(self.to_bits() & o.to_bits())
    }
    #[inline(always)]
    fn op_bor(self, o: Self) -> Self {
        f32::from_bits(self.to_bits() | o.to_bits())
    }
    #[inline(always)]
    fn op_bxor(self, o: Self) -> Self {
        f32::from_bits(self.to_bits() ^ o.to_bits())
    }
    #[inline(always)]
    fn div_n(self, n: usize) -> Self {
        canon32(self / n as f32)
    }
}

impl Elem for f64 {
    const SIZE: usize = 8;
    #[inline(always)]
    fn read(b: &[u8]) -> Self {
        f64::from_ne_bytes(b.try_into().unwrap())
    }
    #[inline(always)]
    fn write(self, out: &mut [u8]) {
        out.copy_from_slice(&self.to_ne_bytes())
    }
    #[inline(always)]
    fn op_sum(self, o: Self) -> Self {
        canon64(self + o)
    }
    #[inline(always)]
    fn op_prod(self, o: Self) -> Self {
        canon64(self * o)
    }
    #[inline(always)]
    fn op_max(self, o: Self) -> Self {
        fmax64(self, o)
    }
    #[inline(always)]
    fn op_min(self, o: Self) -> Self {
        fmin64(self, o)
    }
    #[inline(always)]
    fn op_band(self, o: Self) -> Self {
        f64::from_bits(self.to_bits() & o.to_bits())
    }
    #[inline(always)]
    fn op_bor(self, o: Self) -> Self {
        f64::from_bits(self.to_bits() | o.to_bits())
    }
    #[inline(always)]
    fn op_bxor(self, o: Self) -> Self {
        f64::from_bits(self.to_bits() ^ o.to_bits())
    }
    #[inline(always)]
    fn div_n(self, n: usize) -> Self {
        canon64(self / n as f64)
    }
}

/// Reduced-precision floats: widen to f32, combine in f32 (the f32 rules above, so NaNs are
/// canonical), round back once.
macro_rules! narrow_float_elem {
    ($name:ident, $bits:ty, $to32:expr, $from32:expr) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(super) struct $name(pub(super) $bits);

        impl $name {
            #[inline(always)]
            fn f(self) -> f32 {
                $to32(self.0)
            }
            #[inline(always)]
            fn from_f32(x: f32) -> Self {
                $name($from32(x))
            }
        }

        impl Elem for $name {
            const SIZE: usize = std::mem::size_of::<$bits>();
            #[inline(always)]
            fn read(b: &[u8]) -> Self {
                $name(<$bits>::from_ne_bytes(b.try_into().unwrap()))
            }
            #[inline(always)]
            fn write(self, out: &mut [u8]) {
                out.copy_from_slice(&self.0.to_ne_bytes())
            }
            #[inline(always)]
            fn op_sum(self, o: Self) -> Self {
                Self::from_f32(canon32(self.f() + o.f()))
            }
            #[inline(always)]
            fn op_prod(self, o: Self) -> Self {
                Self::from_f32(canon32(self.f() * o.f()))
            }
            #[inline(always)]
            fn op_max(self, o: Self) -> Self {
                Self::from_f32(fmax32(self.f(), o.f()))
            }
            #[inline(always)]
            fn op_min(self, o: Self) -> Self {
                Self::from_f32(fmin32(self.f(), o.f()))
            }
            #[inline(always)]
            fn op_band(self, o: Self) -> Self {
                $name(self.0 & o.0)
            }
            #[inline(always)]
            fn op_bor(self, o: Self) -> Self {
                $name(self.0 | o.0)
            }
            #[inline(always)]
            fn op_bxor(self, o: Self) -> Self {
                $name(self.0 ^ o.0)
            }
            #[inline(always)]
            fn div_n(self, n: usize) -> Self {
                Self::from_f32(canon32(self.f() / n as f32))
            }
        }
    };
}

narrow_float_elem!(F16, u16, f16_to_f32, f32_to_f16);
narrow_float_elem!(Bf16, u16, bf16_to_f32, f32_to_bf16);
narrow_float_elem!(E4m3, u8, e4m3_to_f32, f32_to_e4m3);
narrow_float_elem!(E5m2, u8, e5m2_to_f32, f32_to_e5m2);

#[inline(always)]
fn binary_with<T: Elem>(a: &[u8], b: &[u8], dst: &mut [u8], f: impl Fn(T, T) -> T) {
    let (a, b) = (&a[..dst.len()], &b[..dst.len()]);
    for ((d, x), y) in dst
        .chunks_exact_mut(T::SIZE)
        .zip(a.chunks_exact(T::SIZE))
        .zip(b.chunks_exact(T::SIZE))
    {
        f(T::read(x), T::read(y)).write(d);
    }
}

#[inline(always)]
fn inplace_with<T: Elem>(acc: &mut [u8], b: &[u8], f: impl Fn(T, T) -> T) {
    let b = &b[..acc.len()];
    for (d, y) in acc.chunks_exact_mut(T::SIZE).zip(b.chunks_exact(T::SIZE)) {
        let x = T::read(d);
        f(x, T::read(y)).write(d);
    }
}

/// `dst[i] = a[i] op b[i]`. The lengths are equal multiples of `T::SIZE` (checked by the caller).
pub(super) fn binary<T: Elem>(op: Kind, a: &[u8], b: &[u8], dst: &mut [u8]) {
    match op {
        Kind::Sum => binary_with::<T>(a, b, dst, T::op_sum),
        Kind::Prod => binary_with::<T>(a, b, dst, T::op_prod),
        Kind::Max => binary_with::<T>(a, b, dst, T::op_max),
        Kind::Min => binary_with::<T>(a, b, dst, T::op_min),
        Kind::BAnd => binary_with::<T>(a, b, dst, T::op_band),
        Kind::BOr => binary_with::<T>(a, b, dst, T::op_bor),
        Kind::BXor => binary_with::<T>(a, b, dst, T::op_bxor),
    }
}

/// `acc[i] = acc[i] op b[i]`.
pub(super) fn inplace<T: Elem>(op: Kind, acc: &mut [u8], b: &[u8]) {
    match op {
        Kind::Sum => inplace_with::<T>(acc, b, T::op_sum),
        Kind::Prod => inplace_with::<T>(acc, b, T::op_prod),
        Kind::Max => inplace_with::<T>(acc, b, T::op_max),
        Kind::Min => inplace_with::<T>(acc, b, T::op_min),
        Kind::BAnd => inplace_with::<T>(acc, b, T::op_band),
        Kind::BOr => inplace_with::<T>(acc, b, T::op_bor),
        Kind::BXor => inplace_with::<T>(acc, b, T::op_bxor),
    }
}

/// `acc[i] = acc[i] / n`.
pub(super) fn scale<T: Elem>(acc: &mut [u8], n: usize) {
    for d in acc.chunks_exact_mut(T::SIZE) {
        T::read(d).div_n(n).write(d);
    }
}

/// Exact division of 32-bit integers by a fixed divisor, by a multiplication (Lemire, Kaser and
/// Kurz, "Faster remainder by direct computation", 2019: for x < 2^32 and 1 <= d <= 2^32,
/// floor(x / d) = floor(c * x / 2^64) with c = ceil(2^64 / d)). Hardware division of 64-bit
/// operands costs ten or more cycles per element; this, two or three.
#[derive(Clone, Copy)]
pub(super) struct Div32 {
    /// 0 when d > u32::MAX (every quotient is 0).
    c: u128,
}

impl Div32 {
    pub(super) fn new(d: usize) -> Div32 {
        assert!(d >= 1);
        let c = if d as u128 > u128::from(u32::MAX) {
            0
        } else {
            (1u128 << 64).div_ceil(d as u128)
        };
        Div32 { c }
    }

    #[inline(always)]
    pub(super) fn div(self, x: u32) -> u32 {
        ((self.c * u128::from(x)) >> 64) as u32
    }

    /// Truncating toward zero.
    #[inline(always)]
    pub(super) fn div_signed(self, x: i32) -> i32 {
        // |x| / d <= 2^31, and 2^31 only for x < 0. Negate without a branch: s is 0 or -1.
        let q = self.div(x.unsigned_abs()) as i32;
        let s = x >> 31;
        (q ^ s).wrapping_sub(s)
    }
}

/// `acc[i] = acc[i] / n` for i32 (truncating), by `Div32`.
pub(super) fn scale_i32(acc: &mut [u8], n: usize) {
    let d = Div32::new(n);
    for e in acc.chunks_exact_mut(4) {
        d.div_signed(i32::read(e)).write(e);
    }
}

/// `acc[i] = acc[i] / n` for u32, by `Div32`.
pub(super) fn scale_u32(acc: &mut [u8], n: usize) {
    let d = Div32::new(n);
    for e in acc.chunks_exact_mut(4) {
        d.div(u32::read(e)).write(e);
    }
}

/// `acc[i] = map[acc[i]]` for one-byte types.
pub(super) fn map_bytes(acc: &mut [u8], map: &[u8; 256]) {
    for x in acc.iter_mut() {
        *x = map[*x as usize];
    }
}

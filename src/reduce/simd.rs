//! x86_64 AVX2 + F16C kernels for f32, f16 and bf16 (sum, prod, max, min, and Avg's scaling), and
//! the AVX2 copies that `reduce::copy` uses where `rep movsb` is slow and where a copy is larger
//! than the cache can keep.
//!
//! Each lane widens to f32 (exactly), combines with exactly the scalar rules (`scalar::fmax32`
//! etc.: canonical NaN, maxNum / minNum, +0 > -0) and rounds back to nearest even, so every
//! kernel gives the scalar kernels' bits. The kernels process whole vectors of 8 elements and
//! return how many elements they did; the caller finishes the tail with the scalar kernel. The
//! safe wrappers check the CPU (`is_x86_feature_detected!`, cached by std) and the lengths.
//!
//! This is the only file of `reduce/` with `unsafe`.

use core::arch::x86_64::*;

use super::Kind;

/// Element formats, as const-generic parameters.
pub(super) const F32: u8 = 0;
pub(super) const F16: u8 = 1;
pub(super) const BF16: u8 = 2;

const SUM: u8 = 0;
const PROD: u8 = 1;
const MAX: u8 = 2;
const MIN: u8 = 3;

/// Whether this CPU runs the kernels (AVX2 and F16C: every x86-64-v3 CPU).
#[inline]
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")
}

const fn width(fmt: u8) -> usize {
    if fmt == F32 {
        4
    } else {
        2
    }
}

/// Loads 8 elements of format `FMT` from `p` (any alignment) as 8 f32.
///
/// # Safety
/// AVX2 and F16C are available; `p` is valid for reading 8 elements.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn load8<const FMT: u8>(p: *const u8) -> __m256 {
    match FMT {
        F32 => _mm256_loadu_ps(p as *const f32),
        F16 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
        _ => {
            let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w))
        }
    }
}

/// Stores 8 f32 as format `FMT` at `p` (any alignment), rounding to nearest even. `v` holds no
/// NaN other than the canonical one (the bf16 rounding relies on it).
///
/// # Safety
/// AVX2 and F16C are available; `p` is valid for writing 8 elements.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn store8<const FMT: u8>(p: *mut u8, v: __m256) {
    match FMT {
        F32 => _mm256_storeu_ps(p as *mut f32, v),
        F16 => _mm_storeu_si128(
            p as *mut __m128i,
            _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v),
        ),
        _ => {
            // bits + 0x7fff + lsb, >> 16: round to nearest even (0x7fc00000 -> 0x7fc0).
            let x = _mm256_castps_si256(v);
            let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(1));
            let x = _mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
            let x = _mm256_srli_epi32::<16>(x);
            let lo = _mm256_castsi256_si128(x);
            let packed = _mm_packus_epi32(lo, _mm256_extracti128_si256::<1>(x));
            _mm_storeu_si128(p as *mut __m128i, packed)
        }
    }
}

/// NaN lanes -> the canonical NaN.
///
/// # Safety
/// AVX2 is available.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn canon(r: __m256) -> __m256 {
    let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(r, r);
    _mm256_blendv_ps(r, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc0_0000)), nan)
}

/// `a op b` per lane, with the scalar rules.
///
/// # Safety
/// AVX2 is available.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn combine<const OP: u8>(a: __m256, b: __m256) -> __m256 {
    match OP {
        SUM => canon(_mm256_add_ps(a, b)),
        PROD => canon(_mm256_mul_ps(a, b)),
        _ => {
            // vmaxps / vminps return the second operand when either is NaN or both are zero.
            let t = if OP == MAX {
                _mm256_max_ps(a, b)
            } else {
                _mm256_min_ps(a, b)
            };
            // b NaN: a (maxNum).
            let t = _mm256_blendv_ps(t, a, _mm256_cmp_ps::<_CMP_UNORD_Q>(b, b));
            // Equal (±0 included): +0 wins for max (and), -0 for min (or).
            let eq = _mm256_cmp_ps::<_CMP_EQ_OQ>(a, b);
            let z = if OP == MAX {
                _mm256_and_ps(a, b)
            } else {
                _mm256_or_ps(a, b)
            };
            // Both NaN: t is a's NaN here; canonicalize.
            canon(_mm256_blendv_ps(t, z, eq))
        }
    }
}

/// `dst[i] = a[i] op b[i]` for `i < n / 8 * 8`; returns that count. `dst` may equal `a`
/// (in-place), element for element; no other overlap.
///
/// # Safety
/// AVX2 and F16C are available; `a`, `b` valid for reading and `dst` for writing `n` elements
/// of format `FMT`; `dst` either is `a` or overlaps neither `a` nor `b`.
#[target_feature(enable = "avx2,f16c")]
unsafe fn binary_kernel<const FMT: u8, const OP: u8>(
    a: *const u8,
    b: *const u8,
    dst: *mut u8,
    n: usize,
) -> usize {
    let w = width(FMT);
    let mut i = 0;
    // Two vectors per round; each round loads before it stores, so dst == a is fine.
    while i + 16 <= n {
        let (x0, x1) = (load8::<FMT>(a.add(i * w)), load8::<FMT>(a.add((i + 8) * w)));
        let (y0, y1) = (load8::<FMT>(b.add(i * w)), load8::<FMT>(b.add((i + 8) * w)));
        store8::<FMT>(dst.add(i * w), combine::<OP>(x0, y0));
        store8::<FMT>(dst.add((i + 8) * w), combine::<OP>(x1, y1));
        i += 16;
    }
    if i + 8 <= n {
        let r = combine::<OP>(load8::<FMT>(a.add(i * w)), load8::<FMT>(b.add(i * w)));
        store8::<FMT>(dst.add(i * w), r);
        i += 8;
    }
    i
}

/// `acc[i] = acc[i] / d` (canonical NaN) for `i < n / 8 * 8`; returns that count.
///
/// # Safety
/// AVX2 and F16C are available; `acc` valid for reading and writing `n` elements of `FMT`.
#[target_feature(enable = "avx2,f16c")]
unsafe fn scale_kernel<const FMT: u8>(acc: *mut u8, n: usize, d: f32) -> usize {
    let w = width(FMT);
    let dv = _mm256_set1_ps(d);
    let mut i = 0;
    while i + 8 <= n {
        let p = acc.add(i * w);
        store8::<FMT>(p, canon(_mm256_div_ps(load8::<FMT>(p), dv)));
        i += 8;
    }
    i
}

/// # Safety
/// As `binary_kernel`.
unsafe fn dispatch<const FMT: u8>(
    op: Kind,
    a: *const u8,
    b: *const u8,
    dst: *mut u8,
    n: usize,
) -> usize {
    match op {
        Kind::Sum => binary_kernel::<FMT, SUM>(a, b, dst, n),
        Kind::Prod => binary_kernel::<FMT, PROD>(a, b, dst, n),
        Kind::Max => binary_kernel::<FMT, MAX>(a, b, dst, n),
        Kind::Min => binary_kernel::<FMT, MIN>(a, b, dst, n),
        // Bitwise ops are for integer types, never these: none done, the scalar kernel runs.
        Kind::BAnd | Kind::BOr | Kind::BXor => 0,
    }
}

/// `dst = a op b` over the longest prefix of whole vectors; returns the bytes done (0 when the
/// CPU lacks AVX2 / F16C). The caller does the rest.
pub(super) fn binary<const FMT: u8>(op: Kind, a: &[u8], b: &[u8], dst: &mut [u8]) -> usize {
    if !available() {
        return 0;
    }
    let w = width(FMT);
    let n = dst.len() / w;
    assert!(a.len() >= n * w && b.len() >= n * w);
    // SAFETY: AVX2 and F16C were detected just above. `a` and `b` hold at least `n` elements
    // (asserted) and `dst` holds `n`; the kernel only does unaligned loads and stores inside
    // those. `dst` is a `&mut` borrow, so it overlaps neither `a` nor `b`.
    let done = unsafe { dispatch::<FMT>(op, a.as_ptr(), b.as_ptr(), dst.as_mut_ptr(), n) };
    done * w
}

/// `acc = acc op b` over the longest prefix of whole vectors; returns the bytes done.
pub(super) fn inplace<const FMT: u8>(op: Kind, acc: &mut [u8], b: &[u8]) -> usize {
    if !available() {
        return 0;
    }
    let w = width(FMT);
    let n = acc.len() / w;
    assert!(b.len() >= n * w);
    let p = acc.as_mut_ptr();
    // SAFETY: AVX2 and F16C were detected just above. `acc` (read and written through the one
    // pointer `p`, derived from the `&mut` borrow) and `b` hold at least `n` elements; `b`
    // cannot overlap `acc`. Each vector is loaded from `acc` before it is stored back.
    let done = unsafe { dispatch::<FMT>(op, p, b.as_ptr(), p, n) };
    done * w
}

/// `acc = acc / d` over the longest prefix of whole vectors; returns the bytes done.
pub(super) fn scale<const FMT: u8>(acc: &mut [u8], d: f32) -> usize {
    if !available() {
        return 0;
    }
    let w = width(FMT);
    let n = acc.len() / w;
    // SAFETY: AVX2 and F16C were detected just above; `acc` holds `n` elements and the kernel
    // only does unaligned loads and stores inside them.
    let done = unsafe { scale_kernel::<FMT>(acc.as_mut_ptr(), n, d) };
    done * w
}

/// Copy `src` into `dst` (same length) with 32-byte AVX2 loads and stores; false (nothing
/// copied) without AVX2. See `reduce::copy` for why this exists.
pub(super) fn copy(dst: &mut [u8], src: &[u8]) -> bool {
    assert_eq!(dst.len(), src.len(), "copy of unequal lengths");
    if !is_x86_feature_detected!("avx2") {
        return false;
    }
    // SAFETY: AVX2 is present (checked above) and both slices have the same length.
    unsafe { copy_kernel::<false>(dst.as_mut_ptr(), src.as_ptr(), src.len()) };
    true
}

/// Copy `src` into `dst` (same length) with non-temporal (streaming) stores, which write whole
/// lines to memory without first reading them into the cache; false (nothing copied) without
/// AVX2. See `reduce::copy` for when this pays.
pub(super) fn copy_stream(dst: &mut [u8], src: &[u8]) -> bool {
    assert_eq!(dst.len(), src.len(), "copy of unequal lengths");
    if !is_x86_feature_detected!("avx2") {
        return false;
    }
    // Up to the first 32-byte boundary of `dst` with ordinary stores: streaming stores need
    // aligned addresses.
    let head = dst.as_ptr().align_offset(32).min(dst.len());
    let (dh, dt) = dst.split_at_mut(head);
    let (sh, st) = src.split_at(head);
    dh.copy_from_slice(sh);
    // SAFETY: AVX2 is present (checked above); `dt` and `st` have the same length, do not
    // overlap (one is borrowed mutably) and `dt` starts 32-byte aligned.
    unsafe { copy_kernel::<true>(dt.as_mut_ptr(), st.as_ptr(), st.len()) };
    true
}

/// `STREAM`: the 128-byte blocks use streaming stores, fenced before the tail.
///
/// # Safety
/// AVX2 must be available; `dst` and `src` must be valid for `n` bytes and must not overlap;
/// with `STREAM`, `dst` must be 32-byte aligned.
#[target_feature(enable = "avx2")]
unsafe fn copy_kernel<const STREAM: bool>(dst: *mut u8, src: *const u8, n: usize) {
    let mut i = 0;
    while i + 128 <= n {
        // SAFETY: i + 128 <= n, so all four 32-byte loads and stores are in bounds; with
        // STREAM, dst + i is 32-byte aligned (dst is, and i is a multiple of 128).
        unsafe {
            let a = _mm256_loadu_si256(src.add(i) as *const __m256i);
            let b = _mm256_loadu_si256(src.add(i + 32) as *const __m256i);
            let c = _mm256_loadu_si256(src.add(i + 64) as *const __m256i);
            let d = _mm256_loadu_si256(src.add(i + 96) as *const __m256i);
            for (k, v) in [a, b, c, d].into_iter().enumerate() {
                let p = dst.add(i + 32 * k) as *mut __m256i;
                if STREAM {
                    _mm256_stream_si256(p, v);
                } else {
                    _mm256_storeu_si256(p, v);
                }
            }
        }
        i += 128;
    }
    if STREAM {
        // Streaming stores are weakly ordered: fence them before anything that publishes the
        // data (a release store of a ring's tail, a completion another thread or process
        // reads).
        _mm_sfence();
    }
    while i + 32 <= n {
        // SAFETY: i + 32 <= n.
        unsafe {
            let a = _mm256_loadu_si256(src.add(i) as *const __m256i);
            _mm256_storeu_si256(dst.add(i) as *mut __m256i, a);
        }
        i += 32;
    }
    while i < n {
        // SAFETY: i < n.
        unsafe { *dst.add(i) = *src.add(i) };
        i += 1;
    }
}

/// F16C conversions of whole slices, to check the scalar conversions against the hardware.
#[cfg(test)]
pub(super) mod hw {
    use super::*;

    /// `None` when the CPU lacks F16C.
    pub(in super::super) fn f32_to_f16(x: &[f32]) -> Option<Vec<u16>> {
        if !available() {
            return None;
        }
        let mut out = vec![0u16; x.len()];
        for (src, dst) in x.chunks_exact(8).zip(out.chunks_exact_mut(8)) {
            // SAFETY: F16C (and AVX2) detected above; `src` holds 8 f32 and `dst` 8 u16, read
            // and written with unaligned loads and stores.
            unsafe { f32_to_f16_8(src.as_ptr(), dst.as_mut_ptr()) }
        }
        let tail = x.len() / 8 * 8;
        let mut buf = [0f32; 8];
        buf[..x.len() - tail].copy_from_slice(&x[tail..]);
        let mut res = [0u16; 8];
        // SAFETY: as above, on local arrays of 8.
        unsafe { f32_to_f16_8(buf.as_ptr(), res.as_mut_ptr()) }
        out[tail..].copy_from_slice(&res[..x.len() - tail]);
        Some(out)
    }

    /// `None` when the CPU lacks F16C.
    pub(in super::super) fn f16_to_f32(x: &[u16]) -> Option<Vec<f32>> {
        if !available() {
            return None;
        }
        assert_eq!(x.len() % 8, 0);
        let mut out = vec![0f32; x.len()];
        for (src, dst) in x.chunks_exact(8).zip(out.chunks_exact_mut(8)) {
            // SAFETY: F16C detected above; `src` holds 8 u16 and `dst` 8 f32 (unaligned ok).
            unsafe { f16_to_f32_8(src.as_ptr(), dst.as_mut_ptr()) }
        }
        Some(out)
    }

    /// # Safety
    /// F16C available; `src` valid for 8 reads, `dst` for 8 writes.
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn f32_to_f16_8(src: *const f32, dst: *mut u16) {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src));
        _mm_storeu_si128(dst as *mut __m128i, h)
    }

    /// # Safety
    /// F16C available; `src` valid for 8 reads, `dst` for 8 writes.
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn f16_to_f32_8(src: *const u16, dst: *mut f32) {
        _mm256_storeu_ps(dst, _mm256_cvtph_ps(_mm_loadu_si128(src as *const __m128i)))
    }
}

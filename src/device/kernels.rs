//! The reduction kernels' CUDA C source, generated for every (type, op) the host reducers
//! have, and the rules it keeps. NVRTC compiles it at run time for the device's compute
//! capability (`device::cuda`); the emulated device runs the host reducers instead.
//!
//! The source ports the host reducers' semantics (`reduce`'s module documentation) operation by
//! operation, so the device computes the same bits:
//! - integers wrap (computed in unsigned arithmetic: signed overflow is undefined in C); Avg
//!   divides truncating toward zero;
//! - f32 and f64 use one IEEE operation per element (`+`, `*`, `/`), compiled without
//!   contraction into fused multiply-adds (`--fmad=false`), without flushing subnormals
//!   (`--ftz=false`) and with IEEE division (`--prec-div=true`): each is correctly rounded, to
//!   nearest even, as on the host;
//! - f16, bf16 and fp8 widen to f32 exactly, combine with the f32 rules, and round back once,
//!   by the same bit manipulations as `reduce::conv` and `reduce::fp8` (no CUDA headers);
//! - NaNs come out canonical; Max and Min are maxNum / minNum with +0 above -0.
//!
//! So every result is the correctly rounded value of the one operation, the host's result bit
//! for bit: the documented bound is 0 ulp (`FLOAT_ULPS`), and the GPU tests check it. The
//! kernels read each element once and write it once, with no reduction order inside a kernel,
//! so runs are bit-identical.
use crate::reduce::{DataType, RedOp};

/// The largest difference, in units in the last place of the type, between a float kernel's
/// result and the host reducer's: 0, the kernels compute the same correctly rounded value.
pub const FLOAT_ULPS: u32 = 0;

/// Threads per block of every kernel.
pub const BLOCK: u32 = 256;

/// The C type that holds an element of `dt` (its bits, for f16, bf16 and fp8).
pub fn c_type(dt: DataType) -> &'static str {
    match dt {
        DataType::Int8 => "signed char",
        DataType::Uint8 | DataType::Float8E4M3 | DataType::Float8E5M2 => "unsigned char",
        DataType::Int32 => "int",
        DataType::Uint32 => "unsigned int",
        DataType::Int64 => "long long",
        DataType::Uint64 => "unsigned long long",
        DataType::Float16 | DataType::Bfloat16 => "unsigned short",
        DataType::Float32 => "float",
        DataType::Float64 => "double",
    }
}

/// The short name of `dt` in kernel names.
fn tag(dt: DataType) -> &'static str {
    match dt {
        DataType::Int8 => "i8",
        DataType::Uint8 => "u8",
        DataType::Int32 => "i32",
        DataType::Uint32 => "u32",
        DataType::Int64 => "i64",
        DataType::Uint64 => "u64",
        DataType::Float16 => "f16",
        DataType::Float32 => "f32",
        DataType::Float64 => "f64",
        DataType::Bfloat16 => "bf16",
        DataType::Float8E4M3 => "e4m3",
        DataType::Float8E5M2 => "e5m2",
    }
}

/// The kernel that reduces `dt` with `op` (Avg is Sum's kernel).
pub fn reduce_name(dt: DataType, op: RedOp) -> String {
    let op = match op {
        RedOp::Sum | RedOp::Avg => "sum",
        RedOp::Prod => "prod",
        RedOp::Max => "max",
        RedOp::Min => "min",
        RedOp::BAnd => "band",
        RedOp::BOr => "bor",
        RedOp::BXor => "bxor",
    };
    format!("fabricoll_reduce_{}_{op}", tag(dt))
}

/// The kernel of Avg's final division for `dt`.
pub fn scale_name(dt: DataType) -> String {
    format!("fabricoll_scale_{}", tag(dt))
}

/// Every kernel's name.
pub fn names() -> Vec<String> {
    let mut v = Vec::new();
    for dt in DataType::ALL {
        v.extend(
            OPS.iter()
                .filter(|op| op.supports(dt))
                .map(|&op| reduce_name(dt, op)),
        );
        v.push(scale_name(dt));
    }
    v
}

/// The ops that have their own kernel (Avg uses Sum's).
const OPS: [RedOp; 7] = [
    RedOp::Sum,
    RedOp::Prod,
    RedOp::Max,
    RedOp::Min,
    RedOp::BAnd,
    RedOp::BOr,
    RedOp::BXor,
];

/// Helpers: the f32 rules and the conversions of the narrow types.
const PRELUDE: &str = r#"
typedef unsigned int u32;
typedef unsigned long long u64;
__device__ __forceinline__ float canon32(float x) { return x != x ? __int_as_float(0x7fc00000) : x; }
__device__ __forceinline__ double canon64(double x) {
  return x != x ? __longlong_as_double(0x7ff8000000000000LL) : x;
}
__device__ __forceinline__ float fmax32(float a, float b) {
  if (a != a) return canon32(b);
  if (b != b) return a;
  if (a == b) return __int_as_float(__float_as_int(a) & __float_as_int(b));
  return a > b ? a : b;
}
__device__ __forceinline__ float fmin32(float a, float b) {
  if (a != a) return canon32(b);
  if (b != b) return a;
  if (a == b) return __int_as_float(__float_as_int(a) | __float_as_int(b));
  return a < b ? a : b;
}
__device__ __forceinline__ double fmax64(double a, double b) {
  if (a != a) return canon64(b);
  if (b != b) return a;
  if (a == b) return __longlong_as_double(__double_as_longlong(a) & __double_as_longlong(b));
  return a > b ? a : b;
}
__device__ __forceinline__ double fmin64(double a, double b) {
  if (a != a) return canon64(b);
  if (b != b) return a;
  if (a == b) return __longlong_as_double(__double_as_longlong(a) | __double_as_longlong(b));
  return a < b ? a : b;
}
__device__ __forceinline__ u32 sel(bool c, u32 a, u32 b) { return c ? a : b; }
__device__ __forceinline__ float f16_to_f32(unsigned short hs) {
  u32 h = hs;
  u32 sign = (h & 0x8000u) << 16;
  u32 em = h & 0x7fffu;
  u32 normal = (em << 13) + (112u << 23);
  u32 sub = __float_as_uint((float)em * __uint_as_float(103u << 23));
  u32 inf_nan = (em << 13) | 0x7f800000u | sel(em > 0x7c00u, 0x400000u, 0u);
  return __uint_as_float(sign | sel(em < 0x400u, sub, sel(em >= 0x7c00u, inf_nan, normal)));
}
__device__ __forceinline__ unsigned short f32_to_f16(float x) {
  u32 bits = __float_as_uint(x);
  u32 sign = (bits >> 16) & 0x8000u;
  u32 abs = bits & 0x7fffffffu;
  u32 nan_inf = sel(abs > 0x7f800000u, 0x7e00u | ((abs >> 13) & 0x3ffu), 0x7c00u);
  u32 normal = ((abs + 0x0fffu + ((abs >> 13) & 1u)) >> 13) - (112u << 10);
  u32 sub = __float_as_uint(__fadd_rn(__uint_as_float(abs), 0.5f)) - 0x3f000000u;
  u32 r = sel(abs >= 0x47800000u, nan_inf, sel(abs < 0x38800000u, sub, normal));
  return (unsigned short)(sign | r);
}
__device__ __forceinline__ float bf16_to_f32(unsigned short h) { return __uint_as_float(((u32)h) << 16); }
__device__ __forceinline__ unsigned short f32_to_bf16(float x) {
  u32 bits = __float_as_uint(x);
  u32 rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  return (unsigned short)sel((bits & 0x7fffffffu) > 0x7f800000u, (bits >> 16) | 0x40u, rounded);
}
/* fp8: man_bits, bias, largest finite code, canonical NaN code, has infinities. */
__device__ __forceinline__ float fp8_to_f32(unsigned char c8, u32 man_bits, u32 bias, bool has_inf) {
  u32 code = c8;
  u32 sign = (code & 0x80u) << 24;
  u32 exp_mask = (1u << (7u - man_bits)) - 1u;
  u32 man_mask = (1u << man_bits) - 1u;
  u32 e = (code >> man_bits) & exp_mask;
  u32 m = code & man_mask;
  bool special = has_inf ? (e == exp_mask) : (e == exp_mask && m == man_mask);
  u32 out;
  if (special) {
    out = m == 0u ? (sign | 0x7f800000u) : (sign | 0x7fc00000u | (m << (23u - man_bits)));
  } else if (e == 0u) {
    if (m == 0u) {
      out = sign;
    } else {
      u32 p = 31u - (u32)__clz(m);
      u32 biased = p + 128u - bias - man_bits;
      out = sign | (biased << 23) | ((m << (23u - p)) & 0x7fffffu);
    }
  } else {
    out = sign | ((e + 127u - bias) << 23) | (m << (23u - man_bits));
  }
  return __uint_as_float(out);
}
__device__ __forceinline__ unsigned char f32_to_fp8(float x, u32 man_bits, u32 bias, u32 max_code,
                                                    unsigned char nan_code) {
  u32 bits = __float_as_uint(x);
  unsigned char sign = (unsigned char)((bits >> 24) & 0x80u);
  u32 abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return nan_code;
  unsigned char over = (unsigned char)(sign | max_code); /* __NV_SATFINITE */
  u32 shift = 23u - man_bits;
  u32 min_normal = 128u - bias;
  u32 e = abs >> 23;
  if (e >= min_normal) {
    u32 max_bits = (max_code + ((127u - bias) << man_bits)) << shift;
    if (abs > max_bits) return over;
    u32 r = abs + (1u << (shift - 1u)) - 1u + ((abs >> shift) & 1u);
    u32 code = (r >> shift) - ((127u - bias) << man_bits);
    if (code > max_code) return over;
    return (unsigned char)(sign | code);
  }
  u32 s = 151u - bias - man_bits - e;
  if (s > 24u) return sign;
  u32 m = (abs & 0x7fffffu) | 0x800000u;
  return (unsigned char)(sign | ((m + (1u << (s - 1u)) - 1u + ((m >> s) & 1u)) >> s));
}
__device__ __forceinline__ float e4m3_to_f32(unsigned char c) { return fp8_to_f32(c, 3u, 7u, false); }
__device__ __forceinline__ unsigned char f32_to_e4m3(float x) { return f32_to_fp8(x, 3u, 7u, 0x7eu, 0x7f); }
__device__ __forceinline__ float e5m2_to_f32(unsigned char c) { return fp8_to_f32(c, 2u, 15u, true); }
__device__ __forceinline__ unsigned char f32_to_e5m2(float x) { return f32_to_fp8(x, 2u, 15u, 0x7bu, 0x7e); }
"#;

/// The C expression of `x ⊕ y` for `dt` and `op` (both of `c_type(dt)`).
fn expr(dt: DataType, op: RedOp) -> String {
    use DataType as D;
    let int_arith = |u: &str, sym: &str| format!("({t})(({u})x {sym} ({u})y)", t = c_type(dt));
    match dt {
        D::Int8 | D::Uint8 | D::Int32 | D::Uint32 | D::Int64 | D::Uint64 => {
            let u = match dt.size() {
                1 => "unsigned char",
                4 => "u32",
                _ => "u64",
            };
            match op {
                RedOp::Sum | RedOp::Avg => int_arith(u, "+"),
                RedOp::Prod => int_arith(u, "*"),
                RedOp::Max => "(x > y ? x : y)".into(),
                RedOp::Min => "(x < y ? x : y)".into(),
                RedOp::BAnd => "(x & y)".into(),
                RedOp::BOr => "(x | y)".into(),
                RedOp::BXor => "(x ^ y)".into(),
            }
        }
        D::Float32 | D::Float64 => {
            let w = if dt == D::Float32 { "32" } else { "64" };
            match op {
                RedOp::Sum | RedOp::Avg => format!("canon{w}(x + y)"),
                RedOp::Prod => format!("canon{w}(x * y)"),
                RedOp::Max => format!("fmax{w}(x, y)"),
                RedOp::Min => format!("fmin{w}(x, y)"),
                _ => unreachable!("bitwise ops are for integer types"),
            }
        }
        D::Float16 | D::Bfloat16 | D::Float8E4M3 | D::Float8E5M2 => {
            let name = match dt {
                D::Float16 => "f16",
                D::Bfloat16 => "bf16",
                D::Float8E4M3 => "e4m3",
                _ => "e5m2",
            };
            let (a, b) = (format!("{name}_to_f32(x)"), format!("{name}_to_f32(y)"));
            let f = match op {
                RedOp::Sum | RedOp::Avg => format!("canon32({a} + {b})"),
                RedOp::Prod => format!("canon32({a} * {b})"),
                RedOp::Max => format!("fmax32({a}, {b})"),
                RedOp::Min => format!("fmin32({a}, {b})"),
                _ => unreachable!("bitwise ops are for integer types"),
            };
            format!("f32_to_{name}({f})")
        }
    }
}

/// The C expression of `x / n` (Avg's last step) for `dt`; `n` is a `u64`, at least 1.
fn scale_expr(dt: DataType) -> &'static str {
    use DataType as D;
    match dt {
        // Truncating toward zero, as C's signed division; a divisor past i64's range gives 0
        // (or -1, for i64::MIN / 2^63).
        D::Int8 | D::Int32 | D::Int64 => {
            "(n > 0x7fffffffffffffffULL ? ((long long)x == -0x7fffffffffffffffLL - 1 && \
             n == 0x8000000000000000ULL ? -1 : 0) : (long long)x / (long long)n)"
        }
        D::Uint8 | D::Uint32 | D::Uint64 => "((u64)x / n)",
        D::Float32 => "canon32(x / (float)n)",
        D::Float64 => "canon64(x / (double)n)",
        D::Float16 => "f32_to_f16(canon32(f16_to_f32(x) / (float)n))",
        D::Bfloat16 => "f32_to_bf16(canon32(bf16_to_f32(x) / (float)n))",
        D::Float8E4M3 => "f32_to_e4m3(canon32(e4m3_to_f32(x) / (float)n))",
        D::Float8E5M2 => "f32_to_e5m2(canon32(e5m2_to_f32(x) / (float)n))",
    }
}

/// The whole CUDA C source: the prelude, a reduce kernel per supported (type, op), a scale
/// kernel per type. Every kernel is a grid-stride loop over `n` elements.
pub fn source() -> String {
    let mut s = String::from(PRELUDE);
    for dt in DataType::ALL {
        let t = c_type(dt);
        for op in OPS {
            if !op.supports(dt) {
                continue;
            }
            s += &format!(
                "extern \"C\" __global__ void {name}({t} *dst, const {t} *a, const {t} *b, u64 n) {{\n\
                 \x20 for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {{\n\
                 \x20   {t} x = a[i], y = b[i];\n\
                 \x20   dst[i] = {e};\n\
                 \x20 }}\n}}\n",
                name = reduce_name(dt, op),
                e = expr(dt, op)
            );
        }
        s += &format!(
            "extern \"C\" __global__ void {name}({t} *dst, u64 count, u64 n) {{\n\
             \x20 for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (u64)gridDim.x * blockDim.x) {{\n\
             \x20   {t} x = dst[i];\n\
             \x20   dst[i] = ({t}){e};\n\
             \x20 }}\n}}\n",
            name = scale_name(dt),
            e = scale_expr(dt)
        );
    }
    s
}

/// NVRTC's options for `source()`: the rules above, for compute capability `cc`.
pub fn nvrtc_options() -> Vec<String> {
    [
        "--fmad=false",
        "--ftz=false",
        "--prec-div=true",
        "--prec-sqrt=true",
    ]
    .map(String::from)
    .to_vec()
}

/// Blocks for `count` elements: enough for one element per thread, at most `max_blocks`
/// (the grid-stride loop covers the rest).
pub fn blocks(count: usize, max_blocks: u32) -> u32 {
    let need = count.div_ceil(BLOCK as usize).max(1);
    u32::try_from(need).unwrap_or(u32::MAX).min(max_blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_and_op_has_a_kernel() {
        let src = source();
        for dt in DataType::ALL {
            for op in RedOp::ALL {
                let name = reduce_name(dt, op);
                assert_eq!(
                    src.contains(&format!(" {name}(")),
                    op.supports(dt),
                    "{dt} {op}: {name}"
                );
            }
            assert!(src.contains(&format!(" {}(", scale_name(dt))), "{dt}");
        }
        // Avg shares Sum's kernel; each name is defined once.
        assert_eq!(
            reduce_name(DataType::Float32, RedOp::Avg),
            reduce_name(DataType::Float32, RedOp::Sum)
        );
        let defs = src.matches("__global__").count();
        assert_eq!(defs, 6 * 7 + 6 * 4 + 12);
        assert_eq!(names().len(), defs);
    }

    #[test]
    fn integers_wrap_in_unsigned_arithmetic() {
        // Signed overflow is undefined in C: sums and products go through unsigned types.
        assert_eq!(expr(DataType::Int32, RedOp::Sum), "(int)((u32)x + (u32)y)");
        assert_eq!(
            expr(DataType::Int64, RedOp::Prod),
            "(long long)((u64)x * (u64)y)"
        );
        assert_eq!(
            expr(DataType::Int8, RedOp::Sum),
            "(signed char)((unsigned char)x + (unsigned char)y)"
        );
    }

    #[test]
    fn narrow_types_round_once_through_f32() {
        assert_eq!(
            expr(DataType::Bfloat16, RedOp::Max),
            "f32_to_bf16(fmax32(bf16_to_f32(x), bf16_to_f32(y)))"
        );
        assert_eq!(
            expr(DataType::Float8E5M2, RedOp::Sum),
            "f32_to_e5m2(canon32(e5m2_to_f32(x) + e5m2_to_f32(y)))"
        );
    }

    #[test]
    fn grid_size() {
        assert_eq!(blocks(0, 1000), 1);
        assert_eq!(blocks(1, 1000), 1);
        assert_eq!(blocks(257, 1000), 2);
        assert_eq!(blocks(1 << 30, 1000), 1000);
    }
}

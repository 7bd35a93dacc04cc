//! `DataType` and `RedOp`: NCCL's `ncclDataType_t` and `ncclRedOp_t`, with their names.

use std::fmt;

/// An element type, with NCCL's `ncclDataType_t` values (fp8 since NCCL 2.24).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    Int8 = 0,
    Uint8 = 1,
    Int32 = 2,
    Uint32 = 3,
    Int64 = 4,
    Uint64 = 5,
    Float16 = 6,
    Float32 = 7,
    Float64 = 8,
    Bfloat16 = 9,
    Float8E4M3 = 10,
    Float8E5M2 = 11,
}

impl DataType {
    /// Every type, in NCCL order (`ALL[i] as i32 == i`).
    pub const ALL: [DataType; 12] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
        DataType::Float8E4M3,
        DataType::Float8E5M2,
    ];

    /// The type for an `ncclDataType_t` value; `None` outside 0..=11.
    pub fn from_nccl(v: i32) -> Option<DataType> {
        usize::try_from(v)
            .ok()
            .and_then(|i| Self::ALL.get(i).copied())
    }

    /// The `ncclDataType_t` value.
    pub fn to_nccl(self) -> i32 {
        self as i32
    }

    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::Float8E4M3 | DataType::Float8E5M2 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    /// Whether the type is a floating-point type (f16, bf16, fp8 included).
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DataType::Float16
                | DataType::Float32
                | DataType::Float64
                | DataType::Bfloat16
                | DataType::Float8E4M3
                | DataType::Float8E5M2
        )
    }

    /// The canonical name (nccl-tests' names, except fp8: "fp8_e4m3", "fp8_e5m2").
    pub fn name(self) -> &'static str {
        match self {
            DataType::Int8 => "int8",
            DataType::Uint8 => "uint8",
            DataType::Int32 => "int32",
            DataType::Uint32 => "uint32",
            DataType::Int64 => "int64",
            DataType::Uint64 => "uint64",
            DataType::Float16 => "half",
            DataType::Float32 => "float",
            DataType::Float64 => "double",
            DataType::Bfloat16 => "bfloat16",
            DataType::Float8E4M3 => "fp8_e4m3",
            DataType::Float8E5M2 => "fp8_e5m2",
        }
    }

    /// Parses a type name, case-insensitively: the canonical names, nccl-tests' names
    /// ("f8e4m3", "f8e5m2"), NCCL's enum names with or without the `nccl` prefix ("ncclFloat",
    /// "char", "int", "float16", "float8e4m3", ...), and the short forms "i8", "u8", "i32", "u32",
    /// "i64", "u64", "f16"/"fp16", "f32"/"fp32", "f64"/"fp64", "bf16", "e4m3", "e5m2".
    pub fn from_name(s: &str) -> Option<DataType> {
        let lower = s.trim().to_ascii_lowercase();
        let n = lower.strip_prefix("nccl").unwrap_or(&lower);
        Some(match n {
            "int8" | "char" | "i8" | "int8_t" => DataType::Int8,
            "uint8" | "u8" | "uint8_t" => DataType::Uint8,
            "int32" | "int" | "i32" | "int32_t" => DataType::Int32,
            "uint32" | "u32" | "uint32_t" => DataType::Uint32,
            "int64" | "i64" | "int64_t" => DataType::Int64,
            "uint64" | "u64" | "uint64_t" => DataType::Uint64,
            "half" | "float16" | "f16" | "fp16" => DataType::Float16,
            "float" | "float32" | "f32" | "fp32" => DataType::Float32,
            "double" | "float64" | "f64" | "fp64" => DataType::Float64,
            "bfloat16" | "bf16" => DataType::Bfloat16,
            "fp8_e4m3" | "f8e4m3" | "fp8e4m3" | "float8e4m3" | "float8_e4m3" | "e4m3" => {
                DataType::Float8E4M3
            }
            "fp8_e5m2" | "f8e5m2" | "fp8e5m2" | "float8e5m2" | "float8_e5m2" | "e5m2" => {
                DataType::Float8E5M2
            }
            _ => return None,
        })
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A reduction operation: NCCL's `ncclRedOp_t` values (0..=4), then the bitwise ops of this
/// library's C API (5..=7; in NCCL, values from 5 up are user-created ops).
///
/// `Avg` reduces as `Sum`; the division by the number of contributions happens once, at the end
/// (`scale_avg`), as in NCCL (whose network plugins see Avg as Sum).
///
/// `BAnd`, `BOr` and `BXor` combine the raw bits of integer types; they are not defined for
/// floating-point types ([`RedOp::supports`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedOp {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
    Avg = 4,
    BAnd = 5,
    BOr = 6,
    BXor = 7,
}

impl RedOp {
    /// Every op, in value order (`ALL[i] as i32 == i`): the C API's `fabricoll_redop`.
    pub const ALL: [RedOp; 8] = [
        RedOp::Sum,
        RedOp::Prod,
        RedOp::Max,
        RedOp::Min,
        RedOp::Avg,
        RedOp::BAnd,
        RedOp::BOr,
        RedOp::BXor,
    ];

    /// NCCL's built-in ops, in NCCL order (`NCCL[i] as i32 == i`).
    pub const NCCL: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];

    /// The op for an `ncclRedOp_t` value; `None` outside 0..=4 (NCCL's user-created ops, 5 and
    /// up, included: those are not this library's bitwise ops).
    pub fn from_nccl(v: i32) -> Option<RedOp> {
        usize::try_from(v)
            .ok()
            .and_then(|i| Self::NCCL.get(i).copied())
    }

    /// The op for a C API `fabricoll_redop` value; `None` outside 0..=7.
    pub fn from_c(v: i32) -> Option<RedOp> {
        usize::try_from(v)
            .ok()
            .and_then(|i| Self::ALL.get(i).copied())
    }

    /// The `ncclRedOp_t` value (and the `fabricoll_redop` value).
    pub fn to_nccl(self) -> i32 {
        self as i32
    }

    /// Whether the op is bitwise (BAnd, BOr, BXor).
    pub fn is_bitwise(self) -> bool {
        matches!(self, RedOp::BAnd | RedOp::BOr | RedOp::BXor)
    }

    /// Whether the op is defined for `dt`: every op on integer types; all but the bitwise ops on
    /// floating-point types.
    pub fn supports(self, dt: DataType) -> bool {
        !(self.is_bitwise() && dt.is_float())
    }

    /// "sum", "prod", "max", "min", "avg" (nccl-tests' names), "band", "bor" or "bxor".
    pub fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Max => "max",
            RedOp::Min => "min",
            RedOp::Avg => "avg",
            RedOp::BAnd => "band",
            RedOp::BOr => "bor",
            RedOp::BXor => "bxor",
        }
    }

    /// Parses an op name, case-insensitively, with or without NCCL's `nccl` prefix ("ncclSum").
    pub fn from_name(s: &str) -> Option<RedOp> {
        let lower = s.trim().to_ascii_lowercase();
        let n = lower.strip_prefix("nccl").unwrap_or(&lower);
        Some(match n {
            "sum" => RedOp::Sum,
            "prod" | "product" => RedOp::Prod,
            "max" => RedOp::Max,
            "min" => RedOp::Min,
            "avg" | "mean" => RedOp::Avg,
            "band" => RedOp::BAnd,
            "bor" => RedOp::BOr,
            "bxor" => RedOp::BXor,
            _ => return None,
        })
    }
}

impl fmt::Display for RedOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

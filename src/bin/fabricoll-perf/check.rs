//! What fabricoll-perf expects: each rank's input values, the reference result of every
//! collective (with the tolerance of each type), the wrong-element count of a rank's output,
//! and nccl-tests' size and bus-bandwidth rules.
use crate::args::Args;
use nccl_net_fabricoll::algo::Collective;
use nccl_net_fabricoll::coll::Comm;
use nccl_net_fabricoll::reduce::{conv, fp8, DataType, RedOp};

/// The rank-r, element-i input value of an `n`-rank run over `dt`: values that differ between
/// ranks at each element and follow no period along the elements (`testing::pattern`), so a
/// block delivered to the wrong rank or offset is counted wrong, and small enough that sums over
/// `n` ranks are exact in `dt` (fp8 is checked within its tolerance). Prod keeps to 1 and 2
/// (products of many ranks stay exact); the bitwise ops (integer types only) take the type's
/// whole exact range, since they never carry.
pub fn value(op: RedOp, dt: DataType, n: usize, r: usize, i: usize) -> f64 {
    use nccl_net_fabricoll::testing::pattern;
    match op {
        RedOp::Prod => {
            if (r + i).is_multiple_of(7) {
                2.0
            } else {
                1.0
            }
        }
        RedOp::BAnd | RedOp::BOr | RedOp::BXor | RedOp::Max | RedOp::Min => {
            pattern::value(pattern::range(dt, n, false), r, i) as f64
        }
        RedOp::Sum | RedOp::Avg => pattern::value(pattern::range(dt, n, true), r, i) as f64,
    }
}

pub fn enc(dt: DataType, v: f64, out: &mut Vec<u8>) {
    match dt {
        DataType::Int8 => out.extend_from_slice(&(v as i8).to_le_bytes()),
        DataType::Uint8 => out.extend_from_slice(&(v as u8).to_le_bytes()),
        DataType::Int32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
        DataType::Uint32 => out.extend_from_slice(&(v as u32).to_le_bytes()),
        DataType::Int64 => out.extend_from_slice(&(v as i64).to_le_bytes()),
        DataType::Uint64 => out.extend_from_slice(&(v as u64).to_le_bytes()),
        DataType::Float16 => out.extend_from_slice(&conv::f32_to_f16(v as f32).to_le_bytes()),
        DataType::Float32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
        DataType::Float64 => out.extend_from_slice(&v.to_le_bytes()),
        DataType::Bfloat16 => out.extend_from_slice(&conv::f32_to_bf16(v as f32).to_le_bytes()),
        DataType::Float8E4M3 => out.push(fp8::f32_to_e4m3(v as f32)),
        DataType::Float8E5M2 => out.push(fp8::f32_to_e5m2(v as f32)),
    }
}

pub fn dec(dt: DataType, b: &[u8]) -> f64 {
    match dt {
        DataType::Int8 => b[0] as i8 as f64,
        DataType::Uint8 => b[0] as f64,
        DataType::Int32 => i32::from_le_bytes(b[..4].try_into().unwrap()) as f64,
        DataType::Uint32 => u32::from_le_bytes(b[..4].try_into().unwrap()) as f64,
        DataType::Int64 => i64::from_le_bytes(b[..8].try_into().unwrap()) as f64,
        DataType::Uint64 => u64::from_le_bytes(b[..8].try_into().unwrap()) as f64,
        DataType::Float16 => conv::f16_to_f32(u16::from_le_bytes([b[0], b[1]])) as f64,
        DataType::Float32 => f32::from_le_bytes(b[..4].try_into().unwrap()) as f64,
        DataType::Float64 => f64::from_le_bytes(b[..8].try_into().unwrap()),
        DataType::Bfloat16 => conv::bf16_to_f32(u16::from_le_bytes([b[0], b[1]])) as f64,
        DataType::Float8E4M3 => fp8::e4m3_to_f32(b[0]) as f64,
        DataType::Float8E5M2 => fp8::e5m2_to_f32(b[0]) as f64,
    }
}

/// Relative tolerance of a type for a reduction over n ranks (exact types: 0).
fn tolerance(dt: DataType, n: usize) -> f64 {
    let eps = match dt {
        DataType::Float16 => 1.0 / 1024.0,
        DataType::Bfloat16 => 1.0 / 128.0,
        DataType::Float8E4M3 => 1.0 / 8.0,
        DataType::Float8E5M2 => 1.0 / 4.0,
        _ => 0.0,
    };
    eps * n as f64
}

fn reference(op: RedOp, dt: DataType, vals: impl Iterator<Item = f64>, n: usize) -> f64 {
    let v: Vec<f64> = vals.collect();
    match op {
        RedOp::Sum => v.iter().sum(),
        RedOp::Prod => v.iter().product(),
        RedOp::Max => v.iter().cloned().fold(f64::MIN, f64::max),
        RedOp::Min => v.iter().cloned().fold(f64::MAX, f64::min),
        RedOp::Avg => {
            let s: f64 = v.iter().sum();
            if dt.is_float() {
                s / n as f64
            } else {
                (s as i64 / n as i64) as f64
            }
        }
        RedOp::BAnd => v.iter().fold(-1i64, |a, &x| a & x as i64) as f64,
        RedOp::BOr => v.iter().fold(0i64, |a, &x| a | x as i64) as f64,
        RedOp::BXor => v.iter().fold(0i64, |a, &x| a ^ x as i64) as f64,
    }
}

/// Count elements of this rank's output that differ from the independent reference.
pub fn wrong(a: &Args, comm: &Comm, out: &[u8], count: usize) -> usize {
    let n = comm.nranks;
    let r = comm.rank;
    let el = a.dtype.size();
    let elems = out.len() / el;
    let tol = tolerance(a.dtype, n);
    let mut bad = 0;
    for j in 0..elems {
        let want = match a.coll {
            Collective::AllReduce => reference(
                a.op,
                a.dtype,
                (0..n).map(|q| value(a.op, a.dtype, n, q, j)),
                n,
            ),
            Collective::ReduceScatter => reference(
                a.op,
                a.dtype,
                (0..n).map(|q| value(a.op, a.dtype, n, q, r * count + j)),
                n,
            ),
            Collective::Reduce if r == a.root => reference(
                a.op,
                a.dtype,
                (0..n).map(|q| value(a.op, a.dtype, n, q, j)),
                n,
            ),
            Collective::Reduce => continue,
            Collective::AllGather => value(a.op, a.dtype, n, j / count, j % count),
            Collective::Broadcast => value(a.op, a.dtype, n, a.root, j),
            Collective::AllToAll => value(a.op, a.dtype, n, j / count, r * count + j % count),
        };
        // Integer types wrap like the library's kernels.
        let mut w = Vec::new();
        enc(a.dtype, want, &mut w);
        let want_t = dec(a.dtype, &w);
        let got = dec(a.dtype, &out[j * el..(j + 1) * el]);
        let ok = if tol == 0.0 {
            got == want_t
        } else {
            (got - want).abs() <= tol * want.abs().max(1.0)
        };
        if !ok {
            bad += 1;
        }
    }
    bad
}

//! f32 values as float, bfloat16 or half data and back, for the compressed collectives' tests.
#![allow(dead_code)] // not every test binary uses each helper
use nccl_net_fabricoll::reduce::conv::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use nccl_net_fabricoll::reduce::DataType;

/// `v` rounded to `dt` and back (the values a rank really holds).
pub fn held(dt: DataType, v: &[f32]) -> Vec<f32> {
    v.iter()
        .map(|&x| match dt {
            DataType::Bfloat16 => bf16_to_f32(f32_to_bf16(x)),
            DataType::Float16 => f16_to_f32(f32_to_f16(x)),
            _ => x,
        })
        .collect()
}

/// `v` as the bytes of `dt` data.
pub fn encode(dt: DataType, v: &[f32]) -> Vec<u8> {
    let mut b = Vec::with_capacity(v.len() * dt.size());
    for &x in v {
        match dt {
            DataType::Bfloat16 => b.extend(f32_to_bf16(x).to_ne_bytes()),
            DataType::Float16 => b.extend(f32_to_f16(x).to_ne_bytes()),
            _ => b.extend(x.to_ne_bytes()),
        }
    }
    b
}

/// The f32 values of `dt` data `b`.
pub fn decode(dt: DataType, b: &[u8]) -> Vec<f32> {
    match dt {
        DataType::Float32 => b
            .chunks_exact(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect(),
        DataType::Bfloat16 => b
            .chunks_exact(2)
            .map(|c| bf16_to_f32(u16::from_ne_bytes(c.try_into().unwrap())))
            .collect(),
        _ => b
            .chunks_exact(2)
            .map(|c| f16_to_f32(u16::from_ne_bytes(c.try_into().unwrap())))
            .collect(),
    }
}

/// A rank's buffers and its call's send and receive regions over them: `input` copied into
/// `buf`; the output `out_bytes` long. In place (`Some((in_off, out_off))`, NCCL's layouts:
/// AllGather's input is the rank's block of the output, ReduceScatter's output the rank's
/// block of the input) both regions lie in `buf`, the input at `in_off` and the output at
/// `out_off`; else the input at the start of `buf` and the output is all of `out`.
pub struct Buffers {
    pub buf: Vec<u8>,
    pub out: Vec<u8>,
    pub send: nccl_net_fabricoll::transport::Region,
    pub recv: nccl_net_fabricoll::transport::Region,
}

pub fn buffers(input: &[u8], out_bytes: usize, in_place: Option<(usize, usize)>) -> Buffers {
    use nccl_net_fabricoll::transport::Region;
    let mut buf = vec![0u8; out_bytes.max(input.len())];
    let mut out = vec![0u8; out_bytes];
    let (send, recv) = match in_place {
        Some((off, roff)) => {
            buf[off..off + input.len()].copy_from_slice(input);
            let p = buf.as_mut_ptr();
            // SAFETY: both regions lie within `buf`, whose heap memory moves with the
            // returned `Buffers` and lives as long as it.
            unsafe {
                (
                    Region::from_raw(p.add(off), input.len()),
                    Region::from_raw(p.add(roff), out_bytes),
                )
            }
        }
        None => {
            buf[..input.len()].copy_from_slice(input);
            // SAFETY: the regions are `buf`'s and `out`'s heap memory, which moves with the
            // returned `Buffers` and lives as long as it.
            unsafe {
                (
                    Region::from_raw(buf.as_mut_ptr(), input.len()),
                    Region::from_raw(out.as_mut_ptr(), out_bytes),
                )
            }
        }
    };
    Buffers {
        buf,
        out,
        send,
        recv,
    }
}

/// What an AllReduce of 4096 floats (ones) on `comm` with the per-call compression
/// `per_call` came to: "OK" or the error's text.
pub fn ones_allreduce(
    comm: &nccl_net_fabricoll::coll::Comm,
    per_call: Option<nccl_net_fabricoll::config::Compression>,
) -> String {
    use nccl_net_fabricoll::algo::Collective;
    use nccl_net_fabricoll::coll::Kind;
    let input = encode(DataType::Float32, &[1f32; 4096]);
    let b = buffers(&input, input.len(), None);
    let call = super::call(Kind::Coll(Collective::AllReduce), b.send, b.recv, 4096);
    match comm.run_with(&call, per_call) {
        Ok(()) => "OK".to_string(),
        Err(e) => e.to_string(),
    }
}

/// The terms of docs/compression.md's error bounds for `codec` on `dt` data.
pub struct Bound {
    pub codec: nccl_net_fabricoll::compress::Codec,
    pub dt: DataType,
}

impl Bound {
    /// The largest scale of a block whose largest magnitude is `amax`.
    pub fn scale(&self, amax: f64) -> f64 {
        use nccl_net_fabricoll::compress::Format;
        let f = self.codec.format;
        match f {
            Format::Bf16 => 1.0,
            Format::Int8 => (amax / 127.0).max(2f64.powi(-126)) * (1.0 + 2f64.powi(-20)),
            _ => (2.0 * amax / f64::from(f.max_code_value())).max(2f64.powi(-126)),
        }
    }

    /// One round trip's error of `v` in a block of scale `s`.
    pub fn once(&self, v: f64, s: f64) -> f64 {
        let (rel, abs) = self.codec.format.error_terms();
        rel * v.abs() + abs * s + 2f64.powi(-149)
    }

    /// The output type's own rounding of a result of magnitude `v`.
    pub fn out_round(&self, v: f64) -> f64 {
        match self.dt {
            DataType::Bfloat16 => 2f64.powi(-8) * v.abs() + 2f64.powi(-134),
            DataType::Float16 => 2f64.powi(-11) * v.abs() + 2f64.powi(-25),
            _ => 0.0,
        }
    }

    /// The largest magnitude of the codec's block of `v` that holds element `i` of `seg`.
    pub fn block_amax(&self, v: &[f64], seg: &std::ops::Range<usize>, i: usize) -> f64 {
        let k = self.codec.block;
        let b0 = seg.start + (i - seg.start) / k * k;
        v[b0..(b0 + k).min(seg.end)]
            .iter()
            .fold(0f64, |m, y| m.max(y.abs()))
    }
}

/// The layout of a ReduceScatterV (`counts`) or AllGatherV (`counts`, `displs`) call.
///
/// # Safety
/// `counts` and `displs` must outlive every call that reads the layout.
pub unsafe fn varied_layout(
    coll: nccl_net_fabricoll::algo::varied::Varied,
    counts: &[usize],
    displs: &[usize],
) -> nccl_net_fabricoll::coll::Layout {
    use nccl_net_fabricoll::algo::varied::Varied;
    use nccl_net_fabricoll::transport::Region;
    let mut l = nccl_net_fabricoll::coll::Layout::new(coll);
    // SAFETY: the caller keeps both arrays alive while the layout is read.
    unsafe {
        l.counts = Region::from_raw(counts.as_ptr() as *mut u8, std::mem::size_of_val(counts));
        if coll == Varied::AllGatherV {
            l.displs = Region::from_raw(displs.as_ptr() as *mut u8, std::mem::size_of_val(displs));
        }
    }
    l
}

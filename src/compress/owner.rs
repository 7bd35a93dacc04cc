//! The arithmetic of a compressed AllReduce, ReduceScatter and AllGather, without the transport:
//! which elements each rank owns, what each rank sends, what an owner computes from what it
//! received, and what every rank makes of the result. The collectives move the byte buffers
//! these functions produce (a reduce-scatter of codes, then an all-gather of codes); the rules
//! that make every rank's result the same bits hold here:
//!
//! - each rank quantizes its contribution to every segment once ([`contribute`]);
//! - the owner of a segment sums the dequantized contributions of all ranks in rank order, its
//!   own included (never its own full-precision data), in f32, divides for Avg, and quantizes
//!   the sum once ([`reduce_segment`]);
//! - every rank, the owner included, dequantizes the owner's codes ([`finish`]), so the final
//!   value is dequant(quant(sum)) everywhere.
//!
//! Each element is so quantized twice, whatever the rank count.
#![forbid(unsafe_code)]

use super::Codec;
use crate::error::{Error, Result};
use std::ops::Range;

/// The owners' segments of `count` elements over `nranks` ranks: whole blocks of the codec,
/// spread as evenly as blocks allow (the first `blocks % nranks` ranks one block more), the
/// last block short where `count` is not a multiple of the block. A rank may own nothing.
pub fn segments(codec: &Codec, count: usize, nranks: usize) -> Vec<Range<usize>> {
    let blocks = count.div_ceil(codec.block);
    let (base, extra) = (blocks / nranks.max(1), blocks % nranks.max(1));
    let mut start = 0;
    (0..nranks)
        .map(|r| {
            let b = base + usize::from(r < extra);
            let end = (start + b * codec.block).min(count);
            let seg = start..end;
            start = end;
            seg
        })
        .collect()
}

/// Where each segment's codes lie in a buffer that holds all segments' codes back to back.
pub fn wire_ranges(codec: &Codec, segs: &[Range<usize>]) -> Vec<Range<usize>> {
    let mut at = 0;
    segs.iter()
        .map(|s| {
            let r = at..at + codec.wire_len(s.len());
            at = r.end;
            r
        })
        .collect()
}

/// A rank's codes of its whole input, segment after segment (each segment its own blocks).
pub fn contribute(codec: &Codec, input: &[f32], segs: &[Range<usize>]) -> Result<Vec<u8>> {
    let wire = wire_ranges(codec, segs);
    let mut out = vec![0u8; wire.last().map_or(0, |r| r.end)];
    for (s, w) in segs.iter().zip(&wire) {
        let x = input.get(s.clone()).ok_or_else(|| {
            Error::arg(
                "input",
                format!("{} elements, segment {s:?} is past them", input.len()),
            )
        })?;
        codec.quantize(x, &mut out[w.clone()])?;
    }
    Ok(out)
}

/// The owner's codes of a segment of `len` elements: the sum, in rank order, of the dequantized
/// contributions `parts` (one per rank, the owner's own codes included), divided by `avg` when
/// it is `Some(n)`, quantized once.
pub fn reduce_segment(
    codec: &Codec,
    parts: &[&[u8]],
    len: usize,
    avg: Option<usize>,
) -> Result<Vec<u8>> {
    let mut acc = vec![0f32; len];
    for p in parts {
        codec.accumulate(p, &mut acc)?;
    }
    if let Some(n) = avg {
        if n == 0 {
            return Err(Error::arg("avg", "the Avg divisor must be at least 1"));
        }
        let d = n as f32;
        acc.iter_mut().for_each(|v| *v /= d);
    }
    let mut out = vec![0u8; codec.wire_len(len)];
    codec.quantize(&acc, &mut out)?;
    Ok(out)
}

/// Every rank's result of one segment from its owner's codes (the owner too).
pub fn finish(codec: &Codec, codes: &[u8], out: &mut [f32]) -> Result<()> {
    codec.dequantize(codes, out)
}

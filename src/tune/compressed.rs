//! The price of a compressed collective (docs/compression.md): its exchanges, each an AllToAll
//! or AllGather of the codes' bytes priced as any such collective (`Model::predict_on`), plus
//! the codec's work on the caller's CPU at a rate per format. The codec's work is the same
//! whichever algorithm runs an exchange, so it does not change which one is chosen; it is what
//! tells, next to the uncompressed call's price, whether compression pays on this link.
#![forbid(unsafe_code)]

use super::Model;
use crate::algo::{Algorithm, Collective};
use crate::compress::Format;

/// What a compressed call computes (the codec's work differs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    AllReduce,
    ReduceScatter,
    AllGather,
}

/// The codec's rates on one core, in GB/s of f32 data: quantize, dequantize, and dequantize
/// while adding into f32 (the owner's sum). Constants per format, taken (rounded down) from the
/// measurement of `fabricoll-codec` that docs/compression.md ("Speed") records: the rate is a
/// property of the loops and the core, not of the link, so nothing is calibrated per
/// communicator.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CodecRate {
    pub quantize_gbps: f64,
    pub dequantize_gbps: f64,
    pub accumulate_gbps: f64,
}

impl CodecRate {
    /// The rates of `format` (Off: infinitely fast, nothing to do).
    pub fn of(format: Format) -> CodecRate {
        let (q, d, a) = match format {
            Format::Off => (f64::INFINITY, f64::INFINITY, f64::INFINITY),
            Format::Bf16 => (27.0, 36.0, 34.0),
            Format::Fp16 => (13.0, 20.0, 19.0),
            Format::Fp8E4m3 => (11.0, 14.0, 13.0),
            Format::Fp8E5m2 => (11.0, 14.0, 13.0),
            Format::Int8 => (19.0, 40.0, 36.0),
        };
        CodecRate {
            quantize_gbps: q,
            dequantize_gbps: d,
            accumulate_gbps: a,
        }
    }
}

/// Elements one rank quantizes, dequantizes into a sum, and dequantizes into its output, in a
/// call of `shape` on `nranks` ranks with NCCL's `count` (AllReduce's whole vector, the others'
/// per-rank count). The largest owner's segment is `ceil(count / nranks)`.
pub fn codec_elements(shape: Shape, nranks: usize, count: usize) -> (usize, usize, usize) {
    let n = nranks.max(1);
    match shape {
        Shape::AllReduce => {
            let seg = count.div_ceil(n);
            (count + seg, n * seg, count)
        }
        Shape::ReduceScatter => (n * count + count, n * count, count),
        Shape::AllGather => (count, 0, n * count),
    }
}

/// Microseconds of the codec's work of one rank (`codec_elements` at `CodecRate::of`).
pub fn codec_us(format: Format, shape: Shape, nranks: usize, count: usize) -> f64 {
    if format == Format::Off || nranks <= 1 {
        return 0.0;
    }
    let r = CodecRate::of(format);
    let (q, a, d) = codec_elements(shape, nranks, count);
    let us = |elems: usize, gbps: f64| (elems * 4) as f64 / (gbps * 1e3);
    us(q, r.quantize_gbps) + us(a, r.accumulate_gbps) + us(d, r.dequantize_gbps)
}

/// One exchange of a compressed call: an AllToAll or AllGather of `bytes` per rank's piece,
/// run by `algo`, predicted `us` (None: the model has no formula for it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Exchange {
    pub coll: Collective,
    pub bytes: usize,
    pub algo: Algorithm,
    pub us: Option<f64>,
}

/// A compressed call's price: its exchanges and the codec's work.
#[derive(Clone, Debug, PartialEq)]
pub struct CompressedPrice {
    pub shape: Shape,
    pub format: Format,
    pub block: usize,
    pub nranks: usize,
    /// NCCL's count and the data's element size (the bytes the call would send uncompressed).
    pub count: usize,
    pub elem: usize,
    pub exchanges: Vec<Exchange>,
    pub codec_us: f64,
}

impl CompressedPrice {
    /// The predicted time: the exchanges one after another, then the codec (None when an
    /// exchange has no prediction).
    pub fn total_us(&self) -> Option<f64> {
        self.exchanges
            .iter()
            .map(|x| x.us)
            .sum::<Option<f64>>()
            .map(|t| t + self.codec_us)
    }

    /// The log line's text (without the uncompressed comparison).
    pub fn describe(&self) -> String {
        let xs: Vec<String> = self
            .exchanges
            .iter()
            .map(|x| {
                let t =
                    x.us.map_or("unpriced".to_string(), |t| format!("{t:.1} us"));
                format!("{:?} of {} B per rank with {} {t}", x.coll, x.bytes, x.algo)
            })
            .collect();
        let r = CodecRate::of(self.format);
        let (q, a, d) = codec_elements(self.shape, self.nranks, self.count);
        format!(
            "compressed {:?} of {} B on {} ranks as {} in blocks of {}: {}; codec {:.1} us \
             (quantize {q} at {} GB/s, accumulate {a} at {} GB/s, dequantize {d} at {} GB/s, \
             elements per rank); predicted {}",
            self.shape,
            self.count * self.elem,
            self.nranks,
            self.format,
            self.block,
            xs.join(", then "),
            self.codec_us,
            r.quantize_gbps,
            r.accumulate_gbps,
            r.dequantize_gbps,
            self.total_us()
                .map_or("unpriced".to_string(), |t| format!("{t:.1} us"))
        )
    }
}

impl Model {
    /// Log `price` at info, once per shape, format and power-of-two size class, with the
    /// uncompressed call's choice and prediction where given.
    pub fn log_compressed(&self, price: &CompressedPrice, uncompressed: Option<(Algorithm, f64)>) {
        if !log::log_enabled!(log::Level::Info) {
            return;
        }
        let class = (price.count * price.elem).max(1).ilog2();
        let key = (price.shape, price.format, class);
        if !self.logged_compressed.lock().insert(key) {
            return;
        }
        let plain = match uncompressed {
            Some((a, t)) => format!("; uncompressed: {a} {t:.1} us"),
            None => String::new(),
        };
        log::info!("{}{plain}", price.describe());
    }
}

//! The price of a compressed collective (docs/compression.md): its exchanges, each an AllToAll
//! or AllGather of the codes' bytes priced as any such collective (`Model::predict_on`), plus
//! the codec's work on the caller's CPU at a rate per format. The codec's work is the same
//! whichever algorithm runs an exchange, so it does not change which one is chosen; it is what
//! tells, next to the uncompressed call's price, whether compression pays on this link.
//!
//! On several hosts the call compresses the inter-host level only (`coll::compressed`,
//! docs/compression.md): its exchanges inside a host carry the data in full precision and are
//! priced on shared memory's link at the data's bytes, those of a lane carry codes and are
//! priced on the network's link, shared by the host's lanes, at the codes' bytes; the codec
//! works on a host's share of the data only (`codec_elements_tiered`).
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
/// while adding into f32 (the owner's sum). Measured once per process and format on this
/// machine (`coll::compressed`'s `measured_rate`: a few milliseconds of the codec's loops),
/// else constants per format (`of`), taken (rounded down) from the measurement of `fabricoll-codec` that
/// docs/compression.md ("Speed") records: the rate is a property of the loops and the core,
/// not of the link, so nothing is calibrated per communicator.
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
            Format::Int4 => (16.0, 21.0, 16.0),
        };
        CodecRate {
            quantize_gbps: q,
            dequantize_gbps: d,
            accumulate_gbps: a,
        }
    }
}

impl CodecRate {
    /// Microseconds to quantize, add and dequantize `(q, a, d)` elements at these rates.
    pub fn us(&self, (q, a, d): (usize, usize, usize)) -> f64 {
        let us = |elems: usize, gbps: f64| (elems * 4) as f64 / (gbps * 1e3);
        us(q, self.quantize_gbps) + us(a, self.accumulate_gbps) + us(d, self.dequantize_gbps)
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

/// `codec_elements` of the inter-host-only composition on hosts of `sizes` ranks, for its
/// busiest rank (a lane's rank; L lanes, the smallest host's ranks, over H hosts): AllReduce
/// quantizes its lane's slice of the host's sum (`ceil(count / L)`) and its segment of the
/// lane's sum (`ceil(slice / H)`), adds the hosts' codes of that segment and decodes the slice;
/// ReduceScatter quantizes the host's sums of its lane's blocks (one per rank of the lane's
/// local indices on every host: `sum_h ceil(s_h / L)`, H on hosts of equal size) and the
/// blocks it owns (its own and its host's extra ranks': `ceil(max_h s_h / L)`), adds H codes of
/// each owned block and decodes them; AllGather quantizes its input and decodes its lane's
/// blocks.
pub fn codec_elements_tiered(shape: Shape, sizes: &[usize], count: usize) -> (usize, usize, usize) {
    let x = sizes.len().max(1);
    let y = sizes.iter().copied().min().unwrap_or(1).max(1);
    let lane: usize = sizes.iter().map(|s| s.div_ceil(y)).sum::<usize>().max(1);
    let owned = sizes.iter().copied().max().unwrap_or(1).div_ceil(y).max(1);
    match shape {
        Shape::AllReduce => {
            let slice = count.div_ceil(y);
            let seg = slice.div_ceil(x);
            (slice + seg, x * seg, slice)
        }
        Shape::ReduceScatter => (
            lane * count + owned * count,
            x * owned * count,
            owned * count,
        ),
        Shape::AllGather => (count, 0, lane * count),
    }
}

/// Microseconds of the codec's work of one rank (`codec_elements` at `CodecRate::of`).
pub fn codec_us(format: Format, shape: Shape, nranks: usize, count: usize) -> f64 {
    if nranks <= 1 {
        return 0.0;
    }
    elements_us(format, codec_elements(shape, nranks, count))
}

/// `codec_us` of the inter-host-only composition on hosts of `sizes` ranks
/// (`codec_elements_tiered`).
pub fn codec_us_tiered(format: Format, shape: Shape, sizes: &[usize], count: usize) -> f64 {
    if sizes.len() <= 1 {
        return 0.0;
    }
    elements_us(format, codec_elements_tiered(shape, sizes, count))
}

/// Microseconds to quantize, add and dequantize `(q, a, d)` elements in `format` at
/// `CodecRate::of`'s constants.
fn elements_us(format: Format, work: (usize, usize, usize)) -> f64 {
    if format == Format::Off {
        return 0.0;
    }
    CodecRate::of(format).us(work)
}

/// The level an exchange of the inter-host-only composition runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    /// Among the ranks of one host, the data in full precision (shared memory).
    Host,
    /// Among the ranks of one lane (one per host), codes (the network).
    Lane,
}

/// One exchange of a compressed call: an AllToAll or AllGather of `bytes` per rank's piece,
/// run by `algo`, predicted `us` (None: the model has no formula for it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Exchange {
    pub coll: Collective,
    pub bytes: usize,
    pub algo: Algorithm,
    pub us: Option<f64>,
    /// The level of the inter-host-only composition it runs on (None: the whole
    /// communicator, every level carrying codes).
    pub level: Option<Tier>,
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
    /// The exchanges of one chunk (the first, the largest); every chunk runs them alike.
    pub exchanges: Vec<Exchange>,
    /// The codec's work of the whole call, at `rate`.
    pub codec_us: f64,
    pub rate: CodecRate,
    /// The chunks the call is cut into (`coll::compressed`'s pipeline; 1: not pipelined).
    pub chunks: usize,
    /// The inter-host-only composition's ranks per host, host by host (None: every level
    /// compressed alike).
    pub tiers: Option<Vec<usize>>,
}

impl CompressedPrice {
    /// The predicted time (None when an exchange has no prediction): one chunk, the
    /// exchanges one after another, then the codec; pipelined (several chunks), every chunk's
    /// exchanges and the codec's work overlap, so the larger of the two, plus one chunk's
    /// share of the codec that stands alone (the first chunk's quantizing, the last one's
    /// decoding).
    pub fn total_us(&self) -> Option<f64> {
        let m = self.chunks.max(1);
        let wire = self.exchanges.iter().map(|x| x.us).sum::<Option<f64>>()? * m as f64;
        Some(if m == 1 {
            wire + self.codec_us
        } else {
            wire.max(self.codec_us) + self.codec_us / m as f64
        })
    }

    /// The log line's text (without the uncompressed comparison).
    pub fn describe(&self) -> String {
        let xs: Vec<String> = self
            .exchanges
            .iter()
            .map(|x| {
                let t =
                    x.us.map_or("unpriced".to_string(), |t| format!("{t:.1} us"));
                let level = match x.level {
                    None => "",
                    Some(Tier::Host) => "host ",
                    Some(Tier::Lane) => "lane ",
                };
                format!(
                    "{level}{:?} of {} B per rank with {} {t}",
                    x.coll, x.bytes, x.algo
                )
            })
            .collect();
        let r = self.rate;
        let ((q, a, d), how) = match &self.tiers {
            Some(sizes) => {
                let (x, y) = (sizes.len(), sizes.iter().copied().min().unwrap_or(0));
                let hosts = if sizes.iter().all(|&s| s == y) {
                    format!("{x} hosts x {y} ranks")
                } else {
                    let s = if y == 1 { "" } else { "s" };
                    format!("{x} hosts of {sizes:?} ranks, {y} lane{s}")
                };
                (
                    codec_elements_tiered(self.shape, sizes, self.count),
                    format!(" inter-host level only ({hosts}; shared memory in full precision)"),
                )
            }
            None => (
                codec_elements(self.shape, self.nranks, self.count),
                " every level".to_string(),
            ),
        };
        let pipe = if self.chunks > 1 {
            format!(
                " pipelined in {} chunks (the codec overlaps the exchanges), each",
                self.chunks
            )
        } else {
            String::new()
        };
        format!(
            "compressed {:?} of {} B on {} ranks as {} in blocks of {}{how}{pipe}: {}; codec \
             {:.1} us (quantize {q} at {:.1} GB/s, accumulate {a} at {:.1} GB/s, dequantize {d} \
             at {:.1} GB/s, elements per rank); predicted {}",
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
    /// Predicted microseconds of one exchange of the inter-host-only composition: `coll` run
    /// by `algo` among `ranks` ranks of the level `tier`, each rank's piece `piece` bytes.
    /// A host's exchange runs on shared memory's link; a lane's on the network's, whose link
    /// the `lanes` lanes of a host share (they run at once).
    pub fn tier_exchange_us(
        &self,
        tier: Tier,
        coll: Collective,
        algo: Algorithm,
        ranks: usize,
        piece: usize,
        lanes: usize,
    ) -> Option<f64> {
        let net = self.net();
        let link = match tier {
            Tier::Host => net.intra,
            Tier::Lane => net.inter.shared(lanes as f64),
        };
        net.phase(link, algo, coll, ranks, (ranks * piece) as f64)
    }

    /// Log `price` at info, once per shape, format and power-of-two size class, with the
    /// uncompressed call's choice and prediction where given.
    pub fn log_compressed(&self, price: &CompressedPrice, uncompressed: Option<(Algorithm, f64)>) {
        if !log::log_enabled!(log::Level::Info) {
            return;
        }
        let class = (price.count * price.elem).max(1).ilog2();
        let key = (price.shape, price.format, class, price.tiers.is_some());
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

//! The codec's rates on this machine for the price of a compressed call: measured once per
//! process and format (`compress::rates`, a few milliseconds), cached, and logged at info;
//! `tune::CodecRate::of`'s constants where they cannot be measured.
use crate::compress::Format;
use crate::tune::CodecRate;
use std::sync::OnceLock;

/// `format`'s rates on this machine (see the module).
pub(super) fn measured_rate(format: Format) -> CodecRate {
    static MEASURED: [OnceLock<CodecRate>; Format::ALL.len()] =
        [const { OnceLock::new() }; Format::ALL.len()];
    let Some(i) = Format::ALL.iter().position(|f| *f == format) else {
        return CodecRate::of(format);
    };
    *MEASURED[i].get_or_init(|| match crate::compress::rates(format) {
        Some((q, d, a)) => {
            log::info!(
                "codec {format} measured on this machine: quantize {q:.1}, dequantize {d:.1}, \
                 accumulate {a:.1} GB/s of f32 on one core"
            );
            CodecRate {
                quantize_gbps: q,
                dequantize_gbps: d,
                accumulate_gbps: a,
            }
        }
        None => {
            log::info!("codec {format}: not measured, the price takes the constant rates");
            CodecRate::of(format)
        }
    })
}

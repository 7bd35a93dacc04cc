//! The codec's rates on this machine: a short timed run of each loop on a small buffer, for
//! the cost model's price of a compressed call (`tune::CodecRate::measured`).
use super::{Codec, Format, DEFAULT_BLOCK};
use std::time::{Duration, Instant};

/// Elements of the timed buffer: small enough to stay in cache, as a pipelined call's pieces
/// mostly do, large enough that a pass is many blocks.
const ELEMS: usize = 16 << 10;

/// How long each loop is timed for (after one untimed pass): three loops, a few milliseconds
/// per format in all.
const TIMED: Duration = Duration::from_micros(500);

/// Passes at most per loop, whatever the clock says.
const MAX_PASSES: u32 = 4096;

/// `format`'s quantize, dequantize and accumulate rates on one core, in GB/s of f32 data, in
/// blocks of the default size: None for `Off`, or where a loop fails or the clock cannot time
/// it.
pub fn rates(format: Format) -> Option<(f64, f64, f64)> {
    if format == Format::Off {
        return None;
    }
    let codec = Codec::new(format, DEFAULT_BLOCK).ok()?;
    let x: Vec<f32> = (0..ELEMS)
        .map(|i| ((i * 7919 % 1999) as f32 - 999.5) * 0.01)
        .collect();
    let mut codes = vec![0u8; codec.wire_len(ELEMS)];
    let mut out = vec![0f32; ELEMS];
    let q = time(|| codec.quantize(&x, &mut codes).is_ok())?;
    let d = time(|| codec.dequantize(&codes, &mut out).is_ok())?;
    out.fill(0.0);
    let a = time(|| codec.accumulate(&codes, &mut out).is_ok())?;
    Some((q, d, a))
}

/// GB/s of `ELEMS` f32 values of `pass`, run once untimed then for about `TIMED`; None where
/// a pass fails or no time passed.
fn time(mut pass: impl FnMut() -> bool) -> Option<f64> {
    if !pass() {
        return None;
    }
    let start = Instant::now();
    let mut passes = 0u32;
    while passes < MAX_PASSES && (passes == 0 || start.elapsed() < TIMED) {
        if !pass() {
            return None;
        }
        passes += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let gbps = (ELEMS * 4) as f64 * f64::from(passes) / secs / 1e9;
    (secs > 0.0 && gbps.is_finite() && gbps > 0.0).then_some(gbps)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every coded format is timed to some positive, finite rate (no speed is asserted);
    /// `Off` has none.
    #[test]
    fn every_coded_format_gets_rates() {
        assert_eq!(rates(Format::Off), None);
        for f in Format::CODED {
            let (q, d, a) = rates(f).unwrap_or_else(|| panic!("{f}: no rates"));
            for r in [q, d, a] {
                assert!(r.is_finite() && r > 0.0, "{f}: {q} {d} {a}");
            }
        }
    }
}

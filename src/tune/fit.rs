//! Fitting the model's parameters to the calibration's timings: the one-level fit of a ring
//! AllReduce (one host), and the per-level fit of point-to-point timings (several hosts), with
//! the medians and the quantization that make repeated calibrations give the same parameters.
#![forbid(unsafe_code)]

use super::{eager_alphas, Algorithm, Collective};

/// Alpha, beta and gamma from timings: `small_us` of a ring AllReduce of a tiny message,
/// `large` = (bytes, us) of ring AllReduces of one or more large sizes (ascending), `reduce` =
/// (bytes, us) of a local reduction, on a transport whose eager protocol ends at `eager_bytes`
/// (the large AllReduces' rounds then wait for a handshake or send extra slices too, as
/// `Model::predict` assumes).
///
/// Beta comes from the difference between the two largest sizes when there are two: the
/// per-round latency then cancels out. With more ranks than cores the tiny AllReduce's rounds
/// include waiting for a peer to be scheduled, so alpha comes out several times the latency a
/// large round pays; subtracting that from one large timing can leave nothing, which clamps
/// beta to its floor and makes `auto` send the whole vector to every peer (mesh1) at 1 MiB
/// (seen over tcp with more ranks than cores; docs/performance.md).
pub fn fit(
    nranks: usize,
    small_us: f64,
    large: &[(usize, f64)],
    reduce: (usize, f64),
    eager_bytes: usize,
) -> (f64, f64, f64) {
    let n = nranks as f64;
    let alpha = (small_us / (2.0 * (n - 1.0))).max(0.05);
    let gamma = (reduce.1 / reduce.0.max(1) as f64).max(1e-7);
    let f = (n - 1.0) / n;
    // The calibration's ring runs with the model's slicing (`Model::eager_slicing`), so its
    // rendezvous or extra slices are the ones `eager_alphas` prices.
    let alphas = |bytes: f64| {
        let (extra, _) = eager_alphas(
            Algorithm::Ring,
            Collective::AllReduce,
            nranks,
            bytes,
            eager_bytes,
            false, // one message a round: per round and per message agree
        );
        2.0 * (n - 1.0) + extra
    };
    // Time a ring AllReduce of `bytes` spends moving data: what latency and reduction leave.
    let transfer = |&(bytes, us): &(usize, f64)| {
        let bytes = bytes as f64;
        us - alphas(bytes) * alpha - f * bytes * gamma
    };
    let per_byte = |us: f64, bytes: usize| us / (2.0 * f * bytes as f64);
    let beta = match large {
        [.., one @ (b1, _), two @ (b2, _)] if b2 > b1 => {
            let diff = per_byte(transfer(two) - transfer(one), b2 - b1);
            if diff > 0.0 {
                diff
            } else {
                per_byte(transfer(two), *b2)
            }
        }
        [.., last] => per_byte(transfer(last), last.0),
        // No timing at all: no bandwidth term (beta at its floor).
        [] => 0.0,
    };
    (alpha, beta.max(1e-7), gamma)
}

/// One level's point-to-point timings from rank 0 to a peer (microseconds, one value per
/// repetition): `pingpong` a round trip of a tiny message; `one_way` (bytes, times) a message
/// of that size and a tiny reply, at two sizes at least; `burst` `burst_len` tiny messages sent
/// at once and a tiny reply.
#[derive(Clone, Debug, Default)]
pub struct LinkSamples {
    pub pingpong: Vec<f64>,
    pub one_way: Vec<(usize, Vec<f64>)>,
    pub burst: Vec<f64>,
    pub burst_len: usize,
}

/// The median: robust to the odd repetition a scheduling hiccup or a retransmission made
/// several times slower (up to half the samples may be outliers). None without samples.
pub fn median(v: &[f64]) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(f64::total_cmp);
    let k = s.len() / 2;
    Some(if s.len() % 2 == 1 {
        s[k]
    } else {
        (s[k - 1] + s[k]) / 2.0
    })
}

/// `x` rounded to the nearest of `QUANTUM_STEPS` steps per octave (about 9 % apart), so that
/// repeated calibrations whose medians differ by a few per cent give the same parameter.
pub fn quantize(x: f64) -> f64 {
    if !(x.is_finite() && x > 0.0) {
        return x;
    }
    let steps = f64::from(QUANTUM_STEPS);
    ((x.log2() * steps).round() / steps).exp2()
}

/// Steps per octave of `quantize`.
pub const QUANTUM_STEPS: u32 = 8;

/// A level's link from point-to-point timings (`LinkSamples`), quantized, with the eager
/// limit `eager_bytes` of its transport: alpha is half the median round trip; beta the
/// slope between the medians of the two largest one-way sizes (the latencies and handshakes
/// of both cancel out), else the largest size alone; the per-message CPU cost what each
/// message of a burst adds to a round trip.
pub fn fit_link(s: &LinkSamples, eager_bytes: usize) -> super::Link {
    let rtt = median(&s.pingpong).unwrap_or(0.0);
    let alpha = (rtt / 2.0).max(0.05);
    let mut sizes: Vec<(usize, f64)> = s
        .one_way
        .iter()
        .filter_map(|(b, t)| Some((*b, median(t)?)))
        .collect();
    sizes.sort_by_key(|x| x.0);
    let alone = |(b, t): (usize, f64)| (t - rtt) / b.max(1) as f64;
    let beta = match sizes.as_slice() {
        [.., (b1, t1), (b2, t2)] if b2 > b1 && t2 > t1 => (t2 - t1) / (b2 - b1) as f64,
        [.., last] => alone(*last),
        [] => 0.0,
    };
    let o = match (median(&s.burst), s.burst_len) {
        (Some(t), k) if k > 1 => (t - rtt) / (k - 1) as f64,
        _ => alpha / 2.0,
    };
    super::Link {
        alpha_us: quantize(alpha),
        beta_us_per_byte: quantize(beta.max(1e-7)),
        o_us: quantize(o.clamp(0.01, alpha)),
        eager_bytes,
    }
}

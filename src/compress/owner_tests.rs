//! The owner arithmetic of compressed collectives, ranks simulated in one thread: the error of
//! AllReduce (sum, avg), ReduceScatter and AllGather against an f64 reference within the stated
//! bound for 2..=8 ranks and uneven counts, the owner's full-precision data never reaching the
//! result, and NaN / infinity never coming out finite.
use super::owner::{contribute, finish, reduce_segment, segments, wire_ranges};
use super::{Codec, Format};
use std::ops::Range;

const FORMATS: [Format; 6] = Format::CODED;

fn data(seed: u64, n: usize, wide: bool) -> Vec<f32> {
    crate::testing::values::values(seed, n, wide.then_some(20))
}

/// The scale of element `j` of one segment's codes (1 for bf16).
fn scale_at(c: &Codec, codes: &[u8], j: usize) -> f64 {
    if !c.format.scaled() {
        return 1.0;
    }
    let at = (j / c.block) * c.block_len(c.block);
    f64::from(f32::from_le_bytes(codes[at..at + 4].try_into().unwrap()))
}

fn round_trip_bound(c: &Codec, x: f64, scale: f64) -> f64 {
    let (rel, abs) = c.format.error_terms();
    rel * x.abs() + abs * scale + 2f64.powi(-149)
}

/// Each rank's AllReduce output, every rank running its own steps on what it received; and
/// the per-element error bound against the exact f64 result.
fn allreduce(c: &Codec, inputs: &[Vec<f32>], avg: bool) -> (Vec<Vec<f32>>, Vec<f64>) {
    let (n, count) = (inputs.len(), inputs[0].len());
    let segs = segments(c, count, n);
    let wire = wire_ranges(c, &segs);
    let sent: Vec<Vec<u8>> = inputs
        .iter()
        .map(|x| contribute(c, x, &segs).unwrap())
        .collect();
    let mut bound = vec![0f64; count];
    let results: Vec<Vec<u8>> = (0..n)
        .map(|o| {
            let parts: Vec<&[u8]> = sent.iter().map(|s| &s[wire[o].clone()]).collect();
            reduce_segment(c, &parts, segs[o].len(), avg.then_some(n)).unwrap()
        })
        .collect();
    let div = if avg { n as f64 } else { 1.0 };
    for (o, s) in segs.iter().enumerate() {
        for (j, i) in s.clone().enumerate() {
            let mut e = 0.0;
            let mut mag = 0.0;
            for (r, x) in inputs.iter().enumerate() {
                let sc = scale_at(c, &sent[r][wire[o].clone()], j);
                e += round_trip_bound(c, f64::from(x[i]), sc);
                mag += f64::from(x[i]).abs() + round_trip_bound(c, f64::from(x[i]), sc);
            }
            let sum_err = (n as f64) * 2f64.powi(-24) * mag;
            let total = (e + sum_err) / div + 2f64.powi(-24) * mag / div;
            let exact: f64 = inputs.iter().map(|x| f64::from(x[i])).sum::<f64>() / div;
            let fin = round_trip_bound(c, exact.abs() + total, scale_at(c, &results[o], j));
            bound[i] = total + fin;
        }
    }
    let outs = (0..n)
        .map(|_| {
            let mut out = vec![0f32; count];
            for (o, s) in segs.iter().enumerate() {
                finish(c, &results[o], &mut out[s.clone()]).unwrap();
            }
            out
        })
        .collect();
    (outs, bound)
}

fn check_allreduce(c: &Codec, inputs: &[Vec<f32>], avg: bool, what: &str) {
    let (outs, bound) = allreduce(c, inputs, avg);
    let n = inputs.len() as f64;
    for (r, out) in outs.iter().enumerate() {
        assert!(
            out.iter()
                .zip(&outs[0])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{what}: rank {r} differs from rank 0"
        );
    }
    for (i, v) in outs[0].iter().enumerate() {
        let mut exact: f64 = inputs.iter().map(|x| f64::from(x[i])).sum();
        if avg {
            exact /= n;
        }
        let err = (f64::from(*v) - exact).abs();
        assert!(
            err <= bound[i],
            "{what}: {} K={}: element {i}: got {v:e}, exact {exact:e}, error {err:e} > bound {:e}",
            c.format,
            c.block,
            bound[i]
        );
    }
}

#[test]
fn allreduce_error_within_the_bound_for_2_to_8_ranks() {
    for f in FORMATS {
        for n in 2..=8usize {
            for (count, k) in [
                (1000, 256),
                (1, 256),
                (13, 4),
                (n * 64 + 1, 64),
                (3000, 1000),
            ] {
                let c = Codec::new(f, k).unwrap();
                let inputs: Vec<Vec<f32>> = (0..n)
                    .map(|r| data(r as u64 + 7 * n as u64, count, r % 2 == 1))
                    .collect();
                check_allreduce(&c, &inputs, false, "sum");
                check_allreduce(&c, &inputs, true, "avg");
            }
        }
    }
}

#[test]
fn segments_cover_the_count_in_whole_blocks() {
    for n in 1..=9 {
        for count in [0usize, 1, 255, 256, 257, 10_000] {
            let c = Codec::new(Format::Int8, 256).unwrap();
            let s = segments(&c, count, n);
            assert_eq!(s.len(), n);
            assert_eq!(s[0].start, 0);
            assert_eq!(s[n - 1].end, count);
            for w in s.windows(2) {
                assert_eq!(w[0].end, w[1].start);
                assert!(
                    w[0].end == count || w[0].len() % 256 == 0,
                    "{count} over {n}: {s:?}"
                );
            }
        }
    }
}

#[test]
fn the_owner_sums_its_quantized_data_not_its_own() {
    // Two inputs of the owner that quantize alike give the same result bits: the owner's full
    // precision never reaches the sum.
    let c = Codec::new(Format::Fp8E4m3, 256).unwrap();
    let a = data(1, 512, false);
    let b = data(2, 512, false);
    let mut a2 = a.clone();
    let (mut qa, mut qa2) = (vec![0u8; c.wire_len(512)], vec![0u8; c.wire_len(512)]);
    // Nudge every element of rank 0 by one f32 ulp unless that changes its code.
    for i in 0..512 {
        let nudged = f32::from_bits(a[i].to_bits() + 1);
        let mut t = a2.clone();
        t[i] = nudged;
        c.quantize(&a, &mut qa).unwrap();
        c.quantize(&t, &mut qa2).unwrap();
        if qa == qa2 {
            a2 = t;
        }
    }
    assert_ne!(a, a2, "no element could be nudged");
    let (o1, _) = allreduce(&c, &[a, b.clone()], false);
    let (o2, _) = allreduce(&c, &[a2, b], false);
    assert!(o1[0]
        .iter()
        .zip(&o2[0])
        .all(|(x, y)| x.to_bits() == y.to_bits()));
}

#[test]
fn nan_and_infinity_never_come_out_finite() {
    for f in FORMATS {
        let c = Codec::new(f, 16).unwrap();
        for special in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for n in [2usize, 3, 5] {
                let mut inputs: Vec<Vec<f32>> =
                    (0..n).map(|r| data(r as u64, 100, false)).collect();
                inputs[n - 1][37] = special;
                let (outs, _) = allreduce(&c, &inputs, false);
                for out in &outs {
                    assert!(
                        !out[37].is_finite(),
                        "{f}: {special} at 37 came out {}",
                        out[37]
                    );
                    // Elements outside the special's block stay finite.
                    assert!(
                        out[64..].iter().all(|v| v.is_finite()),
                        "{f}: {special} spread"
                    );
                }
            }
        }
    }
}

/// ReduceScatter (and ReduceScatterV): the caller's segments, owner r's output its segment.
#[test]
fn reducescatter_uneven_segments() {
    for f in FORMATS {
        let c = Codec::new(f, 32).unwrap();
        for n in 2..=8usize {
            let counts: Vec<usize> = (0..n).map(|r| (r * 37 + 5) % 70).collect();
            let mut segs: Vec<Range<usize>> = Vec::new();
            let mut at = 0;
            for k in &counts {
                segs.push(at..at + k);
                at += k;
            }
            let inputs: Vec<Vec<f32>> = (0..n).map(|r| data(100 + r as u64, at, false)).collect();
            let wire = wire_ranges(&c, &segs);
            let sent: Vec<Vec<u8>> = inputs
                .iter()
                .map(|x| contribute(&c, x, &segs).unwrap())
                .collect();
            for (o, s) in segs.iter().enumerate() {
                let parts: Vec<&[u8]> = sent.iter().map(|w| &w[wire[o].clone()]).collect();
                let codes = reduce_segment(&c, &parts, s.len(), None).unwrap();
                let mut out = vec![0f32; s.len()];
                finish(&c, &codes, &mut out).unwrap();
                for (j, i) in s.clone().enumerate() {
                    let exact: f64 = inputs.iter().map(|x| f64::from(x[i])).sum();
                    let mag: f64 = inputs.iter().map(|x| f64::from(x[i]).abs()).sum();
                    // Each contribution and the result at most rel * |.| + abs * scale, scales
                    // at most 2 * amax / max (power-of-two) or amax / 127 (int8), amax <= 10.
                    let (rel, abs) = f.error_terms();
                    let smax = if f.scaled() {
                        20.0 * n as f64 / f64::from(f.max_code_value())
                    } else {
                        1.0
                    };
                    let bound = rel * (2.0 * mag + exact.abs())
                        + abs * smax * (n as f64 + 1.0)
                        + 1e-5 * mag;
                    let err = (f64::from(out[j]) - exact).abs();
                    assert!(
                        err <= bound,
                        "{f} n={n} owner {o} element {i}: error {err:e} > {bound:e}"
                    );
                }
            }
        }
    }
}

/// AllGather: every rank, the owner included, takes the dequantized codes of each block.
#[test]
fn allgather_owner_reads_its_own_codes() {
    let c = Codec::new(Format::Int8, 64).unwrap();
    let own = data(9, 300, true);
    let segs = vec![Range { start: 0, end: 300 }];
    let codes = contribute(&c, &own, &segs).unwrap();
    let mut back = vec![0f32; 300];
    finish(&c, &codes, &mut back).unwrap();
    assert_ne!(back, own, "int8 changes wide-range data");
    for (j, (b, x)) in back.iter().zip(&own).enumerate() {
        let bound = round_trip_bound(&c, f64::from(*x), scale_at(&c, &codes, j));
        assert!((f64::from(*b) - f64::from(*x)).abs() <= bound);
    }
}

//! The compressed call's views of the caller's buffers as f32: float data read and written
//! where it lies when aligned, through a converted copy otherwise, with the same values.
use super::convert::{into_f32, with_f32};
use crate::error::Result;
use crate::reduce::conv::{bf16_to_f32, f32_to_bf16};
use crate::reduce::DataType;

/// `vals` as float bytes starting `off` bytes into a buffer (so unaligned where `off` is not a
/// multiple of 4), and the range they occupy.
fn float_bytes(vals: &[f32], off: usize) -> (Vec<u8>, std::ops::Range<usize>) {
    let mut b = vec![0u8; off + vals.len() * 4 + 8];
    let r = off..off + vals.len() * 4;
    for (c, v) in b[r.clone()].chunks_exact_mut(4).zip(vals) {
        c.copy_from_slice(&v.to_ne_bytes());
    }
    (b, r)
}

#[test]
fn float_input_is_read_alike_aligned_or_not() {
    let vals: Vec<f32> = (0..37).map(|i| i as f32 * -1.25 + 0.5).collect();
    for off in 0..8 {
        let (b, r) = float_bytes(&vals, off);
        let got = with_f32(DataType::Float32, &b[r.clone()], |x| x.to_vec());
        assert_eq!(got, vals, "offset {off}");
        // aligned data is read in place: the slice handed over is the caller's memory
        let here = with_f32(DataType::Float32, &b[r.clone()], |x| x.as_ptr() as usize);
        assert_eq!(
            here == b[r].as_ptr() as usize,
            (b.as_ptr() as usize + off).is_multiple_of(4)
        );
    }
}

#[test]
fn float_output_is_written_alike_aligned_or_not() {
    let vals: Vec<f32> = (0..29).map(|i| i as f32 * 3.5 - 7.0).collect();
    for off in 0..8 {
        let (mut b, r) = float_bytes(&vec![0.0; vals.len()], off);
        let before: Vec<u8> = b.clone();
        into_f32(DataType::Float32, &mut b[r.clone()], |v| -> Result<()> {
            v.copy_from_slice(&vals);
            Ok(())
        })
        .unwrap();
        let (want, _) = float_bytes(&vals, off);
        assert_eq!(b[r.clone()], want[r.clone()], "offset {off}");
        assert_eq!(
            b[..r.start],
            before[..r.start],
            "bytes before, offset {off}"
        );
        assert_eq!(b[r.end..], before[r.end..], "bytes after, offset {off}");
    }
}

#[test]
fn bfloat16_goes_through_a_converted_copy() {
    let vals: Vec<f32> = (0..16).map(|i| i as f32 * 0.75 - 3.0).collect();
    let mut b: Vec<u8> = vals
        .iter()
        .flat_map(|v| f32_to_bf16(*v).to_ne_bytes())
        .collect();
    let got = with_f32(DataType::Bfloat16, &b, |x| x.to_vec());
    assert_eq!(got, vals);
    into_f32(DataType::Bfloat16, &mut b, |v| -> Result<()> {
        v.iter_mut().for_each(|x| *x = 2.0);
        Ok(())
    })
    .unwrap();
    assert!(b
        .chunks_exact(2)
        .all(|c| bf16_to_f32(u16::from_ne_bytes([c[0], c[1]])) == 2.0));
}

#[test]
fn an_error_of_the_writer_is_returned() {
    let mut b = vec![0u8; 16];
    let err = into_f32(DataType::Float32, &mut b, |_| {
        Err(crate::error::Error::Internal("codec".into()))
    });
    assert!(err.is_err());
}

/// A call's cut: whole blocks of every segment, about the chunk's bytes of the call each, at
/// most `MAX_CHUNKS`, its chunk count (the sequence numbers it takes) from its bytes alone;
/// one chunk where the setting is 0 or the call small.
#[test]
fn chunks_are_whole_blocks_and_few() {
    use super::flat::{chunk_cut, chunk_parts, MAX_CHUNKS};
    use crate::compress::{Codec, Format};
    let codec = Codec::new(Format::Int8, 256).unwrap();
    let counts = vec![1 << 20; 4];
    // 16 MiB of f32 in chunks of 4 MiB: 4 chunks of 256 Ki elements of each segment.
    assert_eq!(chunk_cut(&codec, &counts, 4, 4 << 20), (1 << 18, 4));
    assert_eq!(chunk_cut(&codec, &counts, 4, 0), (1 << 20, 1));
    assert_eq!(chunk_cut(&codec, &[1000, 1000], 4, 4 << 20), (1024, 1));
    assert_eq!(chunk_cut(&codec, &[0, 0], 4, 1).1, 1);
    for (counts, el, chunk) in [
        (vec![100_000, 99_999, 0], 2, 1),
        (vec![5, 3_000_000], 4, 12_345),
        (vec![1; 8], 4, 1),
    ] {
        let mut taken = Vec::new();
        for block in [7, 16, 256] {
            let codec = Codec::new(Format::Fp8E4m3, block).unwrap();
            let (per, m) = chunk_cut(&codec, &counts, el, chunk);
            taken.push(m);
            assert!(per.is_multiple_of(block), "{per} {block}");
            let longest = *counts.iter().max().unwrap();
            let runs = longest.div_ceil(per).max(1);
            assert!(runs <= m && m <= MAX_CHUNKS, "{runs} of {m} chunks");
            // The chunks cover every segment once, in order.
            for (r, &c) in counts.iter().enumerate() {
                let mut at = 0;
                for k in 0..runs {
                    let p = &chunk_parts(&counts, per, k)[r];
                    assert_eq!(p.start, at);
                    at = p.end;
                }
                assert_eq!(at, c);
            }
        }
        assert!(taken.iter().all(|&m| m == taken[0]), "{taken:?}");
    }
}

/// The measured rates are positive and finite, and measured once (their speed is not
/// asserted).
#[test]
fn codec_rates_are_measured_once() {
    use super::rate::measured_rate;
    for f in crate::compress::Format::CODED {
        let r = measured_rate(f);
        for g in [r.quantize_gbps, r.dequantize_gbps, r.accumulate_gbps] {
            assert!(g.is_finite() && g > 0.0, "{f}: {r:?}");
        }
        assert_eq!(measured_rate(f), r, "{f}: measured once");
    }
}

/// The pipeline's order: every chunk's exchanges once, each after its chunk's previous one
/// with another chunk's between them where there is one (AllReduce: ToOwners of chunk k, then
/// Gather of chunk k - 1).
#[test]
fn the_pipeline_runs_each_exchange_once_in_its_chunks_order() {
    assert_eq!(
        super::pipe::wavefront(3, 2),
        [(0, 0), (1, 0), (0, 1), (2, 0), (1, 1), (2, 1)]
    );
    assert_eq!(super::pipe::wavefront(2, 1), [(0, 0), (1, 0)]);
    for (m, s) in [(1, 4), (5, 4), (32, 3), (2, 2)] {
        let order = super::pipe::wavefront(m, s);
        assert_eq!(order.len(), m * s);
        for k in 0..m {
            let at: Vec<usize> = (0..s)
                .map(|j| order.iter().position(|&x| x == (k, j)).unwrap())
                .collect();
            assert!(at.windows(2).all(|w| w[0] < w[1]), "{m} x {s}: {at:?}");
            if m > 1 {
                assert!(at.windows(2).all(|w| w[1] > w[0] + 1), "{m} x {s}: {at:?}");
            }
        }
    }
}

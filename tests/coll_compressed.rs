//! Compressed collectives over the transport (ranks as threads over loopback): every format x
//! AllReduce (sum, avg), ReduceScatter(V) and AllGather(V), 2 to 8 ranks, uneven counts, f32,
//! bf16 and f16 data, in place and out of place. Every rank's output must be the bits of the
//! owner arithmetic (`compress::owner`) computed here from the inputs, the same on every
//! rank, and within the documented error bound of an f64 reference (docs/compression.md);
//! NaN and infinities never come out finite; large finite values stay finite; calls
//! compression cannot apply to, ranks that ask for different compression, forced algorithms.
//! The pipeline of chunks: `coll_compressed_pipe.rs`.
use nccl_net_fabricoll::algo::{self, Algorithm, Collective};
use nccl_net_fabricoll::coll::{Call, Kind};
use nccl_net_fabricoll::compress::{Codec, Format};
use nccl_net_fabricoll::config::Compression;
use nccl_net_fabricoll::reduce::DataType;
use nccl_net_fabricoll::transport::Region;

mod common;
mod compressed;
use compressed::*;

/// Every format x collective x 2..=8 ranks, the data type and in-place-ness varying with the
/// case, the format set on the communicators (`FABRICOLL_COMPRESS`'s path).
#[test]
fn every_format_and_collective_gives_the_owner_bits_on_every_rank() {
    let dts = [DataType::Float32, DataType::Bfloat16, DataType::Float16];
    let mut seed = 0u64;
    for n in 2..=8usize {
        for f in FORMATS {
            let block = [256, 16, 7][n % 3];
            let codec = Codec::new(f, block).unwrap();
            let cs = comms(n, Compression { format: f, block });
            for op in OPS {
                seed += 1;
                let dt = dts[(seed as usize) % 3];
                let total = [1000, 1, 257, 64 * n + 3][(seed as usize) % 4];
                check(&cs, &case(op, dt, codec, n, total, seed), None);
            }
        }
    }
}

/// A per-call setting over communicators that compress nothing.
#[test]
fn a_per_call_setting_compresses_one_call() {
    let n = 3;
    let cs = comms(n, Compression::OFF);
    for f in FORMATS {
        let c = Compression {
            format: f,
            block: 32,
        };
        let codec = c.codec().unwrap();
        for (i, op) in OPS.into_iter().enumerate() {
            let case = case(op, DataType::Float32, codec, n, 500, 100 + i as u64);
            check(&cs, &case, Some(c));
        }
    }
}

/// NaN and infinities never come out finite, on every rank; other blocks stay finite. Large
/// finite values (up to f32's range) stay finite: fp8 and int8 saturate, never overflow.
#[test]
fn specials_never_come_out_finite_and_large_values_stay_finite() {
    let n = 3;
    for f in FORMATS {
        let c = Compression {
            format: f,
            block: 16,
        };
        let cs = comms(n, c);
        for special in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for op in [Op::AllReduce, Op::ReduceScatter, Op::AllGather] {
                let mut k = case(op, DataType::Float32, c.codec().unwrap(), n, 96, 7);
                k.inputs[n - 1][5] = special;
                let got = run(&cs, &k, None);
                let (rank, at) = match op {
                    Op::ReduceScatter => (0, 5),
                    Op::AllGather => (0, k.displs[n - 1] + 5),
                    _ => (0, 5),
                };
                assert!(
                    !got[rank][at].is_finite(),
                    "{f} {op:?}: {special} came out {}",
                    got[rank][at]
                );
                assert!(
                    got[rank][16..].iter().all(|v| v.is_finite()) || op == Op::AllGather,
                    "{f} {op:?}: {special} spread past its block"
                );
            }
        }
        // Large finite values whose sum still fits f32: finite, within the bound.
        let mut k = case(
            Op::AllReduce,
            DataType::Float32,
            c.codec().unwrap(),
            n,
            64,
            9,
        );
        for v in &mut k.inputs {
            v[3] = 4.0e37;
            v[20] = -3.0e37;
        }
        let got = run(&cs, &k, None);
        for g in &got {
            assert!(
                g.iter().all(|v| v.is_finite()),
                "{f}: a large value overflowed"
            );
        }
        for (rank, g) in got.iter().enumerate() {
            k.check_bound(rank, g);
        }
    }
}

/// A per-call compression of a call it cannot apply to is an error naming `compress`; the
/// communicator's setting leaves such calls as they are (exact results).
#[test]
fn calls_compression_cannot_apply_to() {
    let n = 2;
    let c = Compression {
        format: Format::Int8,
        block: 256,
    };
    let cs = comms(n, c);
    let results: Vec<(String, Vec<i32>)> = std::thread::scope(|s| {
        let hs: Vec<_> = cs
            .iter()
            .enumerate()
            .map(|(rank, comm)| {
                s.spawn(move || {
                    let mut v: Vec<i32> = (0..100).map(|i| i * (rank as i32 + 1)).collect();
                    // SAFETY: `v` outlives both blocking calls.
                    let r = unsafe { Region::from_raw(v.as_mut_ptr() as *mut u8, 400) };
                    let call = Call {
                        dtype: DataType::Int32,
                        ..common::call(Kind::Coll(Collective::AllReduce), r, r, 100)
                    };
                    let e = comm.run_with(&call, Some(c)).unwrap_err().to_string();
                    comm.run(&call).unwrap();
                    (e, v)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (e, v) in results {
        assert!(e.contains("'compress'") && e.contains("int32"), "{e}");
        assert_eq!(v, (0..100).map(|i| 3 * i).collect::<Vec<i32>>());
    }
}

/// Ranks asking for different formats or block sizes in one call fail together, each with an
/// error naming the setting that differs, one chunk or pipelined (the ranks' cuts differ
/// where their blocks do).
#[test]
fn ranks_asking_for_different_compression_fail_naming_it() {
    for chunk in [None, Some(1)] {
        different_compression_fails_naming_it(chunk);
    }
}

fn different_compression_fails_naming_it(chunk: Option<usize>) {
    let n = 2;
    // As tests/coll_mismatch.rs: a rank that learns nothing of the other call fails at the
    // deadline, and the test would then report that rank's error.
    let cs = comms_with(n, Compression::OFF, 10_000, chunk);
    let fp8 = Compression {
        format: Format::Fp8E4m3,
        block: 256,
    };
    let cases: [([Compression; 2], [&str; 2]); 3] = [
        (
            [
                fp8,
                Compression {
                    format: Format::Fp16,
                    ..fp8
                },
            ],
            [
                "rank 1 passed compress fp16",
                "rank 0 passed compress fp8e4m3",
            ],
        ),
        (
            [fp8, Compression { block: 64, ..fp8 }],
            [
                "rank 1 passed compress block 64",
                "rank 0 passed compress block 256",
            ],
        ),
        (
            [fp8, Compression::OFF],
            [
                "rank 1 runs it uncompressed",
                "rank 0 passed compress fp8e4m3",
            ],
        ),
    ];
    for (settings, said) in cases {
        let errs: Vec<String> = std::thread::scope(|s| {
            let hs: Vec<_> = cs
                .iter()
                .zip(settings)
                .map(|(comm, c)| s.spawn(move || common::typed::ones_allreduce(comm, Some(c))))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (rank, e) in errs.iter().enumerate() {
            assert!(
                e.contains("the ranks' calls differ") && e.contains(said[rank]),
                "{settings:?} chunk {chunk:?}: rank {rank}: {e}"
            );
        }
    }
}

/// A forced algorithm runs each exchange it implements (AllToAll: mesh, bruck, pairwise;
/// AllGather: ring, bidir_ring, mesh, rdh, bruck, hier, swizzle); the others run as the cost
/// model chooses for them. The results are the owner's bits whichever algorithms run.
#[test]
fn a_forced_algorithm_runs_the_exchanges_it_implements() {
    let n = 4;
    let c = Compression {
        format: Format::Int8,
        block: 32,
    };
    let codec = c.codec().unwrap();
    let cs = comms(n, c);
    let r = Region::empty();
    for (i, op) in [Op::AllReduce, Op::ReduceScatter, Op::AllGather]
        .into_iter()
        .enumerate()
    {
        let coll = match op {
            Op::AllReduce => Collective::AllReduce,
            Op::ReduceScatter => Collective::ReduceScatter,
            _ => Collective::AllGather,
        };
        let probe = |algo| Call {
            algo,
            ..common::call(Kind::Coll(coll), r, r, 777)
        };
        let auto = cs[0].exchange_algos(&probe(None), codec).unwrap();
        for a in Algorithm::ALL {
            if !algo::supports(a, coll) {
                continue;
            }
            let got = cs[0].exchange_algos(&probe(Some(a)), codec).unwrap();
            assert_eq!(got.len(), auto.len());
            for ((x, chosen), (_, model)) in got.iter().zip(&auto) {
                let want = if algo::supports(a, *x) { a } else { *model };
                assert_eq!(*chosen, want, "{op:?} forced {a}: the {x:?} exchange");
            }
            let mut k = case(op, DataType::Float32, codec, n, 700, 300 + i as u64);
            k.algo = Some(a);
            check(&cs, &k, None);
        }
    }
}

//! The pipeline of compressed calls (ranks as threads over loopback; docs/compression.md,
//! "Pipeline"): calls cut into many chunks give the bits of one chunk on every rank, every
//! level compressed alike and the inter-host level alone (hosts from
//! `FABRICOLL_LOCAL_RANKS`); non-blocking calls in flight, abort, the deadline, and an output
//! that overlaps the input.
use nccl_net_fabricoll::algo::Collective;
use nccl_net_fabricoll::coll::{Comm, Kind};
use nccl_net_fabricoll::compress::{Codec, Format};
use nccl_net_fabricoll::config::Compression;
use nccl_net_fabricoll::reduce::DataType;
use nccl_net_fabricoll::transport::Region;

mod common;
mod compressed;
use compressed::*;
use std::sync::Arc;

/// Non-blocking compressed calls, several in flight at once, complete with the same bits as
/// blocking ones, one chunk each or pipelined.
#[test]
fn several_nonblocking_compressed_calls_in_flight() {
    for chunk in [None, Some(1)] {
        nonblocking_calls_in_flight(chunk);
    }
}

fn nonblocking_calls_in_flight(chunk: Option<usize>) {
    let n = 4;
    let c = Compression {
        format: Format::Fp8E5m2,
        block: 64,
    };
    let cs = comms_with(n, c, 60_000, chunk);
    let k = case(
        Op::AllReduce,
        DataType::Float32,
        c.codec().unwrap(),
        n,
        3000,
        4,
    );
    let want = k.expected();
    let got: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
        let hs: Vec<_> = cs
            .iter()
            .enumerate()
            .map(|(rank, comm)| {
                let k = &k;
                s.spawn(move || {
                    let mut bufs: Vec<Vec<f32>> = (0..3).map(|_| k.inputs[rank].clone()).collect();
                    let ids: Vec<_> = bufs
                        .iter_mut()
                        .map(|b| {
                            // SAFETY: `bufs` outlives every request, all waited for below.
                            let r =
                                unsafe { Region::from_raw(b.as_mut_ptr() as *mut u8, 4 * b.len()) };
                            let call =
                                common::call(Kind::Coll(Collective::AllReduce), r, r, b.len());
                            comm.start(&call).unwrap()
                        })
                        .collect();
                    for id in ids.into_iter().rev() {
                        comm.wait(id).unwrap();
                    }
                    bufs
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (rank, bufs) in got.iter().enumerate() {
        for b in bufs {
            assert!(b
                .iter()
                .zip(&want[rank])
                .all(|(x, y)| x.to_bits() == y.to_bits()));
        }
    }
    // Ranks 0 and 1 start a call the others never join; each aborts it in flight.
    let errs = common::on_every_rank(&cs[..2], |_, comm| {
        let mut v = vec![1f32; 3000];
        // SAFETY: `v` outlives the request, which fails below before `v` is dropped.
        let r = unsafe { Region::from_raw(v.as_mut_ptr() as *mut u8, 4 * v.len()) };
        let id = comm
            .start(&common::call(
                Kind::Coll(Collective::AllReduce),
                r,
                r,
                v.len(),
            ))
            .unwrap();
        for _ in 0..10 {
            let _ = comm.test(id);
        }
        comm.abort();
        comm.wait(id).unwrap_err().to_string()
    });
    for (rank, e) in errs.iter().enumerate() {
        assert!(e.contains("aborted"), "chunk {chunk:?}: rank {rank}: {e}");
    }
}

/// A pipelined call whose partner never comes fails at the deadline, naming it, as one chunk
/// does (the deadline is what this tests).
#[test]
fn a_pipelined_call_alone_fails_at_the_deadline() {
    let c = Compression {
        format: Format::Int8,
        block: 16,
    };
    for chunk in [0, 1] {
        let cs = comms_with(2, c, 500, Some(chunk));
        let mut v = vec![1f32; 3000];
        // SAFETY: `v` outlives the blocking call.
        let r = unsafe { Region::from_raw(v.as_mut_ptr() as *mut u8, 4 * v.len()) };
        let call = common::call(Kind::Coll(Collective::AllReduce), r, r, v.len());
        let e = cs[0].run(&call).unwrap_err().to_string();
        assert!(e.contains("timeout"), "chunk {chunk}: {e}");
    }
}

/// A pipelined call (chunks of one block of every segment, or as few more as the most chunks
/// a call takes allow) gives the bits of one chunk on every rank, and the owner arithmetic's:
/// every format x collective, f32, bf16 and f16, in place and out of place, uneven counts.
#[test]
fn pipelined_calls_give_the_bits_of_one_chunk() {
    let dts = [DataType::Float32, DataType::Bfloat16, DataType::Float16];
    let mut seed = 1000u64;
    for (n, block) in [(2, 16), (3, 7), (4, 256)] {
        for f in FORMATS {
            let c = Compression { format: f, block };
            let codec = Codec::new(f, block).unwrap();
            let (piped, whole) = (comms_chunked(n, c, 1), comms_chunked(n, c, 0));
            for op in OPS {
                seed += 1;
                let dt = dts[(seed as usize) % 3];
                let total = [1000, 5000, 64 * n + 3][(seed as usize) % 3];
                let case = case(op, dt, codec, n, total, seed);
                let (a, b) = (run(&piped, &case, None), run(&whole, &case, None));
                let want = case.expected();
                for rank in 0..n {
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    let what = format!(
                        "{op:?} {f} {dt} n={n} in_place={} rank {rank}",
                        case.in_place
                    );
                    assert_eq!(
                        bits(&a[rank]),
                        bits(&b[rank]),
                        "{what}: pipelined vs one chunk"
                    );
                    assert_eq!(
                        bits(&a[rank]),
                        bits(&want[rank]),
                        "{what}: owner arithmetic"
                    );
                }
            }
        }
    }
}

/// An AllReduce whose output overlaps its input shifted (not NCCL's in place; by part of an
/// element, one element, or several chunks, past those quantized ahead) gives, pipelined, the
/// bits of the same call out of place: a chunk's output must not reach a later chunk's input.
#[test]
fn a_pipelined_call_whose_output_overlaps_its_input_reads_the_input_first() {
    let c = Compression {
        format: Format::Int8,
        block: 16,
    };
    // Every level compressed alike, and the inter-host level alone (2 hosts x 2 ranks).
    for comms in [comms_chunked(3, c, 1), comms_on_hosts(4, 2, c, 1)] {
        output_overlapping_input_reads_it_first(&comms);
    }
}

fn output_overlapping_input_reads_it_first(comms: &[Arc<Comm>]) {
    let (n, count) = (comms.len(), 3000usize);
    let inputs: Vec<Vec<f32>> = (0..n).map(|r| data(77 + r as u64, count, r == 1)).collect();
    let results = |shift: Option<usize>| {
        common::on_every_rank(comms, |rank, comm| {
            let bytes: Vec<u8> = inputs[rank].iter().flat_map(|x| x.to_ne_bytes()).collect();
            let len = count * 4;
            let mut buf = vec![0u8; len + 1024];
            let mut out = vec![0u8; len];
            buf[..len].copy_from_slice(&bytes);
            let p = buf.as_mut_ptr();
            // SAFETY: both regions lie within `buf` or `out`, which outlive the blocking call.
            let (send, recv) = unsafe {
                match shift {
                    Some(s) => (Region::from_raw(p, len), Region::from_raw(p.add(s), len)),
                    None => (
                        Region::from_raw(p, len),
                        Region::from_raw(out.as_mut_ptr(), len),
                    ),
                }
            };
            let call = common::call(Kind::Coll(Collective::AllReduce), send, recv, count);
            comm.run(&call).unwrap();
            recv.to_vec()
        })
    };
    let apart = results(None);
    for shift in [2, 4, 800] {
        assert_eq!(
            results(Some(shift)),
            apart,
            "output {shift} bytes past the input"
        );
    }
}

/// The inter-host-only composition pipelined (chunks of one block of every segment, or as few
/// more as the most chunks a call takes allow) gives the bits of one chunk on every rank: hosts
/// 2 x 2, 3 + 2, 2 + 2 + 1, 3 x 2 and 2 x 3, every collective (uniform and V, sum and avg),
/// f32, bf16 and f16 data, in place and out of place, uneven counts.
#[test]
fn pipelined_tiered_calls_give_the_bits_of_one_chunk() {
    let dts = [DataType::Float32, DataType::Bfloat16, DataType::Float16];
    let mut seed = 2000u64;
    for (n, per, format, block) in [
        (4, 2, Format::Bf16, 16),
        (5, 3, Format::Fp8E4m3, 7),
        (5, 2, Format::Int8, 16),
        (6, 2, Format::Fp8E5m2, 32),
        (6, 3, Format::Fp16, 5),
    ] {
        let c = Compression { format, block };
        let codec = Codec::new(format, block).unwrap();
        let (piped, whole) = (comms_on_hosts(n, per, c, 1), comms_on_hosts(n, per, c, 0));
        // The composition runs: its AllReduce is four exchanges (two inside hosts).
        let probe = common::call(
            Kind::Coll(Collective::AllReduce),
            Region::empty(),
            Region::empty(),
            1000,
        );
        assert_eq!(piped[0].exchange_algos(&probe, codec).unwrap().len(), 4);
        for op in OPS {
            for in_place in [false, true] {
                seed += 1;
                let dt = dts[(seed as usize) % 3];
                let total = [1000, 5000, 64 * n + 3][(seed as usize / 2) % 3];
                let mut case = case(op, dt, codec, n, total, seed);
                case.in_place = in_place;
                let (a, b) = (run(&piped, &case, None), run(&whole, &case, None));
                for rank in 0..n {
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&a[rank]),
                        bits(&b[rank]),
                        "{op:?} {format} {dt} {n} ranks, {per} per host, in_place={in_place}, \
                         {total} elements: rank {rank}: pipelined vs one chunk"
                    );
                }
            }
        }
    }
}

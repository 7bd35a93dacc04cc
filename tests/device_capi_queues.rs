//! Stream-ordered calls where the caller's stream shares a hardware queue with the library's
//! streams, on the emulated device: ranks as threads over shm, but each on an emulated device
//! of its own ordinal, so that each rank has a context of its own, as ranks that are processes
//! do (the production case), and ranks do not share queues; each context has 1 or 2 hardware
//! queues (`EmuConfig::queues`), so that the caller's stream shares one with any other stream
//! of its rank. A flag wait on the caller's stream holds back every stream behind it on its
//! queue (docs/device-calls.md, "Hardware queues"): a call whose copies ran on streams of their
//! own would sit behind its own wait until its deadline. Every stream-ordered call, each of
//! several slices, then several calls back to back on one stream without host synchronisation.
use capi::{comm, last_error, ranks};
use device::*;
use nccl_net_fabricoll::coll::device::install_on_thread;
use nccl_net_fabricoll::device::{Device, EmuConfig};
use nccl_net_fabricoll::ffi::api::*;
use std::time::Duration;

use fabricoll_status::*;

mod capi;
mod device;

const STREAM: Mode = Mode::Stream;

/// One emulated device per rank, each of an ordinal no other device of this process uses (a
/// context of its own), with `queues` hardware queues.
fn devices(n: usize, queues: usize) -> Vec<Device> {
    static NEXT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(100);
    (0..n)
        .map(|_| {
            Device::emulated(EmuConfig {
                ordinal: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                max_delay: Duration::from_micros(50),
                queues,
                ..EmuConfig::default()
            })
            .expect("emulated device")
        })
        .collect()
}

/// Every stream-ordered call on 2 ranks, with 1 and then 2 queues per rank, each call of
/// several slices (AllToAll's and ReduceScatter's blocks share a slot, so fewer elements give
/// them several).
#[test]
fn stream_ordered_calls_of_several_slices_with_few_hardware_queues() {
    let test = "stream_ordered_calls_of_several_slices_with_few_hardware_queues";
    let n = 2;
    for queues in [1, 2] {
        let devs = devices(n, queues);
        let Some(cs) = ranks(test, &config(), n) else {
            return;
        };
        let dd = (Place::Device, Place::Device);
        for &coll in COLLS {
            run_case(&devs, &cs, coll, Ty::F32, Op::Sum, 700_001, dd, STREAM);
        }
        destroy(&cs);
    }
}

/// Several stream-ordered allreduces of several slices back to back on each rank's stream (one
/// hardware queue), more than the staging slots can hold at once, with no host
/// synchronisation between them; every result checked.
#[test]
fn stream_ordered_calls_back_to_back_with_one_hardware_queue() {
    let test = "stream_ordered_calls_back_to_back_with_one_hardware_queue";
    let n = 2;
    const CALLS: usize = 8;
    const COUNT: usize = 700_001;
    let devs = devices(n, 1);
    let Some(cs) = ranks(test, &config(), n) else {
        return;
    };
    let ready = std::sync::Barrier::new(n);
    std::thread::scope(|sc| {
        for (me, &c) in cs.iter().enumerate() {
            let (d, ready) = (devs[me].clone(), &ready);
            sc.spawn(move || {
                d.bind().unwrap();
                install_on_thread(Some(d.clone()));
                let s = d.create_stream().unwrap();
                let (input, want) = expected(Coll::AllReduce, Op::Sum, n, me, COUNT);
                let bytes = Ty::F32.encode(&input);
                let mut bufs: Vec<Buf> = (0..CALLS)
                    .map(|_| Buf::new(&d, &s, Place::Device, &bytes))
                    .collect();
                let (f32t, sum, cm) = (Ty::F32.c(), Op::Sum.c(), comm(c));
                ready.wait();
                for (i, b) in bufs.iter_mut().enumerate() {
                    let p = b.ptr();
                    let st = fabricoll_allreduce_stream(p, p, COUNT, f32t, sum, cm, s.handle());
                    assert_eq!(
                        st,
                        FABRICOLL_SUCCESS,
                        "rank {me} call {i}: {}",
                        last_error()
                    );
                }
                // Each rank has a context of its own: no step is needed before a rank's
                // page-locked allocations (downloads), and a failing rank leaves none waiting.
                s.synchronize(WAIT).unwrap();
                no_async_error(cm);
                let want = Ty::F32.encode(&want.unwrap());
                for (i, b) in bufs.iter_mut().enumerate() {
                    assert!(b.read(&s, COUNT * 4) == want, "rank {me} call {i}");
                }
            });
        }
    });
    destroy(&cs);
}

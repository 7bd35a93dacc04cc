//! The direct path of the C API's device calls (docs/device-calls.md) on the emulated device,
//! whose device memory the host cannot touch (PROT_NONE: a host read or write faults), ranks
//! as threads over the loopback transport made to offer "FI_HMEM" for it: it moves device bytes
//! with the device's copies, as libfabric's shm provider moves FI_HMEM_CUDA bytes with CUDA
//! copies. Every call that goes direct (send/recv, tagged, Broadcast, AllGather, AllToAll,
//! Gather, Scatter, AllGatherV), blocking, non-blocking and grouped, in place and out of place,
//! on 2, 3 and 4 ranks, gives the results the host path gives (the same expected bytes, checked
//! on host buffers too), and is counted as direct; reductions and stream-ordered calls stay
//! staged; a transport without FI_HMEM, or whose registration of device memory fails, stages
//! every call.
use device::direct::*;
use device::*;
use nccl_net_fabricoll::coll::Comm;
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::device::Device;
use nccl_net_fabricoll::ffi::api::*;
use nccl_net_fabricoll::transport::loopback::LoopbackFabric;
use nccl_net_fabricoll::transport::Transport;
use std::sync::Arc;

mod capi;
mod device;

/// How the loopback fabric of a test treats device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hmem {
    /// Offers FI_HMEM and registers device memory.
    Registers,
    /// Offers FI_HMEM, and every registration of device memory fails.
    Refuses,
    /// No FI_HMEM.
    None,
}

/// `n` C API communicators (handles) over one loopback fabric, ranks as threads.
fn comms(d: &Device, n: usize, hmem: Hmem) -> Vec<usize> {
    let f = match hmem {
        Hmem::Registers => LoopbackFabric::with_device(d.clone(), true),
        Hmem::Refuses => LoopbackFabric::with_device(d.clone(), false),
        Hmem::None => LoopbackFabric::new(),
    };
    let cfg = Config::from_lookup(|k| (k == "FABRICOLL_TIMEOUT_MS").then(|| "20000".into()))
        .expect("config");
    let eps: Vec<Arc<dyn Transport>> = (0..n)
        .map(|_| Arc::new(f.endpoint()) as Arc<dyn Transport>)
        .collect();
    let addrs: Vec<Vec<u8>> = eps.iter().map(|e| e.address()).collect();
    std::thread::scope(|s| {
        let hs: Vec<_> = eps
            .into_iter()
            .enumerate()
            .map(|(r, ep)| {
                let (addrs, cfg) = (&addrs, &cfg);
                s.spawn(move || Comm::new(r, ep, addrs, cfg).expect("loopback communicator"))
            })
            .collect();
        hs.into_iter()
            .map(|h| comm_handle(h.join().expect("rank")) as usize)
            .collect()
    })
}

#[test]
fn covered_calls_go_direct_and_give_the_host_paths_results() {
    let _serial = serial();
    let d = dev();
    for n in [2, 3, 4] {
        let cs = comms(&d, n, Hmem::Registers);
        for (coll, calls) in DIRECT {
            for mode in [Mode::Blocking, Mode::NonBlocking, Mode::Grouped] {
                for (ty, count) in [(Ty::F32, 1), (Ty::I32, 1000), (Ty::F64, 3)] {
                    case(&d, &cs, coll, ty, count, mode, calls);
                }
            }
            // More than the staged path's slice (1 MiB per block): one call all the same.
            case(&d, &cs, coll, Ty::F32, 300_001, Mode::Blocking, calls);
        }
        destroy(&cs);
    }
}

#[test]
fn reductions_and_stream_ordered_calls_stay_staged() {
    let _serial = serial();
    let d = dev();
    let cs = comms(&d, 3, Hmem::Registers);
    for coll in [
        Coll::AllReduce,
        Coll::ReduceScatter,
        Coll::Reduce,
        Coll::ReduceScatterV,
    ] {
        case(&d, &cs, coll, Ty::F32, 1000, Mode::Blocking, 0);
        case(&d, &cs, coll, Ty::I32, 1000, Mode::NonBlocking, 0);
    }
    for (coll, _) in DIRECT {
        case(&d, &cs, coll, Ty::F32, 1000, Mode::Stream, 0);
    }
    // A call on host and device buffers together is staged too.
    let before = direct(&cs);
    let mixed = (Place::Host, Place::Device);
    let ds = std::slice::from_ref(&d);
    run_case(
        ds,
        &cs,
        Coll::AllGather,
        Ty::F32,
        Op::Sum,
        1000,
        mixed,
        Mode::Blocking,
    );
    assert_eq!(direct(&cs), before, "a mixed call went direct");
    destroy(&cs);
}

#[test]
fn without_fi_hmem_or_with_a_failing_registration_every_call_is_staged() {
    let _serial = serial();
    let d = dev();
    for hmem in [Hmem::None, Hmem::Refuses] {
        let cs = comms(&d, 2, hmem);
        for (coll, _) in DIRECT {
            case(&d, &cs, coll, Ty::F32, 1000, Mode::Blocking, 0);
            case(&d, &cs, coll, Ty::I32, 300_001, Mode::NonBlocking, 0);
        }
        destroy(&cs);
    }
}

#[test]
fn in_place_calls_go_direct_on_a_copy_of_their_input() {
    let _serial = serial();
    let d = dev();
    for n in [2, 3] {
        let cs = comms(&d, n, Hmem::Registers);
        for coll in [Coll::AllGather, Coll::Broadcast, Coll::AllToAll] {
            for count in [1, 1000, 300_001] {
                in_place(&d, &cs, coll, count, 1);
            }
        }
        in_place(&d, &cs, Coll::AllReduce, 1000, 0);
        destroy(&cs);
    }
}

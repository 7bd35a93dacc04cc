//! The direct path of the C API's device calls (docs/device-calls.md) on the emulated device,
//! whose device memory the host cannot touch (PROT_NONE: a host read or write faults), ranks
//! as threads over the loopback transport made to offer "FI_HMEM" for it: it moves device bytes
//! with the device's copies, as libfabric's shm provider moves FI_HMEM_CUDA bytes with CUDA
//! copies. Every call on device buffers (the collectives, reductions included, send/recv,
//! tagged, gather, scatter, allgatherv, reducescatterv), blocking, non-blocking and grouped, on
//! 2, 3 and 4 ranks, and in place, goes direct (counted) and gives the results the host path
//! gives (the same expected bytes, checked on host buffers too; Avg against the host call's
//! bits); stream-ordered and mixed host and device calls stay staged; a transport without
//! FI_HMEM, or whose registration of device memory fails, stages every call; a direct call
//! that gets nothing fails at the deadline.
use capi::{comm, last_error};
use device::direct::*;
use device::*;
use nccl_net_fabricoll::coll::Comm;
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::device::Device;
use nccl_net_fabricoll::ffi::api::*;
use nccl_net_fabricoll::transport::loopback::LoopbackFabric;
use nccl_net_fabricoll::transport::Transport;
use std::sync::Arc;

use fabricoll_status::*;

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
    comms_with(d, n, hmem, "20000")
}

/// `comms` with the deadline `timeout_ms`.
fn comms_with(d: &Device, n: usize, hmem: Hmem, timeout_ms: &str) -> Vec<usize> {
    let f = match hmem {
        Hmem::Registers => LoopbackFabric::with_device(d.clone(), true),
        Hmem::Refuses => LoopbackFabric::with_device(d.clone(), false),
        Hmem::None => LoopbackFabric::new(),
    };
    let cfg = Config::from_lookup(|k| (k == "FABRICOLL_TIMEOUT_MS").then(|| timeout_ms.into()))
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
fn every_call_on_device_buffers_goes_direct_and_gives_the_host_paths_results() {
    let _serial = serial();
    let d = dev();
    let types = [(Ty::F32, Op::Sum), (Ty::I32, Op::Max), (Ty::F64, Op::Min)];
    for n in [2, 3, 4] {
        let cs = comms(&d, n, Hmem::Registers);
        for (coll, calls) in DIRECT {
            for mode in [Mode::Blocking, Mode::NonBlocking, Mode::Grouped] {
                for (k, count) in [1, 1000, 3].into_iter().enumerate() {
                    case(&d, &cs, coll, types[k], count, mode, calls);
                }
            }
            // More than the staged path's slice (1 MiB per block): one call all the same.
            case(&d, &cs, coll, types[0], 300_001, Mode::Blocking, calls);
        }
        destroy(&cs);
    }
}

#[test]
fn stream_ordered_and_mixed_calls_stay_staged() {
    let _serial = serial();
    let d = dev();
    let cs = comms(&d, 3, Hmem::Registers);
    for (coll, _) in DIRECT {
        case(&d, &cs, coll, (Ty::F32, Op::Sum), 1000, Mode::Stream, 0);
    }
    // A call on host and device buffers together is staged.
    let before = direct(&cs);
    let mixed = (Place::Host, Place::Device);
    let ds = std::slice::from_ref(&d);
    for coll in [Coll::AllGather, Coll::AllReduce] {
        run_case(ds, &cs, coll, Ty::F32, Op::Sum, 1000, mixed, Mode::Blocking);
    }
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
            case(&d, &cs, coll, (Ty::F32, Op::Sum), 1000, Mode::Blocking, 0);
            case(
                &d,
                &cs,
                coll,
                (Ty::I32, Op::Max),
                300_001,
                Mode::NonBlocking,
                0,
            );
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
        for coll in [
            Coll::AllGather,
            Coll::Broadcast,
            Coll::AllToAll,
            Coll::AllReduce,
            Coll::ReduceScatter,
        ] {
            for count in [1, 1000, 300_001] {
                in_place(&d, &cs, coll, count, 1);
            }
        }
        destroy(&cs);
    }
}

/// AllReduce with Avg on device buffers, direct (its division on the device), gives the host
/// call's bits, for a float and an integer type (which divides truncating).
#[test]
fn avg_on_device_buffers_gives_the_host_calls_bits() {
    let _serial = serial();
    let d = dev();
    let n = 3;
    let cs = comms(&d, n, Hmem::Registers);
    let avg = fabricoll_redop::FABRICOLL_AVG as std::os::raw::c_int;
    for ty in [Ty::F32, Ty::I32] {
        let count = 1001;
        let before = direct(&cs);
        each_rank(&d, &cs, |me, c, s| {
            let d = s.device();
            let input = ty.encode(&(0..count).map(|i| value(me, i) * 3 + 1).collect::<Vec<_>>());
            let bytes = input.len();
            let mut host = input.clone();
            let p = host.as_mut_ptr().cast();
            let st = fabricoll_allreduce(p, p, count, ty.c(), avg, comm(c));
            assert_eq!(st, FABRICOLL_SUCCESS, "host avg: {}", last_error());
            let mut dev_in = Buf::new(d, s, Place::Device, &input);
            let mut dev_out = Buf::new(d, s, Place::Device, &vec![0u8; bytes]);
            let (i, o) = (dev_in.ptr(), dev_out.ptr());
            let st = fabricoll_allreduce(i, o, count, ty.c(), avg, comm(c));
            assert_eq!(st, FABRICOLL_SUCCESS, "device avg: {}", last_error());
            let got = dev_out.read(s, bytes);
            assert!(got == host, "{ty:?} rank {me}: other bits");
        });
        counted(&cs, &before, 1, &format!("AllReduce Avg {ty:?}"));
    }
    destroy(&cs);
}

/// A direct receive whose sender never sends fails with FABRICOLL_TIMEOUT at the deadline (what
/// this test is about, so the deadline is short) rather than hanging; the communicator is then
/// destroyed cleanly, with the failed call's device memory given up.
#[test]
fn a_direct_call_that_gets_nothing_fails_at_the_deadline() {
    let _serial = serial();
    let d = dev();
    let cs = comms_with(&d, 2, Hmem::Registers, "300");
    each_rank(&d, &cs, |me, c, s| {
        if me == 0 {
            let mut buf = Buf::new(s.device(), s, Place::Device, &[0u8; 4096]);
            let st = fabricoll_recv(buf.ptr(), 1024, Ty::F32.c(), 1, comm(c));
            assert_eq!(st, FABRICOLL_TIMEOUT, "{}", last_error());
        }
    });
    assert_eq!(direct(&cs), [1, 0], "the receive went direct");
    destroy(&cs);
}

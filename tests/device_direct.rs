//! The direct path of the C API's device calls (docs/device-calls.md) on the emulated device,
//! whose device memory the host cannot touch (PROT_NONE: a host read or write faults), ranks
//! as threads over the loopback transport made to offer "FI_HMEM" for it: it moves device bytes
//! with the device's copies, as libfabric's shm provider moves FI_HMEM_CUDA bytes with CUDA
//! copies. Every call on device buffers (the collectives, reductions included, send/recv,
//! tagged, gather, scatter, allgatherv, reducescatterv), blocking, non-blocking and grouped, on
//! 2, 3 and 4 ranks, and in place, goes direct (counted) and gives the results the host path
//! gives (the same expected bytes, checked on host buffers too; Avg against the host call's
//! bits); stream-ordered calls go direct too (`stream_ordered`: each on an emulated device of
//! its own, see there), and mixed host and device calls, or stream-ordered ones on page-locked
//! host memory, stay staged; a transport without FI_HMEM, or whose registration of device
//! memory fails, stages every call; a direct call that gets nothing fails at the deadline.
use capi::{comm, last_error};
use device::direct::*;
use device::stream_ordered::*;
use device::*;
use nccl_net_fabricoll::coll::Comm;
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::device::{Device, DeviceBuffer, Flag, Stream};
use nccl_net_fabricoll::ffi::api::*;
use nccl_net_fabricoll::transport::loopback::LoopbackFabric;
use nccl_net_fabricoll::transport::Transport;
use std::os::raw::c_void;
use std::sync::Arc;
use std::time::Duration;

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
    comms_with(d, n, hmem, "20000", "streams")
}

/// `comms` with the deadline `timeout_ms` and `FABRICOLL_DEVICE_DIRECT` set to `directness`.
fn comms_with(d: &Device, n: usize, hmem: Hmem, timeout_ms: &str, directness: &str) -> Vec<usize> {
    let f = match hmem {
        Hmem::Registers => LoopbackFabric::with_device(d.clone(), true),
        Hmem::Refuses => LoopbackFabric::with_device(d.clone(), false),
        Hmem::None => LoopbackFabric::new(),
    };
    let cfg = Config::from_lookup(|k| match k {
        "FABRICOLL_TIMEOUT_MS" => Some(timeout_ms.into()),
        "FABRICOLL_DEVICE_DIRECT" => Some(directness.into()),
        _ => None,
    })
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

/// Every call stream-ordered on device buffers goes direct (counted) on 2, 3 and 4 ranks, three
/// (type, op) pairs, and gives the bytes the same call blocking on host buffers gives, which
/// are the expected ones.
#[test]
fn stream_ordered_calls_go_direct_and_give_the_host_paths_results() {
    let _serial = serial();
    let types = [(Ty::F32, Op::Sum), (Ty::I32, Op::Max), (Ty::F64, Op::Min)];
    for n in [2, 3, 4] {
        let d = own_device();
        let cs = comms(&d, n, Hmem::Registers);
        on_streams(&d, &cs, |me, c, s, step| {
            for (coll, calls) in DIRECT {
                for (k, count) in [1, 1000, 300_001].into_iter().enumerate() {
                    let (ty, op) = types[2 - k];
                    let case = Case {
                        coll,
                        ty,
                        op,
                        count,
                        places: DD,
                    };
                    case.run(me, c, s, step, n, calls);
                }
            }
        });
        destroy(&cs);
    }
}

/// With `FABRICOLL_DEVICE_DIRECT=auto` (the default) stream-ordered calls on device buffers are
/// staged over a fabric where the other device calls go direct (the test above): every call on
/// 2 ranks gives the expected bytes, and none counts as direct.
#[test]
fn by_default_stream_ordered_calls_are_staged() {
    let _serial = serial();
    let d = own_device();
    let n = 2;
    let cs = comms_with(&d, n, Hmem::Registers, "20000", "auto");
    on_streams(&d, &cs, |me, c, s, step| {
        for (coll, _) in DIRECT {
            for count in [1000, 300_001] {
                let case = Case {
                    coll,
                    ty: Ty::F32,
                    op: Op::Sum,
                    count,
                    places: DD,
                };
                case.run(me, c, s, step, n, 0);
            }
        }
    });
    destroy(&cs);
}

/// On a communicator whose calls go direct, a call on host and device buffers together is
/// staged, and so is a stream-ordered call on page-locked host memory (alone or with device
/// memory): both give the expected bytes, and neither counts as direct (but for the send or
/// receive of a pair on device memory, a call of its own).
#[test]
fn mixed_and_page_locked_calls_stay_staged() {
    let _serial = serial();
    let d = own_device();
    let n = 3;
    let cs = comms(&d, n, Hmem::Registers);
    on_streams(&d, &cs, |me, c, s, step| {
        for coll in [Coll::AllGather, Coll::AllReduce, Coll::SendRecv] {
            // A send and a receive each take one buffer: the one on device memory goes direct.
            let p2p = u64::from(coll == Coll::SendRecv);
            for (places, mode, calls) in [
                ((Place::Host, Place::Device), Mode::Blocking, p2p),
                ((Place::Pinned, Place::Pinned), Mode::Stream, 0),
                ((Place::Device, Place::Pinned), Mode::Stream, p2p),
            ] {
                // A direct send makes one host call where a staged receive of more than one
                // slice makes several (docs/device-calls.md): one slice there.
                let sliced = coll != Coll::SendRecv || places != (Place::Device, Place::Pinned);
                let case = Case {
                    coll,
                    ty: Ty::F32,
                    op: Op::Sum,
                    count: if sliced { 300_001 } else { 1000 },
                    places,
                };
                case.run_in(me, c, s, step, n, mode, calls);
            }
        }
    });
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
    let cs = comms_with(&d, 2, Hmem::Registers, "300", "streams");
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

/// A stream-ordered AllReduce of one element on every rank: the communicator's first
/// stream-ordered call, which waits for every rank and makes its staging (page-locked memory,
/// whose allocation waits for every stream of the device), before a test's stream waits for
/// anything of its own.
fn warm_up(me: usize, c: usize, s: &Stream, step: &Step, n: usize, calls: u64) {
    let case = stream_ordered::Case {
        coll: Coll::AllReduce,
        ty: Ty::F32,
        op: Op::Sum,
        count: 1,
        places: DD,
    };
    case.run(me, c, s, step, n, calls);
}

/// `bytes` in new device memory, uploaded through `s`.
fn on_device(s: &Stream, bytes: &[u8]) -> DeviceBuffer {
    let b = s.device().alloc(bytes.len()).expect("device alloc");
    s.upload(&b.span(), bytes, WAIT).expect("upload");
    b
}

fn read(s: &Stream, b: &DeviceBuffer) -> Vec<u8> {
    let mut v = vec![0u8; b.len()];
    s.download(&mut v, &b.span(), WAIT).expect("download");
    v
}

/// Opens a gate (sets a flag to 1) when dropped, a panic included, so that no stream stays
/// blocked on it.
struct Open<'a>(&'a Flag);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.set(1);
    }
}

/// Elements of the calls of the tests of stream order.
const COUNT: usize = 100_000;

/// One rank of a test: its number, communicator, stream, and the ranks' barrier.
#[derive(Clone, Copy)]
struct Rank<'a> {
    me: usize,
    c: usize,
    s: &'a Stream,
    step: &'a Step,
}

/// Runs `f` on each of 2 ranks (threads; communicators with the deadline `timeout_ms` over a
/// fabric with FI_HMEM, on a device of their own) after a warm-up call; each rank's count of
/// direct calls then, once the communicators are destroyed.
fn on_two_ranks(timeout_ms: &str, f: impl Fn(Rank) + Sync) -> Vec<u64> {
    let d = own_device();
    let cs = comms_with(&d, 2, Hmem::Registers, timeout_ms, "streams");
    on_streams(&d, &cs, |me, c, s, step| {
        warm_up(me, c, s, step, 2, 1);
        f(Rank { me, c, s, step });
    });
    let calls = direct(&cs);
    destroy(&cs);
    calls
}

/// Rank `r` (of 2) makes a stream-ordered AllReduce (f32 sum) of `COUNT` elements from `input`
/// into `out` on its stream, runs `then` once the call has returned, synchronises the stream,
/// and checks that `check` holds the sum (else fails saying `what`).
fn sum_on_stream(
    r: Rank,
    (input, out): (&DeviceBuffer, &DeviceBuffer),
    then: impl FnOnce(),
    check: &DeviceBuffer,
    what: &str,
) {
    let Rank { me, c, s, step } = r;
    let (ty, op) = (Ty::F32.c(), Op::Sum.c());
    let (i, o) = (input.addr() as *mut c_void, out.addr() as *mut c_void);
    let st = fabricoll_allreduce_stream(i, o, COUNT, ty, op, comm(c), s.handle());
    assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
    then();
    let synced = s.synchronize(WAIT);
    step.wait();
    synced.expect("synchronize");
    no_async_error(comm(c));
    let want = expected(Coll::AllReduce, Op::Sum, 2, me, COUNT).1;
    let want = Ty::F32.encode(&want.expect("an output"));
    assert!(read(s, check) == want, "rank {me}: {what}");
}

/// A stream-ordered direct call reads its input only once the work enqueued on its stream
/// before it has run: rank 0's stream first waits for a gate that the test opens 300 ms after
/// the call returned, then copies the real input over garbage, then comes the call. The result
/// must hold rank 0's real input (read before the gate, the input was the garbage).
#[test]
fn a_stream_ordered_direct_call_reads_its_input_after_the_work_before_it() {
    let _serial = serial();
    let calls = on_two_ranks("20000", |r| {
        let Rank { me, s, step, .. } = r;
        let real = Ty::F32.encode(&expected(Coll::AllReduce, Op::Sum, 2, me, COUNT).0);
        // Rank 0's input is garbage until its stream copies the real one over it.
        let garbage = vec![0xA5; COUNT * 4];
        let buf = on_device(s, if me == 0 { &garbage } else { &real });
        let real = on_device(s, &real);
        let out = on_device(s, &vec![0; COUNT * 4]);
        let gate = s.device().create_flag("the test's gate").expect("flag");
        let open = Open(&gate);
        step.wait();
        if me == 0 {
            s.wait_flag(&gate, 1).expect("wait");
            s.copy(&buf.span(), &real.span()).expect("copy");
        }
        let then = || {
            if me == 0 {
                std::thread::sleep(Duration::from_millis(300));
            }
            drop(open);
        };
        let what = "the input was read too early";
        sum_on_stream(r, (&buf, &out), then, &out, what);
    });
    assert_eq!(calls, [2, 2], "the calls went direct");
}

/// Work enqueued on the stream after a stream-ordered direct call sees its output: rank 1 makes
/// its call 300 ms after rank 0, whose stream copies the output aside right after its call;
/// the copy must hold the result (not the output's earlier bytes).
#[test]
fn work_after_a_stream_ordered_direct_call_sees_its_output() {
    let _serial = serial();
    let calls = on_two_ranks("20000", |r| {
        let Rank { me, s, step, .. } = r;
        let input = expected(Coll::AllReduce, Op::Sum, 2, me, COUNT).0;
        let buf = on_device(s, &Ty::F32.encode(&input));
        let out = on_device(s, &vec![0xA5; COUNT * 4]);
        let after = on_device(s, &vec![0; COUNT * 4]);
        step.wait();
        if me == 1 {
            std::thread::sleep(Duration::from_millis(300));
        }
        let then = || s.copy(&after.span(), &out.span()).expect("copy");
        let what = "later work ran before the output";
        sum_on_stream(r, (&buf, &out), then, &after, what);
    });
    assert_eq!(calls, [2, 2], "the calls went direct");
}

/// A stream-ordered direct receive whose sender never sends fails at the deadline (what this
/// test is about, so the deadline is short): the stream is released (its later work runs),
/// the communicator's async error is FABRICOLL_TIMEOUT, and a later stream-ordered call fails
/// with it at once, as a failed staged call does.
#[test]
fn a_failed_stream_ordered_direct_call_releases_its_stream_and_reports_the_error() {
    let _serial = serial();
    let calls = on_two_ranks("1000", |r| {
        let Rank { me, c, s, .. } = r;
        if me == 1 {
            return;
        }
        let buf = on_device(s, &[0u8; 4096]);
        let after = on_device(s, &[0xA5; 4096]);
        let cm = comm(c);
        let p = buf.addr() as *mut c_void;
        let st = fabricoll_recv_stream(p, 1024, Ty::F32.c(), 1, cm, s.handle());
        assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
        s.copy(&after.span(), &buf.span()).expect("copy");
        s.synchronize(WAIT).expect("the stream was released");
        assert!(read(s, &after) == vec![0u8; 4096], "the later copy ran");
        let mut e = FABRICOLL_SUCCESS;
        assert_eq!(
            fabricoll_comm_get_async_error(cm, &mut e),
            FABRICOLL_SUCCESS
        );
        assert_eq!(e, FABRICOLL_TIMEOUT, "{}", last_error());
        let st = fabricoll_recv_stream(p, 1024, Ty::F32.c(), 1, cm, s.handle());
        assert_eq!(st, FABRICOLL_TIMEOUT, "a later call: {}", last_error());
        assert!(last_error().contains("earlier"), "{}", last_error());
    });
    assert_eq!(calls, [2, 1], "the receive went direct");
}

/// A stream-ordered AllReduce with Avg in place, on 3 ranks, goes direct (its input copied
/// aside on the device, its division on the device) and gives the host call's bits, for a
/// float and an integer type.
#[test]
fn a_stream_ordered_avg_in_place_goes_direct_with_the_host_calls_bits() {
    let _serial = serial();
    let d = own_device();
    let n = 3;
    let cs = comms(&d, n, Hmem::Registers);
    let avg = fabricoll_redop::FABRICOLL_AVG as std::os::raw::c_int;
    on_streams(&d, &cs, |me, c, s, step| {
        warm_up(me, c, s, step, n, 1);
        for ty in [Ty::F32, Ty::I32] {
            let count = 300_001;
            let input = ty.encode(&(0..count).map(|i| value(me, i) * 3 + 1).collect::<Vec<_>>());
            let mut host = input.clone();
            let buf = on_device(s, &input);
            step.wait();
            let p = host.as_mut_ptr().cast();
            let st = fabricoll_allreduce(p, p, count, ty.c(), avg, comm(c));
            assert_eq!(st, FABRICOLL_SUCCESS, "host avg: {}", last_error());
            let before = [device_direct_calls(comm(c)).expect("live communicator")];
            let p = buf.addr() as *mut c_void;
            let st = fabricoll_allreduce_stream(p, p, count, ty.c(), avg, comm(c), s.handle());
            assert_eq!(st, FABRICOLL_SUCCESS, "device avg: {}", last_error());
            let synced = s.synchronize(WAIT);
            step.wait();
            synced.expect("synchronize");
            no_async_error(comm(c));
            counted(&[c], &before, 1, &format!("AllReduce Avg {ty:?} in place"));
            assert!(read(s, &buf) == host, "{ty:?} rank {me}: other bits");
        }
    });
    destroy(&cs);
}

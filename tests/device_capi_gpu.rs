//! The C API on device buffers on the real GPU (CUDA device 0, through the driver): the same
//! matrices as `device_capi` with ranks as threads sharing the GPU (blocking, stream-ordered,
//! non-blocking and grouped, every call, 2 to 5 ranks), stream-ordered sends and receives on
//! two streams, host calls after non-blocking device calls, compressed calls on device
//! buffers (the communicator's format and a call's own), the direct path (device buffers
//! registered with shm, no host copy), and a timing table of the
//! 2-rank stream-ordered device allreduce against the caller copying to the host and calling
//! the host API. Run by scripts/gpu-tests.sh (`--ignored`).
use capi::{comm, last_error, ranks};
use device::*;
use nccl_net_fabricoll::coll::device::installed;
use nccl_net_fabricoll::device::{Device, DeviceKind};
use nccl_net_fabricoll::ffi::api::*;
use std::os::raw::c_void;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use fabricoll_status::*;

mod capi;
mod device;

/// The tests share the GPU, where page-locked allocations and frees wait for every stream:
/// they run one at a time (see device_capi.rs).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// CUDA device 0, bound to this thread; panics without one (these tests run only on the GPU
/// machine). The library finds it through the threads' current context.
fn gpu() -> Device {
    nccl_net_fabricoll::testing::backtrace_on_fatal_signal();
    let d = Device::cuda(0).expect("no CUDA device: this test runs on the GPU machine only");
    let found = installed().expect("the library does not see the thread's CUDA context");
    assert_eq!(found.kind(), DeviceKind::Cuda, "{found:?}");
    d
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_every_call_on_device_host_and_mixed_buffers() {
    let _serial = serial();
    let d = gpu();
    matrix(
        &d,
        "gpu_every_call_on_device_host_and_mixed_buffers",
        2,
        false,
    );
    matrix(
        &d,
        "gpu_every_call_on_device_host_and_mixed_buffers",
        4,
        false,
    );
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_every_stream_ordered_call() {
    let _serial = serial();
    let d = gpu();
    matrix(&d, "gpu_every_stream_ordered_call", 2, true);
    matrix(&d, "gpu_every_stream_ordered_call", 3, true);
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_every_call_nonblocking_and_grouped() {
    let _serial = serial();
    let d = gpu();
    let modes = [Mode::NonBlocking, Mode::Grouped];
    for n in [2, 3] {
        let test = "gpu_every_call_nonblocking_and_grouped";
        matrix_modes(&d, test, n, &ALL_COLLS, &modes, true);
    }
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_tagged_rooted_and_uneven_calls_blocking_and_stream_ordered() {
    let _serial = serial();
    let d = gpu();
    let modes = [Mode::Blocking, Mode::Stream];
    for n in [2, 3] {
        let test = "gpu_tagged_rooted_and_uneven_calls_blocking_and_stream_ordered";
        matrix_modes(&d, test, n, &ALL_COLLS[7..], &modes, true);
    }
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_every_call_every_mode_four_and_five_ranks() {
    let _serial = serial();
    four_and_five(&gpu(), "gpu_every_call_every_mode_four_and_five_ranks");
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_compressed_calls_on_device_buffers_give_the_host_calls_bits() {
    let _serial = serial();
    let test = "gpu_compressed_calls_on_device_buffers_give_the_host_calls_bits";
    device::compressed::like_the_host_calls(&gpu(), test);
    let test = "gpu_a_calls_own_compression_applies_to_every_slice_of_a_device_call";
    device::compressed::own_compression_on_every_slice(&gpu(), test);
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_stream_ordered_send_and_recv_on_two_streams_progress_together() {
    let _serial = serial();
    let test = "gpu_stream_ordered_send_and_recv_on_two_streams_progress_together";
    two_streams(&gpu(), test);
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_host_calls_after_nonblocking_device_calls_keep_the_call_order() {
    let _serial = serial();
    let test = "gpu_host_calls_after_nonblocking_device_calls_keep_the_call_order";
    host_after_nonblocking(&gpu(), test);
}

/// The direct path on the GPU over shm (libfabric 2.1 with CUDA, whose shm takes
/// FI_HMEM_CUDA registrations, as `plugin_gpu` checks): every call on device buffers,
/// blocking, non-blocking and (with FABRICOLL_DEVICE_DIRECT=streams) stream-ordered, out of
/// place on 2 and 3 ranks and in place on 2, moves them without a host copy (each counted as direct; reductions by the kernels) and
/// gives the expected bytes. With FABRICOLL_LOG=info the log says which path the calls take
/// and why (stream-ordered calls: once per communicator).
#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_device_calls_go_direct_where_shm_registers_device_memory() {
    use device::direct::{case, in_place, DIRECT};
    use device::stream_ordered::{on_streams, Case};
    let _serial = serial();
    let d = gpu();
    let test = "gpu_device_calls_go_direct_where_shm_registers_device_memory";
    let types = [(Ty::F32, Op::Sum), (Ty::I32, Op::Max)];
    for n in [2, 3] {
        let Some(cs) = ranks(test, &config(), n) else {
            return;
        };
        // Stream-ordered calls go direct only with FABRICOLL_DEVICE_DIRECT=streams
        // (scripts/gpu-tests.sh runs this test a second time with it); by default they are
        // staged, as `device_capi`'s matrices check.
        let streams = std::env::var("FABRICOLL_DEVICE_DIRECT").is_ok_and(|v| v == "streams");
        // Stream-ordered first, each rank on one stream made before the communicator's own:
        // while a call runs, its caller's stream waits for the call's flag, and holds back
        // every stream behind it on its hardware queue, so the test's streams and the
        // communicators' must be fewer than the queues (32, as scripts/gpu-tests.sh sets
        // CUDA_DEVICE_MAX_CONNECTIONS) from the communicators' first device call on.
        on_streams(&d, &cs, |me, c, s, step| {
            for (coll, calls) in DIRECT {
                let calls = if streams { calls } else { 0 };
                for (k, count) in [1000, 300_001].into_iter().enumerate() {
                    let (ty, op) = types[k];
                    let places = device::direct::DD;
                    let case = Case {
                        coll,
                        ty,
                        op,
                        count,
                        places,
                    };
                    case.run(me, c, s, step, n, calls);
                }
            }
        });
        for (coll, calls) in DIRECT {
            for mode in [Mode::Blocking, Mode::NonBlocking] {
                for (k, count) in [1000, 300_001].into_iter().enumerate() {
                    case(&d, &cs, coll, types[k], count, mode, calls);
                }
            }
        }
        if n == 2 {
            for coll in [Coll::AllGather, Coll::AllReduce, Coll::ReduceScatter] {
                in_place(&d, &cs, coll, 300_001, 1);
            }
        }
        destroy(&cs);
    }
}

/// Median seconds of `iters` runs of `f` on both ranks at once (each run starts together).
fn median(iters: usize, bar: &Barrier, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..iters)
        .map(|_| {
            bar.wait();
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    t[t.len() / 2]
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_stream_ordered_allreduce_against_copying_to_the_host() {
    let _serial = serial();
    let test = "gpu_stream_ordered_allreduce_against_copying_to_the_host";
    let d = gpu();
    let mut cfg = config();
    cfg.timeout_ms = 60_000;
    let Some(cs) = ranks(test, &cfg, 2) else {
        return;
    };
    let sizes: Vec<usize> = (0..8)
        .map(|i| 8usize << (3 * i))
        .chain([64 << 20])
        .collect();
    let bar = Barrier::new(2);
    let rows: Vec<(usize, f64, f64)> = std::thread::scope(|sc| {
        let hs: Vec<_> = cs
            .iter()
            .map(|&c| {
                let (d, bar, sizes) = (d.clone(), &bar, &sizes);
                sc.spawn(move || {
                    d.bind().unwrap();
                    let s = d.create_stream().unwrap();
                    let mut rows = Vec::new();
                    for &bytes in sizes {
                        let count = bytes / 4;
                        let buf = d.alloc(bytes).unwrap();
                        s.upload(&buf.span(), &vec![0u8; bytes], WAIT).unwrap();
                        let p = buf.addr() as *mut c_void;
                        let iters = if bytes >= 16 << 20 { 5 } else { 20 };
                        let (f32t, sum) = (Ty::F32.c(), Op::Sum.c());
                        let run = || {
                            let st = fabricoll_allreduce_stream(
                                p,
                                p,
                                count,
                                f32t,
                                sum,
                                comm(c),
                                s.handle(),
                            );
                            assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
                            s.synchronize(Duration::from_secs(60)).unwrap();
                        };
                        // Both ranks have allocated (the upload stages through page-locked
                        // memory, which waits for every stream of the device) before either
                        // stream waits for a call.
                        bar.wait();
                        run();
                        let t_stream = median(iters, bar, run);
                        let mut host = vec![0u8; bytes];
                        let mut copy = || {
                            s.download(&mut host, &buf.span(), WAIT).unwrap();
                            let h = host.as_mut_ptr().cast::<c_void>();
                            let st = fabricoll_allreduce(h, h, count, f32t, sum, comm(c));
                            assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
                            s.upload(&buf.span(), &host, WAIT).unwrap();
                        };
                        copy();
                        let t_copy = median(iters, bar, copy);
                        rows.push((bytes, t_stream, t_copy));
                    }
                    rows
                })
            })
            .collect();
        let mut all: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        all.swap_remove(0)
    });
    // Bus bandwidth as nccl-tests computes it for allreduce: size / time * 2(n-1)/n.
    let bus = |bytes: usize, t: f64| bytes as f64 / t * 2.0 * (2 - 1) as f64 / 2.0 / 1e9;
    println!(
        "2-rank f32 sum allreduce on one GPU ({:?}), in place, median",
        d
    );
    println!(
        "{:>10} {:>12} {:>10} {:>12} {:>10} {:>8}",
        "bytes", "stream us", "busbw GB/s", "copy+host us", "busbw GB/s", "speedup"
    );
    for (bytes, ts, tc) in rows {
        println!(
            "{bytes:>10} {:>12.1} {:>10.2} {:>12.1} {:>10.2} {:>8.2}",
            ts * 1e6,
            bus(bytes, ts),
            tc * 1e6,
            bus(bytes, tc),
            tc / ts
        );
    }
    destroy(&cs);
}

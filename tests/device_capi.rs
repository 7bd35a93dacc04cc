//! The C API on device buffers, on the emulated device (installed for this process with
//! `coll::device::install`), ranks as threads over shm: every call (collectives, send/recv,
//! tagged, gather, scatter, allgatherv, reducescatterv) with device, host and mixed buffers,
//! blocking, stream-ordered, non-blocking and grouped, 2 to 5 ranks; stream-ordered sends and
//! receives on two streams, host calls after non-blocking device calls, a stream-ordered call
//! after a non-blocking one with a rank late to its staging, and more non-blocking calls than
//! staging slots after a stream-ordered one; 1,000 stream-ordered calls between kernels with
//! no host synchronisation; abort and a destroyed peer during a stream-ordered call (a killed
//! peer process: `device_capi_killed`); compressed calls on device buffers; and the misuse
//! errors. Shm on Debian's libfabric registers no device memory, so every call here is staged;
//! the direct path is `device_direct`'s.
use capi::{comm, last_error, ranks};
use device::*;
use nccl_net_fabricoll::ffi::api::*;
use std::os::raw::c_void;
use std::ptr::null;
use std::time::{Duration, Instant};

use fabricoll_status::*;

mod capi;
mod device;

#[test]
fn every_call_on_device_host_and_mixed_buffers_two_ranks() {
    let _serial = serial();
    matrix(
        &dev(),
        "every_call_on_device_host_and_mixed_buffers_two_ranks",
        2,
        false,
    );
}

#[test]
fn every_call_on_device_host_and_mixed_buffers_three_ranks() {
    let _serial = serial();
    matrix(
        &dev(),
        "every_call_on_device_host_and_mixed_buffers_three_ranks",
        3,
        false,
    );
}

#[test]
fn every_stream_ordered_call_two_ranks() {
    let _serial = serial();
    matrix(&dev(), "every_stream_ordered_call_two_ranks", 2, true);
}

#[test]
fn every_stream_ordered_call_three_ranks() {
    let _serial = serial();
    matrix(&dev(), "every_stream_ordered_call_three_ranks", 3, true);
}

/// Per iteration, on each rank's stream: a kernel adds one to the input, the stream-ordered
/// allreduce sums it, a kernel adds the output to an accumulator. The host synchronises once,
/// at the end: acc = sum over iterations of n * (start + i + 1).
#[test]
fn a_thousand_stream_ordered_allreduces_between_kernels() {
    let _serial = serial();
    let test = "a_thousand_stream_ordered_allreduces_between_kernels";
    let d = dev();
    let Some(cs) = ranks(test, &config(), 2) else {
        return;
    };
    const ITERS: usize = 1000;
    const COUNT: usize = 64;
    let ready = std::sync::Barrier::new(cs.len());
    std::thread::scope(|sc| {
        for (me, &c) in cs.iter().enumerate() {
            let d = d.clone();
            let ready = &ready;
            sc.spawn(move || {
                use nccl_net_fabricoll::reduce::{DataType, RedOp};
                d.bind().unwrap();
                let s = d.create_stream().unwrap();
                let f = |v: f32| Ty::F32.encode(&[v as i64; COUNT]);
                let mk = |v: f32| {
                    let b = d.alloc(COUNT * 4).unwrap();
                    s.upload(&b.span(), &f(v), WAIT).unwrap();
                    b
                };
                let (input, output, ones, acc) = (mk(me as f32), mk(0.0), mk(1.0), mk(0.0));
                // Every rank has allocated (uploads stage through page-locked memory) before
                // a stream waits for a call's flag.
                ready.wait();
                for _ in 0..ITERS {
                    s.reduce(DataType::Float32, RedOp::Sum, &input.span(), &ones.span())
                        .unwrap();
                    let st = fabricoll_allreduce_stream(
                        input.addr() as *const c_void,
                        output.addr() as *mut c_void,
                        COUNT,
                        Ty::F32.c(),
                        Op::Sum.c(),
                        comm(c),
                        s.handle(),
                    );
                    assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
                    s.reduce(DataType::Float32, RedOp::Sum, &acc.span(), &output.span())
                        .unwrap();
                }
                s.synchronize(Duration::from_secs(120)).unwrap();
                ready.wait();
                let mut got = vec![0u8; COUNT * 4];
                s.download(&mut got, &acc.span(), WAIT).unwrap();
                // Rank r's input at iteration i is r + i + 1; the sum over both ranks is
                // 2i + 3, and over the iterations ITERS * (ITERS + 2).
                let want = (ITERS * (ITERS + 2)) as f32;
                assert_eq!(got, f(want), "rank {me}");
            });
        }
    });
    destroy(&cs);
}

/// A stream-ordered call that cannot complete (the peer does not call) is ended by `end`,
/// which returns the communicators it left alive; the stream is released and, where rank 0's
/// communicator is alive, the error reported.
fn released(test: &str, end: impl FnOnce(&[usize]) -> Vec<usize>) {
    let d = dev();
    let mut cfg = config();
    cfg.timeout_ms = 1_500;
    let Some(cs) = ranks(test, &cfg, 2) else {
        return;
    };
    // A communicator's first device call allocates its staging, and its first stream-ordered
    // call waits for every rank to have done so (docs/device-calls.md): made here, by both
    // ranks, before rank 0's call that its peer never joins.
    run_case(
        std::slice::from_ref(&d),
        &cs,
        Coll::AllReduce,
        Ty::F32,
        Op::Sum,
        1,
        (Place::Device, Place::Device),
        Mode::Stream,
    );
    d.bind().unwrap();
    let s = d.create_stream().unwrap();
    let buf = d.alloc(4096).unwrap();
    let p = buf.addr() as *mut c_void;
    let (f32t, sum) = (Ty::F32.c(), Op::Sum.c());
    let t = Instant::now();
    let st = fabricoll_allreduce_stream(p, p, 1024, f32t, sum, comm(cs[0]), s.handle());
    assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
    // It returned at once, though the peer does not call.
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    std::thread::sleep(Duration::from_millis(50));
    let t = Instant::now();
    let alive = end(&cs);
    s.synchronize(WAIT).expect("the stream was not released");
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    if alive.contains(&cs[0]) {
        let c = comm(cs[0]);
        let mut e = FABRICOLL_SUCCESS;
        assert_eq!(fabricoll_comm_get_async_error(c, &mut e), FABRICOLL_SUCCESS);
        assert_ne!(e, FABRICOLL_SUCCESS);
        assert!(last_error().contains("async_error"), "{}", last_error());
        // Later stream-ordered calls fail with it at once.
        let st = fabricoll_allreduce_stream(p, p, 1024, f32t, sum, c, s.handle());
        assert_ne!(st, FABRICOLL_SUCCESS);
        assert!(
            last_error().contains("earlier stream-ordered call"),
            "{}",
            last_error()
        );
    }
    destroy(&alive);
}

#[test]
fn abort_releases_the_stream_and_reports_the_error() {
    let _serial = serial();
    released("abort_releases_the_stream_and_reports_the_error", |cs| {
        assert_eq!(fabricoll_comm_abort(comm(cs[0])), FABRICOLL_SUCCESS);
        cs.to_vec()
    });
}

#[test]
fn a_destroyed_peer_releases_the_stream_and_reports_the_error() {
    let _serial = serial();
    released(
        "a_destroyed_peer_releases_the_stream_and_reports_the_error",
        |cs| {
            // The peer goes away (as a killed process's endpoint does): rank 0's call fails,
            // at the latest at its deadline.
            assert_eq!(fabricoll_comm_destroy(comm(cs[1])), FABRICOLL_SUCCESS);
            vec![cs[0]]
        },
    );
}

#[test]
fn destroying_the_communicator_releases_its_stream() {
    let _serial = serial();
    released("destroying_the_communicator_releases_its_stream", |cs| {
        destroy(cs);
        Vec::new()
    });
}

#[test]
fn misuse_gets_a_clear_error() {
    let _serial = serial();
    let test = "misuse_gets_a_clear_error";
    let d = dev();
    let Some(cs) = ranks(test, &config(), 2) else {
        return;
    };
    d.bind().unwrap();
    let c = comm(cs[0]);
    let s = d.create_stream().unwrap();
    let buf = d.alloc(64).unwrap();
    let dp = buf.addr() as *mut c_void;
    let (f32t, sum) = (Ty::F32.c(), Op::Sum.c());
    // A pageable host pointer where the stream needs device memory.
    let mut host = vec![0f32; 16];
    let hp = host.as_mut_ptr().cast::<c_void>();
    let st = fabricoll_allreduce_stream(hp, dp, 16, f32t, sum, c, s.handle());
    assert_eq!(st, FABRICOLL_INVALID_ARGUMENT);
    assert!(
        last_error().contains("sendbuf") && last_error().contains("pageable"),
        "{}",
        last_error()
    );
    // The same refusal from every other form that takes a stream, naming its argument: each
    // is refused before it joins a call, so the peer need not take part.
    let sh = s.handle();
    let counts = [4usize; 2];
    let cp = counts.as_ptr();
    type Call<'a> = Box<dyn Fn() -> fabricoll_status + 'a>;
    let refused: [(&str, &str, Call); 6] = [
        (
            "gather",
            "recvbuf",
            Box::new(|| fabricoll_gather_stream(dp, hp, 4, f32t, 0, c, sh)),
        ),
        (
            "scatter",
            "sendbuf",
            Box::new(|| fabricoll_scatter_stream(hp, dp, 4, f32t, 0, c, sh)),
        ),
        (
            "allgatherv",
            "recvbuf",
            Box::new(|| fabricoll_allgatherv_stream(dp, 4, hp, cp, null(), f32t, c, sh)),
        ),
        (
            "reducescatterv",
            "sendbuf",
            Box::new(|| fabricoll_reducescatterv_stream(hp, dp, cp, f32t, sum, c, sh)),
        ),
        (
            "send_tagged",
            "buf",
            Box::new(|| fabricoll_send_tagged_stream(hp, 4, f32t, 1, 7, c, sh)),
        ),
        (
            "recv_tagged",
            "buf",
            Box::new(|| fabricoll_recv_tagged_stream(hp, 4, f32t, 1, 7, c, sh)),
        ),
    ];
    for (call, arg, f) in refused {
        assert_eq!(f(), FABRICOLL_INVALID_ARGUMENT, "{call}");
        let e = last_error();
        let named = format!("argument '{arg}'");
        assert!(e.contains(&named) && e.contains("pageable"), "{call}: {e}");
    }
    // The legacy and per-thread default streams.
    for h in [0usize, 1, 2] {
        let st = fabricoll_allreduce_stream(dp, dp, 16, f32t, sum, c, h as *mut c_void);
        assert_eq!(st, FABRICOLL_INVALID_ARGUMENT, "{h}");
        assert!(last_error().contains("stream"), "{}", last_error());
    }
    // Device memory to alltoallv, which takes host memory only.
    let st = fabricoll_alltoallv(hp, cp, null(), dp, cp, null(), f32t, c);
    assert_eq!(st, FABRICOLL_INVALID_ARGUMENT);
    assert!(
        last_error().contains("recvbuf") && last_error().contains("alltoallv"),
        "{}",
        last_error()
    );
    // A stream-ordered call inside a group.
    assert_eq!(fabricoll_group_start(), FABRICOLL_SUCCESS);
    let st = fabricoll_allreduce_stream(dp, dp, 16, f32t, sum, c, s.handle());
    assert_eq!(fabricoll_group_end(), FABRICOLL_SUCCESS);
    assert_eq!(st, FABRICOLL_INVALID_USAGE);
    assert!(last_error().contains("group"), "{}", last_error());
    // A gather whose root (this rank) passes no receive buffer.
    let st = fabricoll_gather(dp, std::ptr::null_mut(), 4, f32t, 0, c);
    assert_eq!(st, FABRICOLL_INVALID_ARGUMENT);
    assert!(last_error().contains("recvbuf"), "{}", last_error());
    // A freed device buffer, blocking and stream-ordered.
    let freed = d.alloc(64).unwrap();
    let fp = freed.addr() as *mut c_void;
    drop(freed);
    let st = fabricoll_allreduce(fp, dp, 16, f32t, sum, c);
    assert_eq!(st, FABRICOLL_INVALID_ARGUMENT);
    assert!(
        last_error().contains("sendbuf") && last_error().contains("freed"),
        "{}",
        last_error()
    );
    let st = fabricoll_allreduce_stream(dp, fp, 16, f32t, sum, c, s.handle());
    assert_eq!(st, FABRICOLL_INVALID_ARGUMENT);
    assert!(
        last_error().contains("recvbuf") && last_error().contains("freed"),
        "{}",
        last_error()
    );
    // Nothing failed asynchronously.
    let mut e = FABRICOLL_SUCCESS;
    assert_eq!(fabricoll_comm_get_async_error(c, &mut e), FABRICOLL_SUCCESS);
    assert_eq!(e, FABRICOLL_SUCCESS);
    destroy(&cs);
}

/// A stream-ordered call whose slices need more staging than an earlier call's: the old data
/// path grew its page-locked slots in the worker while the caller's stream waited for the
/// call's flag, which on the CUDA driver waits for that stream: a deadlock (the emulated device
/// fails the allocation, naming it). The staging is allocated up front now, so both calls
/// succeed.
#[test]
fn stream_ordered_calls_allocate_no_page_locked_memory_while_a_stream_waits() {
    let _serial = serial();
    let test = "stream_ordered_calls_allocate_no_page_locked_memory_while_a_stream_waits";
    let d = dev();
    let Some(cs) = ranks(test, &config(), 2) else {
        return;
    };
    for count in [16, 300_000] {
        run_case(
            std::slice::from_ref(&d),
            &cs,
            Coll::AllGather,
            Ty::F32,
            Op::Sum,
            count,
            (Place::Device, Place::Device),
            Mode::Stream,
        );
    }
    destroy(&cs);
}

/// Every call, non-blocking and grouped, on `n` ranks.
fn nonblocking_and_grouped(test: &str, n: usize) {
    let _serial = serial();
    let modes = [Mode::NonBlocking, Mode::Grouped];
    matrix_modes(&dev(), test, n, &ALL_COLLS, &modes, true);
}

#[test]
fn every_call_nonblocking_and_grouped_two_ranks() {
    nonblocking_and_grouped("every_call_nonblocking_and_grouped_two_ranks", 2);
}

#[test]
fn every_call_nonblocking_and_grouped_three_ranks() {
    nonblocking_and_grouped("every_call_nonblocking_and_grouped_three_ranks", 3);
}

/// The calls that only the matrices above lack: tagged, gather, scatter and the uneven
/// counts, blocking and stream-ordered.
#[test]
fn tagged_rooted_and_uneven_calls_blocking_and_stream_ordered() {
    let _serial = serial();
    let test = "tagged_rooted_and_uneven_calls_blocking_and_stream_ordered";
    let modes = [Mode::Blocking, Mode::Stream];
    for n in [2, 3] {
        matrix_modes(&dev(), test, n, &ALL_COLLS[7..], &modes, true);
    }
}

/// Four and five ranks (see `device::four_and_five`).
#[test]
fn every_call_every_mode_four_and_five_ranks() {
    let _serial = serial();
    four_and_five(&dev(), "every_call_every_mode_four_and_five_ranks");
}

/// Each rank sends on one stream and receives on another, both stream-ordered, every rank
/// sending first: the two calls progress together (see `device::two_streams`).
#[test]
fn stream_ordered_send_and_recv_on_two_streams_progress_together() {
    let _serial = serial();
    let test = "stream_ordered_send_and_recv_on_two_streams_progress_together";
    two_streams(&dev(), test);
}

/// Host calls made while non-blocking device calls are in flight start after them on every
/// rank (see `device::host_after_nonblocking`).
#[test]
fn host_calls_after_nonblocking_device_calls_keep_the_call_order() {
    let _serial = serial();
    let test = "host_calls_after_nonblocking_device_calls_keep_the_call_order";
    host_after_nonblocking(&dev(), test);
}

/// A non-blocking device call, then a stream-ordered one, with one rank late: no rank's stream
/// waits for the call before every rank has its staging (see
/// `device::nonblocking_then_stream_ordered`).
#[test]
fn a_stream_ordered_call_after_a_nonblocking_one_waits_for_a_late_rank() {
    let _serial = serial();
    let test = "a_stream_ordered_call_after_a_nonblocking_one_waits_for_a_late_rank";
    nonblocking_then_stream_ordered(&dev(), test);
}

/// A stream-ordered allreduce, then as many non-blocking allreduces as the communicator has
/// staging slots (4), or more, all on device buffers; then every request is waited for and the
/// stream synchronised. The calls progress in call order, so the later calls cannot end before
/// the first: none of them may take the slot it needs, and those that find none free allocate
/// one while the first can still run. (No stream-ordered call follows them: ranks that are
/// threads on one device cannot allocate while a peer's stream waits for a later call, which
/// docs/device-calls.md leaves to the caller.)
#[test]
fn nonblocking_calls_after_a_stream_ordered_one_leave_it_a_slot() {
    let _serial = serial();
    let test = "nonblocking_calls_after_a_stream_ordered_one_leave_it_a_slot";
    for nonblocking in [4, 6] {
        stream_ordered_around_nonblocking(test, nonblocking);
    }
}

/// The calls of the test above on 2 ranks, `nonblocking` non-blocking ones.
fn stream_ordered_around_nonblocking(test: &str, nonblocking: usize) {
    const COUNT: usize = 1000;
    let n = 2;
    let d = dev();
    on_ranks(&d, test, n, |me, c, ready| {
        let s = d.create_stream().unwrap();
        let (input, want) = expected(Coll::AllReduce, Op::Sum, n, me, COUNT);
        let bytes = Ty::F32.encode(&input);
        let mut bufs: Vec<Buf> = (0..nonblocking + 1)
            .map(|_| Buf::new(&d, &s, Place::Device, &bytes))
            .collect();
        let (f32t, sum, cm) = (Ty::F32.c(), Op::Sum.c(), comm(c));
        // Every rank has allocated before a stream waits for a call's flag.
        ready.wait();
        let mut reqs = Vec::new();
        for (i, b) in bufs.iter_mut().enumerate() {
            let p = b.ptr();
            let st = if i == 0 {
                fabricoll_allreduce_stream(p, p, COUNT, f32t, sum, cm, s.handle())
            } else {
                let mut req = std::ptr::null_mut();
                let st = fabricoll_iallreduce(p, p, COUNT, f32t, sum, cm, &mut req);
                reqs.push(req);
                st
            };
            let at = format!("{nonblocking} non-blocking: rank {me} call {i}");
            assert_eq!(st, FABRICOLL_SUCCESS, "{at}: {}", last_error());
        }
        for (i, r) in reqs.into_iter().enumerate() {
            let st = fabricoll_wait(r);
            let at = format!("{nonblocking} non-blocking: rank {me} request {i}");
            assert_eq!(st, FABRICOLL_SUCCESS, "{at}: {}", last_error());
        }
        s.synchronize(WAIT).unwrap();
        no_async_error(cm);
        ready.wait();
        let want = Ty::F32.encode(&want.unwrap());
        for (i, b) in bufs.iter_mut().enumerate() {
            let ok = b.read(&s, COUNT * 4) == want;
            assert!(ok, "{nonblocking} non-blocking: rank {me} call {i}");
        }
    });
}

/// A communicator that compresses compresses its device calls too, slice by slice, giving the
/// host calls' bits (`device::compressed::like_the_host_calls`).
#[test]
fn compressed_calls_on_device_buffers_give_the_host_calls_bits() {
    let _serial = serial();
    let test = "compressed_calls_on_device_buffers_give_the_host_calls_bits";
    device::compressed::like_the_host_calls(&dev(), test);
}

/// A call's own compression reaches every slice of a device call, whichever thread starts it
/// (`device::compressed::own_compression_on_every_slice`).
#[test]
fn a_calls_own_compression_applies_to_every_slice_of_a_device_call() {
    let _serial = serial();
    let test = "a_calls_own_compression_applies_to_every_slice_of_a_device_call";
    device::compressed::own_compression_on_every_slice(&dev(), test);
}

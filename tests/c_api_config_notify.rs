//! The C API's per-communicator options (`fabricoll_config`) and completion callbacks
//! (`fabricoll_request_notify`), two ranks as threads of this process over shm: fields that
//! are bad name themselves, a caller's smaller struct is read only as far as its size, the
//! config's timeout rules its communicator and bootstrap (the environment's stays long), and
//! a notified request calls back once with its status (success, abort, destroy).
use capi::{comm, last_error, pair, shm_config, shm_config_deadline, DEADLINE_MS, LATE};
use nccl_net_fabricoll::ffi::api::*;
use nccl_net_fabricoll::testing::skip;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use fabricoll_status::*;

mod capi;

#[test]
fn bad_fields_name_themselves() {
    let mut id = fabricoll_unique_id { internal: [0; 128] };
    type Set = Box<dyn Fn(&mut fabricoll_config)>;
    let cases: Vec<(Set, &str)> = vec![
        (Box::new(|c| c.size = 0), "config.size"),
        (Box::new(|c| c.size += 8), "config.size"),
        (Box::new(|c| c.timeout_ms = -5), "config.timeout_ms"),
        (Box::new(|c| c.algo = 99), "config.algo"),
        (
            Box::new(|c| c.provider = c"shm net".as_ptr()),
            "config.provider",
        ),
        (
            Box::new(|c| c.intra_provider = c"a/b".as_ptr()),
            "config.intra_provider",
        ),
        (
            Box::new(|c| c.bootstrap_addr = c"localhost".as_ptr()),
            "config.bootstrap_addr",
        ),
    ];
    for (set, name) in cases {
        let mut c = shm_config();
        set(&mut c);
        // SAFETY: both pointers are valid; the strings are static.
        let st = unsafe { fabricoll_get_unique_id_config(&mut id, &c) };
        assert_eq!(st, FABRICOLL_INVALID_ARGUMENT, "{name}");
        assert!(last_error().contains(name), "{name}: {}", last_error());
    }
    // SAFETY: NULL is refused before anything is written.
    let st = unsafe { fabricoll_config_init(std::ptr::null_mut()) };
    assert_eq!(st, FABRICOLL_INVALID_ARGUMENT);
    assert!(last_error().contains("config"), "{}", last_error());
    // SAFETY: as above.
    let st = unsafe { fabricoll_config_init_size(std::ptr::null_mut(), 48) };
    assert_eq!(st, FABRICOLL_INVALID_ARGUMENT);
    assert!(last_error().contains("config"), "{}", last_error());
}

/// A program built against an older (smaller) or newer (larger) header: the library writes
/// only the caller's bytes, and refuses sizes it cannot honour, naming `size`.
#[test]
fn config_init_writes_only_the_callers_struct() {
    let full = std::mem::size_of::<fabricoll_config>();
    let v1 = nccl_net_fabricoll::ffi::api::CONFIG_V1_SIZE;
    assert!(v1 < full, "the first struct ends before the current one");
    // The first header's symbol and the sized one, each into a guarded buffer.
    for (size, old_symbol) in [(v1, true), (v1, false), (full, false)] {
        let mut buf = vec![0xa5u8; full + 64];
        let p = buf.as_mut_ptr().cast::<fabricoll_config>();
        // SAFETY: `buf` is writable for full + 64 bytes and aligned by the allocator for usize.
        let st = unsafe {
            if old_symbol {
                fabricoll_config_init(p)
            } else {
                fabricoll_config_init_size(p, size)
            }
        };
        assert_eq!(st, FABRICOLL_SUCCESS, "size {size}");
        assert!(
            buf[size..].iter().all(|&b| b == 0xa5),
            "size {size}: bytes beyond the caller's struct were written"
        );
        assert_eq!(usize::from_ne_bytes(buf[..8].try_into().unwrap()), size);
        // Each pointer field (provider, intra_provider, bootstrap_addr) is NULL.
        assert!(buf[16..40].iter().all(|&b| b == 0), "size {size}");
    }
    for bad in [0, 8, v1 - 1, full + 8] {
        let mut buf = vec![0xa5u8; full + 64];
        // SAFETY: as above; a refused size writes nothing.
        let st = unsafe { fabricoll_config_init_size(buf.as_mut_ptr().cast(), bad) };
        assert_eq!(st, FABRICOLL_INVALID_ARGUMENT, "size {bad}");
        assert!(last_error().contains("size"), "{}", last_error());
        assert!(buf.iter().all(|&b| b == 0xa5), "size {bad} wrote");
    }
}

#[test]
fn an_unknown_provider_names_config_provider() {
    let mut c = shm_config();
    c.provider = c"nosuchprovider".as_ptr();
    let mut id = fabricoll_unique_id { internal: [0; 128] };
    // SAFETY: both pointers are valid.
    let st = unsafe { fabricoll_get_unique_id_config(&mut id, &c) };
    assert_eq!(st, FABRICOLL_SUCCESS);
    let mut comm = std::ptr::null_mut();
    // SAFETY: every pointer is valid.
    let st = unsafe { fabricoll_comm_init_rank_config(&mut comm, 1, &id, 0, &c) };
    assert_eq!(st, FABRICOLL_INVALID_ARGUMENT, "{}", last_error());
    let e = last_error();
    assert!(
        e.contains("config.provider") && e.contains("nosuchprovider"),
        "{e}"
    );
    assert!(comm.is_null());
}

#[test]
fn a_smaller_struct_is_read_only_as_far_as_its_size() {
    let mut c = shm_config();
    // An older caller's struct ends before `provider`: what lies beyond (here pointers that
    // must never be read) is not its.
    c.size = std::mem::offset_of!(fabricoll_config, provider);
    c.provider = std::ptr::dangling();
    c.intra_provider = std::ptr::dangling();
    c.bootstrap_addr = std::ptr::dangling();
    let mut id = fabricoll_unique_id { internal: [0; 128] };
    // SAFETY: the struct is readable for its size.
    let st = unsafe { fabricoll_get_unique_id_config(&mut id, &c) };
    assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
}

/// A blocking allreduce on `c` that its peer never makes fails with a timeout after
/// DEADLINE_MS (not the environment's ten minutes): not before it, and not much later (LATE
/// allows for a loaded machine).
fn lone_allreduce_times_out(c: usize) {
    let (send, mut recv) = ([1.0f32; 2], [0.0f32; 2]);
    let t0 = Instant::now();
    let st = fabricoll_allreduce(
        send.as_ptr().cast(),
        recv.as_mut_ptr().cast(),
        2,
        fabricoll_datatype::FABRICOLL_FLOAT32 as c_int,
        fabricoll_redop::FABRICOLL_SUM as c_int,
        comm(c),
    );
    let took = t0.elapsed();
    assert_eq!(st, FABRICOLL_TIMEOUT, "{}", last_error());
    assert!(
        took >= Duration::from_millis(DEADLINE_MS as u64)
            && took < Duration::from_millis(DEADLINE_MS as u64) + LATE,
        "{took:?}"
    );
}

#[test]
fn the_configs_timeout_rules_the_bootstrap_and_the_calls() {
    let test = "the_configs_timeout_rules_the_bootstrap_and_the_calls";
    let cfg = shm_config_deadline();
    // A lone rank of two: the bootstrap gives up after the config's timeout.
    let mut id = fabricoll_unique_id { internal: [0; 128] };
    // SAFETY: both pointers are valid.
    if unsafe { fabricoll_get_unique_id_config(&mut id, &cfg) } != FABRICOLL_SUCCESS {
        return skip(test, &format!("no unique id: {}", last_error()));
    }
    let mut lone = std::ptr::null_mut();
    let t0 = Instant::now();
    // SAFETY: every pointer is valid.
    let st = unsafe { fabricoll_comm_init_rank_config(&mut lone, 2, &id, 0, &cfg) };
    assert_eq!(st, FABRICOLL_TIMEOUT, "{}", last_error());
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(DEADLINE_MS as u64)
            && took < Duration::from_millis(DEADLINE_MS as u64) + LATE,
        "{took:?}"
    );
    // A collective that one rank alone makes fails after the config's timeout.
    let Some(cs) = pair(test, &cfg) else { return };
    lone_allreduce_times_out(cs[0]);
    for c in cs {
        assert_eq!(fabricoll_comm_destroy(comm(c)), FABRICOLL_SUCCESS);
    }
}

/// What a C callback saw: the status (-1 before it ran), how many times it ran, and the
/// thread's last error inside the callback when the status is a failure.
struct Seen {
    status: AtomicI32,
    calls: AtomicUsize,
    message: std::sync::Mutex<String>,
}

impl Seen {
    fn new() -> Seen {
        Seen {
            status: AtomicI32::new(-1),
            calls: AtomicUsize::new(0),
            message: std::sync::Mutex::new(String::new()),
        }
    }

    /// The status once the callback ran (within LATE: a bound on a hang, not a speed check).
    fn status(&self) -> c_int {
        let deadline = Instant::now() + LATE;
        while self.calls.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.status.load(Ordering::SeqCst)
    }
}

unsafe extern "C" fn record(user_data: *mut c_void, status: c_int) {
    // SAFETY: every test passes a `Seen` that outlives its request.
    let seen = unsafe { &*(user_data as *const Seen) };
    if status != FABRICOLL_SUCCESS as c_int {
        *seen.message.lock().unwrap() = last_error();
    }
    seen.status.store(status, Ordering::SeqCst);
    seen.calls.fetch_add(1, Ordering::SeqCst);
}

fn iallreduce(c: usize, send: &[f32; 2], recv: &mut [f32; 2]) -> *mut fabricoll_request {
    let mut req = std::ptr::null_mut();
    let st = fabricoll_iallreduce(
        send.as_ptr().cast(),
        recv.as_mut_ptr().cast(),
        2,
        fabricoll_datatype::FABRICOLL_FLOAT32 as c_int,
        fabricoll_redop::FABRICOLL_SUM as c_int,
        comm(c),
        &mut req,
    );
    assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
    req
}

/// The same allreduce of 2 floats started on both communicators of a pair.
fn iallreduce_pair(
    cs: [usize; 2],
    send: &[f32; 2],
    recv: &mut [[f32; 2]; 2],
) -> Vec<*mut fabricoll_request> {
    recv.iter_mut()
        .enumerate()
        .map(|(r, b)| iallreduce(cs[r], send, b))
        .collect()
}

/// A receive of 2 floats from the other rank of a pair.
fn irecv(c: usize, buf: &mut [f32; 2]) -> *mut fabricoll_request {
    let mut rank = 0;
    assert_eq!(fabricoll_comm_rank(comm(c), &mut rank), FABRICOLL_SUCCESS);
    let mut req = std::ptr::null_mut();
    let st = fabricoll_irecv(
        buf.as_mut_ptr().cast(),
        2,
        fabricoll_datatype::FABRICOLL_FLOAT32 as c_int,
        1 - rank,
        comm(c),
        &mut req,
    );
    assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
    req
}

fn notify(req: *mut fabricoll_request, seen: &Seen) -> fabricoll_status {
    fabricoll_request_notify(req, Some(record), seen as *const Seen as *mut c_void)
}

#[test]
fn notified_requests_call_back_once_with_their_status() {
    let test = "notified_requests_call_back_once_with_their_status";
    let Some(cs) = pair(test, &shm_config()) else {
        return;
    };
    // Success on both ranks.
    let send = [[1.0f32, 2.0], [3.0, 4.0]];
    let mut recv = [[0.0f32; 2]; 2];
    let seen = [Seen::new(), Seen::new()];
    let reqs: Vec<_> = (0..2)
        .map(|r| iallreduce(cs[r], &send[r], &mut recv[r]))
        .collect();
    // Bad arguments leave the request as it was.
    assert_eq!(
        fabricoll_request_notify(reqs[0], None, std::ptr::null_mut()),
        FABRICOLL_INVALID_ARGUMENT
    );
    assert!(last_error().contains("callback"), "{}", last_error());
    assert_eq!(
        notify(std::ptr::null_mut(), &seen[0]),
        FABRICOLL_INVALID_ARGUMENT
    );
    assert!(last_error().contains("request"), "{}", last_error());
    for r in 0..2 {
        assert_eq!(notify(reqs[r], &seen[r]), FABRICOLL_SUCCESS);
    }
    for s in &seen {
        assert_eq!(s.status(), FABRICOLL_SUCCESS as c_int);
    }
    std::thread::sleep(Duration::from_millis(20));
    for s in &seen {
        assert_eq!(s.calls.load(Ordering::SeqCst), 1);
    }
    assert_eq!(recv, [[4.0, 6.0], [4.0, 6.0]]);
    // The requests are freed: waiting on one names the request.
    assert_eq!(fabricoll_wait(reqs[0]), FABRICOLL_INVALID_ARGUMENT);
    // Destroy fails a pending receive (no one sends it), and so does abort: the callbacks run
    // with the abort status.
    let mut buf = [0.0f32; 2];
    let destroyed = Seen::new();
    let req = irecv(cs[1], &mut buf);
    assert_eq!(notify(req, &destroyed), FABRICOLL_SUCCESS);
    assert_eq!(fabricoll_comm_destroy(comm(cs[1])), FABRICOLL_SUCCESS);
    assert_eq!(destroyed.status(), FABRICOLL_INVALID_USAGE as c_int);
    let aborted = Seen::new();
    let req = irecv(cs[0], &mut buf);
    assert_eq!(notify(req, &aborted), FABRICOLL_SUCCESS);
    assert_eq!(fabricoll_comm_abort(comm(cs[0])), FABRICOLL_SUCCESS);
    assert_eq!(aborted.status(), FABRICOLL_INVALID_USAGE as c_int);
    assert_eq!(fabricoll_comm_destroy(comm(cs[0])), FABRICOLL_SUCCESS);
    for s in [&aborted, &destroyed] {
        assert_eq!(s.calls.load(Ordering::SeqCst), 1);
        // Inside the callback, fabricoll_last_error says why.
        let m = s.message.lock().unwrap().clone();
        assert!(m.contains("fabricoll_request_notify"), "{m}");
    }
    assert!(aborted.message.lock().unwrap().contains("abort"));
}

#[test]
fn a_callback_may_call_into_its_communicator() {
    let test = "a_callback_may_call_into_its_communicator";
    let Some(cs) = pair(test, &shm_config()) else {
        return;
    };
    /// The callback asks its communicator's rank: the engine's lock is not held.
    struct Ctx {
        comm: usize,
        rank: AtomicI32,
        seen: Seen,
    }
    unsafe extern "C" fn ask(user_data: *mut c_void, status: c_int) {
        // SAFETY: the test's Ctx outlives the request.
        let ctx = unsafe { &*(user_data as *const Ctx) };
        let mut r = -1;
        if fabricoll_comm_rank(ctx.comm as *mut fabricoll_comm, &mut r) == FABRICOLL_SUCCESS {
            ctx.rank.store(r, Ordering::SeqCst);
        }
        ctx.seen.status.store(status, Ordering::SeqCst);
        ctx.seen.calls.fetch_add(1, Ordering::SeqCst);
    }
    let ctx: Vec<Ctx> = (0..2)
        .map(|r| Ctx {
            comm: cs[r],
            rank: AtomicI32::new(-1),
            seen: Seen::new(),
        })
        .collect();
    let send = [1.0f32, 2.0];
    let mut recv = [[0.0f32; 2]; 2];
    let reqs = iallreduce_pair(cs, &send, &mut recv);
    for r in 0..2 {
        let st = fabricoll_request_notify(reqs[r], Some(ask), &ctx[r] as *const Ctx as *mut c_void);
        assert_eq!(st, FABRICOLL_SUCCESS);
    }
    for (r, c) in ctx.iter().enumerate() {
        assert_eq!(c.seen.status(), FABRICOLL_SUCCESS as c_int);
        assert_eq!(c.rank.load(Ordering::SeqCst), r as i32);
    }
    for c in cs {
        assert_eq!(fabricoll_comm_destroy(comm(c)), FABRICOLL_SUCCESS);
    }
}

#[test]
fn a_callback_that_destroys_its_communicator_gets_an_error() {
    let test = "a_callback_that_destroys_its_communicator_gets_an_error";
    let Some(cs) = pair(test, &shm_config()) else {
        return;
    };
    /// The callback tries to destroy its own communicator (forbidden), and records the answer.
    struct Ctx {
        comm: usize,
        destroy: AtomicI32,
        message: std::sync::Mutex<String>,
        seen: Seen,
    }
    unsafe extern "C" fn destroy(user_data: *mut c_void, status: c_int) {
        // SAFETY: the test's Ctx outlives the request.
        let ctx = unsafe { &*(user_data as *const Ctx) };
        let st = fabricoll_comm_destroy(ctx.comm as *mut fabricoll_comm);
        *ctx.message.lock().unwrap() = last_error();
        ctx.destroy.store(st as c_int, Ordering::SeqCst);
        ctx.seen.status.store(status, Ordering::SeqCst);
        ctx.seen.calls.fetch_add(1, Ordering::SeqCst);
    }
    let ctx: Vec<Ctx> = (0..2)
        .map(|r| Ctx {
            comm: cs[r],
            destroy: AtomicI32::new(-1),
            message: std::sync::Mutex::new(String::new()),
            seen: Seen::new(),
        })
        .collect();
    let send = [1.0f32, 2.0];
    let mut recv = [[0.0f32; 2]; 2];
    let reqs = iallreduce_pair(cs, &send, &mut recv);
    for (r, c) in ctx.iter().enumerate() {
        let st = fabricoll_request_notify(reqs[r], Some(destroy), c as *const Ctx as *mut c_void);
        assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
    }
    for c in &ctx {
        assert_eq!(c.seen.status(), FABRICOLL_SUCCESS as c_int);
        assert_eq!(
            c.destroy.load(Ordering::SeqCst),
            FABRICOLL_INVALID_USAGE as c_int
        );
        let m = c.message.lock().unwrap().clone();
        assert!(m.contains("comm") && m.contains("callback"), "{m}");
    }
    // Still whole: a collective passes, then destroy outside the callback succeeds.
    let send = [1.0f32, 2.0];
    let mut recv = [[0.0f32; 2]; 2];
    let reqs = iallreduce_pair(cs, &send, &mut recv);
    for q in reqs {
        assert_eq!(fabricoll_wait(q), FABRICOLL_SUCCESS, "{}", last_error());
    }
    assert_eq!(recv, [[2.0, 4.0], [2.0, 4.0]]);
    for c in cs {
        assert_eq!(fabricoll_comm_destroy(comm(c)), FABRICOLL_SUCCESS);
    }
}

#[test]
fn a_split_inherits_the_config() {
    let test = "a_split_inherits_the_config";
    // The short deadline: that the child has it is what this test checks.
    let Some(cs) = pair(test, &shm_config_deadline()) else {
        return;
    };
    let kids: Vec<usize> = std::thread::scope(|s| {
        let hs: Vec<_> = cs
            .iter()
            .map(|&c| {
                s.spawn(move || {
                    let mut kid = std::ptr::null_mut();
                    let st = fabricoll_comm_split(comm(c), 0, 0, &mut kid);
                    assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
                    kid as usize
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Rank 0 alone on the child: its timeout is the parent's config's, not the environment's.
    lone_allreduce_times_out(kids[0]);
    for c in kids.into_iter().chain(cs) {
        assert_eq!(fabricoll_comm_destroy(comm(c)), FABRICOLL_SUCCESS);
    }
}

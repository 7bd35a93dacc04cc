//! `fabricoll_comm_destroy` while the communicator's progress thread runs a callback: destroy
//! returns only once that thread has let go of the communicator (so nothing of it is freed
//! later, e.g. at process exit while the libraries' destructors run).
use capi::{comm, last_error, pair, shm_config, LATE};
use nccl_net_fabricoll::ffi::api::*;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use fabricoll_status::*;

mod capi;

/// What the slow callback saw: it entered, and it returned.
#[derive(Default)]
struct Slow {
    entered: AtomicBool,
    left: AtomicBool,
}

unsafe extern "C" fn slow(user_data: *mut c_void, _status: c_int) {
    // SAFETY: the test's `Slow` outlives the request.
    let s = unsafe { &*(user_data as *const Slow) };
    s.entered.store(true, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(300));
    s.left.store(true, Ordering::SeqCst);
}

fn ibarrier(c: usize) -> *mut fabricoll_request {
    let mut req = std::ptr::null_mut();
    let st = fabricoll_ibarrier(comm(c), &mut req);
    assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
    req
}

#[test]
fn destroy_waits_for_a_callback_in_progress() {
    let test = "destroy_waits_for_a_callback_in_progress";
    let Some(cs) = pair(test, &shm_config()) else {
        return;
    };
    let seen = [Slow::default(), Slow::default()];
    // Rank 1 first, so that its request is still pending when handed over: its callback then
    // runs in the progress thread.
    let req1 = ibarrier(cs[1]);
    let st = fabricoll_request_notify(req1, Some(slow), &seen[1] as *const Slow as *mut c_void);
    assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
    let req0 = ibarrier(cs[0]);
    let st = fabricoll_request_notify(req0, Some(slow), &seen[0] as *const Slow as *mut c_void);
    assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
    let deadline = Instant::now() + LATE;
    while !seen[1].entered.load(Ordering::SeqCst) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        seen[1].entered.load(Ordering::SeqCst),
        "rank 1's callback never ran"
    );
    assert_eq!(fabricoll_comm_destroy(comm(cs[1])), FABRICOLL_SUCCESS);
    assert!(
        seen[1].left.load(Ordering::SeqCst),
        "destroy returned while the progress thread still ran a callback holding the communicator"
    );
    assert_eq!(fabricoll_comm_destroy(comm(cs[0])), FABRICOLL_SUCCESS);
    assert!(seen[0].left.load(Ordering::SeqCst));
}

//! What the C API tests share: a config over shm, and two (or `n`) ranks' communicators made
//! with it as threads of one process. The config's timeout covers endpoint opening, the bootstrap
//! and the calibration too, so it is generous (a loaded machine must pass); only the tests whose
//! subject is the deadline take the short one (`shm_config_deadline`).
#![allow(dead_code)] // not every test binary uses each helper
use nccl_net_fabricoll::ffi::api::*;
use nccl_net_fabricoll::testing::skip;
use std::ffi::CStr;
use std::os::raw::c_int;

use fabricoll_status::*;

/// The per-communicator timeout of these tests; the environment's is FABRICOLL_TIMEOUT_MS's
/// default (ten minutes) unless a runner sets it. Long enough for init on a loaded machine.
pub const TIMEOUT_MS: c_int = 60_000;

/// The timeout of the tests that check the deadline itself: short, so that the test is quick,
/// and long enough that init (which waits under the same timeout) passes on a loaded machine.
pub const DEADLINE_MS: c_int = 3_000;

/// How late a deadline may fire on a loaded machine before a test calls it missed.
pub const LATE: std::time::Duration = std::time::Duration::from_secs(30);

pub fn last_error() -> String {
    // SAFETY: fabricoll_last_error returns this thread's NUL-terminated message.
    unsafe { CStr::from_ptr(fabricoll_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// A config over shm, one fabric, with the generous timeout. The strings are static.
pub fn shm_config() -> fabricoll_config {
    let mut c = std::mem::MaybeUninit::<fabricoll_config>::uninit();
    let size = std::mem::size_of::<fabricoll_config>();
    // SAFETY: `c` is writable for `size` bytes.
    let st = unsafe { fabricoll_config_init_size(c.as_mut_ptr(), size) };
    assert_eq!(st, FABRICOLL_SUCCESS);
    // SAFETY: fabricoll_config_init_size wrote every field.
    let mut c = unsafe { c.assume_init() };
    assert_eq!(c.size, std::mem::size_of::<fabricoll_config>());
    assert!(c.provider.is_null() && c.timeout_ms == 0 && c.algo == 0);
    c.timeout_ms = TIMEOUT_MS;
    c.provider = c"shm".as_ptr();
    c.intra_provider = c"same".as_ptr();
    c
}

/// `shm_config` with the short timeout, for the tests whose subject is the deadline.
pub fn shm_config_deadline() -> fabricoll_config {
    let mut c = shm_config();
    c.timeout_ms = DEADLINE_MS;
    c
}

/// Two communicators (ranks 0 and 1) made with `cfg`, or None (skipped) without shm.
pub fn pair(test: &str, cfg: &fabricoll_config) -> Option<[usize; 2]> {
    ranks(test, cfg, 2).map(|v| [v[0], v[1]])
}

/// `n` communicators (ranks 0 .. n) made with `cfg` as threads, or None (skipped) without shm.
pub fn ranks(test: &str, cfg: &fabricoll_config, n: usize) -> Option<Vec<usize>> {
    ranks_each(test, &vec![cfg; n])
}

/// One communicator per config (rank r made with `cfgs[r]`, the unique id with `cfgs[0]`) as
/// threads, or None (skipped) without shm.
pub fn ranks_each(test: &str, cfgs: &[&fabricoll_config]) -> Option<Vec<usize>> {
    let n = cfgs.len();
    let mut id = fabricoll_unique_id { internal: [0; 128] };
    // SAFETY: both pointers are valid.
    if unsafe { fabricoll_get_unique_id_config(&mut id, cfgs[0]) } != FABRICOLL_SUCCESS {
        skip(test, &format!("no unique id: {}", last_error()));
        return None;
    }
    let id_addr = &id as *const fabricoll_unique_id as usize;
    let made: Vec<std::result::Result<usize, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let cfg_addr = cfgs[r] as *const fabricoll_config as usize;
                s.spawn(move || {
                    let mut comm = std::ptr::null_mut();
                    // SAFETY: the id and the config outlive this scope; `comm` is writable.
                    let st = unsafe {
                        fabricoll_comm_init_rank_config(
                            &mut comm,
                            n as c_int,
                            id_addr as *const fabricoll_unique_id,
                            r as c_int,
                            cfg_addr as *const fabricoll_config,
                        )
                    };
                    if st == FABRICOLL_SUCCESS {
                        Ok(comm as usize)
                    } else {
                        Err(last_error())
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    if made.iter().all(|m| m.is_ok()) {
        return Some(made.into_iter().map(|m| m.unwrap()).collect());
    }
    skip(test, &format!("no shm communicators: {made:?}"));
    None
}

pub fn comm(c: usize) -> *mut fabricoll_comm {
    c as *mut fabricoll_comm
}

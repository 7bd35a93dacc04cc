//! `fabricoll_config.inplace` through the C API, two ranks as threads over shm: a bad value
//! names the field; a lone rank's in-place allreduce fails at the communicator's deadline
//! with its buffer restored under FABRICOLL_INPLACE_RESTORE and an error saying that it is
//! undefined under FABRICOLL_INPLACE_UNDEFINED; both give the same bytes when the peer calls.
use capi::{comm, last_error, pair, shm_config, shm_config_deadline, DEADLINE_MS, LATE};
use nccl_net_fabricoll::ffi::api::*;
use std::os::raw::{c_int, c_void};
use std::time::{Duration, Instant};

use fabricoll_inplace::*;
use fabricoll_status::*;

mod capi;

const FLOAT32: c_int = fabricoll_datatype::FABRICOLL_FLOAT32 as c_int;
const SUM: c_int = fabricoll_redop::FABRICOLL_SUM as c_int;

#[test]
fn a_bad_inplace_value_names_config_inplace() {
    let mut id = fabricoll_unique_id { internal: [0; 128] };
    for v in [-1, 3, 99] {
        let mut c = shm_config();
        assert_eq!(c.inplace, FABRICOLL_INPLACE_DEFAULT as c_int);
        c.inplace = v;
        // SAFETY: both pointers are valid; the strings are static.
        let st = unsafe { fabricoll_get_unique_id_config(&mut id, &c) };
        assert_eq!(st, FABRICOLL_INVALID_ARGUMENT, "{v}");
        assert!(last_error().contains("config.inplace"), "{}", last_error());
    }
}

/// In-place float sum of `data` on communicator `c`: the status and the error message.
fn allreduce(c: usize, data: &mut [f32]) -> (fabricoll_status, String) {
    let p = data.as_mut_ptr().cast::<c_void>();
    let st = fabricoll_allreduce(p, p, data.len(), FLOAT32, SUM, comm(c));
    (st, last_error())
}

fn input(r: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (i % 1000) as f32 * 0.37 + r as f32)
        .collect()
}

#[test]
fn inplace_restore_or_undefined_on_a_lone_call_and_equal_results_otherwise() {
    let test = "inplace_restore_or_undefined_on_a_lone_call_and_equal_results_otherwise";
    let n = 300_001;
    let mut results = Vec::new();
    for mode in [FABRICOLL_INPLACE_RESTORE, FABRICOLL_INPLACE_UNDEFINED] {
        let restoring = matches!(mode, FABRICOLL_INPLACE_RESTORE);
        let mut cfg = shm_config_deadline();
        cfg.inplace = mode as c_int;
        let Some(cs) = pair(test, &cfg) else {
            return;
        };
        // Rank 1 does not call: rank 0 fails at the deadline (DEADLINE_MS).
        let mut data = input(0, n);
        let t = Instant::now();
        let (st, msg) = allreduce(cs[0], &mut data);
        assert_eq!(st, FABRICOLL_TIMEOUT, "{msg}");
        let limit = Duration::from_millis(DEADLINE_MS as u64) + LATE;
        assert!(t.elapsed() < limit, "{:?}", t.elapsed());
        assert_eq!(msg.contains("undefined"), !restoring, "{msg}");
        if restoring {
            assert!(data == input(0, n), "the input was not restored");
        }
        for c in cs {
            assert_eq!(fabricoll_comm_destroy(comm(c)), FABRICOLL_SUCCESS);
        }
        // A fresh pair: both call.
        let Some(cs) = pair(test, &cfg) else {
            return;
        };
        let out: Vec<Vec<f32>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    let c = cs[r];
                    s.spawn(move || {
                        let mut d = input(r, n);
                        let (st, msg) = allreduce(c, &mut d);
                        assert_eq!(st, FABRICOLL_SUCCESS, "{msg}");
                        d
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(out[0] == out[1], "the ranks' sums differ");
        results.push(out.into_iter().next().unwrap());
        for c in cs {
            assert_eq!(fabricoll_comm_destroy(comm(c)), FABRICOLL_SUCCESS);
        }
    }
    assert!(
        results[0] == results[1],
        "restoring and not give different sums"
    );
}

//! A deadline that passes names where its value came from: a communicator's
//! `fabricoll_config.timeout_ms` (the C API's options, which torch's group timeout becomes),
//! the environment's FABRICOLL_TIMEOUT_MS, or the default with that variable unset. Checked
//! in the engines' error (a peer that never calls) and the bootstrap's (a rank that never
//! comes), with deadlines of a few hundred milliseconds.
use capi::{comm, last_error, pair, shm_config};
use nccl_net_fabricoll::coll::bootstrap;
use nccl_net_fabricoll::coll::{Comm, Kind};
use nccl_net_fabricoll::config::{Config, Overrides, Timeout, TimeoutSource};
use nccl_net_fabricoll::ffi::api::*;
use nccl_net_fabricoll::transport::Region;
use std::net::{IpAddr, Ipv4Addr};
use std::os::raw::c_int;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fabricoll_status::*;

mod capi;
mod common;

// The deadline is what these tests check, but it also covers the bootstrap and calibration of
// the communicators they make: short, yet long enough for a loaded machine.
const MS: u32 = 3000;
const CONFIG: &str = "3000 ms (fabricoll_config.timeout_ms)";
const ENV: &str = "3000 ms (FABRICOLL_TIMEOUT_MS)";
const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Rank 0 of two in-process communicators over the loopback transport makes an AllReduce
/// alone; its error, which must come at the deadline (LATE allows for a loaded machine).
fn lone_allreduce(cfg: &Config) -> String {
    let cfgs = [cfg.clone(), cfg.clone()];
    let cs: Vec<Arc<Comm>> =
        common::comms_in_process("lone_allreduce", "loopback", &cfgs).expect("loopback");
    let mut data = [1.0f32; 4];
    // SAFETY: `data` outlives the blocking call.
    let x = unsafe { Region::from_raw(data.as_mut_ptr().cast(), size_of_val(&data)) };
    let t = Instant::now();
    let call = common::call(
        Kind::Coll(nccl_net_fabricoll::algo::Collective::AllReduce),
        x,
        x,
        4,
    );
    let e = cs[0].run(&call).unwrap_err().to_string();
    let limit = Duration::from_millis(MS.into()) + capi::LATE;
    assert!(t.elapsed() < limit, "{:?}", t.elapsed());
    e
}

#[test]
fn the_engines_name_the_environment_or_the_config() {
    // The two wait out their deadlines side by side.
    std::thread::scope(|s| {
        s.spawn(|| {
            let env = common::fixed_model(None, MS);
            let e = lone_allreduce(&env);
            assert!(e.contains(ENV), "{e}");
        });
        // The same deadline set as a communicator's option: the error names that option, not
        // the variable the user never set.
        s.spawn(|| {
            let own = common::fixed_model(None, 600_000)
                .with_overrides(&Overrides {
                    timeout_ms: Some(MS.into()),
                    ..Overrides::default()
                })
                .unwrap();
            let e = lone_allreduce(&own);
            assert!(e.contains(CONFIG), "{e}");
            assert!(!e.contains("FABRICOLL_TIMEOUT_MS"), "{e}");
        });
    });
}

#[test]
fn the_bootstrap_names_the_environment_or_the_default() {
    // A rank of two whose peer never comes: the root refuses it when its timeout passes (or
    // the rank's own passes first); either error names the source.
    // The two wait out their deadlines side by side, each with its own root.
    std::thread::scope(|s| {
        s.spawn(|| {
            let env = common::fixed_model(None, MS).timeout_setting();
            let id = bootstrap::new_unique_id(LOCALHOST, env).unwrap();
            let e = bootstrap::exchange(&id, 0, 2, b"x", env)
                .unwrap_err()
                .to_string();
            assert!(e.contains(ENV), "{e}");
        });
        s.spawn(|| {
            let default = Timeout::new(Duration::from_millis(MS.into()), TimeoutSource::Default);
            let id = bootstrap::new_unique_id(LOCALHOST, default).unwrap();
            let e = bootstrap::exchange(&id, 0, 2, b"x", default)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("3000 ms (the default, FABRICOLL_TIMEOUT_MS unset)"),
                "{e}"
            );
        });
    });
}

#[test]
fn the_c_apis_config_timeout_names_itself() {
    let test = "the_c_apis_config_timeout_names_itself";
    let mut cfg = shm_config();
    cfg.timeout_ms = MS as c_int;
    // A lone rank of two: the bootstrap's error names the config's field.
    let mut id = fabricoll_unique_id { internal: [0; 128] };
    // SAFETY: both pointers are valid.
    if unsafe { fabricoll_get_unique_id_config(&mut id, &cfg) } != FABRICOLL_SUCCESS {
        return nccl_net_fabricoll::testing::skip(test, &format!("no unique id: {}", last_error()));
    }
    let mut lone = std::ptr::null_mut();
    // SAFETY: every pointer is valid.
    let st = unsafe { fabricoll_comm_init_rank_config(&mut lone, 2, &id, 0, &cfg) };
    let e = last_error();
    assert_eq!(st, FABRICOLL_TIMEOUT, "{e}");
    assert!(
        e.contains(CONFIG) && !e.contains("FABRICOLL_TIMEOUT_MS"),
        "{e}"
    );
    // A collective its peer never makes: the engine's error names it too.
    let Some(cs) = pair(test, &cfg) else { return };
    let (send, mut recv) = ([1.0f32; 2], [0.0f32; 2]);
    let st = fabricoll_allreduce(
        send.as_ptr().cast(),
        recv.as_mut_ptr().cast(),
        2,
        fabricoll_datatype::FABRICOLL_FLOAT32 as c_int,
        fabricoll_redop::FABRICOLL_SUM as c_int,
        comm(cs[0]),
    );
    let e = last_error();
    assert_eq!(st, FABRICOLL_TIMEOUT, "{e}");
    assert!(
        e.contains(CONFIG) && !e.contains("FABRICOLL_TIMEOUT_MS"),
        "{e}"
    );
    for c in cs {
        assert_eq!(fabricoll_comm_destroy(comm(c)), FABRICOLL_SUCCESS);
    }
}

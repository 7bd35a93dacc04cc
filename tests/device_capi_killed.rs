//! A peer process killed (SIGKILL) while a stream-ordered call waits for it, on the emulated
//! device over shm: the survivor's stream is released and the failure reported by
//! fabricoll_comm_get_async_error, within the communicator's deadline. Rank 1 is a process of
//! this test binary (the ignored `peer_rank`, started by the test); rank 0 runs in the test.
//! `gpu_a_killed_peer_releases_the_stream_and_reports_the_error` does the same on CUDA device
//! 0 (ignored here; scripts/gpu-tests.sh runs it). (`device_capi` covers an abort and a peer
//! destroying its communicator in one process.)
use capi::{last_error, shm_config};
use nccl_net_fabricoll::coll::device::{install, installed, uninstall};
use nccl_net_fabricoll::device::{Device, DeviceKind, EmuConfig};
use nccl_net_fabricoll::ffi::api::*;
use std::io::{BufRead, BufReader};
use std::os::raw::{c_int, c_void};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fabricoll_status::*;

mod capi;

/// Set in the peer process: the unique id, as hex.
const CHILD: &str = "DEVICE_CAPI_KILLED_ID";
/// Set in the peer process of the GPU test: use CUDA device 0.
const ON_GPU: &str = "DEVICE_CAPI_KILLED_GPU";
/// The communicators' deadline: long enough for init on a loaded machine; the survivor must
/// report the failure within it (and `LATE`).
const TIMEOUT_MS: c_int = 10_000;
const COUNT: usize = 4096;

/// The device of the calls: CUDA device 0 (`gpu`), else the emulated one, installed.
fn device(gpu: bool) -> Device {
    if gpu {
        nccl_net_fabricoll::testing::backtrace_on_fatal_signal();
        // The emulated case may have run first in this process: its installed device would
        // take CUDA's buffers for host memory.
        uninstall();
        let d = Device::cuda(0).expect("no CUDA device: this test runs on the GPU machine only");
        d.bind().expect("bind");
        let found = installed().map(|f| f.kind());
        assert_eq!(
            found,
            Some(DeviceKind::Cuda),
            "the library's device for this thread"
        );
        return d;
    }
    // A stream waits for a flag longer than the survivor's call may take to fail.
    let cfg = EmuConfig {
        flag_timeout: Duration::from_millis(TIMEOUT_MS as u64) + capi::LATE * 2,
        ..EmuConfig::default()
    };
    let d = Device::emulated(cfg).expect("emulated device");
    install(d.clone());
    d.bind().expect("bind");
    d
}

fn config() -> fabricoll_config {
    let mut c = shm_config();
    c.timeout_ms = TIMEOUT_MS;
    c
}

fn hex(id: &fabricoll_unique_id) -> String {
    id.internal
        .iter()
        .map(|&b| format!("{:02x}", b as u8))
        .collect()
}

fn unhex(s: &str) -> fabricoll_unique_id {
    let mut id = fabricoll_unique_id { internal: [0; 128] };
    for (i, b) in id.internal.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex") as _;
    }
    id
}

/// Rank `rank` of 2 with `id`; one stream-ordered device allreduce on `buf`, waited for: the
/// first device call allocates the staging, and the first stream-ordered call waits until
/// every rank has made it (docs/device-calls.md), so the survivor's later call, which the peer
/// never joins, returns at once.
fn join(
    id: &fabricoll_unique_id,
    rank: c_int,
    d: &Device,
    buf: *mut c_void,
) -> *mut fabricoll_comm {
    let mut comm = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call.
    let st = unsafe { fabricoll_comm_init_rank_config(&mut comm, 2, id, rank, &config()) };
    assert_eq!(st, FABRICOLL_SUCCESS, "init rank {rank}: {}", last_error());
    let (f32t, sum) = (
        fabricoll_datatype::FABRICOLL_FLOAT32 as c_int,
        fabricoll_redop::FABRICOLL_SUM as c_int,
    );
    let s = d.create_stream().unwrap();
    let st = fabricoll_allreduce_stream(buf, buf, COUNT, f32t, sum, comm, s.handle());
    assert_eq!(st, FABRICOLL_SUCCESS, "rank {rank}: {}", last_error());
    s.synchronize(Duration::from_millis(TIMEOUT_MS as u64) + capi::LATE)
        .unwrap();
    comm
}

/// The peer: joins, makes the first stream-ordered call, says so, and waits to be killed.
#[test]
#[ignore = "rank 1 of a_killed_peer_releases_the_stream_and_reports_the_error, which starts it"]
fn peer_rank() {
    let Ok(id) = std::env::var(CHILD) else {
        return;
    };
    let d = device(std::env::var(ON_GPU).is_ok());
    let buf = d.alloc(COUNT * 4).unwrap();
    let _comm = join(&unhex(&id), 1, &d, buf.addr() as *mut c_void);
    println!("@@ready");
    std::thread::sleep(Duration::from_secs(300));
}

/// Kills the child when dropped (a failing test included).
struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_killed_peer_releases_the_stream_and_reports_the_error() {
    killed(
        "a_killed_peer_releases_the_stream_and_reports_the_error",
        false,
    );
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_a_killed_peer_releases_the_stream_and_reports_the_error() {
    killed(
        "gpu_a_killed_peer_releases_the_stream_and_reports_the_error",
        true,
    );
}

/// The test on the emulated device, or CUDA device 0 (`gpu`).
fn killed(test: &str, gpu: bool) {
    let mut id = fabricoll_unique_id { internal: [0; 128] };
    // SAFETY: both pointers are valid.
    if unsafe { fabricoll_get_unique_id_config(&mut id, &config()) } != FABRICOLL_SUCCESS {
        nccl_net_fabricoll::testing::skip(test, &format!("no unique id: {}", last_error()));
        return;
    }
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    if gpu {
        cmd.env(ON_GPU, "1");
    }
    let child = cmd
        .args(["--exact", "peer_rank", "--ignored", "--nocapture"])
        .env(CHILD, hex(&id))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the peer");
    let mut child = Killed(child);
    let out = child.0.stdout.take().unwrap();
    let d = device(gpu);
    let buf = d.alloc(COUNT * 4).unwrap();
    let p = buf.addr() as *mut c_void;
    let comm = join(&id, 0, &d, p);
    // The peer has made its first stream-ordered call; it makes no other.
    let ready = BufReader::new(out)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.contains("@@ready"));
    assert!(ready, "the peer did not get ready");
    let s = d.create_stream().unwrap();
    let (f32t, sum) = (
        fabricoll_datatype::FABRICOLL_FLOAT32 as c_int,
        fabricoll_redop::FABRICOLL_SUM as c_int,
    );
    let st = fabricoll_allreduce_stream(p, p, COUNT, f32t, sum, comm, s.handle());
    assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
    std::thread::sleep(Duration::from_millis(100));
    // SIGKILL: no chance to close anything.
    child.0.kill().expect("kill the peer");
    let killed = Instant::now();
    let limit = Duration::from_millis(TIMEOUT_MS as u64) + capi::LATE;
    s.synchronize(limit)
        .expect("the survivor's stream was not released");
    let released = killed.elapsed();
    let mut e = FABRICOLL_SUCCESS;
    assert_eq!(
        fabricoll_comm_get_async_error(comm, &mut e),
        FABRICOLL_SUCCESS
    );
    assert_ne!(e, FABRICOLL_SUCCESS, "the call did not fail");
    let msg = last_error();
    assert!(msg.contains("async_error"), "{msg}");
    // The survivor sees the peer's process gone while it waits (or refused a send posted
    // after the kill): well before the deadline, not from it.
    let prompt = Duration::from_millis(TIMEOUT_MS as u64) / 3;
    assert!(released < prompt, "released after {released:?}: {msg}");
    assert!(
        msg.contains(" is gone (") || msg.contains("has exited"),
        "{msg}"
    );
    // Later stream-ordered calls fail at once with it, and the communicator still goes.
    let st = fabricoll_allreduce_stream(p, p, COUNT, f32t, sum, comm, s.handle());
    assert_ne!(st, FABRICOLL_SUCCESS);
    assert!(
        last_error().contains("earlier stream-ordered call"),
        "{}",
        last_error()
    );
    assert_eq!(
        fabricoll_comm_destroy(comm),
        FABRICOLL_SUCCESS,
        "{}",
        last_error()
    );
    println!("stream released {released:?} after the kill: {msg}");
}

//! What the integration tests share.
use nccl_net_fabricoll::coll::{Call, Kind};
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::reduce::{DataType, RedOp};
use nccl_net_fabricoll::transport::Region;

pub mod typed;

/// A configuration with a fixed cost model (alpha 5 us, beta 2 GB/s, gamma 8 GB/s: nothing to
/// calibrate), a deadline of `timeout_ms`, and `provider` where given.
#[allow(dead_code)] // not every test binary uses each helper
pub fn fixed_model(provider: Option<&str>, timeout_ms: u32) -> Config {
    fixed_model_on(provider, None, timeout_ms)
}

/// `fixed_model` on the libfabric domain `domain` where given (`lo` for the IP providers).
pub fn fixed_model_on(provider: Option<&str>, domain: Option<&str>, timeout_ms: u32) -> Config {
    let timeout = timeout_ms.to_string();
    let kv = [
        ("FABRICOLL_PROVIDER", provider),
        ("FABRICOLL_DOMAIN", domain),
        ("FABRICOLL_ALPHA_US", Some("5")),
        ("FABRICOLL_BETA_GBPS", Some("2")),
        ("FABRICOLL_GAMMA_GBPS", Some("8")),
        ("FABRICOLL_TIMEOUT_MS", Some(timeout.as_str())),
    ];
    Config::from_lookup(|n| {
        kv.iter()
            .find(|(k, _)| *k == n)
            .and_then(|(_, v)| v.map(String::from))
    })
    .unwrap()
}

/// A float sum of `count` elements: `kind` from `send` into `recv`, the algorithm left to the
/// communicator.
#[allow(dead_code)] // not every test binary uses each helper
pub fn call(kind: Kind, send: Region, recv: Region, count: usize) -> Call {
    Call {
        kind,
        send,
        recv,
        count,
        dtype: DataType::Float32,
        op: RedOp::Sum,
        root: 0,
        algo: None,
    }
}

/// Communicators in this process, one per entry of `cfgs`, over `transport`: "loopback" (the
/// in-process transport) or a libfabric endpoint opened from each configuration. None (the
/// test skipped, naming `test`) where no endpoint opens here.
#[allow(dead_code)] // not every test binary uses each helper
pub fn comms_in_process(
    test: &str,
    transport: &str,
    cfgs: &[Config],
) -> Option<Vec<std::sync::Arc<nccl_net_fabricoll::coll::Comm>>> {
    use nccl_net_fabricoll::coll::{self, Comm};
    use nccl_net_fabricoll::transport::{loopback::LoopbackFabric, Transport};
    use std::sync::Arc;
    let eps: Vec<Arc<dyn Transport>> = if transport == "loopback" {
        let f = LoopbackFabric::new();
        cfgs.iter()
            .map(|_| Arc::new(f.endpoint()) as Arc<dyn Transport>)
            .collect()
    } else {
        match cfgs.iter().map(coll::open_endpoint).collect() {
            Ok(e) => e,
            Err(e) => {
                nccl_net_fabricoll::testing::skip(test, &format!("no {transport} endpoint ({e})"));
                return None;
            }
        }
    };
    let addrs: Vec<Vec<u8>> = eps.iter().map(|e| e.address()).collect();
    Some(
        eps.into_iter()
            .zip(cfgs)
            .enumerate()
            .map(|(r, (e, cfg))| Arc::new(Comm::new(r, e, &addrs, cfg).unwrap()))
            .collect(),
    )
}

/// Connect a send and a receive comm on one net plugin device, polling both from this thread.
#[allow(dead_code)] // not every test binary uses each helper
pub fn net_pair(d: &nccl_net_fabricoll::plugin::net::Device) -> (u64, u64) {
    let (mut handle, listen) = d.listen().unwrap();
    let (mut s, mut r) = (None, None);
    let start = std::time::Instant::now();
    while s.is_none() || r.is_none() {
        if s.is_none() {
            s = d.connect(&mut handle).unwrap();
        }
        if r.is_none() {
            r = d.accept(listen).unwrap();
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "connection setup hung"
        );
    }
    d.close_listen(listen).unwrap();
    (s.unwrap(), r.unwrap())
}

/// `b` as lower-case hex digits, two per byte: bytes on a command line or in the environment.
#[allow(dead_code)] // not every test binary uses each helper
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The bytes `hex` wrote.
#[allow(dead_code)] // not every test binary uses each helper
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

/// A command that runs this test binary's ignored test `name` alone, with its output
/// uncaptured: the second process of a test that starts one.
#[allow(dead_code)] // not every test binary uses each helper
pub fn ignored_test(name: &str) -> std::process::Command {
    let mut c = std::process::Command::new(std::env::current_exe().expect("test executable"));
    c.args([
        "--exact",
        name,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    c
}

/// `f(rank, comm)` on every rank of `comms` at once, a thread each: the results in rank order.
#[allow(dead_code)] // not every test binary uses each helper
pub fn on_every_rank<T: Send>(
    comms: &[std::sync::Arc<nccl_net_fabricoll::coll::Comm>],
    f: impl Fn(usize, &nccl_net_fabricoll::coll::Comm) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(rank, comm)| {
                let f = &f;
                s.spawn(move || f(rank, comm))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

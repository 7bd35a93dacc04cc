//! The plugin's NCCL semantics driven from one thread (as NCCL's GDR probe does), over the
//! loopback backend and over libfabric's tcp and shm providers.
mod common;

use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::plugin::net::Device;
use nccl_net_fabricoll::plugin::{Plugin, HANDLE_SIZE, NCCL_PTR_HOST};
use nccl_net_fabricoll::transport::loopback::LoopbackFabric;
use nccl_net_fabricoll::transport::Region;
use std::time::{Duration, Instant};

fn cfg(pairs: &[(&str, &str)]) -> Config {
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    Config::from_lookup(|n| pairs.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone())).unwrap()
}

fn fabric_plugin(provider: &str) -> Option<Plugin> {
    let mut env = vec![
        ("FABRICOLL_PROVIDER", provider),
        ("FABRICOLL_TIMEOUT_MS", "5000"),
    ];
    if provider == "tcp" {
        env.push(("FABRICOLL_DOMAIN", "lo"));
    }
    match Plugin::discover(&cfg(&env)) {
        Ok(p) => Some(p),
        Err(e) => {
            nccl_net_fabricoll::testing::skip(
                &format!("{provider}_provider"),
                &format!("no {provider} device: {e}"),
            );
            None
        }
    }
}

fn region(v: &mut [u8]) -> Region {
    // SAFETY: every buffer outlives the requests posted on it (each test waits for them).
    unsafe { Region::from_raw(v.as_mut_ptr(), v.len()) }
}

use common::net_pair as pair;

fn wait(d: &Device, req: u64) -> nccl_net_fabricoll::plugin::net::Finished {
    let start = Instant::now();
    loop {
        if let Some(f) = d.test(req).unwrap() {
            return f;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "request hung");
    }
}

fn exercise(d: &Device) {
    let (s, r) = pair(d);
    for size in [0usize, 1, 8, 4095, 65536, (1 << 20) + 3, 8 << 20] {
        let mut src: Vec<u8> = (0..size).map(|i| (i * 7 + size) as u8).collect();
        let mut dst = vec![0u8; size + 64];
        let smr = d.reg_mr(s, region(&mut src), NCCL_PTR_HOST).unwrap();
        let rmr = d.reg_mr(r, region(&mut dst), NCCL_PTR_HOST).unwrap();
        let rq = d.irecv(r, &[(region(&mut dst), 3, rmr)]).unwrap().unwrap();
        let sq = d.isend(s, region(&mut src), 3, smr).unwrap().unwrap();
        let fs = wait(d, sq);
        let fr = wait(d, rq);
        assert_eq!(fs.sizes[0], size);
        assert_eq!(fr.sizes[0], size, "received size");
        assert_eq!(&dst[..size], &src[..], "payload of {size} bytes");
        d.dereg_mr(s, smr).unwrap();
        d.dereg_mr(r, rmr).unwrap();
    }
    // A grouped receive, the sends in another tag order.
    let mut bufs: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; 256]).collect();
    let mut srcs: Vec<Vec<u8>> = (0..8).map(|i| vec![i as u8 + 1; 10 + i]).collect();
    let specs: Vec<(Region, i32, u64)> = bufs
        .iter_mut()
        .enumerate()
        .map(|(i, b)| (region(b), 100 + i as i32, 0))
        .collect();
    let rq = d.irecv(r, &specs).unwrap().unwrap();
    let mut sends = Vec::new();
    for i in (0..8).rev() {
        sends.push(
            d.isend(s, region(&mut srcs[i]), 100 + i as i32, 0)
                .unwrap()
                .unwrap(),
        );
    }
    let f = wait(d, rq);
    for q in sends {
        wait(d, q);
    }
    for i in 0..8 {
        assert_eq!(f.sizes[i], 10 + i);
        assert_eq!(&bufs[i][..10 + i], &srcs[i][..]);
    }
    // A receive smaller than the message is an error.
    let mut small = vec![0u8; 4];
    let mut big = vec![1u8; 64];
    let rq = d.irecv(r, &[(region(&mut small), 9, 0)]).unwrap().unwrap();
    let sq = d.isend(s, region(&mut big), 9, 0).unwrap().unwrap();
    let start = Instant::now();
    let err = loop {
        match d.test(rq) {
            Ok(None) => {}
            Ok(Some(_)) => panic!("truncated receive reported success"),
            Err(e) => break e,
        }
        assert!(start.elapsed() < Duration::from_secs(10));
    };
    // Some providers (tcp;ofi_rxm) do not say how large the message was.
    let e = err.to_string();
    assert!(
        e.contains("arrived for a receive buffer of 4 bytes")
            && (e.contains("64 bytes") || e.contains("a larger message")),
        "{e}"
    );
    let _ = d.test(sq);
    d.close_send(s).unwrap();
    d.close_recv(r).unwrap();
    // Bad input.
    let mut garbage = [0u8; HANDLE_SIZE];
    assert!(d.connect(&mut garbage).is_err());
    assert!(d.test(0x12345678).is_err());
    assert!(d.isend(s, Region::empty(), 1, 0).is_err(), "closed comm");
}

#[test]
fn loopback_backend() {
    let f = LoopbackFabric::new();
    let p = Plugin::loopback(&f, 1, &cfg(&[]));
    exercise(&p.devices[0]);
}

#[test]
fn tcp_provider() {
    if let Some(p) = fabric_plugin("tcp") {
        exercise(&p.devices[0]);
    }
}

#[test]
fn shm_provider() {
    if let Some(p) = fabric_plugin("shm") {
        exercise(&p.devices[0]);
    }
}

#[test]
fn connect_and_test_have_deadlines() {
    let f = LoopbackFabric::new();
    let p = Plugin::loopback(&f, 1, &cfg(&[("FABRICOLL_TIMEOUT_MS", "200")]));
    let d = &p.devices[0];
    let (_h, listen) = d.listen().unwrap();
    let start = Instant::now();
    let err = loop {
        match d.accept(listen) {
            Ok(None) => {}
            Ok(Some(_)) => panic!("nobody connected"),
            Err(e) => break e,
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "accept ignored its deadline"
        );
    };
    assert!(err.to_string().contains("FABRICOLL_TIMEOUT_MS"), "{err}");
    let (s, r) = pair(d);
    let mut buf = vec![0u8; 16];
    let rq = d.irecv(r, &[(region(&mut buf), 1, 0)]).unwrap().unwrap();
    let start = Instant::now();
    let err = loop {
        match d.test(rq) {
            Ok(None) => {}
            Ok(Some(_)) => panic!("nothing was sent"),
            Err(e) => break e,
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "test ignored its deadline"
        );
    };
    assert!(
        matches!(err, nccl_net_fabricoll::Error::Timeout(_)),
        "{err}"
    );
    d.close_send(s).unwrap();
    d.close_recv(r).unwrap();
    assert_eq!(d.live(), (0, 1, 0, 0));
}

//! The net plugin's striped path (`FABRICOLL_NET_STREAMS` > 1) over libfabric's tcp and net
//! providers, two plugin instances in one process: byte-exact messages from 0 B to 64 MiB with
//! uneven splits and receives larger than the message, order under 128 messages in flight,
//! peers with different stream counts, and a peer that goes away mid-message.
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::plugin::net::{Device, Finished};
use nccl_net_fabricoll::plugin::{Plugin, NCCL_PTR_HOST};
use nccl_net_fabricoll::transport::Region;
use std::time::{Duration, Instant};

fn plugin(provider: &str, streams: &str, timeout_ms: &str) -> Option<Plugin> {
    let env = [
        ("FABRICOLL_PROVIDER", provider),
        ("FABRICOLL_DOMAIN", "lo"),
        ("FABRICOLL_TIMEOUT_MS", timeout_ms),
        ("FABRICOLL_NET_STREAMS", streams),
    ];
    let cfg = Config::from_lookup(|n| {
        env.iter()
            .find(|(k, _)| *k == n)
            .map(|(_, v)| v.to_string())
    })
    .expect("valid test configuration");
    match Plugin::discover(&cfg) {
        Ok(p) => Some(p),
        Err(e) => {
            nccl_net_fabricoll::testing::skip(
                &format!("net_stripe_{provider}"),
                &format!("no {provider} device on lo: {e}"),
            );
            None
        }
    }
}

fn region(v: &mut [u8]) -> Region {
    // SAFETY: every buffer outlives the requests posted on it (each test waits for them).
    unsafe { Region::from_raw(v.as_mut_ptr(), v.len()) }
}

/// A send comm on `a` connected to a receive comm on `b`, both polled from this thread.
fn pair(a: &Device, b: &Device) -> (u64, u64) {
    let (mut handle, listen) = b.listen().unwrap();
    let (mut s, mut r) = (None, None);
    let start = Instant::now();
    while s.is_none() || r.is_none() {
        if s.is_none() {
            s = a.connect(&mut handle).unwrap();
        }
        if r.is_none() {
            r = b.accept(listen).unwrap();
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "connection setup hung"
        );
    }
    b.close_listen(listen).unwrap();
    (s.unwrap(), r.unwrap())
}

/// Poll both requests (each on its device) until both are done.
fn wait_both(a: &Device, sq: u64, b: &Device, rq: u64) -> (Finished, Finished) {
    let (mut fs, mut fr) = (None, None);
    let start = Instant::now();
    while fs.is_none() || fr.is_none() {
        if fs.is_none() {
            fs = a.test(sq).unwrap();
        }
        if fr.is_none() {
            fr = b.test(rq).unwrap();
        }
        assert!(start.elapsed() < Duration::from_secs(60), "request hung");
    }
    (fs.unwrap(), fr.unwrap())
}

/// Threads of this process named as the stripe helpers are (`fabricoll-stripe<i>`).
fn stripe_threads() -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with("fabricoll-strip"))
        .count()
}

fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i * 131 + seed * 7 + i / 4099) as u8)
        .collect()
}

/// One message of `size` bytes into a receive of `cap` bytes, checked byte for byte.
fn one(a: &Device, s: u64, b: &Device, r: u64, size: usize, cap: usize, tag: i32) {
    let mut src = pattern(size, cap);
    let mut dst = vec![0xeeu8; cap];
    let smr = a.reg_mr(s, region(&mut src), NCCL_PTR_HOST).unwrap();
    let rmr = b.reg_mr(r, region(&mut dst), NCCL_PTR_HOST).unwrap();
    let rq = b
        .irecv(r, &[(region(&mut dst), tag, rmr)])
        .unwrap()
        .unwrap();
    let sq = a.isend(s, region(&mut src), tag, smr).unwrap().unwrap();
    let (fs, fr) = wait_both(a, sq, b, rq);
    assert_eq!(fs.sizes[0], size, "send size");
    assert_eq!(fr.sizes[0], size, "received size of a {size}-byte message");
    assert!(dst[..size] == src[..], "payload of {size} bytes into {cap}");
    assert!(
        dst[size..].iter().all(|&x| x == 0xee),
        "bytes past {size} written"
    );
    a.dereg_mr(s, smr).unwrap();
    b.dereg_mr(r, rmr).unwrap();
}

fn byte_exact(provider: &str) {
    let (Some(pa), Some(pb)) = (
        plugin(provider, "4", "20000"),
        plugin(provider, "4", "20000"),
    ) else {
        return;
    };
    let (a, b) = (&pa.devices[0], &pb.devices[0]);
    let (s, r) = pair(a, b);
    // Both sides run 3 helpers: the striped path is really taken (a provider that needs
    // registered memory would have fallen back to one endpoint). A new thread names itself
    // once it runs: wait for that.
    let start = Instant::now();
    while stripe_threads() < 6 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        stripe_threads() >= 6,
        "{} stripe helper threads",
        stripe_threads()
    );
    let mib = 1 << 20;
    for (size, extra) in [
        (0, 0),
        (0, 100),
        (1, 0),
        (4095, 9),
        ((256 << 10) - 1, 0),
        (256 << 10, 3),
        ((300 << 10) + 5, 4096),
        (mib - 1, 0),
        (mib, 0),
        (mib + 1, 4096 * 5 + 3),
        (3 * mib + 17, 0),
        (3 * mib + 17, mib),
        (8 * mib + 4097, 1),
        (64 * mib, 0),
        (64 * mib - 4095, 8 * mib),
    ] {
        one(a, s, b, r, size, size + extra, 5);
    }
    a.close_send(s).unwrap();
    b.close_recv(r).unwrap();
}

#[test]
fn byte_exact_tcp() {
    byte_exact("tcp");
}

#[test]
fn byte_exact_net() {
    byte_exact("net");
}

/// 128 messages in flight on one tag, half of them striped, each into its own receive.
fn in_order(provider: &str) {
    let (Some(pa), Some(pb)) = (
        plugin(provider, "3", "20000"),
        plugin(provider, "3", "20000"),
    ) else {
        return;
    };
    let (a, b) = (&pa.devices[0], &pb.devices[0]);
    let (s, r) = pair(a, b);
    let size = |i: usize| {
        if i.is_multiple_of(2) {
            (1 << 20) + 4096 * i + i
        } else {
            100 + i
        }
    };
    let mut srcs: Vec<Vec<u8>> = (0..128).map(|i| pattern(size(i), i)).collect();
    let mut dsts: Vec<Vec<u8>> = (0..128).map(|i| vec![0u8; size(i) + 64]).collect();
    let rqs: Vec<u64> = dsts
        .iter_mut()
        .map(|d| b.irecv(r, &[(region(d), 7, 0)]).unwrap().unwrap())
        .collect();
    let sqs: Vec<u64> = srcs
        .iter_mut()
        .map(|m| a.isend(s, region(m), 7, 0).unwrap().unwrap())
        .collect();
    for (i, (sq, rq)) in sqs.into_iter().zip(rqs).enumerate() {
        let (_, fr) = wait_both(a, sq, b, rq);
        assert_eq!(fr.sizes[0], size(i), "message {i}");
        assert!(
            dsts[i][..size(i)] == srcs[i][..],
            "message {i} out of order or corrupt"
        );
    }
    a.close_send(s).unwrap();
    b.close_recv(r).unwrap();
}

#[test]
fn many_in_flight_keep_order_tcp() {
    in_order("tcp");
}

#[test]
fn many_in_flight_keep_order_net() {
    in_order("net");
}

/// Peers set to different stream counts stripe over as many as both have.
#[test]
fn mismatched_stream_counts_work() {
    for provider in ["net", "tcp"] {
        for (x, y) in [("4", "2"), ("1", "4"), ("3", "1")] {
            let (Some(pa), Some(pb)) = (plugin(provider, x, "20000"), plugin(provider, y, "20000"))
            else {
                return;
            };
            let (a, b) = (&pa.devices[0], &pb.devices[0]);
            let (s, r) = pair(a, b);
            one(a, s, b, r, (9 << 20) + 13, 10 << 20, 1);
            let (s2, r2) = pair(b, a);
            one(b, s2, a, r2, (9 << 20) + 13, (9 << 20) + 13, 2);
        }
    }
}

/// A receiver that goes away in the middle of striped messages: the sender's requests end in
/// an error within the deadline, not a hang.
#[test]
fn a_vanished_peer_fails_within_the_deadline() {
    let (Some(pa), Some(pb)) = (plugin("net", "4", "3000"), plugin("net", "4", "3000")) else {
        return;
    };
    let a = &pa.devices[0];
    let (s, r) = pair(a, &pb.devices[0]);
    let _ = r;
    // Striped sends in flight, no receive posted: their pieces wait on the helpers.
    let mut src = pattern(32 << 20, 1);
    let inflight: Vec<u64> = (0..4)
        .filter_map(|_| a.isend(s, region(&mut src), 1, 0).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    pb.devices[0].close_all(); // closes the receiver's endpoints, helpers included
    drop(pb);
    let start = Instant::now();
    for q in inflight {
        // Each one ends, in success (the data had left) or an error, within the deadline.
        while let Ok(None) = a.test(q) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "an in-flight send hung"
            );
        }
    }
    let mut failed = None;
    'outer: while start.elapsed() < Duration::from_secs(30) {
        let q = match a.isend(s, region(&mut src), 1, 0) {
            Ok(Some(q)) => q,
            Ok(None) => continue,
            Err(e) => {
                failed = Some(e);
                break;
            }
        };
        loop {
            match a.test(q) {
                Ok(None) => {}
                Ok(Some(_)) => break,
                Err(e) => {
                    failed = Some(e);
                    break 'outer;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "a send hung past its deadline"
            );
        }
    }
    let e = failed.expect("sends to a vanished peer kept succeeding");
    assert!(start.elapsed() < Duration::from_secs(30));
    eprintln!("the sender's error: {e}");
}

//! Remote memory access between two processes, as the Neuron plugin's peers use it: this test
//! runs itself again as the target process, which registers a buffer and hands its address,
//! key and endpoint address over its stdout; this process writes, injects and reads there over
//! every provider whose plugin endpoints offer RMA, and the target checks what arrived.
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::testing::skip;
use nccl_net_fabricoll::transport::fabric::{discover, FabricTransport, Use};
use nccl_net_fabricoll::transport::{Completion, Posted, Region, Transport};
use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

mod common;

const CHILD: &str = "FABRICOLL_RMA_TEST_TARGET";
const DEADLINE: Duration = Duration::from_secs(30);
/// The target's buffer, its registration (at an odd offset, sub-page at both ends), and where
/// the initiator writes, injects and reads inside it.
const BUF: usize = (1 << 20) + 4096;
const REG: (usize, usize) = (3, (1 << 20) + 17);
const WRITE: (usize, usize) = (100, 64 << 10);
const INJECT: (usize, usize) = (70_000, 64);
const READ: (usize, usize) = (200_000, 4096);

/// A plugin endpoint of `provider` with RMA, or None after saying why (`testing::skip`: every
/// provider tried offers RMA on the libfabric this suite runs on, so a missing one fails under
/// strict mode instead of dropping out without a word).
fn endpoint(provider: &str) -> Option<FabricTransport> {
    let cfg = Config::from_lookup(|n| match n {
        "FABRICOLL_PROVIDER" => Some(provider.into()),
        "FABRICOLL_DOMAIN" if provider != "shm" => Some("lo".into()),
        _ => None,
    })
    .expect("config");
    let test = format!("rma_between_processes [{provider}]");
    let disc = match discover(&cfg, Use::Plugin) {
        Ok(d) => d,
        Err(e) => {
            skip(&test, &format!("no {provider} here ({e})"));
            return None;
        }
    };
    let Some(dev) = disc.devices.first().filter(|d| d.caps.rma_caps.is_some()) else {
        skip(&test, &format!("{provider}: no device with RMA"));
        return None;
    };
    Some(FabricTransport::open(dev).expect("endpoint"))
}

fn before(i: usize) -> u8 {
    (i * 7 + 1) as u8
}

fn written(i: usize) -> u8 {
    (i * 13 + 5) as u8
}

/// The target process (run only by `rma_between_processes`): register, say where, progress
/// until told the initiator is done, then check every byte.
#[test]
#[ignore = "the target of rma_between_processes, which starts it; alone it has nothing to run"]
fn rma_target_process() {
    let Ok(provider) = std::env::var(CHILD) else {
        return;
    };
    let t = endpoint(&provider).expect("the target's endpoint");
    let mut buf: Vec<u8> = (0..BUF).map(before).collect();
    // SAFETY: buf outlives the registration and every operation on it (this function waits).
    let reg = unsafe { Region::from_raw(buf.as_mut_ptr().add(REG.0), REG.1) };
    let mr = t.register_remote(reg).expect("register");
    println!(
        "@@ {:x} {:x} {}",
        buf.as_ptr() as u64,
        mr.key.expect("key"),
        common::hex(&t.address())
    );
    std::io::stdout().flush().expect("flush");
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().lock().read_line(&mut line);
        d.store(true, Ordering::Release);
    });
    let start = Instant::now();
    let mut sink = Vec::new();
    while !done.load(Ordering::Acquire) {
        t.poll(&mut sink).expect("poll");
        assert!(start.elapsed() < DEADLINE, "the initiator never finished");
        std::thread::sleep(Duration::from_micros(50));
    }
    // Let an inject still on its way land.
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_millis(200) {
        t.poll(&mut sink).expect("poll");
    }
    // SAFETY: read through the pointer: the peer wrote behind the compiler's back.
    let now: Vec<u8> = (0..BUF)
        .map(|i| unsafe { std::ptr::read_volatile(buf.as_ptr().add(i)) })
        .collect();
    let want = |i: usize| {
        let inside = |(o, n): (usize, usize)| i >= o && i < o + n;
        if inside(WRITE) {
            written(i)
        } else if inside(INJECT) {
            written(i) ^ 0xff
        } else {
            before(i)
        }
    };
    let bad = (0..BUF).find(|&i| now[i] != want(i));
    drop(mr);
    match bad {
        None => println!("@@ ok"),
        Some(i) => println!("@@ byte {i} is {} instead of {}", now[i], want(i)),
    }
}

/// Post until queued and wait for `op`'s completion, progressing `t`.
fn finish(t: &FabricTransport, op: u64, mut post: impl FnMut() -> Posted) -> Completion {
    let start = Instant::now();
    let mut out = Vec::new();
    while post() == Posted::Busy {
        t.poll(&mut out).expect("poll");
        assert!(start.elapsed() < DEADLINE, "op {op} stays busy");
    }
    loop {
        t.poll(&mut out).expect("poll");
        if let Some(i) = out.iter().position(|c| c.op == op) {
            return out.remove(i);
        }
        assert!(start.elapsed() < DEADLINE, "no completion for op {op}");
    }
}

/// One provider: the target process, and this one writing, injecting and reading there.
fn across(provider: &str) -> bool {
    let Some(t) = endpoint(provider) else {
        return false;
    };
    let mut kid = common::ignored_test("rma_target_process")
        .env(CHILD, provider)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the target");
    let (tx, rx) = mpsc::channel();
    let out = kid.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
            // The harness may have started the line ("test rma_target_process ... ").
            if let Some(at) = line.find("@@ ") {
                let _ = tx.send(line[at + 3..].to_string());
            }
        }
    });
    let hello = rx.recv_timeout(DEADLINE).expect("the target's address");
    let f: Vec<&str> = hello.split(' ').collect();
    let base = u64::from_str_radix(f[0], 16).expect("address");
    let key = u64::from_str_radix(f[1], 16).expect("key");
    let peer = t
        .insert_peer(&common::unhex(f[2]))
        .expect("insert the target");
    let mut src: Vec<u8> = (WRITE.0..WRITE.0 + WRITE.1).map(written).collect();
    // SAFETY: src outlives the write, which `finish` waits for.
    let r = unsafe { Region::from_raw(src.as_mut_ptr(), src.len()) };
    let c = finish(&t, 1, || {
        t.write(peer, r, 0, base + WRITE.0 as u64, key, 1)
            .expect("write")
    });
    assert!(c.status.is_ok(), "{provider}: write {:?}", c.status);
    let inj: Vec<u8> = (INJECT.0..INJECT.0 + INJECT.1)
        .map(|i| written(i) ^ 0xff)
        .collect();
    let start = Instant::now();
    while t
        .write_inject(peer, &inj, base + INJECT.0 as u64, key)
        .expect("inject")
        == Posted::Busy
    {
        t.poll(&mut Vec::new()).expect("poll");
        assert!(start.elapsed() < DEADLINE, "{provider}: inject stays busy");
    }
    let mut back = vec![0u8; READ.1];
    // SAFETY: back outlives the read, which `finish` waits for.
    let r = unsafe { Region::from_raw(back.as_mut_ptr(), back.len()) };
    let c = finish(&t, 2, || {
        t.read(peer, r, 0, base + READ.0 as u64, key, 2)
            .expect("read")
    });
    assert!(c.status.is_ok(), "{provider}: read {:?}", c.status);
    let want: Vec<u8> = (READ.0..READ.0 + READ.1).map(before).collect();
    assert!(back == want, "{provider}: the bytes read differ");
    // Progress a while so that the inject leaves, then let the target check.
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_millis(100) {
        t.poll(&mut Vec::new()).expect("poll");
    }
    let mut stdin = kid.stdin.take().expect("stdin");
    writeln!(stdin, "done").expect("tell the target");
    let verdict = rx.recv_timeout(DEADLINE).expect("the target's verdict");
    let start = Instant::now();
    while kid.try_wait().expect("wait").is_none() {
        assert!(
            start.elapsed() < DEADLINE,
            "{provider}: the target does not exit"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(verdict, "ok", "{provider}: the target found");
    true
}

#[test]
fn rma_between_processes() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    let mut ran = 0;
    for p in ["shm", "net", "tcp;ofi_rxm"] {
        if across(p) {
            eprintln!("{p}: RMA between processes checked");
            ran += 1;
        }
    }
    if ran == 0 {
        skip("rma_between_processes", "no provider here offers RMA");
    }
}

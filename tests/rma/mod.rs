//! What the RMA tests share: the providers tried, two plugin endpoints of one, and posting a
//! write or read and waiting for it with a deadline.
#![allow(dead_code)] // not every test binary uses each helper
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::testing::skip;
use nccl_net_fabricoll::transport::fabric::{answers, discover, FabricTransport, Use};
use nccl_net_fabricoll::transport::{Completion, Peer, Posted, Region, Transport};
use std::time::{Duration, Instant};

pub const DEADLINE: Duration = Duration::from_secs(20);

/// The providers tried, with the domain each runs on here: `net` is the native TCP endpoint on
/// every libfabric (`tcp` from 1.18), `tcp;ofi_rxm` the layered one.
pub const PROVIDERS: [(&str, Option<&str>); 3] = [
    ("shm", None),
    ("net", Some("lo")),
    ("tcp;ofi_rxm", Some("lo")),
];

pub fn config(provider: &str, domain: Option<&str>) -> Config {
    Config::from_lookup(|n| match n {
        "FABRICOLL_PROVIDER" => Some(provider.into()),
        "FABRICOLL_DOMAIN" => domain.map(String::from),
        _ => None,
    })
    .expect("config")
}

/// Two plugin endpoints of `provider` whose domain offers RMA, or None, after saying why
/// (`testing::skip` for `test` over that provider: each of `PROVIDERS` offers RMA on the
/// libfabric this suite runs on, docs/providers.md, so a missing one fails under strict mode
/// rather than dropping out without a word).
pub fn rma_pair(
    test: &str,
    provider: &str,
    domain: Option<&str>,
) -> Option<(FabricTransport, FabricTransport)> {
    let missing = |why: String| {
        skip(&format!("{test} [{provider}]"), &why);
        None
    };
    let disc = match discover(&config(provider, domain), Use::Plugin) {
        Ok(d) => d,
        Err(e) => return missing(format!("no {provider} here ({e})")),
    };
    if !disc.chosen.as_deref().is_some_and(|c| answers(c, provider)) {
        let chosen = disc.chosen.as_deref();
        return missing(format!("{provider} asked for, {chosen:?} found"));
    }
    let Some(dev) = disc.devices.first() else {
        return missing(format!("{provider}: no device"));
    };
    if dev.caps.rma_caps.is_none() {
        return missing(format!("{provider}: its domain offers no usable RMA"));
    }
    let a = FabricTransport::open(dev).expect("endpoint a");
    let b = FabricTransport::open(dev).expect("endpoint b");
    Some((a, b))
}

pub fn region(v: &mut [u8]) -> Region {
    // SAFETY: every buffer outlives the operations posted on it (each test waits for them).
    unsafe { Region::from_raw(v.as_mut_ptr(), v.len()) }
}

/// Poll `a` and `b` until `a` has the completion of `op`.
pub fn wait_op(a: &dyn Transport, b: &dyn Transport, op: u64, what: &str) -> Completion {
    let start = Instant::now();
    let (mut out, mut sink) = (Vec::new(), Vec::new());
    loop {
        a.poll(&mut out).expect("poll a");
        b.poll(&mut sink).expect("poll b");
        assert!(sink.is_empty(), "{what}: the target saw {sink:?}");
        if let Some(i) = out.iter().position(|c| c.op == op) {
            let c = out.remove(i);
            assert!(out.is_empty(), "{what}: more completions {out:?}");
            return c;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{what}: no completion for op {op}"
        );
    }
}

/// The initiator `a`, the target `b`, and `b` as `a` knows it.
pub struct Ends<'t> {
    pub a: &'t dyn Transport,
    pub b: &'t dyn Transport,
    pub to_b: Peer,
}

impl Ends<'_> {
    /// Progress both ends once; their completions go to `sink`.
    pub fn progress(&self, sink: &mut Vec<Completion>) {
        self.a.poll(sink).expect("poll a");
        self.b.poll(sink).expect("poll b");
    }

    /// `write_inject`, retried while busy: its result once not busy.
    pub fn inject(&self, src: &[u8], addr: u64, key: u64) -> nccl_net_fabricoll::Result<Posted> {
        let start = Instant::now();
        loop {
            match self.a.write_inject(self.to_b, src, addr, key) {
                Ok(Posted::Busy) => {
                    self.progress(&mut Vec::new());
                    assert!(start.elapsed() < DEADLINE, "inject stays busy");
                }
                other => return other,
            }
        }
    }

    /// After an operation with a bad key or out of bounds: libfabric 1.17's `net` and
    /// `tcp;ofi_rxm` close the connection (like an RDMA queue pair going to error), so the
    /// operations after it may fail (cancelled, not connected) until the provider reconnects.
    /// Read 1 byte at `addr` with `key` until that succeeds, within the deadline: the number of
    /// reads that failed.
    pub fn settle(&self, addr: u64, key: u64, op: u64) -> usize {
        let start = Instant::now();
        let mut failed = 0;
        loop {
            let mut one = [0u8];
            // SAFETY: `one` outlives the read, which `rma` waits for.
            let r = unsafe { Region::from_raw(one.as_mut_ptr(), 1) };
            if self.rma(false, r, 0, addr, key, op).status.is_ok() {
                return failed;
            }
            failed += 1;
            std::thread::sleep(Duration::from_millis(1));
            assert!(
                start.elapsed() < DEADLINE,
                "{}: the peer stays unreachable after a bad operation",
                self.a.caps().provider
            );
        }
    }

    /// Post (retrying while busy) a write or read and wait for its completion.
    pub fn rma(
        &self,
        write: bool,
        buf: Region,
        desc: usize,
        addr: u64,
        key: u64,
        op: u64,
    ) -> Completion {
        let (a, to_b) = (self.a, self.to_b);
        let what = format!(
            "{} {} {} bytes at {addr:#x}",
            a.caps().provider,
            if write { "write" } else { "read" },
            buf.len()
        );
        let start = Instant::now();
        loop {
            let posted = if write {
                a.write(to_b, buf, desc, addr, key, op)
            } else {
                a.read(to_b, buf, desc, addr, key, op)
            };
            match posted {
                Ok(Posted::Queued) => break,
                Ok(Posted::Busy) => {
                    let mut sink = Vec::new();
                    self.progress(&mut sink);
                    assert!(sink.is_empty(), "{what}: {sink:?}");
                    assert!(start.elapsed() < DEADLINE, "{what}: stays busy");
                }
                Err(e) => return Completion::failed(op, 0, e),
            }
        }
        wait_op(a, self.b, op, &what)
    }
}

/// The bytes of `v` as they are now: a peer may write them behind the compiler's back.
pub fn volatile_copy(v: &[u8]) -> Vec<u8> {
    // SAFETY: each pointer is inside `v`, valid for reads.
    v.iter()
        .map(|b| unsafe { std::ptr::read_volatile(b) })
        .collect()
}

pub fn pattern(n: usize, seed: usize) -> Vec<u8> {
    (0..n).map(|i| ((i * 31 + seed * 7) % 251) as u8).collect()
}

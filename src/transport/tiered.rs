//! One transport over two fabrics: `intra` reaches the peers of this host (shared memory by
//! default), `inter` the peers on other hosts (the network provider). A peer's address says
//! which host it is on (`placement::host_key`), so `insert_peer` decides once, and the `Peer`
//! it returns carries the choice in its top bit: every later call routes in O(1).
//!
//! Receives name their sender (`recv_from`) and go to its fabric. A receive without one
//! (`recv`, `recv_owned`: the executor's watch for notices) is posted on both; the first
//! completion wins, the other receive is cancelled and its completion swallowed. The race:
//! if messages for it arrive on both fabrics before the cancel lands, the second message is
//! consumed by the cancelled receive and lost. The only such receive of the engines watches
//! for notices that the calls differ, where any one notice fails the collective, so a second
//! one lost changes nothing. An operation id of a receive without a sender must not be reused
//! before both of its completions came back (one delivered, one swallowed). Such a receive
//! into a region lands in a buffer of each fabric and is copied into the region by the poll
//! that delivers it (two fabrics must not write one region), so it takes no registration.
//!
//! `wait` sleeps in one poll(2) on both fabrics' wait fds; where either has none (shm's
//! fastbox raises no completion) it yields, as that fabric alone would.
use super::{Caps, Completion, Mr, OpId, Peer, Posted, Region, Transport, WaitObject};
use crate::error::{Error, Result};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The bit of a `Peer` that says it is reached over the inter-host fabric.
const INTER: u64 = 1 << 63;

/// First byte of a tiered address: its format's version (0 is no valid address of ours).
const VERSION: u8 = 1;

/// Which of the two fabrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// Between ranks of this host.
    Intra,
    /// Between hosts.
    Inter,
}

impl Level {
    /// The fabric that reaches `peer` (a `Peer` of a `Tiered` transport).
    pub fn of(peer: Peer) -> Level {
        if peer.0 & INTER != 0 {
            Level::Inter
        } else {
            Level::Intra
        }
    }
}

/// A receive posted on both fabrics (no sender given).
struct Dual {
    /// Where the message goes (`recv`); None for `recv_owned`, whose buffer comes back.
    region: Option<Region>,
    /// One completion was delivered: the other is swallowed.
    delivered: bool,
}

/// The registrations of one region on each fabric that needs one (`Caps::mr_local`).
struct Pair {
    intra: Option<Mr>,
    inter: Option<Mr>,
}

/// Peers of this host over `intra`, the others over `inter`.
pub struct Tiered {
    intra: Arc<dyn Transport>,
    inter: Arc<dyn Transport>,
    host: u64,
    addr: Vec<u8>,
    caps: Caps,
    duals: Mutex<FxHashMap<OpId, Dual>>,
    /// How many entries `duals` holds, read without its lock on every poll.
    live_duals: AtomicUsize,
}

/// A tiered address: version, host key, then each fabric's address with its length.
pub fn encode_address(host: u64, intra: &[u8], inter: &[u8]) -> Result<Vec<u8>> {
    let mut a = Vec::with_capacity(13 + intra.len() + inter.len());
    a.push(VERSION);
    a.extend_from_slice(&host.to_le_bytes());
    for part in [intra, inter] {
        let len = u16::try_from(part.len())
            .map_err(|_| Error::Internal(format!("fabric address of {} bytes", part.len())))?;
        a.extend_from_slice(&len.to_le_bytes());
        a.extend_from_slice(part);
    }
    Ok(a)
}

/// The host key and the two fabrics' addresses of a tiered address.
pub fn decode_address(a: &[u8]) -> Result<(u64, &[u8], &[u8])> {
    let bad = || {
        Error::InvalidArgument(format!(
            "a peer address of {} bytes is not one of a transport over two fabrics (version {VERSION}): do all ranks set the same FABRICOLL_INTRA_PROVIDER?",
            a.len()
        ))
    };
    if a.first() != Some(&VERSION) || a.len() < 13 {
        return Err(bad());
    }
    let host = u64::from_le_bytes(a[1..9].try_into().expect("8 bytes"));
    let mut rest = &a[9..];
    let mut part = || -> Option<&[u8]> {
        let len = u16::from_le_bytes(rest.get(..2)?.try_into().ok()?) as usize;
        let p = rest.get(2..2 + len)?;
        rest = &rest[2 + len..];
        Some(p)
    };
    let (intra, inter) = (part().ok_or_else(bad)?, part().ok_or_else(bad)?);
    if !rest.is_empty() {
        return Err(bad());
    }
    Ok((host, intra, inter))
}

impl Tiered {
    /// A transport over `intra` (peers whose host key is `host`) and `inter` (the others).
    pub fn new(host: u64, intra: Arc<dyn Transport>, inter: Arc<dyn Transport>) -> Result<Tiered> {
        let addr = encode_address(host, &intra.address(), &inter.address())?;
        let (i, e) = (intra.caps(), inter.caps());
        let caps = Caps {
            wait_fd: i.wait_fd && e.wait_fd,
            direct_channel: i.direct_channel,
            mr_local: i.mr_local || e.mr_local,
            // Device memory goes where both fabrics take it (`register_device` on each).
            hmem: i.hmem && e.hmem,
            max_msg_size: i.max_msg_size.min(e.max_msg_size),
            close_loses: i.close_loses || e.close_loses,
            reads_local_peers: i.reads_local_peers || e.reads_local_peers,
            // Each fabric answers `peer_gone` for its own peers.
            socket_addresses: false,
            intra: Some(Arc::new(i.clone())),
            // RMA is not routed over two fabrics: the trait's defaults refuse it.
            rma_caps: None,
            ..e.clone()
        };
        Ok(Tiered {
            intra,
            inter,
            host,
            addr,
            caps,
            duals: Mutex::new(FxHashMap::default()),
            live_duals: AtomicUsize::new(0),
        })
    }

    /// The fabric of `peer` and the peer as that fabric knows it.
    #[inline]
    fn route(&self, peer: Peer) -> (&dyn Transport, Peer) {
        if peer.0 & INTER != 0 {
            (&*self.inter, Peer(peer.0 & !INTER))
        } else {
            (&*self.intra, peer)
        }
    }

    /// The registration of `mr` on the fabric `level` (a `Pair` of ours, else `mr` itself).
    fn mr_on(mr: Option<&Mr>, level: Level) -> Option<&Mr> {
        let m = mr?;
        match m.keep.as_ref().and_then(|k| k.downcast_ref::<Pair>()) {
            Some(p) => match level {
                Level::Intra => p.intra.as_ref(),
                Level::Inter => p.inter.as_ref(),
            },
            None => Some(m),
        }
    }

    /// Post a receive without a sender on both fabrics, as owned receives of `len` bytes.
    fn post_dual(
        &self,
        tag: u64,
        ignore: u64,
        len: usize,
        region: Option<Region>,
        op: OpId,
    ) -> Result<()> {
        {
            let mut d = self.duals.lock();
            if d.contains_key(&op) {
                return Err(Error::Internal(format!(
                    "receive {op:#x} without a sender reposted before its completions came back"
                )));
            }
            d.insert(
                op,
                Dual {
                    region,
                    delivered: false,
                },
            );
            self.live_duals.store(d.len(), Ordering::Release);
        }
        let undo = |e: Error| {
            let mut d = self.duals.lock();
            d.remove(&op);
            self.live_duals.store(d.len(), Ordering::Release);
            e
        };
        self.intra.recv_owned(tag, ignore, len, op).map_err(undo)?;
        if let Err(e) = self.inter.recv_owned(tag, ignore, len, op) {
            // The intra receive completes cancelled: swallow it.
            if let Some(d) = self.duals.lock().get_mut(&op) {
                d.delivered = true;
            }
            self.intra.cancel(op);
            return Err(e);
        }
        Ok(())
    }

    /// Deliver the first completion of each receive posted on both fabrics and swallow the
    /// second; `out[start..mid]` came from `intra`, `out[mid..]` from `inter`.
    fn sift(&self, out: &mut Vec<Completion>, start: usize, mid: usize) {
        let mut d = self.duals.lock();
        let mut i = start;
        let mut mid = mid;
        while i < out.len() {
            let from = if i < mid { Level::Intra } else { Level::Inter };
            let Some(dual) = d.get_mut(&out[i].op) else {
                i += 1;
                continue;
            };
            if dual.delivered {
                let c = out.remove(i);
                if i < mid {
                    mid -= 1;
                }
                if c.status.is_ok() {
                    log::debug!(
                        "a message for receive {:#x} (tag {:#x}) arrived on both fabrics: the second was dropped",
                        c.op,
                        c.tag
                    );
                }
                d.remove(&c.op);
                continue;
            }
            dual.delivered = true;
            let c = &mut out[i];
            if let Some(r) = dual.region {
                if let Some(data) = c.data.take() {
                    r.write(&data[..data.len().min(r.len())]);
                }
            }
            let other: &dyn Transport = match from {
                Level::Intra => &*self.inter,
                Level::Inter => &*self.intra,
            };
            other.cancel(c.op);
            i += 1;
        }
        self.live_duals.store(d.len(), Ordering::Release);
    }
}

impl Transport for Tiered {
    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn caps_to(&self, peer: Peer) -> &Caps {
        match (Level::of(peer), &self.caps.intra) {
            (Level::Intra, Some(c)) => c,
            _ => &self.caps,
        }
    }

    fn address(&self) -> Vec<u8> {
        self.addr.clone()
    }

    fn insert_peer(&self, addr: &[u8]) -> Result<Peer> {
        let (host, intra, inter) = decode_address(addr)?;
        let (t, a, bit) = if host == self.host {
            (&self.intra, intra, 0)
        } else {
            (&self.inter, inter, INTER)
        };
        let p = t.insert_peer(a)?;
        if p.0 & INTER != 0 {
            return Err(Error::Internal(format!(
                "{} gave a peer handle with the top bit set ({:#x})",
                t.caps().provider,
                p.0
            )));
        }
        log::debug!(
            "peer {:#x} on {} host: over {}",
            p.0 | bit,
            if bit == 0 { "this" } else { "another" },
            t.caps().provider
        );
        Ok(Peer(p.0 | bit))
    }

    fn register(&self, region: Region) -> Result<Mr> {
        let on = |t: &Arc<dyn Transport>| -> Result<Option<Mr>> {
            if t.caps().mr_local {
                t.register(region).map(Some)
            } else {
                Ok(None)
            }
        };
        let pair = Pair {
            intra: on(&self.intra)?,
            inter: on(&self.inter)?,
        };
        Ok(Mr {
            desc: 0,
            region,
            keep: Some(Box::new(pair)),
            key: None,
            device: None,
        })
    }

    /// On both fabrics: a send or receive through it goes to one or the other by its peer.
    fn register_device(&self, region: Region, ordinal: i32) -> Result<Mr> {
        let pair = Pair {
            intra: Some(self.intra.register_device(region, ordinal)?),
            inter: Some(self.inter.register_device(region, ordinal)?),
        };
        Ok(Mr {
            desc: 0,
            region,
            keep: Some(Box::new(pair)),
            key: None,
            device: Some(ordinal),
        })
    }

    fn send(
        &self,
        peer: Peer,
        tag: u64,
        region: Region,
        mr: Option<&Mr>,
        op: OpId,
    ) -> Result<Posted> {
        let (t, p) = self.route(peer);
        t.send(p, tag, region, Tiered::mr_on(mr, Level::of(peer)), op)
    }

    fn recv(
        &self,
        tag: u64,
        ignore: u64,
        region: Region,
        _mr: Option<&Mr>,
        op: OpId,
    ) -> Result<Posted> {
        self.post_dual(tag, ignore, region.len(), Some(region), op)
            .map(|()| Posted::Queued)
    }

    fn recv_from(
        &self,
        from: Peer,
        tag: u64,
        ignore: u64,
        region: Region,
        mr: Option<&Mr>,
        op: OpId,
    ) -> Result<Posted> {
        let (t, p) = self.route(from);
        t.recv_from(
            p,
            tag,
            ignore,
            region,
            Tiered::mr_on(mr, Level::of(from)),
            op,
        )
    }

    fn send_owned(&self, peer: Peer, tag: u64, data: Vec<u8>, op: OpId) -> Result<()> {
        let (t, p) = self.route(peer);
        t.send_owned(p, tag, data, op)
    }

    fn recv_owned(&self, tag: u64, ignore: u64, len: usize, op: OpId) -> Result<()> {
        self.post_dual(tag, ignore, len, None, op)
    }

    fn cancel(&self, op: OpId) {
        // Each fabric ignores an operation it does not have.
        self.intra.cancel(op);
        self.inter.cancel(op);
    }

    fn owner_waits(&self, on: bool) {
        self.intra.owner_waits(on);
        self.inter.owner_waits(on);
    }

    fn poll(&self, out: &mut Vec<Completion>) -> Result<usize> {
        let start = out.len();
        self.intra.poll(out)?;
        let mid = out.len();
        self.inter.poll(out)?;
        if self.live_duals.load(Ordering::Acquire) != 0 && out.len() > start {
            self.sift(out, start, mid);
        }
        Ok(out.len() - start)
    }

    /// Sleep on both fabrics' wait fds at once; where either has none (or would not sleep:
    /// shm's fastbox raises no completion), yield, as that fabric alone would.
    fn wait(&self, timeout: Duration) -> Result<()> {
        match self.fds() {
            (WaitObject::Fd(a), WaitObject::Fd(b)) => {
                let mut pfd = [a, b].map(|fd| libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
                let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as c_int;
                // SAFETY: pfd holds two valid pollfds; the fds belong to the fabrics' queues,
                // open while self lives.
                unsafe { libc::poll(pfd.as_mut_ptr(), 2, ms) };
            }
            (WaitObject::Ready, _) | (_, WaitObject::Ready) => {}
            _ => std::thread::yield_now(),
        }
        Ok(())
    }

    fn peer_gone(&self, peer: Peer, ask_address: bool) -> bool {
        let (t, p) = self.route(peer);
        t.peer_gone(p, ask_address)
    }

    fn direct_bytes(&self, peer: Peer) -> usize {
        let (t, p) = self.route(peer);
        t.direct_bytes(p)
    }

    fn send_now(&self, peer: Peer, tag: u64, data: &[u8]) -> Result<bool> {
        let (t, p) = self.route(peer);
        t.send_now(p, tag, data)
    }

    fn take_now(
        &self,
        peer: Peer,
        tag: u64,
        ignore: u64,
        f: &mut dyn FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<bool> {
        let (t, p) = self.route(peer);
        t.take_now(p, tag, ignore, f)
    }

    fn take_foreign(&self, peer: Peer, tag: u64, ignore: u64, compare: u64) -> Result<Option<u64>> {
        let (t, p) = self.route(peer);
        t.take_foreign(p, tag, ignore, compare)
    }
}

impl Tiered {
    /// Each fabric's wait object, the inter-host one asked only if the intra-host one could
    /// sleep (asking arms its queue's wait fd).
    fn fds(&self) -> (WaitObject, WaitObject) {
        match self.intra.wait_object() {
            WaitObject::Fd(a) => (WaitObject::Fd(a), self.inter.wait_object()),
            other => (other, WaitObject::Yield),
        }
    }
}

#[cfg(test)]
#[path = "tiered_tests.rs"]
mod tests;

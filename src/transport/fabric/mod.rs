//! libfabric backend: one RDM endpoint per device (libfabric domain), tagged messages,
//! memory registration that honours the provider's `mr_mode`, and a completion queue we can
//! sleep on. Every fid is closed by RAII.
//!
//! One file per concern: `discovery` (provider and domains), `names` (provider names across
//! libfabric versions), `fid` (RAII owners), `endpoint` (opening, peers, registration),
//! `route` (which path a send takes), `cq` (the completion queue), `shm` (the shared-memory
//! paths: software matching, fastbox, CMA rendezvous, direct channel, peer watch), `claim`
//! (the native TCP endpoint's stopped connections) and `tuning` (the capabilities filled in
//! per provider). This file holds the endpoint's state and the
//! `Transport` implementation.
mod claim;
mod cq;
mod discovery;
mod endpoint;
mod fid;
mod hmem;
mod names;
mod reach;
mod rma;
mod route;
mod shm;
pub mod sys;
mod tender;
#[cfg(test)]
mod testutil;
mod tuning;

pub use discovery::{
    discover, header_version, runtime_release, runtime_version, Discovery, FabricDevice, Use,
};
pub use names::{answers, native_tcp};

use super::{Caps, Completion, DmaBuf, Mr, OpId, Peer, Posted, Region, Transport};
use crate::error::{Error, Result};
use fid::DomainFids;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use shm::matching::SoftRecv;
use shm::ShmPath;
use std::collections::{HashMap, VecDeque};
use std::ffi::CStr;
use std::mem::ManuallyDrop;
use std::os::raw::{c_int, c_void};
use std::sync::Arc;
use std::time::Duration;

const FI_ADDR_UNSPEC: u64 = u64::MAX;

/// How long `peer_gone` waits for a socket peer's answer to its connection attempt: a refusal
/// comes within a round trip; a host that does not answer counts as not gone.
const REACH_WITHIN: std::time::Duration = std::time::Duration::from_millis(500);

/// libfabric's message for an error code.
fn strerror(rc: i64) -> String {
    let code = rc.unsigned_abs() as c_int;
    // SAFETY: fi_strerror returns a pointer to a static NUL-terminated string for any value.
    unsafe { CStr::from_ptr(sys::fi_strerror(code)) }
        .to_string_lossy()
        .into_owned()
}

/// `rc` as a Result: an error naming `what` when negative, of the kind its errno maps to
/// (`Error::from_errno`).
fn check(what: &str, rc: i64) -> Result<()> {
    if rc < 0 {
        Err(Error::from_errno(
            rc,
            format!("{what} failed: {} ({rc})", strerror(rc)),
        ))
    } else {
        Ok(())
    }
}

/// A C string of libfabric's, copied (empty for NULL).
fn cstr(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: libfabric strings in fi_info are NUL-terminated and live as long as the info.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// The buffer side of one operation.
struct OpBuf {
    addr: usize,
    len: usize,
    desc: usize,
    op: OpId,
    owned: Option<Vec<u8>>,
    /// Device memory (a `Transport::register_device` registration): only the provider may
    /// touch it.
    device: bool,
}

/// Per-operation context; libfabric owns `ctx` while the operation is in flight.
#[repr(C)]
struct OpCtx {
    ctx: sys::fi_context2,
    op: OpId,
    len: usize,
    recv: bool,
    owned: Option<Vec<u8>>,
    role: Role,
    /// What the operation is, for its errors ("send", "receive", "RMA write", "RMA read").
    what: &'static str,
}

/// What a completion means to us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// The caller's operation.
    User,
    /// A receive of the small-message pool (software matching).
    Pool,
    /// The provider half of a receive that also waits in the software matcher.
    Dual,
    /// A provider receive we cancelled ourselves: its completion is dropped.
    Swallow,
    /// A small message sent through the peer's pool: its framed buffer is reused.
    SmallSend,
    /// A peek for a message that stopped its connection (`claim`).
    Peek,
    /// The receive of a message a peek found (`claim`).
    Claim,
    /// A peek for a message that waits unexpected, while an shm endpoint settles before it
    /// closes (`shm::siblings`), or for another call's message (`shm::foreign`): what it
    /// finds is received whole and dropped.
    SettlePeek,
    /// A peek that only looks at a waiting message (`shm::foreign`): its tag and length are
    /// kept in `ShmPath::looked`.
    Look,
    /// The caller's zero-byte receive, posted with a one-byte buffer of ours: libfabric 2.1's
    /// native TCP endpoint never completes a zero-byte receive that a longer message matches,
    /// where it reports a one-byte one as truncated.
    Padded,
}

/// The endpoint's state, behind the transport's lock.
struct Inner {
    ep: *mut sys::fid_ep,
    /// The endpoint sends go out on: `ep`, or over the native TCP endpoint a second one
    /// (`sends_from`), so that each direction between two ranks has a connection of its own.
    tx_ep: *mut sys::fid_ep,
    cq: *mut sys::fid_cq,
    av: *mut sys::fid_av,
    dom: Arc<DomainFids>,
    /// Operations in flight, keyed by the address of their context.
    ops: FxHashMap<usize, Box<OpCtx>>,
    /// Completion entries read per `fi_cq_read` (kept: zeroing them per poll shows in profiles).
    entries: Vec<sys::fi_cq_tagged_entry>,
    peers: HashMap<Vec<u8>, u64>,
    /// Owned sends the provider refused with EAGAIN, retried on poll.
    backlog: VecDeque<(Peer, u64, Vec<u8>, OpId)>,
    /// Completions known without the CQ (injected sends).
    ready: Vec<Completion>,
    /// The contexts of RMA operations in flight, oldest first (`rma::take_ctx`).
    rma_order: VecDeque<usize>,
    /// The shm paths (software matching, fastbox, CMA rendezvous, direct channel, peer watch).
    shm: ShmPath,
    /// Messages that stopped a connection of the native TCP endpoint, claimed (`claim`);
    /// None for other providers.
    claims: Option<claim::Claims>,
    /// An error of the tender's progress (`tender`), for the owner's next poll.
    tended_error: Option<Error>,
}

// SAFETY: every libfabric object here is used only with the transport's Mutex held
// (FI_THREAD_DOMAIN), except the wait fd, which is only polled.
unsafe impl Send for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: the fids were opened by us and are closed once, endpoint first, then the
        // objects bound to it; `shm` forgets the region's name when it drops after this, and the
        // domain closes when the last Arc<DomainFids> goes.
        unsafe {
            if self.tx_ep != self.ep {
                sys::fi_close(self.tx_ep as *mut sys::fid);
            }
            sys::fi_close(self.ep as *mut sys::fid);
            sys::fi_close(self.cq as *mut sys::fid);
            sys::fi_close(self.av as *mut sys::fid);
        }
    }
}

/// One endpoint on one device.
pub struct FabricTransport {
    caps: Caps,
    addr: Vec<u8>,
    wait_fd: Option<c_int>,
    /// Taken out only when the transport drops (an shm endpoint may be parked:
    /// `shm::siblings`); shared with the tender only.
    inner: ManuallyDrop<Arc<Mutex<Inner>>>,
    /// Progresses the endpoint while its owner does not (`tender`); native TCP only.
    tender: Option<tender::Tender>,
}

impl Drop for FabricTransport {
    fn drop(&mut self) {
        // The tender's thread ends first: it holds the other reference to `inner`.
        self.tender = None;
        // SAFETY: `inner` is taken once, here, and the transport is not used afterwards.
        let shared = unsafe { ManuallyDrop::take(&mut self.inner) };
        let Ok(inner) = Arc::try_unwrap(shared) else {
            unreachable!("only the tender, now stopped, shares the endpoint's state");
        };
        let inner = inner.into_inner();
        match inner.shm.name.clone() {
            Some(name) => shm::siblings::release(&name, Box::new(inner)),
            None => drop(inner),
        }
    }
}

impl Inner {
    /// A context for a new operation, kept in `ops` until its completion is read.
    fn new_ctx(
        &mut self,
        op: OpId,
        len: usize,
        recv: bool,
        owned: Option<Vec<u8>>,
        role: Role,
    ) -> *mut c_void {
        let mut b = Box::new(OpCtx {
            ctx: sys::fi_context2::default(),
            op,
            len,
            recv,
            owned,
            role,
            what: if recv { "receive" } else { "send" },
        });
        let p = &mut *b as *mut OpCtx as *mut c_void;
        self.ops.insert(p as usize, b);
        p
    }

    /// A send that finished when it was posted (copied out): its completion is ready.
    fn sent_now(&mut self, op: OpId, len: usize, tag: u64) {
        self.ready.push(Completion::done(op, len, tag, None));
    }

    /// Post a receive: matched in software, served from claimed messages, or to the provider.
    fn post_recv(&mut self, tag: u64, ignore: u64, b: OpBuf) -> Result<Posted> {
        if self.shm.soft.is_some() {
            if b.device {
                // Software matching copies small messages on the CPU.
                return Err(Error::InvalidUsage(
                    "a receive into device memory on an shm endpoint that matches small \
                     messages in software (libfabric before 1.19)"
                        .into(),
                ));
            }
            return self.post_soft_recv(tag, ignore, b);
        }
        if self.claims_busy() && self.claimed_recv(SoftRecv::of(tag, ignore, &b)).is_none() {
            return Ok(Posted::Queued);
        }
        self.post_provider_recv(tag, ignore, b, Role::User)
            .map(|p| p.0)
    }

    /// Post a tagged receive to the provider; returns what happened and the context.
    fn post_provider_recv(
        &mut self,
        tag: u64,
        ignore: u64,
        b: OpBuf,
        role: Role,
    ) -> Result<(Posted, usize)> {
        let OpBuf {
            addr,
            len,
            desc,
            op,
            owned,
            ..
        } = b;
        let padded = len == 0 && owned.is_none() && role == Role::User && self.claims.is_some();
        let (addr, owned, role, post_len) = if padded {
            let pad = vec![0u8; 1];
            (pad.as_ptr() as usize, Some(pad), Role::Padded, 1)
        } else {
            (addr, owned, role, len)
        };
        let ctx = self.new_ctx(op, len, true, owned, role);
        // SAFETY: the buffer is valid until completion (Region's contract, or owned by ctx).
        let rc = unsafe {
            sys::fi_trecv(
                self.ep,
                addr as *mut c_void,
                post_len,
                desc as *mut c_void,
                FI_ADDR_UNSPEC,
                tag,
                ignore,
                ctx,
            )
        };
        if rc == 0 {
            return Ok((Posted::Queued, ctx as usize));
        }
        self.ops.remove(&(ctx as usize));
        if rc == -(sys::FI_EAGAIN as isize) {
            return Ok((Posted::Busy, 0));
        }
        check("fi_trecv", rc as i64)?;
        Ok((Posted::Busy, 0))
    }

    /// Everything `poll` does but the hand-over: completions are left in `ready`.
    fn progress(&mut self, caps: &Caps) -> Result<()> {
        if !self.backlog.is_empty() {
            self.drain_backlog(caps)?;
        }
        let mut entries = std::mem::take(&mut self.entries);
        let mut out = std::mem::take(&mut self.ready);
        let before = out.len();
        let r = self.read_cq(&mut entries, &mut out);
        self.entries = entries;
        // Pool messages matched meanwhile (`on_small`) pushed their completions to `ready`.
        out.append(&mut self.ready);
        let completed = out.len() > before;
        self.ready = out;
        r?;
        self.progress_claims(completed)?;
        for peer in std::mem::take(&mut self.shm.hellos) {
            self.hello(peer)?;
        }
        self.drain_inbox(caps);
        self.progress_rndv(caps);
        Ok(())
    }

    /// Post the owned sends that waited, in order, until the provider is busy again.
    fn drain_backlog(&mut self, caps: &Caps) -> Result<()> {
        while let Some((peer, tag, data, op)) = self.backlog.pop_front() {
            let (addr, len) = (data.as_ptr() as usize, data.len());
            let b = OpBuf {
                addr,
                len,
                desc: 0,
                op,
                owned: Some(data),
                device: false,
            };
            if self.post_send(caps, peer, tag, b)? == Posted::Busy {
                break; // the message is back at the front of the backlog
            }
        }
        Ok(())
    }
}

impl Transport for FabricTransport {
    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn address(&self) -> Vec<u8> {
        self.addr.clone()
    }

    fn insert_peer(&self, addr: &[u8]) -> Result<Peer> {
        self.add_peer(addr)
    }

    fn register(&self, region: Region) -> Result<Mr> {
        self.register_region(region)
    }

    fn register_remote(&self, region: Region) -> Result<Mr> {
        self.register_remote_region(region)
    }

    fn register_device(&self, region: Region, ordinal: i32) -> Result<Mr> {
        self.register_device_region(region, ordinal, None)
    }

    fn register_dmabuf(&self, region: Region, ordinal: i32, buf: DmaBuf) -> Result<Mr> {
        self.register_device_region(region, ordinal, Some(buf))
    }

    fn write(
        &self,
        peer: Peer,
        src: Region,
        desc: usize,
        addr: u64,
        key: u64,
        op: OpId,
    ) -> Result<Posted> {
        let r = rma::Remote { addr, key, desc };
        self.rma_op(true, peer, src, r, op)
    }

    fn write_inject(&self, peer: Peer, src: &[u8], addr: u64, key: u64) -> Result<Posted> {
        self.rma_inject(peer, src, addr, key)
    }

    fn read(
        &self,
        peer: Peer,
        dst: Region,
        desc: usize,
        addr: u64,
        key: u64,
        op: OpId,
    ) -> Result<Posted> {
        let r = rma::Remote { addr, key, desc };
        self.rma_op(false, peer, dst, r, op)
    }

    fn send(
        &self,
        peer: Peer,
        tag: u64,
        region: Region,
        mr: Option<&Mr>,
        op: OpId,
    ) -> Result<Posted> {
        let mut g = self.inner.lock();
        let desc = mr.map_or(0, |m| m.desc);
        let b = OpBuf {
            addr: region.addr(),
            len: region.len(),
            desc,
            op,
            owned: None,
            device: mr.is_some_and(|m| m.device.is_some()),
        };
        g.post_send(&self.caps, peer, tag, b)
    }

    fn recv(
        &self,
        tag: u64,
        ignore: u64,
        region: Region,
        mr: Option<&Mr>,
        op: OpId,
    ) -> Result<Posted> {
        let mut g = self.inner.lock();
        let desc = mr.map_or(0, |m| m.desc);
        let b = OpBuf {
            addr: region.addr(),
            len: region.len(),
            desc,
            op,
            owned: None,
            device: mr.is_some_and(|m| m.device.is_some()),
        };
        g.post_recv(tag, ignore, b)
    }

    fn peer_gone(&self, peer: Peer, ask_address: bool) -> bool {
        let addr = {
            let g = self.inner.lock();
            if g.shm.gone_pid(peer, true).is_some() {
                return true;
            }
            g.peers
                .iter()
                .find(|(_, &p)| p == peer.0)
                .map(|(a, _)| a.clone())
        };
        let Some(addr) = addr else {
            return false;
        };
        if let Some(name) = shm::watch::endpoint_in_address(&addr) {
            return shm::ended(&name);
        }
        ask_address && self.caps.socket_addresses && reach::refused(&addr, REACH_WITHIN)
    }

    fn send_owned(&self, peer: Peer, tag: u64, data: Vec<u8>, op: OpId) -> Result<()> {
        let mut g = self.inner.lock();
        g.backlog.push_back((peer, tag, data, op));
        g.drain_backlog(&self.caps)
    }

    fn recv_owned(&self, tag: u64, ignore: u64, len: usize, op: OpId) -> Result<()> {
        let mut g = self.inner.lock();
        let buf = vec![0u8; len];
        let addr = buf.as_ptr() as usize;
        let b = OpBuf {
            addr,
            len,
            desc: 0,
            op,
            owned: Some(buf),
            device: false,
        };
        match g.post_recv(tag, ignore, b)? {
            Posted::Queued => Ok(()),
            Posted::Busy => Err(Error::System(
                "receive queue full while posting a control receive".into(),
            )),
        }
    }

    fn cancel(&self, op: OpId) {
        let mut g = self.inner.lock();
        if g.cancel_waiting(op) {
            return;
        }
        if let Some(soft) = g.shm.soft.as_mut() {
            if let Some(i) = soft.posted.iter().position(|r| r.op == op) {
                let r = soft.posted.remove(i).expect("index from position");
                if let Some(ctx) = r.provider {
                    g.swallow(ctx);
                }
                g.ready.push(Completion {
                    op,
                    len: 0,
                    tag: r.tag,
                    status: Err(Error::InvalidUsage("operation cancelled".into())),
                    data: None,
                });
                return;
            }
        }
        for (key, ctx) in g.ops.iter() {
            if ctx.op == op && ctx.recv && matches!(ctx.role, Role::User | Role::Padded) {
                // SAFETY: ep is open and *key is the context of an operation posted on it.
                let rc = unsafe { sys::fi_cancel(g.ep as *mut sys::fid, *key as *mut c_void) };
                if rc != 0 {
                    log::debug!("fi_cancel: {}", strerror(rc as i64));
                }
            }
        }
    }

    fn owner_waits(&self, on: bool) {
        if let Some(t) = &self.tender {
            t.owner_waits(on);
        }
    }

    fn poll(&self, out: &mut Vec<Completion>) -> Result<usize> {
        if let Some(t) = &self.tender {
            t.owner_polled();
        }
        let mut g = self.inner.lock();
        if let Some(e) = g.tended_error.take() {
            return Err(e);
        }
        let start = out.len();
        out.append(&mut g.ready);
        g.progress(&self.caps)?;
        out.append(&mut g.ready);
        Ok(out.len() - start)
    }

    fn direct_bytes(&self, peer: Peer) -> usize {
        self.inner.lock().shm.direct_bytes(peer)
    }

    fn send_now(&self, peer: Peer, tag: u64, data: &[u8]) -> Result<bool> {
        self.inner.lock().send_now(&self.caps, peer, tag, data)
    }

    fn take_now(
        &self,
        peer: Peer,
        tag: u64,
        ignore: u64,
        f: &mut dyn FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<bool> {
        self.inner.lock().take_now(&self.caps, peer, tag, ignore, f)
    }

    fn take_foreign(
        &self,
        _peer: Peer,
        tag: u64,
        ignore: u64,
        compare: u64,
    ) -> Result<Option<u64>> {
        if !self.caps.truncation_crashes {
            return Ok(None);
        }
        self.inner.lock().take_foreign(tag, ignore, compare)
    }

    fn wait(&self, timeout: Duration) -> Result<()> {
        self.wait_cq(timeout)
    }

    fn wait_object(&self) -> super::WaitObject {
        self.wait_prepare()
    }
}

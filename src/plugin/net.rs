//! One device's comms: connection setup (listen / connect / accept, never blocking), tagged
//! data transfers with NCCL's matching rules, requests, and their deadlines.
//!
//! Wire tags (64 bits): `kind:2 | comm id:22 | NCCL tag:24 | sequence:16`. The receiver picks
//! the comm id; each (comm, NCCL tag) pair numbers its messages on both sides, so a send
//! always lands in the receive posted for it, in posted order, whatever the provider's own
//! ordering, and grouped receives work for any tag order.
use super::mr::{MrCache, MrRef};
use super::{new_handle, DeviceProps, Kind, HANDLE_SIZE, MAX_RECVS};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::transport::{Completion, OpId, Peer, Posted, Region, Transport};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest NCCL tag we carry (24 bits of the wire tag).
pub const MAX_TAG: i32 = (1 << 24) - 1;
/// Requests in flight per send comm (NCCL: 32 per comm x maxRecvs with shared comms).
pub const SEND_CAPACITY: usize = 256;
/// Requests in flight per receive comm.
pub const RECV_CAPACITY: usize = 64;

const KIND_DATA: u64 = 0;
const KIND_CONNECT: u64 = 1;
const KIND_ACK: u64 = 2;
const ID_BITS: u32 = 21;
/// Ignore mask for everything below the comm id (user tag and sequence).
const LOW_BITS: u64 = (1 << 40) - 1;

const SUB_LISTEN: u64 = 0xf;
const SUB_ACK: u64 = 0xe;
const SUB_CTRL_SEND: u64 = 0xd;

const HANDLE_MAGIC: &[u8; 4] = b"FBCL";
const HANDLE_VERSION: u16 = 1;
const HANDLE_ADDR_OFF: usize = 24;
const MAX_ADDR: usize = HANDLE_SIZE - HANDLE_ADDR_OFF;
const REQ_MAGIC: &[u8; 4] = b"FBCQ";
const ACK_MAGIC: &[u8; 4] = b"FBCA";
const CTRL_LEN: usize = 256;

/// `kind:2 | comm id:21 | NCCL tag:24 | sequence:16`: 63 bits (`transport::TAG_BITS`).
fn wire_tag(kind: u64, id: u32, tag: u32, seq: u16) -> u64 {
    (kind << 61)
        | ((id as u64 & ((1 << ID_BITS) - 1)) << 40)
        | ((tag as u64 & 0xff_ffff) << 16)
        | seq as u64
}

fn op(h: u64, sub: u64) -> OpId {
    (h << 4) | sub
}

struct Listen {
    id: u32,
    queue: VecDeque<(u32, Vec<u8>)>,
    first_accept: Option<Instant>,
}

struct Pending {
    id: u32,
    peer: Peer,
    started: Instant,
    result: Option<Result<u32>>,
}

struct SendComm {
    id: u32,
    remote: u32,
    peer: Peer,
    seq: HashMap<u32, u16>,
    inflight: usize,
    /// Since when the transport has refused (busy) every isend on this comm; None after one
    /// is posted. NCCL retries a refused isend forever, so the deadline must be ours.
    busy_since: Option<Instant>,
}

struct RecvComm {
    id: u32,
    seq: HashMap<u32, u16>,
    inflight: usize,
}

#[derive(Clone, Copy)]
struct Deferred {
    tag: u64,
    region: Region,
    mr: Option<MrRef>,
}

#[derive(Clone, Copy, Default)]
struct Sub {
    size: usize,
    done: bool,
    deferred: Option<Deferred>,
}

struct Request {
    comm: u64,
    send: bool,
    n: usize,
    subs: [Sub; MAX_RECVS],
    left: usize,
    error: Option<Error>,
    last: Instant,
}

#[derive(Default)]
struct WireIds {
    next: u32,
    used: HashSet<u32>,
}

impl WireIds {
    fn alloc(&mut self) -> Result<u32> {
        let max = (1u32 << ID_BITS) - 1;
        for _ in 0..max {
            self.next = self.next % max + 1;
            if self.used.insert(self.next) {
                return Ok(self.next);
            }
        }
        Err(Error::System("no free comm id on this device".into()))
    }

    fn free(&mut self, id: u32) {
        self.used.remove(&id);
    }
}

#[derive(Default)]
struct State {
    t: Option<Arc<dyn Transport>>,
    listens: HashMap<u64, Listen>,
    pendings: HashMap<u64, Pending>,
    sends: HashMap<u64, SendComm>,
    recvs: HashMap<u64, RecvComm>,
    reqs: HashMap<u64, Request>,
    mrs: HashMap<u64, MrRef>,
    cache: MrCache,
    ids: WireIds,
    deferred: VecDeque<(u64, usize)>,
    scratch: Vec<Completion>,
    idle: u32,
}

/// What `test` reports for a finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    pub n: usize,
    pub sizes: [usize; MAX_RECVS],
}

type Opener = Box<dyn Fn() -> Result<Arc<dyn Transport>> + Send + Sync>;

/// One NCCL net device: a transport endpoint (opened on first use) and the comms on it.
pub struct Device {
    pub index: usize,
    pub props: DeviceProps,
    timeout: Duration,
    open: Opener,
    st: Mutex<State>,
}

/// A connection handle's fields (the 128 bytes NCCL carries from listener to connector).
#[derive(Debug)]
struct HandleView {
    listen_id: u32,
    state: u64,
    addr: Vec<u8>,
}

fn parse_handle(h: &[u8; HANDLE_SIZE]) -> Result<HandleView> {
    let bad = |why: &str| Error::arg("handle", format!("not a fabricoll listen handle ({why})"));
    if &h[0..4] != HANDLE_MAGIC {
        return Err(bad("wrong magic"));
    }
    if u16::from_le_bytes([h[4], h[5]]) != HANDLE_VERSION {
        return Err(bad("unknown version"));
    }
    let len = u16::from_le_bytes([h[6], h[7]]) as usize;
    if len == 0 || len > MAX_ADDR {
        return Err(bad("address length out of range"));
    }
    let listen_id = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
    if listen_id == 0 || listen_id >= 1 << ID_BITS {
        return Err(bad("listen id out of range"));
    }
    Ok(HandleView {
        listen_id,
        state: u64::from_le_bytes(h[16..24].try_into().expect("8 bytes")),
        addr: h[HANDLE_ADDR_OFF..HANDLE_ADDR_OFF + len].to_vec(),
    })
}

fn set_handle_state(h: &mut [u8; HANDLE_SIZE], state: u64) {
    h[16..24].copy_from_slice(&state.to_le_bytes());
}

impl Device {
    pub fn new(index: usize, props: DeviceProps, cfg: &Config, open: Opener) -> Device {
        Device {
            index,
            props,
            timeout: cfg.timeout,
            open,
            st: Mutex::new(State {
                cache: MrCache::new(cfg.mr_cache),
                ..Default::default()
            }),
        }
    }

    /// A new endpoint of its own on this device (CollNet gives each collective comm one).
    pub fn open_endpoint(&self) -> Result<Arc<dyn Transport>> {
        (self.open)()
    }

    fn transport(&self, st: &mut State) -> Result<Arc<dyn Transport>> {
        if let Some(t) = &st.t {
            return Ok(t.clone());
        }
        let t = (self.open)()?;
        st.t = Some(t.clone());
        Ok(t)
    }

    fn timed_out(&self, since: Instant) -> bool {
        since.elapsed() > self.timeout
    }

    fn ms(&self) -> u128 {
        self.timeout.as_millis()
    }

    /// Read completions and hand each to its owner; post deferred receives.
    fn progress(&self, st: &mut State) -> Result<usize> {
        let Some(t) = st.t.clone() else {
            return Ok(0);
        };
        let mut comps = std::mem::take(&mut st.scratch);
        let polled = t.poll(&mut comps);
        let n = comps.len();
        for c in comps.drain(..) {
            dispatch(st, &*t, c);
        }
        st.scratch = comps;
        polled?;
        if !st.deferred.is_empty() {
            post_deferred(st, &*t)?;
        }
        if n == 0 {
            st.idle = st.idle.saturating_add(1);
        } else {
            st.idle = 0;
        }
        Ok(n)
    }

    /// Yield the CPU after many fruitless polls, so that more ranks than cores still progress.
    fn polite(&self, idle: u32) {
        if idle >= 64 && idle % 8 == 0 {
            std::thread::yield_now();
        }
    }

    pub fn listen(&self) -> Result<([u8; HANDLE_SIZE], u64)> {
        let mut st = self.st.lock();
        let t = self.transport(&mut st)?;
        let addr = t.address();
        if addr.is_empty() || addr.len() > MAX_ADDR {
            return Err(Error::System(format!(
                "endpoint address of {} bytes does not fit the {HANDLE_SIZE}-byte handle",
                addr.len()
            )));
        }
        let id = st.ids.alloc()?;
        let h = new_handle(self.index, Kind::Listen);
        if let Err(e) = t.recv_owned(
            wire_tag(KIND_CONNECT, id, 0, 0),
            LOW_BITS,
            CTRL_LEN,
            op(h, SUB_LISTEN),
        ) {
            st.ids.free(id);
            return Err(e);
        }
        st.listens.insert(
            h,
            Listen {
                id,
                queue: VecDeque::new(),
                first_accept: None,
            },
        );
        let mut out = [0u8; HANDLE_SIZE];
        out[0..4].copy_from_slice(HANDLE_MAGIC);
        out[4..6].copy_from_slice(&HANDLE_VERSION.to_le_bytes());
        out[6..8].copy_from_slice(&(addr.len() as u16).to_le_bytes());
        out[8..12].copy_from_slice(&id.to_le_bytes());
        out[HANDLE_ADDR_OFF..HANDLE_ADDR_OFF + addr.len()].copy_from_slice(&addr);
        Ok((out, h))
    }

    /// One step of connecting: `Ok(None)` until the listener has answered.
    pub fn connect(&self, handle: &mut [u8; HANDLE_SIZE]) -> Result<Option<u64>> {
        let view = parse_handle(handle)?;
        let mut st = self.st.lock();
        let t = self.transport(&mut st)?;
        if view.state == 0 {
            let peer = t.insert_peer(&view.addr)?;
            let id = st.ids.alloc()?;
            let ph = new_handle(self.index, Kind::Pending);
            if let Err(e) = t.recv_owned(
                wire_tag(KIND_ACK, id, 0, 0),
                LOW_BITS,
                CTRL_LEN,
                op(ph, SUB_ACK),
            ) {
                st.ids.free(id);
                return Err(e);
            }
            let mine = t.address();
            let mut req = Vec::with_capacity(CTRL_LEN);
            req.extend_from_slice(REQ_MAGIC);
            req.extend_from_slice(&id.to_le_bytes());
            req.extend_from_slice(&(mine.len() as u16).to_le_bytes());
            req.extend_from_slice(&mine);
            t.send_owned(
                peer,
                wire_tag(KIND_CONNECT, view.listen_id, 0, 0),
                req,
                op(ph, SUB_CTRL_SEND),
            )?;
            st.pendings.insert(
                ph,
                Pending {
                    id,
                    peer,
                    started: Instant::now(),
                    result: None,
                },
            );
            set_handle_state(handle, ph);
            self.progress(&mut st)?;
            return Ok(None);
        }
        let ph = view.state;
        if !st.pendings.contains_key(&ph) {
            return Err(Error::arg(
                "handle",
                "carries the state of a connect this device does not know",
            ));
        }
        self.progress(&mut st)?;
        let p = st.pendings.get_mut(&ph).expect("checked above");
        let outcome = match p.result.take() {
            Some(r) => Some(r),
            None if self.timed_out(p.started) => Some(Err(Error::Timeout(format!(
                "connect: the listener did not answer within {} ms (FABRICOLL_TIMEOUT_MS)",
                self.ms()
            )))),
            None => None,
        };
        let idle = st.idle;
        match outcome {
            None => {
                drop(st);
                self.polite(idle);
                Ok(None)
            }
            Some(r) => {
                let p = st.pendings.remove(&ph).expect("present");
                set_handle_state(handle, 0);
                match r {
                    Ok(remote) => {
                        let h = new_handle(self.index, Kind::Send);
                        st.sends.insert(
                            h,
                            SendComm {
                                id: p.id,
                                remote,
                                peer: p.peer,
                                seq: HashMap::new(),
                                inflight: 0,
                                busy_since: None,
                            },
                        );
                        Ok(Some(h))
                    }
                    Err(e) => {
                        t.cancel(op(ph, SUB_ACK));
                        st.ids.free(p.id);
                        Err(e)
                    }
                }
            }
        }
    }

    /// One step of accepting on `listen`: `Ok(None)` until a connector arrives.
    pub fn accept(&self, listen: u64) -> Result<Option<u64>> {
        let mut st = self.st.lock();
        if !st.listens.contains_key(&listen) {
            return Err(Error::arg("listenComm", "not an open listen comm"));
        }
        self.progress(&mut st)?;
        let t = self.transport(&mut st)?;
        let l = st.listens.get_mut(&listen).expect("checked above");
        let first = *l.first_accept.get_or_insert_with(Instant::now);
        let Some((remote, addr)) = l.queue.pop_front() else {
            if self.timed_out(first) {
                l.first_accept = None;
                return Err(Error::Timeout(format!(
                    "accept: no connect arrived within {} ms (FABRICOLL_TIMEOUT_MS)",
                    self.ms()
                )));
            }
            let idle = st.idle;
            drop(st);
            self.polite(idle);
            return Ok(None);
        };
        l.first_accept = None;
        let peer = t.insert_peer(&addr)?;
        let id = st.ids.alloc()?;
        let h = new_handle(self.index, Kind::Recv);
        let mut ack = Vec::with_capacity(8);
        ack.extend_from_slice(ACK_MAGIC);
        ack.extend_from_slice(&id.to_le_bytes());
        if let Err(e) = t.send_owned(
            peer,
            wire_tag(KIND_ACK, remote, 0, 0),
            ack,
            op(h, SUB_CTRL_SEND),
        ) {
            st.ids.free(id);
            return Err(e);
        }
        st.recvs.insert(
            h,
            RecvComm {
                id,
                seq: HashMap::new(),
                inflight: 0,
            },
        );
        Ok(Some(h))
    }

    pub fn close_listen(&self, listen: u64) -> Result<()> {
        let mut st = self.st.lock();
        let l = st
            .listens
            .remove(&listen)
            .ok_or_else(|| Error::arg("listenComm", "not an open listen comm"))?;
        if let Some(t) = &st.t {
            t.cancel(op(listen, SUB_LISTEN));
        }
        st.ids.free(l.id);
        self.progress(&mut st)?;
        Ok(())
    }

    fn check_comm(st: &State, comm: u64) -> Result<()> {
        if st.sends.contains_key(&comm) || st.recvs.contains_key(&comm) {
            Ok(())
        } else {
            Err(Error::arg("comm", format!("{comm:#x} is not an open comm")))
        }
    }

    /// Register host memory for use on `comm`'s device.
    pub fn reg_mr(&self, comm: u64, region: Region, ptr_type: i32) -> Result<u64> {
        if ptr_type == super::NCCL_PTR_CUDA {
            return Err(Error::arg(
                "type",
                "NCCL_PTR_CUDA: this plugin supports host memory only (ptrSupport=NCCL_PTR_HOST)",
            ));
        }
        if ptr_type != super::NCCL_PTR_HOST {
            return Err(Error::arg(
                "type",
                format!("{ptr_type} is not NCCL_PTR_HOST (1)"),
            ));
        }
        if region.len() > 1 << 40 {
            return Err(Error::arg(
                "size",
                format!("{} bytes is more than 1 TiB", region.len()),
            ));
        }
        let mut st = self.st.lock();
        Self::check_comm(&st, comm)?;
        let t = self.transport(&mut st)?;
        let r = st.cache.register(&*t, region)?;
        let h = new_handle(self.index, Kind::Mr);
        st.mrs.insert(h, r);
        Ok(h)
    }

    pub fn dereg_mr(&self, comm: u64, mh: u64) -> Result<()> {
        let mut st = self.st.lock();
        Self::check_comm(&st, comm)?;
        let r = st.mrs.remove(&mh).ok_or_else(|| {
            Error::arg(
                "mhandle",
                format!("{mh:#x} is not a registration of this device"),
            )
        })?;
        st.cache.deregister(r)
    }

    fn lookup_mr(&self, st: &State, mh: u64, region: Region, what: &str) -> Result<Option<MrRef>> {
        if mh == 0 {
            if st.t.as_ref().is_some_and(|t| t.caps().mr_local) && !region.is_empty() {
                return Err(Error::arg(
                    what,
                    "NULL, but the provider needs registered memory (call regMr)",
                ));
            }
            return Ok(None);
        }
        let r = st.mrs.get(&mh).ok_or_else(|| {
            Error::arg(
                what,
                format!("{mh:#x} is not a registration of this device"),
            )
        })?;
        if !r.region.contains(&region) {
            return Err(Error::arg(
                what,
                "the buffer is not inside the registered memory",
            ));
        }
        Ok(Some(*r))
    }

    fn check_size(&self, len: usize) -> Result<()> {
        if len > self.props.max_p2p_bytes {
            return Err(Error::arg(
                "size",
                format!(
                    "{len} bytes is more than maxP2pBytes ({})",
                    self.props.max_p2p_bytes
                ),
            ));
        }
        Ok(())
    }

    fn check_tag(tag: i32) -> Result<u32> {
        if !(0..=MAX_TAG).contains(&tag) {
            return Err(Error::arg("tag", format!("{tag} is outside 0..={MAX_TAG}")));
        }
        Ok(tag as u32)
    }

    /// Post a send; `Ok(None)` when the plugin cannot take more now (NCCL retries).
    pub fn isend(&self, comm: u64, region: Region, tag: i32, mh: u64) -> Result<Option<u64>> {
        let tag = Self::check_tag(tag)?;
        self.check_size(region.len())?;
        let mut st = self.st.lock();
        if !st.sends.contains_key(&comm) {
            return Err(Error::arg(
                "sendComm",
                format!("{comm:#x} is not an open send comm"),
            ));
        }
        self.progress(&mut st)?;
        let mr = self.lookup_mr(&st, mh, region, "mhandle")?;
        let t = self.transport(&mut st)?;
        let c = st.sends.get_mut(&comm).expect("checked above");
        if c.inflight >= SEND_CAPACITY {
            return Ok(None);
        }
        let seq = *c.seq.get(&tag).unwrap_or(&0);
        let wtag = wire_tag(KIND_DATA, c.remote, tag, seq);
        let peer = c.peer;
        let h = new_handle(self.index, Kind::Request);
        let mrobj = mr.as_ref().and_then(|r| st.cache.mr(r));
        match t.send(peer, wtag, region, mrobj, op(h, 0))? {
            Posted::Busy => {
                let c = st.sends.get_mut(&comm).expect("checked above");
                let since = *c.busy_since.get_or_insert_with(Instant::now);
                if self.timed_out(since) {
                    c.busy_since = None;
                    return Err(Error::Timeout(format!(
                        "isend: the transport refused every send to this peer for {} ms \
                         (FABRICOLL_TIMEOUT_MS): is the peer alive?",
                        self.ms()
                    )));
                }
                Ok(None)
            }
            Posted::Queued => {
                let c = st.sends.get_mut(&comm).expect("checked above");
                c.busy_since = None;
                c.seq.insert(tag, seq.wrapping_add(1));
                c.inflight += 1;
                st.reqs.insert(h, Request::new(comm, true, 1));
                Ok(Some(h))
            }
        }
    }

    /// Post a grouped receive of `bufs` (region, tag, mhandle); one request for all.
    pub fn irecv(&self, comm: u64, bufs: &[(Region, i32, u64)]) -> Result<Option<u64>> {
        if bufs.is_empty() || bufs.len() > MAX_RECVS {
            return Err(Error::arg(
                "n",
                format!("{} is outside 1..={MAX_RECVS} (maxRecvs)", bufs.len()),
            ));
        }
        let mut tags = [0u32; MAX_RECVS];
        for (i, (region, tag, _)) in bufs.iter().enumerate() {
            tags[i] = Self::check_tag(*tag)?;
            self.check_size(region.len())?;
        }
        let mut st = self.st.lock();
        if !st.recvs.contains_key(&comm) {
            return Err(Error::arg(
                "recvComm",
                format!("{comm:#x} is not an open receive comm"),
            ));
        }
        self.progress(&mut st)?;
        let mut mrs = [None; MAX_RECVS];
        for (i, (region, _, mh)) in bufs.iter().enumerate() {
            mrs[i] = self.lookup_mr(&st, *mh, *region, "mhandles")?;
        }
        let t = self.transport(&mut st)?;
        let c = st.recvs.get_mut(&comm).expect("checked above");
        if c.inflight >= RECV_CAPACITY {
            return Ok(None);
        }
        // Number the messages now: a receive posted later still gets the right one.
        let id = c.id;
        let mut wtags = [0u64; MAX_RECVS];
        let mut next = c.seq.clone();
        for (i, tag) in tags.iter().take(bufs.len()).enumerate() {
            let s = next.entry(*tag).or_insert(0);
            wtags[i] = wire_tag(KIND_DATA, id, *tag, *s);
            *s = s.wrapping_add(1);
        }
        let h = new_handle(self.index, Kind::Request);
        let mut req = Request::new(comm, false, bufs.len());
        for (i, (region, _, _)) in bufs.iter().enumerate() {
            let d = Deferred {
                tag: wtags[i],
                region: *region,
                mr: mrs[i],
            };
            let posted = if req.subs[..i].iter().any(|s| s.deferred.is_some()) {
                Posted::Busy // keep posting order: once one waits, the rest wait behind it
            } else {
                t.recv(
                    d.tag,
                    0,
                    d.region,
                    d.mr.as_ref().and_then(|r| st.cache.mr(r)),
                    op(h, i as u64),
                )?
            };
            if posted == Posted::Busy {
                if i == 0 {
                    return Ok(None); // nothing posted: NCCL retries
                }
                req.subs[i].deferred = Some(d);
                st.deferred.push_back((h, i));
            }
        }
        let c = st.recvs.get_mut(&comm).expect("checked above");
        c.seq = next;
        c.inflight += 1;
        st.reqs.insert(h, req);
        Ok(Some(h))
    }

    /// Flush received data to the consumer: nothing to do for host memory, so it completes at
    /// once and no request is returned.
    pub fn iflush(&self, comm: u64, n: i32) -> Result<Option<u64>> {
        if n < 1 || n as usize > MAX_RECVS {
            return Err(Error::arg("n", format!("{n} is outside 1..={MAX_RECVS}")));
        }
        let st = self.st.lock();
        if !st.recvs.contains_key(&comm) {
            return Err(Error::arg(
                "recvComm",
                format!("{comm:#x} is not an open receive comm"),
            ));
        }
        Ok(None)
    }

    /// Poll a request: `Ok(Some(..))` once finished (the request is then gone).
    pub fn test(&self, req: u64) -> Result<Option<Finished>> {
        let mut st = self.st.lock();
        if !st.reqs.contains_key(&req) {
            return Err(Error::arg(
                "request",
                format!("{req:#x} is not a pending request (finished, or its comm closed)"),
            ));
        }
        self.progress(&mut st)?;
        let r = st.reqs.get(&req).expect("checked above");
        let outcome = if let Some(e) = &r.error {
            Some(Err(e.clone()))
        } else if r.left == 0 {
            let mut f = Finished {
                n: r.n,
                sizes: [0; MAX_RECVS],
            };
            for (i, s) in r.subs.iter().take(r.n).enumerate() {
                f.sizes[i] = s.size;
            }
            Some(Ok(f))
        } else if self.timed_out(r.last) {
            Some(Err(Error::Timeout(format!(
                "{} request made no progress for {} ms (FABRICOLL_TIMEOUT_MS): is the peer alive?",
                if r.send { "send" } else { "receive" },
                self.ms()
            ))))
        } else {
            None
        };
        match outcome {
            None => {
                let idle = st.idle;
                drop(st);
                self.polite(idle);
                Ok(None)
            }
            Some(res) => {
                let r = st.reqs.remove(&req).expect("present");
                retire(&mut st, req, &r);
                res.map(Some)
            }
        }
    }

    pub fn close_send(&self, comm: u64) -> Result<()> {
        let mut st = self.st.lock();
        let c = st
            .sends
            .remove(&comm)
            .ok_or_else(|| Error::arg("sendComm", format!("{comm:#x} is not an open send comm")))?;
        // Sends cannot be cancelled: their completions are dropped when they arrive.
        st.reqs.retain(|_, r| r.comm != comm);
        st.ids.free(c.id);
        self.progress(&mut st)?;
        Ok(())
    }

    pub fn close_recv(&self, comm: u64) -> Result<()> {
        let mut st = self.st.lock();
        let c = st.recvs.remove(&comm).ok_or_else(|| {
            Error::arg("recvComm", format!("{comm:#x} is not an open receive comm"))
        })?;
        let mine: Vec<u64> = st
            .reqs
            .iter()
            .filter(|(_, r)| r.comm == comm)
            .map(|(h, _)| *h)
            .collect();
        for h in mine {
            let r = st.reqs.remove(&h).expect("listed");
            if let Some(t) = &st.t {
                for (i, s) in r.subs.iter().take(r.n).enumerate() {
                    if !s.done && s.deferred.is_none() {
                        t.cancel(op(h, i as u64));
                    }
                }
            }
        }
        st.ids.free(c.id);
        self.progress(&mut st)?;
        Ok(())
    }

    /// Counts of live objects, for leak tests: (comms, listens, requests, registrations).
    pub fn live(&self) -> (usize, usize, usize, usize) {
        let st = self.st.lock();
        (
            st.sends.len() + st.recvs.len() + st.pendings.len(),
            st.listens.len(),
            st.reqs.len(),
            st.cache.len(),
        )
    }
}

impl Request {
    fn new(comm: u64, send: bool, n: usize) -> Request {
        Request {
            comm,
            send,
            n,
            subs: [Sub::default(); MAX_RECVS],
            left: n,
            error: None,
            last: Instant::now(),
        }
    }
}

/// A finished (or failed) request leaves its comm's count; unfinished receives are cancelled.
fn retire(st: &mut State, h: u64, r: &Request) {
    if let Some(c) = st.sends.get_mut(&r.comm) {
        c.inflight -= 1;
    } else if let Some(c) = st.recvs.get_mut(&r.comm) {
        c.inflight -= 1;
    }
    if let Some(t) = &st.t {
        for (i, s) in r.subs.iter().take(r.n).enumerate() {
            if !s.done && s.deferred.is_none() && !r.send {
                t.cancel(op(h, i as u64));
            }
        }
    }
}

fn is_cancel(e: &Error) -> bool {
    matches!(e, Error::InvalidUsage(m) if m.contains("cancelled"))
}

fn dispatch(st: &mut State, t: &dyn Transport, c: Completion) {
    let h = c.op >> 4;
    let sub = c.op & 0xf;
    match (super::handle_kind(h), sub) {
        (k, s) if k == Kind::Request as u8 && (s as usize) < MAX_RECVS => {
            let Some(r) = st.reqs.get_mut(&h) else { return };
            r.last = Instant::now();
            let s = &mut r.subs[s as usize];
            match c.status {
                Ok(()) if !s.done => {
                    s.done = true;
                    s.size = c.len;
                    r.left -= 1;
                }
                Ok(()) => {}
                // We cancel only requests we have already dropped: a cancellation reaching a
                // live request came from the provider (rxm does this when a peer's connection
                // is lost).
                Err(e) if is_cancel(&e) => {
                    r.error.get_or_insert(Error::Remote(
                        "the provider aborted the operation (connection to the peer lost)".into(),
                    ));
                }
                Err(e) => {
                    r.error.get_or_insert(e);
                }
            }
        }
        (k, SUB_LISTEN) if k == Kind::Listen as u8 => {
            let Some(l) = st.listens.get_mut(&h) else {
                return;
            };
            match c.status {
                Ok(()) => {
                    let d = c.data.unwrap_or_default();
                    match parse_connect_request(&d) {
                        Some(x) => l.queue.push_back(x),
                        None => {
                            log::warn!("ignoring a malformed connect request ({} bytes)", d.len())
                        }
                    }
                }
                Err(e) if is_cancel(&e) => return,
                Err(e) => log::warn!("connect request receive failed: {e}"),
            }
            let tag = wire_tag(KIND_CONNECT, l.id, 0, 0);
            if let Err(e) = t.recv_owned(tag, LOW_BITS, CTRL_LEN, op(h, SUB_LISTEN)) {
                log::warn!("cannot re-post the connect request receive: {e}");
            }
        }
        (k, SUB_ACK) if k == Kind::Pending as u8 => {
            let Some(p) = st.pendings.get_mut(&h) else {
                return;
            };
            p.result = Some(match c.status {
                Ok(()) => {
                    let d = c.data.unwrap_or_default();
                    if d.len() >= 8 && &d[0..4] == ACK_MAGIC {
                        Ok(u32::from_le_bytes(d[4..8].try_into().expect("4 bytes")))
                    } else {
                        Err(Error::Remote(
                            "malformed connect answer from the listener".into(),
                        ))
                    }
                }
                Err(e) if is_cancel(&e) => return,
                Err(e) => Err(e),
            });
        }
        (k, SUB_CTRL_SEND) if k == Kind::Pending as u8 => {
            if let (Err(e), Some(p)) = (c.status, st.pendings.get_mut(&h)) {
                p.result = Some(Err(Error::Remote(format!(
                    "connect request not delivered: {e}"
                ))));
            }
        }
        (_, SUB_CTRL_SEND) => {
            if let Err(e) = c.status {
                log::warn!("connect answer not delivered: {e}");
            }
        }
        _ => log::debug!("completion for unknown operation {:#x}", c.op),
    }
}

fn parse_connect_request(d: &[u8]) -> Option<(u32, Vec<u8>)> {
    if d.len() < 10 || &d[0..4] != REQ_MAGIC {
        return None;
    }
    let id = u32::from_le_bytes(d[4..8].try_into().ok()?);
    let len = u16::from_le_bytes([d[8], d[9]]) as usize;
    if id == 0 || len == 0 || d.len() < 10 + len {
        return None;
    }
    Some((id, d[10..10 + len].to_vec()))
}

fn post_deferred(st: &mut State, t: &dyn Transport) -> Result<()> {
    while let Some(&(h, i)) = st.deferred.front() {
        let Some(r) = st.reqs.get(&h) else {
            st.deferred.pop_front();
            continue;
        };
        let Some(d) = r.subs[i].deferred else {
            st.deferred.pop_front();
            continue;
        };
        let mr = d.mr.as_ref().and_then(|m| st.cache.mr(m));
        if t.recv(d.tag, 0, d.region, mr, op(h, i as u64))? == Posted::Busy {
            break;
        }
        st.deferred.pop_front();
        if let Some(r) = st.reqs.get_mut(&h) {
            r.subs[i].deferred = None;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_tags_keep_fields_apart() {
        let t = wire_tag(KIND_DATA, (1 << ID_BITS) - 1, MAX_TAG as u32, 0xffff);
        assert_eq!(t >> 61, KIND_DATA);
        for kind in [KIND_DATA, KIND_CONNECT, KIND_ACK] {
            let t = wire_tag(kind, (1 << ID_BITS) - 1, MAX_TAG as u32, 0xffff);
            assert_eq!(t >> 61, kind);
            assert!(t < 1 << crate::transport::TAG_BITS, "{t:#x}");
        }
        assert_eq!((t >> 40) & ((1 << ID_BITS) - 1), (1 << ID_BITS) - 1);
        assert_eq!(t & 0xffff, 0xffff);
        assert_ne!(wire_tag(KIND_CONNECT, 1, 0, 0), wire_tag(KIND_ACK, 1, 0, 0));
        assert_eq!(
            wire_tag(KIND_DATA, 5, 3, 1) & !LOW_BITS,
            wire_tag(KIND_DATA, 5, 9, 7) & !LOW_BITS
        );
    }

    #[test]
    fn garbage_handles_are_rejected() {
        let mut h = [0u8; HANDLE_SIZE];
        assert!(parse_handle(&h).is_err());
        h[0..4].copy_from_slice(HANDLE_MAGIC);
        h[4..6].copy_from_slice(&1u16.to_le_bytes());
        h[6..8].copy_from_slice(&200u16.to_le_bytes());
        assert!(parse_handle(&h)
            .unwrap_err()
            .to_string()
            .contains("'handle'"));
    }
}

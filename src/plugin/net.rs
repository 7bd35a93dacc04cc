//! One device's comms: the state they share, its progress, and its deadlines. The rest by
//! concern: `wire` (tags, handle and message formats), `setup` (listen / connect / accept),
//! `data` (registration, isend / irecv / iflush / test, closing), `rma` (Neuron's writes and
//! reads of peers' memory), `dispatch` (completions), `stripe` (large messages over several
//! endpoints).
mod data;
mod dispatch;
mod rma;
mod setup;
mod stripe;
mod wire;

use super::handles::HandleTable;
use super::mr::{MrCache, MrRef};
use super::{new_handle, DeviceProps, Flavour, Kind, HANDLE_SIZE, MAX_RECVS};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::transport::{Completion, Peer, Posted, Region, Transport};
use dispatch::{dispatch, post_deferred};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wire::{op, ID_BITS};

/// Largest NCCL tag we carry (24 bits of the wire tag).
pub const MAX_TAG: i32 = (1 << 24) - 1;
/// Requests in flight per send comm (NCCL: 32 per comm x maxRecvs with shared comms).
pub const SEND_CAPACITY: usize = 256;
/// Requests in flight per receive comm (Neuron's NCCL_NET_MAX_REQUESTS is 128).
pub const RECV_CAPACITY: usize = 128;

struct Listen {
    id: u32,
    /// Connect requests: the connector's comm id, address and helper endpoint count.
    queue: VecDeque<(u32, Vec<u8>, usize)>,
    first_accept: Option<Instant>,
}

struct Pending {
    id: u32,
    peer: Peer,
    started: Instant,
    /// The listener's comm id and its helper endpoints' addresses.
    result: Option<Result<(u32, Vec<Vec<u8>>)>>,
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
    /// The peer's helper endpoints, one per helper of ours (`stripe`); empty: not striped.
    stripes: Vec<Peer>,
}

struct RecvComm {
    id: u32,
    /// The connector's endpoint (RMA reads from it).
    peer: Peer,
    seq: HashMap<u32, u16>,
    inflight: usize,
    /// Endpoints the connector stripes over (`stripe`); 1: none.
    streams: usize,
}

#[derive(Clone, Copy)]
struct Deferred {
    tag: u64,
    ignore: u64,
    region: Region,
    mr: Option<MrRef>,
}

#[derive(Clone, Copy, Default)]
struct Sub {
    size: usize,
    done: bool,
    deferred: Option<Deferred>,
    /// The head (or whole message) has completed.
    head: bool,
    /// Stripe pieces still in flight (`stripe`).
    parts: usize,
    /// A tagged receive on a striped comm: its buffer, where a striped head's pieces go.
    stripe_buf: Option<Region>,
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
    listens: HandleTable<Listen>,
    pendings: HandleTable<Pending>,
    sends: HandleTable<SendComm>,
    recvs: HandleTable<RecvComm>,
    reqs: HandleTable<Request>,
    mrs: HandleTable<MrRef>,
    cache: MrCache,
    ids: WireIds,
    deferred: VecDeque<(u64, usize)>,
    scratch: Vec<Completion>,
    idle: u32,
    stripes: stripe::Stripes,
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
    /// CollNet's properties of this device (`collnet::props`), kept here because NCCL holds on
    /// to the name pointer they hand out: they must live as long as the device.
    pub collnet_props: DeviceProps,
    flavour: Flavour,
    timeout: Duration,
    /// `FABRICOLL_NET_STREAMS`; None: the provider's default.
    streams: Option<usize>,
    open: Opener,
    st: Mutex<State>,
}

impl Device {
    pub fn new(
        index: usize,
        props: DeviceProps,
        cfg: &Config,
        flavour: Flavour,
        open: Opener,
    ) -> Device {
        let collnet_props = super::collnet::props_of(&props);
        Device {
            index,
            props,
            collnet_props,
            flavour,
            timeout: cfg.timeout,
            streams: cfg.net_streams,
            open,
            st: Mutex::new(State {
                cache: MrCache::new(flavour.mr_cache(cfg)),
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
        let mut n = comps.len();
        for c in comps.drain(..) {
            dispatch(st, &*t, c);
        }
        // The helper endpoints' completions (`stripe`): their pieces and pieces to post.
        let striped = st.stripes.progress(&mut comps);
        n += comps.len();
        for c in comps.drain(..) {
            stripe::dispatch_piece(st, c);
        }
        st.scratch = comps;
        polled?;
        striped?;
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
        if idle >= 64 && idle.is_multiple_of(8) {
            std::thread::yield_now();
        }
    }

    /// Close everything open on this device, endpoint included (Neuron's `fini`); the next use
    /// opens a new endpoint. Returns the handles closed, which the caller may still close.
    pub fn close_all(&self) -> Vec<u64> {
        let mut st = self.st.lock();
        let mut closed: Vec<u64> = Vec::new();
        closed.extend(st.listens.iter().map(|(h, _)| h));
        closed.extend(st.pendings.iter().map(|(h, _)| h));
        closed.extend(st.sends.iter().map(|(h, _)| h));
        closed.extend(st.recvs.iter().map(|(h, _)| h));
        closed.extend(st.reqs.iter().map(|(h, _)| h));
        closed.extend(st.mrs.iter().map(|(h, _)| h));
        let fresh = State {
            cache: MrCache::new(st.cache.shared),
            ..Default::default()
        };
        let mut old = std::mem::replace(&mut *st, fresh);
        drop(st);
        // The registrations before the endpoint and domain they belong to (`t` is State's first
        // field, so a plain drop would close the endpoint first).
        drop(std::mem::take(&mut old.cache));
        drop(old);
        closed
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
    if let Some(c) = st.sends.get_mut(r.comm) {
        c.inflight -= 1;
    } else if let Some(c) = st.recvs.get_mut(r.comm) {
        c.inflight -= 1;
    }
    if let Some(t) = &st.t {
        for (i, s) in r.subs.iter().take(r.n).enumerate() {
            if !s.done && s.deferred.is_none() && !r.send {
                t.cancel(op(h, i as u64));
            }
        }
    }
    st.stripes.drop_request(h);
}

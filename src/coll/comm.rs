//! The communicator: how it is made (over a transport and the peers' addresses, from a unique
//! id, or by splitting another), what it exposes, and how it ends (abort, drop).
use super::choice::ChoiceKey;
use super::engine::{Engine, ReqState};
use super::{bootstrap, Kind};
use crate::algo::{self, Algorithm, Collective, Hosts, Options, Span};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::reduce::DataType;
use crate::transport::{Peer, Scratch, Transport};
use crate::tune::Model;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A communicator: `nranks` ranks, this one being `rank`, over one transport endpoint.
pub struct Comm {
    pub rank: usize,
    pub nranks: usize,
    pub(super) transport: Arc<dyn Transport>,
    pub(super) peers: Vec<Peer>,
    pub(super) engine: Mutex<Engine>,
    pub(super) timeout: Duration,
    pub(super) poll: Duration,
    pub(super) algo: Mutex<Option<Algorithm>>,
    pub(super) model: Model,
    /// Choices per (problem, element size, forced algorithm or None for `auto`): the model is
    /// fixed once the communicator is made, and evaluating it (the formulas for `auto`, the
    /// eager slicing for a forced algorithm) costs a noticeable part of a small call
    /// (`docs/performance.md`).
    pub(super) choices: Mutex<FxHashMap<ChoiceKey, (Algorithm, Options)>>,
    pub(super) aborted: AtomicBool,
    /// Which host each rank is on (`algo::Hosts`): learnt when the communicator is made.
    pub(super) hosts: Hosts,
    /// Bytes per slice of a pipelined schedule (`slice_bytes`).
    pub(super) slice: usize,
    /// Waiters spin instead of yielding (for up to `poll`): this node's ranks have a core each.
    pub(super) spin: bool,
    /// The transport's receivers copy large messages themselves (`Caps::receiver_copies`).
    pub(super) receiver_copies: bool,
}

impl Comm {
    /// A communicator over `transport`, whose peers have the endpoint addresses `addrs`.
    pub fn new(
        rank: usize,
        transport: Arc<dyn Transport>,
        addrs: &[Vec<u8>],
        cfg: &Config,
    ) -> Result<Comm> {
        let nranks = addrs.len();
        bootstrap::check_ranks(rank, nranks)?;
        let peers = addrs
            .iter()
            .map(|a| transport.insert_peer(a))
            .collect::<Result<Vec<_>>>()?;
        let hosts = match cfg.local_ranks {
            Some(l) => Hosts::blocks(nranks, l),
            None => Hosts::ONE,
        };
        let caps = transport.caps();
        let (slice, eager) = (caps.slice_bytes, caps.eager_bytes);
        let poll = cfg.poll.unwrap_or(caps.poll_window);
        let spin = spin_ok(nranks);
        let receiver_copies = caps.receiver_copies;
        let comm = Comm {
            rank,
            nranks,
            transport,
            peers,
            engine: Mutex::new(Engine::new(nranks)),
            timeout: cfg.timeout,
            poll,
            algo: Mutex::new(cfg.algo),
            model: Model::from_config(cfg).with_eager(eager),
            choices: Mutex::new(FxHashMap::default()),
            aborted: AtomicBool::new(false),
            hosts,
            slice,
            spin,
            receiver_copies,
        };
        Ok(comm)
    }

    /// Join the communicator of `id` over a new endpoint of the default device.
    pub fn init_rank(
        nranks: usize,
        id: &bootstrap::UniqueId,
        rank: usize,
        cfg: &Config,
    ) -> Result<Comm> {
        bootstrap::check_ranks(rank, nranks)?;
        let t = open_endpoint(cfg)?;
        let addrs = bootstrap::exchange(id, rank, nranks, &t.address(), cfg.timeout)?;
        let mut comm = Comm::new(rank, t, &addrs, cfg)?;
        comm.learn_placement()?;
        comm.calibrate()?;
        Ok(comm)
    }

    /// Whether collectives post their ready sends before their ready receives
    /// (`exec::Args::sends_first`): where receivers copy messages themselves and every rank has
    /// a CPU of its own, so that the peer can copy our message while we copy its. Where ranks
    /// share CPUs a peer mostly is not running while we post, and where the provider's
    /// receiver copies nothing at posting time sends first gain nothing
    /// (`docs/performance.md`).
    #[inline]
    pub(super) fn sends_first(&self) -> bool {
        self.receiver_copies && self.spin
    }

    /// Replace the cost model, forgetting the choices made with the old one.
    pub(super) fn set_model(&mut self, m: Model) {
        self.model = m;
        self.choices.get_mut().clear();
    }

    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The communicator's algorithm override (None: automatic).
    pub fn set_algo(&self, a: Option<Algorithm>) {
        *self.algo.lock() = a;
    }

    /// Abort: every collective in flight fails (restoring in-place inputs); later calls fail.
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::SeqCst);
        let mut e = self.engine.lock();
        let ids: Vec<u32> = e.execs.keys().copied().collect();
        for id in ids {
            if let Some(ReqState::Running(x)) = e.execs.remove(&id) {
                let keep = x.fail(&*self.transport, &self.peers);
                e.graveyard.extend(keep);
                e.execs.insert(
                    id,
                    ReqState::Failed(Error::InvalidUsage("communicator aborted".into())),
                );
            }
        }
    }

    /// Fail once the communicator was aborted.
    #[inline]
    pub(super) fn check_alive(&self) -> Result<()> {
        if self.aborted.load(Ordering::SeqCst) {
            Err(Error::InvalidUsage("communicator aborted".into()))
        } else {
            Ok(())
        }
    }

    /// Split by colour (negative: not part of any new communicator), ordered by key then rank.
    pub fn split(&self, color: i32, key: i32, cfg: &Config) -> Result<Option<Comm>> {
        let t = open_endpoint(cfg)?;
        let mine = t.address();
        if mine.len() > 240 {
            return Err(Error::Internal("endpoint address too long to split".into()));
        }
        let mut rec = [0u8; 256];
        rec[0..4].copy_from_slice(&color.to_le_bytes());
        rec[4..8].copy_from_slice(&key.to_le_bytes());
        rec[8..10].copy_from_slice(&(mine.len() as u16).to_le_bytes());
        rec[10..10 + mine.len()].copy_from_slice(&mine);
        let all = Scratch::new(256 * self.nranks);
        let mut own = Scratch::new(256);
        own.bytes_mut().copy_from_slice(&rec);
        let (_, all) = self.run_owned(
            Kind::Coll(Collective::AllGather),
            (own, all),
            256,
            DataType::Uint8,
            Algorithm::Ring,
        )?;
        let table = all.bytes();
        if color < 0 {
            return Ok(None);
        }
        let mut members: Vec<(i32, usize, Vec<u8>)> = Vec::new();
        for r in 0..self.nranks {
            let b = &table[r * 256..(r + 1) * 256];
            let c = i32::from_le_bytes(b[0..4].try_into().expect("4"));
            let k = i32::from_le_bytes(b[4..8].try_into().expect("4"));
            let l = u16::from_le_bytes([b[8], b[9]]) as usize;
            if c == color {
                members.push((k, r, b[10..10 + l].to_vec()));
            }
        }
        members.sort_by_key(|m| (m.0, m.1));
        let new_rank = members
            .iter()
            .position(|m| m.1 == self.rank)
            .expect("self is a member");
        let addrs: Vec<Vec<u8>> = members.into_iter().map(|m| m.2).collect();
        let mut c = Comm::new(new_rank, t, &addrs, cfg)?;
        c.learn_placement()?;
        // The parent's measurements, and whether the new communicator's own ranks share CPUs.
        let shared = c.model.shared_cpus;
        c.set_model(self.model.clone().with_shared_cpus(shared));
        Ok(Some(c))
    }

    /// How many blocking collectives ran over the transport's direct channel (see `run`).
    pub fn direct_runs(&self) -> u64 {
        self.engine.lock().direct_runs
    }

    /// Did a collective fail (so that operations may still be pending in the provider)?
    pub fn had_failures(&self) -> bool {
        !self.engine.lock().graveyard.is_empty()
    }

    /// Collectives and transfers not yet reported.
    pub fn pending(&self) -> usize {
        self.engine.lock().execs.len()
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // Operations of failed collectives may still touch their memory: give them a moment
        // to drain, then leak what is left rather than free memory a provider may write.
        let mut e = self.engine.lock();
        let deadline = Instant::now() + Duration::from_millis(100);
        let mut comps = Vec::new();
        while Instant::now() < deadline && !e.graveyard.is_empty() {
            comps.clear();
            if self.transport.poll(&mut comps).is_err() || comps.is_empty() {
                break;
            }
        }
        for s in e.graveyard.drain(..) {
            s.leak();
        }
    }
}

/// Whether `ranks` processes each have a core of their own in this process's CPU set: the
/// guess before the ranks exchange their places (`Comm::learn_placement`), and the rule of a
/// communicator made without that exchange (CollNet's, the tests' threads). Spinning with more
/// ranks than cores makes the rank that has to move wait for the spinners' time slices
/// (`docs/performance.md`).
pub(super) fn spin_ok(ranks: usize) -> bool {
    std::thread::available_parallelism().is_ok_and(|n| ranks <= n.get())
}

/// A new endpoint on the configured device (FABRICOLL_PROVIDER / FABRICOLL_DOMAIN).
pub fn open_endpoint(cfg: &Config) -> Result<Arc<dyn Transport>> {
    use crate::transport::fabric::{self, FabricTransport};
    static DISCOVERY: once_cell::sync::OnceCell<std::result::Result<fabric::Discovery, Error>> =
        once_cell::sync::OnceCell::new();
    let d = DISCOVERY
        .get_or_init(|| fabric::discover(cfg, fabric::Use::Engines))
        .as_ref()
        .map_err(Clone::clone)?;
    let dev = d.devices.first().ok_or_else(|| {
        Error::System(format!(
            "no libfabric device (providers found: {})",
            if d.providers.is_empty() {
                "none".to_string()
            } else {
                d.providers.join(", ")
            }
        ))
    })?;
    Ok(Arc::new(FabricTransport::open(dev)?))
}

/// Spans of a whole buffer, for tests and tools.
pub fn whole(buf: algo::Buf, len: usize) -> Span {
    Span::new(buf, 0, len)
}

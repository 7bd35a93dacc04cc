//! The communicator: how it is made (over a transport and the peers' addresses, from a unique
//! id, or by splitting another), what it exposes, and how it ends (abort, drop).
use super::agree::{self, Envelope};
use super::choice::ChoiceKey;
use super::engine::{Engine, ReqState};
use super::notify::Notifier;
use super::{bootstrap, placement, Kind};
use crate::algo::{self, Algorithm, Collective, Hosts, Options, Span};
use crate::config::{AlgoSetting, Config, Timeout};
use crate::error::{Error, Result};
use crate::reduce::DataType;
use crate::transport::tiered;
use crate::transport::{self, Peer, Scratch, Transport};
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
    pub(super) timeout: Timeout,
    pub(super) poll: Duration,
    pub(super) algo: Mutex<AlgoSetting>,
    /// Bumped by every change of `algo`: a call repeating the last one reuses its choice only
    /// under the same setting (`engine::Repeat`).
    pub(super) algo_gen: std::sync::atomic::AtomicU64,
    /// The collectives (bit `Collective as usize`) that `FABRICOLL_ALGO`'s plain form does not
    /// implement and that were warned of, once each, as they fell back to `auto`.
    pub(super) algo_warned: std::sync::atomic::AtomicU8,
    pub(super) model: Model,
    /// Choices per (problem, element size, forced algorithm or None for `auto`): the model is
    /// fixed once the communicator is made, and evaluating it (the formulas for `auto`, the
    /// eager slicing for a forced algorithm) costs a noticeable part of a small call
    /// (`docs/performance.md`).
    pub(super) choices: Mutex<FxHashMap<ChoiceKey, (Algorithm, Options)>>,
    pub(super) aborted: AtomicBool,
    /// The communicator said its aborted goodbye, or ends without one (`leave_aborted`).
    pub(super) no_goodbye: AtomicBool,
    /// Which host each rank is on (`algo::Hosts`): learnt when the communicator is made.
    pub(super) hosts: Hosts,
    /// Bytes per slice of a pipelined schedule (`slice_bytes`).
    pub(super) slice: usize,
    /// Waiters spin instead of yielding (for up to `poll`): this node's ranks have a core each.
    pub(super) spin: bool,
    /// The transport's receivers copy large messages themselves (`Caps::receiver_copies`).
    pub(super) receiver_copies: bool,
    /// The progress thread of notified requests (`notify`).
    pub(super) notifier: Notifier,
    /// A failed in-place collective restores its input (`Config::inplace_restore`).
    pub(super) restore: bool,
    /// Which device calls may go direct where the provider registers device memory
    /// (`Config::device_direct`, `device`).
    pub(crate) device_direct: crate::config::DeviceDirect,
    /// The compressed collectives' setting (`Config::compress`; `compressed`).
    pub(super) compress: crate::config::Compression,
    /// Which levels compressed calls compress (`Config::compress_levels`; `compressed`).
    pub(super) compress_levels: crate::config::CompressLevels,
    /// Bytes of a compressed call's data per chunk of its pipeline, 0 for one chunk
    /// (`Config::compress_chunk`; `compressed`).
    pub(super) compress_chunk: usize,
    /// Where one-host calibrations outlive the process (`Config::calibration_dir`).
    pub(super) calibration_dir: Option<std::path::PathBuf>,
}

impl Comm {
    /// A communicator over `transport`, whose peers have the endpoint addresses `addrs`. The
    /// hosts come from the addresses where they carry them (a transport over two fabrics,
    /// `tiered`), else every rank counts as on one host; `FABRICOLL_LOCAL_RANKS` overrides.
    pub fn new(
        rank: usize,
        transport: Arc<dyn Transport>,
        addrs: &[Vec<u8>],
        cfg: &Config,
    ) -> Result<Comm> {
        let keys = match transport.caps().intra {
            Some(_) => Some(
                addrs
                    .iter()
                    .map(|a| tiered::decode_address(a).map(|(host, _, _)| host))
                    .collect::<Result<Vec<u64>>>()?,
            ),
            None => None,
        };
        Comm::with_hosts(rank, transport, addrs, cfg, keys.as_deref())
    }

    /// A communicator over `transport`, whose ranks sent the envelopes `envelopes`
    /// (`agree::Envelope`): every rank fails alike where one disagrees with rank 0, before any
    /// peer is inserted. The hosts are the envelopes' (`FABRICOLL_LOCAL_RANKS` overrides).
    pub fn agreed(
        rank: usize,
        transport: Arc<dyn Transport>,
        envelopes: &[Vec<u8>],
        cfg: &Config,
    ) -> Result<Comm> {
        let all = agree::check(envelopes)?;
        let keys: Vec<u64> = all.iter().map(|e| e.host).collect();
        let addrs: Vec<Vec<u8>> = all.into_iter().map(|e| e.address).collect();
        Comm::with_hosts(rank, transport, &addrs, cfg, Some(&keys))
    }

    fn with_hosts(
        rank: usize,
        transport: Arc<dyn Transport>,
        addrs: &[Vec<u8>],
        cfg: &Config,
        host_keys: Option<&[u64]>,
    ) -> Result<Comm> {
        let nranks = addrs.len();
        bootstrap::check_ranks(rank, nranks)?;
        let peers = addrs
            .iter()
            .map(|a| transport.insert_peer(a))
            .collect::<Result<Vec<_>>>()?;
        let hosts = match (cfg.local_ranks, host_keys) {
            (Some(l), _) => Hosts::blocks(nranks, l),
            (None, Some(k)) => Hosts::from_labels(k),
            (None, None) => Hosts::ONE,
        };
        if rank == 0 {
            log::info!(
                "{nranks} ranks on {} hosts, ranks per host {:?}{}",
                hosts.count(),
                hosts.sizes(nranks),
                if cfg.local_ranks.is_some() {
                    " (FABRICOLL_LOCAL_RANKS)"
                } else {
                    ""
                }
            );
        }
        // Where every peer is reached over the intra-host fabric, its capabilities rule.
        let caps = match &transport.caps().intra {
            Some(intra)
                if peers
                    .iter()
                    .all(|&p| std::ptr::eq(transport.caps_to(p), &**intra)) =>
            {
                &**intra
            }
            _ => transport.caps(),
        };
        let (slice, eager) = (caps.slice_bytes, caps.eager_bytes);
        // The intra-host level's eager limit, where the other hosts are reached otherwise.
        let intra_eager = transport
            .caps()
            .intra
            .as_ref()
            .map_or(eager, |c| c.eager_bytes);
        let poll = cfg.poll.unwrap_or(caps.poll_window);
        let spin = spin_ok(nranks);
        let receiver_copies = caps.receiver_copies;
        let comm = Comm {
            rank,
            nranks,
            transport,
            peers,
            engine: Mutex::new(Engine::new(nranks)),
            timeout: cfg.timeout_setting(),
            poll,
            algo: Mutex::new(cfg.algo),
            algo_gen: std::sync::atomic::AtomicU64::new(0),
            algo_warned: Default::default(),
            model: Model::from_config(cfg)
                .with_eager(eager)
                .with_intra_eager(intra_eager)
                .with_slice(slice),
            choices: Mutex::new(FxHashMap::default()),
            aborted: AtomicBool::new(false),
            no_goodbye: AtomicBool::new(false),
            hosts,
            slice,
            spin,
            receiver_copies,
            notifier: Notifier::default(),
            restore: cfg.inplace_restore,
            device_direct: cfg.device_direct,
            compress: cfg.compress,
            compress_levels: cfg.compress_levels,
            compress_chunk: cfg.compress_chunk.unwrap_or(crate::compress::DEFAULT_CHUNK),
            calibration_dir: cfg.calibration_dir.clone(),
        };
        Ok(comm)
    }

    /// Join the communicator of `id` over a new endpoint, on device `rank mod devices`
    /// (`init_rank_on`).
    pub fn init_rank(
        nranks: usize,
        id: &bootstrap::UniqueId,
        rank: usize,
        cfg: &Config,
    ) -> Result<Comm> {
        Comm::init_rank_on(nranks, id, rank, cfg, rank)
    }

    /// `init_rank` with the device hint `device` (`open_endpoint_on`): the launcher's local
    /// rank where it gives one, so that the ranks of a host spread over its NICs.
    pub fn init_rank_on(
        nranks: usize,
        id: &bootstrap::UniqueId,
        rank: usize,
        cfg: &Config,
        device: usize,
    ) -> Result<Comm> {
        bootstrap::check_ranks(rank, nranks)?;
        let t = open_endpoint_on(cfg, device)?;
        let mine = Envelope::here(&*t, cfg).to_bytes();
        let all = bootstrap::exchange(id, rank, nranks, &mine, cfg.timeout_setting())?;
        let mut comm = Comm::agreed(rank, t, &all, cfg)?;
        comm.learn_placement()?;
        comm.calibrate()?;
        Ok(comm)
    }

    /// The provider that carries messages to rank `r` (below `nranks`): over two fabrics, the
    /// intra-host one for ranks of this host.
    pub fn provider_to(&self, r: usize) -> &str {
        &self.transport.caps_to(self.peers[r]).provider
    }

    /// Which host each rank is on.
    pub fn hosts(&self) -> Hosts {
        self.hosts
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

    /// The communicator's algorithm override for every collective (None: automatic).
    pub fn set_algo(&self, a: Option<Algorithm>) {
        *self.algo.lock() = AlgoSetting::everywhere(a);
        self.algo_gen.fetch_add(1, Ordering::Release);
    }

    /// Abort: every collective in flight fails (restoring in-place inputs where `restore`);
    /// later calls fail.
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::SeqCst);
        let mut e = self.engine.lock();
        // Only the running ones: a request that ended keeps its status for test, wait or
        // its notified callback.
        let ids: Vec<u32> = e
            .execs
            .iter()
            .filter(|(_, s)| matches!(s, ReqState::Running(_)))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if let Some(ReqState::Running(x)) = e.execs.remove(&id) {
                let err = x.explain(Error::InvalidUsage("communicator aborted".into()));
                let keep = x.fail(&*self.transport, &self.peers);
                e.graveyard.extend(keep);
                e.bury_phased(id);
                e.execs.insert(id, ReqState::Failed(err));
            }
        }
    }

    /// Leave without waiting, as NCCL's `ncclCommAbort`, for a job that is failing anyway:
    /// send every rank this one talked to a last goodbye that says it aborted (best effort, not
    /// waited for: the peers then wait for nothing of this rank), and, when dropped, close the
    /// endpoint at once instead of keeping it open until the peers end theirs
    /// (`coll::goodbye`).
    pub fn leave_aborted(&self) {
        self.goodbye_aborted();
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
    /// The ranks exchange their new endpoints' envelopes (`agree`), checked on every rank
    /// before any leaves: the new communicator learns its own hosts from them.
    pub fn split(&self, color: i32, key: i32, cfg: &Config) -> Result<Option<Comm>> {
        /// Bytes per rank in the exchange: colour, key, envelope length, envelope.
        const REC: usize = 512;
        let t = open_endpoint_on(cfg, self.rank)?;
        let mine = Envelope::here(&*t, cfg).to_bytes();
        if mine.len() > REC - 10 {
            return Err(Error::Internal(format!(
                "endpoint envelope of {} bytes, too long to split (at most {})",
                mine.len(),
                REC - 10
            )));
        }
        let mut rec = [0u8; REC];
        rec[0..4].copy_from_slice(&color.to_le_bytes());
        rec[4..8].copy_from_slice(&key.to_le_bytes());
        rec[8..10].copy_from_slice(&(mine.len() as u16).to_le_bytes());
        rec[10..10 + mine.len()].copy_from_slice(&mine);
        let all = Scratch::new(REC * self.nranks);
        let mut own = Scratch::new(REC);
        own.bytes_mut().copy_from_slice(&rec);
        let (_, all) = self.run_owned(
            Kind::Coll(Collective::AllGather),
            (own, all),
            REC,
            DataType::Uint8,
            Algorithm::Ring,
        )?;
        let mut members: Vec<(i32, usize, Vec<u8>)> = Vec::new();
        let mut envelopes = Vec::with_capacity(self.nranks);
        for (r, b) in all.bytes().chunks(REC).enumerate() {
            let c = i32::from_le_bytes(b[0..4].try_into().expect("4"));
            let k = i32::from_le_bytes(b[4..8].try_into().expect("4"));
            let l = (u16::from_le_bytes([b[8], b[9]]) as usize).min(REC - 10);
            let e = b[10..10 + l].to_vec();
            if c == color {
                members.push((k, r, e.clone()));
            }
            envelopes.push(e);
        }
        // Every rank, in a new communicator or not, fails alike where one disagrees.
        agree::check(&envelopes)?;
        if color < 0 {
            return Ok(None);
        }
        members.sort_by_key(|m| (m.0, m.1));
        let new_rank = members
            .iter()
            .position(|m| m.1 == self.rank)
            .expect("self is a member");
        let envelopes: Vec<Vec<u8>> = members.into_iter().map(|m| m.2).collect();
        let mut c = Comm::agreed(new_rank, t, &envelopes, cfg)?;
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
        // The progress thread stops first; notified requests still pending fail.
        self.end_notified();
        // Operations of failed collectives may still touch their memory: give them a moment
        // to drain, then leak what is left rather than free memory a provider may write.
        {
            let mut e = self.engine.lock();
            let ids: Vec<u32> = e.phased.keys().copied().collect();
            ids.into_iter().for_each(|id| e.bury_phased(id));
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
        // What this rank sent must reach its peers before the endpoint closes: the endpoint
        // lingers, open, in the closer until the goodbyes are done (after the drain above,
        // whose polls would take the goodbyes' completions).
        super::closer::linger(|| self.goodbye());
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

/// A new endpoint on the configured device (FABRICOLL_PROVIDER / FABRICOLL_DOMAIN): the
/// first device (`open_endpoint_on` with hint 0).
pub fn open_endpoint(cfg: &Config) -> Result<Arc<dyn Transport>> {
    open_endpoint_on(cfg, 0)
}

/// A new endpoint for the collective engines on device `hint mod n` of the network provider's
/// n devices, over two fabrics where the configuration names an intra-host provider
/// (`transport::open::engines`, which says how): ranks of one host given their local rank as
/// the hint spread over the host's NICs.
pub fn open_endpoint_on(cfg: &Config, hint: usize) -> Result<Arc<dyn Transport>> {
    transport::open::engines(cfg, hint, placement::host_key(cfg))
}

/// Spans of a whole buffer, for tests and tools.
pub fn whole(buf: algo::Buf, len: usize) -> Span {
    Span::new(buf, 0, len)
}

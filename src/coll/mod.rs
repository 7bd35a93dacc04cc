//! Communicators and the collective front end: choose an algorithm (`tune`), build (and cache)
//! its schedule (`algo`), run it (`exec`). Progress is polled in the caller's thread: blocking
//! calls poll, then sleep on the transport's completion queue instead of spinning.
pub mod bootstrap;
pub mod placement;

use crate::algo::{self, Algorithm, Collective, Options, Problem, Schedule, Span};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::exec::{self, Args, BufPool, Exec, Idle, Job, Plan, Tags};
use crate::reduce::{DataType, RedOp};
use crate::transport::{Completion, Peer, Region, Scratch, Transport};
use crate::tune::{self, Model};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to run: a collective, or one side of a point-to-point transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Coll(Collective),
    /// AllGather or ReduceScatter over elements `[offset, offset+len)` of the global
    /// `nranks x count` vector (NCCL CollNet's windows; see `algo::Problem::window`).
    Window {
        coll: Collective,
        offset: usize,
        len: usize,
    },
    Send {
        peer: usize,
    },
    Recv {
        peer: usize,
    },
}

/// One call. `count` follows NCCL (see `algo::Problem`).
#[derive(Clone, Copy, Debug)]
pub struct Call {
    pub kind: Kind,
    pub send: Region,
    pub recv: Region,
    pub count: usize,
    pub dtype: DataType,
    pub op: RedOp,
    pub root: usize,
    /// Per-call algorithm (None: the communicator's choice).
    pub algo: Option<Algorithm>,
}

/// A request of a non-blocking call.
pub type RequestId = u64;

enum ReqState {
    Running(Box<Exec>),
    Done,
    Failed(Error),
}

type ScheduleKey = (Problem, Algorithm, Options, usize);

/// A schedule, this rank's plan of it, and whether every message of the plan fits the
/// transport's direct channel to its peer (then a blocking call runs it with `run_direct`).
#[derive(Clone)]
struct Planned {
    schedule: Arc<Schedule>,
    plan: Arc<Plan>,
    direct: bool,
}

struct Engine {
    execs: FxHashMap<u32, ReqState>,
    next_id: u32,
    seq: u32,
    p2p_send: Vec<u64>,
    p2p_recv: Vec<u64>,
    /// Memory of failed collectives that operations may still touch.
    graveyard: Vec<Scratch>,
    scratch: Vec<Completion>,
    /// Schedules and this rank's plan of them, per (problem, algorithm, options, element size).
    cache: FxHashMap<ScheduleKey, Planned>,
    /// Staging, Tmp and backup memory kept between calls.
    pool: BufPool,
    /// The last collective's choice and schedule: a loop of the same call skips both lookups.
    last: Option<(ChoiceKey, Algorithm, Planned)>,
    /// The executor of the last collective that finished, kept for the next call of the same
    /// plan (`park`, `Exec::rearm`).
    spare: Option<Box<Exec>>,
    /// Blocking collectives that ran over the direct channel (`run_direct`).
    direct_runs: u64,
}

/// Where a collective's executor comes from: a new one for this plan, or the spare.
enum Prep {
    Fresh(Planned),
    Spare(Box<Exec>),
}

/// A communicator: `nranks` ranks, this one being `rank`, over one transport endpoint.
pub struct Comm {
    pub rank: usize,
    pub nranks: usize,
    transport: Arc<dyn Transport>,
    peers: Vec<Peer>,
    engine: Mutex<Engine>,
    timeout: Duration,
    poll: Duration,
    algo: Mutex<Option<Algorithm>>,
    model: Model,
    /// Choices per (problem, element size, forced algorithm or None for `auto`): the model is
    /// fixed once the communicator is made, and evaluating it (the formulas for `auto`, the
    /// eager slicing for a forced algorithm) cost about 1.2 us a call, a fifth of a small shm
    /// AllReduce.
    choices: Mutex<FxHashMap<ChoiceKey, (Algorithm, Options)>>,
    aborted: AtomicBool,
    /// Ranks per node, for `hier`.
    local: usize,
    /// Bytes per slice of a pipelined schedule (`slice_bytes`).
    slice: usize,
    /// Waiters spin instead of yielding (for up to `poll`): this node's ranks have a core each.
    spin: bool,
    /// The transport's receivers copy large messages themselves (`Caps::receiver_copies`).
    receiver_copies: bool,
}

/// What a choice depends on besides the model: the problem, the element size and the forced
/// algorithm (None: `auto`).
type ChoiceKey = (Problem, usize, Option<Algorithm>);

/// How many choices a communicator keeps (a new one beyond that clears them).
const CHOICES_KEPT: usize = 1024;

impl Comm {
    /// A communicator over `transport`, whose peers have the endpoint addresses `addrs`.
    pub fn new(
        rank: usize,
        transport: Arc<dyn Transport>,
        addrs: &[Vec<u8>],
        cfg: &Config,
    ) -> Result<Comm> {
        let nranks = addrs.len();
        if nranks == 0 || nranks > exec::MAX_RANKS {
            return Err(Error::arg(
                "nranks",
                format!("{nranks} is outside 1..={}", exec::MAX_RANKS),
            ));
        }
        if rank >= nranks {
            return Err(Error::arg(
                "rank",
                format!("{rank} is not below nranks ({nranks})"),
            ));
        }
        let peers = addrs
            .iter()
            .map(|a| transport.insert_peer(a))
            .collect::<Result<Vec<_>>>()?;
        let local = local_ranks(addrs, cfg);
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
            engine: Mutex::new(Engine {
                execs: FxHashMap::default(),
                next_id: 1,
                seq: 0,
                p2p_send: vec![0; nranks],
                p2p_recv: vec![0; nranks],
                graveyard: Vec::new(),
                scratch: Vec::new(),
                cache: FxHashMap::default(),
                pool: BufPool::default(),
                last: None,
                spare: None,
                direct_runs: 0,
            }),
            timeout: cfg.timeout,
            poll,
            algo: Mutex::new(cfg.algo),
            model: Model::from_config(cfg).with_eager(eager),
            choices: Mutex::new(FxHashMap::default()),
            aborted: AtomicBool::new(false),
            local,
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
        comm.calibrate(cfg)?;
        Ok(comm)
    }

    /// Exchange every rank's machine and CPU set (`placement`), and spin while waiting only if
    /// each rank on this machine can have a CPU of its own. Until then `spin` is a guess from
    /// this process's CPU set alone, which a binding launcher defeats: 2 ranks bound one per CPU
    /// each see one CPU, and yielded, 0.34 to 0.59 us for a 2-rank shm AllReduce of 8 B against
    /// 0.27 to 0.31 spinning. The cost model learns whether any machine's ranks share CPUs
    /// (`tune::Model::shared_cpus`).
    fn learn_placement(&mut self) -> Result<()> {
        if self.nranks == 1 {
            return Ok(());
        }
        let mut own = Scratch::new(placement::RECORD);
        own.bytes_mut()
            .copy_from_slice(&placement::Place::here().to_bytes());
        let all = Scratch::new(placement::RECORD * self.nranks);
        let (_, all) = self.run_owned(
            Kind::Coll(Collective::AllGather),
            (own, all),
            placement::RECORD,
            DataType::Uint8,
            Algorithm::Ring,
        )?;
        let places = all
            .bytes()
            .chunks(placement::RECORD)
            .map(placement::Place::from_bytes)
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| Error::Internal("placement records of the wrong size".into()))?;
        self.spin = placement::own_cpus(&places, self.rank);
        // Every rank computes this from the same records, so all choose alike.
        let shared = (0..self.nranks).any(|r| !placement::own_cpus(&places, r));
        let m = self.model.clone().with_shared_cpus(shared);
        self.set_model(m);
        let mine = places[self.rank].host;
        log::debug!(
            "rank {}: {} of {} ranks on this machine; waiters {}",
            self.rank,
            places.iter().filter(|p| p.host == mine).count(),
            self.nranks,
            if self.spin { "spin" } else { "yield" }
        );
        Ok(())
    }

    /// Whether collectives post their ready sends before their ready receives
    /// (`exec::Args::sends_first`): where receivers copy messages themselves and every rank has
    /// a CPU of its own, so that the peer can copy our message while we copy its. Where ranks
    /// share CPUs a peer mostly is not running while we post, and where the provider's
    /// receiver copies nothing at posting time sends first gain nothing
    /// (`docs/performance.md`).
    fn sends_first(&self) -> bool {
        self.receiver_copies && self.spin
    }

    /// Measure alpha, beta and gamma unless the configuration fixes them.
    fn calibrate(&mut self, cfg: &Config) -> Result<()> {
        if self.nranks > 1 && self.model.needs_calibration() {
            let m = calibrate(self, cfg)?;
            self.set_model(m);
        }
        Ok(())
    }

    /// Replace the cost model, forgetting the choices made with the old one.
    fn set_model(&mut self, m: Model) {
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
                let keep = x.fail(&*self.transport);
                e.graveyard.extend(keep);
                e.execs.insert(
                    id,
                    ReqState::Failed(Error::InvalidUsage("communicator aborted".into())),
                );
            }
        }
    }

    fn check_alive(&self) -> Result<()> {
        if self.aborted.load(Ordering::SeqCst) {
            Err(Error::InvalidUsage("communicator aborted".into()))
        } else {
            Ok(())
        }
    }

    /// Which algorithm runs `p` (override, else the cost model), with its options.
    pub fn choose(
        &self,
        p: &Problem,
        elem: usize,
        per_call: Option<Algorithm>,
    ) -> Result<(Algorithm, Options)> {
        let forced = per_call.or(*self.algo.lock());
        let key = (*p, elem, forced);
        if let Some(c) = self.choices.lock().get(&key) {
            return Ok(*c);
        }
        let c = self.decide(p, elem, forced)?;
        let mut choices = self.choices.lock();
        if choices.len() >= CHOICES_KEPT {
            choices.clear();
        }
        choices.insert(key, c);
        Ok(c)
    }

    /// `choose` without the kept choices.
    fn decide(
        &self,
        p: &Problem,
        elem: usize,
        forced: Option<Algorithm>,
    ) -> Result<(Algorithm, Options)> {
        let opts = Options {
            slice: (self.slice / elem.max(1)).max(1),
            local: self.local,
            intra: Algorithm::Ring,
            inter: Algorithm::Ring,
        };
        if let Some(a) = forced {
            if !algo::supports(a, p.coll) {
                let ok: Vec<&str> = Algorithm::ALL
                    .iter()
                    .filter(|x| algo::supports(**x, p.coll))
                    .map(|x| x.name())
                    .collect();
                return Err(Error::InvalidArgument(format!(
                    "algorithm '{a}' does not implement {:?}; accepted values: auto, {}",
                    p.coll,
                    ok.join(", ")
                )));
            }
            let opts = if a == Algorithm::Hier {
                tune::hier_options(self.nranks, self.local, opts)
            } else {
                self.model.eager_slicing(a, p, elem, opts)
            };
            return Ok((a, opts));
        }
        Ok(self.model.choose(p, elem, opts, self.local))
    }

    fn schedule(
        &self,
        e: &mut Engine,
        p: Problem,
        a: Algorithm,
        o: Options,
        elem: usize,
    ) -> Result<Planned> {
        if let Some(s) = e.cache.get(&(p, a, o, elem)) {
            return Ok(s.clone());
        }
        let schedule =
            Arc::new(algo::build(p, a, &o).map_err(|err| Error::InvalidArgument(err.to_string()))?);
        let plan = Arc::new(Plan::new(&schedule, self.rank, elem)?);
        let direct = plan
            .message_peers
            .iter()
            .map(|&r| self.transport.direct_bytes(self.peers[r]))
            .all(|d| d > 0 && plan.max_message <= d);
        let planned = Planned {
            schedule,
            plan,
            direct,
        };
        if e.cache.len() > 256 {
            e.cache.clear();
        }
        e.cache.insert((p, a, o, elem), planned.clone());
        Ok(planned)
    }

    /// Start a call; returns its request.
    pub fn start(&self, call: &Call) -> Result<RequestId> {
        self.check_alive()?;
        let mut e = self.engine.lock();
        let (exec, id, _) = self.prepare(call, &mut e)?;
        e.execs.insert(id, ReqState::Running(exec));
        self.progress(&mut e)?;
        Ok(id as RequestId)
    }

    /// Check a call and make its `Exec`, with its request id and whether it may run over the
    /// direct channel (`Planned::direct`; never for point-to-point calls).
    fn prepare(&self, call: &Call, e: &mut Engine) -> Result<(Box<Exec>, u32, bool)> {
        let elem = call.dtype.size();
        let (schedule, rank) = match call.kind {
            Kind::Coll(_) | Kind::Window { .. } => {
                let (coll, window) = match call.kind {
                    Kind::Window { coll, offset, len } => (coll, Some((offset, len))),
                    Kind::Coll(c) => (c, None),
                    _ => unreachable!("matched above"),
                };
                let mut p = Problem::new(coll, self.nranks, call.count).with_root(call.root);
                p.window = window;
                if matches!(coll, Collective::Broadcast | Collective::Reduce)
                    && call.root >= self.nranks
                {
                    return Err(Error::arg(
                        "root",
                        format!("{} is not a rank of {}", call.root, self.nranks),
                    ));
                }
                p.count
                    .checked_mul(self.nranks)
                    .and_then(|c| c.checked_mul(elem))
                    .ok_or_else(|| Error::arg("count", "count x nranks x type size overflows"))?;
                let key = (p, elem, call.algo.or(*self.algo.lock()));
                if !matches!(&e.last, Some((k, ..)) if *k == key) {
                    let (a, o) = self.choose(&p, elem, call.algo)?;
                    let planned = self.schedule(e, p, a, o, elem)?;
                    e.last = Some((key, a, planned));
                }
                let (_, a, planned) = e.last.as_ref().expect("set above");
                // The executor the last collective of this plan left: re-armed, it saves the
                // allocations and the reference counting of a new one.
                let prep = match e.spare.take_if(|x| Arc::ptr_eq(x.plan(), &planned.plan)) {
                    Some(x) => Prep::Spare(x),
                    None => Prep::Fresh(planned.clone()),
                };
                (Some((prep, *a, planned.direct)), self.rank)
            }
            Kind::Send { peer } | Kind::Recv { peer } => {
                if peer >= self.nranks {
                    return Err(Error::arg(
                        "peer",
                        format!("{peer} is not a rank of {}", self.nranks),
                    ));
                }
                (None, self.rank)
            }
        };
        let id = e.next_id;
        e.next_id = e.next_id.wrapping_add(1).max(1);
        let mut direct = false;
        let exec = match (schedule, call.kind) {
            (Some((prep, a, d)), _) => {
                direct = d;
                let seq = e.seq;
                e.seq = e.seq.wrapping_add(1);
                log::debug!(
                    "collective #{seq}: {:?} count {} with {a}",
                    call.kind,
                    call.count
                );
                let args = Args {
                    dtype: call.dtype,
                    op: call.op,
                    inp: call.send,
                    out: call.recv,
                    tags: Tags::Coll(seq),
                    timeout: self.timeout,
                    sends_first: self.sends_first(),
                };
                match prep {
                    Prep::Spare(mut x) => {
                        // As `Exec::new` does when its call is refused: the memory goes back.
                        if let Err(err) = x.rearm(args, id, &mut e.pool) {
                            x.recycle(&mut e.pool);
                            return Err(err);
                        }
                        x
                    }
                    Prep::Fresh(Planned { schedule, plan, .. }) => Exec::new(
                        Job {
                            schedule,
                            rank,
                            args,
                        },
                        plan,
                        id,
                        &mut e.pool,
                    )?,
                }
            }
            (None, Kind::Send { peer }) => {
                let k = e.p2p_send[peer];
                e.p2p_send[peer] += 1;
                Exec::p2p(
                    true,
                    self.rank,
                    peer,
                    self.nranks,
                    call.send,
                    call.count,
                    call.dtype,
                    k,
                    self.timeout,
                    id,
                    &mut e.pool,
                )?
            }
            (None, Kind::Recv { peer }) => {
                let k = e.p2p_recv[peer];
                e.p2p_recv[peer] += 1;
                Exec::p2p(
                    false,
                    self.rank,
                    peer,
                    self.nranks,
                    call.recv,
                    call.count,
                    call.dtype,
                    k,
                    self.timeout,
                    id,
                    &mut e.pool,
                )?
            }
            (None, Kind::Coll(_) | Kind::Window { .. }) => {
                unreachable!("collectives have schedules")
            }
        };
        Ok((exec, id, direct))
    }

    /// Poll the transport, route completions, advance every running collective.
    fn progress(&self, e: &mut Engine) -> Result<bool> {
        let t = &*self.transport;
        let mut comps = std::mem::take(&mut e.scratch);
        t.poll(&mut comps)?;
        let mut moved = !comps.is_empty();
        for c in comps.drain(..) {
            let id = Exec::exec_of(c.op);
            let r = match e.execs.get_mut(&id) {
                Some(ReqState::Running(x)) => x.on_completion(c, &mut e.pool),
                _ => Ok(()), // a failed or finished collective's late completion
            };
            if let Err(err) = r {
                fail(e, t, id, err);
            }
        }
        e.scratch = comps;
        let mut failed = Vec::new();
        let Engine {
            execs, pool, spare, ..
        } = &mut *e;
        for (id, st) in execs.iter_mut() {
            let ReqState::Running(x) = st else {
                continue;
            };
            let r = x
                .advance(t, &self.peers, pool)
                .and_then(|m| x.check_deadline().map(|_| m));
            match r {
                Ok(m) => {
                    moved |= m;
                    if x.is_finished() {
                        if let ReqState::Running(x) = std::mem::replace(st, ReqState::Done) {
                            park(spare, pool, x);
                        }
                    }
                }
                Err(err) => failed.push((*id, err)),
            }
        }
        for (id, err) in failed {
            fail(e, t, id, err);
        }
        Ok(moved)
    }

    /// Is the request done? Done and failed requests are released when reported.
    pub fn test(&self, req: RequestId) -> Result<bool> {
        self.test_moved(req).map(|(done, _)| done)
    }

    /// `test`, and whether anything moved (for the waiter's idle clock).
    fn test_moved(&self, req: RequestId) -> Result<(bool, bool)> {
        let id = u32::try_from(req)
            .map_err(|_| Error::arg("request", "not a request of this communicator"))?;
        let mut e = self.engine.lock();
        if !e.execs.contains_key(&id) {
            return Err(Error::arg(
                "request",
                "not a pending request of this communicator",
            ));
        }
        let moved = self.progress(&mut e)?;
        match e.execs.get(&id) {
            Some(ReqState::Running(_)) => Ok((false, moved)),
            Some(ReqState::Done) => {
                e.execs.remove(&id);
                Ok((true, moved))
            }
            Some(ReqState::Failed(_)) => match e.execs.remove(&id) {
                Some(ReqState::Failed(err)) => Err(err),
                _ => unreachable!(),
            },
            None => Err(Error::Internal("request vanished".into())),
        }
    }

    /// Wait for a request. While something moved in the last `FABRICOLL_POLL_US`, poll,
    /// yielding the core between idle rounds so that ranks that outnumber the cores get to
    /// run (a yield with nothing else runnable returns at once; spinning first only delayed
    /// the rank that had to make progress). After that long without progress, sleep on the
    /// completion queue until it signals (at most 1 ms at a time; every collective's own
    /// deadline still applies).
    pub fn wait(&self, req: RequestId) -> Result<()> {
        let mut idle = Idle::new(self.spin, self.poll);
        loop {
            let (done, moved) = self.test_moved(req)?;
            if done {
                return Ok(());
            }
            if moved {
                idle.moved();
            } else if !idle.expired() {
                idle.pause();
            } else {
                self.transport.wait(Duration::from_millis(1))?;
                idle.moved();
            }
        }
    }

    /// A blocking call. With nothing else in flight on the communicator, a collective whose
    /// messages all fit the transport's direct channel (the shm fastbox) runs there, in this
    /// thread, without posting operations (`Exec::run_direct`); the messages are the same on
    /// the wire, so peers may run the same call either way.
    pub fn run(&self, call: &Call) -> Result<()> {
        self.check_alive()?;
        let mut e = self.engine.lock();
        let (exec, id, direct) = self.prepare(call, &mut e)?;
        if direct && e.execs.is_empty() {
            return self.run_direct(&mut e, exec);
        }
        e.execs.insert(id, ReqState::Running(exec));
        self.progress(&mut e)?;
        drop(e);
        self.wait(id as RequestId)
    }

    /// Run a blocking collective of the communicator's own (placement, split, calibration) on
    /// memory the library owns, with op Sum and root 0. The buffers come back when it
    /// succeeds; when it fails they are leaked, since operations may still be pending on them.
    fn run_owned(
        &self,
        kind: Kind,
        (send, recv): (Scratch, Scratch),
        count: usize,
        dtype: DataType,
        algo: Algorithm,
    ) -> Result<(Scratch, Scratch)> {
        // SAFETY: both buffers stay owned here until the collective has ended, and are leaked
        // rather than freed if it fails, so neither region outlives its memory.
        let (s, r) = unsafe { (send.region(), recv.region()) };
        let call = Call {
            kind,
            send: s,
            recv: r,
            count,
            dtype,
            op: RedOp::Sum,
            root: 0,
            algo: Some(algo),
        };
        match self.run(&call) {
            Ok(()) => Ok((send, recv)),
            Err(e) => {
                send.leak();
                recv.leak();
                Err(e)
            }
        }
    }

    /// `run` over the direct channel; the engine stays locked throughout (calls on one
    /// communicator are serialised, and nothing else of it is in flight).
    fn run_direct(&self, e: &mut Engine, mut exec: Box<Exec>) -> Result<()> {
        let t = &*self.transport;
        let mut idle = Idle::new(self.spin, self.poll);
        e.direct_runs += 1;
        match exec.run_direct(t, &self.peers, &mut idle, &self.aborted) {
            Ok(()) => {
                park(&mut e.spare, &mut e.pool, exec);
                Ok(())
            }
            Err(err) => {
                // Nothing was posted: the memory goes back to the pool, not the graveyard.
                for b in exec.fail(t) {
                    e.pool.put(b);
                }
                Err(err)
            }
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

/// Largest Tmp memory a spare executor keeps outside the pool (and its `POOL_LIMIT`): a
/// re-armed executor saves about 0.05 us a call, which counts for small calls only.
const SPARE_TMP_LIMIT: usize = 1 << 20;

/// Keep a finished collective's executor as the spare for the next call of its plan
/// (`Exec::rearm`); the spare it replaces goes back to the pool. Point-to-point executors
/// are not kept (each transfer makes its own one-step plan), nor ones with more than
/// `SPARE_TMP_LIMIT` bytes of Tmp.
fn park(spare: &mut Option<Box<Exec>>, pool: &mut BufPool, mut x: Box<Exec>) {
    if !x.is_collective() || x.tmp_bytes() > SPARE_TMP_LIMIT {
        x.recycle(pool);
        return;
    }
    x.retire(pool);
    if let Some(mut old) = spare.replace(x) {
        old.recycle(pool);
    }
}

fn fail(e: &mut Engine, t: &dyn Transport, id: u32, err: Error) {
    if let Some(ReqState::Running(x)) = e.execs.remove(&id) {
        let keep = x.fail(t);
        e.graveyard.extend(keep);
    }
    e.execs.insert(id, ReqState::Failed(err));
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
/// ranks than cores makes the rank that has to move wait for the spinners' time slices: a
/// 4-rank shm AllReduce of 8 B on 2 cores took 60 us spinning against 11 us yielding.
fn spin_ok(ranks: usize) -> bool {
    std::thread::available_parallelism().is_ok_and(|n| ranks <= n.get())
}

/// Ranks per node: how many leading ranks share the first rank's host (by address), if every
/// host has the same number; else 1 (no hierarchy).
fn local_ranks(addrs: &[Vec<u8>], cfg: &Config) -> usize {
    if let Some(l) = cfg.local_ranks {
        return l;
    }
    let _ = addrs;
    1
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

/// Measure alpha (tiny ring AllReduce), beta (1 MiB ring AllReduce) and gamma (a local
/// reduction) on rank 0, and broadcast them so that every rank chooses the same algorithms.
pub fn calibrate(comm: &Comm, _cfg: &Config) -> Result<Model> {
    use crate::reduce;
    let n = comm.nranks;
    let small = (Scratch::new(4), Scratch::new(4));
    // The large AllReduces run on buffers like a user's (`Scratch::plain`, small pages): from
    // 2 MiB up `Scratch::new` asks for huge pages, which a peer's copy reads faster than a
    // user's buffer, and beta would come out too high.
    let big_len = 1 << 20;
    let big = (Scratch::plain(big_len), Scratch::plain(big_len));
    let ar = |bufs: (Scratch, Scratch)| {
        let count = bufs.0.len() / 4;
        comm.run_owned(
            Kind::Coll(Collective::AllReduce),
            bufs,
            count,
            DataType::Float32,
            Algorithm::Ring,
        )
    };
    let mut small = small;
    for _ in 0..3 {
        small = ar(small)?;
    }
    // Each timing is the best of 3 batches (microseconds per call), so that one scheduling
    // hiccup does not decide it.
    let best_of_3 =
        |mut bufs: (Scratch, Scratch), iters: usize| -> Result<((Scratch, Scratch), f64)> {
            let mut best = f64::MAX;
            for _ in 0..3 {
                let t = Instant::now();
                for _ in 0..iters {
                    bufs = ar(bufs)?;
                }
                best = best.min(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
            }
            Ok((bufs, best))
        };
    let (_, small_us) = best_of_3(small, 10)?;
    // Two large sizes, so that beta comes from their difference (`tune::fit`).
    let (big, large_us) = best_of_3(big, 1)?;
    let larger_len = 4 * big_len;
    let larger = (Scratch::plain(larger_len), Scratch::plain(larger_len));
    let (larger, larger_us) = best_of_3(larger, 1)?;
    drop(larger);
    let mut red_us = f64::MAX;
    let mut acc = Scratch::new(big_len);
    for _ in 0..3 {
        let t = Instant::now();
        reduce::reduce_inplace(
            DataType::Float32,
            RedOp::Sum,
            acc.bytes_mut(),
            big.0.bytes(),
        )
        .map_err(|e| Error::Internal(format!("calibration reduction: {e}")))?;
        red_us = red_us.min(t.elapsed().as_secs_f64() * 1e6);
    }
    let (a, b, g) = tune::fit(
        n,
        small_us,
        &[(big_len, large_us), (larger_len, larger_us)],
        (big_len, red_us),
        comm.model.eager_bytes,
    );
    // Rank 0's measurement is everyone's.
    let mut params = Scratch::new(24);
    if comm.rank == 0 {
        for (i, x) in [a, b, g].iter().enumerate() {
            params.bytes_mut()[i * 8..i * 8 + 8].copy_from_slice(&x.to_le_bytes());
        }
    }
    let (_, params) = comm.run_owned(
        Kind::Coll(Collective::Broadcast),
        (params, Scratch::new(24)),
        24,
        DataType::Uint8,
        Algorithm::Ring,
    )?;
    let v = params.bytes();
    let f = |i: usize| f64::from_le_bytes(v[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    let m = comm.model.with_measured(f(0), f(1), f(2));
    log::info!(
        "calibration on {n} ranks: alpha {:.2} us, beta {:.3} GB/s, gamma {:.2} GB/s",
        m.alpha_us,
        1.0 / (m.beta_us_per_byte * 1e3),
        1.0 / (m.gamma_us_per_byte * 1e3)
    );
    Ok(m)
}

/// Spans of a whole buffer, for tests and tools.
pub fn whole(buf: algo::Buf, len: usize) -> Span {
    Span::new(buf, 0, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_choices_are_kept_per_model() {
        use crate::transport::loopback::LoopbackFabric;
        let cfg = Config::from_lookup(|_| None).unwrap();
        let f = LoopbackFabric::new();
        let eps: Vec<Arc<dyn Transport>> = (0..4)
            .map(|_| Arc::new(f.endpoint()) as Arc<dyn Transport>)
            .collect();
        let addrs: Vec<Vec<u8>> = eps.iter().map(|e| e.address()).collect();
        let mut comm = Comm::new(0, eps[0].clone(), &addrs, &cfg).unwrap();
        let p = Problem::new(Collective::AllReduce, 4, 1 << 20);
        let latency_bound = Model::new(1e4, 100.0, 100.0);
        let bandwidth_bound = Model::new(1e-3, 0.01, 100.0);
        let opts = |c: &Comm| c.choose(&p, 4, None).unwrap();
        comm.set_model(latency_bound.clone());
        let first = opts(&comm);
        assert_eq!(first, opts(&comm), "a kept choice is the same choice");
        comm.set_model(bandwidth_bound.clone());
        let second = opts(&comm);
        assert_ne!(
            first.0, second.0,
            "the two models must disagree for this test to mean anything"
        );
        let base = Options {
            slice: comm.slice / 4,
            local: comm.local,
            intra: Algorithm::Ring,
            inter: Algorithm::Ring,
        };
        assert_eq!(second, bandwidth_bound.choose(&p, 4, base, comm.local));
        comm.set_model(latency_bound.clone());
        assert_eq!(opts(&comm), latency_bound.choose(&p, 4, base, comm.local));
        // A forced algorithm is kept under its own key, not as auto's choice.
        assert_eq!(
            comm.choose(&p, 4, Some(Algorithm::Ring)).unwrap().0,
            Algorithm::Ring
        );
    }

    /// Whether each of the ranks, threads pinned to `sets[r]`, spins after the exchange (and
    /// that its cost model knows whether the ranks share CPUs).
    fn spins_when_pinned(sets: &[Vec<usize>]) -> Vec<bool> {
        use crate::transport::loopback::LoopbackFabric;
        let cfg = Config::from_lookup(|_| None).unwrap();
        let f = LoopbackFabric::new();
        let eps: Vec<Arc<dyn Transport>> = sets
            .iter()
            .map(|_| Arc::new(f.endpoint()) as Arc<dyn Transport>)
            .collect();
        let addrs: Vec<Vec<u8>> = eps.iter().map(|e| e.address()).collect();
        std::thread::scope(|s| {
            let hs: Vec<_> = sets
                .iter()
                .zip(eps)
                .enumerate()
                .map(|(r, (cpus, ep))| {
                    let (addrs, cfg) = (&addrs, &cfg);
                    s.spawn(move || {
                        placement::bind_to(cpus).expect("bind");
                        let mut c = Comm::new(r, ep, addrs, cfg).unwrap();
                        c.learn_placement().unwrap();
                        // One machine: its ranks share CPUs exactly when they do not spin.
                        assert_eq!(c.model().shared_cpus, !c.spin, "rank {r}");
                        c.spin
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn waiters_spin_when_the_exchanged_cpu_sets_give_each_rank_a_cpu() {
        let mine = placement::allowed_cpus();
        if mine.len() < 2 {
            eprintln!("SKIP: needs 2 CPUs, this process may use {mine:?}");
            return;
        }
        let (a, b) = (mine[0], mine[1]);
        // Bound one per CPU, as mpirun binds: each sees one CPU, and each has one.
        assert_eq!(spins_when_pinned(&[vec![a], vec![b]]), [true, true]);
        // Both bound to one CPU: they share it.
        assert_eq!(spins_when_pinned(&[vec![a], vec![a]]), [false, false]);
        // Unbound on 2 CPUs: 2 ranks fit, 3 do not.
        assert_eq!(spins_when_pinned(&vec![vec![a, b]; 2]), [true, true]);
        assert_eq!(spins_when_pinned(&vec![vec![a, b]; 3]), [false; 3]);
    }
}

//! The request table of a communicator (`Engine`) and the per-call paths over it: prepare a
//! call's executor (cached schedules and plans, the spare executor), start it, test and wait,
//! and run a blocking collective, over the direct channel where it fits. Polling progress is
//! `progress.rs`.
use super::call::{algo_arg, Call, Kind, RequestId};
use super::compressed::Phased;
use super::late::Late;
use super::notify::Notified;
use super::Comm;
use crate::algo::{self, Algorithm, Options, Problem, Schedule};
use crate::config::Compression;
use crate::error::{Error, Result};
use crate::exec::{p2p_key, Args, BufPool, Exec, Idle, Job, Plan, Tags, MAX_TAG};
use crate::transport::{Completion, Peer, Scratch, Transport};
use rustc_hash::FxHashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Where a request stands; done and failed ones stay until `test` reports them.
pub(super) enum ReqState {
    Running(Box<Exec>),
    Done,
    Failed(Error),
}

type ScheduleKey = (Problem, Algorithm, Options, usize);

/// A schedule, this rank's plan of it, and whether every message of the plan fits the
/// transport's direct channel to its peer (then a blocking call runs it with `run_direct`).
#[derive(Clone)]
pub(super) struct Planned {
    pub(super) schedule: Arc<Schedule>,
    pub(super) plan: Arc<Plan>,
    direct: bool,
}

/// A communicator's requests and what its calls keep between them (schedules, plans,
/// buffers, the spare executor), behind the communicator's one lock.
pub(super) struct Engine {
    pub(super) execs: FxHashMap<u32, ReqState>,
    next_id: u32,
    seq: u32,
    p2p_send: Vec<u64>,
    p2p_recv: Vec<u64>,
    /// Transfers per (sends, peer, tag) of the tagged ones (tag 0 counts in `p2p_send`/`p2p_recv`).
    p2p_tagged: FxHashMap<(bool, usize, u32), u64>,
    /// Memory of failed collectives that operations may still touch.
    pub(super) graveyard: Vec<Scratch>,
    pub(super) scratch: Vec<Completion>,
    /// Schedules and this rank's plan of them, per (problem, algorithm, options, element size).
    cache: FxHashMap<ScheduleKey, Planned>,
    /// Staging, Tmp and backup memory kept between calls.
    pub(super) pool: BufPool,
    /// The last collective's choice and schedule: a loop of the same call skips its checks
    /// and both lookups.
    last: Option<(Repeat, Algorithm, Planned)>,
    /// The executor of the last collective that finished, kept for the next call of the same
    /// plan (`park`, `Exec::rearm`).
    pub(super) spare: Option<Box<Exec>>,
    /// Blocking collectives that ran over the direct channel (`run_direct`).
    pub(super) direct_runs: u64,
    /// Requests handed to `Comm::notify`, with their callbacks (`notify`).
    pub(super) notified: Notified,
    /// The ranks this one exchanged messages with, or posted a receive from: its goodbye
    /// goes to them (`goodbye`).
    pub(super) talked: Vec<bool>,
    /// Compressed calls in progress (`compressed`), by request: the request's executor runs
    /// their current exchange.
    pub(super) phased: FxHashMap<u32, Box<Phased>>,
    /// Late notices: calls that differed, learned after they returned here (`late`).
    pub(super) late: Late,
}

impl Engine {
    pub(super) fn new(nranks: usize) -> Engine {
        Engine {
            execs: FxHashMap::default(),
            next_id: 1,
            seq: 0,
            p2p_send: vec![0; nranks],
            p2p_recv: vec![0; nranks],
            p2p_tagged: FxHashMap::default(),
            graveyard: Vec::new(),
            scratch: Vec::new(),
            cache: FxHashMap::default(),
            pool: BufPool::default(),
            last: None,
            spare: None,
            direct_runs: 0,
            notified: Notified::default(),
            talked: vec![false; nranks],
            phased: FxHashMap::default(),
            late: Late::default(),
        }
    }

    /// Mark the ranks `x` exchanges messages with: the goodbye goes to them.
    pub(super) fn note_talked(&mut self, x: &Exec) {
        for &p in &x.plan().message_peers {
            self.talked[p] = true;
        }
    }

    /// A new request id.
    fn new_id(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        id
    }

    /// `n` consecutive collective sequence numbers; the first.
    pub(super) fn take_seqs(&mut self, n: u32) -> u32 {
        let s = self.seq;
        self.seq = self.seq.wrapping_add(n);
        s
    }

    /// A failed request's compressed call: its buffers join the graveyard, since operations
    /// of its exchange may still touch them.
    pub(super) fn bury_phased(&mut self, id: u32) {
        if let Some(p) = self.phased.remove(&id) {
            self.graveyard.extend(p.into_buffers());
        }
    }

    /// Refuse a collective while `MAX_IN_FLIGHT` are in flight: tags repeat after a few
    /// thousand (`exec::MAX_IN_FLIGHT`). A compressed call counts as one for its executor and
    /// one for every two sequence numbers past the first two it took (at least one: the
    /// inter-host-only AllReduce's four exchanges count two, a pipelined call's chunks more),
    /// so the calls in flight never take more than the `2 * MAX_IN_FLIGHT` numbers a tag
    /// tells apart.
    fn check_room(&self) -> Result<()> {
        let n = self.execs.len()
            + self
                .phased
                .values()
                .map(|p| (p.seqs().div_ceil(2)).saturating_sub(1).max(1))
                .sum::<usize>();
        if n >= crate::exec::MAX_IN_FLIGHT {
            return Err(Error::InvalidUsage(format!(
                "{n} operations are in flight on this communicator, the most it takes: wait for some before starting more"
            )));
        }
        Ok(())
    }
}

/// What makes a collective call the same as the last one: every argument but its buffers,
/// and the communicator's algorithm setting when it was made (`Comm::algo_gen`). A call equal
/// to the last passed the same checks and gets the same choice and schedule.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Repeat {
    kind: Kind,
    count: usize,
    dtype: crate::reduce::DataType,
    op: crate::reduce::RedOp,
    root: usize,
    algo: Option<Algorithm>,
    setting: u64,
}

impl Repeat {
    fn of(call: &Call, setting: u64) -> Repeat {
        Repeat {
            kind: call.kind,
            count: call.count,
            dtype: call.dtype,
            op: call.op,
            root: call.root,
            algo: call.algo,
            setting,
        }
    }
}

/// Where a collective's executor comes from: a new one for this plan, or the spare.
enum Prep {
    Fresh(Planned),
    Spare(Box<Exec>),
}

impl Comm {
    pub(super) fn schedule(
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
        let planned = self.planned(schedule, elem)?;
        if e.cache.len() > 256 {
            e.cache.clear();
        }
        e.cache.insert((p, a, o, elem), planned.clone());
        Ok(planned)
    }

    /// This rank's plan of `schedule`, and whether it fits the direct channel.
    pub(super) fn planned(&self, schedule: Arc<Schedule>, elem: usize) -> Result<Planned> {
        let plan = Arc::new(Plan::new(&schedule, self.rank, elem)?);
        let direct = plan
            .message_peers
            .iter()
            .map(|&r| self.transport.direct_bytes(self.peers[r]))
            .all(|d| d > 0 && plan.max_message <= d);
        Ok(Planned {
            schedule,
            plan,
            direct,
        })
    }

    /// Start a call; returns its request.
    pub fn start(&self, call: &Call) -> Result<RequestId> {
        self.start_with(call, None)
    }

    /// Start a call with a per-call compression (None: the communicator's; see
    /// `compression_for`); returns its request.
    pub fn start_with(&self, call: &Call, compress: Option<Compression>) -> Result<RequestId> {
        self.check_alive()?;
        let mut e = self.engine.lock();
        let id = match self.compression_for(call, compress)? {
            Some(codec) => self.insert_compressed(&mut e, call, codec)?,
            None => {
                let (exec, id, _) = self.prepare(call, &mut e, None)?;
                e.execs.insert(id, ReqState::Running(exec));
                id
            }
        };
        self.progress(&mut e)?;
        Ok(id as RequestId)
    }

    /// Starts `call`, whose buffers are device memory that `device` registered, uncompressed
    /// (the direct device calls, `coll::device`).
    pub(crate) fn start_device(
        &self,
        call: &Call,
        device: Arc<dyn crate::exec::DeviceMem>,
    ) -> Result<RequestId> {
        self.check_alive()?;
        let mut e = self.engine.lock();
        let (exec, id, _) = self.prepare(call, &mut e, Some(device))?;
        e.execs.insert(id, ReqState::Running(exec));
        self.progress(&mut e)?;
        Ok(id as RequestId)
    }

    /// Start a compressed call and put it in the table; its request id.
    fn insert_compressed(
        &self,
        e: &mut Engine,
        call: &Call,
        codec: crate::compress::Codec,
    ) -> Result<u32> {
        e.check_room()?;
        let id = e.new_id();
        let (x, p) = self.start_compressed(e, call, codec, id)?;
        e.execs.insert(id, ReqState::Running(x));
        e.phased.insert(id, p);
        Ok(id)
    }

    /// Check a call and make its `Exec`, with its request id and whether it may run over the
    /// direct channel (`Planned::direct`; never for point-to-point calls).
    fn prepare(
        &self,
        call: &Call,
        e: &mut Engine,
        device: Option<Arc<dyn crate::exec::DeviceMem>>,
    ) -> Result<(Box<Exec>, u32, bool)> {
        let elem = call.dtype.size();
        if !matches!(
            call.kind,
            Kind::Send { .. } | Kind::Recv { .. } | Kind::Tagged { .. }
        ) {
            e.check_room()?;
        }
        let (schedule, rank) = match call.kind {
            Kind::Coll(coll) | Kind::Window { coll, .. } => {
                let again = Repeat::of(call, self.algo_gen.load(Ordering::Acquire));
                if !matches!(&e.last, Some((k, ..)) if *k == again) {
                    let p = call.problem(coll, self.nranks)?;
                    let (a, o) = self.choose(&p, elem, call.algo)?;
                    let planned = self.schedule(e, p, a, o, elem)?;
                    e.last = Some((again, a, planned));
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
            Kind::Varied(l) => {
                // Built for this rank only and not cached: the counts make each call its own.
                let spec = call.varied_spec(&l, self.nranks, self.rank)?;
                let s =
                    algo::varied::schedule(self.nranks, &[(self.rank, &spec)]).map_err(algo_arg)?;
                let planned = self.planned(Arc::new(s), elem)?;
                let (a, d) = (planned.schedule.algo, planned.direct);
                (Some((Prep::Fresh(planned), a, d)), self.rank)
            }
            Kind::Send { peer } | Kind::Recv { peer } => {
                call.check_p2p(peer, self.nranks)?;
                (None, self.rank)
            }
            Kind::Tagged { peer, tag, .. } => {
                if tag > MAX_TAG {
                    return Err(Error::arg(
                        "tag",
                        format!("{tag} is above FABRICOLL_MAX_TAG ({MAX_TAG})"),
                    ));
                }
                call.check_p2p(peer, self.nranks)?;
                (None, self.rank)
            }
        };
        let id = e.new_id();
        let mut direct = false;
        let reused = matches!(schedule, Some((Prep::Spare(_), ..)));
        let exec = match (schedule, call.kind) {
            (Some((prep, a, d)), _) => {
                direct = d;
                let seq = e.take_seqs(1);
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
                    restore: self.restore,
                    signature: None,
                    device,
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
            (None, kind) => {
                let (send, peer, tag) = match kind {
                    Kind::Send { peer } => (true, peer, 0),
                    Kind::Recv { peer } => (false, peer, 0),
                    Kind::Tagged { send, peer, tag } => (send, peer, tag),
                    _ => unreachable!("collectives have schedules"),
                };
                let c = if tag != 0 {
                    e.p2p_tagged.entry((send, peer, tag)).or_default()
                } else if send {
                    &mut e.p2p_send[peer]
                } else {
                    &mut e.p2p_recv[peer]
                };
                let k = *c;
                *c += 1;
                Exec::p2p(
                    send,
                    self.rank,
                    peer,
                    self.nranks,
                    if send { call.send } else { call.recv },
                    call.count,
                    call.dtype,
                    p2p_key(tag, k),
                    self.timeout,
                    id,
                    &mut e.pool,
                    device,
                )?
            }
        };
        // A re-armed executor runs a plan whose peers were marked when it was new.
        if !reused {
            e.note_talked(&exec);
        }
        Ok((exec, id, direct))
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
        if !e.execs.contains_key(&id) || e.notified.contains_key(&id) {
            return Err(Error::arg(
                "request",
                "not a pending request of this communicator (or handed to notify)",
            ));
        }
        let moved = self.progress(&mut e)?;
        match e.execs.get(&id) {
            Some(ReqState::Running(_)) => Ok((false, moved)),
            Some(ReqState::Done) => {
                e.execs.remove(&id);
                match e.late.take() {
                    Some(err) => Err(err),
                    None => Ok((true, moved)),
                }
            }
            Some(ReqState::Failed(_)) => {
                self.flush_notices(&mut e);
                match e.execs.remove(&id) {
                    Some(ReqState::Failed(err)) => Err(err),
                    _ => unreachable!(),
                }
            }
            None => Err(Error::Internal("request vanished".into())),
        }
    }

    /// Wait for a request. While something moved in the last `FABRICOLL_POLL_US`, poll,
    /// yielding the core between idle rounds so that ranks that outnumber the cores get to
    /// run (a yield with nothing else runnable returns at once; spinning first only delayed
    /// the rank that had to make progress). After that long without progress, sleep on the
    /// completion queue until it signals (`SLEEP_SLICE` at a time; every collective's own
    /// deadline still applies).
    pub fn wait(&self, req: RequestId) -> Result<()> {
        let mut idle = Idle::new(self.spin, self.poll);
        let _waiting = Waiting::new(&*self.transport);
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
                self.transport.wait(SLEEP_SLICE)?;
                idle.moved();
            }
        }
    }

    /// A blocking call. With nothing else in flight on the communicator, a collective whose
    /// messages all fit the transport's direct channel (the shm fastbox) runs there, in this
    /// thread, without posting operations (`Exec::run_direct`); the messages are the same on
    /// the wire, so peers may run the same call either way.
    pub fn run(&self, call: &Call) -> Result<()> {
        self.run_with(call, None)
    }

    /// `run` with a per-call compression (None: the communicator's; see `compression_for`).
    pub fn run_with(&self, call: &Call, compress: Option<Compression>) -> Result<()> {
        self.check_alive()?;
        let mut e = self.engine.lock();
        if let Some(codec) = self.compression_for(call, compress)? {
            let id = self.insert_compressed(&mut e, call, codec)?;
            self.progress(&mut e)?;
            drop(e);
            return self.wait(id as RequestId);
        }
        let (exec, id, direct) = self.prepare(call, &mut e, None)?;
        if direct && e.execs.is_empty() {
            // The direct path reads no completion: every `LATE_POLL_EVERY` runs, read them
            // first, for late notices (a poll on every run would cost the smallest calls a
            // good part of their time).
            if e.direct_runs.is_multiple_of(LATE_POLL_EVERY) {
                self.progress(&mut e)?;
            }
            return self.run_direct(&mut e, exec);
        }
        e.execs.insert(id, ReqState::Running(exec));
        self.progress(&mut e)?;
        drop(e);
        self.wait(id as RequestId)
    }

    /// `run` over the direct channel; the engine stays locked throughout (calls on one
    /// communicator are serialised, and nothing else of it is in flight).
    fn run_direct(&self, e: &mut Engine, mut exec: Box<Exec>) -> Result<()> {
        let t = &*self.transport;
        let mut idle = Idle::new(self.spin, self.poll);
        e.direct_runs += 1;
        match exec.run_direct(t, &self.peers, &mut idle, &self.aborted) {
            Ok(()) => {
                e.late.succeeded(&exec);
                park(&mut e.spare, &mut e.pool, exec);
                match e.late.take() {
                    Some(err) => Err(err),
                    None => Ok(()),
                }
            }
            Err(err) => {
                e.late.failed(&exec);
                let err = exec.explain(err);
                // Nothing was posted: the memory goes back to the pool, not the graveyard.
                let (keep, notices) = exec.fail_noting(t, &self.peers);
                for b in keep {
                    e.pool.put(b);
                }
                e.late.sent(notices);
                self.flush_notices(e);
                Err(err)
            }
        }
    }
}

/// A blocking wait on a transport, announced for as long as it lives (`Transport::owner_waits`).
struct Waiting<'a>(&'a dyn Transport);

impl<'a> Waiting<'a> {
    fn new(t: &'a dyn Transport) -> Waiting<'a> {
        t.owner_waits(true);
        Waiting(t)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.owner_waits(false);
    }
}

/// How often a blocking call on the direct path polls the transport first, so that late
/// notices reach a communicator whose calls all run there (`late`).
const LATE_POLL_EVERY: u64 = 64;

/// Longest single sleep of a waiter on the completion queue, so that it re-checks its request
/// and the deadline even when the queue's wait object never signals.
pub(super) const SLEEP_SLICE: Duration = Duration::from_millis(1);

/// Largest Tmp memory a spare executor keeps outside the pool (and its `POOL_LIMIT`): re-arming
/// saves little next to a large call (`docs/performance.md`).
const SPARE_TMP_LIMIT: usize = 1 << 20;

/// Keep a finished collective's executor as the spare for the next call of its plan
/// (`Exec::rearm`); the spare it replaces goes back to the pool. Point-to-point executors
/// are not kept (each transfer makes its own one-step plan), nor ones with more than
/// `SPARE_TMP_LIMIT` bytes of Tmp.
pub(super) fn park(spare: &mut Option<Box<Exec>>, pool: &mut BufPool, mut x: Box<Exec>) {
    if !x.is_collective() || x.tmp_bytes() > SPARE_TMP_LIMIT {
        x.recycle(pool);
        return;
    }
    x.retire(pool);
    if let Some(mut old) = spare.replace(x) {
        old.recycle(pool);
    }
}

/// Fail request `id` with `err`, keeping its memory in the graveyard while operations may
/// still touch it.
pub(super) fn fail(e: &mut Engine, t: &dyn Transport, peers: &[Peer], id: u32, mut err: Error) {
    if let Some(ReqState::Running(x)) = e.execs.remove(&id) {
        e.late.failed(&x);
        err = x.explain(err);
        let (keep, notices) = x.fail_noting(t, peers);
        e.late.sent(notices);
        e.graveyard.extend(keep);
    }
    e.bury_phased(id);
    e.execs.insert(id, ReqState::Failed(err));
}

//! Runs one rank's part of a `Schedule` over a `Transport` as a polled state machine.
//!
//! A step runs once its dependencies are done: sends and receives are posted to the transport,
//! copies and reductions run in the polling thread, so receive, reduce and send of consecutive
//! slices overlap. A `RecvReduce` receives into a staging buffer and reduces when the message
//! is in; staging is bounded (`STAGING_LIMIT` bytes per collective, beyond which receives wait
//! for earlier ones to finish; one message larger than the limit is still staged alone).
//! An in-place call whose steps write over the input runs on a backup of it, which also
//! restores the caller's buffer if the collective fails, so a failed collective never leaves a
//! half-reduced buffer behind. One that writes nothing over its input (AllGather and the
//! Broadcast root in NCCL's layouts) reads the input itself and skips the copy onto itself.
#![deny(unsafe_code)]

use crate::algo::{Buf, Collective, Op, Schedule, Span};
use crate::error::{Error, Result};
use crate::reduce::{self, DataType, RedOp};
use crate::transport::{Completion, OpId, Peer, Posted, Region, Scratch, Transport};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Staging memory one collective may hold for receive-and-reduce.
pub const STAGING_LIMIT: usize = 16 << 20;

/// Memory a communicator keeps between calls for staging, Tmp and in-place backups.
pub const POOL_LIMIT: usize = 32 << 20;

/// Scratch buffers kept between calls, so that a collective neither allocates nor zeroes its
/// staging and Tmp memory again (zeroing alone costs as much as a copy). At most `POOL_LIMIT`
/// bytes are kept; a reused buffer holds whatever its last user left (schedules write Tmp and
/// staging before reading them: the symbolic checker proves it).
#[derive(Default)]
pub struct BufPool {
    bufs: Vec<Scratch>,
    bytes: usize,
    /// Step lists of finished collectives, reused by the next ones (a small collective's
    /// allocations cost as much as its messages).
    lists: Vec<Lists>,
}

/// An `Exec`'s per-step lists, kept between calls by `BufPool`.
#[derive(Default)]
struct Lists {
    state: Vec<St>,
    pending: Vec<u32>,
    ready: VecDeque<usize>,
    staging: Vec<Option<(Scratch, usize)>>,
    batch: Vec<usize>,
}

/// How many `Lists` a pool keeps.
const LISTS_KEPT: usize = 8;

impl BufPool {
    /// A buffer of at least `len` bytes: the smallest kept one that fits, else a new one
    /// (an empty one for `len` 0, which keeps the pool's buffers for real work).
    pub fn take(&mut self, len: usize) -> Scratch {
        if len == 0 {
            return Scratch::new(0);
        }
        let best = self
            .bufs
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= len)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                let b = self.bufs.swap_remove(i);
                self.bytes -= b.len();
                b
            }
            None => Scratch::new(len),
        }
    }

    /// Keep `b` for later calls, unless the pool is full.
    pub fn put(&mut self, b: Scratch) {
        if b.is_empty() || self.bytes + b.len() > POOL_LIMIT {
            return;
        }
        self.bytes += b.len();
        self.bufs.push(b);
    }
}

/// Wire tags of collective messages: `kind:1 (1) | sequence:22 | source rank:20 | message:20`,
/// 63 bits in all (`transport::TAG_BITS`: libfabric's net provider keeps bit 63 for itself).
pub fn coll_tag(seq: u32, src: usize, k: usize) -> u64 {
    (1u64 << 62)
        | ((seq as u64 & 0x3f_ffff) << 40)
        | ((src as u64 & 0xf_ffff) << 20)
        | (k as u64 & 0xf_ffff)
}

/// Wire tags of point-to-point messages: `kind:1 (0) | source rank:20 | sequence per pair:42`.
pub fn p2p_tag(src: usize, seq: u64) -> u64 {
    ((src as u64 & 0xf_ffff) << 42) | (seq & ((1 << 42) - 1))
}

/// Largest rank count the tags carry.
pub const MAX_RANKS: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Waiting,
    Posted,
    Done,
}

/// Tagging of a job's messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tags {
    /// A collective: its sequence number on the communicator (the same on every rank).
    Coll(u32),
    /// A point-to-point transfer: its number among the transfers between the two ranks.
    P2p(u64),
}

/// Everything one rank needs to run its part of a collective.
pub struct Job {
    pub schedule: Arc<Schedule>,
    pub rank: usize,
    pub args: Args,
}

/// A job's call: what changes between calls that run one plan (`Exec::rearm`).
pub struct Args {
    pub dtype: DataType,
    pub op: RedOp,
    /// The caller's buffers (in bytes). For an in-place call pass the same region twice.
    pub inp: Region,
    pub out: Region,
    /// How messages are tagged.
    pub tags: Tags,
    pub timeout: Duration,
    /// Post ready sends before ready receives (see `Exec::priority`).
    pub sends_first: bool,
}

/// What the executor derives from one rank's steps, computed once per (schedule, rank) and
/// shared by every call that runs it.
#[derive(Debug)]
pub struct Plan {
    pending: Vec<u32>,
    dependents: Vec<Vec<u32>>,
    keys: Vec<u32>,
    ready: Vec<usize>,
    need_in: usize,
    need_out: usize,
    /// Byte ranges `(start, end)` of Out that steps write, each with the In offset it is
    /// copied from when the step is a copy from In.
    out_writes: Vec<(usize, usize, Option<usize>)>,
    /// The largest message this rank sends or receives, in bytes, and the ranks it exchanges
    /// messages with (each once): what `run_direct` needs of the transport.
    pub max_message: usize,
    pub message_peers: Vec<usize>,
}

impl Plan {
    /// Rank `rank`'s plan of `schedule`, for elements of `elem` bytes.
    pub fn new(schedule: &Schedule, rank: usize, elem: usize) -> Result<Plan> {
        let steps = &schedule.ranks[rank];
        let n = steps.len();
        let reach = |b: Buf| {
            steps
                .iter()
                .flat_map(|s| s.op.reads().into_iter().chain(s.op.writes()))
                .filter(|sp| sp.buf == b)
                .map(|sp| sp.end())
                .max()
                .unwrap_or(0)
                * elem
        };
        let mut dependents = vec![Vec::new(); n];
        let mut pending = vec![0u32; n];
        for (i, s) in steps.iter().enumerate() {
            pending[i] = s.deps.len() as u32;
            for &d in &s.deps {
                dependents[d].push(i as u32);
            }
        }
        // Message numbers per peer, in program order (the matching rule of schedules).
        let nr = schedule.problem.nranks;
        let mut sent = vec![0u32; nr];
        let mut recvd = vec![0u32; nr];
        let mut keys = vec![0u32; n];
        for (i, s) in steps.iter().enumerate() {
            match &s.op {
                Op::Send { peer, .. } => {
                    keys[i] = sent[*peer];
                    sent[*peer] += 1;
                }
                Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => {
                    keys[i] = recvd[*peer];
                    recvd[*peer] += 1;
                }
                _ => {}
            }
        }
        let out_writes = steps
            .iter()
            .filter_map(|s| {
                let w = s.op.writes().filter(|w| w.buf == Buf::Out && w.len > 0)?;
                let from = match &s.op {
                    Op::Copy { src, .. } if src.buf == Buf::In => Some(src.off * elem),
                    _ => None,
                };
                Some((w.off * elem, w.end() * elem, from))
            })
            .collect();
        let max_message = steps
            .iter()
            .filter_map(|s| match &s.op {
                Op::Send { src: sp, .. }
                | Op::Recv { dst: sp, .. }
                | Op::RecvReduce { dst: sp, .. } => Some(sp.len * elem),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let message_peers = (0..nr).filter(|&p| sent[p] + recvd[p] > 0).collect();
        if sent.iter().chain(&recvd).any(|k| *k as usize >= MAX_RANKS) {
            return Err(Error::InvalidUsage(
                "schedule has too many messages per peer for the tag space".into(),
            ));
        }
        Ok(Plan {
            ready: (0..n).filter(|i| pending[*i] == 0).collect(),
            pending,
            dependents,
            keys,
            need_in: reach(Buf::In),
            need_out: reach(Buf::Out),
            out_writes,
            max_message,
            message_peers,
        })
    }

    /// Whether a call whose input starts `delta` bytes into its output and is `len` bytes
    /// long writes over its own input: any write into those bytes, except a copy of the input
    /// onto itself (which the executor skips). Without one, an in-place call needs no backup:
    /// it reads an input nothing changes and has nothing to restore (AllGather and Broadcast
    /// in NCCL's in-place layout).
    fn overwrites_input(&self, delta: usize, len: usize) -> bool {
        self.out_writes.iter().any(|&(a, b, from)| {
            a < delta + len && delta < b && from.map(|src| src + delta) != Some(a)
        })
    }
}

/// What a waiting thread does between polls that found nothing: spin while its ranks have a
/// core each (`spin`) for up to `window` of idleness, else (and after that) yield the core so
/// that ranks outnumbering the cores get to run.
pub struct Idle {
    spin: bool,
    window: Duration,
    since: Option<Instant>,
    rounds: u32,
}

impl Idle {
    /// Idle rounds between readings of the clock while spinning.
    const CLOCK_EVERY: u32 = 64;

    pub fn new(spin: bool, window: Duration) -> Idle {
        Idle {
            spin,
            window,
            since: None,
            rounds: 0,
        }
    }

    /// Something moved: the next idle round starts a new idle period.
    pub fn moved(&mut self) {
        self.since = None;
    }

    /// Whether the idle period has lasted `window` (reads the clock; `pause` asks only every
    /// `CLOCK_EVERY` rounds).
    pub fn expired(&mut self) -> bool {
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        now.duration_since(since) >= self.window
    }

    /// One idle round: a pause hint while spinning, else a yield.
    pub fn pause(&mut self) {
        if self.spin {
            self.rounds += 1;
            if self.rounds < Self::CLOCK_EVERY && self.since.is_some() {
                std::hint::spin_loop();
                return;
            }
            self.rounds = 0;
            if !self.expired() {
                std::hint::spin_loop();
                return;
            }
        }
        std::thread::yield_now();
    }
}

/// The first `len` bytes of memory an executor owns (Tmp, the backup, a staging buffer), as a
/// region to post and reduce on. The one place exec makes a region.
#[allow(unsafe_code)]
fn owned(buf: &Scratch, len: usize) -> Region {
    // SAFETY: an executor's buffers stay owned by it while any step may use their regions;
    // `fail` hands them to the communicator, which keeps them until the provider's operations
    // drain or leaks them. So no region made here outlives its memory.
    let whole = unsafe { buf.region() };
    whole
        .sub(0, len)
        .expect("executor buffers are at least as long as asked")
}

/// One rank's collective in progress.
pub struct Exec {
    job: Job,
    elem: usize,
    inp: Region,
    out: Region,
    tmp: Scratch,
    /// The input's copy when in place (`inp` then points into it).
    backup: Option<Scratch>,
    state: Vec<St>,
    pending: Vec<u32>,
    plan: Arc<Plan>,
    ready: VecDeque<usize>,
    /// Staging of posted receive-and-reduce steps: the buffer and the message length.
    staging: Vec<Option<(Scratch, usize)>>,
    staged: usize,
    done: usize,
    /// Progress since the deadline clock was last read, and polls since then; the clock's
    /// last reading (None before the first: the deadline then starts up to
    /// `DEADLINE_POLLS` polls late, and a call that never waits never reads the clock).
    moved: bool,
    polls: u32,
    last: Option<Instant>,
    /// Ready steps being run (kept to reuse its memory).
    batch: Vec<usize>,
    id: u64,
    posted_recvs: usize,
    finished: bool,
}

/// A message of `got` bytes where the schedule expects `want`.
fn wrong_size(got: usize, want: usize) -> Error {
    Error::Remote(format!(
        "received {got} bytes where {want} were expected: do all ranks call the same collective with the same count and type?"
    ))
}

fn bytes(elem: usize, s: &Span) -> (usize, usize) {
    (s.off * elem, s.len * elem)
}

impl Exec {
    /// Prepare rank `job.rank`'s steps (`plan` is `Plan::new` of the same schedule and rank);
    /// `id` distinguishes concurrent collectives' operations.
    pub fn new(job: Job, plan: Arc<Plan>, id: u32, pool: &mut BufPool) -> Result<Box<Exec>> {
        let elem = job.args.dtype.size();
        let tmp = pool.take(job.schedule.tmp_len[job.rank] * elem);
        let l = pool.lists.pop().unwrap_or_default();
        let mut x = Box::new(Exec {
            elem,
            inp: Region::empty(),
            out: Region::empty(),
            tmp,
            backup: None,
            state: l.state,
            pending: l.pending,
            ready: l.ready,
            plan,
            staging: l.staging,
            staged: 0,
            done: 0,
            moved: false,
            polls: 0,
            last: None,
            batch: l.batch,
            id: 0,
            posted_recvs: 0,
            finished: false,
            job,
        });
        if let Err(e) = x.arm(id, pool) {
            x.recycle(pool);
            return Err(e);
        }
        Ok(x)
    }

    /// Make a finished `Exec` (one `retire` kept) run its plan again, for the call `args`
    /// describes: the schedule, the plan and the Tmp memory stay, and nothing is allocated
    /// unless the call needs a backup of its input. The caller matched the plan to the call
    /// (the same problem, algorithm and element size); `args.dtype` is of that size.
    pub fn rearm(&mut self, args: Args, id: u32, pool: &mut BufPool) -> Result<()> {
        debug_assert_eq!(args.dtype.size(), self.elem, "the plan's element size");
        self.job.args = args;
        self.arm(id, pool)
    }

    /// The per-call part of `new` and `rearm`: check the job's buffers against the plan, take
    /// a backup of an input the steps overwrite, and reset the steps to the plan's start.
    fn arm(&mut self, id: u32, pool: &mut BufPool) -> Result<()> {
        let plan = &self.plan;
        let (need_in, need_out) = (plan.need_in, plan.need_out);
        if self.job.args.inp.len() < need_in {
            return Err(Error::arg(
                "sendbuff",
                format!(
                    "{} bytes, the collective reads {need_in}",
                    self.job.args.inp.len()
                ),
            ));
        }
        if self.job.args.out.len() < need_out {
            return Err(Error::arg(
                "recvbuff",
                format!(
                    "{} bytes, the collective writes {need_out}",
                    self.job.args.out.len()
                ),
            ));
        }
        let inp = self.job.args.inp.sub(0, need_in).expect("checked");
        let out = self.job.args.out.sub(0, need_out).expect("checked");
        // Overlap of input and output: run on a copy of the input (also the restore point),
        // unless the steps leave the input as it is.
        let overlap = !inp.is_empty()
            && !out.is_empty()
            && inp.addr() < out.addr() + out.len()
            && out.addr() < inp.addr() + inp.len();
        let needs_backup = overlap
            && (inp.addr() < out.addr()
                || plan.overwrites_input(inp.addr() - out.addr(), inp.len()));
        debug_assert!(self.backup.is_none(), "new and retire leave no backup");
        self.inp = if needs_backup {
            let b = pool.take(inp.len());
            let copy = owned(&b, inp.len());
            inp.with(|src| copy.with_mut(|dst| reduce::copy(dst, src)));
            self.backup = Some(b);
            copy
        } else {
            inp
        };
        self.out = if need_out == 0 { Region::empty() } else { out };
        let n = plan.pending.len();
        self.state.clear();
        self.state.resize(n, St::Waiting);
        self.pending.clear();
        self.pending.extend_from_slice(&plan.pending);
        self.ready.clear();
        self.ready.extend(plan.ready.iter().copied());
        self.staging.clear();
        self.staging.resize_with(n, || None);
        self.batch.clear();
        self.staged = 0;
        self.done = 0;
        self.moved = false;
        self.polls = 0;
        self.last = None;
        self.id = id as u64;
        self.posted_recvs = 0;
        self.finished = false;
        Ok(())
    }

    /// The plan this `Exec` runs.
    pub fn plan(&self) -> &Arc<Plan> {
        &self.plan
    }

    fn region(&self, s: &Span) -> Region {
        let base = match s.buf {
            Buf::In => self.inp,
            Buf::Out => self.out,
            Buf::Tmp => owned(&self.tmp, self.tmp.len()),
        };
        let (off, len) = bytes(self.elem, s);
        base.sub(off, len)
            .expect("schedule spans are checked against buffer sizes")
    }

    fn tag(&self, src: usize, step: usize) -> u64 {
        match self.job.args.tags {
            Tags::Coll(seq) => coll_tag(seq, src, self.plan.keys[step] as usize),
            Tags::P2p(k) => p2p_tag(src, k),
        }
    }

    fn op_id(&self, step: usize) -> OpId {
        (self.id << 32) | step as u64
    }

    /// The collective id of an operation id.
    pub fn exec_of(op: OpId) -> u32 {
        (op >> 32) as u32
    }

    /// Bytes of Tmp memory this holds.
    pub fn tmp_bytes(&self) -> usize {
        self.tmp.len()
    }

    /// Whether this runs a collective (not a point-to-point transfer).
    pub fn is_collective(&self) -> bool {
        matches!(self.job.args.tags, Tags::Coll(_))
    }

    pub fn is_finished(&self) -> bool {
        self.finished
    }

    fn complete(&mut self, i: usize) {
        self.state[i] = St::Done;
        self.done += 1;
        self.moved = true;
        for &d in &self.plan.dependents[i] {
            let d = d as usize;
            self.pending[d] -= 1;
            if self.pending[d] == 0 {
                self.ready.push_back(d);
            }
        }
    }

    /// Order of the ready steps: receives first (so that peers' messages find them posted
    /// instead of waiting in the provider's unexpected queue), then sends, then local work.
    /// With `Args::sends_first`, sends go before receives: over libfabric's shm the receiver
    /// copies each large message itself (one `process_vm_readv`), and it does so inside
    /// `fi_trecv` when the message is already waiting. Receives first then held our sends
    /// back from the peer for as long as those copies took, and the two ranks took turns
    /// instead of copying at the same time (a 64 MiB AllGather on 2 ranks spent 5.4 ms
    /// posting its 8 receives before its first send).
    fn priority(&self, i: usize) -> u8 {
        match (
            &self.job.schedule.ranks[self.job.rank][i].op,
            self.job.args.sends_first,
        ) {
            (Op::Recv { .. } | Op::RecvReduce { .. }, false) | (Op::Send { .. }, true) => 0,
            (Op::Recv { .. } | Op::RecvReduce { .. }, true) | (Op::Send { .. }, false) => 1,
            _ => 2,
        }
    }

    fn reduce_into(&self, a: Region, b: Region, dst: Region) -> Result<()> {
        let (dt, op) = (self.job.args.dtype, self.job.args.op);
        let r = if dst == a {
            b.with(|bb| dst.with_mut(|d| reduce::reduce_inplace(dt, op, d, bb)))
        } else if dst == b {
            a.with(|aa| dst.with_mut(|d| reduce::reduce_inplace(dt, op, d, aa)))
        } else {
            a.with(|aa| b.with(|bb| dst.with_mut(|d| reduce::reduce(dt, op, aa, bb, d))))
        };
        r.map_err(|e| Error::Internal(format!("reduction: {e}")))
    }

    /// Post or run every ready step; returns whether anything happened.
    pub fn advance(
        &mut self,
        t: &dyn Transport,
        peers: &[Peer],
        pool: &mut BufPool,
    ) -> Result<bool> {
        let mut progressed = false;
        let mut deferred = VecDeque::new();
        let mut batch = std::mem::take(&mut self.batch);
        let r = self.run_ready(t, peers, pool, &mut batch, &mut deferred, &mut progressed);
        batch.clear();
        self.batch = batch;
        r?;
        self.ready = deferred;
        self.check_finished();
        Ok(progressed)
    }

    fn run_ready(
        &mut self,
        t: &dyn Transport,
        peers: &[Peer],
        pool: &mut BufPool,
        batch: &mut Vec<usize>,
        deferred: &mut VecDeque<usize>,
        progressed: &mut bool,
    ) -> Result<()> {
        while !self.ready.is_empty() {
            batch.clear();
            batch.extend(self.ready.drain(..));
            if batch.len() > 1 {
                batch.sort_by_key(|&i| self.priority(i));
            }
            for &i in batch.iter() {
                if self.step(t, peers, pool, i, deferred)? {
                    *progressed = true;
                }
            }
        }
        Ok(())
    }

    /// Post or run ready step `i`; false if it had to wait (deferred).
    fn step(
        &mut self,
        t: &dyn Transport,
        peers: &[Peer],
        pool: &mut BufPool,
        i: usize,
        deferred: &mut VecDeque<usize>,
    ) -> Result<bool> {
        let op = self.job.schedule.ranks[self.job.rank][i].op.clone();
        match op {
            Op::Nop | Op::Copy { .. } | Op::Reduce { .. } => self.run_local(i)?,
            Op::Send { peer, src } => {
                let tag = self.tag(self.job.rank, i);
                match t.send(peers[peer], tag, self.region(&src), None, self.op_id(i))? {
                    Posted::Queued => self.state[i] = St::Posted,
                    Posted::Busy => {
                        deferred.push_back(i);
                        return Ok(false);
                    }
                }
            }
            Op::Recv { peer, dst } => {
                let tag = self.tag(peer, i);
                match t.recv(tag, 0, self.region(&dst), None, self.op_id(i))? {
                    Posted::Queued => {
                        self.state[i] = St::Posted;
                        self.posted_recvs += 1;
                    }
                    Posted::Busy => {
                        deferred.push_back(i);
                        return Ok(false);
                    }
                }
            }
            Op::RecvReduce { peer, dst, .. } => {
                let need = dst.len * self.elem;
                if self.staged > 0 && self.staged + need > STAGING_LIMIT {
                    deferred.push_back(i);
                    return Ok(false);
                }
                let buf = pool.take(need);
                let tag = self.tag(peer, i);
                let into = owned(&buf, need);
                match t.recv(tag, 0, into, None, self.op_id(i))? {
                    Posted::Queued => {
                        self.state[i] = St::Posted;
                        self.posted_recvs += 1;
                        self.staged += need;
                        self.staging[i] = Some((buf, need));
                    }
                    Posted::Busy => {
                        pool.put(buf);
                        deferred.push_back(i);
                        return Ok(false);
                    }
                }
            }
        }
        Ok(true)
    }

    /// Run the whole collective now, in the calling thread, over the transport's direct
    /// channel (`Transport::send_now` / `take_now`): nothing is posted, no completion comes.
    /// Only for an `Exec` nothing has advanced yet, whose plan's messages all fit the direct
    /// channels to their peers (`Plan::max_message`, `Transport::direct_bytes`). Each round
    /// runs the ready steps, sends before local work (a send whose channel is full stays
    /// ready), and takes every waiting receive whose message is in; between rounds that found
    /// nothing it pauses as `idle` says. The collective's deadline applies, and `aborted` is
    /// read every idle round. On an error nothing is left in flight: `fail` restores an
    /// in-place input.
    pub fn run_direct(
        &mut self,
        t: &dyn Transport,
        peers: &[Peer],
        idle: &mut Idle,
        aborted: &AtomicBool,
    ) -> Result<()> {
        let mut waiting = std::mem::take(&mut self.batch);
        waiting.clear();
        let r = self.direct_rounds(t, peers, &mut waiting, idle, aborted);
        waiting.clear();
        self.batch = waiting;
        r
    }

    fn direct_rounds(
        &mut self,
        t: &dyn Transport,
        peers: &[Peer],
        waiting: &mut Vec<usize>,
        idle: &mut Idle,
        aborted: &AtomicBool,
    ) -> Result<()> {
        let rank = self.job.rank;
        loop {
            let (mut moved, mut local) = (false, false);
            // Ready steps: sends go and receives wait in `waiting`; then local work runs, so
            // that it delays no message (a ring AllGather's copy of the own chunk comes first
            // in its schedule). A send that found the channel full stays ready for the next
            // round, and so does whatever a local step or a send makes ready.
            for _ in 0..self.ready.len() {
                let i = self.ready.pop_front().expect("counted");
                match self.job.schedule.ranks[rank][i].op {
                    Op::Recv { .. } | Op::RecvReduce { .. } => waiting.push(i),
                    Op::Send { peer, src } => {
                        let tag = self.tag(rank, i);
                        let sent = self
                            .region(&src)
                            .with(|d| t.send_now(peers[peer], tag, d))?;
                        if sent {
                            self.complete(i);
                            moved = true;
                        } else {
                            self.ready.push_back(i);
                        }
                    }
                    _ => {
                        self.ready.push_back(i);
                        local = true;
                    }
                }
            }
            // The second pass only when the first set local work aside (polls mostly find none).
            let deferred = if local { self.ready.len() } else { 0 };
            for _ in 0..deferred {
                let i = self.ready.pop_front().expect("counted");
                if self.job.schedule.ranks[rank][i].op.peer().is_none() {
                    self.run_local(i)?;
                    moved = true;
                } else {
                    self.ready.push_back(i);
                }
            }
            let mut k = 0;
            while k < waiting.len() {
                let i = waiting[k];
                if self.take_direct(t, peers, i)? {
                    waiting.swap_remove(k);
                    self.complete(i);
                    moved = true;
                } else {
                    k += 1;
                }
            }
            self.check_finished();
            if self.finished {
                return Ok(());
            }
            if moved {
                idle.moved();
            } else {
                if aborted.load(Ordering::Relaxed) {
                    return Err(Error::InvalidUsage("communicator aborted".into()));
                }
                self.check_deadline()?;
                idle.pause();
            }
        }
    }

    /// Receive step `i` over the direct channel if its message is in: true when done.
    fn take_direct(&self, t: &dyn Transport, peers: &[Peer], i: usize) -> Result<bool> {
        let (peer, src, dst) = match self.job.schedule.ranks[self.job.rank][i].op {
            Op::Recv { peer, dst } => (peer, None, dst),
            Op::RecvReduce { peer, src, dst } => (peer, Some(src), dst),
            _ => {
                return Err(Error::Internal(
                    "take_direct of a step that receives nothing".into(),
                ))
            }
        };
        let d = self.region(&dst);
        let s = src.map(|s| self.region(&s));
        let (dt, op) = (self.job.args.dtype, self.job.args.op);
        t.take_now(peers[peer], self.tag(peer, i), &mut |m: &[u8]| {
            if m.len() != d.len() {
                return Err(wrong_size(m.len(), d.len()));
            }
            let r = match s {
                None => {
                    d.with_mut(|x| reduce::copy(x, m));
                    Ok(())
                }
                // The operand order of `reduce_into(src, message, dst)` on the general path.
                Some(s) if s == d => d.with_mut(|x| reduce::reduce_inplace(dt, op, x, m)),
                Some(s) => s.with(|a| d.with_mut(|x| reduce::reduce(dt, op, a, m, x))),
            };
            r.map_err(|e| Error::Internal(format!("reduction: {e}")))
        })
    }

    /// Run local step `i` (a copy, a reduction or a join) and complete it.
    fn run_local(&mut self, i: usize) -> Result<()> {
        match self.job.schedule.ranks[self.job.rank][i].op {
            Op::Copy { src, dst } => {
                let (s, d) = (self.region(&src), self.region(&dst));
                // In place without a backup, the own chunk's copy is onto itself.
                if s.addr() != d.addr() {
                    s.with(|a| d.with_mut(|b| reduce::copy(b, a)));
                }
            }
            Op::Reduce { a, b, dst } => {
                self.reduce_into(self.region(&a), self.region(&b), self.region(&dst))?;
            }
            Op::Nop => {}
            _ => return Err(Error::Internal(format!("step {i} is not local work"))),
        }
        self.complete(i);
        Ok(())
    }

    /// Handle a transport completion of one of our operations.
    pub fn on_completion(&mut self, c: Completion, pool: &mut BufPool) -> Result<()> {
        let i = (c.op & 0xffff_ffff) as usize;
        if i >= self.state.len() || self.state[i] != St::Posted {
            return Err(Error::Internal(format!(
                "unexpected completion for step {i}"
            )));
        }
        // We cancel only operations of collectives we have given up: a cancellation reaching a
        // live one came from the provider (rxm does this when a peer's connection is lost).
        c.status.map_err(|e| match e {
            Error::InvalidUsage(m) if m.contains("cancelled") => Error::Remote(
                "the provider aborted the operation (connection to the peer lost)".into(),
            ),
            // A peer sent more than this rank's schedule expects: the ranks disagree on the call.
            Error::InvalidArgument(m) if m.contains("arrived for a receive buffer") => {
                Error::InvalidUsage(format!(
                    "{}: do the ranks make the same call with the same count and type?",
                    m.trim_start_matches("argument 'size': ")
                ))
            }
            e => e,
        })?;
        let step = self.job.schedule.ranks[self.job.rank][i].op.clone();
        match step {
            Op::Send { .. } => {}
            Op::Recv { dst, .. } => {
                self.posted_recvs -= 1;
                if c.len != dst.len * self.elem {
                    return Err(wrong_size(c.len, dst.len * self.elem));
                }
            }
            Op::RecvReduce { src, dst, .. } => {
                self.posted_recvs -= 1;
                let (buf, need) = self.staging[i].take().expect("staged receive");
                self.staged -= need;
                if c.len != need {
                    pool.put(buf);
                    return Err(wrong_size(c.len, need));
                }
                let msg = owned(&buf, need);
                let r = self.reduce_into(self.region(&src), msg, self.region(&dst));
                pool.put(buf);
                r?;
            }
            _ => return Err(Error::Internal("completion for a local step".into())),
        }
        self.complete(i);
        self.check_finished();
        Ok(())
    }

    fn check_finished(&mut self) {
        if self.finished || self.done < self.state.len() {
            return;
        }
        let p = self.job.schedule.problem;
        if self.job.args.op == RedOp::Avg
            && p.coll.reduces()
            && (p.coll != Collective::Reduce || self.job.rank == p.root)
        {
            let dt = self.job.args.dtype;
            let n = p.nranks;
            self.out.with_mut(|o| {
                let _ = reduce::scale_avg(dt, o, n);
            });
        }
        self.finished = true;
    }

    /// The deadline check: an error if nothing moved for the timeout. The clock is read every
    /// `DEADLINE_POLLS` polls (a poll that finds nothing is a few hundred ns, and a waiter
    /// that sleeps polls at least every millisecond), so the error comes at most that many
    /// polls late.
    pub fn check_deadline(&mut self) -> Result<()> {
        const DEADLINE_POLLS: u32 = 32;
        self.polls += 1;
        if self.finished || self.polls < DEADLINE_POLLS {
            return Ok(());
        }
        self.polls = 0;
        let now = Instant::now();
        let last = *self.last.get_or_insert(now);
        if std::mem::take(&mut self.moved) {
            self.last = Some(now);
            return Ok(());
        }
        if now.duration_since(last) > self.job.args.timeout {
            return Err(Error::Timeout(format!(
                "{:?} made no progress for {} ms (FABRICOLL_TIMEOUT_MS): {} of {} steps done; is every rank alive and calling it?",
                self.job.args.tags,
                self.job.args.timeout.as_millis(),
                self.done,
                self.state.len()
            )));
        }
        Ok(())
    }

    /// Give up: cancel posted receives, restore an in-place input, and hand back the memory
    /// that operations may still touch (the caller keeps it until they drain, or leaks it).
    pub fn fail(mut self, t: &dyn Transport) -> Vec<Scratch> {
        for i in 0..self.state.len() {
            if self.state[i] == St::Posted && self.job.schedule.ranks[self.job.rank][i].op.is_recv()
            {
                t.cancel(self.op_id(i));
            }
        }
        if self.backup.is_some() {
            let user = self
                .job
                .args
                .inp
                .sub(0, self.inp.len())
                .expect("backup length");
            self.inp.with(|src| user.with_mut(|d| reduce::copy(d, src)));
        }
        let mut keep: Vec<Scratch> = self.staging.drain(..).flatten().map(|(b, _)| b).collect();
        keep.push(std::mem::replace(&mut self.tmp, Scratch::new(0)));
        keep.extend(self.backup.take());
        keep
    }

    /// One side of a point-to-point transfer of `count` elements, as a one-step schedule.
    #[allow(clippy::too_many_arguments)]
    pub fn p2p(
        send: bool,
        rank: usize,
        peer: usize,
        nranks: usize,
        buf: Region,
        count: usize,
        dtype: DataType,
        k: u64,
        timeout: Duration,
        id: u32,
        pool: &mut BufPool,
    ) -> Result<Box<Exec>> {
        use crate::algo::{Algorithm, Builder, Problem};
        let mut b = Builder::new(nranks);
        let (inp, out) = if send {
            b.send(rank, peer, Span::new(Buf::In, 0, count), &[]);
            (buf, Region::empty())
        } else {
            b.recv(rank, peer, Span::new(Buf::Out, 0, count), &[]);
            (Region::empty(), buf)
        };
        let schedule = Arc::new(b.finish(
            Problem::new(Collective::Broadcast, nranks, count),
            Algorithm::Ring,
        ));
        let plan = Arc::new(Plan::new(&schedule, rank, dtype.size())?);
        Exec::new(
            Job {
                schedule,
                rank,
                args: Args {
                    dtype,
                    op: RedOp::Sum,
                    inp,
                    out,
                    tags: Tags::P2p(k),
                    timeout,
                    sends_first: false,
                },
            },
            plan,
            id,
            pool,
        )
    }

    /// A finished collective kept for `rearm`: its backup goes back to the pool, its Tmp
    /// memory and lists stay. Its regions still name the finished call's buffers, which
    /// nothing reads before `rearm` replaces them.
    pub fn retire(&mut self, pool: &mut BufPool) {
        debug_assert!(self.finished && self.staging.iter().all(Option::is_none));
        if let Some(b) = self.backup.take() {
            pool.put(b);
        }
    }

    /// A finished collective's memory, back to the pool.
    pub fn recycle(&mut self, pool: &mut BufPool) {
        pool.put(std::mem::replace(&mut self.tmp, Scratch::new(0)));
        if let Some(b) = self.backup.take() {
            pool.put(b);
        }
        // A finished collective has nothing staged.
        if pool.lists.len() < LISTS_KEPT && self.staging.iter().all(Option::is_none) {
            pool.lists.push(Lists {
                state: std::mem::take(&mut self.state),
                pending: std::mem::take(&mut self.pending),
                ready: std::mem::take(&mut self.ready),
                staging: std::mem::take(&mut self.staging),
                batch: std::mem::take(&mut self.batch),
            });
        }
    }

    /// Steps posted to the transport and not completed.
    pub fn in_flight(&self) -> usize {
        self.state.iter().filter(|s| **s == St::Posted).count()
    }
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use super::{coll_tag, p2p_tag, Args, BufPool, Exec, Job, Plan, Tags, MAX_RANKS, POOL_LIMIT};
    use crate::algo::{self, Algorithm, Collective, Options, Problem};
    use crate::error::{Error, Result};
    use crate::reduce::{DataType, RedOp};
    use crate::transport::{Caps, Completion, Mr, OpId, Peer, Posted, Region, Scratch, Transport};
    use parking_lot::Mutex;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn wire_tags_fit_63_bits_and_keep_collectives_apart_from_point_to_point() {
        let limit = 1u64 << crate::transport::TAG_BITS;
        let max_rank = MAX_RANKS - 1;
        for seq in [0, 1, 0x3f_ffff, u32::MAX] {
            for (src, k) in [(0, 0), (max_rank, 0xf_ffff), (5, 7)] {
                let t = coll_tag(seq, src, k);
                assert!(t < limit, "{t:#x}");
                assert_eq!(t >> 62, 1, "collective kind bit");
                assert_eq!((t >> 20) & 0xf_ffff, src as u64);
                assert_eq!(t & 0xf_ffff, k as u64);
            }
        }
        for src in [0, 3, max_rank] {
            for seq in [0, 1, (1 << 42) - 1, u64::MAX] {
                let t = p2p_tag(src, seq);
                assert!(t < limit, "{t:#x}");
                assert_eq!(t >> 62, 0, "point-to-point kind bit");
                assert_eq!(t >> 42, src as u64);
            }
        }
        assert_ne!(coll_tag(1, 2, 3), coll_tag(2, 2, 3));
        assert_ne!(p2p_tag(1, 9), p2p_tag(2, 9));
    }

    #[test]
    fn in_place_calls_back_up_only_inputs_that_steps_overwrite() {
        let (n, count, el) = (4usize, 1000usize, 4usize);
        let plan = |coll, algo, rank| {
            let p = Problem::new(coll, n, count);
            let opts = Options {
                slice: 128,
                ..Options::default()
            };
            Plan::new(&algo::build(p, algo, &opts).unwrap(), rank, el).unwrap()
        };
        let slot = count * el;
        for algo in [Algorithm::Ring, Algorithm::Rdh, Algorithm::Mesh] {
            // AllGather in NCCL's layout: nothing writes the rank's own slot but the copy onto
            // itself, so no backup; an input anywhere else in the output is overwritten.
            let ag = plan(Collective::AllGather, algo, 2);
            assert!(!ag.overwrites_input(2 * slot, slot), "{algo}");
            assert!(ag.overwrites_input(slot, slot), "{algo}");
            assert!(ag.overwrites_input(2 * slot + 4, slot), "{algo}");
            // AllReduce writes its whole output.
            assert!(plan(Collective::AllReduce, algo, 2).overwrites_input(0, n * slot));
        }
        // Broadcast: the root only reads; other ranks receive into the buffer.
        assert!(!plan(Collective::Broadcast, Algorithm::Ring, 0).overwrites_input(0, n * slot));
        assert!(plan(Collective::Broadcast, Algorithm::Ring, 1).overwrites_input(0, n * slot));
    }

    /// A transport that accepts every post, delivers nothing, and records the posts' order.
    /// Its direct channel takes every message and delivers `reply` to every `take_now`; each
    /// `send_now` records what `watch` holds at that moment.
    #[derive(Default)]
    struct Recorder {
        caps: Caps,
        posts: Mutex<Vec<char>>,
        reply: Vec<u8>,
        watch: Option<Region>,
        seen: Mutex<Vec<Vec<u8>>>,
    }

    impl Transport for Recorder {
        fn caps(&self) -> &Caps {
            &self.caps
        }
        fn address(&self) -> Vec<u8> {
            Vec::new()
        }
        fn insert_peer(&self, _: &[u8]) -> Result<Peer> {
            Ok(Peer(0))
        }
        fn register(&self, _: Region) -> Result<Mr> {
            Err(Error::Internal("no registration".into()))
        }
        fn send(&self, _: Peer, _: u64, _: Region, _: Option<&Mr>, _: OpId) -> Result<Posted> {
            self.posts.lock().push('S');
            Ok(Posted::Queued)
        }
        fn recv(&self, _: u64, _: u64, _: Region, _: Option<&Mr>, _: OpId) -> Result<Posted> {
            self.posts.lock().push('R');
            Ok(Posted::Queued)
        }
        fn send_owned(&self, _: Peer, _: u64, _: Vec<u8>, _: OpId) -> Result<()> {
            Ok(())
        }
        fn recv_owned(&self, _: u64, _: u64, _: usize, _: OpId) -> Result<()> {
            Ok(())
        }
        fn cancel(&self, _: OpId) {}
        fn poll(&self, _: &mut Vec<Completion>) -> Result<usize> {
            Ok(0)
        }
        fn wait(&self, _: Duration) -> Result<()> {
            Ok(())
        }
        fn direct_bytes(&self, _: Peer) -> usize {
            1 << 20
        }
        fn send_now(&self, _: Peer, _: u64, _: &[u8]) -> Result<bool> {
            self.posts.lock().push('S');
            if let Some(w) = self.watch {
                self.seen.lock().push(w.to_vec());
            }
            Ok(true)
        }
        fn take_now(
            &self,
            _: Peer,
            _: u64,
            f: &mut dyn FnMut(&[u8]) -> Result<()>,
        ) -> Result<bool> {
            self.posts.lock().push('T');
            f(&self.reply).map(|_| true)
        }
    }

    /// Rank 0's job of a float sum over `schedule`, the first collective of its communicator.
    fn rank0_job(
        schedule: Arc<algo::Schedule>,
        inp: &Scratch,
        out: &Scratch,
        sends_first: bool,
    ) -> Job {
        Job {
            schedule,
            rank: 0,
            args: Args {
                dtype: DataType::Float32,
                op: RedOp::Sum,
                // SAFETY: every test keeps both buffers alive until its executor is done.
                inp: unsafe { inp.region() },
                // SAFETY: as above.
                out: unsafe { out.region() },
                tags: Tags::Coll(0),
                timeout: Duration::from_secs(1),
                sends_first,
            },
        }
    }

    #[test]
    fn over_the_direct_channel_local_steps_run_after_the_sends() {
        // A 2-rank ring AllGather lists the copy of the own chunk first: it must not delay
        // the send, which reads the input, not the output.
        let count = 4usize;
        let p = Problem::new(Collective::AllGather, 2, count);
        let schedule = Arc::new(algo::build(p, Algorithm::Ring, &Options::default()).unwrap());
        let plan = Arc::new(Plan::new(&schedule, 0, 4).unwrap());
        let (mut inp, out) = (Scratch::new(16), Scratch::new(32));
        inp.bytes_mut().fill(7);
        let job = rank0_job(schedule, &inp, &out, true);
        // SAFETY: `out` outlives the recorder that reads it.
        let watch = unsafe { out.region() }.sub(0, 16);
        let t = Recorder {
            reply: vec![9u8; 16],
            watch,
            ..Recorder::default()
        };
        let mut pool = BufPool::default();
        let mut x = Exec::new(job, plan, 1, &mut pool).unwrap();
        let mut idle = super::Idle::new(true, Duration::from_millis(1));
        let aborted = std::sync::atomic::AtomicBool::new(false);
        x.run_direct(&t, &[Peer(0), Peer(1)], &mut idle, &aborted)
            .unwrap();
        assert_eq!(t.posts.lock().iter().collect::<String>(), "ST");
        assert_eq!(
            *t.seen.lock(),
            [vec![0u8; 16]],
            "the own chunk was copied first"
        );
        let mut want = vec![7u8; 16];
        want.extend([9u8; 16]);
        assert_eq!(out.bytes(), want);
    }

    #[test]
    fn ready_sends_go_before_ready_receives_only_when_the_job_asks() {
        // A 4-slice ring AllGather of 2 ranks: its first ready steps are 4 receives and 4
        // sends (the local copy after them either way).
        let (count, el) = (4096usize, 4usize);
        let opts = Options {
            slice: 1024,
            ..Options::default()
        };
        let p = Problem::new(Collective::AllGather, 2, count);
        let schedule = Arc::new(algo::build(p, Algorithm::Ring, &opts).unwrap());
        let plan = Arc::new(Plan::new(&schedule, 0, el).unwrap());
        for sends_first in [false, true] {
            let (inp, out) = (Scratch::new(count * el), Scratch::new(2 * count * el));
            let job = rank0_job(schedule.clone(), &inp, &out, sends_first);
            let mut pool = BufPool::default();
            let t = Recorder::default();
            let mut x = Exec::new(job, plan.clone(), 1, &mut pool).unwrap();
            assert!(x.advance(&t, &[Peer(0), Peer(1)], &mut pool).unwrap());
            let posts: String = t.posts.lock().iter().collect();
            let want = if sends_first { "SSSSRRRR" } else { "RRRRSSSS" };
            assert_eq!(posts, want, "sends_first {sends_first}");
            let _ = x.fail(&t);
        }
    }

    #[test]
    fn pool_reuses_the_smallest_fit_and_keeps_at_most_its_limit() {
        let mut pool = BufPool::default();
        let (small, big) = (pool.take(4096), pool.take(1 << 20));
        let (small_addr, big_addr) = (small.addr(), big.addr());
        pool.put(big);
        pool.put(small);
        // 1000 bytes fit both: the 4 KiB buffer is taken, the 1 MiB one stays.
        let a = pool.take(1000);
        assert_eq!(a.addr(), small_addr);
        assert_eq!(a.len(), 4096);
        assert_eq!(pool.take(8192).addr(), big_addr);
        // An empty request takes nothing from the pool.
        pool.put(a);
        assert_eq!(pool.take(0).len(), 0);
        assert_eq!(pool.take(4096).addr(), small_addr);
        // The limit: buffers beyond POOL_LIMIT bytes in all are dropped, not kept.
        for _ in 0..3 {
            pool.put(Scratch::new(POOL_LIMIT / 2));
        }
        assert_eq!(pool.bytes, POOL_LIMIT);
        assert_eq!(pool.bufs.len(), 2);
    }
}

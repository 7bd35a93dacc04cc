//! Runs one rank's part of a `Schedule` over a `Transport` as a polled state machine.
//!
//! A step runs once its dependencies are done: sends and receives are posted to the transport,
//! copies and reductions run in the polling thread, so receive, reduce and send of consecutive
//! slices overlap. A `RecvReduce` receives into a staging buffer and reduces when the message
//! is in; staging is bounded (`STAGING_LIMIT` bytes per collective, beyond which receives wait
//! for earlier ones to finish; one message larger than the limit is still staged alone).
//! An in-place call whose steps write over the input runs in one of two ways (`Args::restore`).
//! Restoring: on a backup of the whole input, which also restores the caller's buffer if the
//! collective fails, so a failed collective never leaves a half-reduced buffer behind. Not
//! restoring: on the caller's buffer itself, with a copy only of the input that a step reads
//! after another may have written over it (`inplace`); a failure leaves the buffer undefined,
//! as MPI and NCCL do. One that writes nothing over its input (AllGather and the Broadcast
//! root in NCCL's layouts) reads the input itself either way and skips the copy onto itself.
//!
//! By concern: `pool` (the buffer pool and its limits, and the one place exec makes a
//! region), `tags` (wire tags), `plan` (what is precomputed per schedule and rank), `idle`
//! (the idle policy and the deadline), `posted` (the posted state machine), `gone` (noticing
//! a peer that went away), `direct` (the direct executor) and `lifecycle` (making, rearming,
//! retiring and failing an executor).
//! This file holds the executor's state and the step work both executors share.
#![deny(unsafe_code)]

mod device;
mod direct;
mod gone;
mod idle;
mod inplace;
mod lifecycle;
mod notice;
mod plan;
mod pool;
mod posted;
#[cfg(test)]
#[allow(unsafe_code)]
mod recorder;
mod signature;
mod tags;

pub use device::DeviceMem;
pub use gone::is_gone_notice;
pub use idle::Idle;
pub use notice::{is_notice, late_notice_of, late_watch};
pub use plan::Plan;
pub use pool::{BufPool, POOL_LIMIT, STAGING_LIMIT};
pub use signature::{Signature, COMPRESSED_ALGO, SIG_MASK};
pub use tags::{
    coll_tag, goodbye_tag, p2p_key, p2p_tag, Tags, MAX_IN_FLIGHT, MAX_MESSAGES_PER_PEER, MAX_RANKS,
    MAX_TAG,
};

use crate::algo::{Buf, Collective, Op, Schedule, Span};
use crate::config::Timeout;
use crate::error::{Error, Result};
use crate::reduce::{self, DataType, RedOp};
use crate::transport::{Region, Scratch};
use pool::owned;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

/// Where a step is: waiting for its dependencies, posted to the transport, or done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Waiting,
    Posted,
    Done,
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
    /// How long the call may go without progress, and where that was set (for its error).
    pub timeout: Timeout,
    /// Post ready sends before ready receives (see `Exec::priority`).
    pub sends_first: bool,
    /// In place: run on a backup of the whole input, which restores the caller's buffer if
    /// the collective fails. Without it the steps work in the caller's buffer (copying aside
    /// only what is read after being overwritten) and a failure leaves the buffer undefined.
    pub restore: bool,
    /// The signature the call's messages carry where it is not the schedule's own: the steps
    /// of a compressed collective run byte exchanges on behalf of the caller's call
    /// (`coll` compressed), whose signature they carry.
    pub signature: Option<Signature>,
    /// The caller's buffers are device memory (`device`): their registrations, and the copies
    /// on the device. None: host memory.
    pub device: Option<Arc<dyn DeviceMem>>,
}

/// One rank's collective in progress.
pub struct Exec {
    job: Job,
    elem: usize,
    inp: Region,
    out: Region,
    tmp: Scratch,
    /// Where the call's buffers are device memory: Tmp memory and the staging of
    /// receive-and-reduce steps on the device (`DeviceMem::scratch`), and each step's offset
    /// into that staging.
    dev_tmp: Region,
    dev_stage: Region,
    stage_off: Vec<usize>,
    /// The input's copy when in place: all of it when restoring (`inp` then points into it),
    /// else the part `partial` says (`inb` points into it).
    backup: Option<Scratch>,
    /// Not restoring: which steps read In from `inb`, the backup of In's bytes from `lo`,
    /// and the step graph with the dependencies the call adds (`inplace::analyse`).
    partial: Option<Arc<inplace::InPlace>>,
    inb: Region,
    /// In place without restore, over an input the steps write: a failure leaves it undefined.
    undefined_on_failure: bool,
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
    /// The call's signature bits (`Signature::bits`), carried by every collective message.
    sig: u64,
    /// A message carried another call's signature: `fail` tells the peers (`notice`).
    calls_differ: std::cell::Cell<bool>,
    /// Whether the collective watches for other ranks' notices (`notice`).
    watch: notice::Watch,
    /// An operation's failure held while a notice may explain it (`Exec::hold`).
    held: Option<(Error, Instant)>,
    /// When this collective last looked for another call's messages (`notice`, where receives
    /// match the signature exactly).
    foreign_at: Option<Instant>,
    /// The looks for peers that went away while the call waited for them (`gone`).
    gone: gone::Looks,
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
    /// The plan this `Exec` runs.
    pub fn plan(&self) -> &Arc<Plan> {
        &self.plan
    }

    /// Span `s` of step `i`'s operands.
    fn region(&self, i: usize, s: &Span) -> Region {
        let base = match s.buf {
            Buf::In => match &self.partial {
                Some(p) if p.from_backup[i] => {
                    let (off, len) = bytes(self.elem, s);
                    return self
                        .inb
                        .sub(off - p.lo, len)
                        .expect("hazardous reads lie in the backup");
                }
                _ => self.inp,
            },
            Buf::Out => self.out,
            Buf::Tmp if self.job.args.device.is_some() => self.dev_tmp,
            Buf::Tmp => owned(&self.tmp, self.tmp.len()),
        };
        let (off, len) = bytes(self.elem, s);
        base.sub(off, len)
            .expect("schedule spans are checked against buffer sizes")
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
        let dependents = match self.partial.as_ref().and_then(|p| p.graph.as_ref()) {
            Some(g) => &g.dependents,
            None => &self.plan.dependents,
        };
        for &d in &dependents[i] {
            let d = d as usize;
            self.pending[d] -= 1;
            if self.pending[d] == 0 {
                self.ready.push_back(d);
            }
        }
    }

    fn reduce_into(&self, a: Region, b: Region, dst: Region) -> Result<()> {
        let (dt, op) = (self.job.args.dtype, self.job.args.op);
        if let Some(d) = &self.job.args.device {
            // The operations are commutative: dst = dst ⊕ other where dst is one of them.
            let (x, y) = if dst == b { (b, a) } else { (a, b) };
            return d.reduce(dt, op, dst, x, y);
        }
        let r = if dst == a {
            b.with(|bb| dst.with_mut(|d| reduce::reduce_inplace(dt, op, d, bb)))
        } else if dst == b {
            a.with(|aa| dst.with_mut(|d| reduce::reduce_inplace(dt, op, d, aa)))
        } else {
            a.with(|aa| b.with(|bb| dst.with_mut(|d| reduce::reduce(dt, op, aa, bb, d))))
        };
        r.map_err(|e| Error::Internal(format!("reduction: {e}")))
    }

    /// Run local step `i` (a copy, a reduction or a join) and complete it.
    fn run_local(&mut self, i: usize) -> Result<()> {
        match self.job.schedule.ranks[self.job.rank][i].op {
            Op::Copy { src, dst } => {
                let (s, d) = (self.region(i, &src), self.region(i, &dst));
                // In place without a backup, the own chunk's copy is onto itself.
                if s.addr() != d.addr() {
                    match &self.job.args.device {
                        Some(dev) => dev.copy(d, s)?,
                        None => s.with(|a| d.with_mut(|b| reduce::copy(b, a))),
                    }
                }
            }
            Op::Reduce { a, b, dst } => {
                self.reduce_into(self.region(i, &a), self.region(i, &b), self.region(i, &dst))?;
            }
            Op::Nop => {}
            _ => return Err(Error::Internal(format!("step {i} is not local work"))),
        }
        self.complete(i);
        Ok(())
    }

    /// The signature of this call (`Args::signature`, else the schedule's problem's).
    pub(crate) fn signature(&self) -> Signature {
        let s = &self.job.schedule;
        let a = &self.job.args;
        a.signature
            .unwrap_or_else(|| Signature::of(&s.problem, s.algo, a.dtype, a.op))
    }

    fn check_finished(&mut self) -> Result<()> {
        if self.finished || self.done < self.state.len() {
            return Ok(());
        }
        let p = self.job.schedule.problem;
        if self.job.args.op == RedOp::Avg
            && p.coll.reduces()
            && (p.coll != Collective::Reduce || self.job.rank == p.root)
        {
            let dt = self.job.args.dtype;
            let n = p.nranks;
            match &self.job.args.device {
                Some(d) => d.scale_avg(dt, self.out, n)?,
                None => self.out.with_mut(|o| {
                    let _ = reduce::scale_avg(dt, o, n);
                }),
            }
        }
        self.finished = true;
        Ok(())
    }
}

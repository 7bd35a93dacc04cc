//! An executor's lifecycle: made for a job (`new`, or `p2p` for one side of a transfer),
//! armed again for the next call of its plan (`rearm`), and at the end kept for reuse
//! (`retire`), returned to the pool (`recycle`), or given up (`fail`).

use super::notice::Watch;
use super::pool::{owned, Lists, LISTS_KEPT};
use super::{Args, BufPool, Exec, Job, Plan, St, Tags};
use crate::algo::{Buf, Collective, Span};
use crate::config::Timeout;
use crate::error::{Error, Result};
use crate::reduce::{self, DataType, RedOp};
use crate::transport::{Peer, Region, Scratch, Transport};
use std::sync::Arc;

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
            dev_tmp: Region::empty(),
            dev_stage: Region::empty(),
            stage_off: Vec::new(),
            backup: None,
            partial: None,
            inb: Region::empty(),
            undefined_on_failure: false,
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
            sig: 0,
            calls_differ: Default::default(),
            watch: Watch::Off,
            held: None,
            foreign_at: None,
            gone: Default::default(),
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
        self.sig = self.signature().bits();
        self.calls_differ.set(false);
        self.watch = Watch::Off;
        self.held = None;
        self.foreign_at = None;
        self.gone.reset();
        let inp = self.job.args.inp.sub(0, need_in).expect("checked");
        let out = self.job.args.out.sub(0, need_out).expect("checked");
        // Overlap of input and output: the steps may write over the input. Restoring, run on
        // a copy of all of it (also the restore point); not restoring, in the caller's buffer
        // with a copy of the part read after being overwritten. Neither when the steps leave
        // the input as it is.
        let overlap = !inp.is_empty()
            && !out.is_empty()
            && inp.addr() < out.addr() + out.len()
            && out.addr() < inp.addr() + inp.len();
        let overwritten = overlap
            && (inp.addr() < out.addr()
                || plan.overwrites_input(inp.addr() - out.addr(), inp.len()));
        debug_assert!(self.backup.is_none(), "new and retire leave no backup");
        self.dev_tmp = Region::empty();
        self.dev_stage = Region::empty();
        if let Some(d) = &self.job.args.device {
            if overwritten {
                return Err(Error::Internal(
                    "a call on device memory whose steps write over its input".into(),
                ));
            }
            // Tmp, then each receive-and-reduce step's staging, in one device allocation.
            let tmp = self.job.schedule.tmp_len[self.job.rank] * self.elem;
            self.stage_off.clear();
            let mut stage = 0;
            for s in &self.job.schedule.ranks[self.job.rank] {
                self.stage_off.push(stage);
                if let crate::algo::Op::RecvReduce { dst, .. } = &s.op {
                    stage += dst.len * self.elem;
                }
            }
            if tmp + stage > 0 {
                let all = d.scratch(tmp + stage)?;
                let part = |off, len| {
                    all.sub(off, len)
                        .ok_or_else(|| Error::Internal("device scratch too small".into()))
                };
                self.dev_tmp = part(0, tmp)?;
                self.dev_stage = part(tmp, stage)?;
            }
        }
        self.partial = None;
        self.inb = Region::empty();
        self.undefined_on_failure = overwritten && !self.job.args.restore;
        self.inp = if overwritten && self.job.args.restore {
            let b = pool.take(inp.len());
            let copy = owned(&b, inp.len());
            inp.with(|src| copy.with_mut(|dst| reduce::copy(dst, src)));
            self.backup = Some(b);
            copy
        } else {
            if overwritten {
                let shift = inp.addr() as isize - out.addr() as isize;
                let ip = plan.in_place(&self.job.schedule, self.job.rank, shift);
                if ip.needs_backup() {
                    let len = ip.hi - ip.lo;
                    let b = pool.take(len);
                    let copy = owned(&b, len);
                    let part = inp
                        .sub(ip.lo, len)
                        .expect("hazardous reads lie in the input");
                    part.with(|src| copy.with_mut(|dst| reduce::copy(dst, src)));
                    self.backup = Some(b);
                    self.inb = copy;
                }
                if ip.changes_anything() {
                    self.partial = Some(ip);
                }
            }
            inp
        };
        self.out = if need_out == 0 { Region::empty() } else { out };
        let n = plan.pending.len();
        let (pending, ready) = match self.partial.as_ref().and_then(|p| p.graph.as_ref()) {
            Some(g) => (&g.pending, &g.ready),
            None => (&plan.pending, &plan.ready),
        };
        self.state.clear();
        self.state.resize(n, St::Waiting);
        self.pending.clear();
        self.pending.extend_from_slice(pending);
        self.ready.clear();
        self.ready.extend(ready.iter().copied());
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

    /// `err` as this collective reports it: a failure of an in-place call without restore
    /// says that the caller's buffer is undefined.
    pub fn explain(&self, err: Error) -> Error {
        if !self.undefined_on_failure {
            return err;
        }
        let note = |m: String| {
            format!("{m} (in place without restore: the buffer's contents are undefined)")
        };
        match err {
            Error::InvalidArgument(m) => Error::InvalidArgument(note(m)),
            Error::InvalidUsage(m) => Error::InvalidUsage(note(m)),
            Error::System(m) => Error::System(note(m)),
            Error::Internal(m) => Error::Internal(note(m)),
            Error::Remote(m) => Error::Remote(note(m)),
            Error::Timeout(m) => Error::Timeout(note(m)),
        }
    }

    /// Give up: cancel posted receives, restore an in-place input (when restoring), and hand back the memory
    /// that operations may still touch (the caller keeps it until they drain, or leaks it).
    pub fn fail(self, t: &dyn Transport, peers: &[Peer]) -> Vec<Scratch> {
        self.fail_noting(t, peers).0
    }

    /// `fail`, and how many notices it sent (where this rank found that the calls differ, or
    /// failed over a gone rank, `gone`:
    /// their sends complete as this collective's operations, `notice::is_notice`).
    pub fn fail_noting(mut self, t: &dyn Transport, peers: &[Peer]) -> (Vec<Scratch>, usize) {
        self.unwatch(t);
        let notices = if self.calls_differ.get() {
            self.send_notices(t, peers)
        } else {
            self.send_gone_notices(t, peers)
        };
        for i in 0..self.state.len() {
            if self.state[i] == St::Posted && self.job.schedule.ranks[self.job.rank][i].op.is_recv()
            {
                t.cancel(self.op_id(i));
            }
        }
        if self.backup.is_some() && self.partial.is_none() {
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
        (keep, notices)
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
        timeout: Timeout,
        id: u32,
        pool: &mut BufPool,
        device: Option<Arc<dyn super::DeviceMem>>,
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
                    restore: true,
                    signature: None,
                    device,
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
        // A direct device call's registrations and device memory go with its call.
        self.job.args.device = None;
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
}

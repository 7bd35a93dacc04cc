//! The posted state machine: ready steps are posted to the transport (sends and receives) or
//! run in the polling thread (local work), in priority order; completions finish the posted
//! ones. A `RecvReduce` receives into a staging buffer from the pool, bounded by
//! `STAGING_LIMIT`, and reduces when its message is in.

use super::notice::{NOTICE_STEP, WATCH_STEP};
use super::pool::owned;
use super::{wrong_size, BufPool, Exec, St, Tags, SIG_MASK, STAGING_LIMIT};
use crate::algo::Op;
use crate::error::{Error, Result};
use crate::transport::{Completion, OpId, Peer, Posted, Region, Scratch, Transport};
use std::collections::VecDeque;

impl Exec {
    /// The operation id of step `step`: this collective's id above the step's index.
    pub(super) fn op_id(&self, step: usize) -> OpId {
        (self.id << 32) | step as u64
    }

    /// The collective id of an operation id.
    pub fn exec_of(op: OpId) -> u32 {
        (op >> 32) as u32
    }

    /// Order of the ready steps: receives first (so that peers' messages find them posted
    /// instead of waiting in the provider's unexpected queue), then sends, then local work.
    /// With `Args::sends_first`, sends go before receives: over libfabric's shm the receiver
    /// copies each large message itself (one `process_vm_readv`), and it does so inside
    /// `fi_trecv` when the message is already waiting. Receives first then held our sends
    /// back from the peer for as long as those copies took, and the two ranks took turns
    /// instead of copying at the same time (figures in docs/performance.md).
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

    /// Post or run every ready step; returns whether anything happened.
    pub fn advance(
        &mut self,
        t: &dyn Transport,
        peers: &[Peer],
        pool: &mut BufPool,
    ) -> Result<bool> {
        self.held_expired()?;
        let mut progressed = false;
        let mut deferred = VecDeque::new();
        let mut batch = std::mem::take(&mut self.batch);
        let r = self.run_ready(t, peers, pool, &mut batch, &mut deferred, &mut progressed);
        batch.clear();
        self.batch = batch;
        r?;
        self.ready = deferred;
        self.check_finished()?;
        self.tend_watch(t)?;
        self.look_for_foreign(t, peers)?;
        self.look_for_gone(t, peers)?;
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
                let r = self.region(i, &src);
                let mr = self.job.args.device.as_ref().and_then(|d| d.mr(r));
                match t.send(peers[peer], tag, r, mr, self.op_id(i))? {
                    Posted::Queued => self.state[i] = St::Posted,
                    Posted::Busy => {
                        deferred.push_back(i);
                        return Ok(false);
                    }
                }
            }
            Op::Recv { peer, dst } => {
                let tag = self.tag(peer, i);
                let r = self.region(i, &dst);
                let mr = self.job.args.device.as_ref().and_then(|d| d.mr(r));
                match t.recv_from(
                    peers[peer],
                    tag,
                    self.recv_ignored(t, peers[peer]),
                    r,
                    mr,
                    self.op_id(i),
                )? {
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
                let device = self.job.args.device.is_some();
                // The device staging is made whole when the call is armed.
                if !device && self.staged > 0 && self.staged + need > STAGING_LIMIT {
                    deferred.push_back(i);
                    return Ok(false);
                }
                let (buf, into) = if device {
                    (Scratch::new(0), self.device_staging(i, need)?)
                } else {
                    let b = pool.take(need);
                    let into = owned(&b, need);
                    (b, into)
                };
                let mr = self.job.args.device.as_ref().and_then(|d| d.mr(into));
                let tag = self.tag(peer, i);
                match t.recv_from(
                    peers[peer],
                    tag,
                    self.recv_ignored(t, peers[peer]),
                    into,
                    mr,
                    self.op_id(i),
                )? {
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

    /// Handle a transport completion of one of our operations.
    pub fn on_completion(&mut self, c: Completion, pool: &mut BufPool) -> Result<()> {
        let i = (c.op & 0xffff_ffff) as usize;
        match i {
            WATCH_STEP => return self.on_watch(&c),
            NOTICE_STEP => return Ok(()),
            _ => {}
        }
        if i >= self.state.len() || self.state[i] != St::Posted {
            return Err(Error::Internal(format!(
                "unexpected completion for step {i}"
            )));
        }
        let step = &self.job.schedule.ranks[self.job.rank][i].op;
        if let (Some(peer), true) = (step.peer(), step.is_recv()) {
            self.check_signature(peer, &c)?;
        }
        // We cancel only operations of collectives we have given up: a cancellation reaching a
        // live one came from the provider (rxm does this when a peer's connection is lost).
        let status = c.status.map_err(|e| match e {
            Error::InvalidUsage(m) if m.contains("cancelled") => Error::Remote(
                "the provider aborted the operation (connection to the peer lost)".into(),
            ),
            // A peer sent more than this rank's schedule expects: the ranks disagree on the call,
            // so the peers get notices (a peer waiting for this rank learns why), even where the
            // provider reported the receive's tag and not the message's (2.1's shm), so that
            // the signatures compared the same.
            Error::InvalidUsage(m) if m.contains("arrived for a receive buffer") => {
                self.calls_differ.set(true);
                Error::InvalidUsage(format!(
                    "{m}: do the ranks make the same call with the same count and type?"
                ))
            }
            e => e,
        });
        if let Err(e) = status {
            return self.hold(i, e, pool);
        }
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
                let msg = match self.job.args.device {
                    Some(_) => self.device_staging(i, need)?,
                    None => owned(&buf, need),
                };
                let r = self.reduce_into(self.region(i, &src), msg, self.region(i, &dst));
                pool.put(buf);
                r?;
            }
            _ => return Err(Error::Internal("completion for a local step".into())),
        }
        self.complete(i);
        self.check_finished()?;
        Ok(())
    }

    /// Step `i`'s staging of `need` bytes in the call's device staging (`Exec::dev_stage`).
    fn device_staging(&self, i: usize, need: usize) -> Result<Region> {
        self.dev_stage
            .sub(self.stage_off[i], need)
            .ok_or_else(|| Error::Internal(format!("step {i}'s staging lies outside the device's")))
    }

    /// The tag bits a receive ignores when matching: a collective's signature, which
    /// `check_signature` compares once the message is in.
    pub(super) fn sig_ignored(&self) -> u64 {
        match self.job.args.tags {
            Tags::Coll(_) => SIG_MASK,
            Tags::P2p(_) => 0,
        }
    }

    /// The tag bits a posted receive ignores: `sig_ignored`, except where a receive that
    /// another call's longer message matched would crash (`Caps::truncation_crashes`): there
    /// receives match the signature exactly and the stalled collective looks for other calls'
    /// messages (`look_for_foreign`).
    fn recv_ignored(&self, t: &dyn Transport, peer: Peer) -> u64 {
        if t.caps_to(peer).truncation_crashes {
            0
        } else {
            self.sig_ignored()
        }
    }

    /// Fail when a message from `peer` (completed, or refused for its size) carries another
    /// call's signature. A receive that failed otherwise (cancelled, a transport error) says
    /// nothing about the sender's call.
    fn check_signature(&self, peer: usize, c: &Completion) -> Result<()> {
        let arrived = match &c.status {
            Ok(()) => true,
            Err(Error::InvalidUsage(m)) => m.contains("arrived for a receive buffer"),
            Err(_) => false,
        };
        if arrived {
            self.check_signature_bits(peer, c.tag)
        } else {
            Ok(())
        }
    }

    /// Fail when `tag`, of a message from `peer`, carries another call's signature.
    pub(super) fn check_signature_bits(&self, peer: usize, tag: u64) -> Result<()> {
        let theirs = tag & SIG_MASK;
        if self.sig_ignored() == 0 || theirs == self.sig {
            return Ok(());
        }
        self.calls_differ.set(true);
        let n = self.job.schedule.problem.nranks;
        Err(self.signature().mismatch(peer, n, theirs))
    }

    /// Steps posted to the transport and not completed.
    pub fn in_flight(&self) -> usize {
        self.state.iter().filter(|s| **s == St::Posted).count()
    }
}

#[cfg(test)]
mod tests {
    use crate::algo::{self, Algorithm, Collective, Options, Problem};
    use crate::exec::recorder::{rank0_job, Recorder};
    use crate::exec::{BufPool, Exec, Plan};
    use crate::transport::{Peer, Scratch};
    use std::sync::Arc;

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
            let _ = x.fail(&t, &[Peer(0), Peer(1)]);
        }
    }
}

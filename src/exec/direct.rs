//! The direct executor: a whole collective run in the calling thread over the transport's
//! direct channel (`Transport::send_now` / `take_now`), with nothing posted and no completion.

use super::{wrong_size, Exec, Idle};
use crate::algo::Op;
use crate::error::{Error, Result};
use crate::reduce;
use crate::transport::{Peer, Transport};
use std::sync::atomic::{AtomicBool, Ordering};

impl Exec {
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
                            .region(i, &src)
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
            self.check_finished()?;
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
                self.take_notice(t, peers)?;
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
        let d = self.region(i, &dst);
        let s = src.map(|s| self.region(i, &s));
        let (dt, op) = (self.job.args.dtype, self.job.args.op);
        let ignore = self.sig_ignored();
        t.take_now(
            peers[peer],
            self.tag(peer, i),
            ignore,
            &mut |tag, m: &[u8]| {
                self.check_signature_bits(peer, tag)?;
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
            },
        )
    }
}

#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use crate::algo::{self, Algorithm, Collective, Options, Problem};
    use crate::exec::recorder::{rank0_job, Recorder};
    use crate::exec::{BufPool, Exec, Idle, Plan};
    use crate::transport::{Peer, Scratch};
    use std::sync::Arc;
    use std::time::Duration;

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
        let mut idle = Idle::new(true, Duration::from_millis(1));
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
}

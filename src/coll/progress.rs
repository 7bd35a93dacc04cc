//! A communicator's progress (`Comm::progress`): poll the transport, route each completion to
//! its collective, advance every running one (its deadline and gone peers included), do the
//! pipelined codec's work of compressed calls and start their next exchanges; and the notices
//! of failed calls, received (`on_late_notice`) and flushed before a failed call returns.
use super::engine::{fail, park, Engine, ReqState, SLEEP_SLICE};
use super::late;
use super::Comm;
use crate::error::{Error, Result};
use crate::exec::{is_gone_notice, is_notice, late_notice_of, Exec};
use crate::transport::Completion;
use std::time::Duration;

/// Longest a failed call makes progress for its notices before it returns (`flush_notices`):
/// the notices are a few bytes each, and a peer that cannot take them is gone.
const NOTICE_FLUSH: Duration = Duration::from_secs(1);

impl Comm {
    /// Poll the transport, route completions, advance every running collective.
    pub(super) fn progress(&self, e: &mut Engine) -> Result<bool> {
        let t = &*self.transport;
        let mut comps = std::mem::take(&mut e.scratch);
        t.poll(&mut comps)?;
        let mut moved = !comps.is_empty();
        for c in comps.drain(..) {
            if c.op == late::OP {
                self.on_late_notice(e, &c);
                continue;
            }
            if is_notice(c.op) {
                e.late.sent_one();
                continue;
            }
            let id = Exec::exec_of(c.op);
            let r = match e.execs.get_mut(&id) {
                Some(ReqState::Running(x)) => x.on_completion(c, &mut e.pool),
                _ => Ok(()), // a failed or finished collective's late completion
            };
            if let Err(err) = r {
                fail(e, t, &self.peers, id, err);
            }
        }
        e.scratch = comps;
        let mut failed = Vec::new();
        let mut stepped = Vec::new();
        let Engine {
            execs,
            pool,
            spare,
            phased,
            late,
            ..
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
                        late.succeeded(x);
                        if let ReqState::Running(mut x) = std::mem::replace(st, ReqState::Done) {
                            // A compressed call's exchange: its plan is not reused.
                            if phased.contains_key(id) {
                                x.recycle(pool);
                                stepped.push(*id);
                            } else {
                                park(spare, pool, x);
                            }
                        }
                    }
                }
                Err(err) => failed.push((*id, err)),
            }
        }
        for (id, err) in failed {
            fail(e, t, &self.peers, id, err);
        }
        // The codec's work of pipelined compressed calls, a piece each, while their
        // exchanges run (`compressed`).
        let Engine {
            execs,
            pool,
            phased,
            ..
        } = &mut *e;
        let mut broke = Vec::new();
        for (id, p) in phased.iter_mut() {
            if matches!(execs.get(id), Some(ReqState::Running(_))) {
                match p.work(pool) {
                    Ok(w) => moved |= w,
                    Err(err) => broke.push((*id, err)),
                }
            }
        }
        for (id, err) in broke {
            fail(e, t, &self.peers, id, err);
        }
        for id in stepped {
            let Some(mut p) = e.phased.remove(&id) else {
                continue;
            };
            match self.step(&mut p, id, &mut e.pool) {
                Ok(Some(x)) => {
                    e.note_talked(&x);
                    e.execs.insert(id, ReqState::Running(x));
                    e.phased.insert(id, p);
                    moved = true;
                }
                Ok(None) => p.into_buffers().into_iter().for_each(|b| e.pool.put(b)),
                Err(err) => {
                    p.into_buffers().into_iter().for_each(|b| e.pool.put(b));
                    e.execs.insert(id, ReqState::Failed(err));
                }
            }
        }
        e.late.arm(t);
        Ok(moved)
    }

    /// Before a failed call returns: progress until the notices this rank sent are out, for at
    /// most `NOTICE_FLUSH` (`Late::sending`).
    pub(super) fn flush_notices(&self, e: &mut Engine) {
        let until = std::time::Instant::now() + NOTICE_FLUSH;
        while e.late.sending() && std::time::Instant::now() < until {
            match self.progress(e) {
                Ok(true) => {}
                Ok(false) => {
                    let _ = self.transport.wait(SLEEP_SLICE);
                }
                Err(_) => return,
            }
        }
    }

    /// A late notice (or the cancelled receive of them): fail the collective it is about where
    /// it runs here, else keep it for the next report (`late`). One that a rank is gone fails
    /// every collective running here (`exec::gone`), and is dropped where none runs.
    fn on_late_notice(&self, e: &mut Engine, c: &Completion) {
        e.late.disarm();
        if c.status.is_err() {
            return;
        }
        if let Some(body) = c.data.as_deref().filter(|b| is_gone_notice(b)) {
            let told: Vec<(u32, Error)> = e
                .execs
                .iter_mut()
                .filter_map(|(id, st)| match st {
                    ReqState::Running(x) => x.told_gone(c.tag, body).map(|err| (*id, err)),
                    _ => None,
                })
                .collect();
            for (id, err) in told {
                fail(e, &*self.transport, &self.peers, id, err);
            }
            return;
        }
        let (seq, from) = late_notice_of(c.tag);
        let running = e.execs.iter().find_map(|(id, st)| match st {
            ReqState::Running(x) if x.seq_bits() == Some(seq) => Some((*id, x.noticed(c.tag))),
            _ => None,
        });
        match running {
            Some((id, err)) => fail(e, &*self.transport, &self.peers, id, err),
            None => {
                let theirs = c.tag & crate::exec::SIG_MASK;
                e.late.notice(seq, from, self.peers.len(), theirs);
            }
        }
    }
}

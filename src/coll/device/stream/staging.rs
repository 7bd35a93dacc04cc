//! Staging for a communicator's stream-ordered calls: the slots a call takes from the pool
//! (`slots`, never allocating), the staging made before the first one (`prepare`), and the
//! ranks' meeting before the first flag wait (`join`).
use super::super::inflight::{earlier, Inflight};
use super::super::pool::{Fill, Pool};
use super::{finish, Streams, MAX_NAP};
use crate::algo::Collective;
use crate::coll::{Call, Comm, Kind};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::reduce::{DataType, RedOp};
use crate::transport::Region;
use parking_lot::MutexGuard;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The most slots a stream-ordered call takes: two, so that one slice's copies overlap the
/// next one's collective, where two are free.
const STREAM_SLOTS: usize = 2;

impl Streams {
    /// The slots of a stream-ordered call of `nslices` slices of `need` bytes, busy in the pool,
    /// with the calls' lock: two where two are free (one copies while the other is in its
    /// collective), else one, else it waits for one to be freed by the calls in flight (which
    /// it steps meanwhile) until they have made no progress for the communicator's timeout. It
    /// never allocates: page-locked allocation waits for every stream of the device, this
    /// call's stream and its peers' included (docs/device-calls.md).
    pub(super) fn slots(
        &self,
        comm: &Comm,
        dev: &Device,
        need: (usize, usize),
        nslices: usize,
    ) -> Result<(MutexGuard<'_, Inflight>, Vec<usize>)> {
        let mut since = Instant::now();
        let mut nap = Duration::ZERO;
        // Whether this call counts among the waiters (`Inflight::slot_waiters`).
        let mut waiter = false;
        loop {
            let mut c = self.inner.calls.lock();
            let r = try_slots(&mut c, dev, need, nslices, waiter);
            if !matches!(r, Ok(None)) {
                if waiter {
                    c.slot_waiters -= 1;
                }
                return r.map(|got| (c, got.unwrap_or_default()));
            }
            if !waiter {
                c.slot_waiters += 1;
                waiter = true;
            }
            let (moved, fin) = c.advance(comm);
            drop(c);
            finish(comm, fin);
            if moved {
                since = Instant::now();
                nap = Duration::ZERO;
            } else if since.elapsed() > comm.timeout.limit {
                self.inner.calls.lock().slot_waiters -= 1;
                return Err(Error::Timeout(format!(
                    "a stream-ordered call found no free staging slot, and the device calls in \
                     flight that hold them made no progress within {} (a stream-ordered call \
                     allocates none: it waits for one to be freed)",
                    comm.timeout
                )));
            } else {
                nap = crate::device::backoff_to(nap, MAX_NAP);
            }
        }
    }

    /// Before the communicator's first stream-ordered call enqueues its flag wait: this rank's
    /// staging is made (if no earlier device call made it), and every rank has got here, so
    /// every rank has made its own. Ranks that are threads of one process share the device's
    /// context, where allocating page-locked memory and creating streams wait for every
    /// stream: a rank still making its staging would wait for a peer's stream blocked on the
    /// peer's flag, which waits for the call that needs the allocating rank. This holds
    /// whatever the first device call was (a non-blocking one returns before a late peer has
    /// made its staging). The barrier is a host call: device calls in flight ahead of it start
    /// first (`settle`).
    pub(super) fn join(&self, comm: &Arc<Comm>, dev: &Device) -> Result<()> {
        let direct = self.stream_direct(comm, dev).is_some();
        self.prepare(dev, false, true, direct)?;
        self.settle(comm, &Kind::Coll(Collective::AllReduce))?;
        barrier(comm)?;
        self.inner.calls.lock().joined = true;
        Ok(())
    }

    /// Makes the communicator's staging on `dev` where no device call has made it: its copy
    /// streams, then the page-locked slots wanted and not made yet (`full`: the `SLOTS`
    /// full-size slots that staged calls share; `flags`: the flag slots of stream-ordered
    /// direct calls), each slot with the flag that releases a stream-ordered call's stream.
    /// `replace`: a call that may allocate renews staging of another device while no call is
    /// in flight (the next stream-ordered call then joins the ranks again); a stream-ordered
    /// call allocates nothing else.
    ///
    /// A communicator whose calls go direct makes no full-size slot before its first
    /// stream-ordered call: its staged blocking, non-blocking and grouped calls allocate the
    /// slot each needs; but a stream-ordered call that is staged (compressed, or on
    /// page-locked host or managed memory) never allocates, so that first call (`join`) makes
    /// them, before any stream waits for this rank.
    pub(super) fn prepare(
        &self,
        dev: &Device,
        replace: bool,
        full: bool,
        flags: bool,
    ) -> Result<()> {
        let (fresh, lacks) = {
            let c = self.inner.calls.lock();
            match c.pool.as_ref() {
                None => (true, (full, flags)),
                Some(p) if p.device().ordinal() != dev.ordinal() => {
                    if !replace || c.busy() {
                        return Err(Error::InvalidUsage(format!(
                            "this communicator's device calls use device {}, not {} (finish \
                             them first)",
                            p.device().ordinal(),
                            dev.ordinal()
                        )));
                    }
                    (true, (full, flags))
                }
                Some(p) => (false, p.lacks(full, flags)),
            }
        };
        if !fresh && lacks == (false, false) {
            return Ok(());
        }
        // Outside the lock, as in `add`.
        let pool = if fresh { Some(Pool::new(dev)?) } else { None };
        let fill = Fill::make(dev, lacks.0, lacks.1)?;
        let mut c = self.inner.calls.lock();
        if let Some(p) = pool {
            c.pool = Some(p);
            c.joined = false;
        }
        let spare = pool_of(&mut c)?.fill(fill);
        // Made twice by two threads at once: freed outside the lock.
        drop(c);
        drop(spare);
        Ok(())
    }
}

/// One try of `slots`: the slots taken (None: none free, or a waiter comes first where
/// this call is not one, `waiter`).
fn try_slots(
    c: &mut Inflight,
    dev: &Device,
    need: (usize, usize),
    nslices: usize,
    waiter: bool,
) -> Result<Option<Vec<usize>>> {
    if let Some(e) = &c.error {
        return Err(earlier(e));
    }
    let first = !waiter && c.wants_slot();
    let pool = pool_of(c)?;
    if pool.device().ordinal() != dev.ordinal() || !pool.could_fit(need) {
        return Err(Error::InvalidUsage(format!(
            "this communicator's device staging is on device {} or was given up after a \
             failed call (a stream-ordered call allocates none); a blocking call on device \
             {} renews it",
            pool.device().ordinal(),
            dev.ordinal()
        )));
    }
    if first {
        return Ok(None);
    }
    let mut got = Vec::new();
    while got.len() < STREAM_SLOTS.min(nslices) {
        match pool.take(need) {
            Some(s) => got.push(s),
            None => break,
        }
    }
    Ok((!got.is_empty()).then_some(got))
}

/// The staging of `c` (made by `prepare`).
pub(super) fn pool_of(c: &mut Inflight) -> Result<&mut Pool> {
    c.pool
        .as_mut()
        .ok_or_else(|| Error::Internal("the device staging is missing".into()))
}

/// Every rank of `comm` has got here: a one-word host allreduce.
fn barrier(comm: &Comm) -> Result<()> {
    let word = Box::into_raw(Box::new([0u8; 4]));
    // SAFETY: `word` is leaked unless the call succeeded, so it outlives every use.
    let region = unsafe { Region::from_raw(word.cast(), 4) };
    let call = Call {
        kind: Kind::Coll(Collective::AllReduce),
        send: region,
        recv: region,
        count: 1,
        dtype: DataType::Uint32,
        op: RedOp::Sum,
        root: 0,
        algo: None,
    };
    comm.run(&call)?;
    // SAFETY: from `Box::into_raw` above; the call has completed, nothing uses it any more.
    drop(unsafe { Box::from_raw(word) });
    Ok(())
}

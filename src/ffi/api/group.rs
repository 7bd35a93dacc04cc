//! Group calls (`fabricoll_group_start` / `fabricoll_group_end`, as NCCL's): between them a
//! thread's blocking calls start non-blocking and return at once; the outermost end waits for
//! them all. The depth and the started calls are per thread. Calls on device buffers start as
//! the non-blocking device calls do (`coll::device`): each holds a staging slot of its own and
//! the communicator's device worker advances them all together.
//!
//! Why pairs cannot deadlock: every call of the group is posted before any is waited for, and
//! waiting on one request of a communicator advances all of its requests. So a blocking send
//! and a blocking receive that two ranks each make in one group (which outside a group could
//! both block in their send) are all in flight when the ranks start waiting. Over several
//! communicators the calls are handed to the communicators' progress threads (`notify`), so
//! that each advances while the group waits for another.
use super::handles::{wait_pending, CommEntry, Req};
use super::types::fabricoll_status;
use crate::coll::device::DevCall;
use crate::coll::Call;
use crate::error::{Error, Result};
use crate::ffi::boundary::boundary;
use parking_lot::{Condvar, Mutex};
use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

/// This thread's open group: how deeply nested, and the calls started in it.
#[derive(Default)]
struct Group {
    depth: usize,
    started: Vec<(Arc<CommEntry>, Req)>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// A blocking call: run to completion, or, inside a group, started and recorded for
/// `fabricoll_group_end`.
pub(super) fn run_blocking(c: Arc<CommEntry>, call: &Call) -> Result<()> {
    if GROUP.with(|g| g.borrow().depth) == 0 {
        return c.comm.run(call);
    }
    let id = c.comm.start(call)?;
    GROUP.with(|g| g.borrow_mut().started.push((c, Req::Host(id))));
    Ok(())
}

/// A blocking call on device buffers: run to completion, or, inside a group, started (as a
/// non-blocking device call) and recorded for `fabricoll_group_end`.
pub(super) fn run_device(c: Arc<CommEntry>, call: DevCall) -> Result<()> {
    if GROUP.with(|g| g.borrow().depth) == 0 {
        return c.streams.run(&c.comm, call);
    }
    let id = c.streams.start(&c.comm, call)?;
    GROUP.with(|g| g.borrow_mut().started.push((c, Req::Device(id))));
    Ok(())
}

/// Fails when this thread is inside a group: `what` (a call that blocks, or one ordered on a
/// stream) cannot be deferred to the group's end.
pub(super) fn no_group(what: &str) -> Result<()> {
    if GROUP.with(|g| g.borrow().depth) > 0 {
        return Err(Error::InvalidUsage(format!(
            "{what} cannot be used inside fabricoll_group_start / fabricoll_group_end"
        )));
    }
    Ok(())
}

/// Start a group (nestable, per thread, as NCCL's ncclGroupStart): until the matching
/// fabricoll_group_end, blocking calls of this thread (any communicator) are started as
/// non-blocking and return at once.
#[no_mangle]
pub extern "C" fn fabricoll_group_start() -> fabricoll_status {
    boundary("fabricoll_group_start", || {
        GROUP.with(|g| g.borrow_mut().depth += 1);
        Ok(())
    })
}

/// End a group: the outermost end waits for every call started in the group (at most the
/// timeout without progress) and returns the first failure (all calls have finished or
/// failed by then; their buffers are free). Without a matching fabricoll_group_start:
/// FABRICOLL_INVALID_USAGE.
#[no_mangle]
pub extern "C" fn fabricoll_group_end() -> fabricoll_status {
    boundary("fabricoll_group_end", end_group)
}

/// Leave one level of this thread's group; at the outermost, wait for its calls.
fn end_group() -> Result<()> {
    let started = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        match g.depth {
            0 => Err(Error::InvalidUsage(
                "fabricoll_group_end without a matching fabricoll_group_start".into(),
            )),
            1 => {
                g.depth = 0;
                Ok(std::mem::take(&mut g.started))
            }
            _ => {
                g.depth -= 1;
                Ok(Vec::new())
            }
        }
    })?;
    wait_all(started)
}

/// Wait for every call; the first failure (in the order the calls were made).
fn wait_all(started: Vec<(Arc<CommEntry>, Req)>) -> Result<()> {
    let one_comm = started.windows(2).all(|w| Arc::ptr_eq(&w[0].0, &w[1].0));
    if one_comm {
        // Waiting on each in turn advances them all (the host calls' engine, and the device
        // calls, which their worker also advances): no thread handoff.
        let mut first = Ok(());
        for (c, id) in started {
            let r = wait_pending(&c, id);
            if first.is_ok() {
                first = r;
            }
        }
        return first;
    }
    wait_notified(started)
}

/// What the progress threads report to a group waiting over several communicators.
struct Outcome {
    results: Mutex<(usize, Vec<Option<Result<()>>>)>,
    done: Condvar,
}

/// Hand every call to its communicator's progress thread and wait until all have reported.
fn wait_notified(started: Vec<(Arc<CommEntry>, Req)>) -> Result<()> {
    let n = started.len();
    let out = Arc::new(Outcome {
        results: Mutex::new((0, (0..n).map(|_| None).collect())),
        done: Condvar::new(),
    });
    for (i, (c, id)) in started.into_iter().enumerate() {
        let o = out.clone();
        let report = move |r: Result<()>| {
            let mut g = o.results.lock();
            g.0 += 1;
            g.1[i] = Some(r);
            o.done.notify_all();
        };
        if let Err(e) = super::handles::notify_pending(&c, id, Box::new(report)) {
            // Not handed over (cannot happen for a request this group started): report it.
            let mut g = out.results.lock();
            g.0 += 1;
            g.1[i] = Some(Err(e));
        }
    }
    let mut g = out.results.lock();
    // Every call ends by its own deadline (the communicators' timeouts), so this wait ends;
    // the slice only bounds each sleep.
    while g.0 < n {
        out.done.wait_for(&mut g, Duration::from_millis(100));
    }
    g.1.iter_mut()
        .map(|r| r.take().unwrap_or(Ok(())))
        .find(|r| r.is_err())
        .unwrap_or(Ok(()))
}

//! The C API's communicators and requests: one [`HandleTable`] each. A handle is a key, never
//! a pointer to dereference, so a stale or garbage handle is an error naming the argument.
use super::types::{fabricoll_comm, fabricoll_request};
use crate::coll::device::Streams;
use crate::coll::{Callback, Comm, RequestId};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::ffi::non_null;
use crate::plugin::handles::HandleTable;
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A communicator as the C API knows it.
pub(super) struct CommEntry {
    /// Shared with the communicator's progress thread, which holds it weakly (`Comm::notify`).
    pub comm: Arc<Comm>,
    /// Set by `fabricoll_comm_abort`: its requests then all report that, whatever state they
    /// reached, so the caller gets one answer on any number of ranks.
    aborted: AtomicBool,
    /// The settings it was made with where they were not the environment's
    /// (`fabricoll_comm_init_rank_config`): communicators split from it inherit them.
    pub cfg: Option<Config>,
    /// Its calls on device buffers: the staging, the stream-ordered calls and their worker.
    pub streams: Streams,
}

/// Low bits of a C API key: 0, so that handles look like aligned pointers.
const TAG: u8 = 0;

/// Longest wait in `destroy_comm` for other threads (the progress thread running a callback)
/// to release the communicator.
const DESTROY_GRACE: Duration = Duration::from_secs(2);

/// A request's id on its communicator: a host call's (its engine's), or a device call's
/// (its device calls', `coll::device::Streams`).
#[derive(Clone, Copy, Debug)]
pub(super) enum Req {
    Host(RequestId),
    Device(u64),
}

/// A pending request: its communicator and its id there.
type Pending = (Arc<CommEntry>, Req);

static COMMS: Lazy<Mutex<HandleTable<Arc<CommEntry>>>> = Lazy::new(Default::default);
static REQUESTS: Lazy<Mutex<HandleTable<Pending>>> = Lazy::new(Default::default);

fn key<T>(p: *mut T) -> u64 {
    p as usize as u64
}

fn aborted_error() -> Error {
    Error::InvalidUsage(
        "the communicator was aborted (fabricoll_comm_abort): its requests are freed and fail"
            .into(),
    )
}

/// The live communicator behind `p`.
pub(super) fn comm_of(p: *mut fabricoll_comm) -> Result<Arc<CommEntry>> {
    non_null(p, "comm")?;
    COMMS.lock().get(key(p)).cloned().ok_or_else(|| {
        Error::arg(
            "comm",
            "not a live communicator (destroyed, or never created)",
        )
    })
}

pub(super) fn register_comm(c: Comm) -> *mut fabricoll_comm {
    register_comm_with(c, None)
}

/// `register_comm` of a communicator made with `cfg` (None: the environment's settings).
pub(super) fn register_comm_with(c: Comm, cfg: Option<Config>) -> *mut fabricoll_comm {
    let e = Arc::new(CommEntry {
        comm: Arc::new(c),
        aborted: AtomicBool::new(false),
        cfg,
        streams: Streams::default(),
    });
    COMMS.lock().insert(TAG, e) as usize as *mut fabricoll_comm
}

/// Free `p` and its requests; collectives in flight are aborted.
pub(super) fn destroy_comm(p: *mut fabricoll_comm) -> Result<()> {
    let c = comm_of(p)?;
    if c.comm.in_own_callback() {
        return Err(Error::InvalidUsage(
            "comm: fabricoll_comm_destroy inside one of the communicator's own notify \
             callbacks (its progress thread runs them and holds it): destroy it after the \
             callback has returned"
                .into(),
        ));
    }
    COMMS.lock().remove(key(p));
    REQUESTS.lock().retain(|_, (rc, _)| !Arc::ptr_eq(rc, &c));
    // Abort first, whatever is in flight: it raises the communicator's abort flag before it
    // waits for the engine, which a blocking collective on the direct channel holds until it
    // sees the flag. (Asking `pending()` first waited for that collective's deadline.)
    c.comm.abort();
    // The stream worker ends its call (aborted) and fails the queued ones, releasing their
    // streams; it holds the communicator until then.
    c.streams.shutdown(&c.comm);
    // The progress thread may hold the communicator for the rest of a round (a callback in
    // progress): wait for it to let go, so that the communicator and its fabric objects are
    // gone when destroy returns, not freed by that thread later (at process exit, while the
    // libraries' destructors run). Bounded: a callback that never returns costs the grace.
    let gone = Arc::downgrade(&c.comm);
    drop(c);
    let deadline = Instant::now() + DESTROY_GRACE;
    while gone.strong_count() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

pub(super) fn abort_comm(p: *mut fabricoll_comm) -> Result<()> {
    let c = comm_of(p)?;
    c.aborted.store(true, Ordering::SeqCst);
    c.comm.abort();
    c.comm.leave_aborted();
    Ok(())
}

pub(super) fn register_request(c: Arc<CommEntry>, id: RequestId) -> *mut fabricoll_request {
    REQUESTS.lock().insert(TAG, (c, Req::Host(id))) as usize as *mut fabricoll_request
}

/// `register_request` of a device call's request.
pub(super) fn register_device_request(c: Arc<CommEntry>, id: u64) -> *mut fabricoll_request {
    REQUESTS.lock().insert(TAG, (c, Req::Device(id))) as usize as *mut fabricoll_request
}

fn req_of(p: *mut fabricoll_request) -> Result<(u64, Arc<CommEntry>, Req)> {
    non_null(p, "request")?;
    let k = key(p);
    let g = REQUESTS.lock();
    let (c, id) = g.get(k).ok_or_else(|| {
        Error::arg(
            "request",
            "not a pending request (completed, or never created)",
        )
    })?;
    Ok((k, c.clone(), *id))
}

/// `f` on a request of `c`, unless `c` was aborted: then (also when it is aborted while `f`
/// runs and `f` fails) the error says so.
fn unless_aborted<T>(c: &CommEntry, f: impl FnOnce() -> Result<T>) -> Result<T> {
    if c.aborted.load(Ordering::SeqCst) {
        return Err(aborted_error());
    }
    let r = f();
    if r.is_err() && c.aborted.load(Ordering::SeqCst) {
        return Err(aborted_error());
    }
    r
}

/// Has the request ended? An ended request (done or failed) is freed.
pub(super) fn test_request(p: *mut fabricoll_request) -> Result<bool> {
    let (k, c, id) = req_of(p)?;
    let r = unless_aborted(&c, || match id {
        Req::Host(id) => c.comm.test(id),
        Req::Device(id) => c.streams.test(&c.comm, id),
    });
    if !matches!(r, Ok(false)) {
        REQUESTS.lock().remove(k);
    }
    r
}

/// Wait for the request and free it.
pub(super) fn wait_request(p: *mut fabricoll_request) -> Result<()> {
    let (k, c, id) = req_of(p)?;
    let r = wait_pending(&c, id);
    REQUESTS.lock().remove(k);
    r
}

/// Wait for request `id` of `c`, that no handle names (a group's call).
pub(super) fn wait_pending(c: &CommEntry, id: Req) -> Result<()> {
    unless_aborted(c, || match id {
        Req::Host(id) => c.comm.wait(id),
        Req::Device(id) => c.streams.wait(&c.comm, id),
    })
}

/// Hand request `id` of `c`, that no handle names (a group's call), to the progress thread
/// (a device call's: to the communicator's device worker).
pub(super) fn notify_pending(c: &Arc<CommEntry>, id: Req, callback: Callback) -> Result<()> {
    let cb = with_abort(c, callback);
    match id {
        Req::Host(id) => c.comm.notify(id, cb),
        Req::Device(id) => c.streams.notify(&c.comm, id, cb),
    }
}

/// `callback`, reporting the abort error where `c` was aborted (as test and wait do).
fn with_abort(c: &Arc<CommEntry>, callback: Callback) -> Callback {
    let entry = Arc::downgrade(c);
    Box::new(move |r| {
        let aborted = entry
            .upgrade()
            .is_some_and(|e| e.aborted.load(Ordering::SeqCst));
        callback(if r.is_err() && aborted {
            Err(aborted_error())
        } else {
            r
        })
    })
}

/// Hand the request to its communicator's progress thread: `callback` runs once when it ends
/// (at once, in this thread, if it already has), with the abort error where the communicator
/// was aborted. The request is freed here; a bad request is an error that leaves it as it was.
pub(super) fn notify_request(p: *mut fabricoll_request, callback: Callback) -> Result<()> {
    let (k, c, id) = req_of(p)?;
    notify_pending(&c, id, callback)?;
    REQUESTS.lock().remove(k);
    Ok(())
}

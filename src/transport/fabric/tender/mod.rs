//! The tender: a thread that progresses an endpoint of libfabric's native TCP provider while
//! its owner does not.
//!
//! That provider's data progress is manual: bytes move only inside calls that progress the
//! endpoint (reading its completion queue). A send that finds the socket full is copied into
//! the connection's staging buffer and reported complete at once; its bytes leave on a later
//! progress call. An owner that stops polling once its sends have completed (the NCCL proxy
//! with nothing left on a comm, a C API caller that goes on to wait for its peer elsewhere)
//! leaves them there, and the peer waits for a message that was reported sent. The same holds
//! for a peer's connection stopped at a message of ours that no receive matched yet: only our
//! progress claims it.
//!
//! So an endpoint of that provider with a wait fd gets a tender. It does nothing while the
//! owner polls: it looks every `TENDER_AFTER` whether the owner polled since it last looked
//! (a flag the owner's poll sets with a plain store, so that the poll pays no atomic update),
//! or is inside a blocking wait (`Transport::owner_waits`: a communicator's `wait`), where it
//! polls again as soon as it gets a CPU. Without that second look, ranks that outnumber the
//! cores, each off its CPU for longer than `TENDER_AFTER` at a time, had their tenders step in
//! mid-call, taking the endpoint's lock and the CPU from the ranks that had work.
//! Once the owner has not, it progresses the endpoint itself, with the owner's own code
//! (`Inner::progress`): completions wait in `ready` for the owner's next poll, and the queue
//! is signalled so that an owner asleep on the wait fd wakes up for them. Between rounds it
//! sleeps on the wait fd, which the provider makes readable when a socket can take staged
//! bytes or has bytes to read, so an idle endpoint costs no CPU. An error of its progress is
//! kept for the owner's next poll.
use super::{sys, Caps, Inner};
use parking_lot::Mutex;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long the owner may go without polling before the tender steps in: the longest a
/// message reported sent waits for its bytes to leave once the owner has stopped polling.
const TENDER_AFTER: Duration = Duration::from_millis(5);

/// The longest the tender sleeps on the wait fd between rounds.
const IDLE_WAIT: Duration = Duration::from_millis(100);

/// The pause after a round that left the provider with work (`fi_trywait` refused the wait).
const BUSY_PAUSE: Duration = Duration::from_millis(1);

/// What the tender and the transport share.
struct Shared {
    /// Set by each of the owner's polls (`FabricTransport::poll`), cleared by the tender.
    polled: AtomicBool,
    /// Blocking waits of the owner in progress (`Transport::owner_waits`).
    waiting: AtomicUsize,
    stop: AtomicBool,
}

/// A running tender; dropping it stops and joins the thread.
pub(super) struct Tender {
    shared: Arc<Shared>,
    /// Written to wake the thread for `stop`.
    wake: c_int,
    thread: Option<JoinHandle<()>>,
}

impl Tender {
    /// Start a tender for `inner`, whose completion queue's wait fd is `wait_fd`. None where the
    /// thread or its wake-up fd cannot be made (logged): the endpoint then works as before.
    pub(super) fn start(inner: Arc<Mutex<Inner>>, caps: &Caps, wait_fd: c_int) -> Option<Tender> {
        // SAFETY: eventfd has no memory arguments; the fd is closed in Drop.
        let wake = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if wake < 0 {
            log::warn!(
                "{}: no tender for this endpoint (eventfd: {})",
                caps.domain,
                std::io::Error::last_os_error()
            );
            return None;
        }
        let shared = Arc::new(Shared {
            polled: AtomicBool::new(false),
            waiting: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        let (sh, caps2) = (shared.clone(), caps.clone());
        let spawned = std::thread::Builder::new()
            .name("fabricoll-tender".into())
            .spawn(move || run(&inner, &caps2, &sh, wait_fd, wake));
        match spawned {
            Ok(thread) => Some(Tender {
                shared,
                wake,
                thread: Some(thread),
            }),
            Err(e) => {
                log::warn!("{}: no tender for this endpoint: {e}", caps.domain);
                // SAFETY: wake is our open eventfd, closed once here.
                unsafe { libc::close(wake) };
                None
            }
        }
    }

    /// The owner polled: the tender stands aside.
    pub(super) fn owner_polled(&self) {
        self.shared.polled.store(true, Ordering::Relaxed);
    }

    /// The owner enters or leaves a blocking wait (`Transport::owner_waits`).
    pub(super) fn owner_waits(&self, on: bool) {
        if on {
            self.shared.waiting.fetch_add(1, Ordering::Relaxed);
        } else {
            self.shared.waiting.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Tender {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let one: u64 = 1;
        // SAFETY: wake is our open eventfd; the write reads 8 bytes from `one`.
        unsafe { libc::write(self.wake, &one as *const u64 as *const libc::c_void, 8) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // SAFETY: the thread that polled it has ended; closed once here.
        unsafe { libc::close(self.wake) };
    }
}

/// The tender's loop.
fn run(inner: &Mutex<Inner>, caps: &Caps, sh: &Shared, wait_fd: c_int, wake: c_int) {
    while !sh.stop.load(Ordering::Acquire) {
        if sh.polled.swap(false, Ordering::Relaxed) || sh.waiting.load(Ordering::Relaxed) > 0 {
            // The owner is polling, or will as soon as it runs: look again later.
            sleep(&[wake], TENDER_AFTER);
            continue;
        }
        let may_sleep = tend(inner, caps);
        if may_sleep {
            sleep(&[wait_fd, wake], IDLE_WAIT);
        } else {
            sleep(&[wake], BUSY_PAUSE);
        }
        // The owner's polls during the sleep are not the owner returning: only those after.
        sh.polled.store(false, Ordering::Relaxed);
        if sh.stop.load(Ordering::Acquire) {
            break;
        }
        // After the wait fd fired, give the owner a moment to take its own completions.
        if sleep(&[wake], TENDER_AFTER) {
            break;
        }
    }
}

/// One round for an owner that is away: progress the endpoint, wake the owner for what it
/// completed, and say whether the wait fd may be slept on now (`fi_trywait`).
fn tend(inner: &Mutex<Inner>, caps: &Caps) -> bool {
    let mut g = inner.lock();
    let before = g.ready.len();
    if let Err(e) = g.progress(caps) {
        log::debug!("{}: the tender's progress failed: {e}", caps.domain);
        g.tended_error.get_or_insert(e);
    }
    if g.ready.len() > before {
        // SAFETY: cq is open while `inner` lives; signalling wakes a waiter on its wait fd.
        unsafe { sys::fi_cq_signal(g.cq) };
    }
    g.may_wait()
}

/// Sleep until one of `fds` is readable or `timeout` passes (at least a millisecond); true
/// when the last of `fds`, the wake-up fd, fired: the tender is being stopped.
fn sleep(fds: &[c_int], timeout: Duration) -> bool {
    let mut p = [libc::pollfd {
        fd: -1,
        events: libc::POLLIN,
        revents: 0,
    }; 2];
    let n = fds.len().min(p.len());
    for (slot, &fd) in p.iter_mut().zip(fds) {
        slot.fd = fd;
    }
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as c_int;
    // SAFETY: p holds n valid pollfds; the fds stay open while the tender runs.
    unsafe { libc::poll(p.as_mut_ptr(), n as libc::nfds_t, ms) };
    n > 0 && p[n - 1].revents != 0
}

#[cfg(test)]
mod tests;

//! The lingering close: the endpoints of ended communicators stay open in one process-wide
//! thread, the closer, until their goodbyes are done (`goodbye::Farewell`), so that destroy
//! returns at once, as NCCL's `ncclCommDestroy` does, instead of waiting for the peers to
//! destroy theirs. One thread that destroys the communicators of several ranks one after
//! another then waits for none: the first one's endpoint, still open, answers the goodbyes of
//! the later ones.
//!
//! An endpoint closes once its goodbyes are in, sent or failed, or its communicator's deadline
//! has passed (with a warning naming the silent ranks). Over shm (`Caps::reads_local_peers`)
//! an endpoint of this process reads a peer endpoint of this process in that endpoint's own
//! memory, so one closed while another here still has its goodbye to read would crash the
//! reader: such endpoints close together, once none of them still waits. A farewell is handed
//! over under the closer's lock together with the sends of its goodbyes (`linger`), so no
//! endpoint closes between a goodbye sent to it and the arrival of its sender's farewell.
//!
//! At process exit (`atexit`, registered when the closer starts) the exiting thread waits for
//! the closer to close what it holds, each endpoint still bounded by its deadline, so that a
//! process that destroys and exits at once still delivers what it sent. That wait cannot hang
//! the exit: the closer takes no lock but its own queue's, which others hold only to hand over
//! a farewell; the exiting thread waits for that lock and for the closer at most until the
//! latest deadline (plus a grace), and what the closer still holds afterwards is left open, as
//! an exit without destroy leaves it, rather than closed while the libraries' destructors run.
//! A destroy after that wait (from a later destructor) waits for its goodbyes itself; one in
//! a forked child, whose closer stayed in the parent, closes without waiting for them.
use super::engine::SLEEP_SLICE;
use super::goodbye::{Farewell, Step};
use once_cell::sync::OnceCell;
use parking_lot::{Condvar, Mutex};
use std::os::unix::thread::JoinHandleExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// How long the closer, holding nothing, sleeps before it looks at its queue again (woken
/// earlier by each new farewell).
const IDLE: Duration = Duration::from_secs(1);

/// Past the latest deadline, how long exit waits for the closer to close the endpoints (and
/// for its queue's lock).
const EXIT_GRACE: Duration = Duration::from_secs(5);

/// What the closer has to do, shared with the threads that hand it work and with exit.
#[derive(Default)]
struct Queue {
    /// Handed over, not yet taken by the closer.
    new: Vec<Farewell>,
    /// Taken by the closer and not yet closed.
    held: usize,
    /// The latest deadline of any farewell handed over.
    latest: Option<Instant>,
    /// Exit stopped waiting: leave every endpoint still held open.
    exiting: bool,
}

struct Closer {
    queue: Mutex<Queue>,
    /// Signalled on new work (to the closer) and when the closer holds nothing (to exit).
    changed: Condvar,
    /// The closer's thread.
    thread: libc::pthread_t,
    /// The process it runs in (a forked child has no closer).
    pid: libc::pid_t,
}

static CLOSER: OnceCell<Closer> = OnceCell::new();

/// Say goodbye with `post` (`Comm::goodbye`, which posts and sends the goodbyes) and keep the
/// endpoint of the farewell it returns open until its goodbyes are done or its deadline
/// passed, then close it, in the closer's thread (started on first use). Returns at once, but
/// where there is no closer to take it: then it waits for the goodbyes itself.
pub(super) fn linger(post: impl FnOnce() -> Option<Farewell>) {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let closer = match CLOSER.get_or_try_init(|| start(pid)) {
        Ok(c) if c.pid == pid => c,
        Ok(_) => {
            // A forked child: the closer's thread stayed in the parent, and the endpoint is
            // the parent's as much as ours. Close without waiting for the goodbyes.
            drop(post());
            return;
        }
        Err(e) => {
            log::warn!("no closer thread ({e}): destroy waits for the goodbyes itself");
            return wait_here(post());
        }
    };
    // Under the lock, so that the closer sees this farewell before it may close an endpoint
    // that has taken its goodbye (see the module doc).
    let mut q = closer.queue.lock();
    if q.exiting {
        // A destroy from a destructor that runs after the exit's wait.
        drop(q);
        return wait_here(post());
    }
    if let Some(f) = post() {
        q.latest = q.latest.max(Some(f.deadline()));
        q.new.push(f);
        closer.changed.notify_all();
    }
}

/// Wait in this thread for `f`'s goodbyes, as bounded as the closer would, then close it.
fn wait_here(f: Option<Farewell>) {
    let mut held: Vec<Farewell> = f.into_iter().collect();
    while !held.is_empty() {
        if !advance(&mut held) {
            held[0].wait(SLEEP_SLICE);
        }
        close_over(&mut held, false);
    }
}

fn start(pid: libc::pid_t) -> std::io::Result<Closer> {
    let h = std::thread::Builder::new()
        .name("fabricoll-closer".into())
        .spawn(run)?;
    // SAFETY: registering a plain extern "C" function with no arguments. The library is
    // linked with -z nodelete, so the function outlives every caller of exit.
    if unsafe { libc::atexit(at_exit) } != 0 {
        log::warn!("atexit refused the closer's exit wait: a process that exits right after a destroy may lose what it sent last");
    }
    Ok(Closer {
        queue: Mutex::new(Queue::default()),
        changed: Condvar::new(),
        thread: h.as_pthread_t(),
        pid,
    })
}

/// The closer's thread.
fn run() {
    let closer = loop {
        // `start` returns, and `CLOSER` is set, right after this thread is spawned.
        match CLOSER.get() {
            Some(c) => break c,
            None => std::thread::sleep(SLEEP_SLICE),
        }
    };
    let mut held: Vec<Farewell> = Vec::new();
    loop {
        {
            let mut q = closer.queue.lock();
            q.held = held.len();
            if held.is_empty() && q.new.is_empty() {
                closer.changed.notify_all();
                closer.changed.wait_for(&mut q, IDLE);
            }
            if q.exiting {
                // Exit no longer waits: the libraries' destructors may run now.
                std::mem::forget(std::mem::take(&mut held));
                std::mem::forget(std::mem::take(&mut q.new));
                q.held = 0;
                closer.changed.notify_all();
                return;
            }
            held.append(&mut q.new);
            q.held = held.len();
        }
        if held.is_empty() {
            continue;
        }
        let moved = advance(&mut held);
        // A farewell handed over since the take above still waits, whatever it is.
        let newcomer = closer.queue.lock().new.iter().any(|f| f.read_in_place());
        if close_over(&mut held, newcomer) == 0 && !moved {
            match held.as_slice() {
                [one] => one.wait(SLEEP_SLICE),
                _ => std::thread::sleep(SLEEP_SLICE),
            }
        }
    }
}

/// Poll each farewell of `held` once. Whether any moved.
fn advance(held: &mut Vec<Farewell>) -> bool {
    let now = Instant::now();
    let mut moved = false;
    let mut i = 0;
    while i < held.len() {
        // A panic in a transport ends that farewell only; its endpoint is left open, since
        // closing it may panic again.
        match catch_unwind(AssertUnwindSafe(|| held[i].step(now))) {
            Ok(Step::Pending(m)) => {
                moved |= m;
                i += 1;
            }
            Ok(Step::Over) => i += 1,
            Err(_) => {
                log::error!(
                    "the closer's poll of an ended communicator panicked: its endpoint stays open"
                );
                std::mem::forget(held.swap_remove(i));
                moved = true;
            }
        }
    }
    moved
}

/// Close (drop) the farewells of `held` that are over, but those read in place while one such
/// still waits (in `held`, or a newcomer not yet in it: `newcomer`). How many closed.
fn close_over(held: &mut Vec<Farewell>, newcomer: bool) -> usize {
    let waiting = newcomer || held.iter().any(|f| f.read_in_place() && !f.is_over());
    let before = held.len();
    held.retain(|f| !f.is_over() || (f.read_in_place() && waiting));
    before - held.len()
}

/// At exit: wait until the closer has closed every endpoint handed to it, at most until the
/// latest deadline and a grace (see the module doc).
extern "C" fn at_exit() {
    let Some(closer) = CLOSER.get() else {
        return;
    };
    // (Not `std::thread::current`: the exiting thread's thread-locals may be gone.)
    // SAFETY: pthread_self and getpid have no preconditions.
    let (me, pid) = unsafe { (libc::pthread_self(), libc::getpid()) };
    if me == closer.thread || pid != closer.pid {
        return; // exit from inside the closer, or a forked child's: nothing to wait for
    }
    let Some(mut q) = closer.queue.try_lock_for(EXIT_GRACE) else {
        return;
    };
    let until = q.latest.unwrap_or_else(Instant::now).max(Instant::now()) + EXIT_GRACE;
    while (!q.new.is_empty() || q.held > 0) && Instant::now() < until {
        closer.changed.wait_until(&mut q, until);
    }
    let left = q.new.len() + q.held;
    if left > 0 {
        log::warn!("{left} ended communicators' endpoints still open at exit: left as they are");
    }
    q.exiting = true;
    closer.changed.notify_all();
}

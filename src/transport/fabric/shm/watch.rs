//! Names of shm endpoints. libfabric's shm provider names its region after the process id
//! (`<pid>:0:0` in /dev/shm) and unlinks it only when the endpoint is closed. A process that
//! never closes it (NCCL keeps the plugin's endpoints until exit; a rank is killed) leaves 16
//! MiB behind, and a later process that gets the same pid cannot create its endpoint (EBUSY).
//! So each endpoint gets a unique name, the names of endpoints still open are unlinked at exit,
//! and regions of ours whose process is gone are removed when a new endpoint opens (once old
//! enough that no survivor can still be reading a message from them: `SWEEP_AGE`).
use super::super::{check, sys};
use crate::error::Result;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::CString;
use std::os::raw::c_void;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Once;

pub(crate) const PREFIX: &str = "fabricoll-";
static OPEN: Mutex<Vec<String>> = Mutex::new(Vec::new());
static SEQ: AtomicU64 = AtomicU64::new(0);
static AT_EXIT: Once = Once::new();

extern "C" fn unlink_open_regions() {
    // At exit: regions of endpoints nobody closed. Unlinking only drops the name; the memory
    // goes when the last process unmaps it.
    if let Some(names) = OPEN.try_lock() {
        for n in names.iter() {
            if let Ok(c) = CString::new(format!("/{n}")) {
                // SAFETY: c is a valid NUL-terminated path; shm_unlink has no other precondition.
                unsafe { libc::shm_unlink(c.as_ptr()) };
            }
        }
    }
}

fn alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks whether the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// How old a region of a process that no longer exists must be before `sweep` removes it.
/// A peer's first message carries its region's name, and libfabric 1.17's shm maps that
/// region when it reads the message (in `fi_cq_read`), dereferencing the mapping without a
/// check: a region removed between a rank's death and that read crashes every survivor that
/// had a message from it. Creation (bootstrap, hellos, the placement exchange) is where that
/// happens, so a region younger than any creation's deadline is left where it is; older
/// ones only cost their memory until then. Measured on the file's modification time, which
/// the provider sets when it sizes the region and not afterwards (tmpfs mappings do not
/// touch it).
const SWEEP_AGE: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// Remove regions of ours whose process no longer exists, once they are `SWEEP_AGE` old.
fn sweep() {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = pid_of(&name) else {
            continue;
        };
        let age = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok());
        if pid > 0 && !alive(pid) && age.is_some_and(|a| a >= SWEEP_AGE) {
            log::debug!("removing /dev/shm/{name}: its process {pid} is gone");
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The process id in one of our names (`fabricoll-<pid>-...`: regions and their inboxes).
fn pid_of(name: &str) -> Option<i32> {
    name.strip_prefix(PREFIX)?.split('-').next()?.parse().ok()
}

/// Whether `name` (one of ours) names an endpoint of this process.
pub(crate) fn of_this_process(name: &str) -> bool {
    pid_of(name).is_some_and(|pid| pid > 0 && pid as u32 == std::process::id())
}

/// Our endpoint name inside a peer's shm address, if the address carries one.
pub(crate) fn endpoint_in_address(addr: &[u8]) -> Option<String> {
    let s = String::from_utf8_lossy(addr);
    let name: String = s[s.find(PREFIX)?..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    Some(name)
}

/// Give `ep` (not yet enabled) a unique region name; returns it.
pub(crate) fn name_endpoint(ep: *mut sys::fid_ep) -> Result<String> {
    AT_EXIT.call_once(|| {
        sweep();
        // SAFETY: registering a plain extern "C" function with no arguments.
        unsafe { libc::atexit(unlink_open_regions) };
    });
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    let name = format!(
        "{PREFIX}{}-{}-{:x}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed),
        t & 0xffff_ffff
    );
    let c = CString::new(name.clone()).expect("no NUL in the name");
    let bytes = c.as_bytes_with_nul();
    // SAFETY: ep is an open endpoint that is not enabled yet; the name is NUL-terminated and
    // the provider copies it.
    check("fi_setname", unsafe {
        sys::fi_setname(
            ep as *mut sys::fid,
            bytes.as_ptr() as *mut c_void,
            bytes.len(),
        )
    } as i64)?;
    OPEN.lock().push(name.clone());
    Ok(name)
}

/// A file of ours in /dev/shm named `name` (an inbox), to be unlinked at exit if still open.
pub(crate) fn opened(name: String) {
    OPEN.lock().push(name);
}

/// The endpoint named `name` was closed (the provider unlinked its region).
pub(crate) fn closed(name: &str) {
    OPEN.lock().retain(|n| n != name);
}

/// The process behind an shm peer, watched so that we never post to a dead one: a process
/// killed while holding a lock in its shared region leaves libfabric 1.17's shm spinning on it
/// forever inside `fi_tsend`, where no deadline of ours can reach.
///
/// The check runs before every send, so it must cost next to nothing: a `poll` of the pidfd
/// per send was a large share of a small collective (`docs/performance.md`). One thread per
/// process instead sleeps in `epoll_wait` on every watched pidfd and sets the peer's flag when
/// its process exits; a send reads the flag. The kernel wakes that thread at the peer's exit,
/// so the flag is up microseconds later: the same kind of window the per-send `poll` had
/// between its check and `fi_tsend`. Without the thread (no pidfd, epoll or thread), each
/// check polls.
pub(crate) struct PeerWatch {
    pid: i32,
    /// A pidfd (readable once the process has exited, zombies included), or -1.
    fd: i32,
    /// Set by the watcher thread, when this watch is registered with it (the flag, its key).
    exited: Option<(Arc<AtomicBool>, u64, Arc<Watcher>)>,
}

/// The per-process watcher thread's epoll instance and the flags it sets.
struct Watcher {
    epfd: i32,
    /// The process that made it: a forked child has no watcher thread and must not add its
    /// pidfds to its parent's epoll instance, which it shares.
    owner: u32,
    flags: Mutex<HashMap<u64, Arc<AtomicBool>>>,
    next: AtomicU64,
}

static WATCHER: Mutex<Option<Arc<Watcher>>> = Mutex::new(None);

/// Sends up to this size check only the watcher's flag. Larger ones still poll the pidfd: such
/// a send takes several microseconds anyway, and side by side the calls ran slower with the
/// flag alone than with the poll. A short spin in its place gained part of that too, so it is
/// the pause before the send, not the system call, that helps: fewer collisions on the
/// provider's region locks while the peer copies (an explanation, not a measurement).
/// Sends announced by an `RTS` (the peer copies them with CMA, no provider lock) skip the
/// poll, which made them faster. Figures in `docs/performance.md`.
pub(crate) const FLAG_ONLY_BYTES: usize = 4096;

impl Watcher {
    /// This process's watcher, started on first use; None if it cannot be started.
    fn get() -> Option<Arc<Watcher>> {
        let mut g = WATCHER.lock();
        if let Some(w) = g.as_ref().filter(|w| w.owner == std::process::id()) {
            return Some(w.clone());
        }
        // SAFETY: epoll_create1 takes flags and returns a new descriptor or -1.
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            return None;
        }
        let w = Arc::new(Watcher {
            epfd,
            owner: std::process::id(),
            flags: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        });
        let run = w.clone();
        let spawned = std::thread::Builder::new()
            .name("fabricoll-peers".into())
            .spawn(move || run.run());
        if spawned.is_err() {
            // SAFETY: epfd is ours and nothing else holds it yet.
            unsafe { libc::close(epfd) };
            return None;
        }
        *g = Some(w.clone());
        Some(w)
    }

    /// Sleep on the pidfds, raising the flag of each peer whose process exits. Each wait is
    /// bounded (a second); the thread lives as long as the process.
    fn run(&self) {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 16];
        loop {
            // SAFETY: epfd is open for the life of the process (the watcher is never dropped:
            // this thread holds it); events has room for events.len() entries.
            let n = unsafe {
                libc::epoll_wait(self.epfd, events.as_mut_ptr(), events.len() as i32, 1000)
            };
            for e in events.iter().take(n.max(0) as usize) {
                let key = e.u64;
                if let Some(f) = self.flags.lock().get(&key) {
                    f.store(true, Ordering::Release);
                }
            }
        }
    }

    /// Watch `fd`: its flag goes up once it is readable (one shot: an exited process's pidfd
    /// stays readable).
    fn add(self: Arc<Self>, fd: i32) -> Option<(Arc<AtomicBool>, u64, Arc<Watcher>)> {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        let flag = Arc::new(AtomicBool::new(false));
        self.flags.lock().insert(key, flag.clone());
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLONESHOT) as u32,
            u64: key,
        };
        // SAFETY: epfd and fd are open descriptors; ev is a valid event for the call.
        if unsafe { libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
            self.flags.lock().remove(&key);
            return None;
        }
        Some((flag, key, self))
    }

    fn remove(&self, fd: i32, key: u64) {
        // SAFETY: epfd and fd are open; a null event is allowed for EPOLL_CTL_DEL.
        unsafe { libc::epoll_ctl(self.epfd, libc::EPOLL_CTL_DEL, fd, ptr::null_mut()) };
        self.flags.lock().remove(&key);
    }
}

impl PeerWatch {
    /// Watch the process named in a peer's address (our region names carry the pid).
    pub(crate) fn of_address(addr: &[u8]) -> Option<PeerWatch> {
        let pid = pid_of(&endpoint_in_address(addr)?)?;
        if pid <= 0 || pid as u32 == std::process::id() {
            return None;
        }
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
        let exited = if fd >= 0 {
            Watcher::get().and_then(|w| w.add(fd))
        } else {
            None
        };
        Some(PeerWatch { pid, fd, exited })
    }

    /// Has the peer's process exited? With `ask_kernel`, the pidfd is polled even when the
    /// watcher thread keeps a flag for it (see FLAG_ONLY_BYTES).
    pub(crate) fn dead(&self, ask_kernel: bool) -> bool {
        if let Some((flag, ..)) = &self.exited {
            let up = flag.load(Ordering::Acquire);
            if up || !ask_kernel {
                return up;
            }
        }
        if self.fd >= 0 {
            let mut p = libc::pollfd {
                fd: self.fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for a descriptor we own; zero timeout.
            return unsafe { libc::poll(&mut p, 1, 0) } > 0;
        }
        // No pidfd (kernel before 5.3): gone, or a zombie.
        !alive(self.pid)
            || std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
                .map(|st| {
                    st.rsplit(')')
                        .next()
                        .is_some_and(|r| r.trim_start().starts_with('Z'))
                })
                .unwrap_or(true)
    }

    pub(crate) fn pid(&self) -> i32 {
        self.pid
    }
}

impl Drop for PeerWatch {
    fn drop(&mut self) {
        if self.fd >= 0 {
            // A forked child shares its parent's epoll instance: only the owner unregisters.
            if let Some((_, key, w)) = self.exited.take() {
                if w.owner == std::process::id() {
                    w.remove(self.fd, key);
                }
            }
            // SAFETY: we own this descriptor and close it once, after the watcher let go of it.
            unsafe { libc::close(self.fd) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{PeerWatch, Watcher, PREFIX};
    use std::time::{Duration, Instant};

    #[test]
    fn watcher_flags_a_peer_once_its_process_exits_and_forgets_dropped_watches() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let addr = format!("{PREFIX}{}-0-1234", child.id());
        let w = PeerWatch::of_address(addr.as_bytes()).expect("our name format");
        assert_eq!(w.pid(), child.id() as i32);
        assert!(w.exited.is_some(), "the watcher thread took the pidfd");
        assert!(!w.dead(false) && !w.dead(true), "alive");
        child.kill().expect("kill");
        child.wait().expect("reap");
        // The kernel reports the exit at once; the flag follows when the thread has run.
        assert!(w.dead(true), "the pidfd is readable after the exit");
        let start = Instant::now();
        while !w.dead(false) {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "the watcher did not raise the flag within 5 s"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let key = w.exited.as_ref().map(|e| e.1).expect("registered");
        let watcher = Watcher::get().expect("running");
        assert!(watcher.flags.lock().contains_key(&key));
        drop(w);
        assert!(
            !watcher.flags.lock().contains_key(&key),
            "dropped watches are forgotten"
        );
    }

    #[test]
    fn addresses_that_are_not_ours_or_name_this_process_are_not_watched() {
        assert!(PeerWatch::of_address(b"12345:0:0").is_none());
        let own = format!("{PREFIX}{}-0-1", std::process::id());
        assert!(PeerWatch::of_address(own.as_bytes()).is_none());
        assert!(PeerWatch::of_address(format!("{PREFIX}x-0-1").as_bytes()).is_none());
    }
}

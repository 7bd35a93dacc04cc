//! Names of shm endpoints. libfabric's shm provider names its region after the process id
//! (`<pid>:0:0` in /dev/shm) and unlinks it only when the endpoint is closed. A process that
//! never closes it (NCCL keeps the plugin's endpoints until exit; a rank is killed) leaves 16
//! MiB behind, and a later process that gets the same pid cannot create its endpoint (EBUSY).
//! So each endpoint gets a unique name, the names of endpoints still open are unlinked at exit,
//! and regions of ours whose process is gone are removed when a new endpoint opens.
use super::{check, sys};
use crate::error::Result;
use parking_lot::Mutex;
use std::ffi::CString;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

const PREFIX: &str = "fabricoll-";
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

/// Remove regions of ours whose process no longer exists.
fn sweep() {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        if pid > 0 && !alive(pid) {
            log::debug!("removing /dev/shm/{name}: its process {pid} is gone");
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Give `ep` (not yet enabled) a unique region name; returns it.
pub(super) fn name_endpoint(ep: *mut sys::fid_ep) -> Result<String> {
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

/// The endpoint named `name` was closed (the provider unlinked its region).
pub(super) fn closed(name: &str) {
    OPEN.lock().retain(|n| n != name);
}

/// The process behind an shm peer, watched so that we never post to a dead one: a process
/// killed while holding a lock in its shared region leaves libfabric 1.17's shm spinning on it
/// forever inside `fi_tsend`, where no deadline of ours can reach.
pub(super) struct PeerWatch {
    pid: i32,
    /// A pidfd (readable once the process has exited, zombies included), or -1.
    fd: i32,
}

impl PeerWatch {
    /// Watch the process named in a peer's address (our region names carry the pid).
    pub(super) fn of_address(addr: &[u8]) -> Option<PeerWatch> {
        let s = String::from_utf8_lossy(addr);
        let rest = &s[s.find(PREFIX)? + PREFIX.len()..];
        let pid: i32 = rest.split('-').next()?.parse().ok()?;
        if pid <= 0 || pid as u32 == std::process::id() {
            return None;
        }
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
        Some(PeerWatch { pid, fd })
    }

    /// Has the peer's process exited?
    pub(super) fn dead(&self) -> bool {
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

    pub(super) fn pid(&self) -> i32 {
        self.pid
    }
}

impl Drop for PeerWatch {
    fn drop(&mut self) {
        if self.fd >= 0 {
            // SAFETY: we own this descriptor and close it once.
            unsafe { libc::close(self.fd) };
        }
    }
}

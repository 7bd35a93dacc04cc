//! Undo the crash handlers that a dependency installs as the library loads. Debian's libfabric
//! links its psm provider, whose libinfinipath installs, from a load-time constructor, handlers
//! for SIGSEGV, SIGBUS, SIGILL, SIGABRT, SIGINT and SIGTERM that call `exit()` inside the
//! handler: a SIGTERM then runs the process's exit handlers and the libraries' destructors
//! while its threads still run (heap corruption), and the crash that follows re-enters `exit()`
//! in the same handler and deadlocks, so the process never ends. This library's own constructor,
//! which runs after its dependencies', gives those signals back their default action where the
//! handler is libinfinipath's. (A loader that knows the handlers from before the load restores
//! them instead: the Python package does.)
use std::ffi::CStr;
use std::os::raw::{c_int, c_void};

const SIGNALS: [c_int; 6] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGABRT,
    libc::SIGINT,
    libc::SIGTERM,
];

/// Whether the code at `addr` belongs to libinfinipath.
fn in_infinipath(addr: usize) -> bool {
    // SAFETY: Dl_info is plain data; all zeroes is a valid value for dladdr to overwrite.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only looks the address up and fills `info`, a valid out-parameter.
    if unsafe { libc::dladdr(addr as *const c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return false;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the dynamic loader, live while the
    // object is loaded.
    let name = unsafe { CStr::from_ptr(info.dli_fname) }.to_bytes();
    name.windows(b"libinfinipath".len())
        .any(|w| w == b"libinfinipath")
}

/// Give each of `SIGNALS` whose handler is libinfinipath's its default action back.
pub fn reset_dependency_handlers() {
    for sig in SIGNALS {
        // SAFETY: sigaction is plain data; all zeroes is a valid out-parameter.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: a query (no new action), into a valid out-parameter.
        if unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) } != 0 {
            continue;
        }
        let h = old.sa_sigaction;
        if h == libc::SIG_DFL || h == libc::SIG_IGN || !in_infinipath(h) {
            continue;
        }
        // SAFETY: installs the default action for a valid signal number.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
}

extern "C" fn at_load() {
    reset_dependency_handlers();
}

/// Runs `at_load` when the library is loaded, after the constructors of its dependencies.
#[used]
#[link_section = ".init_array"]
static AT_LOAD: extern "C" fn() = at_load;

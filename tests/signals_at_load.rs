//! Loading the library leaves no dependency's crash handler in place: libinfinipath (linked by
//! Debian's libfabric for its psm provider) installs, at load, SIGTERM/SIGINT/SIGABRT/SIGILL
//! handlers that call `exit()` inside the handler; the library's constructor resets them.
use nccl_net_fabricoll::testing::skip;
use std::ffi::CString;
use std::os::raw::c_int;

fn handler(sig: c_int) -> libc::sighandler_t {
    // SAFETY: sigaction is plain data; all zeroes is a valid out-parameter.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a query (no new action), into a valid out-parameter.
    let rc = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
    assert_eq!(rc, 0);
    old.sa_sigaction
}

#[test]
fn no_dependency_handler_survives_the_load() {
    let test = "no_dependency_handler_survives_the_load";
    // The cdylib this run built: in deps/ beside this test (or copied up by `cargo build`).
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let name = "libnccl_net_fabricoll.so";
    let Some(lib) = [deps.join(name), deps.parent().unwrap().join(name)]
        .into_iter()
        .find(|p| p.exists())
    else {
        return skip(test, "the cdylib is not built");
    };
    let path = CString::new(lib.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; the handle stays open for the rest of the process.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null(), "cannot load {}", lib.display());
    let ipath = CString::new("libinfinipath.so.4").unwrap();
    // SAFETY: a valid NUL-terminated name; RTLD_NOLOAD only asks whether it is loaded.
    if unsafe { libc::dlopen(ipath.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) }.is_null() {
        return skip(test, "libfabric here does not load libinfinipath");
    }
    for (name, sig) in [
        ("SIGTERM", libc::SIGTERM),
        ("SIGINT", libc::SIGINT),
        ("SIGABRT", libc::SIGABRT),
        ("SIGILL", libc::SIGILL),
    ] {
        assert_eq!(
            handler(sig),
            libc::SIG_DFL,
            "{name} has a handler after the load"
        );
    }
}

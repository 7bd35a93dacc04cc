//! What the test suites share: how a test that cannot run here says so.
//!
//! A test that needs something this machine lacks (a provider, a libfabric feature, two CPUs)
//! calls `skip` and returns. Under `FABRICOLL_TEST_STRICT=1` (which `scripts/test.sh` sets, so
//! CI runs strict) `skip` panics instead: the test fails rather than passing without testing
//! anything. Otherwise it prints the reason and, when `FABRICOLL_SKIP_LOG` names a file,
//! appends one line to it, so that the suite's summary counts the test as skipped, not passed.
//! Tests that never apply on some machines on purpose are `#[ignore = "why"]` instead.
use std::io::Write;

pub mod pattern;
pub mod values;

/// Environment variable that makes `skip` fail the test.
pub const STRICT_VAR: &str = "FABRICOLL_TEST_STRICT";

/// Environment variable naming the file `skip` appends its lines to.
pub const SKIP_LOG_VAR: &str = "FABRICOLL_SKIP_LOG";

/// Whether tests run strict (`FABRICOLL_TEST_STRICT=1`).
pub fn strict() -> bool {
    std::env::var(STRICT_VAR).is_ok_and(|v| v == "1")
}

/// Test `test` cannot run here because of `why`: fails under strict mode, else records the
/// skip. The caller returns right after.
pub fn skip(test: &str, why: &str) {
    if strict() {
        panic!("{test}: cannot run here: {why} ({STRICT_VAR}=1: a test that cannot run fails)");
    }
    eprintln!("SKIPPED {test}: {why}");
    if let Some(path) = std::env::var_os(SKIP_LOG_VAR) {
        // One short write per line, so that test threads appending at once do not interleave.
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = f.write_all(format!("{test}: {why}\n").as_bytes());
        }
    }
}

/// Makes a crash of this process (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT) print a backtrace
/// of the crashing thread to stderr before the signal kills it as before. For tests run where
/// no debugger is at hand (the GPU machine): a diagnostic, not async-signal-safe (formatting a
/// backtrace may allocate, and may itself crash or deadlock in a corrupted process; the
/// signal's default action still ends it). Idempotent.
pub fn backtrace_on_fatal_signal() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for sig in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGILL,
            libc::SIGFPE,
            libc::SIGABRT,
        ] {
            // SAFETY: a zeroed sigaction is a valid start; the handler has the signature
            // SA_SIGINFO asks for; sigaction is called with valid pointers.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    on_fatal_signal;
                sa.sa_sigaction = handler as libc::sighandler_t;
                sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESETHAND | libc::SA_ONSTACK;
                libc::sigemptyset(&mut sa.sa_mask);
                libc::sigaction(sig, &sa, std::ptr::null_mut());
            }
        }
    });
}

extern "C" fn on_fatal_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    let thread = std::thread::current();
    eprintln!(
        "fatal signal {sig} (address {addr:#x}) in thread {:?}; backtrace:\n{}",
        thread.name().unwrap_or("?"),
        std::backtrace::Backtrace::force_capture()
    );
    // SA_RESETHAND restored the default action: raising again ends the process as the signal
    // would have.
    // SAFETY: raise has no memory-safety preconditions.
    unsafe { libc::raise(sig) };
}

/// The TCP connections of this process in state ESTABLISHED, as (local port, remote port):
/// the `/proc/self/net/tcp` and `tcp6` lines whose socket inode is one of our descriptors (both
/// ends of a loopback connection count, since both are ours). Tests use it to see which
/// fabric carried a peer's messages.
pub fn tcp_connections() -> Vec<(u16, u16)> {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    let port = |a: &str| u16::from_str_radix(a.rsplit(':').next().unwrap_or(""), 16).ok();
    let mut out = Vec::new();
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local remote state ... inode (the tenth field); 01: established.
            if f.len() > 9 && f[3] == "01" && inodes.contains(f[9]) {
                if let (Some(l), Some(r)) = (port(f[1]), port(f[2])) {
                    out.push((l, r));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn skip_fails_under_strict_mode_and_logs_otherwise() {
        // Runs the check in a child process, so that this process's environment stays as is.
        if std::env::var_os("FABRICOLL_TESTING_CHILD").is_some() {
            super::skip("child", "the reason");
            return;
        }
        let exe = std::env::current_exe().unwrap();
        let log = std::env::temp_dir().join(format!("fabricoll-skip-{}.log", std::process::id()));
        let _ = std::fs::remove_file(&log);
        let run = |strict: &str| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "testing::tests::skip_fails_under_strict_mode_and_logs_otherwise",
                    "--nocapture",
                ])
                .env("FABRICOLL_TESTING_CHILD", "1")
                .env(super::STRICT_VAR, strict)
                .env(super::SKIP_LOG_VAR, &log)
                .output()
                .unwrap()
        };
        let lax = run("0");
        assert!(lax.status.success());
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "child: the reason\n"
        );
        let strict = run("1");
        assert!(!strict.status.success(), "a strict skip must fail the test");
        let said = [strict.stdout, strict.stderr].concat();
        assert!(String::from_utf8_lossy(&said).contains("cannot run here: the reason"));
        let _ = std::fs::remove_file(&log);
    }

    #[test]
    fn a_crash_prints_a_backtrace_and_still_kills_the_process() {
        if std::env::var_os("FABRICOLL_TESTING_CRASH").is_some() {
            super::backtrace_on_fatal_signal();
            super::backtrace_on_fatal_signal();
            // SAFETY: none needed: raising SIGSEGV is the point (the handler reports it).
            unsafe { libc::raise(libc::SIGSEGV) };
            unreachable!("SIGSEGV's default action ends the process");
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "testing::tests::a_crash_prints_a_backtrace_and_still_kills_the_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("FABRICOLL_TESTING_CRASH", "1")
            .output()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("fatal signal 11"), "{err}");
        assert!(err.contains("backtrace:"), "{err}");
    }
}

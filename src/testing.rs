//! What the test suites share: how a test that cannot run here says so.
//!
//! A test that needs something this machine lacks (a provider, a libfabric feature, two CPUs)
//! calls `skip` and returns. Under `FABRICOLL_TEST_STRICT=1` (which `scripts/test.sh` sets, so
//! CI runs strict) `skip` panics instead: the test fails rather than passing without testing
//! anything. Otherwise it prints the reason and, when `FABRICOLL_SKIP_LOG` names a file,
//! appends one line to it, so that the suite's summary counts the test as skipped, not passed.
//! Tests that never apply on some machines on purpose are `#[ignore = "why"]` instead.
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

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

/// The TCP connections of this process in state ESTABLISHED, as (local, remote) socket
/// addresses: the `/proc/self/net/tcp` and `tcp6` lines whose socket inode is one of our
/// descriptors (both ends of a loopback connection count, since both are ours). Tests use it to
/// see which fabric carried a peer's messages; two connections are the same one seen from both
/// ends only where both addresses match crosswise, ports alone are not enough (ranks bound to
/// different addresses may use the same port numbers).
pub fn tcp_connections() -> Vec<(SocketAddr, SocketAddr)> {
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
    let mut out = Vec::new();
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // sl local remote state ... inode (the tenth field); 01: established.
            if f.len() > 9 && f[3] == "01" && inodes.contains(f[9]) {
                if let (Some(l), Some(r)) = (proc_net_addr(f[1]), proc_net_addr(f[2])) {
                    out.push((l, r));
                }
            }
        }
    }
    out
}

/// Closes the sockets this process inherited from its parent, for a test's rank process to call
/// first, before it opens any socket of its own. A parent that runs other tests on threads may
/// hold sockets without close-on-exec when it starts a rank (libfabric 2.1's tcp provider makes
/// some), and both ranks started then would list the same connection (`tcp_connections`) as
/// if they had talked to each other.
pub fn close_inherited_sockets() {
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| {
                let e = e.ok()?;
                let fd: i32 = e.file_name().to_str()?.parse().ok()?;
                let link = std::fs::read_link(e.path()).ok()?;
                (fd > 2 && link.to_string_lossy().starts_with("socket:[")).then_some(fd)
            })
            .collect()
        })
        .unwrap_or_default();
    for fd in fds {
        // SAFETY: called before this process opened sockets of its own, so every socket
        // descriptor here was inherited and nothing in this process uses it.
        unsafe { libc::close(fd) };
    }
}

/// A `/proc/net/tcp{,6}` address, `ADDR:PORT` in hex: the address as the kernel stores it (IPv4
/// one 32-bit word, IPv6 four, each in the host's byte order), the port big-endian as written.
fn proc_net_addr(s: &str) -> Option<SocketAddr> {
    let (addr, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(addr.get(8 * i..8 * i + 8)?, 16).ok()?;
        Some(w.to_ne_bytes())
    };
    let ip = match addr.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[4 * i..4 * i + 4].copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(b))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    #[test]
    fn proc_net_addresses_parse_as_the_kernel_writes_them() {
        use std::net::SocketAddr;
        // 127.0.0.1:8080 and [::1]:443 as /proc/net/tcp{,6} show them on little-endian hosts
        if cfg!(target_endian = "little") {
            let v4: SocketAddr = "127.0.0.1:8080".parse().unwrap();
            assert_eq!(super::proc_net_addr("0100007F:1F90"), Some(v4));
            let v6: SocketAddr = "[::1]:443".parse().unwrap();
            assert_eq!(
                super::proc_net_addr("00000000000000000000000001000000:01BB"),
                Some(v6)
            );
        }
        assert_eq!(super::proc_net_addr("0100007F"), None);
        assert_eq!(super::proc_net_addr("01007F:0050"), None);
    }

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

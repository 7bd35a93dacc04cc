//! Where a communicator's ranks run: each rank's machine and the CPUs it may use. The ranks
//! exchange these once, when the communicator is made, so that a waiter spins only while every
//! rank on its machine can have a CPU of its own, and yields the core otherwise.
//!
//! A process's own CPU set is not enough to decide: `mpirun` and `fabricoll-perf` bind each of
//! 2 ranks on 2 CPUs to one CPU, so each sees one CPU and two ranks, although nobody shares; and
//! 4 unbound ranks on 2 CPUs each see two CPUs, although two share each. A machine is a kernel:
//! ranks with the same boot id (containers on one host included) share its CPUs.
//!
//! A host is narrower than a machine: the kernel, host name and network namespace
//! (`host_key`), or `FABRICOLL_HOST`. Ranks of one host talk through shared memory, the others
//! through the network; namespaces of one kernel emulate hosts, yet share the CPUs.
use crate::config::Config;

/// CPUs a record describes (glibc's CPU_SETSIZE); CPUs above it count as absent.
pub const MAX_CPUS: usize = 1024;
const WORDS: usize = MAX_CPUS / 64;
/// Bytes of one rank's record in the exchange: the kernel, the host, then the CPU bitmap.
pub const RECORD: usize = 16 + MAX_CPUS / 8;

/// One rank's machine, host and CPU set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    /// Identifies the kernel the rank runs on (`kernel_key`): ranks of one kernel share CPUs.
    pub kernel: u64,
    /// Identifies the rank's host (`host_key`): ranks of one host share memory.
    pub host: u64,
    /// Bitmap of the CPUs the rank may run on (bit c of word c / 64).
    cpus: [u64; WORDS],
}

impl Place {
    /// A place on `kernel` and `host` with the CPUs `cpus` (those at or above `MAX_CPUS` are
    /// dropped).
    pub fn new(kernel: u64, host: u64, cpus: impl IntoIterator<Item = usize>) -> Place {
        let mut p = Place {
            kernel,
            host,
            cpus: [0; WORDS],
        };
        for c in cpus.into_iter().filter(|&c| c < MAX_CPUS) {
            p.cpus[c / 64] |= 1 << (c % 64);
        }
        p
    }

    /// This process's place under the process's configuration (`FABRICOLL_HOST`).
    pub fn here() -> Place {
        let named = crate::config::get().ok().and_then(|c| c.host.as_deref());
        Place::on_host(host_key_named(named))
    }

    /// This process's place: its machine, its host under `cfg`, and the CPUs it may run on now.
    pub fn here_for(cfg: &Config) -> Place {
        Place::on_host(host_key(cfg))
    }

    /// This process's machine and CPUs, on the host `host`.
    fn on_host(host: u64) -> Place {
        let mut cpus = allowed_cpus();
        if cpus.is_empty() {
            // The kernel did not say: as many CPUs as the standard library finds.
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            cpus = (0..n).collect();
        }
        Place::new(kernel_key(), host, cpus)
    }

    pub fn to_bytes(&self) -> [u8; RECORD] {
        let mut b = [0u8; RECORD];
        b[..8].copy_from_slice(&self.kernel.to_le_bytes());
        b[8..16].copy_from_slice(&self.host.to_le_bytes());
        for (i, w) in self.cpus.iter().enumerate() {
            b[16 + 8 * i..24 + 8 * i].copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    /// The place of a record made by `to_bytes` (None: not `RECORD` bytes).
    pub fn from_bytes(b: &[u8]) -> Option<Place> {
        if b.len() != RECORD {
            return None;
        }
        let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let mut cpus = [0u64; WORDS];
        for (i, w) in cpus.iter_mut().enumerate() {
            *w = word(16 + 8 * i);
        }
        Some(Place {
            kernel: word(0),
            host: word(8),
            cpus,
        })
    }

    fn cpu_list(&self) -> impl Iterator<Item = usize> + '_ {
        (0..MAX_CPUS).filter(|&c| self.cpus[c / 64] & (1 << (c % 64)) != 0)
    }
}

/// Can every rank on the machine (kernel) of rank `me` run on a CPU no other of them runs on, each
/// within its own CPU set? (A matching of ranks to CPUs covering all of them: ranks bound one
/// per CPU, or unbound ranks no more than the CPUs, pass; 4 ranks on 2 CPUs, or 2 ranks bound
/// to the same CPU, do not.)
pub fn own_cpus(places: &[Place], me: usize) -> bool {
    let Some(mine) = places.get(me) else {
        return false;
    };
    let local: Vec<&Place> = places.iter().filter(|p| p.kernel == mine.kernel).collect();
    let mut union = [0u64; WORDS];
    for p in &local {
        for (u, w) in union.iter_mut().zip(p.cpus.iter()) {
            *u |= w;
        }
    }
    let cpus: usize = union.iter().map(|w| w.count_ones() as usize).sum();
    if local.len() > cpus {
        return false;
    }
    if local.iter().all(|p| p.cpus == mine.cpus) {
        return true;
    }
    // Kuhn's augmenting paths: owner[c] is the local rank that CPU c went to.
    let lists: Vec<Vec<usize>> = local.iter().map(|p| p.cpu_list().collect()).collect();
    let mut owner = vec![usize::MAX; MAX_CPUS];
    for r in 0..lists.len() {
        let mut seen = vec![false; MAX_CPUS];
        if !augment(r, &lists, &mut owner, &mut seen) {
            return false;
        }
    }
    true
}

/// Find a CPU for rank `r`, moving ranks already placed to other CPUs of theirs if needed.
fn augment(r: usize, lists: &[Vec<usize>], owner: &mut [usize], seen: &mut [bool]) -> bool {
    for &c in &lists[r] {
        if seen[c] {
            continue;
        }
        seen[c] = true;
        if owner[c] == usize::MAX || augment(owner[c], lists, owner, seen) {
            owner[c] = r;
            return true;
        }
    }
    false
}

/// The CPUs this process may run on, in order (empty if the kernel does not say).
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data for which all zero bytes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is this thread.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below CPU_SETSIZE and `set` was filled by the kernel.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Bind the calling thread to `cpus` (each below `CPU_SETSIZE`). Async-signal-safe: it
/// allocates nothing and makes one system call, so a forked child may call it before exec.
pub fn bind_to(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data for which all zero bytes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: `c` is below CPU_SETSIZE; `set` is a valid cpu_set_t.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is this thread.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The mean round trip of a cache line between CPUs `a` and `b`: one thread bound to each, they
/// take turns writing a shared word, `rounds` times. It tells whether two CPUs share a cache,
/// which decides how fast shared-memory collectives run (figures in docs/performance.md). Both
/// threads spin, so the
/// answer means something only on otherwise idle CPUs. Fails, naming the CPU, when a thread
/// cannot be bound; gives up after `limit` in all (the other thread descheduled for that long).
pub fn core_rtt(
    a: usize,
    b: usize,
    rounds: u32,
    limit: std::time::Duration,
) -> crate::error::Result<std::time::Duration> {
    core_rtt_with(a, b, rounds, limit, bind_to)
}

/// `core_rtt` with `bind` in place of `bind_to` (tests make it fail or stall).
fn core_rtt_with(
    a: usize,
    b: usize,
    rounds: u32,
    limit: std::time::Duration,
    bind: fn(&[usize]) -> std::io::Result<()>,
) -> crate::error::Result<std::time::Duration> {
    use crate::error::Error;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Instant;
    /// The word the responder stores when it cannot run its part.
    const FAILED: u64 = u64::MAX;
    /// The line the two threads pass back and forth, alone in its cache line.
    #[repr(align(128))]
    struct Line(AtomicU64);
    if a == b {
        return Err(Error::arg(
            "cpu",
            format!("{a} twice: give two different CPUs"),
        ));
    }
    if rounds == 0 {
        return Err(Error::arg("rounds", "0: at least 1".to_string()));
    }
    let allowed = allowed_cpus();
    for c in [a, b] {
        if !allowed.contains(&c) {
            return Err(Error::arg(
                "cpu",
                format!("{c} is not one this process may run on ({allowed:?})"),
            ));
        }
    }
    let line = Arc::new(Line(AtomicU64::new(0)));
    let start = Instant::now();
    // Spin until the word is `want`; None when the other thread failed or `limit` has passed.
    fn wait(line: &Line, want: u64, start: Instant, limit: std::time::Duration) -> Option<()> {
        let mut spins = 0u32;
        loop {
            match line.0.load(Ordering::Acquire) {
                v if v == want => return Some(()),
                FAILED => return None,
                _ => {}
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(4096) && start.elapsed() > limit {
                return None;
            }
            std::hint::spin_loop();
        }
    }
    let peer = Arc::clone(&line);
    let spawned = std::thread::Builder::new()
        .name("core-rtt".into())
        .spawn(move || {
            if let Err(e) = bind(&[b]) {
                peer.0.store(FAILED, Ordering::Release);
                return Err(e);
            }
            // As many as the caller's: `rounds` and its untimed first.
            for i in 0..rounds as u64 + 1 {
                if wait(&peer, 2 * i + 1, start, limit).is_none() {
                    return Ok(());
                }
                peer.0.store(2 * i + 2, Ordering::Release);
            }
            Ok::<(), std::io::Error>(())
        });
    let responder =
        spawned.map_err(|e| Error::System(format!("core_rtt: starting a thread: {e}")))?;
    // The caller's own binding is restored afterwards: this thread may be the program's main.
    let bound = bind(&[a]);
    let mut t0 = Instant::now();
    let mut done = bound.is_ok();
    if done {
        // The first round warms both threads up (the responder may not run yet): untimed.
        for i in 0..rounds as u64 + 1 {
            if i == 1 {
                t0 = Instant::now();
            }
            // From the value the responder left: a FAILED there (its binding) ends the probe.
            let handed =
                line.0
                    .compare_exchange(2 * i, 2 * i + 1, Ordering::AcqRel, Ordering::Acquire);
            if handed.is_err() || wait(&line, 2 * i + 2, start, limit).is_none() {
                done = false;
                break;
            }
        }
    } else {
        // Let the responder stop waiting.
        line.0.store(FAILED, Ordering::Release);
    }
    let elapsed = t0.elapsed();
    let _ = bind(&allowed);
    let joined = responder.join();
    if let Err(e) = bound {
        return Err(Error::System(format!("binding to CPU {a}: {e}")));
    }
    match joined {
        Ok(Err(e)) => return Err(Error::System(format!("binding to CPU {b}: {e}"))),
        Err(_) => return Err(Error::Internal("core_rtt responder panicked".into())),
        Ok(Ok(())) => {}
    }
    if !done {
        return Err(Error::Timeout(format!(
            "core round trip between CPUs {a} and {b}: no answer within {limit:?}"
        )));
    }
    Ok(elapsed / rounds)
}

/// The machine: a hash of the kernel's boot id, or of the host name where it is unreadable.
/// Network namespaces of one kernel share it: their ranks compete for the same CPUs.
pub fn kernel_key() -> u64 {
    let id = [
        "/proc/sys/kernel/random/boot_id",
        "/proc/sys/kernel/hostname",
    ]
    .iter()
    .find_map(|f| std::fs::read_to_string(f).ok())
    .unwrap_or_default();
    fnv1a(&[b"kernel\0", id.trim().as_bytes()])
}

/// The host: a hash of `FABRICOLL_HOST` where set (`Config::host`), else of the boot id, the
/// host name and the network namespace (the inode of `/proc/thread-self/ns/net`), so that namespaces
/// of one kernel are hosts of their own, as they are in the multi-host tests. Equal keys share
/// memory (the intra-host fabric); the transport's address carries the key
/// (`transport::tiered`).
pub fn host_key(cfg: &Config) -> u64 {
    host_key_named(cfg.host.as_deref())
}

/// `host_key` for the `FABRICOLL_HOST` value `named`.
fn host_key_named(named: Option<&str>) -> u64 {
    match named {
        Some(h) => fnv1a(&[b"named\0", h.as_bytes()]),
        None => {
            let read = |f: &str| std::fs::read_to_string(f).unwrap_or_default();
            let boot = read("/proc/sys/kernel/random/boot_id");
            let name = read("/proc/sys/kernel/hostname");
            // The calling thread's namespace (a thread may have entered one of its own).
            let netns = ["/proc/thread-self/ns/net", "/proc/self/ns/net"]
                .iter()
                .find_map(|f| std::fs::read_link(f).ok())
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            fnv1a(&[
                b"detected\0",
                boot.trim().as_bytes(),
                b"\0",
                name.trim().as_bytes(),
                b"\0",
                netns.as_bytes(),
            ])
        }
    }
}

/// 64-bit FNV-1a over the concatenation of `parts`: a hash every build computes alike, since
/// ranks compare the keys of other processes.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.iter().flat_map(|p| p.iter()) {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    fn on(kernel: u64, cpus: &[usize]) -> Place {
        Place::new(kernel, kernel, cpus.iter().copied())
    }

    /// Two CPUs this process may use, or None (the test then has nothing to measure).
    fn two_cpus() -> Option<(usize, usize)> {
        let c = allowed_cpus();
        (c.len() >= 2).then(|| (c[0], c[1]))
    }

    #[test]
    fn core_rtt_measures_two_cpus_and_names_bad_arguments() {
        let limit = Duration::from_secs(10);
        let before = allowed_cpus();
        if let Some((a, b)) = two_cpus() {
            let t = core_rtt(a, b, 2000, limit).unwrap();
            // A mean round trip, bounded by the measurement's own limit: how fast it is
            // depends on the machine and its load, so this is no speed check.
            assert!(t > Duration::ZERO && t < limit, "{t:?}");
            assert_eq!(allowed_cpus(), before, "the caller's binding is restored");
            let e = core_rtt(a, a, 10, limit).unwrap_err().to_string();
            assert!(e.contains("'cpu'") && e.contains("twice"), "{e}");
            let e = core_rtt(a, b, 0, limit).unwrap_err().to_string();
            assert!(e.contains("'rounds'"), "{e}");
        } else {
            crate::testing::skip(
                "core_rtt_measures_two_cpus_and_names_bad_arguments",
                "the measurement needs 2 CPUs this process may use (the argument checks ran)",
            );
        }
        let absent = MAX_CPUS + 3;
        let e = core_rtt(before[0], absent, 10, limit)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'cpu'") && e.contains(&absent.to_string()),
            "{e}"
        );
    }

    #[test]
    fn core_rtt_reports_a_thread_that_cannot_bind_or_answer() {
        let Some((a, b)) = two_cpus() else {
            return crate::testing::skip(
                "core_rtt_reports_a_thread_that_cannot_bind_or_answer",
                "needs 2 CPUs this process may use",
            );
        };
        // Either thread's binding fails: the error names its CPU, at once (no waiting out
        // the limit), the caller's CPU first, then the responder's (which the caller learns
        // from the shared word).
        fn refuse(cpus: &[usize]) -> std::io::Result<()> {
            if cpus.len() == 1 && cpus[0] == REFUSED.load(Ordering::Relaxed) {
                return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
            }
            // The other thread's binding succeeds late, so that a refused responder has
            // failed before the caller's first hand-over (which must not overwrite that).
            if cpus.len() == 1 {
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(())
        }
        let limit = Duration::from_secs(10);
        for cpu in [a, b] {
            REFUSED.store(cpu, Ordering::Relaxed);
            let t0 = Instant::now();
            let e = core_rtt_with(a, b, 1000, limit, refuse)
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("binding to CPU {cpu}:")), "{e}");
            assert!(
                t0.elapsed() < limit / 2,
                "a failed binding ends the probe at once"
            );
        }
        // The responder binds the second CPU given; it stalls past the limit: a timeout.
        fn stall(cpus: &[usize]) -> std::io::Result<()> {
            if cpus.len() == 1 && cpus[0] == STALLED.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(400));
            }
            Ok(())
        }
        STALLED.store(b, Ordering::Relaxed);
        let e = core_rtt_with(a, b, 10, Duration::from_millis(100), stall).unwrap_err();
        assert!(matches!(e, crate::error::Error::Timeout(_)), "{e}");
        assert!(e.to_string().contains(&format!("CPUs {a} and {b}")), "{e}");
    }

    static STALLED: AtomicUsize = AtomicUsize::new(usize::MAX);
    static REFUSED: AtomicUsize = AtomicUsize::new(usize::MAX);

    #[test]
    fn records_round_trip_and_wrong_lengths_are_refused() {
        let p = Place::new(0xdead_beef, 7, [0, 5, 63, 64, 1023, 1024, 4000]);
        assert_eq!(Place::from_bytes(&p.to_bytes()), Some(p.clone()));
        assert_eq!(
            p.cpu_list().collect::<Vec<_>>(),
            vec![0, 5, 63, 64, 1023],
            "CPUs at or above MAX_CPUS are dropped"
        );
        assert_eq!(Place::from_bytes(&p.to_bytes()[1..]), None);
    }

    #[test]
    fn ranks_spin_only_when_each_can_have_a_cpu_of_its_own() {
        let bound2 = [on(1, &[0]), on(1, &[1])];
        assert!(
            own_cpus(&bound2, 0) && own_cpus(&bound2, 1),
            "mpirun binding"
        );
        let free2 = [on(1, &[0, 1]), on(1, &[0, 1])];
        assert!(own_cpus(&free2, 0));
        let free4 = vec![on(1, &[0, 1]); 4];
        assert!(!own_cpus(&free4, 2), "4 ranks on 2 CPUs");
        let same = [on(1, &[0]), on(1, &[0])];
        assert!(!own_cpus(&same, 0), "2 ranks bound to one CPU");
        // Mixed sets: {0}, {0,1}, {1,2} match (0, 1, 2); {0}, {0}, {0,1,2} cannot.
        assert!(own_cpus(&[on(1, &[0]), on(1, &[0, 1]), on(1, &[1, 2])], 1));
        assert!(!own_cpus(&[on(1, &[0]), on(1, &[0]), on(1, &[0, 1, 2])], 2));
        // Kuhn has to move rank 0 off CPU 0 for rank 1.
        assert!(own_cpus(&[on(1, &[0, 1]), on(1, &[0])], 0));
    }

    #[test]
    fn only_ranks_on_the_same_machine_count() {
        // 4 ranks on each of 2 machines with 4 CPUs each: each machine's 4 have a CPU each.
        let mut p = vec![on(1, &[0, 1, 2, 3]); 4];
        p.extend(vec![on(2, &[0, 1, 2, 3]); 4]);
        assert!((0..8).all(|r| own_cpus(&p, r)));
        // A fifth rank on machine 2 oversubscribes it, not machine 1.
        p.push(on(2, &[0, 1, 2, 3]));
        assert!(own_cpus(&p, 0));
        assert!(!own_cpus(&p, 4));
        assert!(!own_cpus(&p, 99), "a rank outside the list");
    }

    #[test]
    fn a_thread_bound_to_cpus_is_allowed_exactly_those() {
        let mine = allowed_cpus();
        std::thread::spawn(move || {
            bind_to(&mine[..1]).expect("bind to one of our CPUs");
            assert_eq!(allowed_cpus(), mine[..1]);
            bind_to(&mine).expect("bind back");
            assert_eq!(allowed_cpus(), mine);
            assert!(bind_to(&[]).is_err(), "an empty set is refused");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn here_names_this_process_cpus() {
        let p = Place::here();
        assert!(p.cpu_list().count() >= 1);
        assert_eq!(p.kernel, kernel_key(), "the key is stable within a process");
        assert!(own_cpus(&[p], 0), "one rank always has a CPU");
    }

    fn cfg_host(h: Option<&str>) -> Config {
        Config::from_lookup(|n| {
            (n == "FABRICOLL_HOST")
                .then(|| h.map(String::from))
                .flatten()
        })
        .unwrap()
    }

    #[test]
    fn the_host_is_fabricoll_host_where_set_else_the_kernel_name_and_namespace() {
        let detected = host_key(&cfg_host(None));
        assert_eq!(detected, host_key(&cfg_host(None)), "stable");
        let (a, b) = (
            host_key(&cfg_host(Some("a"))),
            host_key(&cfg_host(Some("b"))),
        );
        assert_ne!(a, b);
        assert_eq!(a, host_key(&cfg_host(Some("a"))));
        assert_ne!(a, detected);
        assert_ne!(
            detected,
            kernel_key(),
            "the host includes the name and the namespace"
        );
        // Another network namespace is another host, with the same kernel: a thread may enter
        // one of its own (unshare needs CAP_SYS_ADMIN; skipped without it).
        let other = std::thread::spawn(|| {
            // SAFETY: unshare with CLONE_NEWNET only changes this thread's namespace.
            (unsafe { libc::unshare(libc::CLONE_NEWNET) } == 0)
                .then(|| (host_key(&cfg_host(None)), kernel_key()))
        })
        .join()
        .unwrap();
        match other {
            Some((h, k)) => {
                assert_ne!(
                    h, detected,
                    "a network namespace of its own is another host"
                );
                assert_eq!(k, kernel_key(), "on the same kernel");
            }
            None => crate::testing::skip(
                "the_host_is_fabricoll_host_where_set_else_the_kernel_name_and_namespace",
                "no new network namespace here (needs CAP_SYS_ADMIN); the named hosts were checked",
            ),
        }
    }
}

//! Where a communicator's ranks run: each rank's machine and the CPUs it may use. The ranks
//! exchange these once, when the communicator is made, so that a waiter spins only while every
//! rank on its machine can have a CPU of its own, and yields the core otherwise.
//!
//! A process's own CPU set is not enough to decide: `mpirun` and `fabricoll-perf` bind each of
//! 2 ranks on 2 CPUs to one CPU, so each sees one CPU and two ranks, although nobody shares; and
//! 4 unbound ranks on 2 CPUs each see two CPUs, although two share each. A machine is a kernel:
//! ranks with the same boot id (containers on one host included) share its CPUs.
use crate::hash::FastHasher;
use std::hash::Hasher;

/// CPUs a record describes (glibc's CPU_SETSIZE); CPUs above it count as absent.
pub const MAX_CPUS: usize = 1024;
const WORDS: usize = MAX_CPUS / 64;
/// Bytes of one rank's record in the exchange: the machine, then the CPU bitmap.
pub const RECORD: usize = 8 + MAX_CPUS / 8;

/// One rank's machine and CPU set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    /// Identifies the kernel the rank runs on (a hash of its boot id, else of its host name).
    pub host: u64,
    /// Bitmap of the CPUs the rank may run on (bit c of word c / 64).
    cpus: [u64; WORDS],
}

impl Place {
    /// A place on `host` with the CPUs `cpus` (those at or above `MAX_CPUS` are dropped).
    pub fn new(host: u64, cpus: impl IntoIterator<Item = usize>) -> Place {
        let mut p = Place {
            host,
            cpus: [0; WORDS],
        };
        for c in cpus.into_iter().filter(|&c| c < MAX_CPUS) {
            p.cpus[c / 64] |= 1 << (c % 64);
        }
        p
    }

    /// This process's place: its machine and the CPUs it may run on now.
    pub fn here() -> Place {
        let mut cpus = allowed_cpus();
        if cpus.is_empty() {
            // The kernel did not say: as many CPUs as the standard library finds.
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            cpus = (0..n).collect();
        }
        Place::new(host_key(), cpus)
    }

    pub fn to_bytes(&self) -> [u8; RECORD] {
        let mut b = [0u8; RECORD];
        b[..8].copy_from_slice(&self.host.to_le_bytes());
        for (i, w) in self.cpus.iter().enumerate() {
            b[8 + 8 * i..16 + 8 * i].copy_from_slice(&w.to_le_bytes());
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
            *w = word(8 + 8 * i);
        }
        Some(Place {
            host: word(0),
            cpus,
        })
    }

    fn cpu_list(&self) -> impl Iterator<Item = usize> + '_ {
        (0..MAX_CPUS).filter(|&c| self.cpus[c / 64] & (1 << (c % 64)) != 0)
    }
}

/// Can every rank on the machine of rank `me` run on a CPU no other of them runs on, each
/// within its own CPU set? (A matching of ranks to CPUs covering all of them: ranks bound one
/// per CPU, or unbound ranks no more than the CPUs, pass; 4 ranks on 2 CPUs, or 2 ranks bound
/// to the same CPU, do not.)
pub fn own_cpus(places: &[Place], me: usize) -> bool {
    let Some(mine) = places.get(me) else {
        return false;
    };
    let local: Vec<&Place> = places.iter().filter(|p| p.host == mine.host).collect();
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

/// The machine: a hash of the kernel's boot id, or of the host name where it is unreadable.
fn host_key() -> u64 {
    let id = [
        "/proc/sys/kernel/random/boot_id",
        "/proc/sys/kernel/hostname",
    ]
    .iter()
    .find_map(|f| std::fs::read_to_string(f).ok())
    .unwrap_or_default();
    let mut h = FastHasher::default();
    h.write(id.trim().as_bytes());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(host: u64, cpus: &[usize]) -> Place {
        Place::new(host, cpus.iter().copied())
    }

    #[test]
    fn records_round_trip_and_wrong_lengths_are_refused() {
        let p = on(0xdead_beef, &[0, 5, 63, 64, 1023, 1024, 4000]);
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
        assert_eq!(p.host, host_key(), "the key is stable within a process");
        assert!(own_cpus(&[p], 0), "one rank always has a CPU");
    }
}

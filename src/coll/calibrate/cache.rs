//! The calibrations this process has measured as rank 0, kept for the life of the process and
//! keyed by what shapes them (`Key`): a later communicator over the same topology (torch's
//! `new_group`, a DeviceMesh, a repeated `init_rank`) takes rank 0's kept parameters instead of
//! measuring again. Only rank 0 looks here, and it tells the other ranks whether it found the
//! key, so that all ranks measure or all skip (`Comm::calibrate`): the other ranks' processes
//! may have seen other communicators, and their caches are never asked.
use crate::algo::Hosts;
use parking_lot::Mutex;

/// What a calibration depends on, as rank 0 sees it after the placement exchange: the ranks
/// and their hosts, the fabric (provider and domain of each level), the model it starts from
/// (configured parameters, eager limits, CPU sharing) and how rank 0 waits (spin, poll window).
/// Everything that differs between two communicators of one process whose measurements could
/// differ for a reason other than noise.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Key {
    pub nranks: usize,
    pub hosts: Hosts,
    /// "provider / domain" of the transport, then of its intra-host level where it has one.
    pub fabric: Vec<String>,
    /// The starting model's alpha, beta and gamma (bit patterns) and which are configured.
    pub base: [u64; 3],
    pub fixed: [bool; 3],
    /// Eager limits of the network and of the intra-host level.
    pub eager: [usize; 2],
    pub shared_cpus: bool,
    pub spin: bool,
    pub poll_ns: u128,
}

/// Kept calibrations: few (one per topology a process's communicators use), so a list.
static KEPT: Mutex<Vec<(Key, Vec<f64>)>> = Mutex::new(Vec::new());

/// How many kept calibrations at most; a new one beyond that replaces the oldest.
const KEPT_MAX: usize = 64;

/// The parameters kept for `key`, if rank 0 of an earlier communicator measured them.
pub(super) fn get(key: &Key) -> Option<Vec<f64>> {
    KEPT.lock()
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
}

/// Keep `params` for `key` (replacing what was kept for it).
pub(super) fn put(key: Key, params: Vec<f64>) {
    let mut kept = KEPT.lock();
    kept.retain(|(k, _)| *k != key);
    if kept.len() >= KEPT_MAX {
        kept.remove(0);
    }
    kept.push((key, params));
}

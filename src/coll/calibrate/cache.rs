//! The calibrations this process has measured as rank 0, kept for the life of the process and
//! keyed by what shapes them (`Key`): a later communicator over the same topology (torch's
//! `new_group`, a DeviceMesh, a repeated `init_rank`) takes rank 0's kept parameters instead of
//! measuring again. Only rank 0 looks here, and it tells the other ranks whether it found the
//! key, so that all ranks measure or all skip (`Comm::calibrate`): the other ranks' processes
//! may have seen other communicators, and their caches are never asked.
//!
//! A one-host communicator's calibration is also stored in a file (`store`, `load`), in the
//! directory of `FABRICOLL_CALIBRATION_CACHE`, named by a hash of the key and this machine's
//! kernel (its boot: a reboot, which may come with other hardware or settings, measures
//! again). The file holds the key's text, checked on reading, and the parameters' exact bits,
//! so that every later process of a job on this machine takes the same model rather than each
//! measuring its own, which load would scatter. Any failure to read or write is logged at debug
//! and costs only a measurement.
use crate::algo::Hosts;
use parking_lot::Mutex;
use std::path::{Path, PathBuf};

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

/// The file's first line: the key as text, with this machine's kernel.
fn key_text(key: &Key) -> String {
    format!(
        "{key:?} on kernel {:016x}",
        super::placement::Place::here().kernel
    )
}

/// FNV-1a, 64 bits: a file name from the key's text, the same in every build.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn path_of(dir: &Path, text: &str) -> PathBuf {
    dir.join(format!("calibration-{:016x}", fnv(text)))
}

/// The parameters stored in `dir` for `key` on this machine, if a valid file has them.
pub(super) fn load(dir: &Path, key: &Key) -> Option<Vec<f64>> {
    let text = key_text(key);
    let path = path_of(dir, &text);
    let body = std::fs::read_to_string(&path).ok()?;
    let mut lines = body.lines();
    if lines.next() != Some(text.as_str()) {
        log::debug!("calibration cache {}: another key, ignored", path.display());
        return None;
    }
    let params: Option<Vec<f64>> = lines
        .next()?
        .split_whitespace()
        .map(|w| u64::from_str_radix(w, 16).ok().map(f64::from_bits))
        .collect();
    let params = params.filter(|p| p.iter().all(|x| x.is_finite()));
    if params.is_none() {
        log::debug!("calibration cache {}: unreadable, ignored", path.display());
    }
    params
}

/// Store `params` for `key` in `dir` (made if missing), replacing what was there: written to
/// a file of this process and renamed, so that a reader never sees half of it.
pub(super) fn store(dir: &Path, key: &Key, params: &[f64]) {
    let text = key_text(key);
    let path = path_of(dir, &text);
    let bits: Vec<String> = params
        .iter()
        .map(|x| format!("{:016x}", x.to_bits()))
        .collect();
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let wrote = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, format!("{text}\n{}\n", bits.join(" "))))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = wrote {
        let _ = std::fs::remove_file(&tmp);
        log::debug!("calibration cache {}: not written ({e})", path.display());
    }
}

/// Forget the calibrations this process kept from a starting model with `alpha_us`, as a new
/// process would start (tests give each case its own configured alpha, so this forgets only
/// theirs).
#[cfg(test)]
pub(super) fn forget_alpha(alpha_us: f64) {
    KEPT.lock().retain(|(k, _)| k.base[0] != alpha_us.to_bits());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(nranks: usize) -> Key {
        Key {
            nranks,
            hosts: Hosts::ONE,
            fabric: vec!["shm / shm".into()],
            base: [1, 2, 3],
            fixed: [false; 3],
            eager: [0, 0],
            shared_cpus: false,
            spin: true,
            poll_ns: 1000,
        }
    }

    fn temp_dir(what: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fabricoll-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_stored_calibration_is_loaded_for_its_key_only_and_exactly() {
        let dir = temp_dir("calibration-cache");
        let params = vec![3.25, 1.0 / 3.0, 0.0, 1e-9, 0.0, 0.0, 0.0, 0.0];
        assert_eq!(load(&dir, &key(2)), None, "nothing stored yet");
        store(&dir, &key(2), &params);
        assert_eq!(load(&dir, &key(2)), Some(params.clone()), "bit for bit");
        assert_eq!(load(&dir, &key(3)), None, "another topology");
        // One file, no temporary left behind.
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        // A file whose first line is another key's (a hash collision) or whose numbers are
        // not numbers is ignored.
        let path = path_of(&dir, &key_text(&key(2)));
        let good = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, good.replacen("nranks: 2", "nranks: 9", 1)).unwrap();
        assert_eq!(load(&dir, &key(2)), None);
        std::fs::write(&path, format!("{}\nnot hex\n", key_text(&key(2)))).unwrap();
        assert_eq!(load(&dir, &key(2)), None);
        // A directory that cannot be made: nothing stored, nothing panics.
        let file = dir.join("a-file");
        std::fs::write(&file, "x").unwrap();
        store(&file.join("sub"), &key(2), &params);
        assert_eq!(load(&file.join("sub"), &key(2)), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

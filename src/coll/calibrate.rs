//! The collectives a communicator runs for itself when it is made, on memory the library owns
//! (`run_owned`): the exchange of every rank's placement, and the calibration of the cost model.
//!
//! Calibration on one host times ring AllReduces (`calibrate`). On several hosts it measures
//! each level apart (`calibrate_levels`): rank 0 plays ping-pong with a rank of its own host
//! (if any) and with one of another host while the others wait, and reduces locally for
//! gamma. Repeated creations on an unchanged machine make the same choices: every figure is a
//! median over several repetitions (outliers do not move it), the parameters are quantized
//! (`tune::quantize`), the model keeps a fixed order unless a candidate is predicted
//! `tune::MARGIN` faster, and rank 0's parameters are broadcast so that all ranks agree.
//!
//! A calibration is measured once per machine and topology: rank 0 keeps what it measured
//! (`cache`: for the life of the process, and for a one-host communicator also in a file per
//! machine boot and topology, `FABRICOLL_CALIBRATION_CACHE`), and a later communicator over the
//! same topology, in this process or a later one, takes it, at the cost of one tiny broadcast
//! instead of the measurement (torch's `new_group` and DeviceMesh make many such communicators;
//! a job makes one per process). Rank 0 decides, so all ranks measure or none do. Repeated
//! timings drop their outliers (`tune::steady`); a measurement most of whose repetitions were
//! slowed by other work is disturbed: the communicator uses it, the log says so, and it is not
//! kept, so that one busy moment cannot set the cost model of every later communicator. Not lazily at the first
//! collective: the choice is made under the engine's lock, where a calibration could not run
//! its own collectives, and most of a process's first creation is the provider's discovery,
//! which a lazy calibration would not save. A forced algorithm measures nothing.
use super::{placement, Call, Comm, Kind};
use crate::algo::{Algorithm, Collective, Hosts};
use crate::config::Forced;
use crate::error::{Error, Result};
use crate::reduce::{DataType, RedOp};
use crate::transport::Scratch;
use crate::tune::{self, Model};

mod cache;
mod measure;

impl Comm {
    /// Exchange every rank's machine and CPU set (`placement`), and spin while waiting only if
    /// each rank on this machine can have a CPU of its own. Until then `spin` is a guess from
    /// this process's CPU set alone, which a binding launcher defeats: 2 ranks bound one per CPU
    /// each see one CPU, and would yield where spinning is faster (`docs/performance.md`). The
    /// cost model learns whether any machine's ranks share CPUs (`tune::Model::shared_cpus`).
    pub(super) fn learn_placement(&mut self) -> Result<()> {
        if self.nranks == 1 {
            return Ok(());
        }
        let mut own = Scratch::new(placement::RECORD);
        own.bytes_mut()
            .copy_from_slice(&placement::Place::here().to_bytes());
        let all = Scratch::new(placement::RECORD * self.nranks);
        let (_, all) = self.run_owned(
            Kind::Coll(Collective::AllGather),
            (own, all),
            placement::RECORD,
            DataType::Uint8,
            Algorithm::Ring,
        )?;
        let places = all
            .bytes()
            .chunks(placement::RECORD)
            .map(placement::Place::from_bytes)
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| Error::Internal("placement records of the wrong size".into()))?;
        self.spin = placement::own_cpus(&places, self.rank);
        // Every rank computes this from the same records, so all choose alike.
        let shared = (0..self.nranks).any(|r| !placement::own_cpus(&places, r));
        let m = self.model.clone().with_shared_cpus(shared);
        self.set_model(m);
        let mine = places[self.rank].kernel;
        log::debug!(
            "rank {}: {} of {} ranks on this machine; waiters {}",
            self.rank,
            places.iter().filter(|p| p.kernel == mine).count(),
            self.nranks,
            if self.spin { "spin" } else { "yield" }
        );
        Ok(())
    }

    /// Measure alpha, beta and gamma unless the configuration fixes them, the communicator's
    /// algorithm is forced (`needs_measured_choice`), or rank 0 of this process kept the
    /// parameters of an earlier communicator over the same topology (`cache`). Rank 0 decides
    /// and broadcasts its decision, with the kept parameters when it has them, so that every
    /// rank measures or none does, and all end with rank 0's parameters.
    pub(super) fn calibrate(&mut self) -> Result<Calibrated> {
        if self.nranks == 1 || !self.model.needs_calibration() || !self.needs_measured_choice() {
            return Ok(Calibrated::Skipped);
        }
        let spans = self.spans_hosts();
        let key = self.calibration_key();
        // Only a one-host communicator's calibration outlives the process: the machine then
        // is the whole topology.
        let dir = (!spans)
            .then_some(self.calibration_dir.as_deref())
            .flatten();
        let (kept, from_file) = if self.rank == 0 {
            match cache::get(&key) {
                Some(p) => (Some(p), false),
                None => {
                    let stored = dir.and_then(|d| cache::load(d, &key));
                    let found = stored.is_some();
                    (stored, found)
                }
            }
        } else {
            (None, false)
        };
        // The flag rank 0 shares with kept parameters: whether they came from the file.
        let (params, how) = match share(self, kept.map(|p| (p, from_file)))? {
            Some((p, stored)) => {
                if from_file {
                    cache::put(key, p.clone());
                }
                (
                    p,
                    if stored {
                        Calibrated::Stored
                    } else {
                        Calibrated::Kept
                    },
                )
            }
            None => {
                let mine = if spans {
                    measure::calibrate_levels(self)?
                } else {
                    measure::calibrate(self)?
                };
                let why = judged(self, mine.as_ref().and_then(|m| m.disturbed.clone()));
                let (p, disturbed) = share(self, mine.map(|m| (m.params, why.is_some())))?
                    .ok_or_else(|| {
                        Error::Internal("calibration: rank 0 sent no parameters".into())
                    })?;
                if let Some(why) = why {
                    log::warn!(
                        "calibration on {} ranks looks disturbed ({why}): the machine was busy; \
                         this communicator uses it, later ones measure again",
                        self.nranks
                    );
                } else if self.rank == 0 && !disturbed {
                    if let Some(d) = dir {
                        cache::store(d, &key, &p);
                    }
                    cache::put(key, p.clone());
                }
                let how = if disturbed {
                    Calibrated::Disturbed
                } else {
                    Calibrated::Measured
                };
                (p, how)
            }
        };
        let m = self.measured_model(spans, &params)?;
        log_model(&m, self.nranks, self.hosts, spans, how);
        self.set_model(m);
        Ok(how)
    }

    /// Whether any choice of this communicator can depend on measured parameters: not where
    /// its algorithm is forced (`FABRICOLL_ALGO`, the config's algorithm), since the eager
    /// slicing of a forced algorithm is linear in alpha (`tune::eager_alphas`), except for
    /// hier and swizzle on several hosts, whose levels the model picks (`Model::levels_for`).
    /// A per-call algorithm is not known here: those communicators still calibrate.
    fn needs_measured_choice(&self) -> bool {
        let setting = *self.algo.lock();
        // The plain form's fallback to `auto` (a collective it does not implement) takes the
        // configured model, as before: only a collective left to the model by name measures.
        let auto = Collective::ALL
            .into_iter()
            .any(|c| setting.of(c) == Forced::Auto);
        auto || setting
            .forced()
            .any(|a| matches!(a, Algorithm::Hier | Algorithm::Swizzle) && self.spans_hosts())
    }

    /// Do the ranks span several hosts (two-level calibration)?
    fn spans_hosts(&self) -> bool {
        self.hosts.count() > 1 && self.hosts.fits(self.nranks)
    }

    /// What this communicator's calibration depends on (`cache::Key`).
    fn calibration_key(&self) -> cache::Key {
        let caps = self.transport.caps();
        let mut fabric = vec![format!("{} / {}", caps.provider, caps.domain)];
        if let Some(i) = &caps.intra {
            fabric.push(format!("{} / {}", i.provider, i.domain));
        }
        let m = &self.model;
        cache::Key {
            nranks: self.nranks,
            hosts: self.hosts,
            fabric,
            base: [
                m.alpha_us.to_bits(),
                m.beta_us_per_byte.to_bits(),
                m.gamma_us_per_byte.to_bits(),
            ],
            fixed: m.fixed,
            eager: [m.eager_bytes, m.intra.eager_bytes],
            shared_cpus: m.shared_cpus,
            spin: self.spin,
            poll_ns: self.poll.as_nanos(),
        }
    }

    /// The model with rank 0's parameters (`calibrate`'s or `calibrate_levels`' `PARAMS`).
    fn measured_model(&self, spans: bool, v: &[f64]) -> Result<Model> {
        if v.len() != PARAMS {
            return Err(Error::Internal(format!(
                "calibration: {} parameters, expected {PARAMS}",
                v.len()
            )));
        }
        if !spans {
            return Ok(self.model.with_measured(v[0], v[1], v[2]));
        }
        let link = |k: usize, eager_bytes: usize| tune::Link {
            alpha_us: v[k],
            beta_us_per_byte: v[k + 1],
            o_us: v[k + 2],
            eager_bytes,
        };
        let inter = link(0, self.model.eager_bytes);
        let intra = (v[7] > 0.0).then(|| link(3, self.model.intra.eager_bytes));
        Ok(self.model.with_measured_levels(intra, inter, v[6]))
    }

    /// Run a blocking collective of the communicator's own (placement, split, calibration) on
    /// memory the library owns, with op Sum and root 0. The buffers come back when it
    /// succeeds; when it fails they are leaked, since operations may still be pending on them.
    pub(super) fn run_owned(
        &self,
        kind: Kind,
        (send, recv): (Scratch, Scratch),
        count: usize,
        dtype: DataType,
        algo: Algorithm,
    ) -> Result<(Scratch, Scratch)> {
        // SAFETY: both buffers stay owned here until the collective has ended, and are leaked
        // rather than freed if it fails, so neither region outlives its memory.
        let (s, r) = unsafe { (send.region(), recv.region()) };
        let call = Call {
            kind,
            send: s,
            recv: r,
            count,
            dtype,
            op: RedOp::Sum,
            root: 0,
            algo: Some(algo),
        };
        // The communicator's own exchanges and measurements send the data as it is.
        match self.run_with(&call, Some(crate::config::Compression::OFF)) {
            Ok(()) => Ok((send, recv)),
            Err(e) => {
                send.leak();
                recv.leak();
                Err(e)
            }
        }
    }
}

/// Whether rank 0's measurement counts as disturbed: `why` (`disturbed`), except under the
/// library's own tests, where the machine's load would make their outcome random: there only
/// the configured alphas a test named (`force_disturbed`) are, and always.
fn judged(comm: &Comm, why: Option<String>) -> Option<String> {
    #[cfg(test)]
    {
        let _ = why;
        let forced = FORCED.lock().contains(&comm.model.alpha_us.to_bits());
        forced.then(|| "forced by a test".to_string())
    }
    #[cfg(not(test))]
    {
        let _ = comm;
        why
    }
}

/// The configured alphas whose calibrations the library's tests judge disturbed (`judged`).
#[cfg(test)]
static FORCED: parking_lot::Mutex<Vec<u64>> = parking_lot::Mutex::new(Vec::new());

/// Judge every calibration from a starting model with `alpha_us` disturbed (`judged`).
#[cfg(test)]
pub(super) fn force_disturbed(alpha_us: f64) {
    FORCED.lock().push(alpha_us.to_bits());
}

/// Forget what this process kept of calibrations from a starting model with `alpha_us`, as a
/// new process would (`cache::forget_alpha`).
#[cfg(test)]
pub(super) fn forget_kept_with_alpha(alpha_us: f64) {
    cache::forget_alpha(alpha_us);
}

/// Values rank 0 broadcasts: on one host alpha, beta, gamma, then zeros; on several
/// (`calibrate_levels`) inter alpha, beta, o; intra alpha, beta, o; gamma; whether intra was
/// measured.
const PARAMS: usize = 8;

/// What `Comm::calibrate` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Calibrated {
    /// Nothing to measure: one rank, a configured model, or a forced algorithm.
    Skipped,
    /// Every rank took part in a measurement; rank 0 kept its result (`cache`).
    Measured,
    /// Every rank took part in a measurement that looked disturbed (`tune::steady`): used,
    /// logged, not kept.
    Disturbed,
    /// Rank 0 had kept the parameters of an earlier communicator over the same topology.
    Kept,
    /// Rank 0 read them from this machine's calibration cache, which an earlier process over
    /// the same topology wrote (`FABRICOLL_CALIBRATION_CACHE`).
    Stored,
}

/// Broadcast rank 0's `params` (`PARAMS` values and a flag: measured ones looked disturbed, or
/// kept ones came from the file; or None) to every rank: the same, or None where rank 0 had
/// none. The other ranks' `params` are ignored.
fn share(comm: &Comm, params: Option<(Vec<f64>, bool)>) -> Result<Option<(Vec<f64>, bool)>> {
    let len = (PARAMS + 1) * 8;
    let mut send = Scratch::new(len);
    if comm.rank == 0 {
        if let Some((p, flag)) = params.filter(|p| p.0.len() == PARAMS) {
            // The head: 0 none, 1 the flag clear, 2 the flag set.
            let v = std::iter::once(if flag { 2.0 } else { 1.0 }).chain(p);
            for (k, x) in v.enumerate() {
                send.bytes_mut()[k * 8..k * 8 + 8].copy_from_slice(&x.to_le_bytes());
            }
        }
    }
    let (_, got) = comm.run_owned(
        Kind::Coll(Collective::Broadcast),
        (send, Scratch::new(len)),
        len,
        DataType::Uint8,
        Algorithm::Ring,
    )?;
    let v: Vec<f64> = got
        .bytes()
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    Ok((v[0] > 0.0).then(|| (v[1..].to_vec(), v[0] > 1.5)))
}

/// Log the calibrated model `m` of `n` ranks on `hosts` (`spans`: the two-level one).
fn log_model(m: &Model, n: usize, hosts: Hosts, spans: bool, how: Calibrated) {
    let how = match how {
        Calibrated::Kept => " (kept from an earlier communicator over the same topology)",
        Calibrated::Stored => " (stored by an earlier process on this machine and topology)",
        _ => "",
    };
    let gbps = |b: f64| 1.0 / (b * 1e3);
    if !spans {
        log::info!(
            "calibration on {n} ranks: alpha {:.2} us, beta {:.3} GB/s, gamma {:.2} GB/s{how}",
            m.alpha_us,
            gbps(m.beta_us_per_byte),
            gbps(m.gamma_us_per_byte)
        );
        return;
    }
    log::info!(
        "calibration on {n} ranks, hosts of {:?} ranks: {}{how}",
        hosts.sizes(n),
        m.levels_text()
    );
}

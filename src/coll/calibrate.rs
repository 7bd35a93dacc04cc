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
use crate::transport::{Region, Scratch};
use crate::tune::{self, LinkSamples, Model};
use std::time::Instant;

mod cache;

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
                    calibrate_levels(self)?
                } else {
                    calibrate(self)?
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

/// What rank 0 measured: the `PARAMS`, and what looked disturbed, if anything (`tune::steady`).
struct Measured {
    params: Vec<f64>,
    disturbed: Option<String>,
}

/// What looked disturbed among named measurements, if any: "alpha 3 of 7 repetitions near the
/// fastest" and the like.
fn disturbed(named: &[(&str, Option<tune::Steady>)]) -> Option<String> {
    let said: Vec<String> = named
        .iter()
        .filter_map(|(name, s)| {
            let s = (*s)?;
            s.disturbed.then(|| {
                format!(
                    "{name}: {} of {} repetitions near the fastest",
                    s.kept, s.of
                )
            })
        })
        .collect();
    (!said.is_empty()).then(|| said.join(", "))
}

/// Measure alpha (tiny ring AllReduce), beta (1 and 4 MiB ring AllReduces) and gamma (a local
/// reduction): the `PARAMS` alpha, beta, gamma then zeros, on rank 0 (None elsewhere).
fn calibrate(comm: &Comm) -> Result<Option<Measured>> {
    use crate::reduce;
    let n = comm.nranks;
    let mut small = (Scratch::new(4), Scratch::new(4));
    // The large AllReduces run on buffers like a user's (`Scratch::plain`, small pages): from
    // 2 MiB up `Scratch::new` asks for huge pages, which a peer's copy reads faster than a
    // user's buffer, and beta would come out too high.
    let big_len = 1 << 20;
    let big = (Scratch::plain(big_len), Scratch::plain(big_len));
    let ar = |bufs: (Scratch, Scratch)| {
        let count = bufs.0.len() / 4;
        comm.run_owned(
            Kind::Coll(Collective::AllReduce),
            bufs,
            count,
            DataType::Float32,
            Algorithm::Ring,
        )
    };
    for _ in 0..3 {
        small = ar(small)?;
    }
    // Each timing is `reps` batches (microseconds per call) judged by `tune::steady`: batches
    // a scheduling hiccup slowed are dropped, and too few steady ones mark it disturbed. The
    // tiny AllReduce, which alpha comes from and which load distorts the most, gets 5.
    let batches = |mut bufs: (Scratch, Scratch),
                   iters: usize,
                   reps: usize|
     -> Result<((Scratch, Scratch), tune::Steady)> {
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            let t = Instant::now();
            for _ in 0..iters {
                bufs = ar(bufs)?;
            }
            times.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
        }
        let s =
            tune::steady(&times).ok_or_else(|| Error::Internal("calibration: no timing".into()))?;
        Ok((bufs, s))
    };
    let (_, small) = batches(small, 10, 5)?;
    // Two large sizes, so that beta comes from their difference (`tune::fit`).
    let (big, large) = batches(big, 1, 3)?;
    let larger_len = 4 * big_len;
    let larger = (Scratch::plain(larger_len), Scratch::plain(larger_len));
    let (larger, larger_t) = batches(larger, 1, 3)?;
    drop(larger);
    let (small_us, large_us, larger_us) = (small.value, large.value, larger_t.value);
    let mut red_us = f64::MAX;
    let mut acc = Scratch::new(big_len);
    for _ in 0..3 {
        let t = Instant::now();
        reduce::reduce_inplace(
            DataType::Float32,
            RedOp::Sum,
            acc.bytes_mut(),
            big.0.bytes(),
        )
        .map_err(|e| Error::Internal(format!("calibration reduction: {e}")))?;
        red_us = red_us.min(t.elapsed().as_secs_f64() * 1e6);
    }
    let (a, b, g) = tune::fit(
        n,
        small_us,
        &[(big_len, large_us), (larger_len, larger_us)],
        (big_len, red_us),
        comm.model.eager_bytes,
    );
    // Quantized, so that calibrations a few per cent apart give the same model.
    let mut v = vec![0.0; PARAMS];
    v[..3].copy_from_slice(&[tune::quantize(a), tune::quantize(b), tune::quantize(g)]);
    let why = disturbed(&[
        ("alpha", Some(small)),
        ("beta at 1 MiB", Some(large)),
        ("beta at 4 MiB", Some(larger_t)),
    ]);
    Ok((comm.rank == 0).then_some(Measured {
        params: v,
        disturbed: why,
    }))
}

/// Repetitions of each timed exchange (the median is kept), after `WARMUP` untimed ones.
const REPS: usize = 7;
const WARMUP: usize = 2;
/// Messages of the burst that measures the sending CPU's cost per message.
const BURST: usize = 8;
/// One-way sizes (bytes) whose difference gives beta: the network's, and shared memory's
/// (larger, since it is faster).
const INTER_SIZES: [usize; 2] = [256 << 10, 1 << 20];
const INTRA_SIZES: [usize; 2] = [1 << 20, 4 << 20];

/// Several hosts: alpha, beta and the per-message cost of each level from rank 0's
/// point-to-point exchanges with a rank of its own host and one of another, gamma from a local
/// reduction: the `PARAMS`, on rank 0 (None elsewhere).
fn calibrate_levels(comm: &Comm) -> Result<Option<Measured>> {
    let hosts = comm.hosts;
    let n = comm.nranks;
    let home = hosts.host_of(0);
    let inter_peer = (1..n)
        .find(|&r| hosts.host_of(r) != home)
        .ok_or_else(|| Error::Internal("calibration: no rank on another host".into()))?;
    let intra = match (1..n).find(|&r| hosts.host_of(r) == home) {
        Some(p) => probe(comm, p, &INTRA_SIZES)?,
        None => None,
    };
    let inter = probe(comm, inter_peer, &INTER_SIZES)?;
    if comm.rank != 0 {
        return Ok(None);
    }
    let inter = inter.ok_or_else(|| Error::Internal("calibration: no samples".into()))?;
    let why = disturbed(&[
        ("the network's ping-pong", tune::steady(&inter.pingpong)),
        (
            "the host's ping-pong",
            intra.as_ref().and_then(|s| tune::steady(&s.pingpong)),
        ),
    ]);
    let e = tune::fit_link(&inter, comm.model.eager_bytes);
    let i = intra.map(|s| tune::fit_link(&s, comm.model.intra.eager_bytes));
    let g = tune::quantize(gamma_us_per_byte()?);
    let has_intra = if i.is_some() { 1.0 } else { 0.0 };
    let i = i.unwrap_or(comm.model.intra);
    let params = vec![
        e.alpha_us,
        e.beta_us_per_byte,
        e.o_us,
        i.alpha_us,
        i.beta_us_per_byte,
        i.o_us,
        g,
        has_intra,
    ];
    Ok(Some(Measured {
        params,
        disturbed: why,
    }))
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

/// Gamma (us per byte): the best of 3 local reductions of 1 MiB of floats.
fn gamma_us_per_byte() -> Result<f64> {
    let len = 1 << 20;
    let (mut acc, src) = (Scratch::new(len), Scratch::plain(len));
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        crate::reduce::reduce_inplace(DataType::Float32, RedOp::Sum, acc.bytes_mut(), src.bytes())
            .map_err(|e| Error::Internal(format!("calibration reduction: {e}")))?;
        best = best.min(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(best / len as f64)
}

/// Rank 0's timings of exchanges with `peer` (`tune::LinkSamples`): ping-pongs of 4 bytes,
/// one-way messages of `sizes` answered by 4 bytes, and bursts of `BURST` messages answered by
/// 4 bytes. `peer` answers; every other rank returns at once. Some only on rank 0.
fn probe(comm: &Comm, peer: usize, sizes: &[usize]) -> Result<Option<LinkSamples>> {
    let me = comm.rank;
    if me != 0 && me != peer {
        return Ok(None);
    }
    let other = if me == 0 { peer } else { 0 };
    let answer = if me == 0 {
        Kind::Recv { peer: other }
    } else {
        Kind::Send { peer: other }
    };
    let mut tiny = Scratch::new(4);
    // One exchange of `buf`'s length: rank 0 sends `count` messages then waits for the answer;
    // the peer receives them and answers. Rank 0's time in microseconds. The buffers are made
    // (and their pages touched) before the clock starts.
    let mut exchange = |mut buf: Scratch, count: usize| -> Result<(Scratch, f64)> {
        let t = Instant::now();
        if me == 0 && count > 1 {
            send_burst(comm, other, count)?;
        } else {
            let kind = if me == 0 {
                Kind::Send { peer: other }
            } else {
                Kind::Recv { peer: other }
            };
            for _ in 0..count {
                buf = p2p(comm, kind, buf)?;
            }
        }
        tiny = p2p(comm, answer, std::mem::replace(&mut tiny, Scratch::new(0)))?;
        Ok((buf, t.elapsed().as_secs_f64() * 1e6))
    };
    let mut timed = |len: usize, count: usize| -> Result<Vec<f64>> {
        let mut buf = Scratch::plain(len);
        buf.bytes_mut().fill(1);
        for _ in 0..WARMUP {
            buf = exchange(buf, count)?.0;
        }
        let mut times = Vec::with_capacity(REPS);
        for _ in 0..REPS {
            let (b, t) = exchange(buf, count)?;
            buf = b;
            times.push(t);
        }
        Ok(times)
    };
    let pingpong = timed(4, 1)?;
    let one_way = sizes
        .iter()
        .map(|&b| Ok((b, timed(b, 1)?)))
        .collect::<Result<Vec<_>>>()?;
    let burst = timed(4, BURST)?;
    Ok((me == 0).then_some(LinkSamples {
        pingpong,
        one_way,
        burst,
        burst_len: BURST,
    }))
}

/// One blocking send or receive of `buf` with a peer; the buffer comes back.
fn p2p(comm: &Comm, kind: Kind, buf: Scratch) -> Result<Scratch> {
    let len = buf.len();
    let send = matches!(kind, Kind::Send { .. });
    let pair = if send {
        (buf, Scratch::new(0))
    } else {
        (Scratch::new(0), buf)
    };
    let (s, r) = comm.run_owned(kind, pair, len, DataType::Uint8, Algorithm::Ring)?;
    Ok(if send { s } else { r })
}

/// `count` sends of 4 bytes to `peer` started at once, then waited for.
fn send_burst(comm: &Comm, peer: usize, count: usize) -> Result<()> {
    let bufs: Vec<Scratch> = (0..count).map(|_| Scratch::new(4)).collect();
    let mut reqs = Vec::with_capacity(count);
    let mut result = Ok(());
    for b in &bufs {
        // SAFETY: every buffer stays owned here until its send has been waited for, and all
        // are leaked rather than freed if any send fails, so no region outlives its memory.
        let send = unsafe { b.region() };
        let call = Call {
            kind: Kind::Send { peer },
            send,
            recv: Region::empty(),
            count: 4,
            dtype: DataType::Uint8,
            op: RedOp::Sum,
            root: 0,
            algo: None,
        };
        match comm.start(&call) {
            Ok(id) => reqs.push(id),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    for id in reqs {
        if let Err(e) = comm.wait(id) {
            result = result.and(Err(e));
        }
    }
    if result.is_err() {
        bufs.into_iter().for_each(Scratch::leak);
    }
    result
}

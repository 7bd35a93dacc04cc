//! The collectives a communicator runs for itself when it is made, on memory the library owns
//! (`run_owned`): the exchange of every rank's placement, and the calibration of the cost model.
use super::{placement, Call, Comm, Kind};
use crate::algo::{Algorithm, Collective};
use crate::error::{Error, Result};
use crate::reduce::{DataType, RedOp};
use crate::transport::Scratch;
use crate::tune::{self, Model};
use std::time::Instant;

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
        let mine = places[self.rank].host;
        log::debug!(
            "rank {}: {} of {} ranks on this machine; waiters {}",
            self.rank,
            places.iter().filter(|p| p.host == mine).count(),
            self.nranks,
            if self.spin { "spin" } else { "yield" }
        );
        Ok(())
    }

    /// Measure alpha, beta and gamma unless the configuration fixes them.
    pub(super) fn calibrate(&mut self) -> Result<()> {
        if self.nranks > 1 && self.model.needs_calibration() {
            let m = calibrate(self)?;
            self.set_model(m);
        }
        Ok(())
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
        match self.run(&call) {
            Ok(()) => Ok((send, recv)),
            Err(e) => {
                send.leak();
                recv.leak();
                Err(e)
            }
        }
    }
}

/// Measure alpha (tiny ring AllReduce), beta (1 MiB ring AllReduce) and gamma (a local
/// reduction) on rank 0, and broadcast them so that every rank chooses the same algorithms.
fn calibrate(comm: &Comm) -> Result<Model> {
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
    // Each timing is the best of 3 batches (microseconds per call), so that one scheduling
    // hiccup does not decide it.
    let best_of_3 =
        |mut bufs: (Scratch, Scratch), iters: usize| -> Result<((Scratch, Scratch), f64)> {
            let mut best = f64::MAX;
            for _ in 0..3 {
                let t = Instant::now();
                for _ in 0..iters {
                    bufs = ar(bufs)?;
                }
                best = best.min(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
            }
            Ok((bufs, best))
        };
    let (_, small_us) = best_of_3(small, 10)?;
    // Two large sizes, so that beta comes from their difference (`tune::fit`).
    let (big, large_us) = best_of_3(big, 1)?;
    let larger_len = 4 * big_len;
    let larger = (Scratch::plain(larger_len), Scratch::plain(larger_len));
    let (larger, larger_us) = best_of_3(larger, 1)?;
    drop(larger);
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
    // Rank 0's measurement is everyone's.
    let mut params = Scratch::new(24);
    if comm.rank == 0 {
        for (i, x) in [a, b, g].iter().enumerate() {
            params.bytes_mut()[i * 8..i * 8 + 8].copy_from_slice(&x.to_le_bytes());
        }
    }
    let (_, params) = comm.run_owned(
        Kind::Coll(Collective::Broadcast),
        (params, Scratch::new(24)),
        24,
        DataType::Uint8,
        Algorithm::Ring,
    )?;
    let v = params.bytes();
    let f = |i: usize| f64::from_le_bytes(v[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    let m = comm.model.with_measured(f(0), f(1), f(2));
    log::info!(
        "calibration on {n} ranks: alpha {:.2} us, beta {:.3} GB/s, gamma {:.2} GB/s",
        m.alpha_us,
        1.0 / (m.beta_us_per_byte * 1e3),
        1.0 / (m.gamma_us_per_byte * 1e3)
    );
    Ok(m)
}

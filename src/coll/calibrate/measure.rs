//! What rank 0 measures for the cost model: on one host, ring AllReduces of three sizes
//! (`calibrate`); on several, ping-pongs, one-way messages and bursts with a rank of its own
//! host and one of another (`calibrate_levels`, `probe`); on either, a local reduction for gamma.
use super::PARAMS;
use crate::algo::{Algorithm, Collective};
use crate::coll::{Call, Comm, Kind};
use crate::error::{Error, Result};
use crate::reduce::{DataType, RedOp};
use crate::transport::{Region, Scratch};
use crate::tune::{self, LinkSamples};
use std::time::Instant;

/// What rank 0 measured: the `PARAMS`, and what looked disturbed, if anything (`tune::steady`).
pub(super) struct Measured {
    pub(super) params: Vec<f64>,
    pub(super) disturbed: Option<String>,
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
pub(super) fn calibrate(comm: &Comm) -> Result<Option<Measured>> {
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
pub(super) fn calibrate_levels(comm: &Comm) -> Result<Option<Measured>> {
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

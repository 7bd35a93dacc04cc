//! fabricoll-perf: nccl-tests-style benchmark of the collective engines.
//!
//! `fabricoll-perf --ranks 4 --coll allreduce -b 8 -e 256M -f 2 -d float -o sum -n 20 -w 5 -c 1`
//! forks the ranks itself where no launcher variable is set; under a launcher (torchrun,
//! mpirun, mpiexec, srun, or fabricoll's own `FABRICOLL_RANK` and `FABRICOLL_NRANKS`: see
//! `coll::launch`) it runs as one rank. Rank 0 prints one row per size: size, count, type, redop, algorithm, time,
//! algbw, busbw (as nccl-tests defines them) and #wrong, then `# Avg bus bandwidth`.
//!
//! `args` holds the command line, `check` the expected values, `fork` how the ranks start where no launcher did;
//! this file runs one rank's sizes and prints the rows.
mod args;
mod check;
mod device;
mod fork;

use args::{parse, Args, Average};
use check::{dec, enc, value, wrong};
use nccl_net_fabricoll::algo::{Algorithm, Collective};
use nccl_net_fabricoll::cli::{bus_factor, counts};
use nccl_net_fabricoll::coll::launch::{self, Launch};
use nccl_net_fabricoll::coll::{Call, Comm, Kind};
use nccl_net_fabricoll::config::{Compression, Config};
use nccl_net_fabricoll::reduce::{DataType, RedOp};
use nccl_net_fabricoll::transport::{Region, Scratch};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

/// The algorithm every row runs unless `auto`, and who forced it.
fn forced(a: &Args, cfg: &Config) -> String {
    use nccl_net_fabricoll::config::Forced;
    match (a.algo, cfg.algo.of(a.coll)) {
        (Some(x), _) => format!("{} (--algo)", x.name()),
        (None, Forced::Explicit(x)) => format!("{} (FABRICOLL_ALGO)", x.name()),
        (None, Forced::Plain(x)) if nccl_net_fabricoll::algo::supports(x, a.coll) => {
            format!("{} (FABRICOLL_ALGO)", x.name())
        }
        (None, _) => "auto".to_string(),
    }
}

fn run_rank(a: &Args, comm: &Arc<Comm>, cfg: &Config, how: &Launch) -> Result<usize, String> {
    let on_device = match a.device {
        Some(which) => {
            let local = how.local_rank.unwrap_or(comm.rank);
            let wait = device::deadline(cfg.timeout);
            Some(device::OnDevice::open(which, local, a.stream, wait)?)
        }
        None => None,
    };
    let r = rows(a, comm, cfg, how, on_device.as_ref());
    if let Some(d) = &on_device {
        d.close(comm);
    }
    r
}

fn rows(
    a: &Args,
    comm: &Arc<Comm>,
    cfg: &Config,
    how: &Launch,
    on_device: Option<&device::OnDevice>,
) -> Result<usize, String> {
    let n = comm.nranks;
    let el = a.dtype.size();
    // The timed calls' compression (None: the communicator's, FABRICOLL_COMPRESS).
    let compressed = a.compress.map(|format| Compression {
        format,
        block: a.compress_block,
    });
    if comm.rank == 0 {
        let timed = match a.time_target {
            Some(t) => format!(
                "{t} s of timed iterations per size ({}..{}, the last column)",
                a.min_iters, a.iters
            ),
            None => format!("{} timed iterations", a.iters),
        };
        let timed = if a.barrier {
            format!("{timed}, each alone after a barrier")
        } else {
            timed
        };
        println!(
            "# fabricoll-perf: {:?} on {n} ranks, algorithm {}, type {}, op {}, {} warm-up + {timed}, {}",
            a.coll,
            forced(a, cfg),
            a.dtype.name(),
            a.op.name(),
            a.warmup,
            if a.in_place { "in place" } else { "out of place" }
        );
        println!("# launcher: {}", how.describe());
        if let Some(d) = on_device {
            println!("# buffers: device memory, rank 0 on {}", d.describe());
        }
        let hosts = comm.hosts();
        if hosts.count() > 1 {
            let (mut within, mut between) = (None, None);
            for r in (0..n).filter(|&r| r != comm.rank) {
                let slot = if hosts.host_of(r) == hosts.host_of(comm.rank) {
                    &mut within
                } else {
                    &mut between
                };
                slot.get_or_insert_with(|| comm.provider_to(r).to_string());
            }
            println!(
                "# hosts: {} with {:?} ranks; provider {} within a host, {} between hosts",
                hosts.count(),
                hosts.sizes(n),
                within.as_deref().unwrap_or("-"),
                between.as_deref().unwrap_or("-")
            );
        }
        println!(
            "# time: {} mean per iteration (-a {})",
            a.average.name(),
            a.average as u8
        );
        let m = comm.model();
        println!(
            "# model: alpha {:.2} us, beta {:.3} GB/s, gamma {:.2} GB/s{}",
            m.alpha_us,
            1e-3 / m.beta_us_per_byte,
            1e-3 / m.gamma_us_per_byte,
            if hosts.count() > 1 {
                format!(
                    " between hosts; within a host alpha {:.2} us, beta {:.3} GB/s",
                    m.intra.alpha_us,
                    1e-3 / m.intra.beta_us_per_byte
                )
            } else {
                String::new()
            }
        );
        if let Some(c) = compressed {
            println!(
                "# compressed: {} in blocks of {} (the algo column names the format; #wrong checks the uncompressed run)",
                c.format, c.block
            );
        }
        println!("#");
        let it = if a.time_target.is_some() {
            "  iters"
        } else {
            ""
        };
        let (err, unit) = if compressed.is_some() {
            ("    error", "  (max/amax)")
        } else {
            ("", "")
        };
        println!(
            "#{:>11} {:>12} {:>9} {:>6} {:>10} {:>10} {:>8} {:>8} {:>7}{err}{it}",
            "size", "count", "type", "redop", "algo", "time", "algbw", "busbw", "#wrong"
        );
        println!(
            "#{:>11} {:>12} {:>9} {:>6} {:>10} {:>10} {:>8} {:>8} {:>7}{unit}",
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", ""
        );
    }
    let mut sum_bus = 0.0;
    let mut rows = 0usize;
    let mut total_wrong = 0usize;
    let mut bytes = a.min.max(el);
    loop {
        let (total, count) = counts(a.coll, bytes, el, n);
        let p = nccl_net_fabricoll::algo::Problem::new(a.coll, n, count).with_root(a.root);
        let in_len = p.in_len() * el;
        let out_len = p.out_len() * el;
        // User buffers as a program's malloc gives them (the MPI benchmarks' are malloc'ed),
        // or device memory (--device).
        let send = Scratch::plain(if on_device.is_some() {
            0
        } else {
            in_len.max(out_len)
        });
        let recv = Scratch::plain(if on_device.is_some() { 0 } else { out_len });
        let mut data = Vec::with_capacity(in_len);
        for i in 0..p.in_len() {
            enc(
                a.dtype,
                value(a.op, a.dtype, comm.nranks, comm.rank, i),
                &mut data,
            );
        }
        // In place: the input sits where the output goes (NCCL's layout for every collective).
        let in_off = match (a.in_place, a.coll) {
            (true, Collective::AllGather) => comm.rank * count * el,
            _ => 0,
        };
        // SAFETY: `send` and `recv` live until the end of this iteration, after the last
        // collective on these regions has returned (an error ends the program).
        let (send_whole, recv_whole) = unsafe { (send.region(), recv.region()) };
        let (sr, rr): (Region, Region) = if on_device.is_some() {
            (Region::empty(), Region::empty())
        } else if a.in_place {
            let base = send_whole;
            let inp = base.sub(in_off, in_len).ok_or("in-place layout")?;
            (
                inp,
                base.sub(0, out_len.max(in_len)).ok_or("in-place layout")?,
            )
        } else {
            (send_whole.sub(0, in_len).ok_or("layout")?, recv_whole)
        };
        let dbufs = match on_device {
            Some(d) => Some((d.alloc(in_len.max(out_len))?, d.alloc(out_len)?)),
            None => None,
        };
        let call = Call {
            kind: Kind::Coll(a.coll),
            send: sr,
            recv: rr,
            count,
            dtype: a.dtype,
            op: a.op,
            root: a.root,
            algo: a.algo,
        };
        let (algo, _) = comm.choose(&p, el, a.algo).map_err(|e| e.to_string())?;
        // One call (a device call: enqueued where stream-ordered, see `finish`).
        let run = |c: Option<Compression>| {
            match (on_device, &dbufs) {
                (Some(d), Some((sb, rb))) => {
                    let recv_at = if a.in_place { (sb, 0) } else { (rb, 0) };
                    d.call(
                        comm,
                        Kind::Coll(a.coll),
                        (sb, in_off),
                        recv_at,
                        count,
                        (a.dtype, a.op),
                        a.root,
                        a.algo,
                        c,
                    )
                }
                _ => comm.run_with(&call, c).map_err(|e| e.to_string()),
            }
            .map_err(|e| format!("size {bytes}: {e}"))
        };
        // Waits for the calls made so far (stream-ordered device calls: their stream).
        let finish = || on_device.map_or(Ok(()), |d| d.finish());
        let input = || match (on_device, &dbufs) {
            (Some(d), Some((sb, _))) => d.write(sb, in_off, &data),
            _ => {
                sr.write(&data);
                Ok(())
            }
        };
        let output = || -> Result<Vec<u8>, String> {
            let out = match (on_device, &dbufs) {
                (Some(d), Some((sb, rb))) => {
                    d.read(if a.in_place { sb } else { rb }, 0, out_len)?
                }
                _ if a.in_place => rr.to_vec(),
                _ => recv.bytes().to_vec(),
            };
            Ok(out[..out_len.min(out.len())].to_vec())
        };
        let mut nwrong = 0;
        // Compressing: the uncompressed run is checked and is the error's reference.
        let plain = compressed.map(|_| Compression::OFF);
        if a.check || compressed.is_some() {
            input()?;
            run(plain)?;
            finish()?;
            nwrong = if a.check {
                wrong(a, comm, &output()?, count)
            } else {
                0
            };
        }
        let mut error = 0.0;
        if compressed.is_some() {
            let exact = output()?;
            input()?;
            run(compressed)?;
            let got = output()?;
            let (mut diff, mut amax) = (0f64, 0f64);
            for (u, c) in exact.chunks(el).zip(got.chunks(el)) {
                let (u, c) = (dec(a.dtype, u), dec(a.dtype, c));
                diff = if (c - u).is_nan() {
                    f64::INFINITY
                } else {
                    diff.max((c - u).abs())
                };
                amax = amax.max(u.abs());
            }
            let diff = all(comm, diff, RedOp::Max)?;
            let amax = all(comm, amax, RedOp::Max)?;
            error = if amax > 0.0 { diff / amax } else { diff };
        }
        input()?;
        let t0 = Instant::now();
        for _ in 0..a.warmup {
            run(compressed)?;
        }
        finish()?;
        let iters = match a.time_target {
            // Every rank must run as many iterations: they agree on the slowest rank's estimate.
            Some(t) => {
                let est = all(
                    comm,
                    t0.elapsed().as_secs_f64() / a.warmup as f64,
                    RedOp::Max,
                )?;
                timed_iterations(t, est, a.min_iters, a.iters)
            }
            None => a.iters,
        };
        let secs = if a.barrier {
            let mut alone = 0.0;
            for _ in 0..iters {
                all(comm, 0.0, RedOp::Max)?;
                let t0 = Instant::now();
                run(compressed)?;
                finish()?;
                alone += t0.elapsed().as_secs_f64();
            }
            alone
        } else {
            let t0 = Instant::now();
            for _ in 0..iters {
                run(compressed)?;
            }
            finish()?;
            t0.elapsed().as_secs_f64()
        };
        let us = ranks_time(comm, secs * 1e6 / iters as f64, a.average)?;
        let all_wrong = all(comm, nwrong as f64, RedOp::Sum)? as usize;
        total_wrong += all_wrong;
        let size = total * el;
        let algbw = size as f64 / us / 1e3;
        let busbw = algbw * bus_factor(a.coll, n);
        if comm.rank == 0 {
            println!(
                "{:>12} {:>12} {:>9} {:>6} {:>10} {:>10.2} {:>8.3} {:>8.3} {:>7}{}{}",
                size,
                total,
                a.dtype.name(),
                if a.coll.reduces() {
                    a.op.name()
                } else {
                    "none"
                },
                compressed.map_or(algo.name(), |c| c.format.name()),
                us,
                algbw,
                busbw,
                if a.check {
                    all_wrong.to_string()
                } else {
                    "N/A".into()
                },
                if compressed.is_some() {
                    format!(" {error:>11.3e}")
                } else {
                    String::new()
                },
                if a.time_target.is_some() {
                    format!(" {iters:>6}")
                } else {
                    String::new()
                }
            );
        }
        sum_bus += busbw;
        rows += 1;
        match bytes.checked_mul(a.factor) {
            Some(b) if b <= a.max => bytes = b,
            _ => break,
        }
    }
    if comm.rank == 0 {
        println!(
            "# Out of bounds values : {total_wrong} {}",
            if total_wrong == 0 { "OK" } else { "FAILED" }
        );
        println!(
            "# Avg bus bandwidth    : {:.4}",
            sum_bus / rows.max(1) as f64
        );
        println!("#");
    }
    Ok(total_wrong)
}

/// How many iterations fill `target` seconds at `estimate` seconds each, within `min..=max`
/// (`mpi_coll_bench -t`'s rule; an estimate of zero gives `max`).
fn timed_iterations(target: f64, estimate: f64, min: usize, max: usize) -> usize {
    if estimate > 0.0 {
        ((target / estimate) as usize).clamp(min, max)
    } else {
        max
    }
}

/// The time of a row from this rank's `us` (`-a`), the same on every rank.
fn ranks_time(comm: &Comm, us: f64, how: Average) -> Result<f64, String> {
    match how {
        Average::Rank0 => all(comm, if comm.rank == 0 { us } else { 0.0 }, RedOp::Sum),
        Average::Mean => all(comm, us, RedOp::Avg),
        Average::Min => all(comm, us, RedOp::Min),
        Average::Max => all(comm, us, RedOp::Max),
    }
}

/// `v` reduced over all ranks with `op` (a float64 AllReduce of one element).
fn all(comm: &Comm, v: f64, op: RedOp) -> Result<f64, String> {
    let (mut send, recv) = (Scratch::new(8), Scratch::new(8));
    send.bytes_mut().copy_from_slice(&v.to_le_bytes());
    // SAFETY: both buffers outlive the blocking collective (an error ends the program).
    let (s, r) = unsafe { (send.region(), recv.region()) };
    comm.run(&Call {
        kind: Kind::Coll(Collective::AllReduce),
        send: s,
        recv: r,
        count: 1,
        dtype: DataType::Float64,
        op,
        root: 0,
        algo: Some(Algorithm::Ring),
    })
    .map_err(|e| e.to_string())?;
    let b: [u8; 8] = recv.bytes()[..8].try_into().expect("8 bytes");
    Ok(f64::from_le_bytes(b))
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    // An error (exit status 2) or --help (0) is printed by clap.
    let a = parse(&argv).unwrap_or_else(|e| e.exit());
    let cfg = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fabricoll-perf: {e}");
            return ExitCode::from(2);
        }
    };
    nccl_net_fabricoll::logging::init(None);
    match launch::from_env(&cfg) {
        Err(e) => {
            eprintln!("fabricoll-perf: {e}");
            ExitCode::from(2)
        }
        Ok(Some(how)) => {
            let rank = how.rank;
            if a.root >= how.nranks {
                eprintln!(
                    "fabricoll-perf: -r {} is not a rank of {}",
                    a.root, how.nranks
                );
                return ExitCode::from(2);
            }
            let comm = match how.init(&cfg) {
                Ok(c) => Arc::new(c),
                Err(e) => {
                    eprintln!("fabricoll-perf rank {rank}: {e}");
                    return ExitCode::from(1);
                }
            };
            match run_rank(&a, &comm, &cfg, &how) {
                Ok(0) => ExitCode::SUCCESS,
                Ok(_) => ExitCode::from(1),
                Err(e) => {
                    eprintln!("fabricoll-perf rank {rank}: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Ok(None) => fork::fork_ranks(&a, &argv, &cfg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timed_iterations_fill_the_target_within_bounds() {
        assert_eq!(timed_iterations(0.2, 0.001, 5, 1000), 200);
        assert_eq!(timed_iterations(0.2, 1e-6, 5, 1000), 1000);
        assert_eq!(timed_iterations(0.2, 0.5, 5, 1000), 5);
        assert_eq!(timed_iterations(0.2, 0.0, 5, 1000), 1000);
        assert_eq!(timed_iterations(0.2, 0.3, 1, 3), 1);
    }
}

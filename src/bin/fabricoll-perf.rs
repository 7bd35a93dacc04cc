//! fabricoll-perf: nccl-tests-style benchmark of the collective engines.
//!
//! `fabricoll-perf --ranks 4 --coll allreduce -b 8 -e 256M -f 2 -d float -o sum -n 20 -w 5 -c 1`
//! forks the ranks itself; under a launcher it runs as one rank (`FABRICOLL_RANK`,
//! `FABRICOLL_NRANKS`, `FABRICOLL_UNIQUE_ID`, or torchrun's `RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
//! `MASTER_PORT`). Rank 0 prints one row per size: size, count, type, redop, algorithm, time,
//! algbw, busbw (as nccl-tests defines them) and #wrong, then `# Avg bus bandwidth`.
use nccl_net_fabricoll::algo::{Algorithm, Collective};
use nccl_net_fabricoll::coll::bootstrap::{self, UniqueId};
use nccl_net_fabricoll::coll::placement::{allowed_cpus, bind_to};
use nccl_net_fabricoll::coll::{Call, Comm, Kind};
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::reduce::{conv, fp8, DataType, RedOp};
use nccl_net_fabricoll::transport::{Region, Scratch};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
struct Args {
    ranks: usize,
    coll: Collective,
    algo: Option<Algorithm>,
    min: usize,
    max: usize,
    factor: usize,
    dtype: DataType,
    op: RedOp,
    iters: usize,
    warmup: usize,
    /// `-t`: seconds of timed iterations per size; the count is then chosen per size, between
    /// `min_iters` and `iters`, from the warm-up's time (as `mpi_coll_bench -t` does).
    time_target: Option<f64>,
    min_iters: usize,
    check: bool,
    root: usize,
    in_place: bool,
    /// `--bind`: how the ranks this process forks are bound to CPUs.
    bind: Bind,
    /// `-a`: how the ranks' times make the reported one.
    average: Average,
}

/// How the ranks' per-iteration times make the time of a row: nccl-tests' `-a` (0 rank 0,
/// 1 the mean over ranks, its default, 2 the fastest rank, 3 the slowest). `mpi_coll_bench`,
/// the Open MPI side of `scripts/bench-coll.sh`, reports the mean over ranks too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Average {
    Rank0,
    Mean,
    Min,
    Max,
}

impl Average {
    fn name(self) -> &'static str {
        match self {
            Average::Rank0 => "rank 0's",
            Average::Mean => "the mean over ranks of each rank's",
            Average::Min => "the fastest rank's",
            Average::Max => "the slowest rank's",
        }
    }
}

/// Binding of forked ranks to CPUs, as `mpirun --bind-to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bind {
    /// Rank r runs on the r-th CPU this process may use, when there is one CPU per rank;
    /// with more ranks than CPUs nothing is bound (Open MPI's default for 2 ranks, and what it
    /// does when oversubscribed).
    Core,
    /// Rank r on CPU r mod n of the n this process may use, ranks outnumbering CPUs too
    /// (`mpirun --bind-to core:overload-allowed`): oversubscribed ranks stay where they are
    /// instead of migrating.
    RoundRobin,
    None,
}

/// The CPU of each rank under `bind`, from the CPUs this process may run on.
fn bind_plan(bind: Bind, ranks: usize, cpus: &[usize]) -> Vec<Option<usize>> {
    match bind {
        Bind::Core if ranks <= cpus.len() => cpus[..ranks].iter().map(|c| Some(*c)).collect(),
        Bind::RoundRobin if !cpus.is_empty() => {
            (0..ranks).map(|r| Some(cpus[r % cpus.len()])).collect()
        }
        _ => vec![None; ranks],
    }
}

const USAGE: &str = "usage: fabricoll-perf [--ranks R] [--coll allreduce|allgather|reducescatter|broadcast|reduce|alltoall]
                      [--algo auto|ring|bidir_ring|mesh|mesh1|rdh|rd|tree|dbtree|bruck|pairwise|hier]
                      [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-d TYPE] [-o OP] [-n ITERS] [-w WARMUP]
                      [-t SECONDS [-m MINITERS]] [-c 0|1] [-r ROOT] [--inplace] [--bind core|rr|none]
                      [-a 0|1|2|3]
sizes accept K, M, G suffixes; TYPE: int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 fp8_e4m3 fp8_e5m2;
OP: sum prod max min avg;
-t: time each size for about SECONDS, with between MINITERS (default 5) and ITERS iterations,
    the count estimated from the slowest rank's warm-up (at least one warm-up iteration);
--bind: ranks forked here run one per CPU (core, the default, when there are at least as many
    CPUs as ranks; as mpirun binds 2 ranks), rank r on CPU r mod the CPU count even when ranks
    outnumber CPUs (rr; mpirun --bind-to core:overload-allowed) or wherever the scheduler puts
    them (none);
-a: the time reported is rank 0's (0), the mean over ranks (1, the default, as nccl-tests),
    the fastest rank's (2) or the slowest rank's (3) mean per iteration";

fn size_arg(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .map(|v| v * mul)
        .map_err(|_| format!("not a size: {s:?}"))
}

fn parse(argv: &[String]) -> Result<Args, String> {
    let mut a = Args {
        ranks: 2,
        coll: Collective::AllReduce,
        algo: None,
        min: 8,
        max: 64 << 20,
        factor: 2,
        dtype: DataType::Float32,
        op: RedOp::Sum,
        iters: 20,
        warmup: 5,
        time_target: None,
        min_iters: 5,
        check: true,
        root: 0,
        in_place: false,
        bind: Bind::Core,
        average: Average::Mean,
    };
    let mut i = 0;
    while i < argv.len() {
        let k = argv[i].as_str();
        let mut v = || -> Result<String, String> {
            i += 1;
            argv.get(i)
                .cloned()
                .ok_or_else(|| format!("{k} needs a value"))
        };
        match k {
            "--ranks" | "-R" => {
                a.ranks = v()?
                    .parse()
                    .map_err(|_| "--ranks: not a number".to_string())?
            }
            "--coll" => {
                let c = v()?;
                a.coll = match c.as_str() {
                    "allreduce" => Collective::AllReduce,
                    "allgather" => Collective::AllGather,
                    "reducescatter" | "reduce_scatter" => Collective::ReduceScatter,
                    "broadcast" | "bcast" => Collective::Broadcast,
                    "reduce" => Collective::Reduce,
                    "alltoall" => Collective::AllToAll,
                    _ => return Err(format!("--coll: unknown collective {c:?}")),
                }
            }
            "--algo" => {
                let s = v()?;
                a.algo = if s == "auto" {
                    None
                } else {
                    Some(Algorithm::from_name(&s).ok_or_else(|| {
                        let names: Vec<&str> = Algorithm::ALL.iter().map(|x| x.name()).collect();
                        format!(
                            "--algo: unknown algorithm {s:?}; accepted values: auto, {}",
                            names.join(", ")
                        )
                    })?)
                }
            }
            "-b" | "--minbytes" => a.min = size_arg(&v()?)?,
            "-e" | "--maxbytes" => a.max = size_arg(&v()?)?,
            "-f" | "--stepfactor" => {
                a.factor = v()?.parse().map_err(|_| "-f: not a number".to_string())?
            }
            "-d" | "--datatype" => {
                let s = v()?;
                a.dtype =
                    DataType::from_name(&s).ok_or_else(|| format!("-d: unknown type {s:?}"))?
            }
            "-o" | "--op" => {
                let s = v()?;
                a.op = RedOp::from_name(&s).ok_or_else(|| format!("-o: unknown op {s:?}"))?
            }
            "-n" | "--iters" => {
                a.iters = v()?.parse().map_err(|_| "-n: not a number".to_string())?
            }
            "-w" | "--warmup_iters" => {
                a.warmup = v()?.parse().map_err(|_| "-w: not a number".to_string())?
            }
            "-t" | "--time" => {
                let t: f64 = v()?
                    .parse()
                    .map_err(|_| "-t: not a number of seconds".to_string())?;
                if !(t.is_finite() && t > 0.0) {
                    return Err(format!("-t: {t} is not a positive number of seconds"));
                }
                a.time_target = Some(t);
            }
            "-m" | "--min_iters" => {
                a.min_iters = v()?.parse().map_err(|_| "-m: not a number".to_string())?
            }
            "-c" | "--check" => a.check = v()? != "0",
            "-r" | "--root" => a.root = v()?.parse().map_err(|_| "-r: not a number".to_string())?,
            "--inplace" => a.in_place = true,
            "--bind" => {
                a.bind = match v()?.as_str() {
                    "core" => Bind::Core,
                    "rr" => Bind::RoundRobin,
                    "none" => Bind::None,
                    o => return Err(format!("--bind: {o:?} is not core, rr or none")),
                }
            }
            "-a" | "--average" => {
                a.average = match v()?.as_str() {
                    "0" => Average::Rank0,
                    "1" => Average::Mean,
                    "2" => Average::Min,
                    "3" => Average::Max,
                    o => {
                        return Err(format!(
                            "-a: {o:?} is not 0 (rank 0), 1 (mean), 2 (min) or 3 (max)"
                        ))
                    }
                }
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            _ => return Err(format!("unknown argument {k:?}\n{USAGE}")),
        }
        i += 1;
    }
    if a.ranks == 0 || a.factor < 2 || a.min > a.max || a.iters == 0 {
        return Err(format!(
            "invalid arguments (ranks >= 1, -f >= 2, -b <= -e, -n >= 1)\n{USAGE}"
        ));
    }
    if a.time_target.is_some() && (a.warmup == 0 || a.min_iters == 0 || a.min_iters > a.iters) {
        return Err(format!(
            "invalid arguments: -t needs -w >= 1 (the estimate) and 1 <= -m <= -n\n{USAGE}"
        ));
    }
    Ok(a)
}

/// The rank-r, element-i input value: small integers, so sums are exact in every type but fp8.
fn value(op: RedOp, r: usize, i: usize) -> f64 {
    match op {
        RedOp::Prod => {
            if (r + i) % 7 == 0 {
                2.0
            } else {
                1.0
            }
        }
        _ => ((r * 7 + i * 3) % 5 + 1) as f64,
    }
}

fn enc(dt: DataType, v: f64, out: &mut Vec<u8>) {
    match dt {
        DataType::Int8 => out.extend_from_slice(&(v as i8).to_le_bytes()),
        DataType::Uint8 => out.extend_from_slice(&(v as u8).to_le_bytes()),
        DataType::Int32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
        DataType::Uint32 => out.extend_from_slice(&(v as u32).to_le_bytes()),
        DataType::Int64 => out.extend_from_slice(&(v as i64).to_le_bytes()),
        DataType::Uint64 => out.extend_from_slice(&(v as u64).to_le_bytes()),
        DataType::Float16 => out.extend_from_slice(&conv::f32_to_f16(v as f32).to_le_bytes()),
        DataType::Float32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
        DataType::Float64 => out.extend_from_slice(&v.to_le_bytes()),
        DataType::Bfloat16 => out.extend_from_slice(&conv::f32_to_bf16(v as f32).to_le_bytes()),
        DataType::Float8E4M3 => out.push(fp8::f32_to_e4m3(v as f32)),
        DataType::Float8E5M2 => out.push(fp8::f32_to_e5m2(v as f32)),
    }
}

fn dec(dt: DataType, b: &[u8]) -> f64 {
    match dt {
        DataType::Int8 => b[0] as i8 as f64,
        DataType::Uint8 => b[0] as f64,
        DataType::Int32 => i32::from_le_bytes(b[..4].try_into().unwrap()) as f64,
        DataType::Uint32 => u32::from_le_bytes(b[..4].try_into().unwrap()) as f64,
        DataType::Int64 => i64::from_le_bytes(b[..8].try_into().unwrap()) as f64,
        DataType::Uint64 => u64::from_le_bytes(b[..8].try_into().unwrap()) as f64,
        DataType::Float16 => conv::f16_to_f32(u16::from_le_bytes([b[0], b[1]])) as f64,
        DataType::Float32 => f32::from_le_bytes(b[..4].try_into().unwrap()) as f64,
        DataType::Float64 => f64::from_le_bytes(b[..8].try_into().unwrap()),
        DataType::Bfloat16 => conv::bf16_to_f32(u16::from_le_bytes([b[0], b[1]])) as f64,
        DataType::Float8E4M3 => fp8::e4m3_to_f32(b[0]) as f64,
        DataType::Float8E5M2 => fp8::e5m2_to_f32(b[0]) as f64,
    }
}

/// Relative tolerance of a type for a reduction over n ranks (exact types: 0).
fn tolerance(dt: DataType, n: usize) -> f64 {
    let eps = match dt {
        DataType::Float16 => 1.0 / 1024.0,
        DataType::Bfloat16 => 1.0 / 128.0,
        DataType::Float8E4M3 => 1.0 / 8.0,
        DataType::Float8E5M2 => 1.0 / 4.0,
        _ => 0.0,
    };
    eps * n as f64
}

fn reference(op: RedOp, dt: DataType, vals: impl Iterator<Item = f64>, n: usize) -> f64 {
    let v: Vec<f64> = vals.collect();
    match op {
        RedOp::Sum => v.iter().sum(),
        RedOp::Prod => v.iter().product(),
        RedOp::Max => v.iter().cloned().fold(f64::MIN, f64::max),
        RedOp::Min => v.iter().cloned().fold(f64::MAX, f64::min),
        RedOp::Avg => {
            let s: f64 = v.iter().sum();
            if dt.is_float() {
                s / n as f64
            } else {
                (s as i64 / n as i64) as f64
            }
        }
    }
}

/// Elements each rank sends/receives for a row of `bytes` (nccl-tests' size column), and the
/// per-call count.
fn counts(coll: Collective, bytes: usize, elem: usize, n: usize) -> (usize, usize) {
    let total = bytes / elem;
    match coll {
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
            (total / n * n, total / n)
        }
        _ => (total, total),
    }
}

fn bus_factor(coll: Collective, n: usize) -> f64 {
    let n = n as f64;
    match coll {
        Collective::AllReduce => 2.0 * (n - 1.0) / n,
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => (n - 1.0) / n,
        Collective::Broadcast | Collective::Reduce => 1.0,
    }
}

/// Count elements of this rank's output that differ from the independent reference.
fn wrong(a: &Args, comm: &Comm, out: &[u8], count: usize) -> usize {
    let n = comm.nranks;
    let r = comm.rank;
    let el = a.dtype.size();
    let elems = out.len() / el;
    let tol = tolerance(a.dtype, n);
    let mut bad = 0;
    for j in 0..elems {
        let want = match a.coll {
            Collective::AllReduce => reference(a.op, a.dtype, (0..n).map(|q| value(a.op, q, j)), n),
            Collective::ReduceScatter => reference(
                a.op,
                a.dtype,
                (0..n).map(|q| value(a.op, q, r * count + j)),
                n,
            ),
            Collective::Reduce if r == a.root => {
                reference(a.op, a.dtype, (0..n).map(|q| value(a.op, q, j)), n)
            }
            Collective::Reduce => continue,
            Collective::AllGather => value(a.op, j / count, j % count),
            Collective::Broadcast => value(a.op, a.root, j),
            Collective::AllToAll => value(a.op, j / count, r * count + j % count),
        };
        // Integer types wrap like the library's kernels.
        let mut w = Vec::new();
        enc(a.dtype, want, &mut w);
        let want_t = dec(a.dtype, &w);
        let got = dec(a.dtype, &out[j * el..(j + 1) * el]);
        let ok = if tol == 0.0 {
            got == want_t
        } else {
            (got - want).abs() <= tol * want.abs().max(1.0)
        };
        if !ok {
            bad += 1;
        }
    }
    bad
}

fn run_rank(a: &Args, comm: &Comm) -> Result<usize, String> {
    let n = comm.nranks;
    let el = a.dtype.size();
    if comm.rank == 0 {
        let timed = match a.time_target {
            Some(t) => format!(
                "{t} s of timed iterations per size ({}..{}, the last column)",
                a.min_iters, a.iters
            ),
            None => format!("{} timed iterations", a.iters),
        };
        println!(
            "# fabricoll-perf: {:?} on {n} ranks, algorithm {}, type {}, op {}, {} warm-up + {timed}, {}",
            a.coll,
            a.algo.map_or("auto".to_string(), |x| x.name().to_string()),
            a.dtype.name(),
            a.op.name(),
            a.warmup,
            if a.in_place { "in place" } else { "out of place" }
        );
        println!(
            "# time: {} mean per iteration (-a {})",
            a.average.name(),
            a.average as u8
        );
        println!(
            "# model: alpha {:.2} us, beta {:.3} GB/s, gamma {:.2} GB/s",
            comm.model().alpha_us,
            1e-3 / comm.model().beta_us_per_byte,
            1e-3 / comm.model().gamma_us_per_byte
        );
        println!("#");
        let it = if a.time_target.is_some() {
            "  iters"
        } else {
            ""
        };
        println!(
            "#{:>11} {:>12} {:>9} {:>6} {:>10} {:>10} {:>8} {:>8} {:>7}{it}",
            "size", "count", "type", "redop", "algo", "time", "algbw", "busbw", "#wrong"
        );
        println!(
            "#{:>11} {:>12} {:>9} {:>6} {:>10} {:>10} {:>8} {:>8} {:>7}",
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
        // User buffers as a program's malloc gives them (the MPI benchmarks' are malloc'ed).
        let send = Scratch::plain(in_len.max(out_len));
        let recv = Scratch::plain(out_len);
        let mut data = Vec::with_capacity(in_len);
        for i in 0..p.in_len() {
            enc(a.dtype, value(a.op, comm.rank, i), &mut data);
        }
        // SAFETY: `send` and `recv` live until the end of this iteration, after the last
        // collective on these regions has returned (an error ends the program).
        let (send_whole, recv_whole) = unsafe { (send.region(), recv.region()) };
        let (sr, rr): (Region, Region) = if a.in_place {
            // In place: the input sits where the output goes (NCCL's layout for every collective).
            let off = match a.coll {
                Collective::AllGather => comm.rank * count * el,
                _ => 0,
            };
            let base = send_whole;
            let inp = base.sub(off, in_len).ok_or("in-place layout")?;
            (
                inp,
                base.sub(0, out_len.max(in_len)).ok_or("in-place layout")?,
            )
        } else {
            (send_whole.sub(0, in_len).ok_or("layout")?, recv_whole)
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
        let mut nwrong = 0;
        if a.check {
            sr.write(&data);
            comm.run(&call).map_err(|e| format!("size {bytes}: {e}"))?;
            let out = if a.in_place {
                rr.to_vec()
            } else {
                recv.bytes().to_vec()
            };
            nwrong = wrong(a, comm, &out[..out_len.min(out.len())], count);
        }
        sr.write(&data);
        let t0 = Instant::now();
        for _ in 0..a.warmup {
            comm.run(&call).map_err(|e| format!("size {bytes}: {e}"))?;
        }
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
        let t0 = Instant::now();
        for _ in 0..iters {
            comm.run(&call).map_err(|e| format!("size {bytes}: {e}"))?;
        }
        let us = ranks_time(
            comm,
            t0.elapsed().as_secs_f64() * 1e6 / iters as f64,
            a.average,
        )?;
        let all_wrong = all(comm, nwrong as f64, RedOp::Sum)? as usize;
        total_wrong += all_wrong;
        let size = total * el;
        let algbw = size as f64 / us / 1e3;
        let busbw = algbw * bus_factor(a.coll, n);
        if comm.rank == 0 {
            println!(
                "{:>12} {:>12} {:>9} {:>6} {:>10} {:>10.2} {:>8.3} {:>8.3} {:>7}{}",
                size,
                total,
                a.dtype.name(),
                if a.coll.reduces() {
                    a.op.name()
                } else {
                    "none"
                },
                algo.name(),
                us,
                algbw,
                busbw,
                if a.check {
                    all_wrong.to_string()
                } else {
                    "N/A".into()
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

/// `v` reduced over all ranks with `op` (a float64 AllReduce of one element).
/// The time of a row from this rank's `us` (`-a`), the same on every rank.
fn ranks_time(comm: &Comm, us: f64, how: Average) -> Result<f64, String> {
    match how {
        Average::Rank0 => all(comm, if comm.rank == 0 { us } else { 0.0 }, RedOp::Sum),
        Average::Mean => all(comm, us, RedOp::Avg),
        Average::Min => all(comm, us, RedOp::Min),
        Average::Max => all(comm, us, RedOp::Max),
    }
}

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

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// This process's rank, rank count and unique id when a launcher started it.
fn launched(cfg: &Config) -> Result<Option<(usize, usize, UniqueId)>, String> {
    if let (Some(r), Some(n), Some(id)) = (
        env("FABRICOLL_RANK"),
        env("FABRICOLL_NRANKS"),
        env("FABRICOLL_UNIQUE_ID"),
    ) {
        let r = r.parse().map_err(|_| "FABRICOLL_RANK: not a number")?;
        let n = n.parse().map_err(|_| "FABRICOLL_NRANKS: not a number")?;
        return Ok(Some((
            r,
            n,
            UniqueId::from_hex(&id).map_err(|e| e.to_string())?,
        )));
    }
    if let (Some(r), Some(n), Some(addr), Some(port)) = (
        env("RANK"),
        env("WORLD_SIZE"),
        env("MASTER_ADDR"),
        env("MASTER_PORT"),
    ) {
        let r: usize = r.parse().map_err(|_| "RANK: not a number")?;
        let n = n.parse().map_err(|_| "WORLD_SIZE: not a number")?;
        let port: u16 = port.parse().map_err(|_| "MASTER_PORT: not a number")?;
        let ip = std::net::ToSocketAddrs::to_socket_addrs(&(addr.as_str(), port))
            .map_err(|e| format!("MASTER_ADDR {addr:?}: {e}"))?
            .next()
            .ok_or("MASTER_ADDR: no address")?;
        // torchrun's store port is taken: our root listens on MASTER_PORT + 1.
        let at = SocketAddr::new(ip.ip(), port.wrapping_add(1));
        let id = if r == 0 {
            bootstrap::serve(at, Some(0x7472_6368), cfg.timeout).map_err(|e| e.to_string())?
        } else {
            UniqueId {
                addr: at,
                nonce: 0x7472_6368,
            }
        };
        return Ok(Some((r, n, id)));
    }
    Ok(None)
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let a = match parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let cfg = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fabricoll-perf: {e}");
            return ExitCode::from(2);
        }
    };
    nccl_net_fabricoll::logging::init(None);
    match launched(&cfg) {
        Err(e) => {
            eprintln!("fabricoll-perf: {e}");
            ExitCode::from(2)
        }
        Ok(Some((rank, n, id))) => {
            let comm = match Comm::init_rank(n, &id, rank, &cfg) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("fabricoll-perf rank {rank}: {e}");
                    return ExitCode::from(1);
                }
            };
            if a.root >= n {
                eprintln!("fabricoll-perf: -r {} is not a rank of {n}", a.root);
                return ExitCode::from(2);
            }
            match run_rank(&a, &comm) {
                Ok(0) => ExitCode::SUCCESS,
                Ok(_) => ExitCode::from(1),
                Err(e) => {
                    eprintln!("fabricoll-perf rank {rank}: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Ok(None) => {
            // Fork the ranks ourselves: this process runs the bootstrap root.
            let id = match bootstrap::new_unique_id(bootstrap::default_bind_ip(&cfg), cfg.timeout) {
                Ok(id) => id,
                Err(e) => {
                    eprintln!("fabricoll-perf: {e}");
                    return ExitCode::from(1);
                }
            };
            let exe = std::env::current_exe().expect("own path");
            let cpus = allowed_cpus();
            let plan = bind_plan(a.bind, a.ranks, &cpus);
            match (a.bind, plan.first().copied().flatten()) {
                (Bind::RoundRobin, Some(_)) => println!(
                    "# binding: rank i on CPU i mod {} of CPUs {cpus:?} (--bind rr)",
                    cpus.len()
                ),
                (_, Some(_)) => println!(
                    "# binding: rank i on the i-th of CPUs {:?} (--bind core)",
                    &cpus[..a.ranks]
                ),
                (Bind::None, None) => println!("# binding: none (--bind none)"),
                (_, None) => {
                    println!("# binding: none ({} ranks, {} CPUs)", a.ranks, cpus.len())
                }
            }
            let mut kids = Vec::new();
            for (r, cpu) in plan.into_iter().enumerate() {
                let mut cmd = Command::new(&exe);
                cmd.args(&argv)
                    .env("FABRICOLL_RANK", r.to_string())
                    .env("FABRICOLL_NRANKS", a.ranks.to_string())
                    .env("FABRICOLL_UNIQUE_ID", id.to_hex())
                    .env_remove("RANK");
                if let Some(cpu) = cpu {
                    // SAFETY: the closure runs in the forked child before exec and makes only
                    // async-signal-safe calls (`bind_to` allocates nothing; one system call).
                    unsafe {
                        cmd.pre_exec(move || bind_to(&[cpu]));
                    }
                }
                match cmd.spawn() {
                    Ok(k) => kids.push(k),
                    Err(e) => {
                        eprintln!("fabricoll-perf: cannot start rank {r}: {e}");
                        for k in &mut kids {
                            let _ = k.kill();
                        }
                        return ExitCode::from(1);
                    }
                }
            }
            // Wait for all ranks; the first that fails takes the others down with it, rather
            // than leaving them to wait for it until FABRICOLL_TIMEOUT_MS.
            let mut ok = true;
            let mut left: Vec<(usize, std::process::Child)> =
                kids.into_iter().enumerate().collect();
            while !left.is_empty() {
                let mut i = 0;
                while i < left.len() {
                    match left[i].1.try_wait() {
                        Ok(Some(s)) => {
                            let (r, _) = left.remove(i);
                            if !s.success() {
                                eprintln!("fabricoll-perf: rank {r} exited with {s}; stopping the other ranks");
                                ok = false;
                                for (_, k) in left.iter_mut() {
                                    let _ = k.kill();
                                }
                            }
                        }
                        Ok(None) => i += 1,
                        Err(e) => {
                            eprintln!("fabricoll-perf: rank {}: {e}", left[i].0);
                            ok = false;
                            left.remove(i);
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<Args, String> {
        parse(&s.split_whitespace().map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn ranks_bind_one_per_cpu_only_when_every_rank_has_one() {
        assert_eq!(args("").expect("valid").bind, Bind::Core);
        assert_eq!(args("--bind none").expect("valid").bind, Bind::None);
        assert!(args("--bind socket").unwrap_err().contains("--bind"));
        let cpus = [2, 5, 7];
        assert_eq!(bind_plan(Bind::Core, 2, &cpus), vec![Some(2), Some(5)]);
        assert_eq!(
            bind_plan(Bind::Core, 3, &cpus),
            vec![Some(2), Some(5), Some(7)]
        );
        assert_eq!(bind_plan(Bind::Core, 4, &cpus), vec![None; 4]);
        assert_eq!(args("--bind rr").expect("valid").bind, Bind::RoundRobin);
        assert_eq!(
            bind_plan(Bind::RoundRobin, 5, &cpus),
            vec![Some(2), Some(5), Some(7), Some(2), Some(5)]
        );
        assert_eq!(bind_plan(Bind::RoundRobin, 1, &[]), vec![None]);
        assert_eq!(bind_plan(Bind::None, 2, &cpus), vec![None; 2]);
        assert_eq!(bind_plan(Bind::Core, 1, &[]), vec![None]);
        let here = allowed_cpus();
        assert!(!here.is_empty(), "this process runs on some CPU");
        assert!(here.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn the_time_is_the_mean_over_ranks_unless_a_says_otherwise() {
        assert_eq!(args("").expect("valid").average, Average::Mean);
        for (v, want) in [
            ("0", Average::Rank0),
            ("1", Average::Mean),
            ("2", Average::Min),
            ("3", Average::Max),
        ] {
            assert_eq!(args(&format!("-a {v}")).expect("valid").average, want);
            assert_eq!(
                want as u8,
                v.parse::<u8>().unwrap(),
                "nccl-tests' numbering"
            );
        }
        let e = args("-a 4").expect_err("-a 4");
        assert!(e.starts_with("-a:"), "{e}");
    }

    #[test]
    fn time_target_and_min_iters_parse() {
        let a = args("-t 0.2 -w 5 -m 3 -n 1000").expect("valid");
        assert_eq!(a.time_target, Some(0.2));
        assert_eq!((a.min_iters, a.iters, a.warmup), (3, 1000, 5));
        assert_eq!(args("-n 7").expect("valid").time_target, None);
    }

    #[test]
    fn timed_iterations_fill_the_target_within_bounds() {
        assert_eq!(timed_iterations(0.2, 0.001, 5, 1000), 200);
        assert_eq!(timed_iterations(0.2, 1e-6, 5, 1000), 1000);
        assert_eq!(timed_iterations(0.2, 0.5, 5, 1000), 5);
        assert_eq!(timed_iterations(0.2, 0.0, 5, 1000), 1000);
        assert_eq!(timed_iterations(0.2, 0.3, 1, 3), 1);
    }

    #[test]
    fn bad_time_targets_are_named() {
        for bad in ["-t 0", "-t -1", "-t nan", "-t inf", "-t x"] {
            let e = args(bad).expect_err(bad);
            assert!(e.starts_with("-t:"), "{bad}: {e}");
        }
        for bad in ["-t 1 -w 0", "-t 1 -m 0", "-t 1 -m 30 -n 20"] {
            let e = args(bad).expect_err(bad);
            assert!(e.contains("-t needs -w >= 1"), "{bad}: {e}");
        }
        assert!(args("-m x").expect_err("-m x").starts_with("-m:"));
    }
}

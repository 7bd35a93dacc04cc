//! fabricoll-sim: predicted time and bus bandwidth of every algorithm for a collective on a
//! modelled machine of any size, by running the engines' own schedules in the simulator
//! (`fabricoll::sim`), with the cost model's (`auto`'s) pick beside the simulator's best.
//! An nccl-tests-style table; each line says how long its simulation took.
use clap::Parser;
use nccl_net_fabricoll::algo::{self, Algorithm, Collective, Hosts, Options, Problem};
use nccl_net_fabricoll::cli;
use nccl_net_fabricoll::sim::{self, Bounded, Burst, Params};
use nccl_net_fabricoll::transport::DEFAULT_SLICE_BYTES;
use nccl_net_fabricoll::tune::{gbps_to_us_per_byte, Model};
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(
    name = "fabricoll-sim",
    about = "Simulate fabricoll's schedules on a modelled machine: time and busbw per algorithm"
)]
struct Args {
    /// Ranks per host: HOSTSxRANKS (512x8) or a list (3,2,1).
    #[arg(long, default_value = "2x4", value_parser = layout)]
    hosts: Layout,
    /// allreduce, allgather, reducescatter, broadcast, reduce or alltoall.
    #[arg(long, default_value = "allreduce", value_parser = cli::collective)]
    coll: Collective,
    /// Smallest size (bytes, as nccl-tests counts them: AllGather's and AllToAll's output,
    /// ReduceScatter's input).
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = cli::size)]
    min_bytes: usize,
    #[arg(short = 'e', long = "maxbytes", default_value = "64M", value_parser = cli::size)]
    max_bytes: usize,
    /// Multiply the size by this each line.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    factor: usize,
    /// Bytes per element.
    #[arg(long, default_value_t = 4)]
    elem: usize,
    /// Network latency per message (us).
    #[arg(long, default_value_t = 10.0)]
    alpha_us: f64,
    /// Network bandwidth per NIC, Gbit/s.
    #[arg(long, default_value_t = 16.0)]
    gbit: f64,
    /// Sending CPU's cost per network message (us); default alpha/2.
    #[arg(long)]
    o_us: Option<f64>,
    /// Shared-memory latency, bandwidth (GB/s) and CPU cost per message.
    #[arg(long, default_value_t = 1.0)]
    intra_alpha_us: f64,
    #[arg(long, default_value_t = 10.0)]
    intra_gbps: f64,
    #[arg(long, default_value_t = 0.5)]
    intra_o_us: f64,
    /// Reduction speed (GB/s).
    #[arg(long, default_value_t = 8.0)]
    gamma_gbps: f64,
    /// Take the parameters (and the hosts, if it names them) from the line a communicator
    /// logs after calibration with FABRICOLL_LOG=info ("calibration on N ranks ...").
    #[arg(long, value_name = "LINE")]
    calibration: Option<String>,
    /// Contention off: every rank has its own links (the closed-form model's assumption).
    #[arg(long)]
    no_contention: bool,
    /// A host's memory bandwidth for its ranks' messages (GB/s; default unlimited).
    #[arg(long)]
    mem_gbps: Option<f64>,
    /// Core oversubscription (1: none).
    #[arg(long, default_value_t = 1.0)]
    taper: f64,
    /// A token bucket of BYTES on each direction of every NIC, as Linux's tbf shapes the
    /// emulated hosts' links (scripts/netns-cluster.sh): after a pause a NIC passes up to
    /// BYTES at --burst-gbps (default none: a NIC's wire has no bucket).
    #[arg(long, value_name = "BYTES", value_parser = cli::size)]
    burst: Option<usize>,
    /// The speed of a NIC's bucketed bytes (GB/s; with --burst).
    #[arg(long, value_name = "GBPS", requires = "burst")]
    burst_gbps: Option<f64>,
    /// Local copies' speed (GB/s; default free, as the closed-form model).
    #[arg(long)]
    copy_gbps: Option<f64>,
    /// Bytes per slice of pipelined schedules (the transport's slice size).
    #[arg(long, default_value_t = DEFAULT_SLICE_BYTES, value_parser = cli::size)]
    slice: usize,
    /// Only these algorithms (comma-separated names); default every one that applies.
    #[arg(long, value_delimiter = ',', value_parser = cli::algorithm)]
    algos: Vec<Algorithm>,
    /// Time per call in a loop of CALLS calls back to back, as fabricoll-perf and nccl-tests
    /// time their loops: each rank starts its next call as soon as its part of the last is
    /// done, and shaped NICs' buckets (--burst) carry over. The simulation of CALLS calls less
    /// that of one, over CALLS - 1. Default 1: one call alone, every rank starting together.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    calls: u32,
    /// Skip a schedule estimated to have more steps than this (memory: about 100 B a step).
    #[arg(long, default_value_t = 20_000_000)]
    max_steps: usize,
    /// Simulate every schedule, even one whose lower bound (critical path, busiest CPU,
    /// busiest link) shows it slower than the best simulated so far at its size.
    #[arg(long)]
    no_bound: bool,
    /// Write the plan of the one algorithm in --algos at --minbytes to FILE as a GOAL schedule
    /// (LogGOPSim, ATLAHS) instead of the table; its options (slices, levels) are the table's.
    #[arg(long, value_name = "FILE")]
    goal: Option<std::path::PathBuf>,
}

/// Ranks per host.
#[derive(Clone, Debug)]
struct Layout(Vec<usize>);

fn layout(s: &str) -> Result<Layout, String> {
    cli::hosts(s).map(Layout)
}

/// The problem of `bytes` as nccl-tests sizes it.
fn problem(c: Collective, n: usize, bytes: usize, elem: usize) -> Problem {
    Problem::new(c, n, cli::counts(c, bytes, elem, n).1)
}

/// One simulated schedule.
struct Run {
    algo: Algorithm,
    opts: Options,
    us: f64,
    steps: usize,
    secs: f64,
}

/// What became of one candidate at one size.
enum Tried {
    Run(Run),
    /// Estimated over `--max-steps`: not built.
    TooBig,
    /// Built, and its lower bound is over the best simulated time at its size (by more than
    /// `BOUND_MARGIN`): it cannot be the best, so it was not simulated.
    Slower {
        bound_us: f64,
        steps: usize,
        secs: f64,
    },
}

/// A candidate is left out only when its lower bound exceeds the best simulated time by this
/// much: the event loop takes instants within `share::TIME_EPS` as one, so a simulated time may
/// fall a hair under the exact bound.
const BOUND_MARGIN: f64 = 1e-3;

/// Steps of `algo`'s schedule for `p`, estimated from the same collective on 32 and 64 ranks
/// in hosts of the same size (the growth between the two extrapolated), without building it.
fn estimate_steps(p: &Problem, a: Algorithm, opts: &Options, per_host: usize) -> Option<f64> {
    if p.nranks <= 64 {
        return None;
    }
    let steps = |n: usize| -> Option<f64> {
        let scaled = Problem::new(p.coll, n, scaled_count(p, n));
        let o = Options {
            hosts: Hosts::blocks(n, per_host),
            ..*opts
        };
        let s = algo::build(scaled, a, &o).ok()?;
        Some(s.ranks.iter().map(Vec::len).sum::<usize>() as f64)
    };
    let (s32, s64) = (steps(32)?, steps(64)?);
    let k = (s64 / s32).log2().max(1.0);
    Some(s64 * (p.nranks as f64 / 64.0).powf(k))
}

/// The count on `n` ranks that keeps each rank's share of the data (the per-rank count of
/// AllGather, ReduceScatter and AllToAll; the whole buffer's share of the others).
fn scaled_count(p: &Problem, n: usize) -> usize {
    match p.coll {
        Collective::AllReduce | Collective::Broadcast | Collective::Reduce => {
            (p.count / p.nranks * n).max(1)
        }
        _ => p.count,
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fabricoll-sim: {e}");
            ExitCode::FAILURE
        }
    }
}

fn model_of(args: &Args) -> Result<(Model, Vec<usize>), String> {
    if let Some(line) = &args.calibration {
        let (m, sizes) = sim::parse_calibration(line).map_err(|e| format!("--calibration: {e}"))?;
        return Ok((
            m.with_slice(args.slice),
            sizes.unwrap_or_else(|| args.hosts.0.clone()),
        ));
    }
    let mut m = Model::new(args.alpha_us, args.gbit / 8.0, args.gamma_gbps).with_slice(args.slice);
    m.inter_o_us = Some(args.o_us.unwrap_or(args.alpha_us / 2.0));
    m.intra.alpha_us = args.intra_alpha_us;
    m.intra.beta_us_per_byte = gbps_to_us_per_byte(args.intra_gbps);
    m.intra.o_us = args.intra_o_us;
    Ok((m, args.hosts.0.clone()))
}

fn run(args: &Args) -> Result<(), String> {
    if args.elem == 0 {
        return Err("--elem: must be at least 1".into());
    }
    if args.factor < 2 {
        return Err("--stepfactor: must be at least 2".into());
    }
    if args.min_bytes > args.max_bytes {
        return Err("--minbytes: larger than --maxbytes".into());
    }
    let (model, sizes) = model_of(args)?;
    let n: usize = sizes.iter().sum();
    let labels: Vec<usize> = sizes
        .iter()
        .enumerate()
        .flat_map(|(h, &s)| std::iter::repeat_n(h, s))
        .collect();
    let hosts = Hosts::from_labels(&labels);
    let mut params = Params::from_model(&model, hosts);
    params.contention = !args.no_contention;
    params.mem_us_per_byte = args.mem_gbps.map(gbps_to_us_per_byte);
    params.taper = args.taper;
    params.copy_us_per_byte = args.copy_gbps.map_or(0.0, gbps_to_us_per_byte);
    params.burst = match (args.burst, args.burst_gbps) {
        (Some(bytes), Some(gbps)) => Some(Burst {
            bytes: bytes as f64,
            peak_us_per_byte: gbps_to_us_per_byte(gbps),
        }),
        (Some(_), None) => return Err("--burst: needs --burst-gbps, the bucket's speed".into()),
        _ => None,
    };
    if params.burst.is_some() && !params.contention {
        return Err("--burst: shapes the hosts' NICs, which --no-contention leaves out".into());
    }
    params.validate()?;
    let per_host = sizes.iter().copied().max().unwrap_or(1);
    let algos: Vec<Algorithm> = if args.algos.is_empty() {
        Algorithm::ALL.to_vec()
    } else {
        args.algos.clone()
    };
    let algos: Vec<Algorithm> = algos
        .into_iter()
        .filter(|a| algo::supports(*a, args.coll))
        .collect();
    if algos.is_empty() {
        return Err(format!("--algos: none implements {:?}", args.coll));
    }
    if let Some(path) = &args.goal {
        return export_goal(path, args, &algos, &model, hosts, &params, n);
    }
    println!(
        "# fabricoll-sim: {:?} on {n} ranks, {} hosts of {} ranks; {}; contention {}, taper {}, \
         memory {}, slices of {} B{}{}",
        args.coll,
        sizes.len(),
        if sizes.iter().all(|&s| s == sizes[0]) {
            sizes[0].to_string()
        } else {
            format!("{sizes:?}")
        },
        model.levels_text(),
        if params.contention { "on" } else { "off" },
        params.taper,
        args.mem_gbps
            .map_or("unlimited".into(), |g| format!("{g} GB/s")),
        args.slice,
        params.burst.map_or(String::new(), |b| format!(
            ", NICs shaped with buckets of {} B at {} GB/s",
            b.bytes,
            1e-3 / b.peak_us_per_byte
        )),
        if args.calls > 1 {
            format!("; time per call of {} calls back to back", args.calls)
        } else {
            String::new()
        }
    );
    println!(
        "# {:>12} {:>12}  {:<20} {:>12} {:>10} {:>10} {:>10} {:>8}  mark",
        "size(B)", "count", "algorithm", "time(us)", "algbw", "busbw", "steps", "run(s)"
    );
    let started = Instant::now();
    let mut bytes = args.min_bytes.max(args.elem);
    let mut worst: Vec<String> = Vec::new();
    loop {
        let p = problem(args.coll, n, bytes, args.elem);
        let base = Options {
            slice: (args.slice / args.elem).max(1),
            hosts,
            ..Options::default()
        };
        let (auto_algo, auto_opts) = model.choose(&p, args.elem, base);
        // Auto's pick first (its time is needed whatever it is), then the others in the
        // order of their predicted times, so that the best is usually simulated early and
        // the bound leaves out the rest.
        let mut cands: Vec<(Algorithm, Options, f64)> = algos
            .iter()
            .map(|&a| {
                let opts = options_for(a, &p, args, &model, hosts);
                let predicted = model.predict_on(a, &p, args.elem, &opts);
                (a, opts, predicted.unwrap_or(f64::INFINITY))
            })
            .collect();
        let is_auto = |c: &(Algorithm, Options, f64)| c.0 == auto_algo && c.1 == auto_opts;
        if !cands.iter().any(is_auto) {
            cands.push((auto_algo, auto_opts, f64::NEG_INFINITY));
        }
        let mut order: Vec<usize> = (0..cands.len()).collect();
        order.sort_by(|&x, &y| {
            let key = |i: usize| (!is_auto(&cands[i]), cands[i].2);
            let (kx, ky) = (key(x), key(y));
            kx.0.cmp(&ky.0).then(kx.1.total_cmp(&ky.1))
        });
        let mut tried: Vec<Option<Tried>> = (0..cands.len()).map(|_| None).collect();
        let mut best_us = f64::INFINITY;
        for &i in &order {
            let (a, opts, _) = cands[i];
            // The lower bound prices the links at their rates: a bucket's bytes beat it.
            let cutoff = if is_auto(&cands[i]) || args.no_bound || params.burst.is_some() {
                f64::INFINITY
            } else {
                best_us * (1.0 + BOUND_MARGIN)
            };
            let t = simulate_one(&p, a, opts, args, &params, per_host, cutoff)
                .map_err(|e| format!("{a} at {bytes} B: {e}"))?;
            if let Tried::Run(r) = &t {
                best_us = best_us.min(r.us);
            }
            tried[i] = Some(t);
        }
        let shown = cli::counts(args.coll, bytes, args.elem, n).0 * args.elem;
        let mut runs: Vec<Run> = Vec::new();
        let mut skipped: Vec<String> = Vec::new();
        let mut slower: Vec<(String, f64, usize, f64)> = Vec::new();
        let mut auto = None;
        for (i, t) in tried.into_iter().enumerate() {
            let (a, opts, _) = cands[i];
            let label = name(a, &opts);
            match t.expect("every candidate is tried") {
                Tried::Run(r) => {
                    if is_auto(&cands[i]) {
                        auto = Some(runs.len());
                    }
                    runs.push(r);
                }
                Tried::TooBig if is_auto(&cands[i]) => {
                    worst.push(format!(
                        "{shown} B: auto {label} not simulated (over --max-steps)"
                    ));
                    skipped.push(format!("{label} (auto)"));
                }
                Tried::TooBig => skipped.push(label),
                Tried::Slower {
                    bound_us,
                    steps,
                    secs,
                } => slower.push((label, bound_us, steps, secs)),
            }
        }
        let best = (0..runs.len()).min_by(|&x, &y| runs[x].us.total_cmp(&runs[y].us));
        for (i, r) in runs.iter().enumerate() {
            let algbw = shown as f64 / r.us / 1e3;
            let mut mark = String::new();
            if Some(i) == auto {
                mark.push_str("auto ");
            }
            if Some(i) == best {
                mark.push_str("best");
            }
            println!(
                "  {:>12} {:>12}  {:<20} {:>12.2} {:>10.3} {:>10.3} {:>10} {:>8.4}  {}",
                shown,
                p.count,
                name(r.algo, &r.opts),
                r.us,
                algbw,
                algbw * cli::bus_factor(args.coll, n),
                r.steps,
                r.secs,
                mark.trim_end()
            );
        }
        for (label, bound_us, steps, secs) in &slower {
            println!(
                "  {:>12} {:>12}  {:<20} {:>12} {:>10} {:>10} {:>10} {:>8.4}  bounded out",
                shown,
                p.count,
                label,
                format!(">{bound_us:.2}"),
                "-",
                "-",
                steps,
                secs
            );
        }
        if !skipped.is_empty() {
            println!(
                "  {:>12} {:>12}  skipped (over --max-steps): {}",
                shown,
                p.count,
                skipped.join(", ")
            );
        }
        if let (Some(a), Some(b)) = (auto, best) {
            let slower = runs[a].us / runs[b].us - 1.0;
            if slower > 0.10 {
                worst.push(format!(
                    "{shown} B: auto {} {:.1} us, best {} {:.1} us (+{:.0} %)",
                    name(runs[a].algo, &runs[a].opts),
                    runs[a].us,
                    name(runs[b].algo, &runs[b].opts),
                    runs[b].us,
                    slower * 100.0
                ));
            }
        }
        match bytes.checked_mul(args.factor) {
            Some(b) if b <= args.max_bytes => bytes = b,
            _ => break,
        }
    }
    if worst.is_empty() {
        println!("# auto's pick is within 10 % of the simulator's best at every size");
    } else {
        println!(
            "# auto's pick more than 10 % slower than the simulator's best (or not simulated):"
        );
        for w in &worst {
            println!("#   {w}");
        }
    }
    println!(
        "# simulated in {:.2} s (one core)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The options the table gives `a` for `p` (the cost model's slicing, or levels for the
/// two-level algorithms).
fn options_for(a: Algorithm, p: &Problem, args: &Args, model: &Model, hosts: Hosts) -> Options {
    let base = Options {
        slice: (args.slice / args.elem).max(1),
        hosts,
        ..Options::default()
    };
    if matches!(a, Algorithm::Hier | Algorithm::Swizzle) {
        model.levels_for(a, p, args.elem, base)
    } else {
        model.eager_slicing(a, p, args.elem, base)
    }
}

/// `--goal`: one algorithm's plan at --minbytes, written as GOAL, and its simulated time.
fn export_goal(
    path: &std::path::Path,
    args: &Args,
    algos: &[Algorithm],
    model: &Model,
    hosts: Hosts,
    params: &Params,
    n: usize,
) -> Result<(), String> {
    let [a] = algos else {
        return Err(format!(
            "--algos: --goal writes one algorithm's plan; name one that implements {:?}",
            args.coll
        ));
    };
    let bytes = args.min_bytes.max(args.elem);
    let p = problem(args.coll, n, bytes, args.elem);
    let opts = options_for(*a, &p, args, model, hosts);
    let s = algo::build(p, *a, &opts).map_err(|e| format!("{a}: {e}"))?;
    let file =
        std::fs::File::create(path).map_err(|e| format!("--goal {}: {e}", path.display()))?;
    let mut w = std::io::BufWriter::new(file);
    sim::write_goal(&s, args.elem, params, &mut w)
        .and_then(|()| std::io::Write::flush(&mut w))
        .map_err(|e| format!("--goal {}: {e}", path.display()))?;
    let out = sim::simulate(&s, args.elem, hosts, params)?;
    let run = Run {
        algo: *a,
        opts,
        us: out.time_us,
        steps: out.steps,
        secs: 0.0,
    };
    println!(
        "# wrote {}: {} {:?} on {n} ranks, {} B ({} elements), {} steps; simulated here {:.2} us",
        path.display(),
        name(run.algo, &run.opts),
        args.coll,
        cli::counts(args.coll, bytes, args.elem, n).0 * args.elem,
        p.count,
        out.steps,
        out.time_us
    );
    Ok(())
}

/// The name with its levels for hier and swizzle.
fn name(a: Algorithm, opts: &Options) -> String {
    match a {
        Algorithm::Hier => format!("hier({}x{})", opts.intra, opts.inter),
        Algorithm::Swizzle => format!("swizzle({})", opts.intra),
        a => a.to_string(),
    }
}

/// Build and simulate `a`'s schedule, unless it is estimated over `--max-steps` or its lower
/// bound exceeds `cutoff_us`.
fn simulate_one(
    p: &Problem,
    a: Algorithm,
    opts: Options,
    args: &Args,
    params: &Params,
    per_host: usize,
    cutoff_us: f64,
) -> Result<Tried, String> {
    let t0 = Instant::now();
    if let Some(est) = estimate_steps(p, a, &opts, per_host) {
        if est > args.max_steps as f64 {
            return Ok(Tried::TooBig);
        }
    }
    let s = algo::build(*p, a, &opts).map_err(|e| e.to_string())?;
    let secs = || t0.elapsed().as_secs_f64();
    if args.calls > 1 {
        // The loop's time per call: no bound applies (calls may overlap).
        let one = sim::simulate(&s, args.elem, opts.hosts, params)?;
        let k = args.calls as usize;
        let all = sim::simulate(&sim::back_to_back(&s, k), args.elem, opts.hosts, params)?;
        return Ok(Tried::Run(Run {
            algo: a,
            opts,
            us: sim::per_call_us(one.time_us, all.time_us, k),
            steps: one.steps,
            secs: secs(),
        }));
    }
    Ok(
        match sim::simulate_unless_slower(&s, args.elem, opts.hosts, params, cutoff_us)? {
            Bounded::Simulated(out) => Tried::Run(Run {
                algo: a,
                opts,
                us: out.time_us,
                steps: out.steps,
                secs: secs(),
            }),
            Bounded::Slower { bound_us, steps } => Tried::Slower {
                bound_us,
                steps,
                secs: secs(),
            },
        },
    )
}

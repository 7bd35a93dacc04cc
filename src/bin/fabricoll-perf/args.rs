//! Command line of fabricoll-perf: nccl-tests' flags (`-b -e -f -d -o -n -w -c -r -a`), parsed
//! with clap, plus the checks that involve several flags.
use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use nccl_net_fabricoll::algo::{Algorithm, Collective};
use nccl_net_fabricoll::cli;
use nccl_net_fabricoll::compress::{Format, DEFAULT_BLOCK, MAX_BLOCK, NAMES};
use nccl_net_fabricoll::reduce::{DataType, RedOp};

/// nccl-tests-style benchmark of the collective engines. Without a launcher it forks the
/// ranks itself; under one (torchrun, mpirun, mpiexec, srun, or FABRICOLL_RANK and
/// FABRICOLL_NRANKS; ranks meet through FABRICOLL_UNIQUE_ID, FABRICOLL_ROOT, FABRICOLL_ROOT_FILE
/// or torchrun's MASTER_ADDR and MASTER_PORT) it runs as one rank.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "fabricoll-perf",
    // A flag given twice takes its last value (scripts append `-n 3` after `-n 2`).
    args_override_self = true,
    after_help = "Sizes accept K, M, G suffixes. Rank 0 prints one row per size: size, count, \
                  type, redop, algorithm, time, algbw, busbw (as nccl-tests defines them) and #wrong \
                  (with --compress, and the error against the uncompressed result)."
)]
pub struct Args {
    /// Ranks to fork (ignored under a launcher).
    #[arg(short = 'R', long, default_value_t = 2, value_parser = clap::value_parser!(usize))]
    pub ranks: usize,
    /// Collective: allreduce allgather reducescatter broadcast reduce alltoall.
    #[arg(long, default_value = "allreduce", value_parser = cli::collective)]
    pub coll: Collective,
    /// Algorithm: auto or one of the library's (ring bidir_ring mesh mesh1 rdh rd tree dbtree
    /// bruck pairwise hier swizzle); auto lets the library choose.
    #[arg(long, default_value = "auto", value_parser = algorithm)]
    pub algo: Auto,
    /// Smallest size in bytes.
    #[arg(short = 'b', long = "minbytes", value_name = "BYTES", default_value = "8", value_parser = cli::size)]
    pub min: usize,
    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", value_name = "BYTES", default_value = "64M", value_parser = cli::size)]
    pub max: usize,
    /// Size multiplier from one row to the next (at least 2).
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    pub factor: usize,
    /// Data type: int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 fp8_e4m3
    /// fp8_e5m2.
    #[arg(short = 'd', long = "datatype", default_value = "float", value_parser = datatype)]
    pub dtype: DataType,
    /// Reduction: sum prod max min avg band bor bxor (the bitwise ops for integer types only).
    #[arg(short = 'o', long = "op", default_value = "sum", value_parser = redop)]
    pub op: RedOp,
    /// Timed iterations per size (the most, with -t).
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    pub iters: usize,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    pub warmup: usize,
    /// Time each size for about SECONDS, with between -m and -n iterations, the count
    /// estimated from the slowest rank's warm-up (needs -w >= 1), as `mpi_coll_bench -t`.
    #[arg(short = 't', long = "time", value_name = "SECONDS", value_parser = seconds,
          allow_negative_numbers = true)]
    pub time_target: Option<f64>,
    /// A barrier before each timed iteration, which is timed alone, as OSU's benchmarks do: the
    /// time of one call on links the last one left idle, which a simulation of one call
    /// predicts. Without it the calls run back to back (nccl-tests), and a rank that has its
    /// result starts the next one while others still finish the last.
    #[arg(long)]
    pub barrier: bool,
    /// Fewest timed iterations per size with -t.
    #[arg(short = 'm', long = "min_iters", default_value_t = 5)]
    pub min_iters: usize,
    /// Check every element against a reference: 1 (any value but 0) or 0.
    #[arg(short = 'c', long = "check", default_value = "1", value_parser = check,
          action = clap::ArgAction::Set)]
    pub check: bool,
    /// Root of broadcast and reduce.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    pub root: usize,
    /// The input sits where the output goes (NCCL's in-place layout).
    #[arg(long = "inplace")]
    pub in_place: bool,
    /// Binding of the ranks forked here: core (one per CPU when every rank has one, as mpirun
    /// binds 2 ranks), rr (rank r on CPU r mod the CPU count; mpirun --bind-to
    /// core:overload-allowed) or none (wherever the scheduler puts them).
    #[arg(long, default_value = "core", value_parser = bind)]
    pub bind: Bind,
    /// The time reported: rank 0's (0), the mean over ranks (1, as nccl-tests), the fastest
    /// rank's (2) or the slowest rank's (3) mean per iteration.
    #[arg(short = 'a', long = "average", default_value = "1", value_parser = average)]
    pub average: Average,
    /// Compress the timed calls: off bf16 fp16 fp8e4m3 fp8e5m2 int8 int4 (allreduce with sum or
    /// avg, reducescatter, allgather; float, half, bfloat16). An `error` column gives the
    /// largest difference from the uncompressed result over the largest magnitude of that
    /// result; -c checks the uncompressed run.
    #[arg(long, value_name = "FMT", value_parser = format)]
    pub compress: Option<Format>,
    /// Elements per scale of --compress.
    #[arg(long = "compress-block", value_name = "K", default_value_t = DEFAULT_BLOCK,
          value_parser = block)]
    pub compress_block: usize,
    /// Buffers in device memory: cuda (the local rank's device, local rank modulo the
    /// devices), cuda:N, or emulated (a test tool: CI's stand-in for a GPU). The calls go
    /// through the C API's device path: staged through page-locked host memory.
    #[arg(long, value_name = "DEVICE", value_parser = super::device::parse)]
    pub device: Option<super::device::Which>,
    /// With --device: stream-ordered calls on one stream of each rank, the iterations
    /// enqueued back to back and timed until the stream has passed the last.
    #[arg(long)]
    pub stream: bool,
}

fn format(s: &str) -> Result<Format, String> {
    Format::parse(&s.to_ascii_lowercase()).ok_or_else(|| format!("expected one of {NAMES}"))
}

fn block(s: &str) -> Result<usize, String> {
    s.parse::<usize>()
        .ok()
        .filter(|b| (1..=MAX_BLOCK).contains(b))
        .ok_or_else(|| format!("expected an integer 1..={MAX_BLOCK}"))
}

/// `--algo`: `None` is auto (the library chooses).
pub type Auto = Option<Algorithm>;

/// How the ranks' per-iteration times make the time of a row: nccl-tests' `-a` (0 rank 0,
/// 1 the mean over ranks, its default, 2 the fastest rank, 3 the slowest). `mpi_coll_bench`,
/// the Open MPI side of `scripts/bench-coll.sh`, reports the mean over ranks too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Average {
    Rank0,
    Mean,
    Min,
    Max,
}

impl Average {
    pub fn name(self) -> &'static str {
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
pub enum Bind {
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

/// Parses the command line (`argv` without the program name). An error (`--help` too) is
/// clap's, naming the flag, or the check across flags that failed; `Error::exit` prints it.
pub fn parse(argv: &[String]) -> Result<Args, clap::Error> {
    let program = std::iter::once("fabricoll-perf".to_string());
    let a = Args::try_parse_from(program.chain(argv.iter().cloned()))?;
    validate(&a).map_err(|m| Args::command().error(ErrorKind::ValueValidation, m))?;
    Ok(a)
}

/// The rules that involve several flags, which clap does not check.
fn validate(a: &Args) -> Result<(), String> {
    if a.ranks == 0 || a.factor < 2 || a.min > a.max || a.iters == 0 {
        return Err(
            "invalid arguments (--ranks >= 1, -f >= 2, -b <= -e, -n >= 1); see --help".to_string(),
        );
    }
    if a.time_target.is_some() && (a.warmup == 0 || a.min_iters == 0 || a.min_iters > a.iters) {
        return Err(
            "invalid arguments: -t needs -w >= 1 (the estimate) and 1 <= -m <= -n; see --help"
                .to_string(),
        );
    }
    if a.stream && a.device.is_none() {
        return Err("invalid arguments: --stream needs --device; see --help".to_string());
    }
    Ok(())
}

fn algorithm(s: &str) -> Result<Auto, String> {
    if s == "auto" {
        return Ok(None);
    }
    cli::algorithm(s)
        .map(Some)
        .map_err(|e| format!("{e}, or auto"))
}

fn datatype(s: &str) -> Result<DataType, String> {
    DataType::from_name(s).ok_or_else(|| format!("unknown type {s:?}"))
}

fn redop(s: &str) -> Result<RedOp, String> {
    RedOp::from_name(s).ok_or_else(|| format!("unknown op {s:?}"))
}

fn seconds(s: &str) -> Result<f64, String> {
    let t: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(t.is_finite() && t > 0.0) {
        return Err(format!("{t} is not a positive number of seconds"));
    }
    Ok(t)
}

fn check(s: &str) -> Result<bool, String> {
    Ok(s != "0")
}

fn bind(s: &str) -> Result<Bind, String> {
    match s {
        "core" => Ok(Bind::Core),
        "rr" => Ok(Bind::RoundRobin),
        "none" => Ok(Bind::None),
        o => Err(format!("{o:?} is not core, rr or none")),
    }
}

fn average(s: &str) -> Result<Average, String> {
    match s {
        "0" => Ok(Average::Rank0),
        "1" => Ok(Average::Mean),
        "2" => Ok(Average::Min),
        "3" => Ok(Average::Max),
        o => Err(format!(
            "{o:?} is not 0 (rank 0), 1 (mean), 2 (min) or 3 (max)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<Args, String> {
        parse(&s.split_whitespace().map(String::from).collect::<Vec<_>>())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_are_nccl_tests_ones() {
        let a = args("").expect("valid");
        assert_eq!((a.ranks, a.min, a.max, a.factor), (2, 8, 64 << 20, 2));
        assert_eq!((a.iters, a.warmup, a.min_iters, a.root), (20, 5, 5, 0));
        assert_eq!(
            (a.coll, a.algo, a.dtype, a.op),
            (Collective::AllReduce, None, DataType::Float32, RedOp::Sum)
        );
        assert!(a.check && !a.in_place && a.time_target.is_none());
        assert_eq!((a.bind, a.average), (Bind::Core, Average::Mean));
    }

    #[test]
    fn every_flag_the_scripts_pass_parses() {
        let a = args(
            "--ranks 4 --coll reducescatter --algo ring -b 4 -e 64K -f 8 -n 2 -w 1 -c 1 -d half \
             -o avg --inplace -r 3 -t 0.0001 -m 1 --bind rr -a 3",
        )
        .expect("valid");
        assert_eq!(
            (a.ranks, a.coll, a.min, a.max, a.factor),
            (4, Collective::ReduceScatter, 4, 64 << 10, 8)
        );
        assert_eq!(a.algo, Some(Algorithm::Ring));
        assert_eq!((a.dtype, a.op, a.root), (DataType::Float16, RedOp::Avg, 3));
        assert!(a.in_place && a.check);
        assert_eq!(a.time_target, Some(0.0001));
        let b = args("-R 3 --coll bcast --minbytes 1K --maxbytes 1G --stepfactor 4 --datatype double \
                      --op max --iters 9 --warmup_iters 2 --check 0 --root 1 --min_iters 2 --average 0")
            .expect("valid");
        assert_eq!(
            (b.ranks, b.coll, b.min, b.max, b.factor),
            (3, Collective::Broadcast, 1024, 1 << 30, 4)
        );
        assert_eq!((b.iters, b.warmup, b.min_iters, b.root), (9, 2, 2, 1));
        assert!(!b.check);
        assert_eq!(
            (b.dtype, b.op, b.average),
            (DataType::Float64, RedOp::Max, Average::Rank0)
        );
        assert_eq!(
            args("--coll reduce_scatter").expect("valid").coll,
            Collective::ReduceScatter
        );
    }

    #[test]
    fn errors_name_the_flag() {
        for (bad, flag) in [
            ("--coll gather", "--coll"),
            ("--algo nope", "--algo"),
            ("-b 1X", "--minbytes"),
            ("-d float7", "--datatype"),
            ("-o nope", "--op"),
            ("--bind socket", "--bind"),
            ("-a 4", "--average"),
            ("--ranks x", "--ranks"),
            ("-n x", "--iters"),
        ] {
            let e = args(bad).expect_err(bad);
            assert!(e.contains(flag), "{bad}: {e}");
        }
        assert!(args("--frobnicate")
            .expect_err("unknown")
            .contains("--frobnicate"));
        assert!(args("-f 1").expect_err("-f 1").contains("-f >= 2"));
        assert!(args("-b 2K -e 1K")
            .expect_err("-b > -e")
            .contains("-b <= -e"));
    }

    #[test]
    fn the_time_is_the_mean_over_ranks_unless_a_says_otherwise() {
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
    }

    #[test]
    fn time_target_and_min_iters_parse() {
        let a = args("-t 0.2 -w 5 -m 3 -n 1000").expect("valid");
        assert_eq!(a.time_target, Some(0.2));
        assert_eq!((a.min_iters, a.iters, a.warmup), (3, 1000, 5));
        assert_eq!(args("-n 7").expect("valid").time_target, None);
        let last = args("-n 2 -w 1 -t 0.0001 -m 1 -n 3").expect("a repeated flag");
        assert_eq!(last.iters, 3, "the last value wins");
    }

    #[test]
    fn bad_time_targets_are_named() {
        for bad in ["-t 0", "-t -1", "-t nan", "-t inf", "-t x"] {
            let e = args(bad).expect_err(bad);
            assert!(e.contains("--time"), "{bad}: {e}");
        }
        for bad in ["-t 1 -w 0", "-t 1 -m 0", "-t 1 -m 30 -n 20"] {
            let e = args(bad).expect_err(bad);
            assert!(e.contains("-t needs -w >= 1"), "{bad}: {e}");
        }
        assert!(args("-m x").expect_err("-m x").contains("--min_iters"));
    }
}

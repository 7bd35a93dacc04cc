//! `fabricoll-perf --device`: the benchmark on device buffers, here on the emulated device
//! (whose memory the host cannot touch, so a host access to a buffer would kill a rank):
//! every collective blocking and stream-ordered, in and out of place, each row checked
//! (#wrong 0); compressed calls on device buffers; and the flags' misuse refused with a
//! message naming the flag. On a GPU,
//! `--device cuda` runs the same (scripts/gpu-tests.sh).
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn perf(args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fabricoll-perf"));
    c.args(args)
        .env_remove("FABRICOLL_RANK")
        .env_remove("FABRICOLL_NRANKS")
        .env("FABRICOLL_PROVIDER", "shm")
        .env("FABRICOLL_TIMEOUT_MS", "60000");
    let t = Instant::now();
    let out = c.output().expect("fabricoll-perf runs");
    // Not a deadline on the benchmark (its calls have the communicator's), a report of a hang.
    assert!(
        t.elapsed() < Duration::from_secs(600),
        "fabricoll-perf {args:?} took {:?}",
        t.elapsed()
    );
    out
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn every_collective_on_emulated_device_buffers_checks_out() {
    let colls = [
        "allreduce",
        "allgather",
        "reducescatter",
        "broadcast",
        "reduce",
        "alltoall",
    ];
    for (i, coll) in colls.iter().enumerate() {
        for stream in [false, true] {
            let in_place = (i + stream as usize) % 2 == 1;
            let ranks = if i % 2 == 0 { "2" } else { "3" };
            let mut args = vec![
                "--ranks", ranks, "--coll", coll, "--device", "emulated", "-b", "8", "-e", "2M",
                "-f", "64", "-n", "2", "-w", "1", "-r", "1",
            ];
            if stream {
                args.push("--stream");
            }
            if in_place {
                args.push("--inplace");
            }
            let o = perf(&args);
            let t = text(&o);
            assert!(o.status.success(), "{args:?}:\n{t}");
            assert!(
                t.contains("# Out of bounds values : 0 OK"),
                "{args:?}:\n{t}"
            );
            assert!(t.contains("# buffers: device memory"), "{args:?}:\n{t}");
            // Rows of the table (stdout; a busy machine may add warnings on stderr).
            let rows = String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| {
                    let w: Vec<&str> = l.split_whitespace().collect();
                    w.len() >= 9 && w[0].parse::<u64>().is_ok()
                })
                .count();
            // 8 B, 512 B, 32 KiB, 2 MiB (rounded to whole elements per rank).
            assert_eq!(rows, 4, "{args:?}:\n{t}");
        }
    }
}

#[test]
fn device_flags_misused_are_refused_naming_the_flag() {
    let o = perf(&["--stream"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--stream needs --device"), "{}", text(&o));
    let o = perf(&["--device", "gpu"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("not a device"), "{}", text(&o));
}

/// Each row's size and `error` column (the last) of a `--compress` run.
fn errors(o: &Output) -> Vec<(u64, String)> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let size = w.first()?.parse::<u64>().ok()?;
            (w.len() >= 10).then(|| (size, w[w.len() - 1].to_string()))
        })
        .collect()
}

/// `--compress` on device buffers: the device calls' slices run with the call's own format
/// (the communicator compresses nothing), so every row reports the host run's error against
/// the uncompressed result, to the digit, and that error is not zero.
#[test]
fn compressed_calls_on_emulated_device_buffers_match_the_host_runs() {
    for coll in ["allreduce", "reducescatter", "allgather"] {
        let base = [
            "--ranks",
            "3",
            "--coll",
            coll,
            "--compress",
            "int8",
            "-b",
            "1K",
            "-e",
            "4M",
            "-f",
            "64",
            "-n",
            "2",
            "-w",
            "1",
        ];
        let host = perf(&base);
        assert!(host.status.success(), "{coll}:\n{}", text(&host));
        let want = errors(&host);
        assert_eq!(want.len(), 3, "{coll}:\n{}", text(&host));
        for (_, e) in &want {
            let e: f64 = e.parse().unwrap();
            assert!(e > 0.0 && e < 0.01, "{coll}: error {e}\n{}", text(&host));
        }
        for extra in [
            &["--device", "emulated"][..],
            &["--device", "emulated", "--stream"],
        ] {
            let args: Vec<&str> = base.iter().chain(extra).copied().collect();
            let o = perf(&args);
            assert!(o.status.success(), "{args:?}:\n{}", text(&o));
            assert_eq!(errors(&o), want, "{args:?}:\n{}", text(&o));
        }
    }
}

#[test]
fn device_cuda_without_a_driver_says_so() {
    if nccl_net_fabricoll::cuda::probe().driver().is_some() {
        // A machine with a GPU runs the benchmark for real in scripts/gpu-tests.sh.
        return;
    }
    let o = perf(&["--ranks", "2", "--device", "cuda", "-b", "8", "-e", "8"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("--device cuda"), "{}", text(&o));
}

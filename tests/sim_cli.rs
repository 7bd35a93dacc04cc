//! fabricoll-sim's table: every applicable algorithm at every size, auto's pick and the best
//! marked; bad arguments fail naming the argument.
use std::process::Command;

fn sim(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_fabricoll-sim"))
        .args(args)
        .output()
        .expect("fabricoll-sim runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn table_has_every_algorithm_auto_and_best() {
    let (ok, out, err) = sim(&[
        "--hosts",
        "3,2,1",
        "--coll",
        "allgather",
        "-b",
        "768",
        "-e",
        "48K",
        "-f",
        "8",
    ]);
    assert!(ok, "{err}");
    let sizes = ["768", "6144", "49152"];
    for s in sizes {
        for a in [
            "ring",
            "bidir_ring",
            "mesh",
            "rdh",
            "bruck",
            "hier(",
            "swizzle(",
        ] {
            assert!(
                out.lines()
                    .any(|l| l.split_whitespace().next() == Some(s) && l.contains(a)),
                "no {a} line at {s} B:\n{out}"
            );
        }
        let marked = |m: &str| {
            out.lines()
                .filter(|l| l.split_whitespace().next() == Some(s) && l.contains(m))
                .count()
        };
        assert_eq!(marked("auto"), 1, "{out}");
        assert_eq!(marked("best"), 1, "{out}");
    }
    assert!(out.contains("# simulated in"), "{out}");
}

#[test]
fn bad_arguments_name_the_argument() {
    let (ok, _, err) = sim(&["--hosts", "0x4"]);
    assert!(!ok && err.contains("hosts"), "{err}");
    let (ok, _, err) = sim(&["--taper", "0.5"]);
    assert!(!ok && err.contains("taper"), "{err}");
    let (ok, _, err) = sim(&["--calibration", "alpha 3 us"]);
    assert!(!ok && err.contains("--calibration"), "{err}");
}

/// The time of `algo` at `bytes` in fabricoll-sim's table run with `extra`.
fn time_of(algo: &str, bytes: &str, extra: &[&str]) -> f64 {
    let mut args = vec![
        "--hosts",
        "1,1,1,1",
        "--gbit",
        "1",
        "--alpha-us",
        "20",
        "--no-bound",
        "--algos",
        algo,
        "-b",
        bytes,
        "-e",
        bytes,
    ];
    args.extend_from_slice(extra);
    let (ok, out, err) = sim(&args);
    assert!(ok, "{err}");
    let row = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(bytes) && l.contains(algo))
        .unwrap_or_else(|| panic!("no {algo} row:\n{out}"));
    row.split_whitespace()
        .nth(3)
        .unwrap()
        .parse()
        .expect("time")
}

/// Shaped NICs pass a bucket at their peak after a pause: a tree's hops of 128 KiB, each
/// after the link was idle, go faster with a bucket that holds a hop. `--calls` times a loop
/// of calls back to back: a tree's calls do not overlap (each leaf waits for the last call's
/// result), so without buckets its time per call is one call's. Both options name what they
/// need.
#[test]
fn token_bucket_nics_and_calls_back_to_back() {
    let plain = time_of("tree", "131072", &[]);
    let shaped = time_of("tree", "131072", &["--burst", "128K", "--burst-gbps", "2"]);
    assert!(
        shaped < 0.8 * plain,
        "with a bucket {shaped} us, without {plain} us"
    );
    let looped = time_of("tree", "131072", &["--calls", "4"]);
    assert!(
        (looped - plain).abs() <= 0.01 * plain,
        "a loop {looped} us a call, one call {plain} us"
    );
    let (ok, _, err) = sim(&["--burst", "128K"]);
    assert!(!ok && err.contains("--burst-gbps"), "{err}");
    let (ok, _, err) = sim(&["--burst", "128K", "--burst-gbps", "0.05"]);
    assert!(!ok && err.contains("burst peak"), "{err}");
    let (ok, _, err) = sim(&["--burst", "128K", "--burst-gbps", "2", "--no-contention"]);
    assert!(!ok && err.contains("--no-contention"), "{err}");
    let (ok, _, err) = sim(&["--calls", "0"]);
    assert!(!ok && err.contains("--calls"), "{err}");
}

#[test]
fn goal_writes_one_plan_and_wants_one_algorithm() {
    let path = std::env::temp_dir().join(format!("fabricoll-sim-{}.goal", std::process::id()));
    let file = path.to_str().expect("temp path is UTF-8");
    let (ok, out, err) = sim(&[
        "--goal",
        file,
        "--coll",
        "allreduce",
        "--algos",
        "ring",
        "-b",
        "64",
        "--hosts",
        "2x2",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("ring AllReduce on 4 ranks"), "{out}");
    let text = std::fs::read_to_string(&path).expect("the GOAL file");
    let _ = std::fs::remove_file(&path);
    assert!(text.contains("\nnum_ranks 4\n"), "{text}");
    for r in 0..4 {
        assert!(text.contains(&format!("\nrank {r} {{\n")), "{text}");
    }
    let sends = text.lines().filter(|l| l.contains(": send ")).count();
    let recvs = text.lines().filter(|l| l.contains(": recv ")).count();
    assert_eq!((sends, recvs), (24, 24), "{text}");
    let (ok, _, err) = sim(&["--goal", file, "--algos", "ring,rdh"]);
    assert!(!ok && err.contains("--algos"), "{err}");
    assert!(!path.exists());
}

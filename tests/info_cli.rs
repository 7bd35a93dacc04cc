//! fabricoll-info's arguments: `--core-rtt` measures, wrong arguments fail with a message
//! (`--unique-id` is tested with the launchers, in tests/launchers.rs).
use std::process::{Command, Output};

fn info(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fabricoll-info"))
        .args(args)
        .output()
        .expect("fabricoll-info runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn core_rtt_prints_one_line_per_pair() {
    let cpus = nccl_net_fabricoll::coll::placement::allowed_cpus();
    let out = info(&["--core-rtt"]);
    if cpus.len() < 2 {
        assert_eq!(out.status.code(), Some(1));
        assert!(text(&out.stderr).contains("needs 2 CPUs"));
        return;
    }
    assert!(out.status.success(), "{}", text(&out.stderr));
    let n = cpus.len().min(8);
    let lines: Vec<String> = text(&out.stdout).lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), n * (n - 1) / 2, "{lines:?}");
    for l in &lines {
        let f: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(f.len(), 4, "{l}");
        assert_eq!(f[0], "core-rtt");
        let (a, b): (usize, usize) = (f[1].parse().unwrap(), f[2].parse().unwrap());
        assert!(a < b && cpus.contains(&a) && cpus.contains(&b), "{l}");
        let ns: u64 = f[3].parse().unwrap();
        assert!(ns > 0 && ns < 1_000_000, "{l}");
    }
    // Two CPUs named: one line, for them.
    let (a, b) = (cpus[1].to_string(), cpus[0].to_string());
    let out = info(&["--core-rtt", &a, &b]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with(&format!("core-rtt {a} {b} ")));
}

#[test]
fn wrong_arguments_fail_with_a_message() {
    let first = nccl_net_fabricoll::coll::placement::allowed_cpus()[0].to_string();
    let c = first.as_str();
    for (args, code, says) in [
        (&["--core-rtt", c, c][..], 1, "twice"),
        (&["--core-rtt", c, "100000"][..], 1, "100000 is not one"),
        (&["--core-rtt", c, "x"][..], 2, "CPU numbers expected"),
        (&["--core-rtt", c][..], 2, "no CPU or two"),
        (&["--bogus"][..], 2, "unknown argument"),
    ] {
        let out = info(args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let out = info(&["--help"]);
    assert!(out.status.success() && text(&out.stdout).contains("--core-rtt"));
    assert!(text(&out.stdout).contains("--unique-id"));
}

#[test]
fn algorithms_lists_each_algorithm_with_the_collectives_it_implements() {
    let out = info(&["--algorithms"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<String> = text(&out.stdout).lines().map(str::to_owned).collect();
    let n = nccl_net_fabricoll::algo::Algorithm::ALL.len();
    assert_eq!(lines.len(), n, "one line per algorithm: {lines:?}");
    let colls = |algo: &str| -> Vec<String> {
        let l = lines
            .iter()
            .find(|l| l.split_whitespace().next() == Some(algo));
        let l = l.unwrap_or_else(|| panic!("no line for {algo}: {lines:?}"));
        l.split_whitespace().skip(1).map(str::to_owned).collect()
    };
    assert_eq!(colls("pairwise"), ["alltoall"]);
    assert!(colls("ring").contains(&"allreduce".to_string()));
    assert!(!info(&["--algorithms", "x"]).status.success());
}

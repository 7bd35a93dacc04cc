//! fabricoll-info's arguments: `--core-rtt` measures, wrong arguments fail with a message
//! (`--unique-id` is tested with the launchers, in tests/launchers_tool/mod.rs).
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

/// `fabricoll-info` under the variables `vars` (and no FABRICOLL_PROVIDER or FI_PROVIDER of
/// the caller's).
fn info_with(vars: &[(&str, &str)]) -> String {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fabricoll-info"));
    c.env_remove("FABRICOLL_PROVIDER").env_remove("FI_PROVIDER");
    c.envs(vars.iter().copied());
    let out = c.output().expect("fabricoll-info runs");
    assert!(out.status.success(), "{vars:?}: {}", text(&out.stderr));
    text(&out.stdout)
}

#[test]
fn the_first_line_names_the_libfabric_run_and_the_headers_built_against() {
    use nccl_net_fabricoll::transport::fabric;
    let out = info_with(&[]);
    let first = out.lines().next().unwrap_or_default();
    let release = fabric::runtime_release();
    // The full release (major.minor.revision), of the libfabric this process runs.
    assert!(
        release.starts_with(&format!("{}.", fabric::runtime_version())),
        "{release}"
    );
    assert_eq!(release.split('.').count(), 3, "{release}");
    assert!(
        first.contains(&format!("libfabric {release} at run time")),
        "{first}"
    );
    assert!(
        first.contains(&format!(
            "built against its {} headers",
            fabric::header_version()
        )),
        "{first}"
    );
}

#[test]
fn provider_names_resolve_or_fail_naming_the_variable() {
    use nccl_net_fabricoll::transport::fabric::native_tcp;
    // `net` is the native TCP endpoint on every libfabric (1.17's `net`, 2.x's `tcp`).
    let out = info_with(&[("FABRICOLL_PROVIDER", "net"), ("FABRICOLL_DOMAIN", "lo")]);
    let want = format!("chosen for the collective engines: {}\n", native_tcp());
    if !out.contains(&want) {
        nccl_net_fabricoll::testing::skip(
            "provider_names_resolve_or_fail_naming_the_variable",
            &format!("no native TCP endpoint here:\n{out}"),
        );
        return;
    }
    // A provider that does not exist is named with the variable that named it, and what
    // does exist.
    for var in ["FABRICOLL_PROVIDER", "FI_PROVIDER"] {
        let out = info_with(&[(var, "nosuchprov")]);
        assert!(
            out.contains(&format!(
                "discovery failed: invalid argument: argument '{var}': nosuchprov: no such provider here"
            )),
            "{var}:\n{out}"
        );
    }
    let out = info_with(&[("FABRICOLL_PROVIDER", "nosuchprov")]);
    let found = out
        .split_once("providers found: ")
        .map(|(_, rest)| rest.lines().next().unwrap_or_default())
        .unwrap_or_default();
    assert!(
        found.split([',', ')']).any(|p| p.trim() == native_tcp()),
        "{out}"
    );
}

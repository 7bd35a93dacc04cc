//! Environments no job can start from, and ranks that wait in vain: each fails within its
//! deadline, naming the variable to change.
use super::*;

/// One rank with `vars` fails within `FAST` with exit code `code`, its stderr naming `names`.
fn fails(test: &str, vars: Env, code: i32, names: &[&str]) {
    let (done, dir) = perf_job(test, 1, |_| vars.clone(), FAST);
    let d = &done[0];
    assert_eq!(d.code, Some(code), "{vars:?}: {d:?}");
    for n in names {
        assert!(
            d.err.contains(n),
            "{vars:?}: stderr does not name {n}: {}",
            d.err
        );
    }
    assert!(
        !d.out.contains("Avg bus bandwidth"),
        "{vars:?}: it ran: {}",
        d.out
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// An environment and the variables its error must name.
type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str]);

#[test]
fn inconsistent_environments_fail_fast_naming_the_variable() {
    let root = format!("127.0.0.1:{}", free_port());
    let r = root.as_str();
    let cases: &[Case] = &[
        (&[("FABRICOLL_RANK", "0")], &["FABRICOLL_NRANKS"]),
        (
            &[("FABRICOLL_NRANKS", "2"), ("FABRICOLL_ROOT", r)],
            &["FABRICOLL_RANK"],
        ),
        // Once a silent local 2-rank job that reported success.
        (
            &[("FABRICOLL_RANK", "0"), ("FABRICOLL_NRANKS", "2")],
            &[
                "FABRICOLL_UNIQUE_ID",
                "FABRICOLL_ROOT",
                "FABRICOLL_ROOT_FILE",
            ],
        ),
        (
            &[
                ("FABRICOLL_RANK", "2"),
                ("FABRICOLL_NRANKS", "2"),
                ("FABRICOLL_ROOT", r),
            ],
            &["FABRICOLL_RANK"],
        ),
        (
            &[
                ("FABRICOLL_RANK", "one"),
                ("FABRICOLL_NRANKS", "2"),
                ("FABRICOLL_ROOT", r),
            ],
            &["FABRICOLL_RANK"],
        ),
        (
            &[
                ("FABRICOLL_RANK", "0"),
                ("FABRICOLL_NRANKS", "4"),
                ("PMI_RANK", "0"),
                ("PMI_SIZE", "2"),
                ("FABRICOLL_ROOT", r),
            ],
            &["FABRICOLL_NRANKS", "PMI_SIZE"],
        ),
        (
            &[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")],
            &["FABRICOLL_ROOT", "FABRICOLL_ROOT_FILE"],
        ),
        (
            &[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")],
            &["FABRICOLL_ROOT"],
        ),
        (&[("PMI_RANK", "0"), ("PMI_SIZE", "2")], &["FABRICOLL_ROOT"]),
        (
            &[
                ("SLURM_PROCID", "3"),
                ("SLURM_NTASKS", "2"),
                ("FABRICOLL_ROOT", r),
            ],
            &["SLURM_PROCID"],
        ),
        (
            &[("OMPI_COMM_WORLD_RANK", "0"), ("FABRICOLL_ROOT", r)],
            &["OMPI_COMM_WORLD_SIZE"],
        ),
        (
            &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "29500")],
            &["MASTER_ADDR"],
        ),
        (
            &[
                ("FABRICOLL_RANK", "0"),
                ("FABRICOLL_NRANKS", "2"),
                ("FABRICOLL_UNIQUE_ID", "46424944deadbeef"),
            ],
            &["FABRICOLL_UNIQUE_ID"],
        ),
        (
            &[
                ("FABRICOLL_RANK", "0"),
                ("FABRICOLL_NRANKS", "2"),
                ("FABRICOLL_UNIQUE_ID", "xyz"),
            ],
            &["FABRICOLL_UNIQUE_ID"],
        ),
        (
            &[
                ("FABRICOLL_RANK", "0"),
                ("FABRICOLL_NRANKS", "2"),
                ("FABRICOLL_ROOT", r),
                ("FABRICOLL_ROOT_FILE", "/tmp/x"),
            ],
            &["FABRICOLL_ROOT_FILE", "FABRICOLL_ROOT"],
        ),
        (
            &[("FABRICOLL_ROOT", r)],
            &["FABRICOLL_ROOT", "FABRICOLL_RANK"],
        ),
        (
            &[
                ("FABRICOLL_RANK", "0"),
                ("FABRICOLL_NRANKS", "2"),
                ("FABRICOLL_ROOT", "nohostport"),
            ],
            &["FABRICOLL_ROOT"],
        ),
    ];
    for (i, (vars, names)) in cases.iter().enumerate() {
        fails(&format!("bad{i}"), env(vars), 2, names);
    }
}

#[test]
fn a_rank_that_waits_in_vain_fails_within_the_deadline() {
    // Rank 1 of a file route whose rank 0 never writes the file.
    let files = temp_dir("lonely-file-dir");
    let p = files.join("id");
    let vars = env(&[
        ("SLURM_PROCID", "1"),
        ("SLURM_NTASKS", "2"),
        ("FABRICOLL_ROOT_FILE", p.to_str().unwrap()),
        ("FABRICOLL_TIMEOUT_MS", "500"),
    ]);
    fails(
        "lonely-file",
        vars,
        1,
        &["FABRICOLL_ROOT_FILE", "FABRICOLL_TIMEOUT_MS"],
    );
    // Rank 0 cannot listen on FABRICOLL_ROOT: its port is taken.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let root = taken.local_addr().unwrap().to_string();
    let vars = env(&[
        ("PMI_RANK", "0"),
        ("PMI_SIZE", "2"),
        ("FABRICOLL_ROOT", &root),
        ("FABRICOLL_TIMEOUT_MS", "500"),
    ]);
    fails("taken-port", vars, 1, &["FABRICOLL_ROOT"]);
    // Rank 1 alone against FABRICOLL_ROOT: a timeout.
    let root = format!("127.0.0.1:{}", free_port());
    let vars = env(&[
        ("PMI_RANK", "1"),
        ("PMI_SIZE", "2"),
        ("FABRICOLL_ROOT", &root),
        ("FABRICOLL_TIMEOUT_MS", "500"),
    ]);
    fails("no-root", vars, 1, &["root"]);
    std::fs::remove_dir_all(files).unwrap();
}

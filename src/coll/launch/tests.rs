//! The parsing of launchers' environments: each launcher, the precedence, the routes, and every
//! inconsistent environment (the error names the variable).
use super::*;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn detect_in(pairs: &[(&str, &str)]) -> Result<Option<Launch>> {
    let m = env(pairs);
    let get = |n: &str| m.get(n).cloned();
    let cfg = Config::from_lookup(get)?;
    detect(&get, &cfg)
}

fn launch(pairs: &[(&str, &str)]) -> Launch {
    detect_in(pairs)
        .unwrap_or_else(|e| panic!("{pairs:?}: {e}"))
        .unwrap_or_else(|| panic!("{pairs:?}: no launch"))
}

/// The error of `pairs`, which must name `var`.
fn fails(pairs: &[(&str, &str)], var: &str) -> String {
    match detect_in(pairs) {
        Err(e) => {
            let m = e.to_string();
            assert!(m.contains(var), "{pairs:?}: {m} does not name {var}");
            m
        }
        Ok(l) => panic!("{pairs:?}: {l:?}, expected an error naming {var}"),
    }
}

const ROOT: (&str, &str) = ("FABRICOLL_ROOT", "127.0.0.1:29400");

#[test]
fn no_variable_is_no_launch() {
    assert_eq!(detect_in(&[]).unwrap(), None);
    assert_eq!(
        detect_in(&[("LOCAL_RANK", "1"), ("MASTER_PORT", "1")]).unwrap(),
        None
    );
    assert_eq!(local_rank_hint(&|_| None), None);
}

#[test]
fn each_launcher_gives_rank_size_and_local_rank() {
    let l = launch(&[
        ("SLURM_PROCID", "2"),
        ("SLURM_NTASKS", "3"),
        ("SLURM_LOCALID", "0"),
        ROOT,
    ]);
    assert_eq!(
        (l.launcher, l.rank, l.nranks, l.local_rank),
        (Launcher::Slurm, 2, 3, Some(0))
    );
    let l = launch(&[
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ROOT,
    ]);
    assert_eq!(
        (l.launcher, l.rank, l.nranks, l.local_rank),
        (Launcher::OpenMpi, 1, 2, Some(1))
    );
    let l = launch(&[("PMI_RANK", "0"), ("PMI_SIZE", "4"), ROOT]);
    assert_eq!(
        (l.launcher, l.rank, l.nranks, l.local_rank),
        (Launcher::Hydra, 0, 4, None)
    );
    let l = launch(&[
        ("PMI_RANK", "3"),
        ("PMI_SIZE", "4"),
        ("MPI_LOCALRANKID", "1"),
        ROOT,
    ]);
    assert_eq!(l.local_rank, Some(1));
    let l = launch(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("LOCAL_RANK", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
    ]);
    assert_eq!(
        (l.launcher, l.rank, l.nranks, l.local_rank),
        (Launcher::Torchrun, 1, 2, Some(1))
    );
    assert_eq!(
        l.rendezvous,
        Rendezvous::Listen {
            addr: "127.0.0.1:29501".parse().unwrap(),
            nonce: FIXED_NONCE,
            var: "MASTER_ADDR, MASTER_PORT + 1"
        }
    );
    let l = launch(&[("FABRICOLL_RANK", "0"), ("FABRICOLL_NRANKS", "1"), ROOT]);
    assert_eq!(
        (l.launcher, l.rank, l.nranks, l.local_rank),
        (Launcher::Fabricoll, 0, 1, None)
    );
    assert!(l
        .describe()
        .starts_with("fabricoll (FABRICOLL_RANK 0 of FABRICOLL_NRANKS 1)"));
}

#[test]
fn precedence_is_fabricoll_torchrun_open_mpi_hydra_slurm() {
    let all = [
        ("FABRICOLL_RANK", "0"),
        ("FABRICOLL_NRANKS", "2"),
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("PMI_RANK", "2"),
        ("PMI_SIZE", "6"),
        ("SLURM_PROCID", "3"),
        ("SLURM_NTASKS", "8"),
        ROOT,
    ];
    let expect = [
        Launcher::Fabricoll,
        Launcher::Torchrun,
        Launcher::OpenMpi,
        Launcher::Hydra,
        Launcher::Slurm,
    ];
    for (skip, want) in [0, 2, 6, 8, 10].into_iter().zip(expect) {
        assert_eq!(launch(&all[skip..]).launcher, want, "{:?}", &all[skip..]);
    }
    // Nested launchers count differently (mpirun's daemons under srun): the inner one wins.
    let l = launch(&all[6..]);
    assert_eq!((l.rank, l.nranks), (1, 4));
    assert_eq!(
        local_rank_hint(&|n| (n == "SLURM_PROCID" || n == "SLURM_LOCALID").then(|| "1".into())),
        Some(1)
    );
}

#[test]
fn routes_unique_id_root_file_and_the_job_nonce() {
    let id = UniqueId {
        addr: "10.1.2.3:4567".parse().unwrap(),
        nonce: 99,
    };
    let hex = id.to_hex();
    let base = [("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2")];
    let with = |extra: &[(&'static str, &str)]| -> Vec<(&'static str, String)> {
        base.iter()
            .chain(extra)
            .map(|(k, v)| (*k, v.to_string()))
            .collect()
    };
    let run = |v: Vec<(&'static str, String)>| {
        let p: Vec<(&str, &str)> = v.iter().map(|(k, v)| (*k, v.as_str())).collect();
        launch(&p)
    };
    assert_eq!(
        run(with(&[("FABRICOLL_UNIQUE_ID", &hex)])).rendezvous,
        Rendezvous::Id(id)
    );
    let l = run(with(&[
        ("FABRICOLL_ROOT_FILE", "/tmp/x/id"),
        ("SLURM_JOB_ID", "77"),
    ]));
    let job = fnv("SLURM_JOB_ID=77");
    assert_eq!(
        l.rendezvous,
        Rendezvous::File {
            path: "/tmp/x/id".into(),
            nonce: Some(job)
        }
    );
    assert_eq!(l.job.as_deref(), Some("SLURM_JOB_ID"));
    // A job and step id: the step is part of the nonce; the nonce reaches the address route.
    let l = run(with(&[
        ROOT,
        ("SLURM_JOB_ID", "77"),
        ("SLURM_STEP_ID", "3"),
    ]));
    match l.rendezvous {
        Rendezvous::Listen { nonce, var, .. } => {
            assert_eq!(
                (nonce, var),
                (fnv("SLURM_JOB_ID.SLURM_STEP_ID=77.3"), "FABRICOLL_ROOT")
            );
            assert_ne!(nonce, job);
        }
        r => panic!("{r:?}"),
    }
    // Open MPI's job id; torchrun's run id.
    let l = launch(&[
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_MCA_ess_base_jobid", "1234"),
        ROOT,
    ]);
    assert_eq!(l.job.as_deref(), Some("OMPI_MCA_ess_base_jobid"));
    let l = launch(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
        ("TORCHELASTIC_RUN_ID", "abc"),
    ]);
    assert!(
        matches!(l.rendezvous, Rendezvous::Listen { nonce, .. } if nonce == fnv("TORCHELASTIC_RUN_ID=abc"))
    );
    // An explicit root wins over torchrun's address.
    let l = launch(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ROOT,
    ]);
    assert!(matches!(
        l.rendezvous,
        Rendezvous::Listen {
            var: "FABRICOLL_ROOT",
            ..
        }
    ));
}

#[test]
fn inconsistent_environments_name_the_variable() {
    let ok_root = ROOT;
    fails(&[("FABRICOLL_RANK", "0"), ok_root], "FABRICOLL_NRANKS");
    fails(&[("FABRICOLL_NRANKS", "2"), ok_root], "FABRICOLL_RANK");
    fails(
        &[("FABRICOLL_RANK", "x"), ("FABRICOLL_NRANKS", "2"), ok_root],
        "FABRICOLL_RANK",
    );
    fails(
        &[("FABRICOLL_RANK", "2"), ("FABRICOLL_NRANKS", "2"), ok_root],
        "FABRICOLL_RANK",
    );
    fails(
        &[("FABRICOLL_RANK", "0"), ("FABRICOLL_NRANKS", "0"), ok_root],
        "FABRICOLL_NRANKS",
    );
    fails(
        &[("FABRICOLL_RANK", "-1"), ("FABRICOLL_NRANKS", "2"), ok_root],
        "FABRICOLL_RANK",
    );
    // No id or root: the message names all three ways.
    let m = fails(
        &[("FABRICOLL_RANK", "0"), ("FABRICOLL_NRANKS", "2")],
        "FABRICOLL_UNIQUE_ID",
    );
    assert!(
        m.contains("FABRICOLL_ROOT") && m.contains("FABRICOLL_ROOT_FILE"),
        "{m}"
    );
    // Launchers without an address for rank 0.
    for pairs in [
        &[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")][..],
        &[("PMI_RANK", "0"), ("PMI_SIZE", "2")][..],
        &[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")][..],
    ] {
        let m = fails(pairs, "FABRICOLL_ROOT");
        assert!(
            m.contains("FABRICOLL_ROOT_FILE") && m.contains("gives no address"),
            "{m}"
        );
    }
    fails(&[("SLURM_PROCID", "0"), ok_root], "SLURM_NTASKS");
    fails(&[("PMI_SIZE", "2"), ok_root], "PMI_RANK");
    fails(
        &[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "z"),
            ok_root,
        ],
        "SLURM_LOCALID",
    );
    fails(
        &[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "2"),
            ok_root,
        ],
        "SLURM_LOCALID",
    );
    // Sizes of fabricoll's own and the launcher below it disagree.
    let m = fails(
        &[
            ("FABRICOLL_RANK", "0"),
            ("FABRICOLL_NRANKS", "4"),
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "2"),
            ok_root,
        ],
        "FABRICOLL_NRANKS",
    );
    assert!(m.contains("PMI_SIZE"), "{m}");
    // torchrun without its address, or with a bad port.
    fails(
        &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "29500")],
        "MASTER_ADDR",
    );
    fails(
        &[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
        ],
        "MASTER_PORT",
    );
    fails(
        &[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "65535"),
        ],
        "MASTER_PORT",
    );
    // A malformed id; two ways to meet; a root variable without a rank.
    let two = [("FABRICOLL_RANK", "0"), ("FABRICOLL_NRANKS", "2")];
    for bad in ["zz", "0123", "46424944"] {
        fails(
            &[two[0], two[1], ("FABRICOLL_UNIQUE_ID", bad)],
            "FABRICOLL_UNIQUE_ID",
        );
    }
    let m = fails(
        &[two[0], two[1], ok_root, ("FABRICOLL_ROOT_FILE", "/tmp/f")],
        "FABRICOLL_ROOT_FILE",
    );
    assert!(m.contains("set together with FABRICOLL_ROOT"), "{m}");
    fails(&[("FABRICOLL_ROOT_FILE", "/tmp/f")], "FABRICOLL_ROOT_FILE");
    fails(&[("FABRICOLL_UNIQUE_ID", "00")], "FABRICOLL_UNIQUE_ID");
    fails(
        &[two[0], two[1], ("FABRICOLL_ROOT", "no-such-host.invalid:1")],
        "FABRICOLL_ROOT",
    );
}

#[test]
fn the_file_route_publishes_atomically_and_skips_another_jobs_file() {
    let dir = std::env::temp_dir().join(format!("fabricoll-launch-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("id");
    // Another job's file is ignored until the deadline.
    let stale = UniqueId {
        addr: "127.0.0.1:9".parse().unwrap(),
        nonce: 1,
    };
    std::fs::write(&path, stale.to_hex()).unwrap();
    let t = Duration::from_millis(100);
    let e = await_file(&path, Some(2), Instant::now() + t, t).unwrap_err();
    assert!(
        matches!(&e, Error::Timeout(m) if m.contains("FABRICOLL_ROOT_FILE")),
        "{e}"
    );
    assert_eq!(await_file(&path, None, Instant::now(), t).unwrap(), stale);
    std::fs::write(&path, "not hex").unwrap();
    let e = await_file(&path, None, Instant::now(), t).unwrap_err();
    assert!(e.to_string().contains("FABRICOLL_ROOT_FILE"), "{e}");
    // Rank 0 replaces it; a reader of this job finds the new id; no temporary file is left.
    let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let published = publish(&path, Some(2), 1, ip, Duration::from_secs(5)).unwrap();
    let id = published.id;
    assert_eq!(id.nonce, 2);
    assert_eq!(await_file(&path, Some(2), Instant::now(), t).unwrap(), id);
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["id"]);
    // Once the one rank has joined, the root is done and the file goes.
    bootstrap::exchange(&id, 0, 1, b"a", Duration::from_secs(5)).unwrap();
    published.finish(Duration::from_secs(60));
    assert!(!path.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bind_ip_is_the_configured_address_or_one_of_this_host() {
    let cfg = Config::from_lookup(|n| (n == "FABRICOLL_BOOTSTRAP_ADDR").then(|| "10.9.8.7".into()))
        .unwrap();
    assert_eq!(bind_ip(&cfg), "10.9.8.7".parse::<IpAddr>().unwrap());
    let ip = bind_ip(&Config::from_lookup(|_| None).unwrap());
    // Whatever it is, this host can listen on it.
    std::net::TcpListener::bind(SocketAddr::new(ip, 0)).unwrap();
}

#[test]
fn fabricoll_job_id_names_the_job_whatever_the_launcher() {
    let nonce_of = |l: &Launch| match l.rendezvous {
        Rendezvous::Listen { nonce, .. } => nonce,
        ref r => panic!("{r:?}"),
    };
    let own = |job: &'static str| {
        launch(&[
            ("FABRICOLL_RANK", "0"),
            ("FABRICOLL_NRANKS", "2"),
            ("FABRICOLL_JOB_ID", job),
            ROOT,
        ])
    };
    let (a, b) = (own("job-a"), own("job-b"));
    assert_eq!(a.job.as_deref(), Some("FABRICOLL_JOB_ID"));
    assert_ne!(nonce_of(&a), nonce_of(&b), "two jobs, two identities");
    assert_ne!(nonce_of(&a), FIXED_NONCE);
    assert_eq!(
        nonce_of(&a),
        nonce_of(&own("job-a")),
        "one job, one identity"
    );
    assert!(a.describe().contains("job id from FABRICOLL_JOB_ID"));
    // It takes the place of the launcher's own job id.
    let l = launch(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
        ("TORCHELASTIC_RUN_ID", "abc"),
        ("FABRICOLL_JOB_ID", "job-a"),
    ]);
    assert_eq!(nonce_of(&l), nonce_of(&a));
}

//! fabricoll-perf and the C API under each launcher's variables, set by hand as the launcher
//! would (torchrun, Open MPI's mpirun, MPICH's Hydra, Slurm's srun, fabricoll's own), over the
//! routes of `coll::launch` (FABRICOLL_ROOT, FABRICOLL_ROOT_FILE, torchrun's address, a unique id
//! served by `fabricoll-info --unique-id`), and every inconsistent environment: it fails fast,
//! naming the variable. Every rank runs on shm (FABRICOLL_PROVIDER=shm) with a deadline. The
//! unique-id tool's tests are in `launchers_tool`, the environments that must fail in
//! `launchers_fail`; the helpers they share are here.
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod launchers_fail;
mod launchers_tool;

/// Variables of every launcher: removed from each child's environment before the test's own
/// are set, so that a test run under a real launcher (CI under Slurm) tests what it says.
const LAUNCHER_VARS: &[&str] = &[
    "FABRICOLL_RANK",
    "FABRICOLL_NRANKS",
    "FABRICOLL_UNIQUE_ID",
    "FABRICOLL_ROOT",
    "FABRICOLL_ROOT_FILE",
    "FABRICOLL_ALGO",
    "FABRICOLL_BOOTSTRAP_ADDR",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_MCA_ess_base_jobid",
    "PMIX_NAMESPACE",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
];

/// How long a job that should succeed may take, and how long one that should fail fast may.
const JOB: Duration = Duration::from_secs(120);
const FAST: Duration = Duration::from_secs(10);

type Env = Vec<(String, String)>;

fn env(pairs: &[(&str, &str)]) -> Env {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A fresh directory for one test's files.
fn temp_dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("fabricoll-launchers-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A TCP port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `program` with a clean launcher environment, shm, the test's variables, output to files in
/// `dir` named after `tag`.
fn command(program: &str, args: &[&str], vars: &Env, dir: &std::path::Path, tag: &str) -> Command {
    let mut c = Command::new(program);
    c.args(args);
    for v in LAUNCHER_VARS {
        c.env_remove(v);
    }
    c.env("FABRICOLL_PROVIDER", "shm")
        .env("FABRICOLL_TIMEOUT_MS", "30000")
        .env_remove("FABRICOLL_LOG");
    for (k, v) in vars {
        c.env(k, v);
    }
    c.stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join(format!("{tag}.out"))).unwrap())
        .stderr(std::fs::File::create(dir.join(format!("{tag}.err"))).unwrap());
    c
}

/// What a rank did: exit code (None: killed at the deadline), stdout, stderr.
#[derive(Debug)]
struct Done {
    code: Option<i32>,
    out: String,
    err: String,
}

/// Wait for `kids` (tagged) until `deadline`, killing those still running then.
fn finish(kids: Vec<(String, Child)>, dir: &std::path::Path, deadline: Duration) -> Vec<Done> {
    let end = Instant::now() + deadline;
    let mut codes: Vec<Option<Option<i32>>> = vec![None; kids.len()];
    let mut kids = kids;
    while codes.iter().any(Option::is_none) && Instant::now() < end {
        for (i, (_, k)) in kids.iter_mut().enumerate() {
            if codes[i].is_none() {
                if let Ok(Some(s)) = k.try_wait() {
                    codes[i] = Some(s.code());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    kids.iter_mut()
        .zip(codes)
        .map(|((tag, k), code)| {
            // A signal is -1; None: still running at the deadline (killed).
            let code = match code {
                Some(c) => Some(c.unwrap_or(-1)),
                None => {
                    let _ = k.kill();
                    let _ = k.wait();
                    None
                }
            };
            let read = |ext: &str| {
                std::fs::read_to_string(dir.join(format!("{tag}.{ext}"))).unwrap_or_default()
            };
            Done {
                code,
                out: read("out"),
                err: read("err"),
            }
        })
        .collect()
}

const PERF_ARGS: &[&str] = &[
    "-c", "1", "-b", "8", "-e", "64K", "-f", "8", "-n", "3", "-w", "1",
];

/// Run `n` fabricoll-perf ranks, rank r with `vars(r)`; returns each rank's result.
fn perf_job(
    test: &str,
    n: usize,
    vars: impl Fn(usize) -> Env,
    deadline: Duration,
) -> (Vec<Done>, PathBuf) {
    let dir = temp_dir(test);
    let kids = (0..n)
        .map(|r| {
            let tag = format!("rank{r}");
            let c = command(
                env!("CARGO_BIN_EXE_fabricoll-perf"),
                PERF_ARGS,
                &vars(r),
                &dir,
                &tag,
            )
            .spawn()
            .unwrap();
            (tag, c)
        })
        .collect();
    (finish(kids, &dir, deadline), dir)
}

/// Every rank succeeded; rank 0 printed a correct table and the launcher line.
fn assert_ran(done: &[Done], launcher: &str) {
    for (r, d) in done.iter().enumerate() {
        assert_eq!(d.code, Some(0), "rank {r}: {d:?}");
    }
    let out = &done[0].out;
    assert!(out.contains("# Out of bounds values : 0 OK"), "{out}");
    assert!(out.contains(&format!("# launcher: {launcher}")), "{out}");
    assert!(out.contains(&format!("on {} ranks", done.len())), "{out}");
}

/// `perf_job` that must succeed (`assert_ran`); returns the ranks' results.
fn job_ok(test: &str, n: usize, vars: impl Fn(usize) -> Env, launcher: &str) -> Vec<Done> {
    let (done, dir) = perf_job(test, n, vars, JOB);
    assert_ran(&done, launcher);
    std::fs::remove_dir_all(dir).unwrap();
    done
}

#[test]
fn slurm_with_fabricoll_root() {
    let root = format!("127.0.0.1:{}", free_port());
    let done = job_ok(
        "slurm",
        3,
        |r| {
            let (r, l) = (r.to_string(), (r % 2).to_string());
            env(&[
                ("SLURM_PROCID", &r),
                ("SLURM_NTASKS", "3"),
                ("SLURM_LOCALID", &l),
                ("SLURM_JOB_ID", "4242"),
                ("SLURM_STEP_ID", "0"),
                ("FABRICOLL_ROOT", &root),
            ])
        },
        "Slurm (SLURM_PROCID 0 of SLURM_NTASKS 3, SLURM_LOCALID 0)",
    );
    assert!(
        done[0]
            .out
            .contains("job id from SLURM_JOB_ID.SLURM_STEP_ID"),
        "{}",
        done[0].out
    );
}

#[test]
fn open_mpi_with_a_root_file() {
    let files = temp_dir("ompi-file");
    let path = files.join("root-id");
    let p = path.to_str().unwrap().to_string();
    job_ok(
        "ompi",
        2,
        |r| {
            let r = r.to_string();
            env(&[
                ("OMPI_COMM_WORLD_RANK", &r),
                ("OMPI_COMM_WORLD_SIZE", "2"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", &r),
                ("OMPI_MCA_ess_base_jobid", "123"),
                ("FABRICOLL_ROOT_FILE", &p),
            ])
        },
        "Open MPI (OMPI_COMM_WORLD_RANK 0 of OMPI_COMM_WORLD_SIZE 2",
    );
    // Rank 0 removed its file once every rank had joined; nothing else is left.
    assert_eq!(std::fs::read_dir(&files).unwrap().count(), 0);
    std::fs::remove_dir_all(files).unwrap();
}

#[test]
fn hydra_with_fabricoll_root() {
    let root = format!("127.0.0.1:{}", free_port());
    job_ok(
        "hydra",
        2,
        |r| {
            env(&[
                ("PMI_RANK", &r.to_string()),
                ("PMI_SIZE", "2"),
                ("FABRICOLL_ROOT", &root),
            ])
        },
        "Hydra (PMI_RANK 0 of PMI_SIZE 2)",
    );
}

#[test]
fn torchrun_with_master_addr_and_port() {
    // The root listens on MASTER_PORT + 1.
    let port = (free_port() - 1).to_string();
    job_ok(
        "torchrun",
        2,
        |r| {
            let r = r.to_string();
            env(&[
                ("RANK", &r),
                ("WORLD_SIZE", "2"),
                ("LOCAL_RANK", &r),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", &port),
                ("TORCHELASTIC_RUN_ID", "t1"),
            ])
        },
        "torchrun (RANK 0 of WORLD_SIZE 2, LOCAL_RANK 0)",
    );
}

#[test]
fn fabricoll_variables_with_a_root_and_a_forced_algorithm() {
    let root = format!("127.0.0.1:{}", free_port());
    let done = job_ok(
        "own",
        2,
        |r| {
            env(&[
                ("FABRICOLL_RANK", &r.to_string()),
                ("FABRICOLL_NRANKS", "2"),
                ("FABRICOLL_ROOT", &root),
                ("FABRICOLL_ALGO", "ring"),
            ])
        },
        "fabricoll (FABRICOLL_RANK 0 of FABRICOLL_NRANKS 2)",
    );
    // The header says which algorithm runs, and the rows ran it.
    let out = &done[0].out;
    assert!(out.contains("algorithm ring (FABRICOLL_ALGO)"), "{out}");
    assert!(
        out.lines()
            .filter(|l| !l.starts_with('#'))
            .all(|l| l.contains(" ring ")),
        "{out}"
    );
}

/// Open MPI's real mpirun, where installed: two ranks meeting through a root file.
#[test]
fn real_mpirun_with_a_root_file() {
    let version = Command::new("mpirun").arg("--version").output();
    let open_mpi = version
        .as_ref()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("Open MPI"));
    if !open_mpi {
        nccl_net_fabricoll::testing::skip("real_mpirun_with_a_root_file", "no Open MPI mpirun");
        return;
    }
    let files = temp_dir("mpirun-file");
    let id = files.join("id");
    let dir = temp_dir("mpirun");
    let file_var = format!("FABRICOLL_ROOT_FILE={}", id.display());
    let mut args = vec![
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
        "-np",
        "2",
        "-x",
        "FABRICOLL_PROVIDER",
        "-x",
        "FABRICOLL_TIMEOUT_MS",
        "-x",
        &file_var,
        env!("CARGO_BIN_EXE_fabricoll-perf"),
    ];
    args.extend_from_slice(PERF_ARGS);
    let kid = command("mpirun", &args, &Env::new(), &dir, "mpirun")
        .spawn()
        .unwrap();
    let done = finish(vec![("mpirun".into(), kid)], &dir, JOB);
    let d = &done[0];
    assert_eq!(d.code, Some(0), "{d:?}");
    for says in [
        "# launcher: Open MPI (OMPI_COMM_WORLD_RANK 0 of OMPI_COMM_WORLD_SIZE 2",
        "on 2 ranks",
        "# Out of bounds values : 0 OK",
    ] {
        assert!(d.out.contains(says), "{d:?}");
    }
    assert!(
        done[0].out.contains("job id from OMPI_MCA_ess_base_jobid")
            || done[0].out.contains("job id from PMIX_NAMESPACE"),
        "{:?}",
        done[0]
    );
    std::fs::remove_dir_all(files).unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}

/// The C API's `fabricoll_comm_init_env` in two processes under Slurm's variables (this test's
/// binary, re-run as `capi_rank`).
#[test]
fn c_api_init_env_under_slurm_variables() {
    let root = format!("127.0.0.1:{}", free_port());
    let dir = temp_dir("capi");
    let exe = std::env::current_exe().unwrap();
    let kids = (0..2)
        .map(|r| {
            let tag = format!("rank{r}");
            let vars = env(&[
                ("SLURM_PROCID", &r.to_string()),
                ("SLURM_NTASKS", "2"),
                ("FABRICOLL_ROOT", &root),
                ("LAUNCHERS_CAPI_RANK", "1"),
            ]);
            let args = ["capi_rank", "--exact", "--ignored", "--nocapture"];
            let c = command(exe.to_str().unwrap(), &args, &vars, &dir, &tag)
                .spawn()
                .unwrap();
            (tag, c)
        })
        .collect();
    for (r, d) in finish(kids, &dir, JOB).iter().enumerate() {
        assert_eq!(d.code, Some(0), "rank {r}: {d:?}");
        assert!(d.out.contains("capi rank ok"), "rank {r}: {d:?}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
#[ignore = "a rank of c_api_init_env_under_slurm_variables, which starts it"]
fn capi_rank() {
    use nccl_net_fabricoll::ffi::api::*;
    if std::env::var("LAUNCHERS_CAPI_RANK").is_err() {
        return;
    }
    let last = || {
        // SAFETY: fabricoll_last_error returns a valid C string.
        unsafe { std::ffi::CStr::from_ptr(fabricoll_last_error()) }
            .to_string_lossy()
            .into_owned()
    };
    assert_ne!(
        fabricoll_comm_init_env(std::ptr::null_mut()),
        fabricoll_status::FABRICOLL_SUCCESS
    );
    assert!(last().contains("comm"), "{}", last());
    let mut comm = std::ptr::null_mut();
    let s = fabricoll_comm_init_env(&mut comm);
    assert_eq!(s, fabricoll_status::FABRICOLL_SUCCESS, "{}", last());
    let (mut rank, mut size) = (-1, -1);
    assert_eq!(
        fabricoll_comm_rank(comm, &mut rank),
        fabricoll_status::FABRICOLL_SUCCESS
    );
    assert_eq!(
        fabricoll_comm_size(comm, &mut size),
        fabricoll_status::FABRICOLL_SUCCESS
    );
    let want: i32 = std::env::var("SLURM_PROCID").unwrap().parse().unwrap();
    assert_eq!((rank, size), (want, 2));
    let (send, mut recv) = ([rank as f32 + 1.0; 4], [0f32; 4]);
    let s = fabricoll_allreduce(
        send.as_ptr().cast(),
        recv.as_mut_ptr().cast(),
        4,
        fabricoll_datatype::FABRICOLL_FLOAT32 as i32,
        fabricoll_redop::FABRICOLL_SUM as i32,
        comm,
    );
    assert_eq!(s, fabricoll_status::FABRICOLL_SUCCESS, "{}", last());
    assert_eq!(recv, [3.0; 4]);
    assert_eq!(
        fabricoll_comm_destroy(comm),
        fabricoll_status::FABRICOLL_SUCCESS
    );
    println!("capi rank ok");
}

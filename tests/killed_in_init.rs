//! A rank killed while the communicator is being made, over shm: the survivors must fail
//! cleanly (an error, no signal) within the deadline, every time, whatever the moment of the
//! kill. Each rank is a process of this test binary (the ignored `init_rank`, started by the
//! test; the bootstrap root runs in the test). The first group runs without a kill and
//! measures how long creation goes on after the bootstrap; each later group kills one rank at a
//! random moment of that span (hellos, the placement exchange, calibration, the first
//! collective), and then starts a bystander: another process of the library opening its first
//! endpoint, as a job starting beside this one would.
use nccl_net_fabricoll::algo::Collective;
use nccl_net_fabricoll::coll::bootstrap::{self, UniqueId};
use nccl_net_fabricoll::coll::{Comm, Kind};
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::testing::skip;
use nccl_net_fabricoll::transport::Region;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

/// Set in a rank process.
const CHILD: &str = "KILLED_IN_INIT_CHILD";
const NRANKS: usize = 4;
/// The ranks' deadline (FABRICOLL_TIMEOUT_MS).
const TIMEOUT_MS: u64 = 8000;
/// How long a survivor may take past its deadline before it counts as hung: process start and
/// a loaded machine, not a second deadline.
const GRACE: Duration = Duration::from_secs(30);

/// A rank: make the communicator, print how it went, and end with a status of 0 either way.
/// A survivor that crashes or hangs is what the parent looks for.
#[test]
#[ignore = "a rank of survivors_of_a_rank_killed_during_init_fail_cleanly, which starts it"]
fn init_rank() {
    let Ok(mode) = std::env::var(CHILD) else {
        return;
    };
    if mode == "bystander" {
        // Another process of the library opening its first endpoint, as another job would:
        // it removes what it takes for leftovers of dead processes.
        let cfg = Config::from_env().unwrap();
        let id = bootstrap::new_unique_id(IpAddr::V4(Ipv4Addr::LOCALHOST), cfg.timeout).unwrap();
        let made = Comm::init_rank(1, &id, 0, &cfg);
        println!("@@bystander {}", made.is_ok());
        return;
    }
    let get = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} unset"));
    let rank: usize = get("KILLED_IN_INIT_RANK").parse().unwrap();
    let id = UniqueId::from_hex(&get("KILLED_IN_INIT_ID"), "KILLED_IN_INIT_ID").unwrap();
    let cfg = Config::from_env().unwrap();
    let start = Instant::now();
    match Comm::init_rank(NRANKS, &id, rank, &cfg) {
        Ok(c) => {
            // A kill after creation: the next collective must fail or pass, never crash.
            let made = start.elapsed().as_millis();
            let (mut a, mut b) = ([1u8; 16], [0u8; 16]);
            // SAFETY: both buffers outlive the blocking call.
            let (s, r) = unsafe {
                (
                    Region::from_raw(a.as_mut_ptr(), 16),
                    Region::from_raw(b.as_mut_ptr(), 16),
                )
            };
            let ran = c.run(&common::call(Kind::Coll(Collective::AllReduce), s, r, 4));
            drop(c);
            println!("@@made {made} then allreduce {}", ran.is_ok());
        }
        Err(e) => println!("@@error {} after {} ms", e, start.elapsed().as_millis()),
    }
}

fn spawn(rank: usize, id: &UniqueId, mode: &str) -> Child {
    let exe = std::env::current_exe().unwrap();
    Command::new(exe)
        .args(["--exact", "init_rank", "--ignored", "--nocapture"])
        .args(["--test-threads=1"])
        .env(CHILD, mode)
        .env("KILLED_IN_INIT_RANK", rank.to_string())
        .env("KILLED_IN_INIT_ID", id.to_hex())
        .env("FABRICOLL_PROVIDER", "shm")
        .env("FABRICOLL_INTRA_PROVIDER", "shm")
        .env("FABRICOLL_TIMEOUT_MS", TIMEOUT_MS.to_string())
        .env_remove("FABRICOLL_ALGO")
        .env_remove("FABRICOLL_ALPHA_US")
        .env_remove("FABRICOLL_BETA_GBPS")
        .env_remove("FABRICOLL_GAMMA_GBPS")
        .env_remove("FABRICOLL_HOST")
        .env_remove("FABRICOLL_LOCAL_RANKS")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A small generator for the kill moments and victims (no dependency for it).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

/// One group of ranks; `kill`: (victim, moment after the bootstrap root has sent every rank
/// its table). Returns each rank's exit (None: hung and killed by us), stdout and stderr, and
/// how long the group ran after the bootstrap (None: it never finished).
type Ranks = Vec<(Option<i32>, String, String)>;
fn group(kill: Option<(usize, Duration)>) -> (Ranks, Option<Duration>) {
    let limit = Duration::from_millis(TIMEOUT_MS) * 2 + GRACE;
    let bind = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
    let root = bootstrap::listen(bind, None, Some(NRANKS), limit).unwrap();
    let id = root.id;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let served = root.wait().is_ok();
        let _ = tx.send((served, Instant::now()));
    });
    let start = Instant::now();
    let mut kids: Vec<Child> = (0..NRANKS).map(|r| spawn(r, &id, "rank")).collect();
    let mut exits: Vec<Option<std::process::ExitStatus>> = vec![None; NRANKS];
    let (mut killed, mut served, mut bystander) = (false, None, None);
    while exits.iter().any(Option::is_none) && start.elapsed() < limit {
        if let Ok((true, at)) = rx.try_recv() {
            served = Some(at);
        }
        if let (Some((v, at)), Some(b)) = (kill, served) {
            if !killed && b.elapsed() >= at {
                let _ = kids[v].kill();
                killed = true;
                bystander = Some(spawn(0, &id, "bystander"));
            }
        }
        for (k, e) in kids.iter_mut().zip(exits.iter_mut()) {
            if e.is_none() {
                *e = k.try_wait().unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let after = served.map(|b| b.elapsed());
    if let Some(mut b) = bystander {
        let _ = b.kill();
        let _ = b.wait();
    }
    let out = kids
        .into_iter()
        .zip(exits)
        .map(|(mut k, e)| {
            if e.is_none() {
                let _ = k.kill();
            }
            let o = k.wait_with_output().unwrap();
            let code = e.map(|s| s.code().unwrap_or(-1));
            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            (code, text(&o.stdout), text(&o.stderr))
        })
        .collect();
    (out, after)
}

#[test]
fn survivors_of_a_rank_killed_during_init_fail_cleanly() {
    let test = "survivors_of_a_rank_killed_during_init_fail_cleanly";
    let runs: u64 = std::env::var("KILLED_IN_INIT_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let (first, after) = group(None);
    if first
        .iter()
        .any(|(_, o, e)| o.contains("no libfabric device") || e.contains("no libfabric device"))
    {
        skip(test, "no shm provider here");
        return;
    }
    for (r, (code, out, err)) in first.iter().enumerate() {
        assert_eq!(*code, Some(0), "rank {r} without a kill:\n{out}\n{err}");
        assert!(
            out.contains("@@made"),
            "rank {r} made no communicator:\n{out}\n{err}"
        );
    }
    // Kill anywhere from the bootstrap's end (the fabric's part of creation: endpoints
    // inserted, hellos, the placement exchange, calibration) to a little past the end.
    let span = after.expect("the root served the group").as_millis() as u64 + 20;
    let mut rng = Lcg(std::process::id() as u64 ^ 0x9e37_79b9_7f4a_7c15);
    let mut failures = Vec::new();
    for run in 0..runs {
        let victim = rng.next(NRANKS as u64) as usize;
        let at = Duration::from_millis(rng.next(span));
        let (ranks, took) = group(Some((victim, at)));
        let took = took.unwrap_or_default();
        let outcomes: Vec<String> = ranks
            .iter()
            .map(|(c, o, _)| {
                let said = o.split("@@").nth(1).unwrap_or("").trim();
                format!("{c:?} {}", said.chars().take(90).collect::<String>())
            })
            .collect();
        eprintln!("run {run}: rank {victim} killed {at:?} after the bootstrap (of ~{span} ms): {outcomes:?}");
        for (r, (code, out, err)) in ranks.iter().enumerate() {
            if r == victim {
                continue;
            }
            let what = match code {
                None => "still running at the group's limit (hung)".to_string(),
                Some(0) => continue,
                Some(c) => format!("exit status {c} (a crash or a panic)"),
            };
            failures.push(format!(
                "run {run}: rank {r} (rank {victim} killed {at:?} after the bootstrap; the \
                 group took {took:?} after it): {what}\n{out}\n{}",
                err.lines().rev().take(15).collect::<Vec<_>>().join("\n")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n---\n"));
}

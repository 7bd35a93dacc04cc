//! A send that completed is delivered whatever its sender does next: ranks that send to the
//! next rank, receive from the previous one and destroy their communicator at once (the drop of
//! `Comm`) lose no message, over the native TCP endpoint with one fabric for every peer, as
//! threads and as processes (7 rank processes, each making a new communicator per round: before
//! the goodbye, `coll::goodbye`, a receive of the ring failed in every run). And a peer that
//! never destroys does not hold a destroy past the communicator's deadline.
use nccl_net_fabricoll::algo::Collective;
use nccl_net_fabricoll::coll::bootstrap::{self, UniqueId};
use nccl_net_fabricoll::coll::{Call, Comm, Kind};
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::reduce::{DataType, RedOp};
use nccl_net_fabricoll::testing::skip;
use nccl_net_fabricoll::transport::Region;
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

/// Ranks of the ring.
const RANKS: usize = 7;

/// FABRICOLL_TIMEOUT_MS of these communicators: a lost message fails the receive at this
/// deadline instead of hanging the test.
const DEADLINE_MS: u32 = 20_000;

/// `RANKS` communicators over `provider` ("net", "tcp" or "shm"), one fabric for every peer.
fn ring(test: &str, provider: &str, ranks: usize, deadline_ms: u32) -> Option<Vec<Arc<Comm>>> {
    let domain = (provider != "shm").then_some("lo");
    let mut cfg: Config = common::fixed_model_on(Some(provider), domain, deadline_ms);
    // FABRICOLL_INTRA_PROVIDER=same
    cfg.intra_provider = None;
    common::comms_in_process(test, provider, &vec![cfg; ranks])
}

fn p2p(kind: Kind, buf: &mut [u8]) -> Call {
    Call {
        kind,
        // SAFETY: the buffer outlives the call (each rank waits for it before it returns).
        send: unsafe { Region::from_raw(buf.as_mut_ptr(), buf.len()) },
        // SAFETY: as above.
        recv: unsafe { Region::from_raw(buf.as_mut_ptr(), buf.len()) },
        count: buf.len(),
        dtype: DataType::Uint8,
        op: RedOp::Sum,
        root: 0,
        algo: None,
    }
}

/// One round: every rank sends 4 bytes to the next and receives 4 from the previous, waits for
/// both and drops its communicator at once (`ring_once`). Each rank's error, if any.
fn round(comms: Vec<Arc<Comm>>, round: usize) -> Vec<Option<String>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .map(|c| s.spawn(move || ring_once(c, round)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn no_message_lost(test: &str, provider: &str, rounds: usize) {
    for i in 0..rounds {
        let Some(comms) = ring(test, provider, RANKS, DEADLINE_MS) else {
            return;
        };
        let t = Instant::now();
        let errors: Vec<String> = round(comms, i).into_iter().flatten().collect();
        assert!(
            errors.is_empty(),
            "{provider}, round {i} (after {:?}): {errors:?}",
            t.elapsed()
        );
    }
}

#[test]
fn a_completed_send_survives_its_senders_destroy_over_net() {
    no_message_lost(
        "a_completed_send_survives_its_senders_destroy_over_net",
        "net",
        40,
    );
}

/// A peer that never destroys its communicator holds a destroy for the deadline, not longer:
/// the goodbye waits for it (it may still take our messages), and gives up at the deadline.
#[test]
fn a_peer_that_never_destroys_holds_a_destroy_for_the_deadline_only() {
    let test = "a_peer_that_never_destroys_holds_a_destroy_for_the_deadline_only";
    // The deadline is what this test checks: short.
    let deadline = Duration::from_millis(2000);
    let Some(mut comms) = ring(test, "net", 2, deadline.as_millis() as u32) else {
        return;
    };
    let stays = comms.pop().expect("two");
    let leaves = comms.pop().expect("two");
    let mut a = [7u8; 4];
    let mut b = [0u8; 4];
    std::thread::scope(|s| {
        s.spawn(|| leaves.run(&p2p(Kind::Send { peer: 1 }, &mut a)).unwrap());
        s.spawn(|| stays.run(&p2p(Kind::Recv { peer: 0 }, &mut b)).unwrap());
    });
    assert_eq!(b, [7u8; 4]);
    let t = Instant::now();
    drop(leaves);
    let took = t.elapsed();
    assert!(
        took >= deadline,
        "{test}: destroy returned after {took:?}, before its peer said goodbye or the deadline passed"
    );
    assert!(
        took < deadline + Duration::from_secs(30),
        "{test}: destroy took {took:?}, past the deadline of {deadline:?}"
    );
    drop(stays);
}

/// Set in a rank process: its provider.
const CHILD: &str = "GOODBYE_TEST_CHILD";

/// Rounds of the ring in each rank process: each makes a communicator (a split of the first),
/// runs a few collectives, then the ring, and destroys it.
const PROC_ROUNDS: usize = 30;

/// One rank's side of the ring on `c`, in round `round`; then `c` is dropped (the last
/// reference: the communicator is destroyed).
fn ring_once(c: Arc<Comm>, round: usize) -> Option<String> {
    let (r, n) = (c.rank, c.nranks);
    let mut out = (r as u32 * 1000 + round as u32).to_le_bytes();
    let mut inp = [0u8; 4];
    let res = (|| {
        let sreq = c.start(&p2p(Kind::Send { peer: (r + 1) % n }, &mut out))?;
        let rreq = c.start(&p2p(
            Kind::Recv {
                peer: (r + n - 1) % n,
            },
            &mut inp,
        ))?;
        c.wait(sreq)?;
        c.wait(rreq)
    })();
    drop(c);
    let want = (((r + n - 1) % n) as u32 * 1000 + round as u32).to_le_bytes();
    match res {
        Err(e) => Some(format!("rank {r}: {e}")),
        Ok(()) if inp != want => Some(format!("rank {r}: got {inp:?}, not {want:?}")),
        Ok(()) => None,
    }
}

/// A rank process: join, then `PROC_ROUNDS` times split a communicator off, run a few
/// collectives on it, the ring, and destroy it. Prints `@@lost` with each error.
#[test]
#[ignore = "a rank of the process tests, which start it; alone it has nothing to run"]
fn rank_process() {
    if std::env::var(CHILD).is_err() {
        return; // not started as a rank
    }
    let get = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} unset"));
    let rank: usize = get("GOODBYE_TEST_RANK").parse().unwrap();
    let nranks: usize = get("GOODBYE_TEST_NRANKS").parse().unwrap();
    let id = UniqueId::from_hex(&get("GOODBYE_TEST_ID"), "GOODBYE_TEST_ID").unwrap();
    let cfg = Config::from_env().unwrap();
    let base =
        Comm::init_rank(nranks, &id, rank, &cfg).unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    let mut lost = Vec::new();
    for i in 0..PROC_ROUNDS {
        let c = base.split(0, rank as i32, &cfg).unwrap().expect("a member");
        for (k, coll) in [Collective::AllReduce, Collective::AllGather]
            .into_iter()
            .enumerate()
        {
            let count = 16 << (k + i % 3);
            let mut a = vec![1u8; count * 4 * nranks];
            let mut b = vec![0u8; count * 4 * nranks];
            // SAFETY: both buffers outlive the blocking call.
            let (s, rv) = unsafe {
                (
                    Region::from_raw(a.as_mut_ptr(), a.len()),
                    Region::from_raw(b.as_mut_ptr(), b.len()),
                )
            };
            c.run(&common::call(Kind::Coll(coll), s, rv, count))
                .unwrap();
        }
        lost.extend(ring_once(Arc::new(c), i));
    }
    println!("@@lost {}", lost.join(" | "));
    // The first communicator outlives every round's: no rank leaves before all are done.
    let mut x = [0u8; 4];
    // SAFETY: the buffer outlives the blocking call.
    let reg = unsafe { Region::from_raw(x.as_mut_ptr(), 4) };
    base.run(&common::call(
        Kind::Coll(Collective::AllReduce),
        reg,
        reg,
        1,
    ))
    .unwrap();
}

/// `RANKS` rank processes over `provider` with one fabric for every peer; every error of their
/// rings.
fn in_processes(test: &str, provider: &str) -> Option<Vec<String>> {
    let id = bootstrap::new_unique_id(IpAddr::V4(Ipv4Addr::LOCALHOST), Duration::from_secs(600))
        .unwrap();
    let exe = std::env::current_exe().unwrap();
    let kids: Vec<_> = (0..RANKS)
        .map(|r| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "rank_process",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD, provider)
                .env("GOODBYE_TEST_RANK", r.to_string())
                .env("GOODBYE_TEST_NRANKS", RANKS.to_string())
                .env("GOODBYE_TEST_ID", id.to_hex())
                .env("FABRICOLL_PROVIDER", provider)
                .env("FABRICOLL_INTRA_PROVIDER", "same")
                .env("FABRICOLL_DOMAIN", "lo")
                .env("FABRICOLL_TIMEOUT_MS", DEADLINE_MS.to_string())
                .env("FABRICOLL_ALPHA_US", "5")
                .env("FABRICOLL_BETA_GBPS", "2")
                .env("FABRICOLL_GAMMA_GBPS", "8")
                .env_remove("FI_PROVIDER")
                .env_remove("FABRICOLL_ALGO")
                .env_remove("FABRICOLL_LOCAL_RANKS")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut lost = Vec::new();
    for (r, kid) in kids.into_iter().enumerate() {
        let o = kid.wait_with_output().unwrap();
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        );
        if err.contains("no libfabric device") || err.contains("no such provider here") {
            skip(test, &format!("provider {provider} missing here: {err}"));
            return None;
        }
        assert!(o.status.success(), "{test}: rank {r} failed:\n{out}\n{err}");
        let line = out
            .lines()
            .find_map(|l| l.split_once("@@lost ").map(|x| x.1.to_string()))
            .unwrap_or_else(|| panic!("{test}: rank {r} printed no result:\n{out}\n{err}"));
        lost.extend(
            line.split(" | ")
                .filter(|e| !e.is_empty())
                .map(String::from),
        );
    }
    Some(lost)
}

#[test]
fn a_completed_send_survives_its_senders_destroy_in_processes_over_net() {
    let test = "a_completed_send_survives_its_senders_destroy_in_processes_over_net";
    if let Some(lost) = in_processes(test, "net") {
        assert!(lost.is_empty(), "{test}: {lost:?}");
    }
}

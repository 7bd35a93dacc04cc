//! A send that completed is delivered whatever its sender does next: ranks that send to the
//! next rank, receive from the previous one and destroy their communicator at once (the drop of
//! `Comm`) lose no message, over the native TCP endpoint with one fabric for every peer, as
//! threads and as processes (7 rank processes, each making a new communicator per round: before
//! the goodbye, `coll::goodbye`, a receive of the ring failed in every run), and a process that
//! exits right after its destroy delivers what it sent (the exit waits for the closer,
//! `coll::closer`). Destroy itself returns at once: a peer that never destroys keeps the ended
//! communicator's endpoint open until the deadline only, and one thread that destroys several
//! ranks' communicators one after another waits for none of their goodbyes. Failed peers are
//! not waited for: a process whose peer aborted, or was killed (before or after its goodbye),
//! exits well within the deadline, and a peer that closed without goodbye holds the endpoint
//! briefly. Point-to-point calls (plain and tagged) mark their peer for the goodbye.
use nccl_net_fabricoll::algo::Collective;
use nccl_net_fabricoll::coll::bootstrap::{self, UniqueId};
use nccl_net_fabricoll::coll::{Call, Comm, Kind};
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::reduce::{DataType, RedOp};
use nccl_net_fabricoll::testing::skip;
use nccl_net_fabricoll::transport::{Region, Transport};
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Child, Stdio};
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

/// Destroy returns at once, and a peer that never destroys its communicator keeps the ended
/// one's endpoint open (in the closer) until the deadline, not longer: the goodbye waits for it
/// (it may still take our messages), and gives up at the deadline.
#[test]
fn a_peer_that_never_destroys_holds_the_endpoint_for_the_deadline_only() {
    let test = "a_peer_that_never_destroys_holds_the_endpoint_for_the_deadline_only";
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
    let endpoint = Arc::downgrade(leaves.transport());
    let t = Instant::now();
    drop(leaves);
    let returned = t.elapsed();
    assert!(
        returned < deadline,
        "{test}: destroy took {returned:?}: it waited for its silent peer instead of leaving the endpoint to the closer"
    );
    assert!(
        endpoint.upgrade().is_some(),
        "{test}: the endpoint closed before its peer said goodbye or the deadline passed"
    );
    let closed = wait_closed(&[endpoint], deadline + Duration::from_secs(30));
    assert!(
        closed >= deadline.saturating_sub(returned),
        "{test}: the endpoint closed after {closed:?}, before its peer said goodbye or the deadline passed"
    );
    assert!(
        closed < deadline + Duration::from_secs(30),
        "{test}: the endpoint was still open {closed:?} after destroy, past the deadline of {deadline:?}"
    );
    drop(stays);
}

/// How long until every endpoint of `eps` is closed (at most `limit`, then `limit`).
fn wait_closed(eps: &[std::sync::Weak<dyn Transport>], limit: Duration) -> Duration {
    let t = Instant::now();
    while eps.iter().any(|e| e.upgrade().is_some()) && t.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(5));
    }
    t.elapsed().min(limit)
}

/// One thread destroys the communicators of all ranks one after another, as a program that
/// holds several ranks does: no destroy waits for its peers (they are idle, destroyed later),
/// and every endpoint closes soon after the last destroy, since the earlier ones, lingering
/// open, answer the later ones' goodbyes. With a long deadline, so that a destroy that waited
/// for its peers' goodbyes (or an endpoint that stayed open until the deadline) shows.
#[test]
fn destroying_ranks_one_after_another_in_one_thread_waits_for_no_peer() {
    let test = "destroying_ranks_one_after_another_in_one_thread_waits_for_no_peer";
    let deadline = Duration::from_secs(60);
    // Far below the deadline, far above a destroy and a few round trips on a loaded machine.
    let bound = Duration::from_secs(20);
    for provider in ["net", "shm"] {
        let Some(comms) = ring(test, provider, 4, deadline.as_millis() as u32) else {
            continue;
        };
        // Each rank talks to its peers, so each destroy has goodbyes to wait for.
        std::thread::scope(|s| {
            for c in &comms {
                s.spawn(move || {
                    let (mut a, mut b) = (vec![1f32; 256], vec![0f32; 256]);
                    // SAFETY: both buffers outlive the blocking call.
                    let (sr, rr) = unsafe {
                        (
                            Region::from_raw(a.as_mut_ptr() as *mut u8, 1024),
                            Region::from_raw(b.as_mut_ptr() as *mut u8, 1024),
                        )
                    };
                    c.run(&common::call(
                        Kind::Coll(Collective::AllReduce),
                        sr,
                        rr,
                        256,
                    ))
                    .unwrap();
                    assert_eq!(b, vec![c.nranks as f32; 256]);
                });
            }
        });
        let endpoints: Vec<_> = comms
            .iter()
            .map(|c| Arc::downgrade(c.transport()))
            .collect();
        let t = Instant::now();
        for c in comms {
            let one = Instant::now();
            drop(c);
            assert!(
                one.elapsed() < bound,
                "{test}: {provider}: one destroy took {:?}: it waited for its idle peers",
                one.elapsed()
            );
        }
        let destroyed = t.elapsed();
        let closed = wait_closed(&endpoints, deadline);
        assert!(
            destroyed + closed < bound,
            "{test}: {provider}: the destroys took {destroyed:?} and the endpoints closed {closed:?} later: the lingering endpoints did not answer the later goodbyes"
        );
    }
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

/// In a rank process: its rank, the number of ranks, its configuration and the communicator
/// of all ranks. None where this process was not started as a rank.
fn join() -> Option<(usize, usize, Config, Comm)> {
    std::env::var(CHILD).ok()?;
    // FABRICOLL_LOG shows the ranks' logs in a failing test's output.
    nccl_net_fabricoll::ffi::logging::init(None);
    let get = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} unset"));
    let rank: usize = get("GOODBYE_TEST_RANK").parse().unwrap();
    let nranks: usize = get("GOODBYE_TEST_NRANKS").parse().unwrap();
    let id = UniqueId::from_hex(&get("GOODBYE_TEST_ID"), "GOODBYE_TEST_ID").unwrap();
    let cfg = Config::from_env().unwrap();
    let base =
        Comm::init_rank(nranks, &id, rank, &cfg).unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    Some((rank, nranks, cfg, base))
}

/// A rank process: join, then `PROC_ROUNDS` times split a communicator off, run a few
/// collectives on it, the ring, and destroy it. Prints `@@lost` with each error.
#[test]
#[ignore = "a rank of the process tests, which start it; alone it has nothing to run"]
fn rank_process() {
    let Some((rank, nranks, cfg, base)) = join() else {
        return;
    };
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

/// `ranks` processes of the rank test `child` over `provider` with one fabric for every peer
/// and a deadline of `deadline_ms`, their stdin piped (closed when dropped).
fn spawn(provider: &str, child: &str, ranks: usize, deadline_ms: u32) -> Vec<Child> {
    let id = bootstrap::new_unique_id(IpAddr::V4(Ipv4Addr::LOCALHOST), Duration::from_secs(600))
        .unwrap();
    (0..ranks)
        .map(|r| {
            common::ignored_test(child)
                .env(CHILD, provider)
                .env("GOODBYE_TEST_RANK", r.to_string())
                .env("GOODBYE_TEST_NRANKS", ranks.to_string())
                .env("GOODBYE_TEST_ID", id.to_hex())
                .env("FABRICOLL_PROVIDER", provider)
                .env("FABRICOLL_INTRA_PROVIDER", "same")
                .env("FABRICOLL_DOMAIN", "lo")
                .env("FABRICOLL_TIMEOUT_MS", deadline_ms.to_string())
                .env("FABRICOLL_ALPHA_US", "5")
                .env("FABRICOLL_BETA_GBPS", "2")
                .env("FABRICOLL_GAMMA_GBPS", "8")
                .env_remove("FI_PROVIDER")
                .env_remove("FABRICOLL_ALGO")
                .env_remove("FABRICOLL_LOCAL_RANKS")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect()
}

/// Whether a rank's stderr says that the provider is missing here (then `test` is skipped).
fn missing(test: &str, provider: &str, err: &str) -> bool {
    let gone = err.contains("no libfabric device") || err.contains("no such provider here");
    if gone {
        skip(test, &format!("provider {provider} missing here: {err}"));
    }
    gone
}

/// `ranks` processes of the rank test `child` over `provider` with one fabric for every peer;
/// every error they print.
fn in_processes(test: &str, provider: &str, child: &str, ranks: usize) -> Option<Vec<String>> {
    let kids = spawn(provider, child, ranks, DEADLINE_MS);
    let mut lost = Vec::new();
    for (r, kid) in kids.into_iter().enumerate() {
        let o = kid.wait_with_output().unwrap();
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        );
        if missing(test, provider, &err) {
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
    if let Some(lost) = in_processes(test, "net", "rank_process", RANKS) {
        assert!(lost.is_empty(), "{test}: {lost:?}");
    }
}

/// A rank process of two: rank 1 sends rank 0 a message that rank 0 never takes; rank 0 sends
/// rank 1 one, lets rank 1's arrive, destroys its communicator and exits at once; rank 1 posts
/// its receive only a while later, so that rank 0's message still waits on rank 1's side when
/// rank 0 leaves (and rank 0 leaves with rank 1's message unread, which resets the
/// connection). Rank 1 prints `@@lost` with what went wrong.
#[test]
#[ignore = "a rank of the process tests, which start it; alone it has nothing to run"]
fn exit_process() {
    let Some((rank, _, _, c)) = join() else {
        return;
    };
    let want = 0x600d_b1e5u32.to_le_bytes();
    let mut x = [0u8; 4];
    // Not deadlines: how long each side leaves the other to move first.
    let (arrive, leave) = (Duration::from_millis(500), Duration::from_millis(2000));
    if rank == 0 {
        x = want;
        c.run(&p2p(Kind::Send { peer: 1 }, &mut x)).unwrap();
        std::thread::sleep(arrive);
        drop(c);
        println!("@@lost ");
        std::process::exit(0);
    }
    let mut unwanted = [1u8; 4];
    c.run(&p2p(Kind::Send { peer: 0 }, &mut unwanted)).unwrap();
    std::thread::sleep(leave);
    let lost = match c.run(&p2p(Kind::Recv { peer: 0 }, &mut x)) {
        Err(e) => format!("rank 1: {e}"),
        Ok(()) if x != want => format!("rank 1: got {x:?}, not {want:?}"),
        Ok(()) => String::new(),
    };
    println!("@@lost {lost}");
}

/// A process that destroys its communicator and exits at once still delivers what it sent: the
/// exit waits for the ended communicator's goodbyes (its peer's receive was not even posted).
#[test]
fn a_process_that_destroys_and_exits_at_once_delivers_what_it_sent() {
    let test = "a_process_that_destroys_and_exits_at_once_delivers_what_it_sent";
    if let Some(lost) = in_processes(test, "net", "exit_process", 2) {
        assert!(lost.is_empty(), "{test}: {lost:?}");
    }
}

/// A rank that only sends (send/recv, and tagged): rank 0's send to rank 1 completes and it
/// destroys its communicator at once, while rank 1 waits for a message of rank 2's (sent a
/// moment later), polling its endpoint all the while, and takes rank 0's only after it. Over
/// net and tcp (ofi_rxm), plain and tagged.
#[test]
fn a_send_recv_only_pair_delivers_what_it_sent_over_net_and_tcp() {
    let test = "a_send_recv_only_pair_delivers_what_it_sent_over_net_and_tcp";
    // Not a deadline: how long rank 2 leaves rank 0 to destroy before it sends.
    let late = Duration::from_millis(300);
    for provider in ["net", "tcp"] {
        for (i, tag) in [0u32, 7].into_iter().enumerate() {
            let Some(comms) = ring(test, provider, 3, DEADLINE_MS) else {
                return;
            };
            let kind = |send, peer| match tag {
                0 if send => Kind::Send { peer },
                0 => Kind::Recv { peer },
                _ => Kind::Tagged { send, peer, tag },
            };
            let want = (0x5e4d_0000u32 + i as u32).to_le_bytes();
            let mut comms = comms.into_iter();
            let (c0, c1, c2) = (comms.next(), comms.next(), comms.next());
            let (c0, c1, c2) = (c0.expect("3"), c1.expect("3"), c2.expect("3"));
            let got = std::thread::scope(|s| {
                s.spawn(move || {
                    let mut x = want;
                    c0.run(&p2p(kind(true, 1), &mut x)).unwrap();
                    drop(c0);
                });
                s.spawn(move || {
                    std::thread::sleep(late);
                    let mut x = [2u8; 4];
                    c2.run(&p2p(kind(true, 1), &mut x)).unwrap();
                    drop(c2);
                });
                s.spawn(move || {
                    let mut y = [0u8; 4];
                    let mut x = [0u8; 4];
                    let r = c1
                        .run(&p2p(kind(false, 2), &mut y))
                        .and_then(|()| c1.run(&p2p(kind(false, 0), &mut x)));
                    drop(c1);
                    r.map(|()| (x, y))
                })
                .join()
                .unwrap()
            });
            match got {
                Ok((x, y)) => {
                    assert_eq!(y, [2u8; 4], "{test}: {provider} (tag {tag}): from rank 2");
                    assert_eq!(x, want, "{test}: {provider} (tag {tag}): from rank 0");
                }
                Err(e) => panic!("{test}: {provider} (tag {tag}): {e}"),
            }
        }
    }
}

/// The deadline of the process tests whose survivor must not wait for its failed peer: long,
/// so that a wait for it shows.
const LONG_DEADLINE_MS: u32 = 60_000;

/// Rank `rank` of two sends its peer 4 bytes and receives 4 from it.
fn exchange(c: &Comm, rank: usize) {
    let mut out = [rank as u8; 4];
    let mut inp = [9u8; 4];
    let s = c
        .start(&p2p(Kind::Send { peer: 1 - rank }, &mut out))
        .unwrap();
    let r = c
        .start(&p2p(Kind::Recv { peer: 1 - rank }, &mut inp))
        .unwrap();
    c.wait(s).unwrap();
    c.wait(r).unwrap();
    assert_eq!(inp, [(1 - rank) as u8; 4]);
}

/// A rank process of two: both exchange a message; rank 1 aborts its communicator (as
/// `fabricoll_comm_abort` does) and keeps it, endpoint open, until its stdin closes (the parent
/// closes it once rank 0 has exited); rank 0 destroys its communicator and exits.
#[test]
#[ignore = "a rank of the process tests, which start it; alone it has nothing to run"]
fn abort_process() {
    let Some((rank, _, _, c)) = join() else {
        return;
    };
    exchange(&c, rank);
    if rank == 1 {
        c.abort();
        c.leave_aborted();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
            let _ = tx.send(());
        });
        let _ = rx.recv_timeout(Duration::from_millis(2 * LONG_DEADLINE_MS as u64));
    }
    drop(c);
    println!("@@lost ");
}

/// A rank process of two: both exchange a message; rank 0 destroys its communicator and exits
/// at once; rank 1 kills itself (SIGKILL) a moment later, after rank 0's goodbye reached it
/// but before it said its own.
#[test]
#[ignore = "a rank of the process tests, which start it; alone it has nothing to run"]
fn killed_process() {
    killed(false);
}

/// As `killed_process`, but rank 1 kills itself at once and rank 0 destroys its communicator a
/// moment later: rank 0's goodbye goes to a peer already dead.
#[test]
#[ignore = "a rank of the process tests, which start it; alone it has nothing to run"]
fn killed_first_process() {
    killed(true);
}

/// Rank 1's death before rank 0's destroy (`first`) or after it.
fn killed(first: bool) {
    let Some((rank, _, _, c)) = join() else {
        return;
    };
    exchange(&c, rank);
    // Not a deadline: how long the other rank has to move first.
    let moment = Duration::from_millis(1000);
    if rank == 1 {
        if !first {
            std::thread::sleep(moment);
        }
        // SAFETY: kill with this process's own id and a valid signal has no preconditions.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    } else if first {
        std::thread::sleep(moment);
    }
    drop(c);
    println!("@@lost ");
}

/// Wait for `kid` (at most `limit`, then kill it): how long it ran since `start`, its output
/// and whether it exited with success. None where the provider is missing here.
fn finish(
    test: &str,
    provider: &str,
    kid: &mut Child,
    start: Instant,
    limit: Duration,
) -> Option<(Duration, String, Option<i32>)> {
    let status = loop {
        if let Some(s) = kid.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            let _ = kid.kill();
            break kid.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = start.elapsed();
    let mut out = String::new();
    let mut err = String::new();
    use std::io::Read;
    let _ = kid.stdout.take().unwrap().read_to_string(&mut out);
    let _ = kid.stderr.take().unwrap().read_to_string(&mut err);
    if missing(test, provider, &err) {
        return None;
    }
    use std::os::unix::process::ExitStatusExt;
    let text = format!("{status:?}\n{out}\n{err}");
    Some((took, text, status.signal()))
}

/// The survivor of a failed peer (`child`: aborted or killed) exits well within the deadline:
/// neither its destroy nor its exit waits for the goodbye that peer never says. Returns the
/// peer's end (its output and signal).
fn survivor_exits_promptly(test: &str, child: &str) -> Option<(String, Option<i32>)> {
    let deadline = Duration::from_millis(LONG_DEADLINE_MS as u64);
    let start = Instant::now();
    let mut kids = spawn("net", child, 2, LONG_DEADLINE_MS);
    let (took, text, signal) = finish(test, "net", &mut kids[0], start, 3 * deadline)?;
    // rank 1 (the aborted one) waits for its stdin to close.
    drop(kids[1].stdin.take());
    let (_, peer, peer_signal) = finish(test, "net", &mut kids[1], start, 3 * deadline)?;
    assert!(
        signal.is_none() && text.contains("@@lost"),
        "{test}: {child}: the survivor failed:\n{text}\npeer:\n{peer}"
    );
    assert!(
        took < deadline / 2,
        "{test}: {child}: the survivor took {took:?} to exit (deadline {deadline:?}): it waited for its failed peer:\n{text}"
    );
    Some((peer, peer_signal))
}

#[test]
fn a_process_whose_peer_aborted_exits_promptly() {
    let test = "a_process_whose_peer_aborted_exits_promptly";
    if let Some((peer, signal)) = survivor_exits_promptly(test, "abort_process") {
        assert!(
            signal.is_none() && peer.contains("@@lost"),
            "{test}: the aborting rank failed:\n{peer}"
        );
    }
}

/// Killed after the survivor's goodbye reached it, and before.
#[test]
fn a_peer_killed_with_sigkill_does_not_hold_the_survivors_exit() {
    let test = "a_peer_killed_with_sigkill_does_not_hold_the_survivors_exit";
    for child in ["killed_process", "killed_first_process"] {
        if let Some((peer, signal)) = survivor_exits_promptly(test, child) {
            assert_eq!(
                signal,
                Some(libc::SIGKILL),
                "{test}: {child}: the peer was to kill itself:\n{peer}"
            );
        }
    }
}

/// A rank that posted a receive from a peer that never took part (a lone rank's request) marks
/// that peer, but the peer, having talked to nobody, closes without goodbye: the farewell lets
/// it go once its endpoint is seen closed, well before the deadline (it held the endpoint, and
/// process exit, for the whole deadline). Over shm (a send into a closed endpoint's region
/// succeeds) and net, ranks in this process.
#[test]
fn a_peer_closed_without_goodbye_holds_the_endpoint_briefly() {
    let test = "a_peer_closed_without_goodbye_holds_the_endpoint_briefly";
    let deadline = Duration::from_millis(LONG_DEADLINE_MS as u64);
    for provider in ["shm", "net"] {
        let Some(mut comms) = ring(test, provider, 2, LONG_DEADLINE_MS) else {
            continue;
        };
        let silent = comms.pop().expect("two");
        let lone = comms.pop().expect("two");
        let mut x = [0u8; 4];
        lone.start(&p2p(Kind::Recv { peer: 1 }, &mut x)).unwrap();
        drop(silent);
        let endpoint = Arc::downgrade(lone.transport());
        drop(lone);
        let closed = wait_closed(&[endpoint], deadline);
        assert!(
            closed < deadline / 2,
            "{test}: {provider}: the endpoint stayed open {closed:?} for a peer that had closed (deadline {deadline:?})"
        );
    }
}

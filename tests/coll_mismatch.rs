//! Ranks whose calls differ (another collective, type, op, root or forced algorithm) never
//! succeed: the
//! reproducers of the outside test's F3. A rank that receives a message of the other call
//! fails at once, saying that the calls differ and which argument, and sends its peers a notice
//! that a stalled rank picks up. A rank that learns nothing of the other call (the provider
//! dropped the connection over the mismatched sizes before the notice came) fails with the
//! provider's error or a timeout, within the deadline.
use nccl_net_fabricoll::algo::{Algorithm, Collective};
use nccl_net_fabricoll::coll::{Call, Comm, Kind};
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::reduce::{DataType, RedOp};
use nccl_net_fabricoll::transport::Region;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

/// FABRICOLL_TIMEOUT_MS of these communicators.
const DEADLINE_MS: u32 = 3000;

/// One rank's call: collective, count, type, op, root, per-call algorithm (None: the model's).
type Sig = (Collective, usize, DataType, RedOp, usize, Option<Algorithm>);

/// `n` communicators over `transport` ("loopback", "shm", "net", or two fabrics, shm and
/// net, with the ranks on two hosts ("tiered-inter") or one ("tiered-intra")), or None
/// (skipped) where the provider is missing.
fn group(test: &str, transport: &str, n: usize) -> Option<Vec<Arc<Comm>>> {
    let mut cfg: Config = match transport {
        "net" | "tiered-inter" | "tiered-intra" => {
            common::fixed_model_on(Some("net"), Some("lo"), DEADLINE_MS)
        }
        "shm" => common::fixed_model(Some("shm"), DEADLINE_MS),
        _ => common::fixed_model(None, DEADLINE_MS),
    };
    if !transport.starts_with("tiered") {
        // Each provider between these ranks of one host (FABRICOLL_INTRA_PROVIDER=same).
        cfg.intra_provider = None;
    }
    let cfgs: Vec<Config> = (0..n)
        .map(|r| Config {
            host: Some(
                if transport == "tiered-inter" {
                    r % 2
                } else {
                    0
                }
                .to_string(),
            ),
            ..cfg.clone()
        })
        .collect();
    common::comms_in_process(test, transport, &cfgs)
}

/// Run `calls[r]` on rank r at once; each rank's error text (or "OK").
fn run(comms: &[Arc<Comm>], calls: &[Sig]) -> Vec<String> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .zip(calls.iter().copied())
            .map(|(comm, (coll, count, dtype, op, root, algo))| {
                s.spawn(move || {
                    // Room for the largest layout (ReduceScatter's input holds nranks chunks).
                    let bytes = 2 * count * dtype.size();
                    let (mut inp, mut out) = (vec![1u8; bytes], vec![0u8; bytes]);
                    // SAFETY: both buffers outlive the blocking call.
                    let (send, recv) = unsafe {
                        (
                            Region::from_raw(inp.as_mut_ptr(), bytes),
                            Region::from_raw(out.as_mut_ptr(), bytes),
                        )
                    };
                    let call = Call {
                        kind: Kind::Coll(coll),
                        send,
                        recv,
                        count,
                        dtype,
                        op,
                        root,
                        algo,
                    };
                    match comm.run(&call) {
                        Ok(()) => "OK".to_string(),
                        Err(e) => e.to_string(),
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Each case: the two ranks' calls and, per rank, what its error must say.
fn cases(count: usize) -> Vec<([Sig; 2], [&'static str; 2])> {
    use Collective::*;
    let (f32_, f64_, sum) = (DataType::Float32, DataType::Float64, RedOp::Sum);
    vec![
        (
            [
                (ReduceScatter, count, f32_, sum, 0, None),
                (AllReduce, count, f32_, sum, 0, None),
            ],
            ["rank 1 called AllReduce", "rank 0 called ReduceScatter"],
        ),
        (
            [
                (AllReduce, count, f32_, sum, 0, None),
                (AllReduce, count / 2, f64_, sum, 0, None),
            ],
            ["x double", "x float"],
        ),
        (
            [
                (AllReduce, count, f32_, sum, 0, None),
                (AllReduce, count, f32_, RedOp::Max, 0, None),
            ],
            ["rank 1 passed op max", "rank 0 passed op sum"],
        ),
        (
            [
                (Broadcast, count, f32_, sum, 0, None),
                (Broadcast, count, f32_, sum, 1, None),
            ],
            ["rank 1 named root 1", "rank 0 named root 0"],
        ),
        (
            [
                (Broadcast, count, f32_, sum, 0, None),
                (Reduce, count, f32_, sum, 0, None),
            ],
            ["rank 1 called Reduce", "rank 0 called Broadcast"],
        ),
        (
            [
                (AllReduce, count, f32_, sum, 0, Some(Algorithm::Ring)),
                (AllReduce, count, f32_, sum, 0, Some(Algorithm::Mesh)),
            ],
            ["rank 1 runs algorithm mesh", "rank 0 runs algorithm ring"],
        ),
    ]
}

fn check(test: &str, transport: &str, count: usize) {
    let Some(comms) = group(test, transport, 2) else {
        return;
    };
    for (calls, says) in cases(count) {
        let t = Instant::now();
        let got = run(&comms, &calls);
        let took = t.elapsed();
        assert!(
            took < Duration::from_millis(2 * DEADLINE_MS as u64 + 30_000),
            "{transport} {calls:?}: took {took:?}: {got:?}"
        );
        for (r, e) in got.iter().enumerate() {
            assert!(
                e.contains("the ranks' calls differ")
                    || e.starts_with("timeout")
                    || e.starts_with("remote error")
                    || e.starts_with("system error"),
                "{transport}, count {count}, {calls:?}: rank {r} said {e:?}"
            );
        }
        assert!(
            (0..2).any(|r| got[r].contains("the ranks' calls differ") && got[r].contains(says[r])),
            "{transport}, count {count}, {calls:?}: no rank named the argument: {got:?}"
        );
    }
}

#[test]
fn mismatched_calls_fail_on_every_rank_over_loopback() {
    check(
        "mismatched_calls_fail_on_every_rank_over_loopback",
        "loopback",
        1024,
    );
    check(
        "mismatched_calls_fail_on_every_rank_over_loopback",
        "loopback",
        1 << 20,
    );
}

#[test]
fn mismatched_calls_fail_on_every_rank_over_shm() {
    // Small calls run over the direct channel, large ones on the posted path.
    check("mismatched_calls_fail_on_every_rank_over_shm", "shm", 64);
    check(
        "mismatched_calls_fail_on_every_rank_over_shm",
        "shm",
        1 << 20,
    );
}

#[test]
fn mismatched_calls_fail_on_every_rank_over_net() {
    check("mismatched_calls_fail_on_every_rank_over_net", "net", 1024);
    check(
        "mismatched_calls_fail_on_every_rank_over_net",
        "net",
        1 << 20,
    );
}

#[test]
fn mismatched_calls_fail_on_every_rank_over_two_fabrics() {
    // The watch for notices is a receive without a sender, posted on both fabrics.
    let test = "mismatched_calls_fail_on_every_rank_over_two_fabrics";
    for transport in ["tiered-inter", "tiered-intra"] {
        check(test, transport, 1024);
        check(test, transport, 1 << 20);
    }
}

/// Broadcast from rank 0 against Reduce to rank 0 on every other rank, n = 3 to 5: a Reduce
/// leaf only sends, so its part is over before it could see the other call. Every rank learns
/// that the calls differ, once: in that call, or (a rank whose call returned success) from the
/// late notice, which a later call reports (the next that reads it: every call on the posted
/// path reads notices, the direct channel every 64th, and over TCP a notice may wait behind a
/// message of the other call until the endpoint looks for stopped connections). None times
/// out, and every other call succeeds.
fn broadcast_against_reduce(test: &str, transport: &str) {
    use Collective::*;
    let f32_ = DataType::Float32;
    for n in [3usize, 4, 5] {
        let Some(comms) = group(test, transport, n) else {
            return;
        };
        for count in [64usize, 1 << 16] {
            let mut calls = vec![(Reduce, count, f32_, RedOp::Sum, 0, None); n];
            calls[0].0 = Broadcast;
            let first = run(&comms, &calls);
            let fine = vec![(AllReduce, 16, f32_, RedOp::Sum, 0, None); n];
            let mut told: Vec<Vec<String>> = vec![Vec::new(); n];
            let waiting =
                |told: &Vec<Vec<String>>| (0..n).any(|r| first[r] == "OK" && told[r].is_empty());
            // Generous: the notices are a few bytes; this bounds a test that fails.
            let until = Instant::now() + Duration::from_secs(60);
            let mut calls_after = 0;
            while (calls_after < 17 || waiting(&told)) && Instant::now() < until {
                for (r, e) in run(&comms, &fine).into_iter().enumerate() {
                    if e != "OK" {
                        told[r].push(e);
                    }
                }
                calls_after += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            let last = run(&comms, &fine);
            let case = format!("{transport}, {n} ranks, count {count}: {first:?} then {told:?}");
            for r in 0..n {
                if first[r] == "OK" {
                    assert!(
                        told[r].len() == 1
                            && told[r][0].contains("returned success here, but rank")
                            && told[r][0].contains("the ranks' calls differ"),
                        "rank {r} should have been told once: {case}"
                    );
                } else {
                    assert!(
                        first[r].contains("the ranks' calls differ"),
                        "rank {r}: {case}"
                    );
                    assert!(told[r].is_empty(), "rank {r} told twice: {case}");
                }
            }
            assert!(last.iter().all(|e| e == "OK"), "{case}, then {last:?}");
        }
    }
}

#[test]
fn broadcast_against_reduce_fails_every_rank_over_loopback() {
    let test = "broadcast_against_reduce_fails_every_rank_over_loopback";
    broadcast_against_reduce(test, "loopback");
}

#[test]
fn broadcast_against_reduce_fails_every_rank_over_net() {
    broadcast_against_reduce("broadcast_against_reduce_fails_every_rank_over_net", "net");
}

#[test]
fn broadcast_against_reduce_fails_every_rank_over_shm() {
    broadcast_against_reduce("broadcast_against_reduce_fails_every_rank_over_shm", "shm");
}

#[test]
fn broadcast_against_reduce_fails_every_rank_over_two_fabrics() {
    // The receive of late notices has no sender: it is posted on both fabrics.
    let test = "broadcast_against_reduce_fails_every_rank_over_two_fabrics";
    broadcast_against_reduce(test, "tiered-inter");
}

//! Ranks as threads over the loopback transport: every algorithm x collective x a dtype/op
//! sample, in place and out of place, against an independent reference, bit-identical across
//! ranks; plus point-to-point, non-blocking calls, abort and bad arguments.
use nccl_net_fabricoll::algo::{self, Algorithm, Collective};
use nccl_net_fabricoll::coll::{Call, Comm, Kind};
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::reduce::{conv, fp8, DataType, RedOp};
use nccl_net_fabricoll::testing::pattern;
use nccl_net_fabricoll::transport::loopback::LoopbackFabric;
use nccl_net_fabricoll::transport::{Region, Transport};
use std::sync::Arc;

mod common;

fn cfg(extra: &[(&str, &str)]) -> Config {
    let mut kv: Vec<(String, String)> = vec![
        ("FABRICOLL_ALPHA_US".into(), "5".into()),
        ("FABRICOLL_BETA_GBPS".into(), "2".into()),
        ("FABRICOLL_GAMMA_GBPS".into(), "8".into()),
        ("FABRICOLL_TIMEOUT_MS".into(), "20000".into()),
        ("FABRICOLL_POLL_US".into(), "20".into()),
    ];
    kv.extend(extra.iter().map(|(a, b)| (a.to_string(), b.to_string())));
    Config::from_lookup(|n| {
        kv.iter()
            .rev()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
    })
    .unwrap()
}

/// Communicators for `n` ranks over one in-process fabric.
fn comms(n: usize, c: &Config) -> Vec<Comm> {
    let f = LoopbackFabric::new();
    let eps: Vec<Arc<dyn Transport>> = (0..n)
        .map(|_| Arc::new(f.endpoint()) as Arc<dyn Transport>)
        .collect();
    let addrs: Vec<Vec<u8>> = eps.iter().map(|e| e.address()).collect();
    eps.into_iter()
        .enumerate()
        .map(|(r, e)| Comm::new(r, e, &addrs, c).unwrap())
        .collect()
}

/// Encode a small integer-valued number as `dt` (independently of the reduction kernels).
fn enc(dt: DataType, v: f64) -> Vec<u8> {
    match dt {
        DataType::Int8 => (v as i8).to_le_bytes().to_vec(),
        DataType::Uint8 => (v as u8).to_le_bytes().to_vec(),
        DataType::Int32 => (v as i32).to_le_bytes().to_vec(),
        DataType::Uint32 => (v as u32).to_le_bytes().to_vec(),
        DataType::Int64 => (v as i64).to_le_bytes().to_vec(),
        DataType::Uint64 => (v as u64).to_le_bytes().to_vec(),
        DataType::Float16 => conv::f32_to_f16(v as f32).to_le_bytes().to_vec(),
        DataType::Float32 => (v as f32).to_le_bytes().to_vec(),
        DataType::Float64 => v.to_le_bytes().to_vec(),
        DataType::Bfloat16 => conv::f32_to_bf16(v as f32).to_le_bytes().to_vec(),
        DataType::Float8E4M3 => vec![fp8::f32_to_e4m3(v as f32)],
        DataType::Float8E5M2 => vec![fp8::f32_to_e5m2(v as f32)],
    }
}

const F32: DataType = DataType::Float32;
const SUM: RedOp = RedOp::Sum;

/// Rank r's input at element i for `op` over `dt` and `n` ranks: values that differ between
/// ranks at each element and follow no period (`testing::pattern`), so a block delivered to the
/// wrong rank or offset fails the check, and small enough that the reference is exact in `dt`
/// (products keep to 1 and 2; sums to the type's exact integers divided by n).
fn value(dt: DataType, op: RedOp, n: usize, r: usize, i: usize) -> f64 {
    let range = match op {
        RedOp::Prod => 2,
        RedOp::Sum | RedOp::Avg => pattern::range(dt, n, true),
        _ => pattern::range(dt, n, false),
    };
    pattern::value(range, r, i) as f64
}

fn combine(op: RedOp, vals: &[f64], dt: DataType) -> f64 {
    match op {
        RedOp::Sum => vals.iter().sum(),
        RedOp::Prod => vals.iter().product(),
        RedOp::Max => vals.iter().cloned().fold(f64::MIN, f64::max),
        RedOp::Min => vals.iter().cloned().fold(f64::MAX, f64::min),
        RedOp::Avg => {
            let s: f64 = vals.iter().sum();
            if dt.is_float() {
                (s as f32 / vals.len() as f32) as f64
            } else {
                (s as i64 / vals.len() as i64) as f64
            }
        }
        RedOp::BAnd => vals.iter().fold(-1i64, |a, &x| a & x as i64) as f64,
        RedOp::BOr => vals.iter().fold(0i64, |a, &x| a | x as i64) as f64,
        RedOp::BXor => vals.iter().fold(0i64, |a, &x| a ^ x as i64) as f64,
    }
}

fn buf(dt: DataType, vals: impl Iterator<Item = f64>) -> Vec<u8> {
    vals.flat_map(|v| enc(dt, v)).collect()
}

fn region(v: &mut [u8]) -> Region {
    // SAFETY: each buffer outlives the blocking call that uses it.
    unsafe { Region::from_raw(v.as_mut_ptr(), v.len()) }
}

/// Run one collective on n ranks; check every rank against the reference and each other.
fn run_case(
    comms: &[Comm],
    algo: Algorithm,
    coll: Collective,
    count: usize,
    dt: DataType,
    op: RedOp,
    in_place: bool,
) {
    let n = comms.len();
    let root = n / 2;
    let results: Vec<Vec<u8>> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                s.spawn(move || {
                    let p = algo::Problem::new(coll, n, count);
                    let el = dt.size();
                    let mut send = buf(dt, (0..p.in_len()).map(|i| value(dt, op, n, r, i)));
                    let mut out = vec![0xeeu8; p.out_len() * el];
                    // In place, NCCL's layouts: AllGather's input is the rank's slot of the
                    // output, ReduceScatter's output the rank's slot of the input, and the
                    // other collectives use one buffer for both.
                    let (in_at, out_at) = match coll {
                        Collective::AllGather => (r * count * el, 0),
                        Collective::ReduceScatter => (0, r * count * el),
                        _ => (0, 0),
                    };
                    let mut whole = vec![0xeeu8; send.len().max(out.len()) + in_at + out_at];
                    whole[in_at..in_at + send.len()].copy_from_slice(&send);
                    let (sr, rr) = if in_place {
                        let base = region(&mut whole);
                        (
                            base.sub(in_at, send.len()).unwrap(),
                            base.sub(out_at, out.len()).unwrap(),
                        )
                    } else {
                        (region(&mut send), region(&mut out))
                    };
                    let call = Call {
                        kind: Kind::Coll(coll),
                        send: sr,
                        recv: rr,
                        count,
                        dtype: dt,
                        op,
                        root,
                        algo: Some(algo),
                    };
                    c.run(&call).unwrap_or_else(|e| {
                        panic!("{algo} {coll:?} n={n} count={count} {dt:?} {op:?} rank {r}: {e}")
                    });
                    if in_place {
                        whole[out_at..out_at + out.len()].to_vec()
                    } else {
                        out
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let el = dt.size();
    for (r, out) in results.iter().enumerate() {
        let p = algo::Problem::new(coll, n, count);
        for j in 0..p.out_len() {
            let want = match coll {
                Collective::AllReduce => combine(
                    op,
                    &(0..n).map(|q| value(dt, op, n, q, j)).collect::<Vec<_>>(),
                    dt,
                ),
                Collective::ReduceScatter => combine(
                    op,
                    &(0..n)
                        .map(|q| value(dt, op, n, q, r * count + j))
                        .collect::<Vec<_>>(),
                    dt,
                ),
                Collective::Reduce if r == root => combine(
                    op,
                    &(0..n).map(|q| value(dt, op, n, q, j)).collect::<Vec<_>>(),
                    dt,
                ),
                Collective::Reduce => continue,
                Collective::AllGather => value(dt, op, n, j / count, j % count),
                Collective::Broadcast => value(dt, op, n, root, j),
                Collective::AllToAll => value(dt, op, n, j / count, r * count + j % count),
            };
            assert_eq!(
                &out[j * el..(j + 1) * el],
                &enc(dt, want)[..],
                "{algo} {coll:?} n={n} count={count} {dt:?} {op:?} in_place={in_place}: rank {r} element {j}"
            );
        }
    }
    if matches!(coll, Collective::AllReduce) {
        for r in 1..n {
            assert_eq!(
                results[r], results[0],
                "{algo}: AllReduce results differ between ranks 0 and {r}"
            );
        }
    }
}

const SAMPLE: &[(DataType, RedOp)] = &[
    (DataType::Int32, RedOp::Sum),
    (DataType::Float32, RedOp::Sum),
    (DataType::Float64, RedOp::Max),
    (DataType::Bfloat16, RedOp::Sum),
    (DataType::Uint8, RedOp::Min),
    (DataType::Float16, RedOp::Max),
    (DataType::Int64, RedOp::Avg),
    (DataType::Float32, RedOp::Avg),
    (DataType::Float8E4M3, RedOp::Max),
    (DataType::Uint64, RedOp::Prod),
    (DataType::Int32, RedOp::BXor),
    (DataType::Uint8, RedOp::BOr),
    (DataType::Int64, RedOp::BAnd),
];

/// A bitwise op on a floating-point type is an invalid argument naming the op and the type,
/// found before anything is sent: one rank calling alone gets it at once (no peer, no timeout).
#[test]
fn bitwise_ops_on_floats_fail_at_call_time() {
    let cs = comms(2, &cfg(&[("FABRICOLL_TIMEOUT_MS", "60000")]));
    for coll in [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::Reduce,
    ] {
        for dt in [DataType::Float32, DataType::Float16, DataType::Float8E5M2] {
            let mut a = vec![0u8; 64];
            let mut b = vec![0u8; 64];
            let t = std::time::Instant::now();
            let e = cs[0]
                .run(&Call {
                    kind: Kind::Coll(coll),
                    send: region(&mut a),
                    recv: region(&mut b),
                    count: 4,
                    dtype: dt,
                    op: RedOp::BXor,
                    root: 0,
                    algo: None,
                })
                .unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.contains("invalid argument")
                    && msg.contains("'op'")
                    && msg.contains("bxor")
                    && msg.contains(dt.name()),
                "{coll:?} {dt}: {msg}"
            );
            assert!(
                t.elapsed().as_secs() < 10,
                "{coll:?} {dt}: took {:?}",
                t.elapsed()
            );
        }
    }
    // Collectives that do not reduce ignore the op, as NCCL does.
    std::thread::scope(|s| {
        for c in &cs {
            s.spawn(move || {
                let mut a = vec![1u8; 16];
                c.run(&Call {
                    kind: Kind::Coll(Collective::Broadcast),
                    send: region(&mut a),
                    recv: region(&mut a),
                    count: 4,
                    dtype: DataType::Float32,
                    op: RedOp::BXor,
                    root: 0,
                    algo: None,
                })
                .unwrap();
            });
        }
    });
}

#[test]
fn every_algorithm_and_collective_on_threads() {
    for n in [1usize, 2, 3, 4, 5, 8] {
        let c = cfg(&[("FABRICOLL_LOCAL_RANKS", if n % 2 == 0 { "2" } else { "1" })]);
        let cs = comms(n, &c);
        for algo in Algorithm::ALL {
            for coll in Collective::ALL {
                if !algo::supports(algo, coll) {
                    continue;
                }
                for count in [0usize, 1, 7, 1000] {
                    let sample: &[(DataType, RedOp)] =
                        if coll.reduces() { SAMPLE } else { &SAMPLE[..3] };
                    for (i, &(dt, op)) in sample.iter().enumerate() {
                        // The full sample at one size, one pair elsewhere.
                        if count != 7 && i > 0 {
                            continue;
                        }
                        run_case(&cs, algo, coll, count, dt, op, false);
                    }
                    run_case(&cs, algo, coll, count, DataType::Float32, RedOp::Sum, true);
                }
            }
        }
    }
}

#[test]
fn large_sliced_collectives_and_auto_choice() {
    let cs = comms(4, &cfg(&[]));
    for coll in Collective::ALL {
        let count = if matches!(
            coll,
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce
        ) {
            600_001
        } else {
            150_001
        };
        for algo in [
            Algorithm::Ring,
            Algorithm::Rdh,
            Algorithm::Pairwise,
            Algorithm::Tree,
        ] {
            if algo::supports(algo, coll) {
                run_case(&cs, algo, coll, count, DataType::Float32, RedOp::Sum, false);
            }
        }
    }
    // auto (no override): whatever the model picks is correct too.
    for (i, c) in cs.iter().enumerate() {
        c.set_algo(None);
        let _ = i;
    }
    let results: Vec<Vec<u8>> = allreduce_each(&cs)
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert!(results.iter().all(|r| r == &results[0]));
}

#[test]
fn point_to_point_nonblocking_and_errors() {
    let cs = comms(3, &cfg(&[("FABRICOLL_TIMEOUT_MS", "500")]));
    std::thread::scope(|s| {
        let c0 = &cs[0];
        let c2 = &cs[2];
        s.spawn(move || {
            let mut a = vec![7u8; 100];
            let mut b = vec![9u8; 50];
            let r1 = c0
                .start(&Call {
                    kind: Kind::Send { peer: 2 },
                    send: region(&mut a),
                    recv: Region::empty(),
                    count: 25,
                    dtype: DataType::Int32,
                    op: RedOp::Sum,
                    root: 0,
                    algo: None,
                })
                .unwrap();
            let r2 = c0
                .start(&Call {
                    kind: Kind::Send { peer: 2 },
                    send: region(&mut b),
                    recv: Region::empty(),
                    count: 50,
                    dtype: DataType::Uint8,
                    op: RedOp::Sum,
                    root: 0,
                    algo: None,
                })
                .unwrap();
            c0.wait(r1).unwrap();
            c0.wait(r2).unwrap();
        });
        s.spawn(move || {
            let mut a = vec![0u8; 100];
            let mut b = vec![0u8; 50];
            c2.run(&Call {
                kind: Kind::Recv { peer: 0 },
                send: Region::empty(),
                recv: region(&mut a),
                count: 25,
                dtype: DataType::Int32,
                op: RedOp::Sum,
                root: 0,
                algo: None,
            })
            .unwrap();
            c2.run(&Call {
                kind: Kind::Recv { peer: 0 },
                send: Region::empty(),
                recv: region(&mut b),
                count: 50,
                dtype: DataType::Uint8,
                op: RedOp::Sum,
                root: 0,
                algo: None,
            })
            .unwrap();
            assert_eq!(a, vec![7u8; 100]);
            assert_eq!(b, vec![9u8; 50]);
        });
    });
    // Bad arguments are errors naming the argument.
    let c = &cs[1];
    let mut x = vec![0u8; 16];
    let bad_peer = c.run(&Call {
        kind: Kind::Send { peer: 9 },
        send: region(&mut x),
        recv: Region::empty(),
        count: 1,
        dtype: DataType::Int32,
        op: RedOp::Sum,
        root: 0,
        algo: None,
    });
    assert!(bad_peer.unwrap_err().to_string().contains("'peer'"));
    let bad_root = c.run(&Call {
        kind: Kind::Coll(Collective::Broadcast),
        send: region(&mut x),
        recv: region(&mut x),
        count: 1,
        dtype: DataType::Int32,
        op: RedOp::Sum,
        root: 7,
        algo: None,
    });
    assert!(bad_root.unwrap_err().to_string().contains("'root'"));
    let overflow = c.run(&Call {
        kind: Kind::Coll(Collective::AllGather),
        send: region(&mut x),
        recv: region(&mut x),
        count: usize::MAX / 2,
        dtype: DataType::Int32,
        op: RedOp::Sum,
        root: 0,
        algo: None,
    });
    assert!(overflow.unwrap_err().to_string().contains("'count'"));
    let short = c.run(&Call {
        kind: Kind::Coll(Collective::AllReduce),
        send: region(&mut x),
        recv: region(&mut x),
        count: 100,
        dtype: DataType::Int32,
        op: RedOp::Sum,
        root: 0,
        algo: Some(Algorithm::Ring),
    });
    assert!(short.unwrap_err().to_string().contains("sendbuff"));
    let na = c.run(&Call {
        kind: Kind::Coll(Collective::AllToAll),
        send: region(&mut x),
        recv: region(&mut x),
        count: 1,
        dtype: DataType::Int32,
        op: RedOp::Sum,
        root: 0,
        algo: Some(Algorithm::Ring),
    });
    assert!(na.unwrap_err().to_string().contains("accepted values"));
}

/// A float32 sum collective rooted at rank 0.
fn float_sum(
    coll: Collective,
    send: Region,
    recv: Region,
    count: usize,
    algo: Option<Algorithm>,
) -> Call {
    Call {
        algo,
        ..common::call(Kind::Coll(coll), send, recv, count)
    }
}

#[test]
fn a_missing_peer_times_out_and_in_place_input_is_restored() {
    // Rank 1 never joins: rank 0's in-place AllReduce fails within the deadline and its buffer
    // holds the original data, not a half-reduced one.
    let cs = comms(
        2,
        &cfg(&[
            ("FABRICOLL_TIMEOUT_MS", "300"),
            ("FABRICOLL_INPLACE_RESTORE", "1"),
        ]),
    );
    let mut data = buf(
        DataType::Float32,
        (0..1000).map(|i| value(F32, SUM, 2, 0, i)),
    );
    let orig = data.clone();
    let r = region(&mut data);
    let t = std::time::Instant::now();
    let e = cs[0]
        .run(&float_sum(
            Collective::AllReduce,
            r,
            r,
            1000,
            Some(Algorithm::Ring),
        ))
        .unwrap_err();
    // At the 300 ms deadline, give or take a loaded machine's delay.
    assert!(t.elapsed() < std::time::Duration::from_secs(30));
    assert!(e.to_string().contains("FABRICOLL_TIMEOUT_MS"), "{e}");
    assert_eq!(data, orig);
    // An in-place AllGather runs on the caller's input itself (no backup): failing, it leaves
    // that input as it was too.
    let mut whole = buf(
        DataType::Float32,
        (0..2000).map(|i| value(F32, SUM, 2, 0, i)),
    );
    let before = whole.clone();
    let base = region(&mut whole);
    let e = cs[0]
        .run(&float_sum(
            Collective::AllGather,
            base.sub(0, 4000).unwrap(),
            base,
            1000,
            Some(Algorithm::Ring),
        ))
        .unwrap_err();
    assert!(e.to_string().contains("FABRICOLL_TIMEOUT_MS"), "{e}");
    assert_eq!(whole[..4000], before[..4000]);
    // Abort makes later calls fail.
    cs[0].abort();
    assert!(cs[0]
        .run(&float_sum(Collective::AllReduce, r, r, 1, None))
        .is_err());
}

#[test]
fn mismatched_counts_across_ranks_are_errors_not_hangs() {
    // Rank 1 passes a larger count than rank 0. Each algorithm must end both calls with an error
    // within the deadline (a message of the wrong size is detected where it lands; the other
    // rank then loses its peer), never report success, and restore in-place inputs.
    for algo in [Algorithm::Ring, Algorithm::Mesh, Algorithm::Rdh] {
        let cs = comms(
            2,
            &cfg(&[
                ("FABRICOLL_TIMEOUT_MS", "1500"),
                ("FABRICOLL_INPLACE_RESTORE", "1"),
            ]),
        );
        let counts = [1000usize, 1200];
        let t = std::time::Instant::now();
        let outcomes: Vec<(String, bool)> = std::thread::scope(|s| {
            let hs: Vec<_> = cs
                .iter()
                .enumerate()
                .map(|(r, c)| {
                    s.spawn(move || {
                        let mut data = buf(
                            DataType::Float32,
                            (0..counts[r]).map(|i| value(F32, SUM, 2, r, i)),
                        );
                        let orig = data.clone();
                        let reg = region(&mut data);
                        let res = c.run(&Call {
                            kind: Kind::Coll(Collective::AllReduce),
                            send: reg,
                            recv: reg,
                            count: counts[r],
                            dtype: DataType::Float32,
                            op: RedOp::Sum,
                            root: 0,
                            algo: Some(algo),
                        });
                        let msg = match res {
                            Ok(()) => String::from("OK"),
                            Err(e) => e.to_string(),
                        };
                        (msg, data == orig)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "{algo:?}: took {:?}",
            t.elapsed()
        );
        for (r, (msg, restored)) in outcomes.iter().enumerate() {
            assert_ne!(msg, "OK", "{algo:?}: rank {r} reported success");
            assert!(
                restored,
                "{algo:?}: rank {r}'s in-place input was not restored"
            );
        }
        for (m, _) in &outcomes {
            assert!(
                m.contains("the ranks' calls differ") && m.contains("count"),
                "{algo:?}: a rank did not say what was wrong: {outcomes:?}"
            );
        }
    }
}

/// One allreduce of 1000 float32 elements with no per-call algorithm on every rank of `cs`:
/// each rank's result, or its error.
fn allreduce_each(cs: &[Comm]) -> Vec<Result<Vec<u8>, String>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = cs
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let mut send =
                        buf(F32, (0..1000).map(|i| value(F32, SUM, c.nranks, c.rank, i)));
                    let mut out = vec![0u8; 4000];
                    let call = Call {
                        kind: Kind::Coll(Collective::AllReduce),
                        send: region(&mut send),
                        recv: region(&mut out),
                        count: 1000,
                        dtype: F32,
                        op: SUM,
                        root: 0,
                        algo: None,
                    };
                    c.run(&call).map(|_| out).map_err(|e| e.to_string())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn fabricoll_algo_forms_run_allreduce() {
    let n = 4;
    let want = buf(
        F32,
        (0..1000).map(|i| {
            let v: Vec<f64> = (0..n).map(|r| value(F32, SUM, n, r, i)).collect();
            combine(SUM, &v, F32)
        }),
    );
    // bruck does not implement allreduce: the plain form leaves it to the model; the
    // per-collective form forces ring on it.
    for algo in [
        "bruck",
        "BRUCK",
        "allreduce:ring;allgather:bruck",
        "bruck;AllReduce:rdh",
    ] {
        assert!(!algo::supports(Algorithm::Bruck, Collective::AllReduce));
        let cs = comms(n, &cfg(&[("FABRICOLL_ALGO", algo)]));
        for (r, got) in allreduce_each(&cs).into_iter().enumerate() {
            assert_eq!(
                got.as_ref().ok(),
                Some(&want),
                "FABRICOLL_ALGO={algo}, rank {r}: {got:?}"
            );
        }
    }
    // Forced on the communicator (the C API's fabricoll_comm_set_algo), it stays an error,
    // also for a call that repeats one made before the setting changed (whose choice the
    // communicator keeps for the next equal call).
    let cs = comms(n, &cfg(&[]));
    for (r, got) in allreduce_each(&cs).into_iter().enumerate() {
        assert_eq!(got.as_ref().ok(), Some(&want), "auto, rank {r}: {got:?}");
    }
    for c in &cs {
        c.set_algo(Some(Algorithm::Bruck));
    }
    for (r, got) in allreduce_each(&cs).into_iter().enumerate() {
        let e = got.expect_err("bruck forced on the communicator");
        assert!(
            e.contains("bruck") && e.contains("AllReduce"),
            "rank {r}: {e}"
        );
    }
}

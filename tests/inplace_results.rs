//! In-place collectives give the same bytes whether the communicator restores a failed call's
//! input (a backup of all of it per call) or not (the steps work in the caller's buffer and
//! copy aside only what is read after being overwritten): every collective with an in-place
//! form, every algorithm that implements it, 2 to 5 ranks, odd counts, over the loopback
//! transport, shm and net; and both equal the out-of-place result.
use nccl_net_fabricoll::algo::{self, Algorithm, Collective};
use nccl_net_fabricoll::coll::{Call, Comm, Kind};
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::reduce::{DataType, RedOp};
use nccl_net_fabricoll::transport::Region;
use std::sync::Arc;

mod common;

const EL: usize = 4;

fn cfg(transport: &str, restore: bool) -> Config {
    let base = match transport {
        "net" => common::fixed_model_on(Some("net"), Some("lo"), 20_000),
        _ => common::fixed_model(Some("shm"), 20_000),
    };
    Config {
        inplace_restore: restore,
        ..base
    }
}

fn region(v: &mut [u8]) -> Region {
    // SAFETY: each buffer outlives the blocking call that uses it.
    unsafe { Region::from_raw(v.as_mut_ptr(), v.len()) }
}

/// Float values whose sums depend on the order of the additions, so that any difference in
/// what a step read shows in the bytes.
fn data(r: usize, len: usize) -> Vec<u8> {
    (0..len)
        .flat_map(|i| {
            let v = ((r * 7919 + i * 104_729) % 1000) as f32 * 0.001_3 + (r as f32 + 1.0) * 1e-7;
            v.to_le_bytes()
        })
        .collect()
}

/// Elements of each rank's buffer in place, and the byte range of its result in it.
fn layout(
    coll: Collective,
    n: usize,
    r: usize,
    count: usize,
    root: usize,
) -> (usize, usize, usize) {
    match coll {
        Collective::AllReduce | Collective::Broadcast => (count, 0, count * EL),
        Collective::Reduce => (count, 0, if r == root { count * EL } else { 0 }),
        Collective::AllGather | Collective::AllToAll => (n * count, 0, n * count * EL),
        Collective::ReduceScatter => (n * count, r * count * EL, (r + 1) * count * EL),
    }
}

/// One call on every rank at once; the ranks' buffers afterwards, or the first error.
fn run(
    cs: &[Arc<Comm>],
    coll: Collective,
    algo: Algorithm,
    count: usize,
    in_place: bool,
) -> Result<Vec<Vec<u8>>, String> {
    let n = cs.len();
    let root = n - 1;
    let outs: Vec<Result<Vec<u8>, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let c = cs[r].clone();
                s.spawn(move || {
                    let (len, _, _) = layout(coll, n, r, count, root);
                    let in_len = match coll {
                        Collective::AllGather => count,
                        Collective::ReduceScatter | Collective::AllToAll => n * count,
                        _ => count,
                    };
                    let mut buf = data(r, len);
                    let mut src = data(r, in_len);
                    if coll == Collective::AllGather {
                        // The own slot holds the input; the rest is overwritten.
                        buf[r * count * EL..(r + 1) * count * EL].copy_from_slice(&src);
                    }
                    let whole = region(&mut buf);
                    let (send, recv) = match (in_place, coll) {
                        // Out of place, the result lands where in place puts it.
                        (false, Collective::ReduceScatter) => (
                            region(&mut src),
                            whole.sub(r * count * EL, count * EL).unwrap(),
                        ),
                        (false, _) => (region(&mut src), whole),
                        (true, Collective::AllGather) => {
                            (whole.sub(r * count * EL, count * EL).unwrap(), whole)
                        }
                        (true, Collective::ReduceScatter) => {
                            (whole, whole.sub(r * count * EL, count * EL).unwrap())
                        }
                        (true, _) => (whole, whole),
                    };
                    let call = Call {
                        kind: Kind::Coll(coll),
                        send,
                        recv,
                        count,
                        dtype: DataType::Float32,
                        op: RedOp::Sum,
                        root,
                        algo: Some(algo),
                    };
                    c.run(&call).map_err(|e| e.to_string())?;
                    Ok(buf)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    outs.into_iter().collect()
}

fn check(test: &str, transport: &str, most: usize, counts: &[usize]) {
    for n in 2..=most {
        let made = [true, false].map(|restore| {
            let cfgs: Vec<Config> = (0..n).map(|_| cfg(transport, restore)).collect();
            common::comms_in_process(test, transport, &cfgs)
        });
        let [Some(restoring), Some(waived)] = made else {
            return;
        };
        for coll in Collective::ALL {
            for algo in Algorithm::ALL {
                if !algo::supports(algo, coll) {
                    continue;
                }
                for &count in counts {
                    let what = format!("{transport} {coll:?} {algo} n={n} count={count}");
                    let kept = run(&restoring, coll, algo, count, true);
                    let fast = run(&waived, coll, algo, count, true);
                    let (kept, fast) = match (kept, fast) {
                        (Ok(k), Ok(f)) => (k, f),
                        // Refused alike (an algorithm that needs several hosts, say).
                        (Err(a), Err(b)) if a == b => continue,
                        (k, f) => panic!("{what}: restoring {k:?} and not {f:?}"),
                    };
                    assert!(
                        kept == fast,
                        "{what}: in place with and without restore differ"
                    );
                    let out = run(&waived, coll, algo, count, false).unwrap();
                    for r in 0..n {
                        let (_, a, b) = layout(coll, n, r, count, n - 1);
                        assert!(
                            fast[r][a..b] == out[r][a..b],
                            "{what}: rank {r}'s in-place result differs from out of place"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn in_place_results_are_the_same_with_and_without_restore_over_loopback() {
    check(
        "in_place_results_are_the_same_with_and_without_restore_over_loopback",
        "loopback",
        5,
        &[7, 1001, 100_003],
    );
}

#[test]
fn in_place_results_are_the_same_with_and_without_restore_over_shm() {
    check(
        "in_place_results_are_the_same_with_and_without_restore_over_shm",
        "shm",
        5,
        &[7, 1001, 300_007],
    );
}

#[test]
fn in_place_results_are_the_same_with_and_without_restore_over_net() {
    check(
        "in_place_results_are_the_same_with_and_without_restore_over_net",
        "net",
        4,
        &[1001, 300_007],
    );
}

//! Over libfabric's native TCP endpoint (`net` in 1.17), a rank that sends before its peer
//! posts the receive must not stop the other traffic between the two: the provider stops
//! reading a connection at such a message until its receive is posted, and the transport
//! claims it (`transport::fabric::claim`). Ranks as threads, each with its own endpoint on
//! loopback; skipped where the provider is missing.
use nccl_net_fabricoll::algo::Collective;
use nccl_net_fabricoll::coll::{self, Comm, Kind};
use nccl_net_fabricoll::testing::skip;

mod common;
use common::call;
use nccl_net_fabricoll::transport::fabric::native_tcp;
use nccl_net_fabricoll::transport::Region;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `n` communicators over net endpoints on loopback, or None where the provider is missing
/// (test `test` is then skipped: `testing::skip`).
fn comms(test: &str, n: usize) -> Option<Vec<Arc<Comm>>> {
    let mut c = common::fixed_model_on(Some("net"), Some("lo"), 20000);
    // net between these ranks of one host, not shared memory (FABRICOLL_INTRA_PROVIDER=same).
    c.intra_provider = None;
    let eps = match (0..n)
        .map(|_| coll::open_endpoint(&c))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(e) => e,
        Err(e) => {
            skip(test, &format!("no net endpoint ({e})"));
            return None;
        }
    };
    if eps[0].caps().provider != native_tcp() {
        skip(test, "provider net not offered");
        return None;
    }
    let addrs: Vec<Vec<u8>> = eps.iter().map(|e| e.address()).collect();
    Some(
        eps.into_iter()
            .enumerate()
            .map(|(r, e)| Arc::new(Comm::new(r, e, &addrs, &c).unwrap()))
            .collect(),
    )
}

fn region(v: &mut [f32]) -> Region {
    // SAFETY: each buffer outlives the calls that use it (every request is waited for).
    unsafe { Region::from_raw(v.as_mut_ptr() as *mut u8, v.len() * 4) }
}

/// An in-place AllReduce of `count` floats on 2 ranks, checked.
fn allreduce(c: &Comm, count: usize) {
    let mut a: Vec<f32> = (0..count).map(|i| (i % 5) as f32).collect();
    let x = region(&mut a);
    c.run(&call(Kind::Coll(Collective::AllReduce), x, x, count))
        .unwrap();
    assert!(a
        .iter()
        .enumerate()
        .all(|(i, &v)| v == 2.0 * (i % 5) as f32));
}

#[test]
fn sends_posted_before_a_collective_do_not_stop_it_where_the_peer_receives_them_after() {
    let Some(cs) = comms(
        "sends_posted_before_a_collective_do_not_stop_it_where_the_peer_receives_them_after",
        2,
    ) else {
        return;
    };
    // Eight small messages (the provider keeps at most 4 unexpected small ones per
    // connection) and a large one, each before its receive.
    let sizes = [256usize, 256, 256, 256, 256, 256, 256, 256, 1 << 18];
    let ar = 1 << 16;
    let t = Instant::now();
    std::thread::scope(|s| {
        let c0 = cs[0].clone();
        s.spawn(move || {
            let mut bufs: Vec<Vec<f32>> = sizes
                .iter()
                .enumerate()
                .map(|(k, n)| (0..*n).map(|i| (k * 1000 + i % 997) as f32).collect())
                .collect();
            let reqs: Vec<_> = bufs
                .iter_mut()
                .zip(sizes)
                .map(|(b, n)| {
                    let x = region(b);
                    c0.start(&call(Kind::Send { peer: 1 }, x, x, n)).unwrap()
                })
                .collect();
            allreduce(&c0, ar);
            for r in reqs {
                c0.wait(r).unwrap();
            }
        });
        let c1 = cs[1].clone();
        s.spawn(move || {
            allreduce(&c1, ar);
            for (k, n) in sizes.into_iter().enumerate() {
                let mut b = vec![0f32; n];
                let x = region(&mut b);
                c1.run(&call(Kind::Recv { peer: 0 }, x, x, n)).unwrap();
                assert!(
                    b.iter()
                        .enumerate()
                        .all(|(i, &v)| v == (k * 1000 + i % 997) as f32),
                    "message {k}"
                );
            }
        });
    });
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

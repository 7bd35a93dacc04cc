//! shm ranks as threads of one process (siblings). libfabric's shm maps a sibling's region by
//! taking the sibling's own mapping, which its close unmaps: a rank that destroys its
//! communicator while a peer still finishes its collective (or holds a message from it) must
//! not take the region away under that peer (`transport::fabric::shm::siblings`). Before that
//! was handled the process died of SIGSEGV inside `fi_cq_read`, so a failure here may be the
//! whole test binary crashing.
use nccl_net_fabricoll::algo::Collective;
use nccl_net_fabricoll::coll::{self, Comm, Kind};
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::transport::Region;
use std::sync::Arc;

mod common;

/// Generous: these tests are about crashes, not deadlines.
const TIMEOUT_MS: u32 = 60_000;

fn config(fastbox: bool) -> Config {
    let mut cfg = common::fixed_model(Some("shm"), TIMEOUT_MS);
    cfg.intra_provider = None;
    cfg.host = Some("0".into());
    cfg.shm_fastbox = fastbox;
    cfg
}

/// Rank r's AllReduces of `counts` floats, checked; then it drops its communicator at once,
/// while slower peers may still be finishing.
fn allreduces_then_destroy(comm: Arc<Comm>, r: usize, n: usize, counts: &[usize]) {
    for &count in counts {
        let mut inp = vec![(r + 1) as f32; count];
        let mut out = vec![0f32; count];
        // SAFETY: both vectors outlive the blocking call.
        let (send, recv) = unsafe {
            (
                Region::from_raw(inp.as_mut_ptr().cast(), count * 4),
                Region::from_raw(out.as_mut_ptr().cast(), count * 4),
            )
        };
        let call = common::call(Kind::Coll(Collective::AllReduce), send, recv, count);
        comm.run(&call)
            .unwrap_or_else(|e| panic!("rank {r} of {n}, count {count}: {e}"));
        let want = (n * (n + 1) / 2) as f32;
        assert!(
            out.iter().all(|&x| x == want),
            "rank {r} of {n}, count {count}"
        );
    }
    drop(comm);
}

#[test]
fn a_rank_that_destroys_first_leaves_its_sibling_ranks_running() {
    let test = "a_rank_that_destroys_first_leaves_its_sibling_ranks_running";
    // Without the fastbox every message goes through the provider; with it, the hellos and
    // what falls back to the provider do.
    for fastbox in [false, true] {
        for n in [2, 3, 7] {
            for _round in 0..3 {
                let Some(comms) = common::comms_in_process(test, "shm", &vec![config(fastbox); n])
                else {
                    return;
                };
                std::thread::scope(|s| {
                    for (r, c) in comms.into_iter().enumerate() {
                        s.spawn(move || allreduces_then_destroy(c, r, n, &[1, 4096, 1 << 20]));
                    }
                });
            }
        }
    }
}

#[test]
fn the_address_of_a_destroyed_sibling_is_refused_naming_it() {
    let test = "the_address_of_a_destroyed_sibling_is_refused_naming_it";
    let cfg = config(true);
    let (a, b) = match (coll::open_endpoint(&cfg), coll::open_endpoint(&cfg)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            nccl_net_fabricoll::testing::skip(test, &format!("no shm endpoint ({e})"));
            return;
        }
    };
    let gone = a.address();
    drop(a);
    let e = b
        .insert_peer(&gone)
        .expect_err("a destroyed sibling's address")
        .to_string();
    assert!(e.contains("of this process was closed"), "{e}");
    // A live sibling is still welcome, and so is the same address twice.
    let c = coll::open_endpoint(&cfg).expect("a third endpoint");
    let p = b.insert_peer(&c.address()).expect("a live sibling");
    assert_eq!(b.insert_peer(&c.address()).expect("again"), p);
}

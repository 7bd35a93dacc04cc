//! `Comm::split` over shm endpoints of this process, ranks as threads pinned to CPUs: a new
//! communicator keeps its parent's measured cost model but learns for itself whether its own
//! ranks share CPUs (`tune::Model::shared_cpus`), alike on all of its ranks.
use nccl_net_fabricoll::coll::{self, placement, Comm};
use nccl_net_fabricoll::testing::skip;
use nccl_net_fabricoll::transport::Transport;
use std::sync::Arc;

mod common;

#[test]
fn a_split_communicator_learns_whether_its_own_ranks_share_cpus() {
    let test = "a_split_communicator_learns_whether_its_own_ranks_share_cpus";
    let mine = placement::allowed_cpus();
    if mine.len() < 2 {
        skip(
            test,
            &format!("needs 2 CPUs, this process may use {mine:?}"),
        );
        return;
    }
    let (a, b) = (mine[0], mine[1]);
    let c = common::fixed_model(Some("shm"), 20000);
    let eps: Vec<Arc<dyn Transport>> = match (0..4).map(|_| coll::open_endpoint(&c)).collect() {
        Ok(e) => e,
        Err(e) => {
            skip(test, &format!("no shm endpoint ({e})"));
            return;
        }
    };
    let addrs: Vec<Vec<u8>> = eps.iter().map(|e| e.address()).collect();
    // Ranks 0 and 1 get a CPU each; ranks 2 and 3 share one. Colour r / 2 splits them so.
    let pins = [vec![a], vec![b], vec![a], vec![a]];
    let children: Vec<bool> = std::thread::scope(|s| {
        let hs: Vec<_> = eps
            .into_iter()
            .enumerate()
            .map(|(r, ep)| {
                let (addrs, c, cpus) = (&addrs, &c, &pins[r]);
                s.spawn(move || {
                    placement::bind_to(cpus).expect("bind");
                    let parent = Comm::new(r, ep, addrs, c).unwrap();
                    let child = parent
                        .split((r / 2) as i32, r as i32, c)
                        .unwrap()
                        .expect("every rank has a colour");
                    // The configured parameters come from the parent.
                    assert_eq!(child.model(), parent.model());
                    child.model().shared_cpus
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(children, [false, false, true, true]);
}

//! CollNet semantics over the loopback plugin, ranks as threads: connect completes in one call,
//! iallreduce, and windowed iallgather / ireducescatter as NCCL issues them.
use nccl_net_fabricoll::plugin::{collnet, Plugin, HANDLE_SIZE};
use nccl_net_fabricoll::transport::loopback::LoopbackFabric;
use nccl_net_fabricoll::transport::Region;
use std::time::{Duration, Instant};

mod common;

fn region(v: &mut [u8]) -> Region {
    // SAFETY: buffers outlive the requests, which each test waits for.
    unsafe { Region::from_raw(v.as_mut_ptr(), v.len()) }
}

fn wait(req: u64) -> usize {
    let t = Instant::now();
    loop {
        if let Some(b) = collnet::test(req).unwrap() {
            return b;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "request hung");
    }
}

fn f32s(v: &[u8]) -> Vec<f32> {
    v.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn collnet_allreduce_and_windows() {
    for n in [1usize, 2, 3, 5] {
        let c = common::fixed_model(None, 10000);
        let f = LoopbackFabric::new();
        let plugin = Plugin::loopback(&f, 1, &c);
        let listens: Vec<([u8; HANDLE_SIZE], u64)> = (0..n)
            .map(|_| collnet::listen(&plugin, 0).unwrap())
            .collect();
        let handles: Vec<[u8; HANDLE_SIZE]> = listens.iter().map(|l| l.0).collect();
        let comms: Vec<u64> = (0..n)
            .map(|r| {
                let id = collnet::connect(&handles, r, listens[r].1, &c).unwrap();
                collnet::close_listen(listens[r].1).unwrap();
                id
            })
            .collect();
        for dt in 0..12 {
            for op in 0..4 {
                assert!(collnet::reduce_support(dt, op));
            }
            assert!(!collnet::reduce_support(dt, 4));
        }
        assert!(!collnet::reduce_support(12, 0));
        std::thread::scope(|s| {
            for (r, &id) in comms.iter().enumerate() {
                s.spawn(move || {
                    // AllReduce of 1000 floats, two in flight.
                    let count = 1000;
                    let mut send: Vec<u8> = (0..count)
                        .flat_map(|i| ((r * 3 + i) as f32).to_le_bytes())
                        .collect();
                    let mut recv = vec![0u8; count * 4];
                    let mut recv2 = vec![0u8; count * 4];
                    let q1 =
                        collnet::iallreduce(id, region(&mut send), region(&mut recv), count, 7, 0)
                            .unwrap();
                    let q2 =
                        collnet::iallreduce(id, region(&mut send), region(&mut recv2), count, 7, 2)
                            .unwrap();
                    assert_eq!(wait(q2), count * 4);
                    assert_eq!(wait(q1), count * 4);
                    for (i, v) in f32s(&recv).iter().enumerate() {
                        let want: f32 = (0..n).map(|q| (q * 3 + i) as f32).sum();
                        assert_eq!(*v, want, "allreduce sum n={n} rank {r} element {i}");
                    }
                    for (i, v) in f32s(&recv2).iter().enumerate() {
                        assert_eq!(*v, ((n - 1) * 3 + i) as f32, "allreduce max");
                    }
                    // AllGather and ReduceScatter of a 12-byte-per-rank buffer in windows of 7 bytes.
                    let bpr = 12usize;
                    let total = bpr * n;
                    let mine: Vec<u8> = (0..bpr).map(|i| (r * 16 + i) as u8).collect();
                    let mut got = vec![0u8; total];
                    let mut red = vec![0u8; bpr];
                    let input: Vec<u8> = (0..total).map(|g| (g + r) as u8).collect();
                    let mut off = 0;
                    while off < total {
                        let len = 7.min(total - off);
                        // This rank's slice inside the window (possibly empty).
                        let lo = (r * bpr).max(off);
                        let hi = ((r + 1) * bpr).min(off + len).max(lo);
                        let mut send_part = if hi > lo {
                            mine[lo - r * bpr..hi - r * bpr].to_vec()
                        } else {
                            Vec::new()
                        };
                        let send = (hi > lo).then(|| region(&mut send_part));
                        let mut win = vec![0u8; len];
                        let q =
                            collnet::iallgather(id, send, vec![region(&mut win)], bpr, off, len)
                                .unwrap();
                        assert_eq!(wait(q), len);
                        got[off..off + len].copy_from_slice(&win);
                        let mut in_part = input[off..off + len].to_vec();
                        let mut out_part = vec![0u8; hi - lo];
                        let recv = (hi > lo).then(|| region(&mut out_part));
                        let q = collnet::ireducescatter(
                            id,
                            vec![region(&mut in_part)],
                            recv,
                            bpr,
                            off,
                            len,
                            1,
                            0,
                        )
                        .unwrap();
                        wait(q);
                        if hi > lo {
                            red[lo - r * bpr..hi - r * bpr].copy_from_slice(&out_part);
                        }
                        off += len;
                    }
                    for (g, v) in got.iter().enumerate() {
                        assert_eq!(
                            *v,
                            ((g / bpr) * 16 + g % bpr) as u8,
                            "allgather n={n} rank {r} byte {g}"
                        );
                    }
                    for (i, v) in red.iter().enumerate() {
                        let g = r * bpr + i;
                        let want = (0..n).fold(0u8, |a, q| a.wrapping_add((g + q) as u8));
                        assert_eq!(*v, want, "reducescatter n={n} rank {r} byte {i}");
                    }
                });
            }
        });
        // Bad input.
        assert!(
            collnet::iallreduce(comms[0], Region::empty(), Region::empty(), 0, 99, 0)
                .unwrap_err()
                .to_string()
                .contains("dataType")
        );
        assert!(
            collnet::iallreduce(comms[0], Region::empty(), Region::empty(), 0, 7, 4)
                .unwrap_err()
                .to_string()
                .contains("redOp")
        );
        assert!(collnet::iallgather(comms[0], None, vec![], 4, 0, 0).is_err());
        assert!(
            collnet::iallgather(comms[0], None, vec![Region::empty()], 4, 4 * n, 4)
                .unwrap_err()
                .to_string()
                .contains("window")
        );
        assert!(collnet::test(0x1234).is_err());
        let mut bad = handles.clone();
        bad[0] = [0u8; HANDLE_SIZE];
        assert!(collnet::connect(&bad, 0, 0x999, &c).is_err());
        for id in comms {
            collnet::close_coll(id).unwrap();
        }
    }
}

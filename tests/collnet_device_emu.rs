//! CollNet on device buffers, on the emulated device (whose device memory the host cannot
//! touch: a host access dies of SIGSEGV): where the net device takes CUDA memory, CollNet
//! advertises it too, registers NCCL_PTR_CUDA buffers, and runs AllReduce and the windowed
//! AllGather and ReduceScatter on device buffers through the staged device path, as NCCL's
//! proxy calls them (ranks as threads over the loopback plugin); host buffers on the same comm
//! still take the host path; a device that takes host memory only refuses NCCL_PTR_CUDA; a
//! scatter-gather list of several device parts is refused, naming it.
use nccl_net_fabricoll::coll::device::{install, uninstall};
use nccl_net_fabricoll::device::{Device, DeviceBuffer, EmuConfig, Stream};
use nccl_net_fabricoll::plugin::{collnet, Plugin, HANDLE_SIZE, NCCL_PTR_CUDA, NCCL_PTR_HOST};
use nccl_net_fabricoll::transport::loopback::LoopbackFabric;
use nccl_net_fabricoll::transport::Region;
use std::time::{Duration, Instant};

mod common;

const WAIT: Duration = Duration::from_secs(60);

fn wait(req: u64) -> usize {
    let t = Instant::now();
    loop {
        if let Some(b) = collnet::test(req).unwrap() {
            return b;
        }
        assert!(t.elapsed() < WAIT, "request hung");
        std::thread::yield_now();
    }
}

fn region_of(b: &DeviceBuffer, off: usize, len: usize) -> Region {
    // SAFETY: device memory the test keeps allocated until its requests are done; nothing
    // on the host dereferences it (the plugin classifies it and stages it by copies).
    unsafe { Region::from_raw((b.addr() as usize + off) as *mut u8, len) }
}

fn host_region(v: &mut [u8]) -> Region {
    // SAFETY: buffers outlive the requests, which each test waits for.
    unsafe { Region::from_raw(v.as_mut_ptr(), v.len()) }
}

/// `bytes` in a fresh device buffer.
fn on_device(dev: &Device, s: &Stream, bytes: &[u8]) -> DeviceBuffer {
    let b = dev.alloc(bytes.len().max(1)).unwrap();
    if !bytes.is_empty() {
        s.upload(&b.span().slice(0..bytes.len()).unwrap(), bytes, WAIT)
            .unwrap();
    }
    b
}

fn read(s: &Stream, b: &DeviceBuffer, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    if len > 0 {
        s.download(&mut out, &b.span().slice(0..len).unwrap(), WAIT)
            .unwrap();
    }
    out
}

fn f32s(v: &[u8]) -> Vec<f32> {
    v.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// `n` collective comms over one loopback plugin whose CollNet device has `ptr_support`.
fn comms(plugin: &mut Plugin, n: usize, ptr_support: i32) -> Vec<u64> {
    let c = common::fixed_model(None, 10000);
    plugin.devices[0].collnet_props.ptr_support = ptr_support;
    let listens: Vec<([u8; HANDLE_SIZE], u64)> = (0..n)
        .map(|_| collnet::listen(plugin, 0).unwrap())
        .collect();
    let handles: Vec<[u8; HANDLE_SIZE]> = listens.iter().map(|l| l.0).collect();
    // Every rank connects at once, as NCCL's ranks do (a connect does not wait for its
    // peers, but the communicator's set-up does).
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (handles, listens, c) = (&handles, &listens, &c);
                s.spawn(move || {
                    let id = collnet::connect(handles, r, listens[r].1, c).unwrap();
                    collnet::close_listen(listens[r].1).unwrap();
                    id
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn collnet_reduces_and_gathers_device_buffers() {
    let dev = Device::emulated(EmuConfig::default()).expect("emulated device");
    install(dev.clone());
    for n in [2usize, 3] {
        let f = LoopbackFabric::new();
        let cfg = common::fixed_model(None, 10000);
        let mut plugin = Plugin::loopback(&f, 1, &cfg);
        let ids = comms(&mut plugin, n, NCCL_PTR_HOST | NCCL_PTR_CUDA);
        std::thread::scope(|sc| {
            for (r, &id) in ids.iter().enumerate() {
                let dev = dev.clone();
                sc.spawn(move || {
                    dev.bind().unwrap();
                    let s = dev.create_stream().unwrap();
                    // AllReduce (f32 sum) of several slices on device buffers, one of them in
                    // place, with a host-buffer AllReduce in flight beside them.
                    let count = 700_001;
                    let input: Vec<u8> = (0..count)
                        .flat_map(|i| ((r * 3 + i % 1000) as f32).to_le_bytes())
                        .collect();
                    let send = on_device(&dev, &s, &input);
                    let recv = on_device(&dev, &s, &vec![0u8; input.len()]);
                    let inplace = on_device(&dev, &s, &input);
                    let mh = collnet::reg_mr(id, region_of(&send, 0, input.len()), NCCL_PTR_CUDA)
                        .unwrap();
                    let bytes = input.len();
                    let q1 = collnet::iallreduce(
                        id,
                        region_of(&send, 0, bytes),
                        region_of(&recv, 0, bytes),
                        count,
                        7,
                        0,
                    )
                    .unwrap();
                    let mut hs: Vec<u8> = (0..1000u32)
                        .flat_map(|i| ((r as u32 + i) as f32).to_le_bytes())
                        .collect();
                    let mut hr = vec![0u8; hs.len()];
                    let q2 = collnet::iallreduce(
                        id,
                        host_region(&mut hs),
                        host_region(&mut hr),
                        1000,
                        7,
                        2,
                    )
                    .unwrap();
                    let q3 = collnet::iallreduce(
                        id,
                        region_of(&inplace, 0, bytes),
                        region_of(&inplace, 0, bytes),
                        count,
                        7,
                        0,
                    )
                    .unwrap();
                    assert_eq!(wait(q3), bytes);
                    assert_eq!(wait(q2), 4000);
                    assert_eq!(wait(q1), bytes);
                    collnet::dereg_mr(id, mh).unwrap();
                    for out in [read(&s, &recv, bytes), read(&s, &inplace, bytes)] {
                        for (i, v) in f32s(&out).iter().enumerate() {
                            let want: f32 = (0..n).map(|q| (q * 3 + i % 1000) as f32).sum();
                            assert_eq!(*v, want, "allreduce n={n} rank {r} element {i}");
                        }
                    }
                    for (i, v) in f32s(&hr).iter().enumerate() {
                        assert_eq!(*v, (n - 1 + i) as f32, "host allreduce max, element {i}");
                    }
                    // Windowed AllGather of bytes and ReduceScatter of u8 sums, one device
                    // part each, windows of 700 bytes over 1200 bytes per rank.
                    let bpr = 1200usize;
                    let total = bpr * n;
                    let mine: Vec<u8> = (0..bpr).map(|i| (r * 16 + i) as u8).collect();
                    let global: Vec<u8> = (0..total).map(|g| (g + r) as u8).collect();
                    let mut off = 0;
                    while off < total {
                        let len = 700.min(total - off);
                        let lo = (r * bpr).max(off);
                        let hi = ((r + 1) * bpr).min(off + len).max(lo);
                        let own: &[u8] = if hi > lo {
                            &mine[lo - r * bpr..hi - r * bpr]
                        } else {
                            &[]
                        };
                        let sendb = on_device(&dev, &s, own);
                        let win = on_device(&dev, &s, &vec![0u8; len]);
                        let send = (hi > lo).then(|| region_of(&sendb, 0, hi - lo));
                        let q = collnet::iallgather(
                            id,
                            send,
                            vec![region_of(&win, 0, len)],
                            bpr,
                            off,
                            len,
                        )
                        .unwrap();
                        assert_eq!(wait(q), len);
                        for (k, v) in read(&s, &win, len).iter().enumerate() {
                            let g = off + k;
                            assert_eq!(
                                *v,
                                ((g / bpr) * 16 + g % bpr) as u8,
                                "allgather n={n} rank {r} byte {g}"
                            );
                        }
                        let inp = on_device(&dev, &s, &global[off..off + len]);
                        let out = on_device(&dev, &s, &vec![0u8; (hi - lo).max(1)]);
                        let recv = (hi > lo).then(|| region_of(&out, 0, hi - lo));
                        let q = collnet::ireducescatter(
                            id,
                            vec![region_of(&inp, 0, len)],
                            recv,
                            bpr,
                            off,
                            len,
                            1,
                            0,
                        )
                        .unwrap();
                        wait(q);
                        for (k, v) in read(&s, &out, hi - lo).iter().enumerate() {
                            let g = lo + k;
                            let want = (0..n).fold(0u8, |a, q| a.wrapping_add((g + q) as u8));
                            assert_eq!(*v, want, "reducescatter n={n} rank {r} byte {g}");
                        }
                        off += len;
                    }
                    // Several device parts: refused, naming the list.
                    let a = on_device(&dev, &s, &[0u8; 8]);
                    let e = collnet::iallgather(
                        id,
                        Some(region_of(&a, 0, 4)),
                        vec![region_of(&a, 0, 4), region_of(&a, 4, 4)],
                        4,
                        0,
                        8,
                    );
                    match e {
                        Err(e) => assert!(e.to_string().contains("recvParts"), "{e}"),
                        Ok(_) => panic!("several device parts were taken"),
                    }
                });
            }
        });
        for id in ids {
            collnet::close_coll(id).unwrap();
        }
    }
    // A device AllReduce whose peer never joins: closing the comm ends it (the request goes
    // with the comm) at once, without a hang or a host access to the device buffers.
    {
        let f = LoopbackFabric::new();
        let cfg = common::fixed_model(None, 10000);
        let mut plugin = Plugin::loopback(&f, 1, &cfg);
        let ids = comms(&mut plugin, 2, NCCL_PTR_HOST | NCCL_PTR_CUDA);
        dev.bind().unwrap();
        let b = dev.alloc(1 << 22).unwrap();
        let q = collnet::iallreduce(
            ids[0],
            region_of(&b, 0, 1 << 22),
            region_of(&b, 0, 1 << 22),
            1 << 20,
            7,
            0,
        )
        .unwrap();
        assert_eq!(collnet::test(q).unwrap(), None, "done without its peer");
        let t = Instant::now();
        for id in ids {
            collnet::close_coll(id).unwrap();
        }
        assert!(t.elapsed() < WAIT, "closing took {:?}", t.elapsed());
        assert!(collnet::test(q).is_err(), "the request outlived its comm");
    }
    // A CollNet device that takes host memory only refuses NCCL_PTR_CUDA, naming why.
    let f = LoopbackFabric::new();
    let cfg = common::fixed_model(None, 10000);
    let mut plugin = Plugin::loopback(&f, 1, &cfg);
    let ids = comms(&mut plugin, 1, NCCL_PTR_HOST);
    let b = dev.alloc(64).unwrap();
    let e = collnet::reg_mr(ids[0], region_of(&b, 0, 64), NCCL_PTR_CUDA).unwrap_err();
    assert!(e.to_string().contains("host memory only"), "{e}");
    collnet::close_coll(ids[0]).unwrap();
    uninstall();
    assert_eq!(collnet::live(), (0, 0, 0));
}

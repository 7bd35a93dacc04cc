//! Neuron's tables (`ncclNetPlugin_v4` ... `_v6` of `libnccom-net.so`) driven through their slots
//! as libnccom calls them, over one libfabric provider (`run`; a test binary per provider, as
//! the configuration is read once per process): the lifecycle (init, fini,
//! init again), non-blocking v6 and blocking v4 setup, transfers, 128 requests in flight, flush,
//! registrations, RMA where the provider offers it, and the errors libnccom relies on. The
//! tables are compiled, unexported, into the NCCL flavour too, which is what this test links.
//! The C harness (plugin-tests/neuron_harness.c) checks the same through the exported library.
use nccl_net_fabricoll::error::nccl;
use nccl_net_fabricoll::ffi::neuron::types::{NeuronPropsV4, NeuronPropsV6};
use nccl_net_fabricoll::ffi::neuron::{NEURON_NET_V4, NEURON_NET_V6};
use std::ffi::c_void;
use std::os::raw::c_int;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

type P = *mut c_void;

const HANDLE: usize = 128;

/// Call `f` until it sets its out-pointer, with a deadline.
fn until_set(what: &str, mut f: impl FnMut(&mut P) -> c_int) -> P {
    let start = Instant::now();
    let mut out: P = null_mut();
    loop {
        assert_eq!(f(&mut out), nccl::SUCCESS, "{what}");
        if !out.is_null() {
            return out;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{what} hung");
    }
}

/// A send and a receive comm on device 0, set up from this one thread (v6: never blocks).
fn pair() -> (P, P, P) {
    let t = &NEURON_NET_V6;
    let mut handle = [0u8; HANDLE];
    let mut listen: P = null_mut();
    // SAFETY: a 128-byte handle and a writable out-pointer.
    let rc = unsafe { (t.listen)(0, handle.as_mut_ptr().cast(), &mut listen) };
    assert_eq!(rc, nccl::SUCCESS);
    let (mut s, mut r): (P, P) = (null_mut(), null_mut());
    let start = Instant::now();
    while s.is_null() || r.is_null() {
        if s.is_null() {
            // SAFETY: the same handle buffer each time, as the ABI asks.
            let rc = unsafe { (t.connect)(0, handle.as_mut_ptr().cast(), &mut s) };
            assert_eq!(rc, nccl::SUCCESS);
        }
        if r.is_null() {
            // SAFETY: `listen` came from listen above.
            assert_eq!(unsafe { (t.accept)(listen, &mut r) }, nccl::SUCCESS);
        }
        assert!(start.elapsed() < Duration::from_secs(20), "setup hung");
    }
    (listen, s, r)
}

fn wait(req: P) -> c_int {
    let mut size: c_int = -1;
    let start = Instant::now();
    loop {
        let mut done = 0;
        // SAFETY: a request of this plugin and writable ints.
        let rc = unsafe { (NEURON_NET_V6.test)(req, &mut done, &mut size) };
        assert_eq!(rc, nccl::SUCCESS);
        if done == 1 {
            return size;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "request hung");
    }
}

fn reg(comm: P, buf: &mut [u8]) -> P {
    let mut mh: P = null_mut();
    // SAFETY: `buf` outlives its registration (deregistered before it is dropped).
    let rc =
        unsafe { (NEURON_NET_V6.reg_mr)(comm, buf.as_mut_ptr().cast(), buf.len(), 1, &mut mh) };
    assert_eq!(rc, nccl::SUCCESS);
    mh
}

fn transfer(s: P, r: P, len: usize, tag: c_int) {
    let t = &NEURON_NET_V6;
    let mut src: Vec<u8> = (0..len).map(|i| (i * 7 + tag as usize) as u8).collect();
    let mut dst = vec![0u8; len];
    let (ms, mr) = (reg(s, &mut src), reg(r, &mut dst));
    let (mut d, mut size, mut tg, mut m) = (dst.as_mut_ptr().cast(), len as c_int, tag, mr);
    // SAFETY: one-element arrays; the buffers live until the requests are done.
    let rr = until_set("irecv", |o| unsafe {
        (t.irecv)(r, 1, &mut d, &mut size, &mut tg, &mut m, o)
    });
    // SAFETY: as above.
    let sr = until_set("isend", |o| unsafe {
        (t.isend)(s, src.as_mut_ptr().cast(), len as c_int, tag, ms, o)
    });
    assert_eq!(wait(sr) as usize, len);
    assert_eq!(wait(rr) as usize, len);
    assert!(src == dst, "{len} bytes arrived changed");
    // SAFETY: registrations of these comms.
    unsafe {
        assert_eq!((t.dereg_mr)(s, ms), nccl::SUCCESS);
        assert_eq!((t.dereg_mr)(r, mr), nccl::SUCCESS);
    }
}

/// Everything, over `provider` (`tcp` and `net` on the loopback interface). Once per process.
pub fn run(provider: &str) {
    std::env::set_var("FABRICOLL_PROVIDER", provider);
    if provider != "shm" {
        std::env::set_var("FABRICOLL_DOMAIN", "lo");
    }
    std::env::set_var("FABRICOLL_TIMEOUT_MS", "5000");
    let t = &NEURON_NET_V6;
    // SAFETY: each call below passes what the Neuron ABI asks: writable out-pointers, buffers
    // that outlive their requests, handles this plugin returned.
    unsafe {
        let mut n = 0;
        assert_eq!(
            (t.devices)(&mut n),
            nccl::INVALID_USAGE,
            "devices before init"
        );
        let rc = (t.init)(None);
        if rc != nccl::SUCCESS {
            nccl_net_fabricoll::testing::skip(
                &format!("neuron_tables_over_{provider}"),
                &format!("no {provider} provider"),
            );
            return;
        }
        assert_eq!((t.init)(None), nccl::SYSTEM_ERROR, "a second init");
        assert_eq!((t.devices)(&mut n), nccl::SUCCESS);
        assert!(n >= 1);

        let mut p6: NeuronPropsV6 = std::mem::zeroed();
        assert_eq!((t.get_properties)(0, &mut p6), nccl::SUCCESS);
        assert_eq!((p6.max_recvs, p6.ptr_support, p6.port), (1, 1, 1));
        assert_eq!(p6.reg_is_global, 0, "no registration cache under Neuron");
        assert!(p6.speed > 0 && p6.latency > 0.0 && p6.max_comms > 0);
        let rma = p6.rma_supported == 1;
        assert_eq!(rma, p6.max_write_inline_size > 0);
        let mut p4: NeuronPropsV4 = std::mem::zeroed();
        assert_eq!((NEURON_NET_V4.get_properties)(0, &mut p4), nccl::SUCCESS);
        assert_eq!((p4.guid, p4.port), (p6.guid, 1));

        let (listen, s, r) = pair();
        for len in [0, 1, 4096, 1 << 20] {
            transfer(s, r, len, 7);
        }

        // 128 requests in flight each way on one comm pair.
        let (k, w) = (128, 64);
        let mut src: Vec<u8> = (0..k * w).map(|i| (i / w) as u8).collect();
        let mut dst = vec![0u8; k * w];
        let (ms, mr) = (reg(s, &mut src), reg(r, &mut dst));
        let mut reqs = Vec::new();
        for i in 0..k {
            let mut d: P = dst.as_mut_ptr().add(i * w).cast();
            let (mut size, mut tg, mut m) = (w as c_int, 1, mr);
            let mut req: P = null_mut();
            assert_eq!(
                (t.irecv)(r, 1, &mut d, &mut size, &mut tg, &mut m, &mut req),
                nccl::SUCCESS
            );
            assert!(!req.is_null(), "receive {i} refused as busy");
            reqs.push(req);
        }
        for i in 0..k {
            let req = until_set("isend", |o| {
                (t.isend)(s, src.as_mut_ptr().add(i * w).cast(), w as c_int, 1, ms, o)
            });
            reqs.push(req);
        }
        for q in reqs {
            assert_eq!(wait(q), w as c_int);
        }
        assert!(src == dst);
        assert_eq!((t.dereg_mr)(s, ms), nccl::SUCCESS);
        assert_eq!((t.dereg_mr)(r, mr), nccl::SUCCESS);

        // iflush on host memory: a request, done at once (NULL would mean "busy").
        let mut buf = vec![0u8; 8];
        let (mut d, mut size, mut m) = (buf.as_mut_ptr().cast(), 8, null_mut());
        let mut req: P = null_mut();
        assert_eq!(
            (t.iflush)(r, 1, &mut d, &mut size, &mut m, &mut req),
            nccl::SUCCESS
        );
        assert!(!req.is_null());
        wait(req);
        // A handle that is no registration is refused, as a receive refuses it.
        let mut garbage: P = 0xdead_beef_usize as P;
        let mut req: P = null_mut();
        assert_eq!(
            (t.iflush)(r, 1, &mut d, &mut size, &mut garbage, &mut req),
            nccl::INVALID_ARGUMENT
        );
        assert!(req.is_null());

        // Registrations: exact sub-page ranges; CUDA and Neuron memory refused.
        let mut small = vec![0u8; 100];
        let mh = reg(r, &mut small[3..40]);
        assert_eq!((t.dereg_mr)(r, mh), nccl::SUCCESS);
        let mut mh: P = null_mut();
        assert_eq!(
            (t.reg_mr)(r, small.as_mut_ptr().cast(), 100, 2, &mut mh),
            nccl::INVALID_ARGUMENT
        );
        assert_eq!(
            (t.reg_mr)(r, small.as_mut_ptr().cast(), 100, 4, &mut mh),
            nccl::INVALID_USAGE
        );

        // Bad input.
        let (mut d, mut size, mut tg, mut m) = (buf.as_mut_ptr().cast(), 8, 0, null_mut());
        for n in [0, 9] {
            let mut req: P = null_mut();
            let rc = (t.irecv)(r, n, &mut d, &mut size, &mut tg, &mut m, &mut req);
            assert_eq!(rc, nccl::INVALID_ARGUMENT, "irecv n = {n}");
        }
        let mut req: P = null_mut();
        let rc = (t.isend)(
            null_mut(),
            buf.as_mut_ptr().cast(),
            8,
            0,
            null_mut(),
            &mut req,
        );
        assert_eq!(rc, nccl::INVALID_ARGUMENT, "NULL comm");
        let mut garbage = [0xabu8; HANDLE];
        let mut c: P = null_mut();
        assert_eq!(
            (t.connect)(0, garbage.as_mut_ptr().cast(), &mut c),
            nccl::INVALID_ARGUMENT
        );

        // RMA: write into and read from the receiver's buffer at offsets.
        let mut key = 0u64;
        if rma {
            let mut target = vec![0u8; 1 << 16];
            let tmh = reg(r, &mut target);
            assert_eq!((t.get_mr_key)(tmh, &mut key), nccl::SUCCESS);
            let base = target.as_ptr() as u64;
            let mut src = vec![0x5au8; 4096];
            let smh = reg(s, &mut src);
            let q = until_set("iwrite", |o| {
                (t.iwrite)(s, src.as_mut_ptr().cast(), 4096, smh, base + 100, key, o)
            });
            wait(q);
            assert!(target[100..4196].iter().all(|b| *b == 0x5a) && target[99] == 0);
            let mut inline = [0x11u8; 8];
            let q = until_set("iwriteInline", |o| {
                (t.iwrite_inline)(s, inline.as_mut_ptr().cast(), 8, base + 8000, key, o)
            });
            wait(q);
            // The inject completes locally: poll the target for its arrival.
            let start = Instant::now();
            while std::ptr::read_volatile(&target[8007]) != 0x11 {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "inline write lost"
                );
                let mut done = 0;
                let (mut d, mut size, mut m) = (buf.as_mut_ptr().cast(), 8, null_mut());
                let mut f: P = null_mut();
                (t.iflush)(r, 1, &mut d, &mut size, &mut m, &mut f);
                (t.test)(f, &mut done, null_mut());
            }
            // iread on the receive comm reads the connector's (send side's) memory.
            let mut back = vec![0u8; 4096];
            let bmh = reg(r, &mut back);
            let mut skey = 0u64;
            assert_eq!((t.get_mr_key)(smh, &mut skey), nccl::SUCCESS);
            let q = until_set("iread", |o| {
                (t.iread)(
                    r,
                    back.as_mut_ptr().cast(),
                    4096,
                    bmh,
                    src.as_ptr() as u64,
                    skey,
                    o,
                )
            });
            assert_eq!(wait(q), 4096);
            assert!(back == src);
            let too_big = p6.max_write_inline_size + 1;
            let mut big = vec![0u8; too_big];
            let mut q: P = null_mut();
            let rc = (t.iwrite_inline)(s, big.as_mut_ptr().cast(), too_big, base, key, &mut q);
            assert_eq!(rc, nccl::INVALID_ARGUMENT);
            for mh in [tmh, bmh] {
                assert_eq!((t.dereg_mr)(r, mh), nccl::SUCCESS);
            }
            assert_eq!((t.dereg_mr)(s, smh), nccl::SUCCESS);
        } else {
            let mut q: P = null_mut();
            let mh = reg(s, &mut buf);
            assert_eq!((t.get_mr_key)(mh, &mut key), nccl::SYSTEM_ERROR);
            assert_eq!((t.dereg_mr)(s, mh), nccl::SUCCESS);
            let rc = (t.iwrite)(s, buf.as_mut_ptr().cast(), 8, null_mut(), 0, 0, &mut q);
            assert_eq!(rc, nccl::SYSTEM_ERROR);
        }

        // fini closes everything; closing afterwards is quiet; fini twice is an error.
        let mut open_mh: P = null_mut();
        assert_eq!(
            (t.reg_mr)(s, buf.as_mut_ptr().cast(), 8, 1, &mut open_mh),
            nccl::SUCCESS
        );
        assert_eq!((t.fini)(), nccl::SUCCESS);
        assert_eq!((t.fini)(), nccl::SYSTEM_ERROR, "a second fini");
        assert_eq!(
            (t.devices)(&mut n),
            nccl::INVALID_USAGE,
            "devices after fini"
        );
        assert_eq!((t.dereg_mr)(s, open_mh), nccl::SUCCESS);
        assert_eq!((t.close_send)(s), nccl::SUCCESS);
        assert_eq!((t.close_recv)(r), nccl::SUCCESS);
        assert_eq!((t.close_listen)(listen), nccl::SUCCESS);

        // init again: everything works as before.
        assert_eq!((t.init)(None), nccl::SUCCESS, "init after fini");
        let (listen, s, r) = pair();
        transfer(s, r, 65536, 3);
        assert_eq!((t.close_send)(s), nccl::SUCCESS);
        assert_eq!((t.close_recv)(r), nccl::SUCCESS);
        assert_eq!((t.close_listen)(listen), nccl::SUCCESS);

        // v4: blocking connect and accept over a 64-byte handle.
        let t4 = &NEURON_NET_V4;
        let mut handle = [0u8; 64];
        let mut l4: P = null_mut();
        assert_eq!(
            (t4.listen)(0, handle.as_mut_ptr().cast(), &mut l4),
            nccl::SUCCESS
        );
        let l4a = l4 as usize;
        let acceptor = std::thread::spawn(move || {
            let mut rc4: P = null_mut();
            let rc = (NEURON_NET_V4.accept)(l4a as P, &mut rc4);
            (rc, rc4 as usize)
        });
        let mut s4: P = null_mut();
        assert_eq!(
            (t4.connect)(0, handle.as_mut_ptr().cast(), &mut s4),
            nccl::SUCCESS
        );
        assert!(!s4.is_null(), "v4 connect returned without a comm");
        let (rc, r4) = acceptor.join().unwrap();
        assert_eq!(rc, nccl::SUCCESS);
        assert!(r4 != 0, "v4 accept returned without a comm");
        let mut src = vec![9u8; 1000];
        let mut dst = vec![0u8; 1000];
        let (mut ms, mut mr): (P, P) = (null_mut(), null_mut());
        assert_eq!(
            (t4.reg_mr)(s4, src.as_mut_ptr().cast(), 1000, 1, &mut ms),
            nccl::SUCCESS
        );
        assert_eq!(
            (t4.reg_mr)(r4 as P, dst.as_mut_ptr().cast(), 1000, 1, &mut mr),
            nccl::SUCCESS
        );
        let mut rq: P = null_mut();
        assert_eq!(
            (t4.irecv)(r4 as P, dst.as_mut_ptr().cast(), 1000, mr, &mut rq),
            nccl::SUCCESS
        );
        let sq = until_set("v4 isend", |o| {
            (t4.isend)(s4, src.as_mut_ptr().cast(), 1000, ms, o)
        });
        wait(sq);
        wait(rq);
        assert!(src == dst);
        assert_eq!((t4.dereg_mr)(s4, ms), nccl::SUCCESS);
        assert_eq!((t4.dereg_mr)(r4 as P, mr), nccl::SUCCESS);
        assert_eq!((t4.close_send)(s4), nccl::SUCCESS);
        assert_eq!((t4.close_recv)(r4 as P), nccl::SUCCESS);
        assert_eq!((t4.close_listen)(l4), nccl::SUCCESS);
        assert_eq!((t.fini)(), nccl::SUCCESS);
    }
}

//! NCCL's multi-request groups through the exported `ncclNetPlugin_v12` / `_v11` tables, called
//! as NCCL's convention says (`*request = NCCL_NET_MULTI_REQUEST` before each member but the
//! last), over one libfabric provider from one thread (`run`; a test binary per provider, as the
//! configuration is read once per process): groups of 1 to maxMultiRequestSize members each way,
//! byte-exact, sizes 0 to 1 MiB mixed; a busy last member called again with the same buffer
//! (not appended twice) and with another one (not appended); an over-size group and a hinted
//! call after the last member refused; groups left open at close; the v11 / v12 properties; and
//! v10, which ignores the hint.
use nccl_net_fabricoll::error::nccl;
use nccl_net_fabricoll::ffi::collnet::ncclCollNetPlugin_v12;
use nccl_net_fabricoll::ffi::net::{
    live_groups, ncclNetPlugin_v10, ncclNetPlugin_v11, ncclNetPlugin_v12, MAX_GROUP,
    NCCL_NET_MULTI_REQUEST,
};
use nccl_net_fabricoll::ffi::types::{PropsV11, PropsV12};
use std::ffi::c_void;
use std::os::raw::c_int;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

type P = *mut c_void;

const MULTI: P = NCCL_NET_MULTI_REQUEST as P;
const CANARY: u8 = 0xA5;

fn deadline_check(start: Instant, what: &str) {
    assert!(start.elapsed() < Duration::from_secs(30), "{what} hung");
}

/// A send and a receive comm on device 0 of the v12 table, set up from this one thread.
fn pair(ctx: P) -> (P, P) {
    let t = &ncclNetPlugin_v12;
    let mut handle = [0u8; 128];
    let mut listen: P = null_mut();
    // SAFETY: a 128-byte handle and writable out-pointers, as NCCL passes them.
    unsafe {
        let rc = (t.listen)(ctx, 0, handle.as_mut_ptr().cast(), &mut listen);
        assert_eq!(rc, nccl::SUCCESS);
        let (mut s, mut r): (P, P) = (null_mut(), null_mut());
        let start = Instant::now();
        while s.is_null() || r.is_null() {
            if s.is_null() {
                let h = handle.as_mut_ptr().cast();
                assert_eq!((t.connect)(ctx, 0, h, &mut s, null_mut()), nccl::SUCCESS);
            }
            if r.is_null() {
                assert_eq!((t.accept)(listen, &mut r, null_mut()), nccl::SUCCESS);
            }
            deadline_check(start, "connection setup");
        }
        assert_eq!((t.close_listen)(listen), nccl::SUCCESS);
        (s, r)
    }
}

/// One member's buffers: what is sent, and where it lands (`size` + 64 canary bytes).
struct Msg {
    src: Vec<u8>,
    dst: Vec<u8>,
    tag: c_int,
}

impl Msg {
    fn new(size: usize, tag: c_int, seed: usize) -> Msg {
        Msg {
            src: (0..size).map(|i| (i * 31 + seed * 7 + 1) as u8).collect(),
            dst: vec![CANARY; size + 64],
            tag,
        }
    }

    fn check(&self, what: &str) {
        let n = self.src.len();
        assert!(
            self.dst[..n] == self.src[..],
            "{what}: {n} bytes arrived changed"
        );
        assert!(
            self.dst[n..].iter().all(|&b| b == CANARY),
            "{what}: written past the message"
        );
    }
}

/// Member `i` of a group of `k`: 0 to 1 MiB, mostly small, a few large.
fn member_size(k: usize, i: usize) -> usize {
    match (i * 7 + k) % 11 {
        0 => 0,
        1 if i % 4 == 1 => 1 << 20,
        2 => 65536 + 3,
        3 => 4096,
        4 => 1,
        _ => 100 + (i * 37) % 900,
    }
}

/// isend of the v12 table with `*request = hint` on input; the request it returns.
fn isend(s: P, m: &mut Msg, hint: P) -> (c_int, P) {
    let mut req = hint;
    // SAFETY: the buffer outlives the request (every test waits for its requests or closes
    // the comm first).
    let rc = unsafe {
        (ncclNetPlugin_v12.isend)(
            s,
            m.src.as_mut_ptr().cast(),
            m.src.len(),
            m.tag,
            null_mut(),
            null_mut(),
            &mut req,
        )
    };
    (rc, req)
}

/// irecv of one buffer, as `isend`.
fn irecv(r: P, m: &mut Msg, hint: P) -> (c_int, P) {
    let mut req = hint;
    let (mut d, mut size, mut tag, mut mh): (P, usize, c_int, P) =
        (m.dst.as_mut_ptr().cast(), m.dst.len(), m.tag, null_mut());
    // SAFETY: one-element arrays; the buffer outlives the request.
    let rc = unsafe {
        (ncclNetPlugin_v12.irecv)(
            r,
            1,
            &mut d,
            &mut size,
            &mut tag,
            &mut mh,
            null_mut(),
            &mut req,
        )
    };
    (rc, req)
}

type Post = fn(P, &mut Msg, P) -> (c_int, P);

/// Post `msgs` on `comm` as one group (NCCL's convention: the hint on all but the last, the
/// last called again until it returns the handle), or one by one; the requests.
fn post_all(post: Post, comm: P, msgs: &mut [Msg], grouped: bool) -> Vec<P> {
    let k = msgs.len();
    let mut reqs = Vec::new();
    for (i, m) in msgs.iter_mut().enumerate() {
        if grouped && i + 1 < k {
            let (rc, req) = post(comm, m, MULTI);
            assert_eq!(rc, nccl::SUCCESS, "member {i} of {k}");
            assert!(req.is_null(), "member {i} of {k} got a request of its own");
            continue;
        }
        reqs.push(until_request(post, comm, m, &format!("member {i} of {k}")));
    }
    reqs
}

/// Call `post` without the hint (the same buffer each time) until it returns a request.
fn until_request(post: Post, comm: P, m: &mut Msg, what: &str) -> P {
    let start = Instant::now();
    loop {
        let (rc, req) = post(comm, m, null_mut());
        assert_eq!(rc, nccl::SUCCESS, "{what}");
        if !req.is_null() {
            return req;
        }
        deadline_check(start, what);
    }
}

/// Test `req` until done; its first size (`n` sizes written for a receive).
fn wait(req: P) -> c_int {
    let mut sizes = [-1 as c_int; 64];
    let start = Instant::now();
    loop {
        let mut done = 0;
        // SAFETY: a request of this plugin; writable ints (64, as NCCL passes for receives).
        let rc = unsafe { (ncclNetPlugin_v12.test)(req, &mut done, sizes.as_mut_ptr()) };
        assert_eq!(rc, nccl::SUCCESS, "test");
        if done == 1 {
            assert_eq!(
                sizes[1], -1,
                "more than one size written for a one-buffer request"
            );
            return sizes[0];
        }
        deadline_check(start, "a request");
    }
}

/// `k` messages from `s` to `r`, either side grouped or not; checks bytes and sizes.
fn exchange(s: P, r: P, k: usize, send_grouped: bool, recv_grouped: bool, tag: c_int) {
    let mut dsts: Vec<Msg> = (0..k)
        .map(|i| Msg::new(member_size(k, i), tag, i + k))
        .collect();
    let rreqs = post_all(irecv, r, &mut dsts, recv_grouped);
    let sreqs = post_all(isend, s, &mut dsts, send_grouped);
    let total: usize = dsts.iter().map(|m| m.src.len()).sum();
    let what = format!("{k} members (send grouped {send_grouped}, recv grouped {recv_grouped})");
    let sent: usize = sreqs.iter().map(|&q| wait(q) as usize).sum();
    let got: usize = rreqs.iter().map(|&q| wait(q) as usize).sum();
    assert_eq!((sent, got), (total, total), "{what}: sizes");
    assert_eq!(rreqs.len(), if recv_grouped { 1 } else { k }, "{what}");
    for (i, m) in dsts.iter().enumerate() {
        m.check(&format!("{what}, member {i}"));
    }
}

fn props_checks() {
    // SAFETY: writable props structs of each version's layout.
    unsafe {
        let mut p12: PropsV12 = std::mem::zeroed();
        assert_eq!(
            (ncclNetPlugin_v12.get_properties)(0, &mut p12),
            nccl::SUCCESS
        );
        assert_eq!(p12.max_multi_request_size, MAX_GROUP as c_int);
        assert_eq!((p12.rail_id, p12.plane_id), (-1, -1), "railId / planeId");
        let mut p11: PropsV11 = std::mem::zeroed();
        assert_eq!(
            (ncclNetPlugin_v11.get_properties)(0, &mut p11),
            nccl::SUCCESS
        );
        assert_eq!(p11.max_multi_request_size, MAX_GROUP as c_int);
        let mut c12: PropsV12 = std::mem::zeroed();
        assert_eq!(
            (ncclCollNetPlugin_v12.get_properties)(0, &mut c12),
            nccl::SUCCESS
        );
        assert_eq!(
            c12.max_multi_request_size, 1,
            "CollNet has no isend / irecv"
        );
    }
    assert_eq!(MAX_GROUP, 128, "bounded by a receive comm's 128 requests");
}

/// The receiver's last member finds no room: NULL until room frees, the same buffer called
/// again is not appended twice, another buffer is not appended, a hint is refused.
fn busy_last_recv(s: P, r: P) {
    let fill = MAX_GROUP - 2;
    let mut plain: Vec<Msg> = (0..fill).map(|i| Msg::new(8, 7, i)).collect();
    let preqs: Vec<P> = plain
        .iter_mut()
        .map(|m| post_all(irecv, r, std::slice::from_mut(m), false)[0])
        .collect();
    let mut group: Vec<Msg> = (0..4).map(|i| Msg::new(member_size(4, i), 9, i)).collect();
    for m in group.iter_mut().take(3) {
        assert_eq!(irecv(r, m, MULTI), (nccl::SUCCESS, null_mut()));
    }
    let (rc, req) = irecv(r, &mut group[3], null_mut());
    assert_eq!(
        (rc, req),
        (nccl::SUCCESS, null_mut()),
        "the last member found room"
    );
    assert_eq!(
        irecv(r, &mut group[3], null_mut()),
        (nccl::SUCCESS, null_mut())
    );
    let mut other = Msg::new(16, 9, 99);
    assert_eq!(
        irecv(r, &mut other, null_mut()),
        (nccl::SUCCESS, null_mut())
    );
    let (rc, _) = irecv(r, &mut other, MULTI);
    assert_eq!(
        rc,
        nccl::INVALID_USAGE,
        "a hint after the group's last member"
    );
    // The sender: the plain messages, then the group's four as plain sends.
    let mut sreqs = Vec::new();
    for m in plain.iter_mut() {
        sreqs.extend(post_all(isend, s, std::slice::from_mut(m), false));
    }
    for m in group.iter_mut() {
        sreqs.extend(post_all(isend, s, std::slice::from_mut(m), false));
    }
    for q in preqs {
        assert_eq!(wait(q), 8);
    }
    // Room now: the same last buffer gets the group's handle.
    let handle = until_request(irecv, r, &mut group[3], "the last member");
    let total: usize = group.iter().map(|m| m.src.len()).sum();
    assert_eq!(wait(handle) as usize, total, "a group of 4, not 5");
    for q in sreqs {
        wait(q);
    }
    for (i, m) in group.iter().enumerate() {
        m.check(&format!("busy group member {i}"));
    }
    assert!(
        other.dst.iter().all(|&b| b == CANARY),
        "another buffer was appended"
    );
}

/// The sender's last member finds no room; a call with another buffer is not appended but gets
/// the handle once room frees; the next message is the sender's next, not that buffer.
fn busy_last_send(s: P, r: P) {
    // Every place of the send comm (256 requests) taken by a plain send that nobody tests: a
    // place frees only when `test` reports its request done, so the group's members all wait,
    // whether or not the provider completes a send before its receive is posted (libfabric
    // 2.1's tcp and shm complete a 1 MiB one at once; 1.17's do not).
    let fill = 256;
    let mut plain: Vec<Msg> = (0..fill).map(|i| Msg::new(8, 11, i)).collect();
    let sreqs: Vec<P> = plain
        .iter_mut()
        .flat_map(|m| post_all(isend, s, std::slice::from_mut(m), false))
        .collect();
    let sizes = [1 << 20, (1 << 20) + 5, 4096, 0];
    let mut group: Vec<Msg> = (0..4).map(|i| Msg::new(sizes[i], 12, i)).collect();
    for m in group.iter_mut().take(3) {
        assert_eq!(isend(s, m, MULTI), (nccl::SUCCESS, null_mut()));
    }
    assert_eq!(
        isend(s, &mut group[3], null_mut()),
        (nccl::SUCCESS, null_mut())
    );
    let mut other = Msg::new(16, 12, 77);
    assert_eq!(
        isend(s, &mut other, null_mut()),
        (nccl::SUCCESS, null_mut())
    );
    // The plain messages, in batches a receive comm can hold, then the group.
    for batch in plain.chunks_mut(100) {
        let reqs: Vec<P> = batch
            .iter_mut()
            .flat_map(|m| post_all(irecv, r, std::slice::from_mut(m), false))
            .collect();
        for q in reqs {
            assert_eq!(wait(q), 8);
        }
    }
    let rreqs = post_all(irecv, r, &mut group, true);
    for q in sreqs {
        assert_eq!(wait(q), 8);
    }
    let handle = until_request(isend, s, &mut other, "the group's handle");
    let total: usize = group.iter().map(|m| m.src.len()).sum();
    assert_eq!(wait(handle) as usize, total);
    assert_eq!(wait(rreqs[0]) as usize, total);
    for (i, m) in group.iter().enumerate() {
        m.check(&format!("busy send group member {i}"));
    }
    // The next message on tag 12 is a sentinel, not `other`.
    let mut next = Msg::new(16, 12, 5);
    let rq = post_all(irecv, r, std::slice::from_mut(&mut next), false)[0];
    let sq = post_all(isend, s, std::slice::from_mut(&mut next), false)[0];
    assert_eq!((wait(sq), wait(rq)), (16, 16));
    next.check("the message after the group");
}

/// Over-size groups and a hint after the last member are refused; groups left open (or
/// returned, unfinished) at close go with their comm.
fn misuse_and_close(ctx: P) {
    let t = &ncclNetPlugin_v12;
    let (s, r) = pair(ctx);
    let mut ms: Vec<Msg> = (0..MAX_GROUP).map(|i| Msg::new(0, 20, i)).collect();
    for (i, m) in ms.iter_mut().take(MAX_GROUP - 1).enumerate() {
        assert_eq!(
            isend(s, m, MULTI),
            (nccl::SUCCESS, null_mut()),
            "member {i}"
        );
    }
    let (rc, req) = isend(s, &mut ms[MAX_GROUP - 1], MULTI);
    assert_eq!(
        (rc, req),
        (nccl::INVALID_USAGE, null_mut()),
        "an over-size group"
    );
    let mut rs: Vec<Msg> = (0..3).map(|i| Msg::new(64, 21, i)).collect();
    for m in rs.iter_mut() {
        assert_eq!(irecv(r, m, MULTI), (nccl::SUCCESS, null_mut()));
    }
    assert_eq!(live_groups(), 2);
    // SAFETY: comms of this plugin.
    unsafe {
        assert_eq!((t.close_send)(s), nccl::SUCCESS);
        assert_eq!((t.close_recv)(r), nccl::SUCCESS);
    }
    assert_eq!(live_groups(), 0, "groups left open at close");
    // A returned group whose messages never come, then its comm closes.
    let (s, r) = pair(ctx);
    let mut rs: Vec<Msg> = (0..2).map(|i| Msg::new(64, 22, i)).collect();
    let h = post_all(irecv, r, &mut rs, true)[0];
    assert_eq!(live_groups(), 1);
    // SAFETY: comms and a request of this plugin.
    unsafe {
        assert_eq!((t.close_recv)(r), nccl::SUCCESS);
        assert_eq!(live_groups(), 0);
        let mut done = 0;
        let rc = (t.test)(h, &mut done, null_mut());
        assert_eq!(
            rc,
            nccl::INVALID_ARGUMENT,
            "the handle of a closed comm's group"
        );
        assert_eq!((t.close_send)(s), nccl::SUCCESS);
    }
}

/// v10 never gets the hint from NCCL; a stray one is overwritten and the send is plain.
fn v10_ignores_hint(s: P, r: P) {
    let mut m = Msg::new(100, 30, 3);
    let rq = post_all(irecv, r, std::slice::from_mut(&mut m), false)[0];
    let mut req = MULTI;
    // SAFETY: the buffer outlives the request.
    let rc = unsafe {
        (ncclNetPlugin_v10.isend)(
            s,
            m.src.as_mut_ptr().cast(),
            100,
            30,
            null_mut(),
            null_mut(),
            &mut req,
        )
    };
    assert_eq!(rc, nccl::SUCCESS);
    assert!(!req.is_null() && req != MULTI, "v10 isend took the hint");
    assert_eq!((wait(req), wait(rq)), (100, 100));
    m.check("v10");
    assert_eq!(live_groups(), 0);
}

/// Everything, over `provider` (`tcp` on the loopback interface, or `shm`). Once per process.
pub fn run(provider: &str) {
    std::env::set_var("FABRICOLL_PROVIDER", provider);
    if provider != "shm" {
        std::env::set_var("FABRICOLL_DOMAIN", "lo");
    }
    std::env::set_var("FABRICOLL_TIMEOUT_MS", "20000");
    let t = &ncclNetPlugin_v12;
    let mut ctx: P = null_mut();
    // SAFETY: a writable context out-pointer; no config, logger or profiler.
    let rc = unsafe { (t.init)(&mut ctx, 1, null_mut(), None, null_mut()) };
    if rc != nccl::SUCCESS {
        nccl_net_fabricoll::testing::skip(
            &format!("net_multi_over_{provider}"),
            &format!("no {provider} provider"),
        );
        return;
    }
    props_checks();
    let (s1, r1) = pair(ctx);
    let (s2, r2) = pair(ctx);
    for k in [1, 2, 3, 8, 31, 127, MAX_GROUP] {
        exchange(s1, r1, k, true, true, 1);
        exchange(s2, r2, k, true, true, 2);
    }
    exchange(s1, r1, 5, true, false, 3);
    exchange(s2, r2, 5, false, true, 4);
    busy_last_recv(s1, r1);
    busy_last_send(s2, r2);
    v10_ignores_hint(s1, r1);
    // SAFETY: comms of this plugin.
    unsafe {
        for (s, r) in [(s1, r1), (s2, r2)] {
            assert_eq!((t.close_send)(s), nccl::SUCCESS);
            assert_eq!((t.close_recv)(r), nccl::SUCCESS);
        }
    }
    misuse_and_close(ctx);
    assert_eq!(live_groups(), 0);
    let dev = &nccl_net_fabricoll::plugin::global().unwrap().devices[0];
    let (comms, _, reqs, _) = dev.live();
    assert_eq!(
        (comms, reqs),
        (0, 0),
        "comms and requests left after closing"
    );
    // SAFETY: the context from init.
    assert_eq!(unsafe { (t.finalize)(ctx) }, nccl::SUCCESS);
}

//! Tests of `tiered`: the address format, routing by host, receives without a sender and device
//! memory, over two in-process fabrics (`loopback`).
use super::*;
use crate::transport::loopback::{LoopbackFabric, LoopbackTransport};

/// A tiered endpoint on `host` over endpoints of `intra` and `inter`, with those endpoints.
struct Rank {
    t: Tiered,
    intra: Arc<LoopbackTransport>,
    inter: Arc<LoopbackTransport>,
}

fn rank(host: u64, intra: &Arc<LoopbackFabric>, inter: &Arc<LoopbackFabric>) -> Rank {
    let (i, e) = (Arc::new(intra.endpoint()), Arc::new(inter.endpoint()));
    let t = Tiered::new(host, i.clone(), e.clone()).unwrap();
    Rank {
        t,
        intra: i,
        inter: e,
    }
}

fn drain(t: &dyn Transport) -> Vec<Completion> {
    let mut v = Vec::new();
    t.poll(&mut v).unwrap();
    v
}

fn region(v: &mut [u8]) -> Region {
    // SAFETY: the vectors outlive every operation in these tests.
    unsafe { Region::from_raw(v.as_mut_ptr(), v.len()) }
}

#[test]
fn addresses_round_trip_and_foreign_ones_are_refused_by_name() {
    let a = encode_address(0x1234, b"intra", b"inter-address").unwrap();
    let (h, i, e) = decode_address(&a).unwrap();
    assert_eq!((h, i, e), (0x1234, &b"intra"[..], &b"inter-address"[..]));
    let empty = encode_address(7, b"", b"").unwrap();
    assert_eq!(decode_address(&empty).unwrap(), (7, &b""[..], &b""[..]));
    let mut long = a.clone();
    long.push(0);
    for bad in [
        &a[..a.len() - 1],
        &long[..],
        &a[1..],
        &[][..],
        b"raw fabric address",
    ] {
        let e = decode_address(bad).unwrap_err().to_string();
        assert!(e.contains("FABRICOLL_INTRA_PROVIDER"), "{e}");
    }
    assert!(encode_address(1, &vec![0; 70_000], b"").is_err());
}

#[test]
fn peers_of_this_host_go_over_intra_and_the_others_over_inter() {
    let (fi, fe) = (LoopbackFabric::new(), LoopbackFabric::new());
    let (a, b, c) = (rank(1, &fi, &fe), rank(1, &fi, &fe), rank(2, &fi, &fe));
    let pb = a.t.insert_peer(&b.t.address()).unwrap();
    let pc = a.t.insert_peer(&c.t.address()).unwrap();
    assert_eq!((Level::of(pb), Level::of(pc)), (Level::Intra, Level::Inter));
    assert_eq!(
        a.t.insert_peer(&c.t.address()).unwrap(),
        pc,
        "same address, same peer"
    );
    assert!(
        a.t.insert_peer(&b.intra.address()).is_err(),
        "a bare address"
    );
    // What a sends to b arrives on b's intra endpoint, to c on c's inter endpoint.
    let mut m = *b"hello";
    a.t.send(pb, 5, region(&mut m), None, 1).unwrap();
    a.t.send_owned(pc, 6, b"world".to_vec(), 2).unwrap();
    b.intra.recv_owned(5, 0, 8, 10).unwrap();
    c.inter.recv_owned(6, 0, 8, 11).unwrap();
    let got_b = drain(&*b.intra);
    let got_c = drain(&*c.inter);
    assert_eq!(got_b[0].data.as_deref(), Some(&b"hello"[..]));
    assert_eq!(got_c[0].data.as_deref(), Some(&b"world"[..]));
    assert!(drain(&*b.inter).is_empty() && drain(&*c.intra).is_empty());
    // Both sends complete through the tiered endpoint's poll.
    let mut ops: Vec<OpId> = drain(&a.t).iter().map(|c| c.op).collect();
    ops.sort();
    assert_eq!(ops, vec![1, 2]);
    // A receive naming its sender is posted on that sender's fabric only.
    let pa_from_c = c.t.insert_peer(&a.t.address()).unwrap();
    let mut r = [0u8; 8];
    c.t.recv_from(pa_from_c, 9, 0, region(&mut r), None, 20)
        .unwrap();
    let pc_from_a = pc;
    a.t.send_owned(pc_from_a, 9, b"x".to_vec(), 3).unwrap();
    let done = drain(&c.t);
    assert_eq!((done.len(), done[0].op, r[0]), (1, 20, b'x'));
    // Capabilities: the intra fabric's to peers of this host.
    assert!(a.t.caps().intra.is_some());
    assert!(std::ptr::eq(
        a.t.caps_to(pb),
        &**a.t.caps().intra.as_ref().unwrap()
    ));
    assert!(std::ptr::eq(a.t.caps_to(pc), a.t.caps()));
}

#[test]
fn a_receive_without_a_sender_takes_the_first_message_of_either_fabric_once() {
    let (fi, fe) = (LoopbackFabric::new(), LoopbackFabric::new());
    let (a, b, c) = (rank(1, &fi, &fe), rank(1, &fi, &fe), rank(2, &fi, &fe));
    let pa_b = b.t.insert_peer(&a.t.address()).unwrap();
    let pa_c = c.t.insert_peer(&a.t.address()).unwrap();
    // Owned: from the other host.
    a.t.recv_owned(7, 0, 4, 100).unwrap();
    c.t.send_owned(pa_c, 7, b"inter".to_vec()[..4].to_vec(), 1)
        .unwrap();
    let done = drain(&a.t);
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(done[0].data.as_deref(), Some(&b"inte"[..]));
    assert!(
        drain(&a.t).is_empty(),
        "the intra receive's cancellation is swallowed"
    );
    // Into a region: from this host.
    let mut r = [0u8; 4];
    a.t.recv(8, 0, region(&mut r), None, 101).unwrap();
    b.t.send_owned(pa_b, 8, b"ab".to_vec(), 2).unwrap();
    let done = drain(&a.t);
    assert_eq!((done.len(), done[0].op, done[0].len), (1, 101, 2));
    assert!(done[0].data.is_none() && &r[..2] == b"ab");
    assert!(drain(&a.t).is_empty());
    // Both fabrics deliver before a poll (the race): one completion, the other dropped.
    a.t.recv_owned(9, 0, 4, 102).unwrap();
    b.t.send_owned(pa_b, 9, b"b".to_vec(), 3).unwrap();
    c.t.send_owned(pa_c, 9, b"c".to_vec(), 4).unwrap();
    let done = drain(&a.t);
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(
        done[0].data.as_deref(),
        Some(&b"b"[..]),
        "intra is polled first"
    );
    // Cancelled: one cancelled completion.
    a.t.recv_owned(10, 0, 4, 103).unwrap();
    a.t.cancel(103);
    let done = drain(&a.t);
    assert_eq!(done.len(), 1, "{done:?}");
    assert!(done[0].status.is_err());
    assert!(drain(&a.t).is_empty());
    // The op id is free again once both completions came back.
    a.t.recv_owned(10, 0, 4, 103).unwrap();
    assert!(
        a.t.recv_owned(10, 0, 4, 103).is_err(),
        "reposted while pending"
    );
    a.t.cancel(103);
    assert_eq!(drain(&a.t).len(), 1);
}

#[test]
fn waiting_over_two_fabrics_returns_when_either_has_something() {
    let (fi, fe) = (LoopbackFabric::new(), LoopbackFabric::new());
    let (a, c) = (rank(1, &fi, &fe), rank(2, &fi, &fe));
    let pa = c.t.insert_peer(&a.t.address()).unwrap();
    c.t.send_owned(pa, 1, vec![1], 1).unwrap();
    // Loopback endpoints have no file descriptor: the wait yields and returns at once.
    let t0 = std::time::Instant::now();
    a.t.wait(Duration::from_secs(120)).unwrap();
    // Long before the wait's own limit: it returned because something was there.
    assert!(t0.elapsed() < Duration::from_secs(60));
    a.t.recv_owned(1, 0, 1, 5).unwrap();
    assert_eq!(drain(&a.t).len(), 1);
}

/// Device memory over two fabrics that both take it: registered on both, each message moved
/// by the fabric of its peer (the loopback fabrics move the emulated device's bytes with its
/// copies); where one fabric does not take it, the tiered endpoint offers no FI_HMEM and
/// refuses the registration.
#[test]
fn device_memory_goes_over_the_fabric_of_each_peer() {
    use crate::device::{Device, EmuConfig};
    let dev = Device::emulated(EmuConfig::default()).unwrap();
    dev.bind().unwrap();
    let (intra, inter) = (
        LoopbackFabric::with_device(dev.clone(), true),
        LoopbackFabric::with_device(dev.clone(), true),
    );
    let (a, b, c) = (
        rank(1, &intra, &inter),
        rank(1, &intra, &inter),
        rank(2, &intra, &inter),
    );
    assert!(a.t.caps().hmem);
    let s = dev.create_stream().unwrap();
    let wait = std::time::Duration::from_secs(20);
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    let src = dev.alloc(data.len()).unwrap();
    s.upload(&src.span(), &data, wait).unwrap();
    // SAFETY: device memory alive until the end of the test, after every operation on it.
    let reg = |t: &Tiered, b: &crate::device::DeviceBuffer| unsafe {
        t.register_device(
            Region::from_raw(b.addr() as *mut u8, b.len()),
            dev.ordinal(),
        )
    };
    let mr = reg(&a.t, &src).unwrap();
    assert_eq!(mr.device, Some(dev.ordinal()));
    for (to, tag) in [(&b, 1u64), (&c, 2)] {
        let dst = dev.alloc(data.len()).unwrap();
        let dmr = reg(&to.t, &dst).unwrap();
        let from = to.t.insert_peer(&a.t.address()).unwrap();
        let peer = a.t.insert_peer(&to.t.address()).unwrap();
        to.t.recv_from(from, tag, 0, dmr.region, Some(&dmr), 7)
            .unwrap();
        a.t.send(peer, tag, mr.region, Some(&mr), 8).unwrap();
        let got = drain(&to.t);
        assert!(got.iter().all(|c| c.status.is_ok()), "{got:?}");
        assert_eq!(got.len(), 1, "one receive done");
        let mut back = vec![0u8; data.len()];
        s.download(&mut back, &dst.span(), wait).unwrap();
        assert!(back == data, "tag {tag}: other bytes");
        assert!(drain(&a.t).iter().all(|c| c.status.is_ok()));
    }
    let host_only = rank(1, &intra, &LoopbackFabric::new());
    assert!(!host_only.t.caps().hmem);
    assert!(reg(&host_only.t, &src).is_err());
}

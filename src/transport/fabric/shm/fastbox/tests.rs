//! The fastbox's rings: order, wraps, kinds, slots given back, corrupt and unbacked files.
use super::*;

fn endpoint(tag: &str) -> String {
    format!(
        "{}{}-{}-fbtest{tag}",
        super::super::watch::PREFIX,
        std::process::id(),
        TOKENS.fetch_add(1, Ordering::Relaxed)
    )
}

fn drained(ib: &mut Inbox) -> Vec<(u64, Vec<u8>)> {
    drained_kinds(ib)
        .into_iter()
        .map(|(kind, tag, m)| {
            assert_eq!(kind, DATA);
            (tag, m)
        })
        .collect()
}

fn drained_kinds(ib: &mut Inbox) -> Vec<(u32, u64, Vec<u8>)> {
    let mut v = Vec::new();
    ib.drain(|a| {
        v.push((
            a.kind,
            u64::from_le_bytes(a.msg[..8].try_into().expect("tag")),
            a.msg[8..].to_vec(),
        ))
    });
    v
}

#[test]
fn frames_arrive_in_order_across_wraps_and_a_full_ring_refuses() {
    let ep = endpoint("order");
    let mut ib = Inbox::create(&ep).expect("inbox");
    let mut ob = Outbox::open(&inbox_name(&ep), "fbtest-sender").expect("slot");
    let mut sent = Vec::new();
    let mut got = Vec::new();
    // Sizes that do not divide the ring, so frames wrap at odd places.
    for i in 0..2000u64 {
        let len = [0usize, 1, 7, 8, 100, 1000, MAX_PAYLOAD][(i % 7) as usize];
        let data: Vec<u8> = (0..len).map(|b| (b as u64 ^ i) as u8).collect();
        loop {
            match ob.push(i, &data) {
                Pushed::Done => break,
                Pushed::Full => {
                    let n = got.len();
                    got.extend(drained(&mut ib));
                    assert!(got.len() > n, "a full ring has frames to read");
                }
            }
        }
        sent.push((i, data));
    }
    got.extend(drained(&mut ib));
    assert_eq!(got, sent);
    assert!(drained(&mut ib).is_empty());
}

#[test]
fn frames_keep_their_kind_and_an_unknown_kind_breaks_the_slot() {
    let ep = endpoint("kinds");
    let mut ib = Inbox::create(&ep).expect("inbox");
    let mut ob = Outbox::open(&inbox_name(&ep), "fbtest-sender").expect("slot");
    assert_eq!(ob.push(1, b"data"), Pushed::Done);
    assert_eq!(ob.push_kind(RTS, 2, b"rts"), Pushed::Done);
    assert_eq!(ob.push_kind(ACK, 3, b"ack"), Pushed::Done);
    let mut from = Vec::new();
    ib.drain(|a| from.push(a.from));
    assert_eq!(from, vec![sender_id("fbtest-sender"); 3]);
    assert_eq!(ob.push_kind(RTS, 2, b"rts"), Pushed::Done);
    assert_eq!(ob.push_kind(ACK + 1, 4, b"?"), Pushed::Done);
    assert_eq!(drained_kinds(&mut ib), vec![(RTS, 2, b"rts".to_vec())]);
    assert_eq!(
        ib.broken,
        1 << ob.slot,
        "a frame of unknown kind is corruption"
    );
}

#[test]
fn drained_slots_are_given_back_and_undrained_ones_stay_claimed() {
    let ep = endpoint("slots");
    let mut ib = Inbox::create(&ep).expect("inbox");
    let name = inbox_name(&ep);
    let mut ob = Outbox::open(&name, "fbtest-sender").expect("slot");
    assert_eq!(ob.push(1, b"x"), Pushed::Done);
    assert_eq!(drained(&mut ib), vec![(1, b"x".to_vec())]);
    assert_eq!(ob.push(2, b"y"), Pushed::Done);
    // A drained slot is given back on drop; an undrained one stays claimed.
    let slot = ob.slot;
    drop(ob);
    assert_ne!(
        ib.map.owner(slot).load(Ordering::Relaxed),
        0,
        "frame unread"
    );
    assert_eq!(drained(&mut ib).len(), 1);
    let others: Vec<Outbox> = (1..SLOTS)
        .map(|_| Outbox::open(&name, "fbtest-sender").expect("slot"))
        .collect();
    assert!(
        Outbox::open(&name, "fbtest-sender").is_err(),
        "every slot is taken"
    );
    drop(others);
    let again = Outbox::open(&name, "fbtest-sender").expect("drained slots are free again");
    assert_ne!(again.slot, slot, "the stuck slot stays claimed");
    assert_eq!(ib.claimed(), SLOTS);
}

#[test]
fn an_inbox_knows_which_endpoints_hold_its_slots() {
    let ep = endpoint("who");
    let mut ib = Inbox::create(&ep).expect("inbox");
    let name = inbox_name(&ep);
    let (a, b) = (endpoint("sender-a"), endpoint("sender-b"));
    assert!(!ib.sends_here(sender_id(&a)) && !ib.sends_here(sender_id(&b)));
    let mut ob = Outbox::open(&name, &a).expect("slot");
    assert!(ib.sends_here(sender_id(&a)), "a claimed a slot");
    assert!(!ib.sends_here(sender_id(&b)), "b did not");
    // A slot given back no longer speaks for its last holder.
    assert_eq!(ob.push(1, b"x"), Pushed::Done);
    assert_eq!(drained(&mut ib).len(), 1);
    drop(ob);
    assert!(!ib.sends_here(sender_id(&a)), "a gave its slot back");
    let _b = Outbox::open(&name, &b).expect("slot");
    assert!(ib.sends_here(sender_id(&b)) && !ib.sends_here(sender_id(&a)));
}

#[test]
fn a_ring_with_no_memory_behind_it_is_an_error_not_a_crash() {
    let ep = endpoint("nomem");
    let ib = Inbox::create(&ep).expect("inbox");
    let name = inbox_name(&ep);
    assert!(ib.map.populate(0, libc::MADV_POPULATE_WRITE).is_ok());
    let map = Map::open(&name, false).expect("a sender's map");
    // Cut the file short under the mapping: slot 0's pages cannot exist any more, as when
    // /dev/shm is full. Writing them would raise SIGBUS; populating says so instead.
    std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/dev/shm/{name}"))
        .expect("open")
        .set_len(HEADER as u64)
        .expect("truncate");
    let e = ib.map.populate(1, libc::MADV_POPULATE_WRITE);
    let mut probe = vec![0u8; 8192];
    let page = (probe.as_mut_ptr() as usize).next_multiple_of(4096) as *mut libc::c_void;
    // SAFETY: one page inside `probe`; the advice changes no byte.
    let supported = unsafe { libc::madvise(page, 4096, libc::MADV_POPULATE_READ) } == 0;
    if supported {
        assert!(e.is_err(), "populating past the end of the file must fail");
        // A sender that maps the inbox then finds no memory behind it: an error naming
        // the cause, and no slot claimed.
        let e = Outbox::claim(map, &name, "fbtest-sender")
            .err()
            .expect("no memory");
        assert!(e.to_string().contains("is /dev/shm full?"), "{e}");
        assert_eq!(ib.claimed(), 0);
    } else {
        crate::testing::skip(
            "a_ring_with_no_memory_behind_it_is_an_error_not_a_crash",
            "this kernel has no MADV_POPULATE_*",
        );
    }
}

#[test]
fn corrupt_rings_and_foreign_files_are_refused_not_read() {
    let ep = endpoint("bad");
    let mut ib = Inbox::create(&ep).expect("inbox");
    let name = inbox_name(&ep);
    let mut ob = Outbox::open(&name, "fbtest-sender").expect("slot");
    assert_eq!(ob.push(5, b"ok"), Pushed::Done);
    // A length beyond MAX_PAYLOAD in the next frame.
    let at = (ob.tail % RING as u64) as usize;
    // SAFETY: at is an 8-aligned offset inside the test's own ring.
    unsafe { std::ptr::write_volatile(ob.map.ring(ob.slot, at) as *mut u32, 1 << 20) };
    ob.map.tail(ob.slot).store(ob.tail + 64, Ordering::SeqCst);
    assert_eq!(drained(&mut ib), vec![(5, b"ok".to_vec())]);
    assert_eq!(ib.broken, 1 << ob.slot);
    assert!(drained(&mut ib).is_empty(), "the broken slot is skipped");
    assert!(Outbox::open("fabricoll-0-no-such-inbox-fb", "fbtest-sender").is_err());
    // A name taken twice, and a file of another size or layout under an inbox's name.
    assert!(Inbox::create(&ep).is_err(), "the inbox exists");
    let foreign = inbox_name(&endpoint("foreign"));
    let path = format!("/dev/shm/{foreign}");
    std::fs::write(&path, b"not an inbox").expect("write");
    let e = Outbox::open(&foreign, "fbtest-sender")
        .err()
        .expect("wrong size")
        .to_string();
    assert!(e.contains("not the"), "{e}");
    std::fs::write(&path, vec![0u8; FILE_BYTES]).expect("write");
    let e = Outbox::open(&foreign, "fbtest-sender")
        .err()
        .expect("no magic")
        .to_string();
    assert!(e.contains("not an inbox"), "{e}");
    std::fs::remove_file(&path).expect("remove");
    assert_eq!(
        inbox_of_address(format!("fi_shm://{ep}\0\0").as_bytes()),
        Some(name.clone())
    );
    assert_eq!(inbox_of_address(b"127.0.0.1:5000"), None);
    drop(ib);
    assert!(
        Outbox::open(&name, "fbtest-sender").is_err(),
        "unlinked with its inbox"
    );
}

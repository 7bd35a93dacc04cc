//! The bootstrap root against peers that are not good ranks (defect F1, and the errors a rank
//! gets): a huge `nranks`, a huge address length, a wrong nonce, garbage, a rank that disagrees
//! on `nranks`, and a rank that never comes. The root must refuse or ignore the bad peer,
//! allocate at most a small bounded amount (a counting allocator watches every allocation of
//! this test process), and the good ranks must finish, or time out with an error that says so.
use nccl_net_fabricoll::coll::bootstrap::{self, UniqueId};
use nccl_net_fabricoll::error::Error;
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Forwards to the system allocator, remembering the largest request. Requests above
/// `REFUSED_ABOVE` fail (the process then aborts, failing the test) instead of being tried.
struct Watch;

static LARGEST: AtomicUsize = AtomicUsize::new(0);
const REFUSED_ABOVE: usize = 1 << 30;
/// What "a small bounded amount" means here: the root keeps at most `MAX_ADDR` (4 KiB) per
/// rank, and nothing of a refused peer beyond its fixed-size hello.
const SMALL: usize = 1 << 20;

impl Watch {
    fn note(size: usize) -> bool {
        LARGEST.fetch_max(size, Ordering::Relaxed);
        size <= REFUSED_ABOVE
    }
}

// SAFETY: every method forwards to `System` with the caller's own arguments, or returns null
// (which `GlobalAlloc` allows for a failed allocation).
unsafe impl GlobalAlloc for Watch {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !Watch::note(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !Watch::note(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc_zeroed` requires.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this layout (every allocation here does).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !Watch::note(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: `ptr` came from `System` with `layout`; the caller's arguments otherwise.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static WATCH: Watch = Watch;

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A root that gives up after `secs` seconds.
fn root(secs: u64) -> UniqueId {
    bootstrap::new_unique_id(LOCALHOST, Duration::from_secs(secs)).unwrap()
}

/// A hello as a rank sends it: nonce, rank, nranks, address length, padding, address.
fn hello(nonce: u64, rank: u32, nranks: u32, len: u32, addr: &[u8]) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(&nonce.to_le_bytes());
    h.extend_from_slice(&rank.to_le_bytes());
    h.extend_from_slice(&nranks.to_le_bytes());
    h.extend_from_slice(&len.to_le_bytes());
    h.extend_from_slice(&[0u8; 4]);
    h.extend_from_slice(addr);
    h
}

/// Send `bytes` to the root as a stranger would, close the sending side, and read what the root
/// answers until it closes.
fn poke(id: &UniqueId, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(id.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(bytes).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    answer
}

/// `n` good ranks join `id`; each must get the table of everyone's address.
fn good_ranks_finish(id: UniqueId, n: usize) {
    let hs: Vec<_> = (0..n)
        .map(|r| {
            std::thread::spawn(move || {
                bootstrap::exchange(&id, r, n, &[r as u8; 7], Duration::from_secs(20))
            })
        })
        .collect();
    let want: Vec<Vec<u8>> = (0..n).map(|r| vec![r as u8; 7]).collect();
    for h in hs {
        assert_eq!(h.join().unwrap().unwrap(), want);
    }
}

fn assert_small() {
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(largest <= SMALL, "an allocation of {largest} bytes");
}

#[test]
fn a_huge_nranks_is_refused_before_anything_is_allocated() {
    let id = root(20);
    let answer = poke(&id, &hello(id.nonce, 0, i32::MAX as u32, 5, b"abcde"));
    assert!(!answer.is_empty(), "the root answers a refusal");
    assert!(String::from_utf8_lossy(&answer).contains("nranks"));
    good_ranks_finish(id, 3);
    assert_small();
}

#[test]
fn a_huge_address_length_is_refused_before_it_is_read() {
    let id = root(20);
    let answer = poke(&id, &hello(id.nonce, 0, 2, u32::MAX, b""));
    assert!(String::from_utf8_lossy(&answer).contains("address"));
    good_ranks_finish(id, 2);
    assert_small();
}

#[test]
fn wrong_nonces_and_garbage_are_refused_without_reading_further() {
    let id = root(20);
    // Huge length fields behind a wrong nonce: nothing past the fixed header is read.
    poke(
        &id,
        &hello(!id.nonce, u32::MAX, u32::MAX, u32::MAX, &[7; 100]),
    );
    poke(&id, &[0xff; 4096]);
    poke(&id, b"GET / HTTP/1.0\r\n\r\n");
    // A peer that closes before its header is whole.
    poke(&id, &[1, 2, 3]);
    good_ranks_finish(id, 2);
    assert_small();
}

#[test]
fn a_wrong_nonce_is_named_to_the_rank() {
    let id = root(20);
    let stranger = UniqueId {
        addr: id.addr,
        nonce: id.nonce ^ 1,
    };
    let e = bootstrap::exchange(&stranger, 0, 2, b"x", Duration::from_secs(20)).unwrap_err();
    match &e {
        Error::InvalidArgument(m) => assert!(
            m.contains("uniqueId") && m.contains("nonce does not match"),
            "{e}"
        ),
        _ => panic!("{e:?}"),
    }
    good_ranks_finish(id, 2);
    assert_small();
}

#[test]
fn a_rank_that_disagrees_on_nranks_is_refused() {
    let id = root(20);
    let first = std::thread::spawn(move || {
        bootstrap::exchange(&id, 0, 2, &[0; 7], Duration::from_secs(20))
    });
    // Let rank 0 fix the communicator's size first.
    std::thread::sleep(Duration::from_millis(300));
    let e = bootstrap::exchange(&id, 1, 3, &[1; 7], Duration::from_secs(20)).unwrap_err();
    match &e {
        Error::InvalidArgument(m) => assert!(m.contains("nranks"), "{e}"),
        _ => panic!("{e:?}"),
    }
    let second = bootstrap::exchange(&id, 1, 2, &[1; 7], Duration::from_secs(20)).unwrap();
    assert_eq!(first.join().unwrap().unwrap(), second);
    assert_small();
}

#[test]
fn a_missing_rank_is_a_timeout_that_names_it() {
    let id = bootstrap::new_unique_id(LOCALHOST, Duration::from_millis(500)).unwrap();
    let e = bootstrap::exchange(&id, 0, 3, b"x", Duration::from_secs(20)).unwrap_err();
    match &e {
        Error::Timeout(m) => assert!(
            m.contains("did not arrive")
                && m.contains("500 ms (the caller's timeout argument)")
                && m.contains("rank(s) 1, 2 missing"),
            "{e}"
        ),
        _ => panic!("{e:?}"),
    }
}

#[test]
fn a_rank_whose_own_deadline_passes_first_gets_a_timeout() {
    // The root waits longer than the rank: the rank's own deadline ends the wait.
    let id = root(20);
    let e = bootstrap::exchange(&id, 0, 2, b"x", Duration::from_millis(300)).unwrap_err();
    match &e {
        Error::Timeout(m) => assert!(m.contains("300 ms (the caller's timeout argument)"), "{e}"),
        _ => panic!("{e:?}"),
    }
}

#[test]
fn a_rank_refuses_an_impossible_nranks_itself() {
    let id = root(2);
    let e =
        bootstrap::exchange(&id, 0, i32::MAX as usize, b"x", Duration::from_secs(5)).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("nranks")),
        "{e}"
    );
}

#[test]
fn silent_connections_do_not_hold_up_the_ranks() {
    // Each silent connection used to hold the root for its whole hello wait (5 s), one after
    // another: six of them, 30 s, past the ranks' 20 s deadline.
    let id = root(60);
    let silent: Vec<TcpStream> = (0..6)
        .map(|_| TcpStream::connect(id.addr).unwrap())
        .collect();
    good_ranks_finish(id, 3);
    drop(silent);
}

#[test]
fn a_silent_connection_is_not_taken_for_a_missing_rank() {
    // The root's own deadline is what is tested: it must pass with rank 1 missing.
    let bind = std::net::SocketAddr::new(LOCALHOST, 0);
    let r = bootstrap::listen(bind, None, Some(2), Duration::from_millis(1500)).unwrap();
    let _silent = TcpStream::connect(r.id.addr).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let e = bootstrap::exchange(&r.id, 0, 2, b"x", Duration::from_secs(20)).unwrap_err();
    assert!(e.to_string().contains("rank(s) 1 missing"), "{e}");
    let e = r.wait().unwrap_err().to_string();
    assert!(
        e.contains("1 of 2 ranks did not arrive") && e.contains("rank(s) 1 missing"),
        "{e}"
    );
    assert!(!e.contains("no rank arrived"), "{e}");
}

/// A loopback address whose port nothing listens on (a launch's fixed port).
fn free_port() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind((LOCALHOST, 0)).unwrap();
    l.local_addr().unwrap()
}

/// Two 2-rank jobs without an identity meet on one port, started a little apart: rank 0 of
/// job A serves; rank 1 of job B joins it first; then rank 1 of job A arrives, and rank 0 of job
/// B finds the port taken. No rank may end up in a communicator with the other job's.
#[test]
fn two_jobs_on_one_port_without_an_identity_are_never_mixed() {
    let at = free_port();
    let nonce = 0x7472_6368; // what every job without an id uses
    let id = UniqueId { addr: at, nonce };
    let limit = Duration::from_secs(20);
    let a_root = bootstrap::listen_unnamed(at, nonce, 2, limit).unwrap();
    let join = |rank: usize, who: &'static [u8]| {
        std::thread::spawn(move || bootstrap::exchange(&id, rank, 2, who, limit))
    };
    let a0 = join(0, b"A0");
    let b1 = join(1, b"B1");
    std::thread::sleep(Duration::from_millis(200));
    let b0 = bootstrap::listen_unnamed(at, nonce, 2, limit);
    let a1 = join(1, b"A1");
    let e = b0
        .err()
        .expect("job B's rank 0 cannot serve on a taken port");
    assert!(e.to_string().contains("FABRICOLL_JOB_ID"), "{e}");
    // A0 and B1 had arrived: the root fails them naming the remedy. A1 arrives about when the
    // root gives up: any error will do, but not a communicator.
    for (who, h) in [("A0", a0), ("B1", b1), ("A1", a1)] {
        match h.join().unwrap() {
            Ok(t) => panic!("{who} joined a communicator of {t:?}"),
            Err(e) if who != "A1" => {
                assert!(e.to_string().contains("FABRICOLL_JOB_ID"), "{who}: {e}")
            }
            Err(_) => {}
        }
    }
    assert!(a_root.wait().is_err());
}

#[test]
fn a_job_without_an_identity_still_forms_alone() {
    let at = free_port();
    let r = bootstrap::listen_unnamed(at, 7, 3, Duration::from_secs(20)).unwrap();
    good_ranks_finish(UniqueId { addr: at, nonce: 7 }, 3);
    r.wait().unwrap();
}

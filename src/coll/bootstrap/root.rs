//! The bootstrap root: the thread that gathers every rank's hello and sends each the table of
//! addresses (`listen`, `serve`, `new_unique_id`). It serves connections concurrently, each
//! hello read within a short deadline by a thread of its own, so that idle connections (port
//! scanners, health checks) delay no rank; and it refuses to mix two jobs that meet on one port
//! (a rank twice, or a rank 0 that found the port taken: every rank fails, naming
//! FABRICOLL_JOB_ID).
use super::{
    check_ranks, io, nonce, read_exact, Refusal, UniqueId, HELLO, MAX_ADDR, MAX_DRAIN, MAX_REFUSAL,
    REFUSED, RUNNING,
};
use crate::config::Timeout;
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// How long the root waits for a connected peer's hello. A rank sends it as soon as it has
/// connected; a silent peer costs only its reader thread, so this bounds how many such threads
/// a scanner can keep alive, not how long ranks wait.
const HELLO_WAIT: Duration = Duration::from_secs(2);
/// How long a root of a job without identity waits, once every rank has arrived, for a sign of
/// another job on its port (`listen_unnamed`).
const SETTLE: Duration = Duration::from_secs(1);
/// Connections whose hello is being read at once; more are closed unread until one ends.
const MAX_READERS: usize = 64;
/// The rank field of a `contend` hello: not a rank, a rank 0 of another job.
pub(super) const CONTENDER: u32 = u32::MAX;

/// Answer a peer the root refuses with `e`, then read what it still sends (a bounded amount,
/// into a fixed buffer) until it closes, so that it gets the answer.
fn refuse(s: &mut TcpStream, e: &Error) {
    let (kind, msg) = Refusal::of(e);
    let msg = &msg.as_bytes()[..msg.len().min(MAX_REFUSAL)];
    let mut out = Vec::with_capacity(16 + msg.len());
    out.extend_from_slice(&REFUSED.to_le_bytes());
    out.extend_from_slice(&(kind as u32).to_le_bytes());
    out.extend_from_slice(&(msg.len() as u32).to_le_bytes());
    out.extend_from_slice(msg);
    let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
    if s.write_all(&out).is_err() || s.shutdown(std::net::Shutdown::Write).is_err() {
        return;
    }
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let mut sink = [0u8; 4096];
    let mut drained = 0;
    while drained < MAX_DRAIN {
        match s.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

/// A rank's hello, once the root has checked it.
struct Hello {
    rank: usize,
    nranks: usize,
    addr: Vec<u8>,
}

/// What the root heard on one connection.
enum Heard {
    /// A rank, checked.
    Rank(Hello),
    /// No whole hello within `HELLO_WAIT` (a port scanner, a health check, a peer gone).
    Silent,
    /// A peer refused with this error (already answered by the thread that read it).
    Refused(Error),
    /// A rank 0 of another job that found this root on its port (`contend`): the root cannot
    /// tell which of its ranks belong to which job, so every one fails with this error.
    Contender(Error),
}

/// Read and check a hello. Only the fixed header is read before the nonce is checked, and
/// every field is checked before the address is read, so a peer without the unique id makes
/// the root allocate nothing.
fn read_hello(s: &mut TcpStream, id: &UniqueId, deadline: Instant) -> Heard {
    let wait = deadline.min(Instant::now() + HELLO_WAIT);
    let mut hdr = [0u8; HELLO];
    let silent = || "no hello from a connected peer".to_string();
    if read_exact(s, &mut hdr, wait, "hello", silent).is_err() {
        return Heard::Silent;
    }
    let u32_at = |i: usize| u32::from_le_bytes([hdr[i], hdr[i + 1], hdr[i + 2], hdr[i + 3]]);
    let nonce = u64::from_le_bytes(hdr[0..8].try_into().expect("8 bytes"));
    if nonce != id.nonce {
        return Heard::Refused(Error::arg(
            "uniqueId",
            format!(
                "its nonce does not match the one of the root at {}: this rank was given \
                 another communicator's unique id",
                id.addr
            ),
        ));
    }
    if u32_at(8) == CONTENDER {
        return Heard::Contender(two_jobs(format!(
            "a rank 0 of another job found this job's bootstrap root on port {}",
            id.addr.port()
        )));
    }
    let (rank, nranks, len) = (u32_at(8) as usize, u32_at(12) as usize, u32_at(16) as usize);
    if let Err(e) = check_ranks(rank, nranks) {
        return Heard::Refused(e);
    }
    if len > MAX_ADDR {
        return Heard::Refused(Error::arg(
            "address",
            format!("{len} bytes, more than the {MAX_ADDR} an endpoint address may have"),
        ));
    }
    let mut addr = vec![0u8; len];
    if read_exact(s, &mut addr, wait, "address", silent).is_err() {
        return Heard::Silent;
    }
    Heard::Rank(Hello { rank, nranks, addr })
}

/// The error of every rank of a root that saw two jobs on its port (`what`: how it knew).
fn two_jobs(what: String) -> Error {
    Error::InvalidUsage(format!(
        "{what}: two jobs share one bootstrap port, and the root cannot tell their ranks apart, \
         so none of them may join; give each job its own FABRICOLL_JOB_ID (or port)"
    ))
}

/// Tell the root already serving `port` (this rank 0 could not bind it) that a rank 0 of
/// another job is here, so that it fails its ranks rather than mix the two jobs; then wait
/// briefly for its answer. Best effort: a root that is gone or of another nonce ignores it.
fn contend(at: SocketAddr, nonce: u64) {
    let Ok(mut s) = TcpStream::connect_timeout(&at, Duration::from_millis(500)) else {
        return;
    };
    let mut hello = Vec::with_capacity(HELLO);
    hello.extend_from_slice(&nonce.to_le_bytes());
    hello.extend_from_slice(&CONTENDER.to_le_bytes());
    hello.extend_from_slice(&[0u8; 12]);
    if s.write_all(&hello).is_ok() {
        let mut answer = [0u8; 8];
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let _ = s.read_exact(&mut answer);
    }
}

/// A running root: its unique id, and its thread, which ends once it has served one
/// communicator or its deadline has passed.
pub struct Root {
    pub id: UniqueId,
    thread: std::thread::JoinHandle<Result<()>>,
}

impl Root {
    /// Wait until the root has served its communicator (every rank joined: Ok) or given up
    /// (the error the ranks were sent).
    pub fn wait(self) -> Result<()> {
        self.thread
            .join()
            .unwrap_or_else(|_| Err(Error::Internal("the bootstrap root panicked".into())))
    }
}

/// Start a root on `bind` (port 0: any) serving one communicator of `nranks` ranks (None: as
/// many as the first rank to arrive says), with `nonce` (None: a fresh one), for `timeout` (a
/// `Config::timeout_setting`, whose source its errors name, or a bare `Duration`).
pub fn listen(
    bind: SocketAddr,
    nonce_value: Option<u64>,
    nranks: Option<usize>,
    timeout: impl Into<Timeout>,
) -> Result<Root> {
    start(bind, nonce_value, nranks, timeout.into(), Duration::ZERO)
}

/// `listen` for a launch whose job has no identity (no launcher job id, no
/// `FABRICOLL_JOB_ID`), whose nonce another job on the same port shares: once every rank has
/// arrived, the root waits `SETTLE` more before it sends the tables, and a rank that arrives
/// twice meanwhile, or a rank 0 that found the port taken, fails every rank. Two jobs started
/// that close together are refused instead of mixed; the job id is what keeps them apart
/// whatever the interval.
pub fn listen_unnamed(
    bind: SocketAddr,
    nonce_value: u64,
    nranks: usize,
    timeout: impl Into<Timeout>,
) -> Result<Root> {
    start(
        bind,
        Some(nonce_value),
        Some(nranks),
        timeout.into(),
        SETTLE,
    )
}

fn start(
    bind: SocketAddr,
    nonce_value: Option<u64>,
    nranks: Option<usize>,
    timeout: Timeout,
    settle: Duration,
) -> Result<Root> {
    if let Some(n) = nranks {
        check_ranks(0, n)?;
    }
    let listener = match TcpListener::bind(bind) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && bind.port() != 0 => {
            // A launch's fixed port (FABRICOLL_ROOT, MASTER_PORT + 1) held by another root,
            // which may already have taken ranks of this job for its own.
            if let Some(n) = nonce_value {
                let ip = match bind.ip() {
                    IpAddr::V4(a) if a.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
                    IpAddr::V6(a) if a.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
                    ip => ip,
                };
                contend(SocketAddr::new(ip, bind.port()), n);
            }
            return Err(two_jobs(format!(
                "rank 0 cannot listen on {bind}: another bootstrap root holds the port"
            )));
        }
        Err(e) => return Err(io(&format!("listen on {bind}"), e)),
    };
    let addr = listener.local_addr().map_err(|e| io("local address", e))?;
    let id = UniqueId {
        addr,
        nonce: nonce_value.unwrap_or_else(nonce),
    };
    let done = Arc::new((parking_lot::Mutex::new(false), parking_lot::Condvar::new()));
    RUNNING.lock().push((id, done.clone()));
    let thread = std::thread::Builder::new()
        .name("fabricoll-bootstrap".into())
        .spawn(move || {
            let r = root(listener, id, nranks.unwrap_or(0), timeout, settle);
            if let Err(e) = &r {
                log::warn!("bootstrap root on {addr}: {e}");
            }
            RUNNING.lock().retain(|(i, _)| *i != id);
            *done.0.lock() = true;
            done.1.notify_all();
            r
        });
    let thread = match thread {
        Ok(t) => t,
        Err(e) => {
            RUNNING.lock().retain(|(i, _)| *i != id);
            return Err(io("thread", e));
        }
    };
    Ok(Root { id, thread })
}

/// Start a root on `bind` (port 0: any) serving one communicator; returns its unique id (the
/// root's thread runs on by itself).
pub fn serve(
    bind: SocketAddr,
    nonce_value: Option<u64>,
    timeout: impl Into<Timeout>,
) -> Result<UniqueId> {
    Ok(listen(bind, nonce_value, None, timeout)?.id)
}

/// A unique id for a new communicator, with its root listening on `FABRICOLL_BOOTSTRAP_ADDR`'s
/// address (default 127.0.0.1: single host).
pub fn new_unique_id(bind_ip: IpAddr, timeout: impl Into<Timeout>) -> Result<UniqueId> {
    serve(SocketAddr::new(bind_ip, 0), None, timeout)
}

/// The ranks below `nranks` not in `arrived`, as a short list for an error message.
fn missing(arrived: &BTreeMap<usize, (TcpStream, Vec<u8>)>, nranks: usize) -> String {
    const SHOWN: usize = 8;
    let mut gone = (0..nranks).filter(|r| !arrived.contains_key(r));
    let mut list: Vec<String> = gone.by_ref().take(SHOWN).map(|r| r.to_string()).collect();
    if gone.next().is_some() {
        list.push("...".into());
    }
    list.join(", ")
}

/// Serve one communicator: gather every rank's hello, then send each the table of addresses.
/// The communicator's size is `expected`, or (0) the first good hello's `nranks`; ranks that
/// disagree are refused; after the last rank, the root listens `settle` longer. Each connection's hello is read by a thread of its own within
/// `HELLO_WAIT` (at most `MAX_READERS` at once; more connections are closed unread), so a
/// silent peer holds no rank up. A rank that arrives twice, or a rank 0 of another job, fails
/// every rank: two jobs met here. Memory grows only with the ranks that arrived (at most
/// `MAX_ADDR` bytes each).
fn root(
    listener: TcpListener,
    id: UniqueId,
    expected: usize,
    timeout: Timeout,
    settle: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout.limit;
    listener
        .set_nonblocking(true)
        .map_err(|e| io("listener", e))?;
    let (tx, rx) = mpsc::channel::<(TcpStream, Heard)>();
    let readers = Arc::new(AtomicUsize::new(0));
    let mut conns: BTreeMap<usize, (TcpStream, Vec<u8>)> = BTreeMap::new();
    let mut nranks = expected;
    let (mut silent, mut unread) = (0usize, 0usize);
    let said = if expected > 0 {
        "the root was started for them"
    } else {
        "the first rank to arrive said so"
    };
    let mut failed: Option<Error> = None;
    // Set once every rank has arrived: when the tables go out (`settle` later).
    let mut settled: Option<Instant> = None;
    while failed.is_none() && settled.is_none_or(|t| Instant::now() < t) {
        if settled.is_none() && nranks > 0 && conns.len() == nranks {
            settled = Some(Instant::now() + settle);
            continue;
        }
        if Instant::now() > deadline {
            let others = match (silent, unread) {
                (0, 0) => String::new(),
                (s, u) => format!(
                    " ({s} connection(s) sent no hello within {HELLO_WAIT:?}, {u} closed unread)"
                ),
            };
            failed = Some(Error::Timeout(if nranks == 0 {
                format!("no rank arrived within {timeout}{others}")
            } else {
                format!(
                    "{} of {nranks} ranks did not arrive within {timeout}: rank(s) {} \
                     missing{others}",
                    nranks - conns.len(),
                    missing(&conns, nranks)
                )
            }));
            break;
        }
        let mut moved = false;
        match listener.accept() {
            Ok((s, _)) => {
                moved = true;
                if readers.load(Ordering::SeqCst) >= MAX_READERS {
                    unread += 1; // dropped: closed
                } else {
                    readers.fetch_add(1, Ordering::SeqCst);
                    let (tx, count) = (tx.clone(), readers.clone());
                    let spawned = std::thread::Builder::new()
                        .name("fabricoll-bootstrap-hello".into())
                        .spawn(move || {
                            let mut s = s;
                            let heard = if s.set_nonblocking(false).is_ok() {
                                let _ = s.set_nodelay(true);
                                read_hello(&mut s, &id, deadline)
                            } else {
                                Heard::Silent
                            };
                            if let Heard::Refused(e) = &heard {
                                refuse(&mut s, e);
                            }
                            let _ = tx.send((s, heard));
                            count.fetch_sub(1, Ordering::SeqCst);
                        });
                    if spawned.is_err() {
                        readers.fetch_sub(1, Ordering::SeqCst);
                        unread += 1;
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(io("accept", e)),
        }
        while let Ok((mut s, heard)) = rx.try_recv() {
            moved = true;
            let h = match heard {
                Heard::Rank(h) => h,
                Heard::Silent => {
                    silent += 1;
                    continue;
                }
                Heard::Refused(e) => {
                    log::warn!("bootstrap: refused a peer: {e}");
                    continue;
                }
                Heard::Contender(e) => {
                    refuse(&mut s, &e);
                    failed = Some(e);
                    break;
                }
            };
            if nranks == 0 {
                nranks = h.nranks;
            }
            if h.nranks != nranks {
                let e = Error::arg(
                    "nranks",
                    format!(
                        "rank {} says {}, but the communicator has {nranks} ranks ({said})",
                        h.rank, h.nranks
                    ),
                );
                log::warn!("bootstrap: refused a rank: {e}");
                refuse(&mut s, &e);
                continue;
            }
            if conns.contains_key(&h.rank) {
                let e = two_jobs(format!("rank {} joined twice", h.rank));
                refuse(&mut s, &e);
                failed = Some(e);
                break;
            }
            conns.insert(h.rank, (s, h.addr));
        }
        if !moved {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    if let Some(e) = failed {
        for (s, _) in conns.values_mut() {
            refuse(s, &e);
        }
        return Err(e);
    }
    let mut table = Vec::new();
    for (_, a) in conns.values() {
        table.extend_from_slice(&(a.len() as u32).to_le_bytes());
        table.extend_from_slice(a);
    }
    for (s, _) in conns.values_mut() {
        let mut msg = (table.len() as u64).to_le_bytes().to_vec();
        msg.extend_from_slice(&table);
        s.write_all(&msg).map_err(|e| io("send table", e))?;
    }
    Ok(())
}

//! Bootstrap over TCP, like `ncclGetUniqueId` / `ncclCommInitRank`: the process that makes the
//! unique id listens; every rank connects, sends its endpoint address, and receives everyone's.
//! Every wait has a deadline. The root serves one communicator, then its thread ends.
#![forbid(unsafe_code)]

mod root;
pub use root::{listen, listen_unnamed, new_unique_id, serve, Root};

use crate::config::Timeout;
use crate::error::{Error, Result};
use crate::exec::MAX_RANKS;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Roots serving in this process, each with the flag it raises when its thread ends. A rank
/// whose own process runs the root waits for it after its exchange (`exchange`), so that the
/// rank cannot exit (failing the agreement check, say) while the root is still sending the
/// other ranks their tables, which would cut them off with a closed connection.
type Running = Vec<(
    UniqueId,
    Arc<(parking_lot::Mutex<bool>, parking_lot::Condvar)>,
)>;
static RUNNING: parking_lot::Mutex<Running> = parking_lot::Mutex::new(Vec::new());

/// Size of the unique id (`fabricoll_unique_id`).
pub const UNIQUE_ID_BYTES: usize = 128;
const MAGIC: &[u8; 4] = b"FBID";
const MAX_ADDR: usize = 4096;

/// Where the root listens and the nonce that keeps strangers out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UniqueId {
    pub addr: SocketAddr,
    pub nonce: u64,
}

impl UniqueId {
    pub fn to_bytes(&self) -> [u8; UNIQUE_ID_BYTES] {
        let mut b = [0u8; UNIQUE_ID_BYTES];
        b[0..4].copy_from_slice(MAGIC);
        b[4..12].copy_from_slice(&self.nonce.to_le_bytes());
        b[12..14].copy_from_slice(&self.addr.port().to_le_bytes());
        match self.addr.ip() {
            IpAddr::V4(a) => {
                b[14] = 4;
                b[15..19].copy_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                b[14] = 6;
                b[15..31].copy_from_slice(&a.octets());
            }
        }
        b
    }

    /// Parse the bytes of a unique id; an error names `what` (the argument or variable the
    /// bytes came from).
    pub fn from_bytes(b: &[u8], what: &str) -> Result<UniqueId> {
        let bad = || {
            Error::arg(
                what,
                "not a fabricoll unique id (make one with fabricoll_get_unique_id or \
                 `fabricoll-info --unique-id`)",
            )
        };
        if b.len() < 31 || &b[0..4] != MAGIC {
            return Err(bad());
        }
        let nonce = u64::from_le_bytes(b[4..12].try_into().map_err(|_| bad())?);
        let port = u16::from_le_bytes([b[12], b[13]]);
        let ip: IpAddr = match b[14] {
            4 => IpAddr::from(<[u8; 4]>::try_from(&b[15..19]).map_err(|_| bad())?),
            6 => IpAddr::from(<[u8; 16]>::try_from(&b[15..31]).map_err(|_| bad())?),
            _ => return Err(bad()),
        };
        Ok(UniqueId {
            addr: SocketAddr::new(ip, port),
            nonce,
        })
    }

    /// Hex form, for `FABRICOLL_UNIQUE_ID` (launchers pass it to ranks through the environment).
    pub fn to_hex(&self) -> String {
        self.to_bytes()[..31]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Parse the hex form; an error names `what` (`FABRICOLL_UNIQUE_ID`, or the file it was
    /// read from).
    pub fn from_hex(s: &str, what: &str) -> Result<UniqueId> {
        let s = s.trim();
        let not_hex = || Error::arg(what, format!("{s:?} is not a hex string"));
        if !s.len().is_multiple_of(2) || !s.is_ascii() {
            return Err(not_hex());
        }
        let v: std::result::Result<Vec<u8>, _> = (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16))
            .collect();
        UniqueId::from_bytes(&v.map_err(|_| not_hex())?, what)
    }
}

fn nonce() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut x = t.as_nanos() as u64 ^ ((std::process::id() as u64) << 32);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^ (x >> 29)
}

fn io(what: &str, e: std::io::Error) -> Error {
    Error::System(format!("bootstrap {what}: {e}"))
}

/// The fixed part of a rank's hello: nonce (u64), rank, nranks, address length (u32 each) and
/// 4 bytes of padding; the address follows.
const HELLO: usize = 24;
/// In place of the table's size, the root's answer to a rank it refuses; the kind of error
/// (u32, `Refusal`), the length of its message (u32, at most `MAX_REFUSAL`) and the message
/// follow.
const REFUSED: u64 = u64::MAX;
const MAX_REFUSAL: usize = 1024;
/// How much of a refused peer's remaining bytes the root reads (and drops) before closing, so
/// that the close does not reset the connection before the peer has read the refusal.
const MAX_DRAIN: usize = 64 << 10;

/// The kinds of error a refusal carries, as numbers on the wire.
#[derive(Clone, Copy)]
enum Refusal {
    Argument = 1,
    Timeout = 2,
}

impl Refusal {
    fn of(e: &Error) -> (Refusal, &str) {
        match e {
            Error::Timeout(m) => (Refusal::Timeout, m),
            Error::InvalidArgument(m)
            | Error::InvalidUsage(m)
            | Error::System(m)
            | Error::Internal(m)
            | Error::Remote(m) => (Refusal::Argument, m),
        }
    }

    fn error(kind: u32, msg: String) -> Error {
        match kind {
            k if k == Refusal::Timeout as u32 => Error::Timeout(msg),
            k if k == Refusal::Argument as u32 => Error::InvalidArgument(msg),
            _ => Error::Remote(msg),
        }
    }
}

/// Read exactly `buf` from `s` before `deadline`. `on_timeout` says what it means that the
/// deadline passed; a closed connection is a remote error.
fn read_exact(
    s: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
    what: &str,
    on_timeout: impl FnOnce() -> String,
) -> Result<()> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    s.set_read_timeout(Some(left)).map_err(|e| io(what, e))?;
    s.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            Error::Timeout(format!("bootstrap {what}: {}", on_timeout()))
        }
        std::io::ErrorKind::UnexpectedEof
        | std::io::ErrorKind::ConnectionReset
        | std::io::ErrorKind::ConnectionAborted => Error::Remote(format!(
            "bootstrap {what}: the peer closed the connection ({e})"
        )),
        _ => io(what, e),
    })
}

/// Check that `rank` is a rank of a communicator of `nranks`, and that such a communicator
/// can exist (at most `exec::MAX_RANKS` ranks: what the message tags carry).
pub(crate) fn check_ranks(rank: usize, nranks: usize) -> Result<()> {
    if nranks == 0 || nranks > MAX_RANKS {
        return Err(Error::arg(
            "nranks",
            format!("{nranks} is outside 1..={MAX_RANKS}"),
        ));
    }
    if rank >= nranks {
        return Err(Error::arg(
            "rank",
            format!("{rank} is not below nranks ({nranks})"),
        ));
    }
    Ok(())
}

/// Join the communicator of `id` as `rank` of `nranks`, sending `addr`, within `timeout` (as
/// `listen`'s); returns every rank's address.
pub fn exchange(
    id: &UniqueId,
    rank: usize,
    nranks: usize,
    addr: &[u8],
    timeout: impl Into<Timeout>,
) -> Result<Vec<Vec<u8>>> {
    let timeout = timeout.into();
    check_ranks(rank, nranks)?;
    if addr.len() > MAX_ADDR {
        return Err(Error::Internal(format!(
            "endpoint address of {} bytes, more than the bootstrap's {MAX_ADDR}",
            addr.len()
        )));
    }
    let deadline = Instant::now() + timeout.limit;
    let mut s = loop {
        match TcpStream::connect_timeout(&id.addr, Duration::from_millis(500)) {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                log::debug!("bootstrap connect to {}: {e}; retrying", id.addr);
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                return Err(Error::Timeout(format!(
                    "bootstrap: cannot reach the root at {} within {timeout} ({e})",
                    id.addr
                )))
            }
        }
    };
    let _ = s.set_nodelay(true);
    let mut hello = Vec::with_capacity(HELLO + addr.len());
    hello.extend_from_slice(&id.nonce.to_le_bytes());
    hello.extend_from_slice(&(rank as u32).to_le_bytes());
    hello.extend_from_slice(&(nranks as u32).to_le_bytes());
    hello.extend_from_slice(&(addr.len() as u32).to_le_bytes());
    hello.extend_from_slice(&[0u8; 4]);
    hello.extend_from_slice(addr);
    s.write_all(&hello).map_err(|e| io("hello", e))?;
    let late = || {
        format!(
            "the table did not come within {timeout}: not every one of the {nranks} ranks \
             reached the root at {}",
            id.addr
        )
    };
    let mut len = [0u8; 8];
    read_exact(&mut s, &mut len, deadline, "table size", late)?;
    let len = u64::from_le_bytes(len);
    if len == REFUSED {
        let mut head = [0u8; 8];
        read_exact(&mut s, &mut head, deadline, "refusal", late)?;
        let kind = u32::from_le_bytes(head[0..4].try_into().expect("4 bytes"));
        let n =
            (u32::from_le_bytes(head[4..8].try_into().expect("4 bytes")) as usize).min(MAX_REFUSAL);
        let mut msg = vec![0u8; n];
        read_exact(&mut s, &mut msg, deadline, "refusal", late)?;
        let msg = String::from_utf8_lossy(&msg);
        return Err(Refusal::error(
            kind,
            format!("{msg} (refused by the bootstrap root at {})", id.addr),
        ));
    }
    if len > (nranks * (MAX_ADDR + 4)) as u64 {
        return Err(Error::Remote("bootstrap: malformed table".into()));
    }
    let mut table = vec![0u8; len as usize];
    read_exact(&mut s, &mut table, deadline, "table", late)?;
    // This process's own root, if it is one, let it finish sending the others their tables.
    // Matched by port and nonce: a root listening on every interface is reached by a named one.
    let own = RUNNING
        .lock()
        .iter()
        .find(|(i, _)| i.nonce == id.nonce && i.addr.port() == id.addr.port())
        .map(|(_, d)| d.clone());
    if let Some(done) = own {
        let mut finished = done.0.lock();
        while !*finished && Instant::now() < deadline {
            done.1.wait_until(&mut finished, deadline);
        }
    }
    let mut out = Vec::with_capacity(nranks);
    let mut p = 0;
    while p + 4 <= table.len() {
        let l = u32::from_le_bytes(table[p..p + 4].try_into().expect("4")) as usize;
        p += 4;
        out.push(
            table
                .get(p..p + l)
                .ok_or_else(|| Error::Remote("bootstrap: malformed table".into()))?
                .to_vec(),
        );
        p += l;
    }
    if out.len() != nranks {
        return Err(Error::Remote(format!(
            "bootstrap: table has {} ranks, expected {nranks}",
            out.len()
        )));
    }
    Ok(out)
}

/// The default address the root binds: `FABRICOLL_BOOTSTRAP_ADDR` or 127.0.0.1.
pub fn default_bind_ip(cfg: &crate::config::Config) -> IpAddr {
    cfg.bootstrap_addr
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_round_trips_and_ranks_exchange() {
        let id = new_unique_id(IpAddr::V4(Ipv4Addr::LOCALHOST), Duration::from_secs(10)).unwrap();
        assert_eq!(UniqueId::from_bytes(&id.to_bytes(), "id").unwrap(), id);
        assert_eq!(UniqueId::from_hex(&id.to_hex(), "X").unwrap(), id);
        let e = UniqueId::from_bytes(&[0u8; 128], "id").unwrap_err();
        assert!(e.to_string().contains("'id'"), "{e}");
        for bad in ["zz", "abc", "00112233", "é1"] {
            let e = UniqueId::from_hex(bad, "FABRICOLL_UNIQUE_ID").unwrap_err();
            assert!(e.to_string().contains("FABRICOLL_UNIQUE_ID"), "{bad}: {e}");
        }
        let hs: Vec<_> = (0..3)
            .map(|r| {
                std::thread::spawn(move || {
                    exchange(&id, r, 3, &[r as u8; 5], Duration::from_secs(10)).unwrap()
                })
            })
            .collect();
        for h in hs {
            let t = h.join().unwrap();
            assert_eq!(t, vec![vec![0u8; 5], vec![1u8; 5], vec![2u8; 5]]);
        }
    }

    #[test]
    fn exchange_has_a_deadline() {
        // A root that never gets its second rank.
        let id =
            new_unique_id(IpAddr::V4(Ipv4Addr::LOCALHOST), Duration::from_millis(300)).unwrap();
        let e = exchange(&id, 0, 2, b"x", Duration::from_millis(500)).unwrap_err();
        assert!(matches!(e, Error::Timeout(_)), "{e}");
    }
}

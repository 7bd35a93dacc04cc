//! Bootstrap over TCP, like `ncclGetUniqueId` / `ncclCommInitRank`: the process that makes the
//! unique id listens; every rank connects, sends its endpoint address, and receives everyone's.
//! Every wait has a deadline. The root serves one communicator, then its thread ends.
#![forbid(unsafe_code)]

use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

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

    pub fn from_bytes(b: &[u8]) -> Result<UniqueId> {
        let bad = || Error::arg("uniqueId", "not a fabricoll unique id");
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

    pub fn from_hex(s: &str) -> Result<UniqueId> {
        let s = s.trim();
        if s.len() % 2 != 0 || !s.is_ascii() {
            return Err(Error::arg("FABRICOLL_UNIQUE_ID", "not a hex string"));
        }
        let v: std::result::Result<Vec<u8>, _> = (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16))
            .collect();
        UniqueId::from_bytes(&v.map_err(|_| Error::arg("FABRICOLL_UNIQUE_ID", "not a hex string"))?)
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

fn read_exact(s: &mut TcpStream, buf: &mut [u8], deadline: Instant, what: &str) -> Result<()> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    s.set_read_timeout(Some(left)).map_err(|e| io(what, e))?;
    s.read_exact(buf).map_err(|e| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            Error::Timeout(format!(
                "bootstrap {what}: no answer before the deadline (FABRICOLL_TIMEOUT_MS)"
            ))
        } else {
            io(what, e)
        }
    })
}

/// Start a root on `bind` (port 0: any) serving one communicator; returns its unique id.
pub fn serve(bind: SocketAddr, nonce_value: Option<u64>, timeout: Duration) -> Result<UniqueId> {
    let listener = TcpListener::bind(bind).map_err(|e| io(&format!("listen on {bind}"), e))?;
    let addr = listener.local_addr().map_err(|e| io("local address", e))?;
    let id = UniqueId {
        addr,
        nonce: nonce_value.unwrap_or_else(nonce),
    };
    std::thread::Builder::new()
        .name("fabricoll-bootstrap".into())
        .spawn(move || {
            if let Err(e) = root(listener, id, timeout) {
                log::warn!("bootstrap root on {addr}: {e}");
            }
        })
        .map_err(|e| io("thread", e))?;
    Ok(id)
}

/// A unique id for a new communicator, with its root listening on `FABRICOLL_BOOTSTRAP_ADDR`'s
/// address (default 127.0.0.1: single host).
pub fn new_unique_id(bind_ip: IpAddr, timeout: Duration) -> Result<UniqueId> {
    serve(SocketAddr::new(bind_ip, 0), None, timeout)
}

fn root(listener: TcpListener, id: UniqueId, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    listener
        .set_nonblocking(true)
        .map_err(|e| io("listener", e))?;
    let mut conns: Vec<Option<(TcpStream, Vec<u8>)>> = Vec::new();
    let mut nranks = 0usize;
    let mut arrived = 0usize;
    while nranks == 0 || arrived < nranks {
        if Instant::now() > deadline {
            return Err(Error::Timeout(format!(
                "{arrived} of {nranks} ranks arrived before the deadline"
            )));
        }
        let (mut s, _) = match listener.accept() {
            Ok(x) => x,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(e) => return Err(io("accept", e)),
        };
        s.set_nonblocking(false).map_err(|e| io("socket", e))?;
        let _ = s.set_nodelay(true);
        let mut hdr = [0u8; 24];
        if read_exact(&mut s, &mut hdr, deadline, "hello").is_err() {
            continue; // not one of ours, or gone: ignore
        }
        let n = u64::from_le_bytes(hdr[0..8].try_into().expect("8"));
        let rank = u32::from_le_bytes(hdr[8..12].try_into().expect("4")) as usize;
        let nr = u32::from_le_bytes(hdr[12..16].try_into().expect("4")) as usize;
        let len = u32::from_le_bytes(hdr[16..20].try_into().expect("4")) as usize;
        if n != id.nonce || len > MAX_ADDR || nr == 0 || rank >= nr {
            continue;
        }
        let mut addr = vec![0u8; len];
        if read_exact(&mut s, &mut addr, deadline, "address").is_err() {
            continue;
        }
        if nranks == 0 {
            nranks = nr;
            conns = (0..nr).map(|_| None).collect();
        }
        if nr != nranks || conns[rank].is_some() {
            log::warn!("bootstrap: rank {rank} of {nr} does not fit a communicator of {nranks} (or came twice)");
            continue;
        }
        conns[rank] = Some((s, addr));
        arrived += 1;
    }
    let mut table = Vec::new();
    for c in conns.iter().flatten() {
        table.extend_from_slice(&(c.1.len() as u32).to_le_bytes());
        table.extend_from_slice(&c.1);
    }
    for c in conns.iter_mut().flatten() {
        let mut msg = (table.len() as u64).to_le_bytes().to_vec();
        msg.extend_from_slice(&table);
        c.0.write_all(&msg).map_err(|e| io("send table", e))?;
    }
    Ok(())
}

/// Join the communicator of `id` as `rank` of `nranks`, sending `addr`; returns every rank's address.
pub fn exchange(
    id: &UniqueId,
    rank: usize,
    nranks: usize,
    addr: &[u8],
    timeout: Duration,
) -> Result<Vec<Vec<u8>>> {
    let deadline = Instant::now() + timeout;
    let mut s = loop {
        match TcpStream::connect_timeout(&id.addr, Duration::from_millis(500)) {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                log::debug!("bootstrap connect to {}: {e}; retrying", id.addr);
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                return Err(Error::Timeout(format!(
                    "bootstrap: cannot reach the root at {} ({e})",
                    id.addr
                )))
            }
        }
    };
    let _ = s.set_nodelay(true);
    let mut hello = Vec::with_capacity(24 + addr.len());
    hello.extend_from_slice(&id.nonce.to_le_bytes());
    hello.extend_from_slice(&(rank as u32).to_le_bytes());
    hello.extend_from_slice(&(nranks as u32).to_le_bytes());
    hello.extend_from_slice(&(addr.len() as u32).to_le_bytes());
    hello.extend_from_slice(&[0u8; 4]);
    hello.extend_from_slice(addr);
    s.write_all(&hello).map_err(|e| io("hello", e))?;
    let mut len = [0u8; 8];
    read_exact(&mut s, &mut len, deadline, "table size")?;
    let len = u64::from_le_bytes(len) as usize;
    if len > nranks * (MAX_ADDR + 4) {
        return Err(Error::Remote("bootstrap: malformed table".into()));
    }
    let mut table = vec![0u8; len];
    read_exact(&mut s, &mut table, deadline, "table")?;
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
        assert_eq!(UniqueId::from_bytes(&id.to_bytes()).unwrap(), id);
        assert_eq!(UniqueId::from_hex(&id.to_hex()).unwrap(), id);
        assert!(UniqueId::from_bytes(&[0u8; 128]).is_err());
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
        assert!(matches!(e, Error::Timeout(_) | Error::System(_)), "{e}");
    }
}

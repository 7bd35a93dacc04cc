//! The file route of a launch (`FABRICOLL_ROOT_FILE`): rank 0 serves a root on an address
//! the other hosts can reach and writes its id to a file they all see; the others wait for it.
use super::bootstrap::{self, UniqueId};
use crate::config::{Config, Timeout};
use crate::error::{Error, Result};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

/// The address a root that ranks on other hosts must reach listens on: `FABRICOLL_BOOTSTRAP_ADDR`,
/// else this host's first address that is up and not loopback (IPv4 first), else 127.0.0.1.
pub fn bind_ip(cfg: &Config) -> IpAddr {
    cfg.bootstrap_addr
        .or_else(host_ip)
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

fn file_err(path: &Path, what: &str, e: std::io::Error) -> Error {
    Error::arg(
        "FABRICOLL_ROOT_FILE",
        format!("{what} {}: {e}", path.display()),
    )
}

/// Rank 0's side of a published id: the id, and the thread that removes the file once the
/// root has served.
pub(super) struct Published {
    pub id: UniqueId,
    removed: Option<std::sync::mpsc::Receiver<()>>,
}

impl Published {
    /// Wait (until `limit`) for the file to be removed: call it once this rank's communicator
    /// is built, when the root has served every rank, so that the process does not exit with
    /// the removal still pending.
    pub fn finish(self, limit: Duration) {
        if let Some(rx) = self.removed {
            if rx.recv_timeout(limit).is_err() {
                log::debug!("FABRICOLL_ROOT_FILE: the root had not finished within {limit:?}");
            }
        }
    }
}

/// Rank 0 of the file route: start a root on `ip`, write its id to `path` (a temporary file
/// renamed into place, so that a reader sees all of it or nothing), and remove the file once
/// the root has served (if it still holds this id); `Published::finish` waits for that.
pub(super) fn publish(
    path: &Path,
    nonce: Option<u64>,
    nranks: usize,
    ip: IpAddr,
    timeout: impl Into<Timeout>,
) -> Result<Published> {
    let root = bootstrap::listen(SocketAddr::new(ip, 0), nonce, Some(nranks), timeout)?;
    let id = root.id;
    let hex = id.to_hex();
    let name = path.file_name().ok_or_else(|| {
        Error::arg(
            "FABRICOLL_ROOT_FILE",
            format!("{} names no file", path.display()),
        )
    })?;
    let tmp = path.with_file_name(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    std::fs::write(&tmp, format!("{hex}\n")).map_err(|e| file_err(&tmp, "cannot write", e))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        file_err(path, "cannot rename the id into", e)
    })?;
    let owned = path.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("fabricoll-root-file".into())
        .spawn(move || {
            let _ = root.wait();
            if std::fs::read_to_string(&owned).is_ok_and(|s| s.trim() == hex) {
                let _ = std::fs::remove_file(&owned);
            }
            let _ = tx.send(());
        });
    let removed = match spawned {
        Ok(_) => Some(rx),
        Err(e) => {
            log::debug!("FABRICOLL_ROOT_FILE: no thread to remove the file after the job: {e}");
            None
        }
    };
    Ok(Published { id, removed })
}

/// The other ranks of the file route: wait (until `deadline`, `timeout` from now) for the file
/// to hold an id of this job (with a job nonce, an id with another nonce is a stale file: wait
/// on).
pub(super) fn await_file(
    path: &Path,
    nonce: Option<u64>,
    deadline: Instant,
    timeout: impl Into<Timeout>,
) -> Result<UniqueId> {
    let timeout = timeout.into();
    loop {
        match std::fs::read_to_string(path) {
            Ok(s) => {
                let id = UniqueId::from_hex(&s, "FABRICOLL_ROOT_FILE")?;
                if nonce.is_none_or(|n| n == id.nonce) {
                    return Ok(id);
                }
                log::debug!(
                    "FABRICOLL_ROOT_FILE {}: another job's id; waiting",
                    path.display()
                );
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(file_err(path, "cannot read", e)),
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout(format!(
                "FABRICOLL_ROOT_FILE {}: rank 0 did not write this job's id within {timeout}",
                path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// This host's first address on an interface that is up and not loopback: IPv4 first, else a
/// global IPv6 one.
fn host_ip() -> Option<IpAddr> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head to `list` on success; it is freed below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let (mut v4, mut v6) = (None, None);
    let mut p = list;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        let flags = ifa.ifa_flags as libc::c_int;
        if ifa.ifa_addr.is_null() || flags & libc::IFF_UP == 0 || flags & libc::IFF_LOOPBACK != 0 {
            continue;
        }
        // SAFETY: a non-null `ifa_addr` points to a sockaddr whose family says its type.
        let family = unsafe { (*ifa.ifa_addr).sa_family } as libc::c_int;
        if family == libc::AF_INET && v4.is_none() {
            // SAFETY: family AF_INET: the address is a sockaddr_in.
            let a = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            v4 = Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr))));
        } else if family == libc::AF_INET6 && v6.is_none() {
            // SAFETY: family AF_INET6: the address is a sockaddr_in6.
            let a = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
            let ip = std::net::Ipv6Addr::from(a.sin6_addr.s6_addr);
            if ip.segments()[0] & 0xffc0 != 0xfe80 {
                v6 = Some(IpAddr::V6(ip));
            }
        }
    }
    // SAFETY: `list` came from getifaddrs and is freed once; no node is used after this.
    unsafe { libc::freeifaddrs(list) };
    v4.or(v6)
}

//! Whether a peer endpoint of a socket provider (`net`, `tcp`) is gone: its address, a
//! `sockaddr_in` or `sockaddr_in6` (the provider's name of the endpoint), refuses a TCP
//! connection. Each such endpoint listens on a port of its own for as long as it is open, so a
//! refusal means the endpoint was closed or its process died. The provider itself may not say
//! so: libfabric 1.17's native TCP endpoint keeps a send to a peer whose connection it saw
//! end queued for ever. The check is one connection attempt (closed at once, before the
//! provider's handshake: the peer's listener drops it), so it is made only of a peer that
//! looks stuck (`Transport::peer_gone`).
use std::time::Duration;

/// Whether the endpoint at `addr` refuses a connection within `within`. False where `addr` is
/// not a socket address, the attempt connects, or no answer comes in time (a host that does
/// not answer may still come back).
pub(super) fn refused(addr: &[u8], within: Duration) -> bool {
    let Some(family) = family(addr) else {
        return false;
    };
    // SAFETY: socket has no memory preconditions; the descriptor is closed below.
    let fd = unsafe {
        libc::socket(
            family,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return false;
    }
    let refused = attempt(fd, addr, within);
    // SAFETY: fd was opened above and is closed once.
    unsafe { libc::close(fd) };
    refused
}

/// The address family of `addr` where it is a whole `sockaddr_in` or `sockaddr_in6`.
fn family(addr: &[u8]) -> Option<libc::c_int> {
    let f = libc::c_int::from(u16::from_ne_bytes([*addr.first()?, *addr.get(1)?]));
    let need = match f {
        libc::AF_INET => std::mem::size_of::<libc::sockaddr_in>(),
        libc::AF_INET6 => std::mem::size_of::<libc::sockaddr_in6>(),
        _ => return None,
    };
    (addr.len() >= need).then_some(f)
}

/// Connect the non-blocking socket `fd` to `addr`: whether it was refused within `within`.
fn attempt(fd: libc::c_int, addr: &[u8], within: Duration) -> bool {
    // The address is copied into aligned storage: `addr` has no alignment of its own.
    // SAFETY: sockaddr_storage is plain data, valid when zeroed.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = addr
        .len()
        .min(std::mem::size_of::<libc::sockaddr_storage>());
    // SAFETY: `len` bytes fit both the source and the storage, which do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(addr.as_ptr(), &mut ss as *mut _ as *mut u8, len);
    }
    // SAFETY: ss holds a socket address of `len` bytes (checked by `family`).
    let rc = unsafe {
        libc::connect(
            fd,
            &ss as *const _ as *const libc::sockaddr,
            len as libc::socklen_t,
        )
    };
    if rc == 0 {
        return false;
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ECONNREFUSED) => return true,
        Some(libc::EINPROGRESS) => {}
        _ => return false,
    }
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    let ms = within.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: p is one valid pollfd.
    if unsafe { libc::poll(&mut p, 1, ms) } != 1 {
        return false;
    }
    let mut err: libc::c_int = 0;
    let mut n = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: err and n are valid for getsockopt's output of one int.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            &mut err as *mut _ as *mut libc::c_void,
            &mut n,
        )
    };
    rc == 0 && err == libc::ECONNREFUSED
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{SocketAddr, TcpListener};

    fn raw(a: SocketAddr) -> Vec<u8> {
        match a {
            SocketAddr::V4(v4) => {
                // SAFETY: sockaddr_in is plain data, valid when zeroed.
                let mut s: libc::sockaddr_in = unsafe { std::mem::zeroed() };
                s.sin_family = libc::AF_INET as libc::sa_family_t;
                s.sin_port = v4.port().to_be();
                s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
                // SAFETY: s is a plain struct of exactly this many bytes.
                unsafe {
                    std::slice::from_raw_parts(
                        &s as *const _ as *const u8,
                        std::mem::size_of::<libc::sockaddr_in>(),
                    )
                }
                .to_vec()
            }
            SocketAddr::V6(_) => unreachable!("the tests listen on IPv4"),
        }
    }

    #[test]
    fn a_listening_address_is_not_refused_and_a_closed_one_is() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = raw(l.local_addr().unwrap());
        let within = Duration::from_secs(5);
        assert!(!refused(&a, within), "a listening port");
        drop(l);
        assert!(refused(&a, within), "the port of a closed listener");
    }

    #[test]
    fn addresses_that_are_not_socket_addresses_are_never_refused() {
        let within = Duration::from_millis(10);
        assert!(!refused(b"fabricoll-1234-0", within));
        assert!(!refused(&[], within));
        assert!(!refused(&[2, 0, 1], within), "a truncated sockaddr_in");
    }
}

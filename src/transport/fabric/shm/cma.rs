//! Large shm messages through the fastbox: a rendezvous the receiver completes with one
//! `process_vm_readv` (cross-memory attach, CMA).
//!
//! libfabric 1.17's shm moves a message above its inject size with a command in the peer's
//! region, a `process_vm_readv` by the receiver and a response, each queue under the owner's
//! spin lock. Two ranks that send to each other at once then spin on each other's lock for as
//! long as a copy takes, and a message costs several microseconds one way (figures in
//! `docs/performance.md`).
//!
//! Between two fastbox endpoints (each holds a slot in the other's inbox) a message larger
//! than the fastbox payload instead goes as an `RTS` frame naming the sender's process, the
//! buffer's address and length and a cookie. The receiver matches it like any message, copies
//! the data straight from the sender's memory into the receive buffer, and answers with an
//! `ACK` frame carrying the cookie, on which the send completes. No lock is shared and the
//! data is copied once, as Open MPI's vader BTL does with CMA.
//!
//! Where the kernel refuses the copy (`EPERM`: a Yama `ptrace_scope` of 1 or more between
//! unrelated processes, a seccomp filter, another user), the receiver answers `FALLBACK`: the
//! sender sends the message through the provider instead (whose receive half the receiver
//! keeps posted for exactly this) and sends every later one to that peer so.
use std::io;

/// Payload of an `RTS` frame: who, where and how much, and the cookie the `ACK` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rts {
    pub(crate) pid: i32,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) cookie: u64,
}

pub(crate) const RTS_BYTES: usize = 32;

impl Rts {
    pub(crate) fn encode(&self) -> [u8; RTS_BYTES] {
        let mut b = [0u8; RTS_BYTES];
        b[0..4].copy_from_slice(&self.pid.to_le_bytes());
        b[8..16].copy_from_slice(&self.addr.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b[24..32].copy_from_slice(&self.cookie.to_le_bytes());
        b
    }

    /// None for a payload of another size or a pid that names no process of ours to read.
    pub(crate) fn decode(b: &[u8]) -> Option<Rts> {
        if b.len() != RTS_BYTES {
            return None;
        }
        let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let pid = i32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
        (pid > 0).then(|| Rts {
            pid,
            addr: word(8),
            len: word(16),
            cookie: word(24),
        })
    }
}

/// What an `ACK` says of the message its cookie names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AckStatus {
    /// Copied (or refused by the receiver for a reason of its own, such as truncation, which
    /// it reports on its side): the send is complete.
    Done,
    /// The kernel refused the copy: send it through the provider.
    Fallback,
    /// The copy failed reading the sender's memory (the buffer was not readable there).
    Failed,
}

pub(crate) const ACK_BYTES: usize = 16;

pub(crate) fn encode_ack(cookie: u64, status: AckStatus) -> [u8; ACK_BYTES] {
    let mut b = [0u8; ACK_BYTES];
    b[0..8].copy_from_slice(&cookie.to_le_bytes());
    b[8] = match status {
        AckStatus::Done => 0,
        AckStatus::Fallback => 1,
        AckStatus::Failed => 2,
    };
    b
}

pub(crate) fn decode_ack(b: &[u8]) -> Option<(u64, AckStatus)> {
    if b.len() != ACK_BYTES {
        return None;
    }
    let cookie = u64::from_le_bytes(b[0..8].try_into().expect("8 bytes"));
    let status = match b[8] {
        0 => AckStatus::Done,
        1 => AckStatus::Fallback,
        2 => AckStatus::Failed,
        _ => return None,
    };
    Some((cookie, status))
}

/// Copy `dst.len()` bytes from address `addr` of process `pid` into `dst`.
pub(crate) fn read_from(pid: i32, addr: u64, dst: &mut [u8]) -> io::Result<()> {
    let mut done = 0usize;
    while done < dst.len() {
        let local = libc::iovec {
            iov_base: dst[done..].as_mut_ptr().cast(),
            iov_len: dst.len() - done,
        };
        let remote = libc::iovec {
            iov_base: (addr as usize).wrapping_add(done) as *mut libc::c_void,
            iov_len: dst.len() - done,
        };
        // SAFETY: `local` covers the rest of `dst`, which we borrow mutably; `remote` is only
        // an address in the other process, which the kernel checks (EFAULT) and never
        // dereferences in ours.
        let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
        done += n as usize;
    }
    Ok(())
}

/// Whether a failed `read_from` means the kernel does not let us read that process at all
/// (so the provider must carry the message), rather than a bad address or a dead process.
pub(crate) fn refused(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EPERM) | Some(libc::EACCES) | Some(libc::ENOSYS)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_malformed_ones_are_refused() {
        let r = Rts {
            pid: 42,
            addr: 0xdead_beef_0000,
            len: 1 << 33,
            cookie: u64::MAX,
        };
        assert_eq!(Rts::decode(&r.encode()), Some(r));
        assert_eq!(Rts::decode(&r.encode()[..31]), None);
        assert_eq!(Rts::decode(&Rts { pid: 0, ..r }.encode()), None);
        assert_eq!(Rts::decode(&Rts { pid: -1, ..r }.encode()), None);
        for s in [AckStatus::Done, AckStatus::Fallback, AckStatus::Failed] {
            assert_eq!(decode_ack(&encode_ack(7, s)), Some((7, s)));
        }
        let mut bad = encode_ack(7, AckStatus::Done);
        bad[8] = 9;
        assert_eq!(decode_ack(&bad), None);
        assert_eq!(decode_ack(&bad[..8]), None);
    }

    #[test]
    fn reads_our_own_memory_and_reports_bad_addresses_and_processes() {
        let src: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let me = std::process::id() as i32;
        read_from(me, src.as_ptr() as u64, &mut dst).expect("read own memory");
        assert_eq!(dst, src);
        read_from(me, 0, &mut []).expect("nothing to read");
        let e = read_from(me, 8, &mut dst[..16]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
        assert!(!refused(&e));
        // A pid no process has (above the kernel's pid_max of 2^22).
        let e = read_from(1 << 23, src.as_ptr() as u64, &mut dst[..16]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESRCH), "{e}");
        assert!(!refused(&e));
        assert!(refused(&io::Error::from_raw_os_error(libc::EPERM)));
    }
}

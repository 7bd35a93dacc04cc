//! Remote memory access between loopback endpoints: a registration for peers gets a key in
//! its endpoint's table, and writes and reads copy memory between the caller's buffer and the
//! peer's registration, at the peer's virtual address, completing at once.
use super::{Endpoint, LoopbackTransport};
use crate::error::{Error, Result};
use crate::transport::{Completion, Mr, OpId, Peer, Region, RmaCaps};
use std::sync::Weak;

/// What loopback endpoints report: virtual addresses, keys of their own, and inject size.
pub(super) const CAPS: RmaCaps = RmaCaps {
    virt_addr: true,
    prov_key: true,
    key_size: 8,
    inject_size: 256,
};

/// Removes a registration's key from its endpoint's table when the `Mr` drops.
struct KeyGuard {
    ep: Weak<Endpoint>,
    key: u64,
}

impl Drop for KeyGuard {
    fn drop(&mut self) {
        if let Some(ep) = self.ep.upgrade() {
            ep.mrs.lock().remove(&self.key);
        }
    }
}

impl Endpoint {
    /// The part `[addr, addr+len)` of the registration with `key`, or why there is none.
    fn target(&self, addr: u64, len: usize, key: u64) -> Result<Region> {
        let mrs = self.mrs.lock();
        let Some(r) = mrs.get(&key) else {
            return Err(Error::System(format!(
                "loopback RMA: the peer has no registration with key {key:#x}"
            )));
        };
        let start = r.addr() as u64;
        let end = start + r.len() as u64;
        let inside = addr >= start && addr.checked_add(len as u64).is_some_and(|e| e <= end);
        if !inside {
            return Err(Error::System(format!(
                "loopback RMA: {len} bytes at {addr:#x} are outside the registration with key {key:#x} ({} bytes at {start:#x})",
                r.len()
            )));
        }
        // SAFETY: the range lies inside a registered region, whose registrant promised the
        // memory stays valid while the registration lives (and it lives: its key is here).
        Ok(unsafe { Region::from_raw(addr as usize as *mut u8, len) })
    }
}

impl LoopbackTransport {
    /// `Transport::register_remote`.
    pub(super) fn register_remote_region(&self, region: Region) -> Result<Mr> {
        let key = self
            .fabric
            .next_key
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        self.ep.mrs.lock().insert(key, region);
        let guard = KeyGuard {
            ep: std::sync::Arc::downgrade(&self.ep),
            key,
        };
        Ok(Mr {
            desc: 0,
            region,
            keep: Some(Box::new(guard)),
            key: Some(key),
            device: None,
        })
    }

    /// Copy `buf` into the peer's registration (`write`) or out of it: Ok(()) once copied.
    pub(super) fn copy(
        &self,
        write: bool,
        peer: Peer,
        buf: Region,
        addr: u64,
        key: u64,
    ) -> Result<()> {
        let dest = self.endpoint_of(peer)?;
        let there = dest.target(addr, buf.len(), key)?;
        if write {
            there.write(&buf.to_vec());
        } else {
            buf.write(&there.to_vec());
        }
        Ok(())
    }

    /// `Transport::write` and `Transport::read`: the copy, and its completion.
    pub(super) fn rma(&self, write: bool, peer: Peer, buf: Region, addr: u64, key: u64, op: OpId) {
        let c = match self.copy(write, peer, buf, addr, key) {
            Ok(()) => Completion::done(op, buf.len(), 0, None),
            Err(e) => Completion::failed(op, 0, e),
        };
        self.push(c);
    }

    /// `Transport::write_inject`: the copy, with no completion.
    pub(super) fn inject(&self, peer: Peer, src: &[u8], addr: u64, key: u64) -> Result<()> {
        if src.len() > CAPS.inject_size {
            return Err(Error::arg(
                "src",
                format!(
                    "{} bytes is more than the loopback RMA inject size of {} bytes",
                    src.len(),
                    CAPS.inject_size
                ),
            ));
        }
        let dest = self.endpoint_of(peer)?;
        dest.target(addr, src.len(), key)?.write(src);
        Ok(())
    }
}

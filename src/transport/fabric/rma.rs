//! Remote memory access over libfabric: which plugin endpoints get it (`probe`, `usable`),
//! registrations peers may read and write (`register_remote`), and `fi_write`,
//! `fi_inject_write` and `fi_read` with their completions on the endpoint's queue.
//!
//! Remote addresses are the peer's virtual addresses, as Neuron's net plugin hands them over,
//! so a domain offers RMA here only where libfabric grants `FI_MR_VIRT_ADDR`: without it a
//! remote address is an offset into the registration (libfabric 1.17's `tcp;ofi_rxm` and
//! `net` grant no `mr_mode` bits, and address by offset; `shm` grants `FI_MR_VIRT_ADDR`).
use super::discovery::getinfo_caps;
use super::{check, cstr, strerror, sys, FabricTransport, Inner, OpCtx, Role};
use crate::error::{Error, Result};
use crate::transport::{Caps, Mr, OpId, Peer, Posted, Region, RmaCaps};
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

/// The capabilities an endpoint needs to write and read peers' memory and to be written and
/// read.
const RMA_BITS: u64 =
    (sys::FI_RMA | sys::FI_READ | sys::FI_WRITE | sys::FI_REMOTE_READ | sys::FI_REMOTE_WRITE)
        as u64;

/// `FI_OPT_INJECT_RMA_SIZE`: libfabric 1.22's endpoint option for the largest
/// `fi_inject_write` (its value in `fi_endpoint.h`; the 1.17 headers do not have it, and a
/// provider that does not know it answers `-FI_ENOPROTOOPT`).
const FI_OPT_INJECT_RMA_SIZE: c_int = 18;

/// What an RMA operation's context says it is (`OpCtx::what`).
const WRITE: &str = "RMA write";
const READ: &str = "RMA read";

/// `FI_KEY_NOTAVAIL`: what `fi_mr_key` returns where a registration has no key (a cast macro
/// that the generated bindings leave out).
const KEY_NOTAVAIL: u64 = u64::MAX;

/// Keys requested where the provider does not choose them (`FI_MR_PROV_KEY` not granted):
/// unique in the process, so unique in every domain it opens.
static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

/// What a domain grants when asked for RMA: its capability bits, `mr_mode`, key size and
/// inject size (`probe` takes the endpoint's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Offer {
    pub caps: u64,
    pub mr_mode: u64,
    pub key_size: usize,
    pub inject_size: usize,
}

/// The RMA an offer makes usable: None unless it has every RMA capability and remote
/// addresses are virtual addresses (`FI_MR_VIRT_ADDR`, or the legacy `FI_MR_BASIC` mode, which
/// implies virtual addresses and provider keys).
pub(super) fn usable(o: &Offer) -> Option<RmaCaps> {
    let basic = o.mr_mode == sys::fi_mr_mode_FI_MR_BASIC as u64;
    let virt_addr = basic || o.mr_mode & sys::FI_MR_VIRT_ADDR as u64 != 0;
    if o.caps & RMA_BITS != RMA_BITS || !virt_addr {
        return None;
    }
    Some(RmaCaps {
        virt_addr,
        prov_key: basic || o.mr_mode & sys::FI_MR_PROV_KEY as u64 != 0,
        key_size: o.key_size,
        inject_size: o.inject_size,
    })
}

/// Ask `provider` for RMA on its domain `domain` (address format `addr_format`), with the
/// capabilities `base` the endpoint already has: what the domain grants, None where it offers
/// no RMA.
pub(super) fn offer(provider: &str, domain: &str, addr_format: u32, base: u64) -> Option<Offer> {
    let list = getinfo_caps(Some(provider), RMA_BITS | base).ok()?;
    let mut cur = list.0;
    while !cur.is_null() {
        // SAFETY: cur is an element of the list we own; its attributes are allocated.
        unsafe {
            let i = &*cur;
            if cstr((*i.fabric_attr).prov_name) == provider
                && cstr((*i.domain_attr).name) == domain
                && i.addr_format == addr_format
            {
                return Some(Offer {
                    caps: i.caps,
                    mr_mode: (*i.domain_attr).mr_mode as u64,
                    key_size: (*i.domain_attr).mr_key_size,
                    inject_size: (*i.tx_attr).inject_size,
                });
            }
            cur = i.next;
        }
    }
    None
}

/// Give the plugin endpoint of `info` RMA where its domain offers it usably: the capability
/// bits and the `mr_mode` the domain grants with them go into `info` and `caps`
/// (`caps.rma_caps`). Elsewhere both stay as they are.
pub(super) fn probe(info: *mut sys::fi_info, caps: &mut Caps) {
    // SAFETY: info is a complete fi_info we own (a duplicate); its attributes are allocated.
    let (addr_format, base, inject) = unsafe {
        (
            (*info).addr_format,
            (*info).caps,
            (*(*info).tx_attr).inject_size,
        )
    };
    let base = base & (sys::FI_TAGGED | sys::FI_MSG) as u64;
    let Some(o) = offer(&caps.provider, &caps.domain, addr_format, base) else {
        log::debug!("{} / {}: no RMA offered", caps.provider, caps.domain);
        return;
    };
    // The endpoint opened is this info's: its inject size, until the endpoint says better.
    let o = Offer {
        inject_size: inject,
        ..o
    };
    let Some(rma) = usable(&o) else {
        log::info!(
            "{} / {}: RMA addresses remote memory by offset (mr_mode {:#x}), not by virtual address: no RMA for the plugin",
            caps.provider,
            caps.domain,
            o.mr_mode
        );
        return;
    };
    // SAFETY: as above; we only set bits and the mr_mode the provider granted for them.
    unsafe {
        let i = &mut *info;
        i.caps |= RMA_BITS;
        (*i.tx_attr).caps |= (sys::FI_RMA | sys::FI_READ | sys::FI_WRITE) as u64;
        (*i.rx_attr).caps |= (sys::FI_RMA | sys::FI_REMOTE_READ | sys::FI_REMOTE_WRITE) as u64;
        (*i.domain_attr).mr_mode = o.mr_mode as c_int;
    }
    caps.mr_mode = o.mr_mode;
    caps.mr_local = o.mr_mode & sys::FI_MR_LOCAL as u64 != 0;
    caps.rma_caps = Some(rma);
}

/// The endpoint's largest `fi_inject_write`: `FI_OPT_INJECT_RMA_SIZE` where the provider
/// answers it, else `fallback` (its inject size).
pub(super) fn inject_size(ep: *mut sys::fid_ep, fallback: usize) -> usize {
    let mut v: usize = 0;
    let mut len = std::mem::size_of::<usize>();
    // SAFETY: ep is an enabled endpoint; v and len are valid for a size_t option.
    let rc = unsafe {
        sys::fi_getopt(
            ep as *mut sys::fid,
            sys::FI_OPT_ENDPOINT as c_int,
            FI_OPT_INJECT_RMA_SIZE,
            &mut v as *mut usize as *mut c_void,
            &mut len,
        )
    };
    if rc == 0 && len == std::mem::size_of::<usize>() {
        v
    } else {
        fallback
    }
}

impl FabricTransport {
    /// The endpoint's RMA, or the error of an RMA call where it has none.
    fn rma(&self) -> Result<RmaCaps> {
        self.caps.rma_caps.ok_or_else(|| {
            Error::InvalidUsage(format!(
                "provider {} on {} offers no RMA with virtual addresses (mr_mode {:#x})",
                self.caps.provider, self.caps.domain, self.caps.mr_mode
            ))
        })
    }

    /// `Transport::register_remote`.
    pub(super) fn register_remote_region(&self, region: Region) -> Result<Mr> {
        let rma = self.rma()?;
        let key = if rma.prov_key {
            0
        } else {
            let k = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
            if rma.key_size < 8 && k >> (8 * rma.key_size) != 0 {
                return Err(Error::System(format!(
                    "{}: no registration key left ({}-byte keys)",
                    self.caps.domain, rma.key_size
                )));
            }
            k
        };
        let access = (sys::FI_SEND
            | sys::FI_RECV
            | sys::FI_READ
            | sys::FI_WRITE
            | sys::FI_REMOTE_READ
            | sys::FI_REMOTE_WRITE) as u64;
        let (keep, desc) = self.mr_reg(region, access, key)?;
        let key = if rma.prov_key {
            // SAFETY: keep.mr is open.
            let k = unsafe { sys::fi_mr_key(keep.mr) };
            if k == KEY_NOTAVAIL {
                return Err(Error::System(format!(
                    "{}: the provider gave no key for a registration of {} bytes",
                    self.caps.domain,
                    region.len()
                )));
            }
            k
        } else {
            key
        };
        Ok(Mr {
            desc,
            region,
            keep: Some(Box::new(keep)),
            key: Some(key),
        })
    }

    /// `Transport::write` (`fi_write`) and `Transport::read` (`fi_read`).
    pub(super) fn rma_op(
        &self,
        write: bool,
        peer: Peer,
        buf: Region,
        remote: Remote,
        op: OpId,
    ) -> Result<Posted> {
        self.rma()?;
        let mut g = self.inner.lock();
        g.post_rma(write, peer, buf, remote, op)
    }

    /// `Transport::write_inject` (`fi_inject_write`).
    pub(super) fn rma_inject(&self, peer: Peer, src: &[u8], addr: u64, key: u64) -> Result<Posted> {
        let rma = self.rma()?;
        if src.len() > rma.inject_size {
            return Err(Error::arg(
                "src",
                format!(
                    "{} bytes is more than {}'s RMA inject size of {} bytes",
                    src.len(),
                    self.caps.provider,
                    rma.inject_size
                ),
            ));
        }
        let g = self.inner.lock();
        // SAFETY: the endpoint is open; libfabric copies src out before returning.
        let rc = unsafe {
            sys::fi_inject_write(
                g.tx_ep,
                src.as_ptr() as *const c_void,
                src.len(),
                peer.0,
                addr,
                key,
            )
        };
        if rc == -(sys::FI_EAGAIN as isize) {
            return Ok(Posted::Busy);
        }
        check(
            &format!(
                "fi_inject_write of {} bytes to {addr:#x} (key {key:#x})",
                src.len()
            ),
            rc as i64,
        )?;
        Ok(Posted::Queued)
    }
}

/// The far side of an RMA operation: the peer's virtual address, the key of its
/// registration, and the descriptor of the local buffer's (0 where none).
#[derive(Clone, Copy, Debug)]
pub(super) struct Remote {
    pub addr: u64,
    pub key: u64,
    pub desc: usize,
}

impl Inner {
    /// Post an `fi_write` of `buf` (or an `fi_read` into it) with a context of its own.
    fn post_rma(
        &mut self,
        write: bool,
        peer: Peer,
        buf: Region,
        r: Remote,
        op: OpId,
    ) -> Result<Posted> {
        let what = if write { WRITE } else { READ };
        let mut b = Box::new(OpCtx {
            ctx: sys::fi_context2::default(),
            op,
            len: buf.len(),
            recv: false,
            owned: None,
            role: Role::User,
            what,
        });
        let ctx = &mut *b as *mut OpCtx as *mut c_void;
        self.ops.insert(ctx as usize, b);
        // SAFETY: the endpoint is open; the buffer stays valid until the completion (Region's
        // contract); ctx lives in `ops` until its completion is read.
        let rc = unsafe {
            if write {
                sys::fi_write(
                    self.tx_ep,
                    buf.addr() as *const c_void,
                    buf.len(),
                    r.desc as *mut c_void,
                    peer.0,
                    r.addr,
                    r.key,
                    ctx,
                )
            } else {
                sys::fi_read(
                    self.tx_ep,
                    buf.addr() as *mut c_void,
                    buf.len(),
                    r.desc as *mut c_void,
                    peer.0,
                    r.addr,
                    r.key,
                    ctx,
                )
            }
        };
        if rc == 0 {
            self.rma_order.push_back(ctx as usize);
            return Ok(Posted::Queued);
        }
        self.ops.remove(&(ctx as usize));
        if rc == -(sys::FI_EAGAIN as isize) {
            return Ok(Posted::Busy);
        }
        Err(Error::from_errno(
            rc as i64,
            format!(
                "{what} of {} bytes at {:#x} (key {:#x}) failed: {} ({rc})",
                buf.len(),
                r.addr,
                r.key,
                strerror(rc as i64)
            ),
        ))
    }
}

impl Inner {
    /// The context of a completion, taken out of `ops` (and of `rma_order`).
    ///
    /// libfabric 1.17's shm reports a failed "fast" RMA operation (one it copies itself by
    /// cross-memory attach while posting it, as it does every `fi_write` and `fi_read` here)
    /// with no context (`smr_generic_rma`). It writes every fast operation's completion while
    /// posting it, so the queue holds them in the order they were posted, and a completion
    /// error without a context belongs to the oldest RMA operation still in flight.
    pub(super) fn take_ctx(&mut self, op_context: *mut c_void) -> Option<Box<OpCtx>> {
        if self.rma_order.is_empty() {
            return self.ops.remove(&(op_context as usize));
        }
        if op_context.is_null() {
            let key = self.rma_order.pop_front()?;
            return self.ops.remove(&key);
        }
        let key = op_context as usize;
        let ctx = self.ops.remove(&key)?;
        if ctx.what == WRITE || ctx.what == READ {
            if let Some(i) = self.rma_order.iter().position(|&k| k == key) {
                self.rma_order.remove(i);
            }
        }
        Some(ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rma_is_usable_only_with_every_capability_and_virtual_addresses() {
        let offer = |caps: u64, mr_mode: u32| Offer {
            caps: caps | sys::FI_TAGGED as u64,
            mr_mode: mr_mode as u64,
            key_size: 8,
            inject_size: 4096,
        };
        // shm on libfabric 1.17: virtual addresses, keys requested by us.
        let shm = usable(&offer(RMA_BITS, sys::FI_MR_VIRT_ADDR)).expect("shm");
        assert_eq!(
            shm,
            RmaCaps {
                virt_addr: true,
                prov_key: false,
                key_size: 8,
                inject_size: 4096
            }
        );
        // tcp;ofi_rxm and net: no mr_mode bits, so offsets into the registration.
        assert_eq!(usable(&offer(RMA_BITS, 0)), None);
        // efa-like: virtual addresses and provider keys.
        let both = sys::FI_MR_VIRT_ADDR | sys::FI_MR_PROV_KEY | sys::FI_MR_LOCAL;
        assert!(usable(&offer(RMA_BITS, both)).expect("efa").prov_key);
        // The legacy basic mode implies both.
        let basic = usable(&offer(RMA_BITS, sys::fi_mr_mode_FI_MR_BASIC)).expect("basic");
        assert!(basic.virt_addr && basic.prov_key);
        // Without remote reads (say), no RMA.
        let partial = RMA_BITS & !(sys::FI_REMOTE_READ as u64);
        assert_eq!(usable(&offer(partial, sys::FI_MR_VIRT_ADDR)), None);
    }
}

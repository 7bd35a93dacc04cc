//! Remote memory access over libfabric: which plugin endpoints get it (`probe`, `usable`),
//! registrations peers may read and write (`register_remote`), and `fi_write`,
//! `fi_inject_write` and `fi_read` with their completions on the endpoint's queue.
//!
//! Callers address peers' memory by virtual address, as Neuron's net plugin hands it over.
//! Where libfabric grants `FI_MR_VIRT_ADDR` (`shm`) that is the provider's own address. Where
//! it does not (libfabric 1.17's `tcp;ofi_rxm` and `net` grant no `mr_mode` bits) a remote
//! address is an offset into the registration: there the key we choose carries the
//! registration's base address (`encoded_key`), and the initiator subtracts it (`translate`).
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

/// The flags of an `fi_write` on `provider`: a completion, which comes only once the bytes are
/// in the peer's memory, as on RDMA hardware, so that a caller may tell the peer they are
/// there. `net` and `tcp;ofi_rxm` (libfabric 1.17) complete a write once it is sent unless
/// asked for `FI_DELIVERY_COMPLETE`. `shm` copies a write into the peer's memory before it
/// returns ("fast RMA"), so its completion already means delivery; asking it for delivery
/// takes it off that path onto one where, in 1.17, a write of 0 bytes never completes.
fn write_flags(provider: &str) -> u64 {
    let delivery = if provider == "shm" {
        0
    } else {
        sys::FI_DELIVERY_COMPLETE
    };
    (sys::FI_COMPLETION | delivery) as u64
}

/// `FI_MR_BASIC`: the legacy registration mode that a provider may report as its whole
/// `mr_mode`. libfabric 1.x declares it in `enum fi_mr_mode` (value 1); 2.x replaced the enum
/// with deprecated macros of the same value that the generated bindings leave out, so the
/// value is written here once, for builds against either version's headers.
const MR_BASIC: u32 = 1;

/// What an RMA operation's context says it is (`OpCtx::what`).
const WRITE: &str = "RMA write";
const READ: &str = "RMA read";

/// `FI_KEY_NOTAVAIL`: what `fi_mr_key` returns where a registration has no key (a cast macro
/// that the generated bindings leave out).
const KEY_NOTAVAIL: u64 = u64::MAX;

/// Keys requested where the provider does not choose them (`FI_MR_PROV_KEY` not granted) and
/// addresses are virtual: unique in the process, so unique in every domain it opens.
static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

/// A key no other registration of this process requested (`NEXT_KEY`).
pub(super) fn unique_key() -> u64 {
    NEXT_KEY.fetch_add(1, Ordering::Relaxed)
}

/// Where addresses are offsets, the low bits of a key we choose hold the registration's base
/// address: user addresses on x86-64 and aarch64 (4-level tables) are below 2^48.
const BASE_BITS: u32 = 48;
const BASE_MASK: u64 = (1 << BASE_BITS) - 1;

/// The high 16 bits of such a key: a per-process counter, so that two registrations starting
/// at the same address get different keys.
static KEY_SERIAL: AtomicU64 = AtomicU64::new(0);

/// How many keys a registration tries where the provider says a key is in use
/// (`-FI_ENOKEY`) before it gives up.
pub(super) const KEY_TRIES: usize = 64;

/// What a domain grants when asked for RMA: its capability bits, `mr_mode`, key size and
/// inject size (`probe` takes the endpoint's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Offer {
    pub caps: u64,
    pub mr_mode: u64,
    pub key_size: usize,
    pub inject_size: usize,
}

/// The RMA an offer makes usable: None unless it has every RMA capability and callers can
/// address peers' memory by virtual address. That holds where the provider takes virtual
/// addresses (`FI_MR_VIRT_ADDR`, or the legacy `FI_MR_BASIC` mode, which implies virtual
/// addresses and provider keys), and where it takes offsets but lets us choose 8-byte keys
/// (no `FI_MR_PROV_KEY`), which then carry each registration's base (`encoded_key`).
pub(super) fn usable(o: &Offer) -> Option<RmaCaps> {
    let basic = o.mr_mode == MR_BASIC as u64;
    let virt_addr = basic || o.mr_mode & sys::FI_MR_VIRT_ADDR as u64 != 0;
    let prov_key = basic || o.mr_mode & sys::FI_MR_PROV_KEY as u64 != 0;
    if o.caps & RMA_BITS != RMA_BITS {
        return None;
    }
    // Offsets with keys the provider picks: the initiator gets only the peer's virtual address
    // and the key (Neuron's iwrite/iread), and the provider's key has no room for the base the
    // offset is counted from, so there is no way to translate.
    if !virt_addr && (prov_key || o.key_size < 8) {
        return None;
    }
    Some(RmaCaps {
        virt_addr,
        prov_key,
        key_size: o.key_size,
        inject_size: o.inject_size,
    })
}

/// The key of serial `serial` for a registration starting at `base`, where addresses are
/// offsets: the base in the low 48 bits, the serial's low 16 bits above. None where `base`
/// does not fit in 48 bits.
pub(super) fn encoded_key(base: u64, serial: u64) -> Option<u64> {
    (base <= BASE_MASK).then_some(base | (serial << BASE_BITS))
}

/// The provider's remote address for the peer's virtual address `addr` in the registration
/// with `key`: `addr` itself where addresses are virtual, else its offset from the base the
/// key carries. An address below that base is refused, naming `addr`.
pub(super) fn translate(rma: &RmaCaps, addr: u64, key: u64) -> Result<u64> {
    if rma.virt_addr {
        return Ok(addr);
    }
    let base = key & BASE_MASK;
    addr.checked_sub(base).ok_or_else(|| {
        Error::arg(
            "addr",
            format!(
                "{addr:#x} is below {base:#x}, the start of the peer's registration with key {key:#x}"
            ),
        )
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
    // FI_HMEM stays asked for: an endpoint that takes device memory must keep it, and the
    // domain's FI_HMEM entry may ask a different mode (FI_MR_HMEM) than its host entry.
    let base = base & (sys::FI_TAGGED as u64 | sys::FI_MSG as u64 | sys::FI_HMEM);
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
            "{} / {}: RMA by offset with keys of {} bytes the provider may choose (mr_mode {:#x}) cannot be addressed by virtual address: no RMA for the plugin",
            caps.provider,
            caps.domain,
            o.key_size,
            o.mr_mode
        );
        return;
    };
    // An FI_HMEM endpoint keeps FI_MR_HMEM (see `discovery`: fi_getinfo may leave it out of
    // the mode it grants, and fi_domain then refuses the entry).
    let mr_mode = if base & sys::FI_HMEM != 0 {
        o.mr_mode | sys::FI_MR_HMEM as u64
    } else {
        o.mr_mode
    };
    // SAFETY: as above; we only set bits and the mr_mode the provider granted for them.
    unsafe {
        let i = &mut *info;
        i.caps |= RMA_BITS;
        (*i.tx_attr).caps |= (sys::FI_RMA | sys::FI_READ | sys::FI_WRITE) as u64;
        (*i.rx_attr).caps |= (sys::FI_RMA | sys::FI_REMOTE_READ | sys::FI_REMOTE_WRITE) as u64;
        (*i.domain_attr).mr_mode = mr_mode as c_int;
    }
    caps.mr_mode = mr_mode;
    caps.mr_local = mr_mode & sys::FI_MR_LOCAL as u64 != 0;
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
                "provider {} on {} offers no RMA usable by virtual address (mr_mode {:#x})",
                self.caps.provider, self.caps.domain, self.caps.mr_mode
            ))
        })
    }

    /// `Transport::register_remote`.
    pub(super) fn register_remote_region(&self, region: Region) -> Result<Mr> {
        let rma = self.rma()?;
        let access = (sys::FI_SEND
            | sys::FI_RECV
            | sys::FI_READ
            | sys::FI_WRITE
            | sys::FI_REMOTE_READ
            | sys::FI_REMOTE_WRITE) as u64;
        for _ in 0..KEY_TRIES {
            let key = self.next_key(&rma, region)?;
            let Some((keep, desc)) = self.mr_reg_try(region, access, key)? else {
                continue; // the key is in use in this domain: try the next
            };
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
            return Ok(Mr {
                desc,
                region,
                keep: Some(Box::new(keep)),
                key: Some(key),
                device: None,
            });
        }
        Err(Error::System(format!(
            "{}: {KEY_TRIES} registration keys for {:#x} were all in use",
            self.caps.domain,
            region.addr()
        )))
    }

    /// The key to request for a registration of `region`: 0 where the provider chooses,
    /// unique in the process where addresses are virtual, else its base with the next serial.
    fn next_key(&self, rma: &RmaCaps, region: Region) -> Result<u64> {
        if rma.prov_key {
            return Ok(0);
        }
        if !rma.virt_addr {
            let serial = KEY_SERIAL.fetch_add(1, Ordering::Relaxed) & 0xffff;
            let base = region.addr() as u64;
            return encoded_key(base, serial).ok_or_else(|| {
                Error::arg(
                    "region",
                    format!(
                        "starts at {base:#x}, at or above 2^{BASE_BITS}: {} addresses remote memory by offset, and its keys carry a registration's base in {BASE_BITS} bits",
                        self.caps.provider
                    ),
                )
            });
        }
        let k = unique_key();
        if rma.key_size < 8 && k >> (8 * rma.key_size) != 0 {
            return Err(Error::System(format!(
                "{}: no registration key left ({}-byte keys)",
                self.caps.domain, rma.key_size
            )));
        }
        Ok(k)
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
        let rma = self.rma()?;
        let remote = Remote {
            addr: translate(&rma, remote.addr, remote.key)?,
            ..remote
        };
        let flags = write_flags(&self.caps.provider);
        let mut g = self.inner.lock();
        g.post_rma(write, peer, buf, remote, op, flags)
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
        let at = translate(&rma, addr, key)?;
        let g = self.inner.lock();
        // SAFETY: the endpoint is open; libfabric copies src out before returning.
        let rc = unsafe {
            sys::fi_inject_write(
                g.tx_ep,
                src.as_ptr() as *const c_void,
                src.len(),
                peer.0,
                at,
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

/// The far side of an RMA operation: the peer's virtual address (the provider's address once
/// `translate`d), the key of its registration, and the descriptor of the local buffer's (0
/// where none).
#[derive(Clone, Copy, Debug)]
pub(super) struct Remote {
    pub addr: u64,
    pub key: u64,
    pub desc: usize,
}

impl Inner {
    /// Post an `fi_write` of `buf` with `flags` (or an `fi_read` into it) with a context of
    /// its own.
    fn post_rma(
        &mut self,
        write: bool,
        peer: Peer,
        buf: Region,
        r: Remote,
        op: OpId,
        flags: u64,
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
                let iov = sys::iovec {
                    iov_base: buf.addr() as *mut c_void,
                    iov_len: buf.len(),
                };
                let rma_iov = sys::fi_rma_iov {
                    addr: r.addr,
                    len: buf.len(),
                    key: r.key,
                };
                let mut desc = r.desc as *mut c_void;
                let msg = sys::fi_msg_rma {
                    msg_iov: &iov,
                    desc: &mut desc,
                    iov_count: 1,
                    addr: peer.0,
                    rma_iov: &rma_iov,
                    rma_iov_count: 1,
                    context: ctx,
                    data: 0,
                };
                sys::fi_writemsg(self.tx_ep, &msg, flags)
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
    fn rma_is_usable_with_every_capability_and_addresses_we_can_translate() {
        let offer = |caps: u64, mr_mode: u32, key_size: usize| Offer {
            caps: caps | sys::FI_TAGGED as u64,
            mr_mode: mr_mode as u64,
            key_size,
            inject_size: 4096,
        };
        // shm on libfabric 1.17: virtual addresses, keys requested by us.
        let shm = usable(&offer(RMA_BITS, sys::FI_MR_VIRT_ADDR, 8)).expect("shm");
        assert_eq!(
            shm,
            RmaCaps {
                virt_addr: true,
                prov_key: false,
                key_size: 8,
                inject_size: 4096
            }
        );
        // tcp;ofi_rxm and net: no mr_mode bits, so offsets, translated through our keys.
        assert_eq!(
            usable(&offer(RMA_BITS, 0, 8)),
            Some(RmaCaps {
                virt_addr: false,
                prov_key: false,
                key_size: 8,
                inject_size: 4096
            })
        );
        // Offsets with keys too short for a base, or keys the provider picks: no RMA.
        assert_eq!(usable(&offer(RMA_BITS, 0, 4)), None);
        assert_eq!(usable(&offer(RMA_BITS, sys::FI_MR_PROV_KEY, 8)), None);
        // efa-like: virtual addresses and provider keys.
        let both = sys::FI_MR_VIRT_ADDR | sys::FI_MR_PROV_KEY | sys::FI_MR_LOCAL;
        assert!(usable(&offer(RMA_BITS, both, 8)).expect("efa").prov_key);
        // The legacy basic mode implies both.
        let basic = usable(&offer(RMA_BITS, MR_BASIC, 8)).expect("basic");
        assert!(basic.virt_addr && basic.prov_key);
        // Without remote reads (say), no RMA.
        let partial = RMA_BITS & !(sys::FI_REMOTE_READ as u64);
        assert_eq!(usable(&offer(partial, sys::FI_MR_VIRT_ADDR, 8)), None);
    }

    #[test]
    fn keys_carry_the_base_and_addresses_translate_to_offsets() {
        let base = 0x7fff_1234_5003u64;
        let k1 = encoded_key(base, 1).expect("fits");
        let k2 = encoded_key(base, 0xffff).expect("fits");
        assert_ne!(k1, k2);
        assert_eq!(k1 & BASE_MASK, base);
        assert_eq!(encoded_key(1 << 48, 0), None);
        assert_eq!(encoded_key(u64::MAX, 0), None);
        let tcp = RmaCaps {
            virt_addr: false,
            prov_key: false,
            key_size: 8,
            inject_size: 64,
        };
        assert_eq!(translate(&tcp, base + 77, k2).expect("inside"), 77);
        assert_eq!(translate(&tcp, base, k1).expect("start"), 0);
        let e = translate(&tcp, base - 1, k1).expect_err("below");
        assert!(e.to_string().contains("'addr'"), "{e}");
        let shm = RmaCaps {
            virt_addr: true,
            ..tcp
        };
        assert_eq!(translate(&shm, 5, k1).expect("virtual"), 5);
    }
}

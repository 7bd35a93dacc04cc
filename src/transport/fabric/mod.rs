//! libfabric backend: one RDM endpoint per device (libfabric domain), tagged messages,
//! memory registration that honours the provider's `mr_mode`, and a completion queue we can
//! sleep on. Every fid is closed by RAII.
mod claim;
mod cma;
mod fastbox;
mod shm;
pub mod sys;
mod tuning;

use super::{Caps, Completion, Mr, OpId, Peer, Posted, Region, Transport};
use crate::config::Config;
use crate::error::{Error, Result};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::collections::{HashMap, VecDeque};
use std::ffi::{CStr, CString};
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::Arc;
use std::time::Duration;

const FI_ADDR_UNSPEC: u64 = u64::MAX;
/// The API version we ask for: the oldest we support (Debian bookworm's 1.17).
const API_VERSION: u32 = (1 << 16) | 17;

fn strerror(rc: i64) -> String {
    let code = rc.unsigned_abs() as c_int;
    // SAFETY: fi_strerror returns a pointer to a static NUL-terminated string for any value.
    unsafe { CStr::from_ptr(sys::fi_strerror(code)) }
        .to_string_lossy()
        .into_owned()
}

fn check(what: &str, rc: i64) -> Result<()> {
    if rc < 0 {
        Err(Error::System(format!(
            "{what} failed: {} ({rc})",
            strerror(rc)
        )))
    } else {
        Ok(())
    }
}

fn cstr(p: *const std::os::raw::c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: libfabric strings in fi_info are NUL-terminated and live as long as the info.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// One `fi_info` we own (a duplicate of an entry of `fi_getinfo`'s list).
struct Info(*mut sys::fi_info);

// SAFETY: the fi_info is never mutated after duplication; libfabric reads it only during
// fi_fabric/fi_domain/fi_endpoint, which we call with the transport's lock held or before sharing.
unsafe impl Send for Info {}
// SAFETY: see Send: read-only after creation.
unsafe impl Sync for Info {}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: we own this duplicate; fi_freeinfo frees it and its attributes once.
        unsafe { sys::fi_freeinfo(self.0) }
    }
}

/// A device: one domain of the chosen provider, with what was probed of it.
pub struct FabricDevice {
    info: Info,
    pub caps: Caps,
    pub pci_path: Option<String>,
    pub speed_mbps: Option<u64>,
    pub mem_tag_format: u64,
    /// Small shm messages may go through our shared-memory rings (`FABRICOLL_SHM_FASTBOX`).
    pub fastbox: bool,
    /// Over the native TCP endpoint, sends leave from an endpoint of their own (`sends_from`):
    /// for the collective engines, not the NCCL plugins. A plugin answers a connect with a
    /// message and then may not call in again for a while (an accept returns, NCCL goes on),
    /// and a send over a connection still to be made needs the sender's progress: on a separate
    /// send endpoint the plugin harness's connect waited for the answer until its timeout.
    pub own_send_endpoint: bool,
}

impl std::fmt::Debug for FabricDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FabricDevice")
            .field("caps", &self.caps)
            .field("pci_path", &self.pci_path)
            .field("speed_mbps", &self.speed_mbps)
            .finish()
    }
}

/// What discovery found: every provider offering tagged RDM endpoints, and the devices of the one chosen.
#[derive(Debug, Default)]
pub struct Discovery {
    pub providers: Vec<String>,
    pub chosen: Option<String>,
    pub devices: Vec<FabricDevice>,
    /// Domains of the chosen provider that were left out (loopback by default), for diagnostics.
    pub skipped: Vec<String>,
}

/// The libfabric version the process runs against, as "major.minor".
pub fn runtime_version() -> String {
    // SAFETY: fi_version has no arguments and no preconditions.
    let v = unsafe { sys::fi_version() };
    format!("{}.{}", v >> 16, v & 0xffff)
}

/// Whether `fi_tinject` is safe on this provider. shm before libfabric 1.19 keeps an unexpected
/// inject message in the sender's bounce buffer, which the sender reuses once inject returns:
/// a later message overwrote an earlier one in our tests (ofiwg/libfabric#9143, fixed in 1.19
/// by #9187). There, small sends go through fi_tsend, whose completion waits for the copy.
fn inject_safe(provider: &str) -> bool {
    // SAFETY: fi_version has no arguments and no preconditions.
    let v = unsafe { sys::fi_version() };
    !(provider.split(';').next() == Some("shm") && v < ((1 << 16) | 19))
}

/// What the endpoints of a discovery serve, which decides the provider taken when none is
/// named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// Communicators of the collective engines (the C API, `fabricoll-perf`), each on an
    /// endpoint of its own.
    Engines,
    /// The NCCL net and CollNet plugins, whose NCCL comms share one endpoint per device.
    Plugin,
}

/// Provider preference when none is named, lowest first.
///
/// For the engines: efa; libfabric's native TCP RDM endpoint (`net` in 1.17, `tcp` from
/// 1.18; its stopped connections are claimed, see `claim`); TCP through the ofi_rxm layer;
/// shm. The native endpoint goes before rxm for speed: raw `fi_pingpong -e rdm -d lo`, one
/// way, best of 3, net against tcp;ofi_rxm: 8 B 5.3 against 7.6 us, 64 KiB 17.7 against
/// 56.5, 4 MiB 924 against 2381.
///
/// For the plugin: efa, then a `tcp` provider (on 1.17 tcp;ofi_rxm; from 1.18 the native one,
/// whose name sorts first), then shm, as before the engines changed. Its NCCL comms between
/// two processes share one endpoint and so, on the native endpoint, one TCP connection, where
/// a message waiting for its receive holds up every comm's messages behind it until its
/// receive is posted or it is claimed; how that weighs against the faster data path has not
/// been measured under NCCL's channels yet.
fn provider_rank(name: &str, for_use: Use) -> Option<usize> {
    let core = name.split(';').next().unwrap_or(name);
    let layered = name.contains(';');
    match (for_use, core) {
        (_, "efa") => Some(0),
        (Use::Engines, "net" | "tcp") if !layered => Some(1),
        (Use::Engines, "net" | "tcp") => Some(2),
        (Use::Plugin, "tcp") => Some(1),
        (_, "shm") => Some(3),
        _ => None,
    }
}

fn sys_pci_path(nic: *mut sys::fid_nic, domain: &str) -> Option<String> {
    if !nic.is_null() {
        // SAFETY: nic points into the fi_info we own; bus_attr may be NULL and is checked.
        let bus = unsafe { (*nic).bus_attr };
        // SAFETY: checked for NULL; the union is read as PCI only when bus_type says PCI.
        if !bus.is_null() && unsafe { (*bus).bus_type } == sys::fi_bus_type_FI_BUS_PCI {
            // SAFETY: bus_type is PCI, so the pci member is the active one.
            let p = unsafe { (*bus).attr.pci };
            let path = format!(
                "/sys/bus/pci/devices/{:04x}:{:02x}:{:02x}.{:x}",
                p.domain_id, p.bus_id, p.device_id, p.function_id
            );
            if let Ok(real) = std::fs::canonicalize(&path) {
                return Some(real.to_string_lossy().into_owned());
            }
        }
    }
    let dev = format!("/sys/class/net/{domain}/device");
    std::fs::canonicalize(dev)
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
}

fn sys_speed_mbps(nic: *mut sys::fid_nic, domain: &str) -> Option<u64> {
    if !nic.is_null() {
        // SAFETY: nic points into the fi_info we own; link_attr may be NULL and is checked.
        let link = unsafe { (*nic).link_attr };
        if !link.is_null() {
            // SAFETY: checked for NULL above.
            let bps = unsafe { (*link).speed } as u64;
            if bps >= 1_000_000 {
                return Some(bps / 1_000_000);
            }
        }
    }
    std::fs::read_to_string(format!("/sys/class/net/{domain}/speed"))
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .filter(|v| *v > 0)
        .map(|v| v as u64)
}

struct InfoList(*mut sys::fi_info);

impl Drop for InfoList {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the head of a list fi_getinfo returned; freed once here.
            unsafe { sys::fi_freeinfo(self.0) }
        }
    }
}

fn getinfo(provider: Option<&str>) -> Result<InfoList> {
    getinfo_caps(provider, 0)
}

/// Domains of `provider` that also offer `extra` capabilities (FI_RMA, FI_HMEM), probed with a
/// separate query because fi_getinfo reports only the capabilities the hints asked for.
fn domains_with(provider: &str, extra: u64) -> Vec<String> {
    let Ok(list) = getinfo_caps(Some(provider), extra) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut cur = list.0;
    while !cur.is_null() {
        // SAFETY: cur is an element of the list we own; its attributes are allocated.
        unsafe {
            if cstr((*(*cur).fabric_attr).prov_name) == provider && (*cur).caps & extra == extra {
                out.push(cstr((*(*cur).domain_attr).name));
            }
            cur = (*cur).next;
        }
    }
    out
}

fn getinfo_caps(provider: Option<&str>, extra: u64) -> Result<InfoList> {
    // SAFETY: fi_allocinfo returns a zeroed fi_info with allocated attribute structs, or NULL.
    let hints = unsafe { sys::fi_allocinfo() };
    if hints.is_null() {
        return Err(Error::System("fi_allocinfo returned NULL".into()));
    }
    let hints = InfoList(hints);
    // SAFETY: hints and its attribute pointers were allocated by fi_allocinfo and are ours to
    // fill; prov_name must be malloc'ed because fi_freeinfo frees it.
    unsafe {
        let h = &mut *hints.0;
        h.caps = sys::FI_TAGGED as u64 | extra;
        h.mode = sys::FI_CONTEXT | sys::FI_CONTEXT2;
        (*h.ep_attr).type_ = sys::fi_ep_type_FI_EP_RDM;
        (*h.domain_attr).mr_mode = (sys::FI_MR_LOCAL
            | sys::FI_MR_VIRT_ADDR
            | sys::FI_MR_ALLOCATED
            | sys::FI_MR_PROV_KEY
            | sys::FI_MR_ENDPOINT) as c_int;
        (*h.domain_attr).threading = sys::fi_threading_FI_THREAD_DOMAIN;
        if let Some(p) = provider {
            let c =
                CString::new(p).map_err(|_| Error::arg("FABRICOLL_PROVIDER", "contains NUL"))?;
            (*h.fabric_attr).prov_name = libc::strdup(c.as_ptr());
        }
    }
    let mut list: *mut sys::fi_info = ptr::null_mut();
    // SAFETY: hints is a valid fi_info; list receives a new list we free with InfoList.
    let rc =
        unsafe { sys::fi_getinfo(API_VERSION, ptr::null(), ptr::null(), 0, hints.0, &mut list) };
    let list = InfoList(list);
    if rc == -(sys::FI_ENODATA as c_int) {
        return Ok(InfoList(ptr::null_mut()));
    }
    check("fi_getinfo", rc as i64)?;
    Ok(list)
}

/// Find the provider and its devices, as the configuration asks.
pub fn discover(cfg: &Config, for_use: Use) -> Result<Discovery> {
    let mut list = getinfo(cfg.provider.as_deref())?;
    // shm before 1.19 also needs untagged messages (software matching of small messages); ask
    // for them only there: rxm keeps receive buffers per connection for them.
    let mut cur = list.0;
    while !cur.is_null() {
        // SAFETY: cur is an element of the list we own; fabric_attr is always allocated.
        let p = cstr(unsafe { (*(*cur).fabric_attr).prov_name });
        if !inject_safe(&p)
            && cfg
                .provider
                .as_deref()
                .is_some_and(|w| p == w || p.split(';').next() == Some(w))
        {
            list = getinfo_caps(Some(&p), sys::FI_MSG as u64)?;
            break;
        }
        // SAFETY: as above.
        cur = unsafe { (*cur).next };
    }
    let mut entries: Vec<*mut sys::fi_info> = Vec::new();
    let mut cur = list.0;
    while !cur.is_null() {
        entries.push(cur);
        // SAFETY: cur is an element of the list we own.
        cur = unsafe { (*cur).next };
    }
    let prov_of = |i: *mut sys::fi_info| {
        // SAFETY: i is an element of the list we own; fabric_attr is always allocated.
        cstr(unsafe { (*(*i).fabric_attr).prov_name })
    };
    let mut disc = Discovery::default();
    for &e in &entries {
        let p = prov_of(e);
        if !disc.providers.contains(&p) {
            disc.providers.push(p);
        }
    }
    let chosen = match &cfg.provider {
        // The provider of that name, else one layered over it (tcp in 1.17: tcp;ofi_rxm).
        Some(want) => disc
            .providers
            .iter()
            .find(|p| *p == want)
            .or_else(|| {
                disc.providers
                    .iter()
                    .find(|p| p.split(';').next() == Some(want.as_str()))
            })
            .cloned(),
        None => disc
            .providers
            .iter()
            .filter_map(|p| provider_rank(p, for_use).map(|r| (r, p)))
            .min()
            .map(|(_, p)| p.clone()),
    };
    let Some(chosen) = chosen else {
        return Ok(disc);
    };
    if cfg.provider.is_none() && !inject_safe(&chosen) {
        // Chosen by preference: query again naming it, so that untagged messages are included.
        let named = Config {
            provider: Some(chosen.clone()),
            ..cfg.clone()
        };
        let mut d = discover(&named, for_use)?;
        d.providers = disc.providers;
        return Ok(d);
    }
    // One device per domain: the first entry, but an IPv4 one over IPv6 for IP providers.
    let mut by_domain: Vec<(String, *mut sys::fi_info)> = Vec::new();
    for &e in &entries {
        if prov_of(e) != chosen {
            continue;
        }
        // SAFETY: e is an element of the list we own; domain_attr is always allocated.
        let dom = cstr(unsafe { (*(*e).domain_attr).name });
        // SAFETY: as above.
        let v4 = unsafe { (*e).addr_format } == sys::FI_SOCKADDR_IN;
        match by_domain.iter_mut().find(|(d, _)| *d == dom) {
            Some(slot) => {
                // SAFETY: slot.1 is an element of the list we own.
                let old_v4 = unsafe { (*slot.1).addr_format } == sys::FI_SOCKADDR_IN;
                if v4 && !old_v4 {
                    slot.1 = e;
                }
            }
            None => by_domain.push((dom, e)),
        }
    }
    let order: Vec<(String, *mut sys::fi_info)> = match &cfg.domains {
        Some(want) => {
            let mut v = Vec::new();
            for w in want {
                match by_domain.iter().find(|(d, _)| d == w) {
                    Some(x) => v.push(x.clone()),
                    None => {
                        let have: Vec<&str> = by_domain.iter().map(|(d, _)| d.as_str()).collect();
                        return Err(Error::InvalidArgument(format!(
                            "environment variable FABRICOLL_DOMAIN names {w:?}, which provider {chosen} does not have; accepted values: {}",
                            have.join(", ")
                        )));
                    }
                }
            }
            v
        }
        None => {
            let (lo, rest): (Vec<_>, Vec<_>) = by_domain.into_iter().partition(|(d, _)| d == "lo");
            disc.skipped = lo.iter().map(|(d, _)| d.clone()).collect();
            if rest.is_empty() {
                lo
            } else {
                rest
            }
        }
    };
    let rma = domains_with(&chosen, sys::FI_RMA as u64);
    let hmem = domains_with(&chosen, sys::FI_HMEM);
    for (dom, e) in order {
        // SAFETY: e is an element of the list we own; fi_dupinfo copies it (and not its next).
        let dup = unsafe { sys::fi_dupinfo(e) };
        if dup.is_null() {
            return Err(Error::System("fi_dupinfo returned NULL".into()));
        }
        let info = Info(dup);
        // SAFETY: dup is a complete fi_info we own; its attribute pointers are valid.
        let (caps, nic, tag_format) = unsafe {
            let i = &*dup;
            let tx = &*i.tx_attr;
            let rx = &*i.rx_attr;
            let ep = &*i.ep_attr;
            let mr_mode = (*i.domain_attr).mr_mode as u64;
            (
                Caps {
                    provider: chosen.clone(),
                    fabric: cstr((*i.fabric_attr).name),
                    domain: dom.clone(),
                    inject_size: tx.inject_size,
                    max_msg_size: ep.max_msg_size,
                    mr_mode,
                    mr_local: mr_mode & sys::FI_MR_LOCAL as u64 != 0,
                    hmem: hmem.contains(&dom),
                    rma: rma.contains(&dom),
                    wait_fd: false,
                    inject_ok: inject_safe(&chosen),
                    tx_size: tx.size,
                    rx_size: rx.size,
                    ..Default::default()
                },
                i.nic,
                ep.mem_tag_format,
            )
        };
        let mut caps = caps;
        tuning::apply(&mut caps);
        super::require_tag_bits(&chosen, &dom, tag_format)?;
        disc.devices.push(FabricDevice {
            pci_path: sys_pci_path(nic, &dom),
            speed_mbps: sys_speed_mbps(nic, &dom),
            mem_tag_format: tag_format,
            fastbox: cfg.shm_fastbox,
            own_send_endpoint: for_use == Use::Engines,
            caps,
            info,
        });
    }
    disc.chosen = Some(chosen);
    Ok(disc)
}

/// The fabric and domain, shared by the endpoint and every registration so that a domain is
/// closed only after the last registration made in it.
struct DomainFids {
    domain: *mut sys::fid_domain,
    fabric: *mut sys::fid_fabric,
}

// SAFETY: the domain and fabric are only closed (in Drop, once) and passed to libfabric calls
// that we serialise with the transport's lock.
unsafe impl Send for DomainFids {}
// SAFETY: see Send.
unsafe impl Sync for DomainFids {}

impl Drop for DomainFids {
    fn drop(&mut self) {
        // SAFETY: both fids were opened by us and are closed once, domain before fabric.
        unsafe {
            if !self.domain.is_null() {
                sys::fi_close(self.domain as *mut sys::fid);
            }
            if !self.fabric.is_null() {
                sys::fi_close(self.fabric as *mut sys::fid);
            }
        }
    }
}

struct MrFid {
    mr: *mut sys::fid_mr,
    _domain: Arc<DomainFids>,
}

// SAFETY: a registration handle is immutable after creation; closing it is done once, in Drop.
unsafe impl Send for MrFid {}
// SAFETY: see Send.
unsafe impl Sync for MrFid {}

impl Drop for MrFid {
    fn drop(&mut self) {
        // SAFETY: we opened this MR; the domain it belongs to is kept alive by `_domain`.
        unsafe { sys::fi_close(self.mr as *mut sys::fid) };
    }
}

/// The buffer side of one operation.
struct OpBuf {
    addr: usize,
    len: usize,
    desc: usize,
    op: OpId,
    owned: Option<Vec<u8>>,
}

/// Per-operation context; libfabric owns `ctx` while the operation is in flight.
#[repr(C)]
struct OpCtx {
    ctx: sys::fi_context2,
    op: OpId,
    len: usize,
    recv: bool,
    owned: Option<Vec<u8>>,
    role: Role,
}

/// What a completion means to us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// The caller's operation.
    User,
    /// A receive of the small-message pool (software matching).
    Pool,
    /// The provider half of a receive that also waits in the software matcher.
    Dual,
    /// A provider receive we cancelled ourselves: its completion is dropped.
    Swallow,
    /// A small message sent through the peer's pool: its framed buffer is reused.
    SmallSend,
    /// A peek for a message that stopped its connection (`claim`).
    Peek,
    /// The receive of a message a peek found (`claim`).
    Claim,
}

/// Messages up to this size bypass the provider's tag matching on shm before libfabric 1.19:
/// they travel untagged into library-owned receives and are matched here, so that the
/// provider never holds an unexpected small message (see `inject_safe`).
const POOL_BUFS: usize = 256;

/// Where a software-matched receive puts its data.
#[derive(Clone, Copy, Debug)]
enum SoftDst {
    Region(Region),
    Owned,
}

#[derive(Debug)]
struct SoftRecv {
    tag: u64,
    ignore: u64,
    len: usize,
    dst: SoftDst,
    /// The buffer's registration descriptor (0: none).
    desc: usize,
    op: OpId,
    /// Context of the provider receive posted for messages too large for the pool.
    provider: Option<usize>,
}

impl SoftRecv {
    /// A receive of `tag` / `ignore` into `b` (an owned buffer gets a new one on delivery).
    fn of(tag: u64, ignore: u64, b: &OpBuf) -> SoftRecv {
        let dst = if b.owned.is_some() {
            SoftDst::Owned
        } else {
            // SAFETY: Region's contract, forwarded from the caller's recv().
            SoftDst::Region(unsafe { Region::from_raw(b.addr as *mut u8, b.len) })
        };
        SoftRecv {
            tag,
            ignore,
            len: b.len,
            dst,
            desc: b.desc,
            op: b.op,
            provider: None,
        }
    }
}

/// A message that arrived before its receive.
#[derive(Debug)]
enum Unexp {
    /// Its bytes.
    Data(Vec<u8>),
    /// A large message still in its sender's memory (`cma`), announced by the fastbox sender
    /// whose `sender_id` is `from`.
    Rndv { rts: cma::Rts, from: u64 },
}

/// A large send announced by an `RTS` frame, waiting for the receiver's `ACK` (see `cma`).
struct RndvSend {
    peer: u64,
    tag: u64,
    addr: usize,
    len: usize,
    desc: usize,
    op: OpId,
    owned: Option<Vec<u8>>,
}

#[derive(Default)]
struct Soft {
    small: usize,
    posted: VecDeque<SoftRecv>,
    unexpected: VecDeque<(u64, Unexp)>,
    /// Framed send buffers (`small + 8` bytes of capacity) whose sends completed.
    free: Vec<Vec<u8>>,
}

impl Soft {
    /// The first posted receive that matches `tag`, taken out with its position in the list.
    fn take_posted(&mut self, tag: u64) -> Option<(usize, SoftRecv)> {
        let i = self
            .posted
            .iter()
            .position(|r| (r.tag | r.ignore) == (tag | r.ignore))?;
        Some((i, self.posted.remove(i).expect("index from position")))
    }
}

/// Framed small-message buffers kept for reuse.
const FREE_BUFS: usize = 64;

/// The error of an operation on a shm peer whose process `pid` has exited (`how`: what it
/// left undone, if anything).
fn peer_exited(pid: i32, how: &str) -> Error {
    Error::Remote(format!("the peer process {pid} has exited{how}"))
}

struct Inner {
    ep: *mut sys::fid_ep,
    /// The endpoint sends go out on: `ep`, or over the native TCP endpoint a second one
    /// (`sends_from`), so that each direction between two ranks has a connection of its own.
    tx_ep: *mut sys::fid_ep,
    cq: *mut sys::fid_cq,
    av: *mut sys::fid_av,
    dom: Arc<DomainFids>,
    /// Operations in flight, keyed by the address of their context.
    ops: FxHashMap<usize, Box<OpCtx>>,
    /// Completion entries read per `fi_cq_read` (kept: zeroing them per poll shows in profiles).
    entries: Vec<sys::fi_cq_tagged_entry>,
    peers: HashMap<Vec<u8>, u64>,
    /// Owned sends the provider refused with EAGAIN, retried on poll.
    backlog: VecDeque<(Peer, u64, Vec<u8>, OpId)>,
    /// Completions known without the CQ (injected sends).
    ready: Vec<Completion>,
    /// Software matching of small messages (shm before libfabric 1.19), else None.
    soft: Option<Soft>,
    /// The shared-memory region's name (shm), unlinked at exit if still open.
    shm_name: Option<String>,
    /// shm peers' processes, checked before every post to them.
    watch: FxHashMap<u64, shm::PeerWatch>,
    /// Our shared-memory inbox for small messages (shm with software matching), else None.
    inbox: Option<fastbox::Inbox>,
    /// Slots claimed in peers' inboxes, by peer.
    outbox: FxHashMap<u64, fastbox::Outbox>,
    /// The shm peers' `fastbox::sender_id`s, to ask our inbox whether they hold a slot in it.
    peer_senders: FxHashMap<u64, u64>,
    /// The other way round: the peer whose endpoint has a given `sender_id`.
    sender_peers: FxHashMap<u64, u64>,
    /// Large sends announced by an `RTS` frame and not yet acknowledged, by cookie.
    rndv: FxHashMap<u64, RndvSend>,
    next_cookie: u64,
    /// This process's pid, for `RTS` frames (`getpid` is a system call, 0.15 us here, on the
    /// path of every large send). An endpoint is not used across `fork`.
    pid: i32,
    /// `ACK` frames that found the sender's ring full: (its `sender_id`, payload).
    acks: VecDeque<(u64, [u8; cma::ACK_BYTES])>,
    /// Peers that could not copy from our memory: large messages to them take the provider.
    no_cma: FxHashMap<u64, ()>,
    /// Sends that a `FALLBACK` answer turned to the provider while it was busy, posted again
    /// on poll.
    resend: VecDeque<RndvSend>,
    /// Tests: act as if the kernel refused every copy from a peer (`cma::refused`).
    #[cfg(test)]
    refuse_cma: bool,
    /// `take_now` calls that found nothing since the completion queue was last read there.
    direct_misses: u32,
    /// Peers whose hello (see `hello`) the provider refused with EAGAIN, sent again on poll.
    hellos: Vec<u64>,
    /// Messages that stopped a connection of the native TCP endpoint, claimed (`claim`);
    /// None for other providers.
    claims: Option<claim::Claims>,
}

// SAFETY: every libfabric object here is used only with the transport's Mutex held
// (FI_THREAD_DOMAIN), except the wait fd, which is only polled.
unsafe impl Send for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: the fids were opened by us and are closed once, endpoint first, then the
        // objects bound to it; the domain closes when the last Arc<DomainFids> goes.
        unsafe {
            if self.tx_ep != self.ep {
                sys::fi_close(self.tx_ep as *mut sys::fid);
            }
            sys::fi_close(self.ep as *mut sys::fid);
            sys::fi_close(self.cq as *mut sys::fid);
            sys::fi_close(self.av as *mut sys::fid);
        }
        if let Some(n) = self.shm_name.take() {
            shm::closed(&n);
        }
    }
}

/// One endpoint on one device.
pub struct FabricTransport {
    caps: Caps,
    addr: Vec<u8>,
    wait_fd: Option<c_int>,
    inner: Mutex<Inner>,
}

impl FabricTransport {
    pub fn open(dev: &FabricDevice) -> Result<FabricTransport> {
        let info = dev.info.0;
        let mut dom = DomainFids {
            domain: ptr::null_mut(),
            fabric: ptr::null_mut(),
        };
        // SAFETY: info is a complete fi_info we own; out-pointers are valid locals.
        unsafe {
            check(
                "fi_fabric",
                sys::fi_fabric((*info).fabric_attr, &mut dom.fabric, ptr::null_mut()) as i64,
            )?;
            check(
                "fi_domain",
                sys::fi_domain(dom.fabric, info, &mut dom.domain, ptr::null_mut()) as i64,
            )?;
        }
        let dom = Arc::new(dom);
        let mut caps = dev.caps.clone();
        let mut av: *mut sys::fid_av = ptr::null_mut();
        let mut av_attr = sys::fi_av_attr {
            type_: sys::fi_av_type_FI_AV_TABLE,
            ..Default::default()
        };
        // SAFETY: the domain is open; av_attr and av are valid locals.
        check("fi_av_open", unsafe {
            sys::fi_av_open(dom.domain, &mut av_attr, &mut av, ptr::null_mut())
        } as i64)?;
        let guard_av = scopeguard(av as *mut sys::fid);
        let cq_size = (caps.tx_size + caps.rx_size).clamp(1024, 65536);
        let mut cq: *mut sys::fid_cq = ptr::null_mut();
        let mut wait_fd = None;
        for wait_obj in [sys::fi_wait_obj_FI_WAIT_FD, sys::fi_wait_obj_FI_WAIT_NONE] {
            let mut attr = sys::fi_cq_attr {
                size: cq_size,
                format: sys::fi_cq_format_FI_CQ_FORMAT_TAGGED,
                wait_obj,
                ..Default::default()
            };
            // SAFETY: the domain is open; attr and cq are valid locals.
            let rc = unsafe { sys::fi_cq_open(dom.domain, &mut attr, &mut cq, ptr::null_mut()) };
            if rc == 0 {
                if wait_obj == sys::fi_wait_obj_FI_WAIT_FD {
                    let mut fd: c_int = -1;
                    // SAFETY: cq is open; FI_GETWAIT writes an int fd for FI_WAIT_FD queues.
                    let rc = unsafe {
                        sys::fi_control(
                            cq as *mut sys::fid,
                            sys::FI_GETWAIT as c_int,
                            &mut fd as *mut c_int as *mut c_void,
                        )
                    };
                    if rc == 0 && fd >= 0 {
                        wait_fd = Some(fd);
                    }
                }
                break;
            }
            log::debug!(
                "fi_cq_open with wait object {wait_obj} failed: {}",
                strerror(rc as i64)
            );
            cq = ptr::null_mut();
        }
        if cq.is_null() {
            return Err(Error::System(format!(
                "fi_cq_open failed on {}",
                caps.domain
            )));
        }
        let guard_cq = scopeguard(cq as *mut sys::fid);
        caps.wait_fd = wait_fd.is_some();
        let shm = caps.provider.split(';').next() == Some("shm");
        let (ep, shm_name) = endpoint(dom.domain, info, av, cq, shm, "")?;
        let guard_ep = scopeguard(ep as *mut sys::fid);
        let mut name = vec![0u8; 256];
        let mut len = name.len();
        // SAFETY: ep is enabled; name has `len` writable bytes.
        check("fi_getname", unsafe {
            sys::fi_getname(
                ep as *mut sys::fid,
                name.as_mut_ptr() as *mut c_void,
                &mut len,
            )
        } as i64)?;
        name.truncate(len);
        std::mem::forget((guard_av, guard_cq, guard_ep));
        log::info!(
            "opened endpoint on {} / {} (inject {} B, mr_mode {:#x}, wait fd {})",
            caps.provider,
            caps.domain,
            caps.inject_size,
            caps.mr_mode,
            wait_fd.is_some()
        );
        let fastbox = dev.fastbox;
        let claims = claim::needed(&caps.provider).then(claim::Claims::default);
        // The provider that needs claims is the native TCP endpoint, the one that splits.
        let split = dev.own_send_endpoint && claims.is_some();
        let tx_ep = sends_from(split, caps.mr_mode, ep, &caps.domain, || {
            endpoint(dom.domain, info, av, cq, false, " (sends)").map(|(tx, _)| tx)
        });
        Ok(FabricTransport {
            caps,
            addr: name,
            wait_fd,
            inner: Mutex::new(Inner {
                ep,
                tx_ep,
                cq,
                av,
                dom,
                ops: FxHashMap::default(),
                entries: vec![sys::fi_cq_tagged_entry::default(); 32],
                peers: HashMap::new(),
                backlog: VecDeque::new(),
                ready: Vec::new(),
                soft: None,
                shm_name,
                watch: FxHashMap::default(),
                inbox: None,
                outbox: FxHashMap::default(),
                peer_senders: FxHashMap::default(),
                sender_peers: FxHashMap::default(),
                rndv: FxHashMap::default(),
                next_cookie: 1,
                pid: std::process::id() as i32,
                acks: VecDeque::new(),
                no_cma: FxHashMap::default(),
                resend: VecDeque::new(),
                #[cfg(test)]
                refuse_cma: false,
                direct_misses: 0,
                hellos: Vec::new(),
                claims,
            }),
        })
        .and_then(|t: FabricTransport| {
            if !t.caps.inject_ok {
                let mut g = t.inner.lock();
                g.soft = Some(Soft {
                    small: t.caps.inject_size.max(256),
                    ..Default::default()
                });
                for _ in 0..POOL_BUFS {
                    g.post_pool(None)?;
                }
                if let (true, Some(name)) = (fastbox, g.shm_name.clone()) {
                    match fastbox::Inbox::create(&name) {
                        Ok(ib) => g.inbox = Some(ib),
                        Err(e) => log::warn!("no shared-memory fastbox for {name}: {e}"),
                    }
                }
                drop(g);
                log::info!(
                    "{}: small messages are matched in software (libfabric {} shm, issue #9143)",
                    t.caps.domain,
                    runtime_version()
                );
            }
            Ok(t)
        })
    }
}

/// An enabled endpoint of `info`, bound to `av` and `cq`, and its shared-memory name when `shm`
/// (see `shm::name_endpoint`); `what` tells its errors apart.
fn endpoint(
    domain: *mut sys::fid_domain,
    info: *mut sys::fi_info,
    av: *mut sys::fid_av,
    cq: *mut sys::fid_cq,
    shm: bool,
    what: &str,
) -> Result<(*mut sys::fid_ep, Option<String>)> {
    let mut ep: *mut sys::fid_ep = ptr::null_mut();
    // SAFETY: domain and info are valid; ep is a valid local.
    check(&format!("fi_endpoint{what}"), unsafe {
        sys::fi_endpoint(domain, info, &mut ep, ptr::null_mut())
    } as i64)?;
    let guard = scopeguard(ep as *mut sys::fid);
    let shm_name = if shm {
        Some(shm::name_endpoint(ep)?)
    } else {
        None
    };
    // SAFETY: ep, av and cq are open objects of the same domain.
    unsafe {
        check(
            &format!("fi_ep_bind(av){what}"),
            sys::fi_ep_bind(ep, av as *mut sys::fid, 0) as i64,
        )?;
        check(
            &format!("fi_ep_bind(cq){what}"),
            sys::fi_ep_bind(
                ep,
                cq as *mut sys::fid,
                (sys::FI_TRANSMIT | sys::FI_RECV) as u64,
            ) as i64,
        )?;
        check(&format!("fi_enable{what}"), sys::fi_enable(ep) as i64)?;
    }
    std::mem::forget(guard);
    Ok((ep, shm_name))
}

/// The endpoint sends leave from: one that `open` makes where `split` asks for it (the engines
/// over the native TCP endpoint, `own_send_endpoint`), else, or where `open` fails, or where a
/// registration binds to one endpoint (`FI_MR_ENDPOINT` in `mr_mode`), the receiving `ep`.
/// `open` gives a second endpoint bound to the same address vector and completion queue. Over
/// the native TCP endpoint each endpoint pair keeps one connection, so ranks that exchange
/// messages both ways would share one socket; with sends from the second endpoint to the peers'
/// receiving endpoints, each direction has its own. On loopback a 1 MiB exchange between two
/// processes took 177-228 us over two sockets against 296-342 over one (plain sockets, 5 runs
/// with both CPUs on one L3, 2026-11-26).
fn sends_from(
    split: bool,
    mr_mode: u64,
    ep: *mut sys::fid_ep,
    domain: &str,
    open: impl FnOnce() -> Result<*mut sys::fid_ep>,
) -> *mut sys::fid_ep {
    if !split || mr_mode & sys::FI_MR_ENDPOINT as u64 != 0 {
        return ep;
    }
    open().unwrap_or_else(|e| {
        log::debug!("{domain}: sends share the receiving endpoint: {e}");
        ep
    })
}

/// Complete a software-matched receive with a message.
fn deliver(r: &SoftRecv, tag: u64, data: &[u8]) -> Completion {
    if data.len() > r.len {
        return Completion::failed(r.op, tag, too_large(data.len() as u64, r.len));
    }
    let len = data.len();
    let data = match r.dst {
        SoftDst::Region(region) => {
            region.write(data);
            None
        }
        SoftDst::Owned => Some(data.to_vec()),
    };
    Completion::done(r.op, len, tag, data)
}

/// The error of a receive of `cap` bytes that a message of `got` bytes arrived for.
fn too_large(got: u64, cap: usize) -> Error {
    Error::InvalidArgument(format!(
        "argument 'size': a message of {got} bytes arrived for a receive buffer of {cap} bytes"
    ))
}

/// Closes a fid on an error path during construction.
struct FidGuard(*mut sys::fid);

fn scopeguard(f: *mut sys::fid) -> FidGuard {
    FidGuard(f)
}

impl Drop for FidGuard {
    fn drop(&mut self) {
        // SAFETY: only reached on an error path, for a fid we opened and nothing else owns yet.
        unsafe { sys::fi_close(self.0) };
    }
}

impl Inner {
    fn new_ctx(
        &mut self,
        op: OpId,
        len: usize,
        recv: bool,
        owned: Option<Vec<u8>>,
        role: Role,
    ) -> *mut c_void {
        let mut b = Box::new(OpCtx {
            ctx: sys::fi_context2::default(),
            op,
            len,
            recv,
            owned,
            role,
        });
        let p = &mut *b as *mut OpCtx as *mut c_void;
        self.ops.insert(p as usize, b);
        p
    }

    /// A send that finished when it was posted (copied out): its completion is ready.
    fn sent_now(&mut self, op: OpId, len: usize, tag: u64) {
        self.ready.push(Completion::done(op, len, tag, None));
    }

    /// The pid of a watched shm peer whose process has exited (`ask_kernel`: poll its pidfd
    /// when the watcher has not flagged it yet; see `shm::PeerWatch::dead`), else None.
    fn gone_pid(&self, peer: Peer, ask_kernel: bool) -> Option<i32> {
        let w = self.watch.get(&peer.0).filter(|w| w.dead(ask_kernel))?;
        Some(w.pid())
    }

    fn post_send(&mut self, caps: &Caps, peer: Peer, tag: u64, b: OpBuf) -> Result<Posted> {
        // A send the peer copies itself (an RTS) asks the watcher only: it waits for the
        // peer's ACK, and `progress_rndv` fails it once the watcher sees the peer gone.
        let rndv = b.len > fastbox::MAX_PAYLOAD && self.rndv_ok(peer.0);
        if let Some(pid) = self.gone_pid(peer, b.len > shm::FLAG_ONLY_BYTES && !rndv) {
            let e = peer_exited(pid, "");
            if b.owned.is_some() {
                // A control message: its operation fails, the endpoint goes on.
                self.ready.push(Completion {
                    op: b.op,
                    len: 0,
                    tag,
                    status: Err(e),
                    data: None,
                });
                return Ok(Posted::Queued);
            }
            return Err(e);
        }
        let OpBuf {
            addr,
            len,
            desc,
            op,
            owned,
        } = b;
        if len <= fastbox::MAX_PAYLOAD {
            if let Some(ob) = self.outbox.get_mut(&peer.0) {
                let pushed = match &owned {
                    Some(d) => ob.push(tag, d),
                    // SAFETY: Region's contract (the caller promised `len` readable bytes).
                    None => {
                        unsafe { Region::from_raw(addr as *mut u8, len) }.with(|d| ob.push(tag, d))
                    }
                };
                return match pushed {
                    fastbox::Pushed::Done => {
                        self.sent_now(op, len, tag);
                        Ok(Posted::Queued)
                    }
                    fastbox::Pushed::Full => {
                        if let Some(data) = owned {
                            self.backlog.push_front((peer, tag, data, op));
                        }
                        Ok(Posted::Busy)
                    }
                };
            }
        }
        if rndv {
            let s = RndvSend {
                peer: peer.0,
                tag,
                addr,
                len,
                desc,
                op,
                owned,
            };
            return Ok(self.post_rts(s));
        }
        if let Some(small) = self.soft.as_ref().map(|x| x.small) {
            if len <= small {
                return self.post_small(peer, tag, addr, len, op, owned);
            }
        }
        if caps.inject_ok && len <= caps.inject_size && owned.is_none() {
            // SAFETY: the endpoint is enabled; inject copies the buffer before returning.
            let rc =
                unsafe { sys::fi_tinject(self.tx_ep, addr as *const c_void, len, peer.0, tag) };
            if rc == 0 {
                self.sent_now(op, len, tag);
                return Ok(Posted::Queued);
            }
            if rc != -(sys::FI_EAGAIN as isize) {
                check("fi_tinject", rc as i64)?;
            }
            return Ok(Posted::Busy);
        }
        let ctx = self.new_ctx(op, len, false, owned, Role::User);
        // SAFETY: the buffer is valid until completion (Region's contract, or owned by ctx);
        // ctx is a live fi_context2 we keep until its completion is read.
        let rc = unsafe {
            sys::fi_tsend(
                self.tx_ep,
                addr as *const c_void,
                len,
                desc as *mut c_void,
                peer.0,
                tag,
                ctx,
            )
        };
        if rc == 0 {
            return Ok(Posted::Queued);
        }
        let ctx = self.ops.remove(&(ctx as usize));
        if rc == -(sys::FI_EAGAIN as isize) {
            // An owned control message goes back to the front of the backlog.
            if let Some(data) = ctx.and_then(|c| c.owned) {
                self.backlog.push_front((peer, tag, data, op));
            }
            return Ok(Posted::Busy);
        }
        check("fi_tsend", rc as i64)?;
        Ok(Posted::Busy)
    }

    /// Whether both ends of `peer` hold a slot in each other's inbox, so that every message
    /// it sends us, and every answer it owes us, comes through our inbox.
    fn both_slots(&self, peer: u64) -> bool {
        match &self.inbox {
            Some(ib) if self.outbox.contains_key(&peer) => self
                .peer_senders
                .get(&peer)
                .is_some_and(|&id| ib.sends_here(id)),
            _ => false,
        }
    }

    /// Whether a large message to `peer` may go as an `RTS` (see `cma`).
    fn rndv_ok(&self, peer: u64) -> bool {
        !self.no_cma.contains_key(&peer) && self.both_slots(peer)
    }

    /// Announce `s` to its peer with an `RTS` frame; the send completes on the `ACK`.
    fn post_rts(&mut self, s: RndvSend) -> Posted {
        let cookie = self.next_cookie;
        let rts = cma::Rts {
            pid: self.pid,
            addr: s.addr as u64,
            len: s.len as u64,
            cookie,
        };
        let ob = self.outbox.get_mut(&s.peer).expect("rndv_ok checked it");
        match ob.push_kind(fastbox::RTS, s.tag, &rts.encode()) {
            fastbox::Pushed::Done => {
                self.next_cookie += 1;
                self.rndv.insert(cookie, s);
                Posted::Queued
            }
            fastbox::Pushed::Full => {
                if let Some(data) = s.owned {
                    self.backlog.push_front((Peer(s.peer), s.tag, data, s.op));
                }
                Posted::Busy
            }
        }
    }

    /// An `RTS` frame from the fastbox sender `from`: match it in posted order or keep it.
    fn on_rts(&mut self, from: u64, msg: &[u8]) {
        let tag = u64::from_le_bytes(msg[0..8].try_into().expect("8 bytes"));
        let Some(rts) = cma::Rts::decode(&msg[8..]) else {
            log::warn!("malformed RTS frame ({} bytes) dropped", msg.len());
            return;
        };
        let soft = self.soft.as_mut().expect("soft mode");
        match soft.take_posted(tag) {
            Some((i, r)) => {
                if let Some(r) = self.fetch(r, tag, rts, from) {
                    // The provider brings it instead: the receive stays where it was.
                    self.soft.as_mut().expect("soft mode").posted.insert(i, r);
                }
            }
            None => soft.unexpected.push_back((tag, Unexp::Rndv { rts, from })),
        }
    }

    /// Complete receive `r` with the message `rts` announced (tag `tag`, from the fastbox
    /// sender `from`) by copying it out of the sender's memory, and answer the sender. Returns
    /// the receive when the kernel refused the copy: the sender then sends through the
    /// provider, into the receive's provider half (posted whenever a message may exceed the
    /// small size), so it must stay posted.
    fn fetch(&mut self, r: SoftRecv, tag: u64, rts: cma::Rts, from: u64) -> Option<SoftRecv> {
        let len = rts.len as usize;
        let (answer, got) = if rts.len > r.len as u64 {
            // The receive fails, the send is done: the message was delivered, just too large.
            (cma::AckStatus::Done, Err(too_large(rts.len, r.len)))
        } else {
            match self.copy_in(r.dst, rts) {
                Err(e) if cma::refused(&e) => {
                    log::info!(
                        "the kernel refuses copies from process {} ({e}): its large messages \
                         come through the provider",
                        rts.pid
                    );
                    self.ack(from, rts.cookie, cma::AckStatus::Fallback);
                    return Some(r);
                }
                Err(e) => (
                    cma::AckStatus::Failed,
                    Err(Error::System(format!(
                        "receive failed: copying {len} bytes from process {}: {e}",
                        rts.pid
                    ))),
                ),
                Ok(data) => (cma::AckStatus::Done, Ok(data)),
            }
        };
        self.ack(from, rts.cookie, answer);
        if let Some(ctx) = r.provider {
            self.swallow(ctx);
        }
        self.ready.push(match got {
            Ok(data) => Completion::done(r.op, len, tag, data),
            Err(e) => Completion::failed(r.op, tag, e),
        });
        None
    }

    /// Copy the message `rts` announced into `dst` (a new buffer for an owned receive, which
    /// is returned).
    fn copy_in(&self, dst: SoftDst, rts: cma::Rts) -> std::io::Result<Option<Vec<u8>>> {
        #[cfg(test)]
        if self.refuse_cma {
            return Err(std::io::Error::from_raw_os_error(libc::EPERM));
        }
        let len = rts.len as usize;
        match dst {
            SoftDst::Region(region) => region
                .with_mut(|d| cma::read_from(rts.pid, rts.addr, &mut d[..len]))
                .map(|_| None),
            SoftDst::Owned => {
                let mut v = vec![0u8; len];
                cma::read_from(rts.pid, rts.addr, &mut v).map(|_| Some(v))
            }
        }
    }

    /// Send an `ACK` to the fastbox sender `from`, now or (its ring full) on a later poll.
    fn ack(&mut self, from: u64, cookie: u64, status: cma::AckStatus) {
        let payload = cma::encode_ack(cookie, status);
        if !self.acks.is_empty() || !self.push_ack(from, &payload) {
            self.acks.push_back((from, payload));
        }
    }

    /// Push one `ACK`; false if the ring is full. One for a sender we hold no slot of is
    /// dropped with a warning (its send then fails at its deadline; senders announce only to
    /// peers that hold a slot in their inbox, so this is not expected).
    fn push_ack(&mut self, from: u64, payload: &[u8]) -> bool {
        let ob = self
            .sender_peers
            .get(&from)
            .and_then(|p| self.outbox.get_mut(p));
        match ob {
            Some(ob) => ob.push_kind(fastbox::ACK, 0, payload) == fastbox::Pushed::Done,
            None => {
                log::warn!("an ACK for fastbox sender {from:#x}, whose inbox we cannot reach");
                true
            }
        }
    }

    /// An `ACK` frame: the send it names is complete, failed, or goes to the provider.
    fn on_ack(&mut self, caps: &Caps, msg: &[u8]) {
        let Some((cookie, status)) = cma::decode_ack(&msg[8..]) else {
            log::warn!("malformed ACK frame ({} bytes) dropped", msg.len());
            return;
        };
        let Some(s) = self.rndv.remove(&cookie) else {
            log::warn!("an ACK for no pending send (cookie {cookie})");
            return;
        };
        let status = match status {
            cma::AckStatus::Done => Ok(()),
            cma::AckStatus::Failed => Err(Error::Remote(format!(
                "send failed: the receiver could not copy the {} bytes from this process",
                s.len
            ))),
            cma::AckStatus::Fallback => {
                self.no_cma.insert(s.peer, ());
                return self.resend_one(caps, s);
            }
        };
        self.ready.push(match status {
            Ok(()) => Completion::done(s.op, s.len, s.tag, s.owned),
            Err(e) => Completion::failed(s.op, s.tag, e),
        });
    }

    /// Post `s` through the provider (its peer refused our copies); kept for the next poll
    /// if the provider is busy. An error (the peer has exited, say) is this send's, not the
    /// endpoint's.
    fn resend_one(&mut self, caps: &Caps, mut s: RndvSend) {
        let owned = s.owned.take();
        let was_owned = owned.is_some();
        let b = OpBuf {
            addr: s.addr,
            len: s.len,
            desc: s.desc,
            op: s.op,
            owned,
        };
        match self.post_send(caps, Peer(s.peer), s.tag, b) {
            // An owned one went back to the backlog; a caller's buffer waits here.
            Ok(Posted::Busy) if !was_owned => self.resend.push_back(s),
            Ok(_) => {}
            Err(e) => self.ready.push(Completion::failed(s.op, s.tag, e)),
        }
    }

    /// What `poll` does for the rendezvous: ACKs and resends that had to wait, and sends to
    /// peers whose process has exited (they will never answer).
    fn progress_rndv(&mut self, caps: &Caps) {
        while let Some((from, payload)) = self.acks.front().copied() {
            if !self.push_ack(from, &payload) {
                break;
            }
            self.acks.pop_front();
        }
        for _ in 0..self.resend.len() {
            let s = self.resend.pop_front().expect("counted");
            self.resend_one(caps, s);
        }
        if self.rndv.is_empty() {
            return;
        }
        let gone: Vec<(u64, i32)> = self
            .rndv
            .iter()
            .filter_map(|(&c, s)| self.gone_pid(Peer(s.peer), false).map(|pid| (c, pid)))
            .collect();
        for (cookie, pid) in gone {
            let s = self.rndv.remove(&cookie).expect("listed");
            let e = peer_exited(pid, " before taking the message");
            self.ready.push(Completion::failed(s.op, s.tag, e));
        }
    }

    fn post_recv(&mut self, tag: u64, ignore: u64, b: OpBuf) -> Result<Posted> {
        if self.soft.is_some() {
            return self.post_soft_recv(tag, ignore, b);
        }
        if self.claims_busy() && self.claimed_recv(SoftRecv::of(tag, ignore, &b)).is_none() {
            return Ok(Posted::Queued);
        }
        self.post_provider_recv(tag, ignore, b, Role::User)
            .map(|p| p.0)
    }

    /// Post a tagged receive to the provider; returns what happened and the context.
    fn post_provider_recv(
        &mut self,
        tag: u64,
        ignore: u64,
        b: OpBuf,
        role: Role,
    ) -> Result<(Posted, usize)> {
        let OpBuf {
            addr,
            len,
            desc,
            op,
            owned,
        } = b;
        let ctx = self.new_ctx(op, len, true, owned, role);
        // SAFETY: the buffer is valid until completion (Region's contract, or owned by ctx).
        let rc = unsafe {
            sys::fi_trecv(
                self.ep,
                addr as *mut c_void,
                len,
                desc as *mut c_void,
                FI_ADDR_UNSPEC,
                tag,
                ignore,
                ctx,
            )
        };
        if rc == 0 {
            return Ok((Posted::Queued, ctx as usize));
        }
        self.ops.remove(&(ctx as usize));
        if rc == -(sys::FI_EAGAIN as isize) {
            return Ok((Posted::Busy, 0));
        }
        check("fi_trecv", rc as i64)?;
        Ok((Posted::Busy, 0))
    }

    /// A small message as an untagged send of `[tag][payload]` into the peer's pool.
    fn post_small(
        &mut self,
        peer: Peer,
        tag: u64,
        addr: usize,
        len: usize,
        op: OpId,
        owned: Option<Vec<u8>>,
    ) -> Result<Posted> {
        let mut msg = self
            .soft
            .as_mut()
            .and_then(|s| s.free.pop())
            .unwrap_or_default();
        msg.clear();
        msg.reserve(8 + len);
        msg.extend_from_slice(&tag.to_le_bytes());
        match &owned {
            Some(d) => msg.extend_from_slice(d),
            // SAFETY: Region's contract (the caller promised `len` readable bytes at `addr`).
            None => {
                unsafe { Region::from_raw(addr as *mut u8, len) }.with(|d| msg.extend_from_slice(d))
            }
        }
        let (maddr, mlen) = (msg.as_ptr() as usize, msg.len());
        // A framed copy of caller memory is ours to reuse when the send completes; one
        // framing an owned (control) message stays with its completion.
        let role = if owned.is_none() {
            Role::SmallSend
        } else {
            Role::User
        };
        let ctx = self.new_ctx(op, len, false, Some(msg), role);
        // SAFETY: the message buffer is owned by ctx until its completion; ctx lives until then.
        let rc = unsafe {
            sys::fi_send(
                self.tx_ep,
                maddr as *const c_void,
                mlen,
                ptr::null_mut(),
                peer.0,
                ctx,
            )
        };
        if rc == 0 {
            return Ok(Posted::Queued);
        }
        self.ops.remove(&(ctx as usize));
        if rc == -(sys::FI_EAGAIN as isize) {
            if let Some(data) = owned {
                self.backlog.push_front((peer, tag, data, op));
            }
            return Ok(Posted::Busy);
        }
        check("fi_send", rc as i64)?;
        Ok(Posted::Busy)
    }

    /// An empty untagged message to a fastbox peer (its pool receive drops it). Small messages,
    /// the handshakes among them, no longer reach the provider, whose shm maps the peer's
    /// region at the first send and answers EAGAIN until then: the hello sets that up when the
    /// peer is inserted, so that the first large send finds it ready. If the provider is busy,
    /// again on the next poll.
    fn hello(&mut self, peer: u64) -> Result<()> {
        let ctx = self.new_ctx(0, 0, false, None, Role::Swallow);
        // SAFETY: a zero-byte send; ctx lives in `ops` until its completion is read.
        let rc = unsafe { sys::fi_send(self.tx_ep, ptr::null(), 0, ptr::null_mut(), peer, ctx) };
        if rc == 0 {
            return Ok(());
        }
        self.ops.remove(&(ctx as usize));
        if rc == -(sys::FI_EAGAIN as isize) {
            if !self.hellos.contains(&peer) {
                self.hellos.push(peer);
            }
            return Ok(());
        }
        check("fi_send (fastbox hello)", rc as i64)
    }

    /// Read our inbox: messages go to the software matcher like pool messages, `RTS` frames
    /// to the matcher too, `ACK`s complete our sends.
    fn drain_inbox(&mut self, caps: &Caps) {
        if let Some(mut ib) = self.inbox.take() {
            ib.drain(|a| self.on_frame(caps, a));
            self.inbox = Some(ib);
        }
    }

    fn on_frame(&mut self, caps: &Caps, a: fastbox::Arrived<'_>) {
        match a.kind {
            fastbox::RTS => self.on_rts(a.from, a.msg),
            fastbox::ACK => self.on_ack(caps, a.msg),
            _ => self.on_small(a.msg),
        }
    }

    /// Everything `poll` does but the hand-over: completions are left in `ready`.
    fn progress(&mut self, caps: &Caps) -> Result<()> {
        if !self.backlog.is_empty() {
            self.drain_backlog(caps)?;
        }
        let mut entries = std::mem::take(&mut self.entries);
        let mut out = std::mem::take(&mut self.ready);
        let before = out.len();
        let r = self.read_cq(&mut entries, &mut out);
        self.entries = entries;
        // Pool messages matched meanwhile (`on_small`) pushed their completions to `ready`.
        out.append(&mut self.ready);
        let completed = out.len() > before;
        self.ready = out;
        r?;
        self.progress_claims(completed)?;
        for peer in std::mem::take(&mut self.hellos) {
            self.hello(peer)?;
        }
        self.drain_inbox(caps);
        self.progress_rndv(caps);
        Ok(())
    }

    /// `Transport::direct_bytes`: the fastbox, where both ends have one. Up to `soft.small`
    /// bytes that holds whichever way the peer sends (its frames and its provider messages of
    /// that size both end in `on_small`); up to `MAX_PAYLOAD` only while the peer holds a slot
    /// in our inbox, since without one its larger messages take the provider's tagged path,
    /// which `take_now` does not look at.
    fn direct_bytes(&self, peer: Peer) -> usize {
        match &self.soft {
            Some(soft) if self.inbox.is_some() && self.outbox.contains_key(&peer.0) => {
                if self.both_slots(peer.0) {
                    fastbox::MAX_PAYLOAD
                } else {
                    fastbox::MAX_PAYLOAD.min(soft.small)
                }
            }
            _ => 0,
        }
    }

    /// `Transport::send_now`.
    fn send_now(&mut self, caps: &Caps, peer: Peer, tag: u64, data: &[u8]) -> Result<bool> {
        let max = self.direct_bytes(peer);
        if data.len() > max {
            return Err(Error::arg(
                "data",
                format!(
                    "{} bytes is more than the direct channel to this peer carries ({max})",
                    data.len()
                ),
            ));
        }
        if let Some(pid) = self.gone_pid(peer, false) {
            return Err(peer_exited(pid, ""));
        }
        let ob = self
            .outbox
            .get_mut(&peer.0)
            .expect("direct_bytes checked it");
        match ob.push(tag, data) {
            fastbox::Pushed::Done => Ok(true),
            fastbox::Pushed::Full => {
                // The peer may be waiting for room in our inbox just as we wait for its.
                self.drain_inbox(caps);
                Ok(false)
            }
        }
    }

    /// `Transport::take_now`. Looks in what arrived earlier, then the inbox, and every
    /// `CQ_EVERY` misses the completion queue (a peer without a slot in our inbox sends small
    /// messages through the provider); a peer whose exit was seen before the look has gone
    /// without sending it.
    fn take_now(
        &mut self,
        caps: &Caps,
        peer: Peer,
        tag: u64,
        f: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<bool> {
        const CQ_EVERY: u32 = 256;
        let gone = self.gone_pid(peer, false);
        if self.take_unexpected(tag, f)? {
            return Ok(true);
        }
        let mut found: Option<Result<()>> = None;
        if let Some(mut ib) = self.inbox.take() {
            ib.drain(|a| {
                if found.is_none()
                    && a.kind == fastbox::DATA
                    && a.msg.len() >= 8
                    && a.msg[..8] == tag.to_le_bytes()
                {
                    found = Some(f(&a.msg[8..]));
                } else {
                    self.on_frame(caps, a);
                }
            });
            self.inbox = Some(ib);
        }
        if let Some(r) = found {
            return r.map(|_| true);
        }
        self.direct_misses += 1;
        if self.direct_misses >= CQ_EVERY {
            self.direct_misses = 0;
            self.progress(caps)?;
            if self.take_unexpected(tag, f)? {
                return Ok(true);
            }
        }
        match gone {
            Some(pid) => Err(peer_exited(pid, " without sending the message")),
            None => Ok(false),
        }
    }

    /// A message with exactly `tag` that arrived before anyone asked for it, handed to `f`.
    fn take_unexpected(
        &mut self,
        tag: u64,
        f: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<bool> {
        let Some(soft) = self.soft.as_mut() else {
            return Ok(false);
        };
        let Some(i) = soft.unexpected.iter().position(|(t, _)| *t == tag) else {
            return Ok(false);
        };
        match soft.unexpected.remove(i).expect("index from position").1 {
            Unexp::Data(data) => f(&data).map(|_| true),
            // Only a program whose ranks disagree on a message's size gets here: the direct
            // channel carries messages of up to the fastbox payload, an RTS announces larger.
            Unexp::Rndv { rts, .. } => Err(Error::InvalidArgument(format!(
                "argument 'size': a message of {} bytes arrived where at most {} were expected",
                rts.len,
                fastbox::MAX_PAYLOAD
            ))),
        }
    }

    /// Post one receive of the small-message pool, into `reuse` if given (a pool buffer whose
    /// message has been consumed).
    fn post_pool(&mut self, reuse: Option<Vec<u8>>) -> Result<()> {
        let Some(small) = self.soft.as_ref().map(|x| x.small) else {
            return Ok(());
        };
        let buf = match reuse {
            Some(mut b) if b.capacity() >= small + 8 => {
                b.resize(small + 8, 0);
                b
            }
            _ => vec![0u8; small + 8],
        };
        let (addr, len) = (buf.as_ptr() as usize, buf.len());
        let ctx = self.new_ctx(0, len, true, Some(buf), Role::Pool);
        // SAFETY: the buffer is owned by ctx until its completion.
        let rc = unsafe {
            sys::fi_recv(
                self.ep,
                addr as *mut c_void,
                len,
                ptr::null_mut(),
                FI_ADDR_UNSPEC,
                ctx,
            )
        };
        if rc != 0 {
            self.ops.remove(&(ctx as usize));
            check("fi_recv (small-message pool)", rc as i64)?;
        }
        Ok(())
    }

    /// A receive matched in software, plus a provider receive when a large message may come.
    fn post_soft_recv(&mut self, tag: u64, ignore: u64, b: OpBuf) -> Result<Posted> {
        let soft = self.soft.as_mut().expect("soft mode");
        let small = soft.small;
        let mut r = SoftRecv::of(tag, ignore, &b);
        if let Some(i) = soft
            .unexpected
            .iter()
            .position(|(t, _)| (*t | ignore) == (tag | ignore))
        {
            match soft.unexpected.remove(i).expect("index from position") {
                (t, Unexp::Data(data)) => {
                    let c = deliver(&r, t, &data);
                    self.ready.push(c);
                    return Ok(Posted::Queued);
                }
                (t, Unexp::Rndv { rts, from }) => match self.fetch(r, t, rts, from) {
                    None => return Ok(Posted::Queued),
                    // Refused: the provider brings it; post the receive as any other.
                    Some(back) => r = back,
                },
            }
        }
        if b.len > small {
            let op = b.op;
            let (p, ctx) =
                self.post_provider_recv(tag, ignore, OpBuf { owned: None, ..b }, Role::Dual)?;
            if p == Posted::Busy {
                return Ok(Posted::Busy);
            }
            r.provider = Some(ctx);
            let _ = op;
        }
        self.soft.as_mut().expect("soft mode").posted.push_back(r);
        Ok(Posted::Queued)
    }

    /// A pool message arrived: match it in posted order or keep it as unexpected.
    fn on_small(&mut self, msg: &[u8]) {
        if msg.is_empty() {
            return; // a fastbox peer's hello (see `hello`)
        }
        if msg.len() < 8 {
            log::warn!("runt small message ({} bytes) dropped", msg.len());
            return;
        }
        let tag = u64::from_le_bytes(msg[0..8].try_into().expect("8 bytes"));
        let data = &msg[8..];
        let soft = self.soft.as_mut().expect("soft mode");
        match soft.take_posted(tag) {
            Some((_, r)) => {
                if let Some(ctx) = r.provider {
                    self.swallow(ctx);
                }
                let c = deliver(&r, tag, data);
                self.ready.push(c);
            }
            None => soft.unexpected.push_back((tag, Unexp::Data(data.to_vec()))),
        }
    }

    /// Cancel a provider receive whose completion we will drop.
    fn swallow(&mut self, ctx: usize) {
        if let Some(c) = self.ops.get_mut(&ctx) {
            c.role = Role::Swallow;
            // SAFETY: ep is open; ctx is the context of a receive posted on it.
            unsafe { sys::fi_cancel(self.ep as *mut sys::fid, ctx as *mut c_void) };
        }
    }

    fn drain_backlog(&mut self, caps: &Caps) -> Result<()> {
        while let Some((peer, tag, data, op)) = self.backlog.pop_front() {
            let (addr, len) = (data.as_ptr() as usize, data.len());
            let b = OpBuf {
                addr,
                len,
                desc: 0,
                op,
                owned: Some(data),
            };
            if self.post_send(caps, peer, tag, b)? == Posted::Busy {
                break; // the message is back at the front of the backlog
            }
        }
        Ok(())
    }

    /// Read the completion queue dry into `out` (`entries` is the read buffer).
    fn read_cq(
        &mut self,
        entries: &mut [sys::fi_cq_tagged_entry],
        out: &mut Vec<Completion>,
    ) -> Result<()> {
        loop {
            // SAFETY: cq is open; entries has room for entries.len() tagged entries.
            let n = unsafe {
                sys::fi_cq_read(self.cq, entries.as_mut_ptr() as *mut c_void, entries.len())
            };
            if n == -(sys::FI_EAGAIN as isize) {
                return Ok(());
            }
            if n == -(sys::FI_EAVAIL as isize) {
                self.read_error(out)?;
                continue;
            }
            check("fi_cq_read", n as i64)?;
            for e in &entries[..n as usize] {
                let Some(ctx) = self.ops.remove(&(e.op_context as usize)) else {
                    log::warn!(
                        "completion for an unknown operation context {:p}",
                        e.op_context
                    );
                    continue;
                };
                if ctx.role == Role::Peek {
                    self.on_peeked(ctx, e.tag, e.len)?;
                    continue;
                }
                let ctx = *ctx;
                let mut owned = ctx.owned;
                match ctx.role {
                    Role::Swallow => continue,
                    Role::Claim => {
                        let mut data = owned.unwrap_or_default();
                        data.truncate(e.len);
                        self.on_claimed(data)?;
                        continue;
                    }
                    Role::Pool => {
                        let msg = owned.unwrap_or_default();
                        self.on_small(&msg[..e.len.min(msg.len())]);
                        self.post_pool(Some(msg))?;
                        continue;
                    }
                    Role::SmallSend => {
                        if let (Some(soft), Some(b)) = (self.soft.as_mut(), owned.take()) {
                            if soft.free.len() < FREE_BUFS {
                                soft.free.push(b);
                            }
                        }
                    }
                    Role::Dual => {
                        if let Some(soft) = self.soft.as_mut() {
                            soft.posted.retain(|r| r.op != ctx.op);
                        }
                    }
                    // A peek's answer was handled above, before its context was taken apart.
                    Role::User | Role::Peek => {}
                }
                let len = if ctx.recv { e.len } else { ctx.len };
                let data = owned.map(|mut v| {
                    v.truncate(len);
                    v
                });
                out.push(Completion {
                    op: ctx.op,
                    len,
                    tag: e.tag,
                    status: Ok(()),
                    data,
                });
            }
            if (n as usize) < entries.len() {
                return Ok(());
            }
        }
    }

    fn read_error(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        let mut e = sys::fi_cq_err_entry::default();
        // SAFETY: cq is open; e is a valid, zeroed error entry (err_data_size 0: the provider
        // points err_data at its own buffer).
        let rc = unsafe { sys::fi_cq_readerr(self.cq, &mut e, 0) };
        if rc == -(sys::FI_EAGAIN as isize) {
            return Ok(());
        }
        check("fi_cq_readerr", rc as i64)?;
        let mut buf = [0 as std::os::raw::c_char; 256];
        // SAFETY: cq is open; e came from it; buf has 256 writable bytes.
        let prov = unsafe {
            sys::fi_cq_strerror(
                self.cq,
                e.prov_errno,
                e.err_data,
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        let prov = cstr(prov);
        let Some(ctx) = self.ops.remove(&(e.op_context as usize)) else {
            log::warn!(
                "completion error for an unknown operation: {} ({prov})",
                strerror(e.err as i64)
            );
            return Ok(());
        };
        match ctx.role {
            Role::Swallow => return Ok(()),
            Role::Peek | Role::Claim => return self.on_claim_error(ctx.role, e.err.abs()),
            Role::Pool => {
                if e.err.abs() != sys::FI_ECANCELED as c_int {
                    log::warn!(
                        "small-message pool receive failed: {} ({prov})",
                        strerror(e.err as i64)
                    );
                    self.post_pool(None)?;
                }
                return Ok(());
            }
            Role::Dual => {
                if let Some(soft) = self.soft.as_mut() {
                    soft.posted.retain(|r| r.op != ctx.op);
                }
            }
            Role::User | Role::SmallSend => {}
        }
        // Some providers (shm) report a negative errno here: compare magnitudes.
        let err = e.err.abs();
        let status = if err == sys::FI_ECANCELED as c_int {
            Err(Error::InvalidUsage("operation cancelled".into()))
        } else if err == sys::FI_ETRUNC as c_int {
            Err(too_large((ctx.len + e.olen) as u64, ctx.len))
        } else {
            Err(Error::System(format!(
                "{} failed: {} (provider: {prov})",
                if ctx.recv { "receive" } else { "send" },
                strerror(e.err as i64)
            )))
        };
        out.push(Completion {
            op: ctx.op,
            len: 0,
            tag: e.tag,
            status,
            data: None,
        });
        Ok(())
    }
}

impl Transport for FabricTransport {
    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn address(&self) -> Vec<u8> {
        self.addr.clone()
    }

    fn insert_peer(&self, addr: &[u8]) -> Result<Peer> {
        let mut g = self.inner.lock();
        if let Some(p) = g.peers.get(addr) {
            return Ok(Peer(*p));
        }
        let mut fi_addr: u64 = FI_ADDR_UNSPEC;
        // SAFETY: av is open; addr points at `addr.len()` readable bytes in the provider's format.
        let rc = unsafe {
            sys::fi_av_insert(
                g.av,
                addr.as_ptr() as *const c_void,
                1,
                &mut fi_addr,
                0,
                ptr::null_mut(),
            )
        };
        if rc != 1 {
            return Err(Error::System(format!(
                "fi_av_insert of a peer address ({} bytes) failed: {}",
                addr.len(),
                if rc < 0 {
                    strerror(rc as i64)
                } else {
                    "address not accepted".into()
                }
            )));
        }
        g.peers.insert(addr.to_vec(), fi_addr);
        if g.shm_name.is_some() {
            if let Some(w) = shm::PeerWatch::of_address(addr) {
                g.watch.insert(fi_addr, w);
            }
        }
        if g.inbox.is_some() {
            // Our own inbox says we match in software, so the peer (same library, same
            // libfabric) reads its inbox; without one it gets the provider path.
            if let Some(peer) = shm::endpoint_in_address(addr) {
                let id = fastbox::sender_id(&peer);
                g.peer_senders.insert(fi_addr, id);
                g.sender_peers.insert(id, fi_addr);
            }
            if let Some(name) = fastbox::inbox_of_address(addr) {
                let me = g.shm_name.clone().unwrap_or_default();
                match fastbox::Outbox::open(&name, &me) {
                    Ok(ob) => {
                        g.outbox.insert(fi_addr, ob);
                        g.hello(fi_addr)?;
                    }
                    Err(e) => log::debug!("peer {name}: no fastbox ({e})"),
                }
            }
        }
        Ok(Peer(fi_addr))
    }

    fn register(&self, region: Region) -> Result<Mr> {
        if !self.caps.mr_local {
            return Ok(Mr {
                desc: 0,
                region,
                keep: None,
            });
        }
        let g = self.inner.lock();
        let mut mr: *mut sys::fid_mr = ptr::null_mut();
        let access = (sys::FI_SEND | sys::FI_RECV) as u64;
        // SAFETY: the domain is open; the region is valid memory per its contract.
        check("fi_mr_reg", unsafe {
            sys::fi_mr_reg(
                g.dom.domain,
                region.addr() as *const c_void,
                region.len(),
                access,
                0,
                0,
                0,
                &mut mr,
                ptr::null_mut(),
            )
        } as i64)?;
        let keep = MrFid {
            mr,
            _domain: g.dom.clone(),
        };
        if self.caps.mr_mode & sys::FI_MR_ENDPOINT as u64 != 0 {
            // SAFETY: mr and ep are open objects of the same domain.
            unsafe {
                check(
                    "fi_mr_bind",
                    sys::fi_mr_bind(mr, g.ep as *mut sys::fid, 0) as i64,
                )?;
                check("fi_mr_enable", sys::fi_mr_enable(mr) as i64)?;
            }
        }
        // SAFETY: mr is open.
        let desc = unsafe { sys::fi_mr_desc(mr) } as usize;
        Ok(Mr {
            desc,
            region,
            keep: Some(Box::new(keep)),
        })
    }

    fn send(
        &self,
        peer: Peer,
        tag: u64,
        region: Region,
        mr: Option<&Mr>,
        op: OpId,
    ) -> Result<Posted> {
        let mut g = self.inner.lock();
        let desc = mr.map_or(0, |m| m.desc);
        let b = OpBuf {
            addr: region.addr(),
            len: region.len(),
            desc,
            op,
            owned: None,
        };
        g.post_send(&self.caps, peer, tag, b)
    }

    fn recv(
        &self,
        tag: u64,
        ignore: u64,
        region: Region,
        mr: Option<&Mr>,
        op: OpId,
    ) -> Result<Posted> {
        let mut g = self.inner.lock();
        let desc = mr.map_or(0, |m| m.desc);
        let b = OpBuf {
            addr: region.addr(),
            len: region.len(),
            desc,
            op,
            owned: None,
        };
        g.post_recv(tag, ignore, b)
    }

    fn send_owned(&self, peer: Peer, tag: u64, data: Vec<u8>, op: OpId) -> Result<()> {
        let mut g = self.inner.lock();
        g.backlog.push_back((peer, tag, data, op));
        g.drain_backlog(&self.caps)
    }

    fn recv_owned(&self, tag: u64, ignore: u64, len: usize, op: OpId) -> Result<()> {
        let mut g = self.inner.lock();
        let buf = vec![0u8; len];
        let addr = buf.as_ptr() as usize;
        let b = OpBuf {
            addr,
            len,
            desc: 0,
            op,
            owned: Some(buf),
        };
        match g.post_recv(tag, ignore, b)? {
            Posted::Queued => Ok(()),
            Posted::Busy => Err(Error::System(
                "receive queue full while posting a control receive".into(),
            )),
        }
    }

    fn cancel(&self, op: OpId) {
        let mut g = self.inner.lock();
        if g.cancel_waiting(op) {
            return;
        }
        if let Some(soft) = g.soft.as_mut() {
            if let Some(i) = soft.posted.iter().position(|r| r.op == op) {
                let r = soft.posted.remove(i).expect("index from position");
                if let Some(ctx) = r.provider {
                    g.swallow(ctx);
                }
                g.ready.push(Completion {
                    op,
                    len: 0,
                    tag: r.tag,
                    status: Err(Error::InvalidUsage("operation cancelled".into())),
                    data: None,
                });
                return;
            }
        }
        for (key, ctx) in g.ops.iter() {
            if ctx.op == op && ctx.recv && ctx.role == Role::User {
                // SAFETY: ep is open and *key is the context of an operation posted on it.
                let rc = unsafe { sys::fi_cancel(g.ep as *mut sys::fid, *key as *mut c_void) };
                if rc != 0 {
                    log::debug!("fi_cancel: {}", strerror(rc as i64));
                }
            }
        }
    }

    fn poll(&self, out: &mut Vec<Completion>) -> Result<usize> {
        let mut g = self.inner.lock();
        let start = out.len();
        out.append(&mut g.ready);
        g.progress(&self.caps)?;
        out.append(&mut g.ready);
        Ok(out.len() - start)
    }

    fn direct_bytes(&self, peer: Peer) -> usize {
        self.inner.lock().direct_bytes(peer)
    }

    fn send_now(&self, peer: Peer, tag: u64, data: &[u8]) -> Result<bool> {
        self.inner.lock().send_now(&self.caps, peer, tag, data)
    }

    fn take_now(
        &self,
        peer: Peer,
        tag: u64,
        f: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<bool> {
        self.inner.lock().take_now(&self.caps, peer, tag, f)
    }

    fn wait(&self, timeout: Duration) -> Result<()> {
        let Some(fd) = self.wait_fd else {
            std::thread::yield_now();
            return Ok(());
        };
        {
            let g = self.inner.lock();
            if !g.ready.is_empty() || !g.backlog.is_empty() || !g.hellos.is_empty() {
                return Ok(());
            }
            if g.inbox.is_some() {
                // A fastbox frame raises no completion: never sleep past one.
                drop(g);
                std::thread::yield_now();
                return Ok(());
            }
            let mut fids = [g.cq as *mut sys::fid];
            // SAFETY: fabric and cq are open; fids holds one valid fid.
            let rc = unsafe { sys::fi_trywait(g.dom.fabric, fids.as_mut_ptr(), 1) };
            if rc != 0 {
                return Ok(()); // something is ready or needs progress: the caller polls
            }
        }
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as c_int;
        // SAFETY: pfd is one valid pollfd; the fd belongs to our CQ, open while self lives.
        unsafe { libc::poll(&mut pfd, 1, ms) };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn shm_pair() -> Option<(FabricTransport, FabricTransport)> {
        let (a, b) = pair("shm", None)?;
        if a.inner.lock().inbox.is_none() {
            eprintln!("skipping: this libfabric's shm needs no fastbox");
            return None;
        }
        Some((a, b))
    }

    /// Two endpoints of `provider` (on `domain`), or None where it is missing.
    fn pair(provider: &str, domain: Option<&str>) -> Option<(FabricTransport, FabricTransport)> {
        pair_with(provider, domain, &[])
    }

    /// `pair`, with the variables `more` set as well.
    fn pair_with(
        provider: &str,
        domain: Option<&str>,
        more: &[(&str, &str)],
    ) -> Option<(FabricTransport, FabricTransport)> {
        let cfg = Config::from_lookup(|n| match n {
            "FABRICOLL_PROVIDER" => Some(provider.into()),
            "FABRICOLL_DOMAIN" => domain.map(String::from),
            _ => more
                .iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| v.to_string()),
        })
        .expect("config");
        let disc = match discover(&cfg, Use::Engines) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("skipping {provider}: {e}");
                return None;
            }
        };
        if disc.chosen.as_deref().and_then(|c| c.split(';').next()) != Some(provider) {
            eprintln!("skipping {provider}: not offered here");
            return None;
        }
        let dev = disc.devices.first()?;
        let a = FabricTransport::open(dev).expect("endpoint a");
        let b = FabricTransport::open(dev).expect("endpoint b");
        Some((a, b))
    }

    #[test]
    fn messages_that_arrive_before_their_receive_match_with_our_widest_tags() {
        // libfabric 1.17's net provider keeps tag bit 63 for itself: a message whose tag had it
        // set and that arrived before its receive was never matched. Our tags use bits 0..=62;
        // the widest ones must match however early they arrive, over both TCP providers.
        let widest = (1u64 << crate::transport::TAG_BITS) - 1;
        let tags = [widest, 1 << 62, widest >> 1, 7];
        let sizes = [8usize, 300, 0, 70_000];
        for provider in ["net", "tcp"] {
            let Some((a, b)) = pair(provider, Some("lo")) else {
                continue;
            };
            let to_a = b.insert_peer(&a.address()).expect("insert");
            let mut src: Vec<Vec<u8>> = sizes
                .iter()
                .map(|n| (0..*n).map(|i| (i * 7 + n) as u8).collect())
                .collect();
            let mut early = [Vec::new(), Vec::new()];
            let start = Instant::now();
            for (i, s) in src.iter_mut().enumerate() {
                while b
                    .send(to_a, tags[i], region(s), None, 100 + i as u64)
                    .expect("send")
                    == Posted::Busy
                {
                    // The connection is set up while both ends progress.
                    a.poll(&mut early[0]).expect("poll");
                    b.poll(&mut early[1]).expect("poll");
                    assert!(
                        start.elapsed() < Duration::from_secs(10),
                        "{provider}: send stays busy"
                    );
                }
            }
            // Let the messages arrive with no receive posted.
            while start.elapsed() < Duration::from_millis(100) {
                a.poll(&mut early[0]).expect("poll");
                b.poll(&mut early[1]).expect("poll");
            }
            assert!(early[0].is_empty(), "{provider}: nothing was posted at a");
            let mut dst: Vec<Vec<u8>> = sizes.iter().map(|n| vec![0u8; n + 1]).collect();
            for (i, d) in dst.iter_mut().enumerate().rev() {
                a.recv(tags[i], 0, region(d), None, i as u64).expect("recv");
            }
            let [mut got, sent] = completions(&a, &b, sizes.len(), early);
            assert!(
                sent.iter().all(|c| c.status.is_ok()),
                "{provider}: {sent:?}"
            );
            got.sort_by_key(|c| c.op);
            for (i, c) in got.iter().enumerate() {
                assert!(c.status.is_ok(), "{provider}: {:?}", c.status);
                assert_eq!(c.tag, tags[i], "{provider}: tag of op {i}");
                assert_eq!(c.len, sizes[i], "{provider}: op {i}");
                assert_eq!(
                    dst[i][..sizes[i]],
                    src[i][..],
                    "{provider}: payload of op {i}"
                );
            }
        }
    }

    fn region(v: &mut [u8]) -> Region {
        // SAFETY: every buffer outlives the operations posted on it (each test polls them).
        unsafe { Region::from_raw(v.as_mut_ptr(), v.len()) }
    }

    /// Poll `a` and `b` (the provider moves large messages only while both progress) until
    /// they have `want` completions each, `out` holding those found before.
    fn completions(
        a: &FabricTransport,
        b: &FabricTransport,
        want: usize,
        mut out: [Vec<Completion>; 2],
    ) -> [Vec<Completion>; 2] {
        let start = Instant::now();
        while out[0].len() < want || out[1].len() < want {
            a.poll(&mut out[0]).expect("poll");
            b.poll(&mut out[1]).expect("poll");
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no completion: {:?}",
                out
            );
        }
        out
    }

    /// The TCP sockets of this process in state ESTABLISHED (both ends of a loopback
    /// connection count, since both are ours): `/proc/net/tcp` and `tcp6` lines whose socket
    /// inode is one of our descriptors.
    fn established_sockets() -> usize {
        let ours: std::collections::HashSet<String> = std::fs::read_dir("/proc/self/fd")
            .map(|d| {
                d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                    .filter_map(|l| {
                        let l = l.to_string_lossy().into_owned();
                        Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
                    })
                    .collect()
            })
            .unwrap_or_default();
        ["/proc/net/tcp", "/proc/net/tcp6"]
            .iter()
            .filter_map(|f| std::fs::read_to_string(f).ok())
            .flat_map(|t| t.lines().skip(1).map(str::to_owned).collect::<Vec<_>>())
            .filter(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 9 && f[3] == "01" && ours.contains(f[9])
            })
            .count()
    }

    #[test]
    fn sends_share_the_receiving_endpoint_unless_a_second_one_is_asked_for_and_made() {
        // Endpoint values only compared, never used.
        let (rx, tx) = (8 as *mut sys::fid_ep, 16 as *mut sys::fid_ep);
        let mr_ep = sys::FI_MR_ENDPOINT as u64;
        let never = || -> Result<*mut sys::fid_ep> { panic!("no second endpoint wanted") };
        assert_eq!(sends_from(false, 0, rx, "d", never), rx);
        assert_eq!(sends_from(true, mr_ep, rx, "d", never), rx);
        let failed = || Err(Error::System("fi_endpoint (sends) failed".into()));
        assert_eq!(sends_from(true, 0, rx, "d", failed), rx);
        assert_eq!(sends_from(true, 0, rx, "d", || Ok(tx)), tx);
    }

    #[test]
    fn over_native_tcp_each_direction_has_a_connection_of_its_own() {
        let Some((a, b)) = pair("net", Some("lo")) else {
            return;
        };
        for t in [&a, &b] {
            let g = t.inner.lock();
            assert!(g.tx_ep != g.ep, "a send endpoint of its own");
        }
        let before = established_sockets();
        let to_a = b.insert_peer(&a.address()).expect("insert");
        let to_b = a.insert_peer(&b.address()).expect("insert");
        // Both ways at once, large and small, each checked.
        let n = 3 << 20;
        let mut ab: Vec<u8> = (0..n).map(|j| (j * 7 + 1) as u8).collect();
        let mut ba: Vec<u8> = (0..n).map(|j| (j * 11 + 3) as u8).collect();
        let (mut got_a, mut got_b) = (vec![0u8; n], vec![0u8; n]);
        let (mut sa, mut sb) = (*b"to b", *b"to a");
        let (mut ga, mut gb) = ([0u8; 4], [0u8; 4]);
        a.recv(1, 0, region(&mut got_a), None, 1).expect("recv");
        b.recv(1, 0, region(&mut got_b), None, 2).expect("recv");
        a.recv(2, 0, region(&mut ga), None, 3).expect("recv");
        b.recv(2, 0, region(&mut gb), None, 4).expect("recv");
        let mut out = [Vec::new(), Vec::new()];
        for (from, peer, tag, data, op) in [
            (&a, to_b, 1u64, &mut ab[..], 5u64),
            (&b, to_a, 1, &mut ba[..], 6),
            (&a, to_b, 2, &mut sa[..], 7),
            (&b, to_a, 2, &mut sb[..], 8),
        ] {
            let start = Instant::now();
            while from.send(peer, tag, region(data), None, op).expect("send") == Posted::Busy {
                a.poll(&mut out[0]).expect("poll");
                b.poll(&mut out[1]).expect("poll");
                assert!(start.elapsed() < Duration::from_secs(10), "send stays busy");
            }
        }
        // Each transport: its two receives and its two sends.
        let out = completions(&a, &b, 4, out);
        let all: Vec<&Completion> = out.iter().flatten().collect();
        for op in 1..=8 {
            let c = all
                .iter()
                .find(|c| c.op == op)
                .unwrap_or_else(|| panic!("op {op}"));
            assert!(c.status.is_ok(), "op {op}: {:?}", c.status);
        }
        assert!(
            got_a == ba && got_b == ab,
            "the large messages arrived intact"
        );
        assert_eq!((&ga, &gb), (b"to a", b"to b"));
        // Two connections, each with both ends in this process.
        assert_eq!(established_sockets() - before, 4);
        // The plugins' endpoints send from the receiving endpoint (see `own_send_endpoint`).
        let cfg = Config::from_lookup(|n| match n {
            "FABRICOLL_PROVIDER" => Some("net".into()),
            "FABRICOLL_DOMAIN" => Some("lo".into()),
            _ => None,
        })
        .expect("config");
        let disc = discover(&cfg, Use::Plugin).expect("the plugins found net");
        let dev = &disc.devices[0];
        assert!(!dev.own_send_endpoint);
        let t = FabricTransport::open(dev).expect("endpoint");
        let g = t.inner.lock();
        assert!(g.tx_ep == g.ep, "the plugin's sends share its endpoint");
    }

    #[test]
    fn without_the_fastbox_small_shm_messages_reach_a_receive_posted_before_or_after() {
        let Some((a, b)) = pair_with("shm", None, &[("FABRICOLL_SHM_FASTBOX", "0")]) else {
            return;
        };
        assert!(a.inner.lock().inbox.is_none(), "FABRICOLL_SHM_FASTBOX=0");
        let to_a = b.insert_peer(&a.address()).expect("insert");
        let _to_b = a.insert_peer(&b.address()).expect("insert");
        // One receive posted first, one message that arrives first.
        let (mut early, mut late) = ([0u8; 5], [0u8; 4]);
        a.recv(1, 0, region(&mut early), None, 1).expect("recv");
        let (mut m1, mut m2) = (*b"first", *b"late");
        let start = Instant::now();
        let mut out = [Vec::new(), Vec::new()];
        for (tag, m, op) in [(1u64, &mut m1[..], 11u64), (2, &mut m2[..], 12)] {
            while b.send(to_a, tag, region(m), None, op).expect("send") == Posted::Busy {
                a.poll(&mut out[0]).expect("poll");
                b.poll(&mut out[1]).expect("poll");
                assert!(start.elapsed() < Duration::from_secs(10), "send stays busy");
            }
        }
        let [got, sent] = completions(&a, &b, 1, out);
        assert!(sent.iter().all(|c| c.status.is_ok()), "{sent:?}");
        a.recv(2, 0, region(&mut late), None, 2).expect("recv");
        let [got, _] = completions(&a, &b, 2, [got, sent]);
        assert!(got.iter().all(|c| c.status.is_ok()), "{got:?}");
        assert_eq!((&early, &late), (b"first", b"late"));
    }

    #[test]
    fn small_shm_messages_go_through_the_fastbox_in_order_and_large_ones_do_not() {
        let Some((a, b)) = shm_pair() else { return };
        let to_a = b.insert_peer(&a.address()).expect("insert");
        assert!(
            b.inner.lock().outbox.contains_key(&to_a.0),
            "a slot in a's inbox"
        );
        let fb = fastbox::MAX_PAYLOAD;
        let sizes = [0usize, 1, 8, 4096, 4097, fb, fb + 1, 65536];
        let mut src: Vec<Vec<u8>> = sizes
            .iter()
            .map(|n| (0..*n).map(|i| (i * 13 + n) as u8).collect())
            .collect();
        // Four messages with one tag: received in the order sent, whatever the path.
        let mut dst: Vec<Vec<u8>> = sizes.iter().map(|n| vec![0u8; n + 8]).collect();
        for (i, d) in dst.iter_mut().enumerate() {
            let tag = if i < 4 { 5 } else { 6 + i as u64 };
            a.recv(tag, 0, region(d), None, i as u64).expect("recv");
        }
        let (start, mut early) = (Instant::now(), [Vec::new(), Vec::new()]);
        for (i, s) in src.iter_mut().enumerate() {
            let tag = if i < 4 { 5 } else { 6 + i as u64 };
            // The provider may refuse (EAGAIN) until it has mapped a's region: progress both.
            while b
                .send(to_a, tag, region(s), None, 100 + i as u64)
                .expect("send")
                == Posted::Busy
            {
                a.poll(&mut early[0]).expect("poll");
                b.poll(&mut early[1]).expect("poll");
                assert!(start.elapsed() < Duration::from_secs(10), "send stays busy");
            }
        }
        let [mut got, sent] = completions(&a, &b, sizes.len(), early);
        assert!(sent.iter().all(|c| c.status.is_ok()));
        // The provider's halves of the receives the fastbox served are cancelled and their
        // completions swallowed: one completion per receive, nothing more.
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(200) {
            a.poll(&mut got).expect("poll");
        }
        assert_eq!(got.len(), sizes.len(), "{got:?}");
        got.sort_by_key(|c| c.op);
        for (i, c) in got.iter().enumerate() {
            assert!(c.status.is_ok(), "{:?}", c.status);
            assert_eq!(c.len, sizes[i], "op {i}");
            assert_eq!(dst[i][..sizes[i]], src[i][..], "payload of op {i}");
        }
    }

    #[test]
    fn the_direct_channel_carries_more_than_small_messages_only_from_peers_with_a_slot_here() {
        let Some((a, b)) = shm_pair() else { return };
        // Every slot of a's inbox taken before b comes: b's messages to a beyond the small
        // size then take the provider's tagged path, which take_now cannot see.
        let name = a.inner.lock().inbox.as_ref().expect("inbox").name.clone();
        let squatters: Vec<fastbox::Outbox> = (0..fastbox::SLOTS)
            .map(|i| fastbox::Outbox::open(&name, &format!("squatter-{i}")).expect("slot"))
            .collect();
        let to_a = b.insert_peer(&a.address()).expect("insert");
        let to_b = a.insert_peer(&b.address()).expect("insert");
        assert!(!b.inner.lock().outbox.contains_key(&to_a.0), "no slot left");
        assert_eq!(b.direct_bytes(to_a), 0, "b cannot write into a's inbox");
        let small = a.inner.lock().soft.as_ref().expect("soft").small;
        assert!(small < fastbox::MAX_PAYLOAD);
        assert_eq!(a.direct_bytes(to_b), small, "b holds no slot in a's inbox");
        drop(squatters);
        // With both slots held, the whole fastbox payload, both ways.
        let (c, d) = shm_pair().expect("a second pair");
        let to_c = d.insert_peer(&c.address()).expect("insert");
        let to_d = c.insert_peer(&d.address()).expect("insert");
        assert_eq!(c.direct_bytes(to_d), fastbox::MAX_PAYLOAD);
        assert_eq!(d.direct_bytes(to_c), fastbox::MAX_PAYLOAD);
        let big: Vec<u8> = (0..fastbox::MAX_PAYLOAD).map(|i| (i * 31) as u8).collect();
        assert!(d.send_now(to_c, 4, &big).expect("send_now"));
        assert_eq!(take(&c, to_d, 4), big);
    }

    #[test]
    fn a_waiter_with_an_inbox_never_sleeps_past_a_fastbox_frame() {
        let Some((a, b)) = shm_pair() else { return };
        let to_a = b.insert_peer(&a.address()).expect("insert");
        let mut buf = vec![0u8; 8];
        a.recv(7, 0, region(&mut buf), None, 1).expect("recv");
        // Frames raise no completion, so a wait must return without sleeping its timeout
        // (on a CQ with a wait fd it would sleep all of it).
        let t = Instant::now();
        a.wait(Duration::from_secs(5)).expect("wait");
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "slept {:?}",
            t.elapsed()
        );
        let mut msg = *b"no sleep";
        assert_eq!(
            b.send(to_a, 7, region(&mut msg), None, 2).expect("send"),
            Posted::Queued
        );
        let [c, _] = completions(&a, &b, 1, Default::default());
        assert_eq!((c[0].op, c[0].len), (1, 8));
        assert_eq!(&buf, b"no sleep");
    }

    /// Take tag `tag` from `peer` on `t`, polling up to 5 s.
    fn take(t: &FabricTransport, peer: Peer, tag: u64) -> Vec<u8> {
        let start = Instant::now();
        let mut got = None;
        while !t
            .take_now(peer, tag, &mut |m| {
                got = Some(m.to_vec());
                Ok(())
            })
            .expect("take_now")
        {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "tag {tag} never came"
            );
        }
        got.expect("taken")
    }

    #[test]
    fn the_direct_channel_delivers_by_tag_in_any_order_and_refuses_what_it_cannot_carry() {
        let Some((a, b)) = shm_pair() else { return };
        let to_a = b.insert_peer(&a.address()).expect("insert");
        let to_b = a.insert_peer(&b.address()).expect("insert");
        let max = b.direct_bytes(to_a);
        assert!(max == fastbox::MAX_PAYLOAD && a.direct_bytes(to_b) == max);
        // Nothing yet; then three tags taken in another order than sent (the ones passed
        // over wait among the unexpected), one of them the largest payload.
        let none = a.take_now(to_b, 1, &mut |_| Ok(())).expect("take_now");
        assert!(!none);
        let big: Vec<u8> = (0..max).map(|i| (i * 7) as u8).collect();
        assert!(b.send_now(to_a, 1, b"one").expect("send_now"));
        assert!(b.send_now(to_a, 2, &big).expect("send_now"));
        assert!(b.send_now(to_a, 3, b"").expect("send_now"));
        assert_eq!(take(&a, to_b, 3), b"");
        assert_eq!(take(&a, to_b, 1), b"one");
        assert_eq!(take(&a, to_b, 2), big);
        // The general path's recv matches what send_now sent, and take_now takes what send
        // sent: one wire format.
        let mut buf = [0u8; 5];
        a.recv(9, 0, region(&mut buf), None, 77).expect("recv");
        assert!(b.send_now(to_a, 9, b"mixed").expect("send_now"));
        let (start, mut c) = (Instant::now(), Vec::new());
        while c.is_empty() {
            a.poll(&mut c).expect("poll");
            assert!(start.elapsed() < Duration::from_secs(5), "no completion");
        }
        assert_eq!((c[0].op, c[0].len, &buf), (77, 5, b"mixed"));
        let mut msg = *b"general";
        assert_eq!(
            b.send(to_a, 10, region(&mut msg), None, 5).expect("send"),
            Posted::Queued
        );
        assert_eq!(take(&a, to_b, 10), b"general");
        // The taker's error comes back, and the message is consumed all the same.
        assert!(b.send_now(to_a, 11, b"bad").expect("send_now"));
        let start = Instant::now();
        let err = loop {
            match a.take_now(to_b, 11, &mut |_| Err(Error::Remote("no".into()))) {
                Ok(false) => assert!(start.elapsed() < Duration::from_secs(5)),
                Ok(true) => panic!("the error was lost"),
                Err(e) => break e,
            }
        };
        assert!(err.to_string().contains("no"), "{err}");
        assert!(!a.take_now(to_b, 11, &mut |_| Ok(())).expect("take_now"));
        // More than the channel carries: an error naming the argument, nothing sent.
        let err = b.send_now(to_a, 12, &vec![0u8; max + 1]).unwrap_err();
        assert!(err.to_string().contains("'data'"), "{err}");
    }

    #[test]
    fn a_full_direct_channel_says_so_and_takes_more_once_drained() {
        let Some((a, b)) = shm_pair() else { return };
        let to_a = b.insert_peer(&a.address()).expect("insert");
        let to_b = a.insert_peer(&b.address()).expect("insert");
        let payload = vec![0x5au8; b.direct_bytes(to_a)];
        let mut sent = 0u64;
        while b.send_now(to_a, sent, &payload).expect("send_now") {
            sent += 1;
            assert!(sent < 1000, "the ring never fills");
        }
        assert!(sent > 0);
        for tag in 0..sent {
            assert_eq!(take(&a, to_b, tag), payload);
        }
        assert!(b.send_now(to_a, sent, &payload).expect("send_now"));
        assert_eq!(take(&a, to_b, sent), payload);
    }

    /// A spawned process that `t` watches as `peer`'s (both endpoints of a pair live in this
    /// process): kill it to make the peer exit.
    fn stand_in(t: &FabricTransport, peer: Peer) -> std::process::Child {
        let child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let name = format!("{}{}-0-1", shm::PREFIX, child.id());
        let w = shm::PeerWatch::of_address(name.as_bytes()).expect("our name format");
        t.inner.lock().watch.insert(peer.0, w);
        child
    }

    #[test]
    fn the_direct_channel_reports_a_peer_whose_process_exited() {
        let Some((a, b)) = shm_pair() else { return };
        let to_a = b.insert_peer(&a.address()).expect("insert");
        let to_b = a.insert_peer(&b.address()).expect("insert");
        assert!(b.send_now(to_a, 1, b"last words").expect("send_now"));
        // Both endpoints live in this process: a spawned process stands in for b's.
        let mut child = stand_in(&a, to_b);
        child.kill().expect("kill");
        child.wait().expect("reap");
        let start = Instant::now();
        while a.inner.lock().gone_pid(to_b, false).is_none() {
            assert!(start.elapsed() < Duration::from_secs(5), "never flagged");
            std::thread::sleep(Duration::from_millis(1));
        }
        // What it sent before it went is still taken; then neither side waits for it.
        assert_eq!(take(&a, to_b, 1), b"last words");
        let e = a.take_now(to_b, 2, &mut |_| Ok(())).unwrap_err();
        assert!(e.to_string().contains("exited without sending"), "{e}");
        let e = a.send_now(to_b, 3, b"x").unwrap_err();
        assert!(e.to_string().contains("has exited"), "{e}");
    }

    /// A pair of shm endpoints that hold a slot in each other's inbox, with their peers.
    fn linked_pair() -> Option<(FabricTransport, FabricTransport, Peer, Peer)> {
        let (a, b) = shm_pair()?;
        let to_a = b.insert_peer(&a.address()).expect("insert");
        let to_b = a.insert_peer(&b.address()).expect("insert");
        assert!(a.inner.lock().rndv_ok(to_b.0) && b.inner.lock().rndv_ok(to_a.0));
        Some((a, b, to_a, to_b))
    }

    /// Send `src` from `b` to `a` as op `op`, progressing both while the send is refused.
    fn send_all(
        a: &FabricTransport,
        b: &FabricTransport,
        to_a: Peer,
        tag: u64,
        src: &mut [u8],
        op: u64,
    ) {
        let (start, mut sink) = (Instant::now(), Vec::new());
        while b.send(to_a, tag, region(src), None, op).expect("send") == Posted::Busy {
            a.poll(&mut sink).expect("poll");
            assert!(sink.is_empty(), "{sink:?}");
            assert!(start.elapsed() < Duration::from_secs(10), "send stays busy");
        }
    }

    #[test]
    fn large_shm_messages_between_fastbox_peers_are_copied_by_their_receiver() {
        let Some((a, b, to_a, _)) = linked_pair() else {
            return;
        };
        let fb = fastbox::MAX_PAYLOAD;
        let sizes = [fb + 1, 65536, 3 << 20];
        let mut src: Vec<Vec<u8>> = sizes
            .iter()
            .map(|n| (0..*n).map(|i| (i * 7 + n) as u8).collect())
            .collect();
        let mut dst: Vec<Vec<u8>> = sizes.iter().map(|n| vec![0u8; n + 64]).collect();
        // The first receive is posted before its message, the others after theirs (their
        // RTS frames wait among the unexpected, and the copy happens at the receive).
        let (first, rest) = dst.split_at_mut(1);
        a.recv(10, 0, region(&mut first[0]), None, 0).expect("recv");
        for (i, s) in src.iter_mut().enumerate() {
            send_all(&a, &b, to_a, 10 + i as u64, s, 100 + i as u64);
        }
        {
            let g = b.inner.lock();
            assert_eq!(g.rndv.len(), 3, "every send waits for its ACK");
        }
        let mut early = [Vec::new(), Vec::new()];
        a.poll(&mut early[0]).expect("poll");
        for (i, d) in rest.iter_mut().enumerate() {
            a.recv(11 + i as u64, 0, region(d), None, 1 + i as u64)
                .expect("recv");
        }
        let [mut got, mut sent] = completions(&a, &b, sizes.len(), early);
        // Nothing more comes: the provider halves of the receives were cancelled quietly.
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(200) {
            a.poll(&mut got).expect("poll");
            b.poll(&mut sent).expect("poll");
        }
        assert_eq!((got.len(), sent.len()), (sizes.len(), sizes.len()));
        got.sort_by_key(|c| c.op);
        sent.sort_by_key(|c| c.op);
        for (i, n) in sizes.iter().enumerate() {
            assert!(
                got[i].status.is_ok() && sent[i].status.is_ok(),
                "{got:?} {sent:?}"
            );
            assert_eq!(
                (got[i].len, got[i].tag, sent[i].len),
                (*n, 10 + i as u64, *n)
            );
            assert_eq!(dst[i][..*n], src[i][..], "payload of message {i}");
            assert!(
                dst[i][*n..].iter().all(|&x| x == 0),
                "written past the message"
            );
        }
        assert!(b.inner.lock().rndv.is_empty());
        // Only the small-message pool is left posted on the receiving side.
        let g = a.inner.lock();
        assert!(g.soft.as_ref().expect("soft").posted.is_empty());
        assert!(
            g.ops.values().all(|c| c.role == Role::Pool),
            "provider halves left"
        );
    }

    #[test]
    fn a_large_shm_message_too_big_for_its_receive_fails_the_receive_not_the_send() {
        let Some((a, b, to_a, _)) = linked_pair() else {
            return;
        };
        let mut small = vec![0u8; 40_000];
        a.recv(3, 0, region(&mut small), None, 1).expect("recv");
        let mut big = vec![9u8; 50_000];
        send_all(&a, &b, to_a, 3, &mut big, 2);
        let [got, sent] = completions(&a, &b, 1, Default::default());
        let e = got[0].status.as_ref().unwrap_err().to_string();
        assert!(e.contains("'size'") && e.contains("50000"), "{e}");
        assert!(small.iter().all(|&x| x == 0), "nothing written");
        assert!(sent[0].status.is_ok(), "{:?}", sent[0].status);
    }

    #[test]
    fn where_the_kernel_refuses_copies_large_shm_messages_take_the_provider() {
        let Some((a, b, to_a, _)) = linked_pair() else {
            return;
        };
        a.inner.lock().refuse_cma = true;
        let n = 100_000;
        let mut src: Vec<Vec<u8>> = (0..2u8)
            .map(|k| (0..n).map(|i| (i as u8) ^ k).collect())
            .collect();
        let mut dst = [vec![0u8; n], vec![0u8; n]];
        a.recv(1, 0, region(&mut dst[0]), None, 1).expect("recv");
        send_all(&a, &b, to_a, 1, &mut src[0], 11);
        let [got, sent] = completions(&a, &b, 1, Default::default());
        assert!(
            got[0].status.is_ok() && sent[0].status.is_ok(),
            "{got:?} {sent:?}"
        );
        assert_eq!(dst[0], src[0]);
        // The sender remembers: the next one goes to the provider at once.
        assert!(!b.inner.lock().rndv_ok(to_a.0));
        send_all(&a, &b, to_a, 2, &mut src[1], 12);
        assert!(b.inner.lock().rndv.is_empty(), "no RTS this time");
        a.recv(2, 0, region(&mut dst[1]), None, 2).expect("recv");
        let [got, sent] = completions(&a, &b, 1, Default::default());
        assert!(
            got[0].status.is_ok() && sent[0].status.is_ok(),
            "{got:?} {sent:?}"
        );
        assert_eq!(dst[1], src[1]);
    }

    #[test]
    fn a_large_shm_message_the_receiver_cannot_read_fails_both_sides() {
        let Some((a, b, to_a, _)) = linked_pair() else {
            return;
        };
        // Inaccessible memory (mapped, so no other allocation can take its place): only the
        // receiver's process_vm_readv looks at it, and gets EFAULT.
        let len = 1 << 20;
        // SAFETY: a fresh private anonymous mapping with no access; unmapped below.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        let mut dst = vec![0u8; len];
        a.recv(8, 0, region(&mut dst), None, 1).expect("recv");
        // SAFETY: the region is never dereferenced in this process (the send goes as an RTS).
        let bad = unsafe { Region::from_raw(p as *mut u8, len) };
        assert_eq!(b.send(to_a, 8, bad, None, 2).expect("send"), Posted::Queued);
        let [got, sent] = completions(&a, &b, 1, Default::default());
        let e = got[0].status.as_ref().unwrap_err().to_string();
        assert!(e.contains("receive failed: copying"), "{e}");
        let e = sent[0].status.as_ref().unwrap_err().to_string();
        assert!(e.contains("could not copy"), "{e}");
        // SAFETY: mapped above with this length; nothing refers to it any more.
        unsafe { libc::munmap(p, len) };
    }

    #[test]
    fn a_fallback_to_a_peer_that_has_exited_fails_that_send_not_the_endpoint() {
        let Some((a, b, to_a, _)) = linked_pair() else {
            return;
        };
        a.inner.lock().refuse_cma = true;
        let mut dst = vec![0u8; 100_000];
        a.recv(6, 0, region(&mut dst), None, 1).expect("recv");
        let mut src = vec![3u8; 100_000];
        send_all(&a, &b, to_a, 6, &mut src, 7);
        let mut sink = Vec::new();
        a.poll(&mut sink).expect("poll"); // a answers FALLBACK
        assert!(sink.is_empty(), "{sink:?}");
        let mut child = stand_in(&b, to_a);
        child.kill().expect("kill");
        child.wait().expect("reap");
        let (start, mut out) = (Instant::now(), Vec::new());
        while out.is_empty() {
            b.poll(&mut out).expect("the endpoint goes on");
            assert!(start.elapsed() < Duration::from_secs(5), "never failed");
        }
        assert_eq!(out[0].op, 7);
        let e = out[0].status.as_ref().unwrap_err().to_string();
        assert!(e.contains("has exited"), "{e}");
    }

    #[test]
    fn a_large_shm_send_to_a_peer_that_exits_before_copying_it_fails() {
        let Some((a, b, to_a, _)) = linked_pair() else {
            return;
        };
        let mut big = vec![1u8; 70_000];
        send_all(&a, &b, to_a, 4, &mut big, 5);
        // a never receives it; its process "exits" (a spawned process stands in for it).
        let mut child = stand_in(&b, to_a);
        let mut out = Vec::new();
        b.poll(&mut out).expect("poll");
        assert!(out.is_empty(), "still waiting for the ACK: {out:?}");
        child.kill().expect("kill");
        child.wait().expect("reap");
        let start = Instant::now();
        while out.is_empty() {
            b.poll(&mut out).expect("poll");
            assert!(start.elapsed() < Duration::from_secs(5), "never failed");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(out[0].op, 5);
        let e = out[0].status.as_ref().unwrap_err().to_string();
        assert!(e.contains("has exited before taking the message"), "{e}");
        assert!(b.inner.lock().rndv.is_empty());
    }

    #[test]
    fn a_large_shm_send_posted_after_its_peer_exited_fails() {
        // Large sends skip the pidfd poll: one posted before the watcher has seen the exit
        // goes out as an RTS and must fail on poll; one posted after fails at once. Either
        // way it fails, and nothing stays pending.
        let Some((_a, b, to_a, _)) = linked_pair() else {
            return;
        };
        let mut child = stand_in(&b, to_a);
        child.kill().expect("kill");
        child.wait().expect("reap");
        let mut big = vec![1u8; 70_000];
        let e = match b.send(to_a, 4, region(&mut big), None, 5) {
            Err(e) => e.to_string(),
            Ok(posted) => {
                assert_eq!(
                    posted,
                    Posted::Queued,
                    "an RTS is never busy on an empty ring"
                );
                let (start, mut out) = (Instant::now(), Vec::new());
                while out.is_empty() {
                    b.poll(&mut out).expect("poll");
                    assert!(start.elapsed() < Duration::from_secs(5), "never failed");
                    std::thread::sleep(Duration::from_millis(1));
                }
                assert_eq!(out[0].op, 5);
                out[0].status.as_ref().unwrap_err().to_string()
            }
        };
        assert!(e.contains("has exited"), "{e}");
        assert!(b.inner.lock().rndv.is_empty());
    }

    /// Post `data` to `to` with `tag` (op `op`), polling both ends while the provider is busy.
    fn send_busy(
        a: &FabricTransport,
        b: &FabricTransport,
        to: Peer,
        tag: u64,
        data: &mut [u8],
        op: u64,
    ) {
        let start = Instant::now();
        let mut seen = [Vec::new(), Vec::new()];
        while b.send(to, tag, region(data), None, op).expect("send") == Posted::Busy {
            a.poll(&mut seen[0]).expect("poll");
            b.poll(&mut seen[1]).expect("poll");
            assert!(start.elapsed() < Duration::from_secs(10), "send stays busy");
        }
        assert!(seen[0].is_empty() && seen[1].is_empty(), "{seen:?}");
    }

    /// A pair of native TCP endpoints (None: skip) where `b` has sent `a` messages of `sizes`
    /// (tags 10, 11, ...; ops 100, 101, ...) before their receives, then one more, whose
    /// receive (op 1) has completed behind them: the payloads sent and the completions so far.
    #[allow(clippy::type_complexity)]
    fn stopped_then_claimed(
        sizes: &[usize],
    ) -> Option<(
        FabricTransport,
        FabricTransport,
        Vec<Vec<u8>>,
        [Vec<Completion>; 2],
    )> {
        // libfabric's native TCP endpoint keeps at most 4 small unexpected messages per
        // connection and stops reading the connection at any other: without claiming, the
        // receive of the last message never completed (2 s), whatever the sizes.
        let (a, b) = pair("net", Some("lo"))?;
        let to_a = b.insert_peer(&a.address()).expect("insert");
        let mut src: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, n)| (0..*n).map(|j| (j * 13 + i) as u8).collect())
            .collect();
        for (i, s) in src.iter_mut().enumerate() {
            send_busy(&a, &b, to_a, 10 + i as u64, s, 100 + i as u64);
        }
        let mut last = vec![7u8; 8];
        send_busy(&a, &b, to_a, 1 << 40, &mut last, 200);
        let mut got = vec![0u8; 8];
        a.recv(1 << 40, 0, region(&mut got), None, 1).expect("recv");
        let start = Instant::now();
        let mut out = [Vec::new(), Vec::new()];
        while !out[0].iter().any(|c: &Completion| c.op == 1) {
            a.poll(&mut out[0]).expect("poll");
            b.poll(&mut out[1]).expect("poll");
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "the message behind the stopped ones never arrived: {:?}",
                out[0]
            );
        }
        assert_eq!(got, last);
        assert!(a.inner.lock().claimed() > 0, "nothing was claimed");
        Some((a, b, src, out))
    }

    #[test]
    fn messages_that_stop_a_native_tcp_connection_are_claimed_and_received_in_order() {
        let sizes = [100usize, 100, 4096, 0, 100, 100_000, 100, 3 << 20, 100];
        let Some((a, b, src, out)) = stopped_then_claimed(&sizes) else {
            return;
        };
        // The claimed messages, received late and out of order; the one of 4096 bytes into
        // a receive too small for it, one into a buffer the transport owns.
        let mut dst: Vec<Vec<u8>> = sizes.iter().map(|n| vec![0u8; *n]).collect();
        dst[2].truncate(4000);
        for (i, d) in dst.iter_mut().enumerate().rev() {
            let (tag, op) = (10 + i as u64, 10 + i as u64);
            if i == 4 {
                a.recv_owned(tag, 0, sizes[i], op).expect("recv_owned");
            } else {
                a.recv(tag, 0, region(d), None, op).expect("recv");
            }
        }
        let out = completions(&a, &b, sizes.len() + 1, out);
        assert!(out[1].iter().all(|c| c.status.is_ok()), "{:?}", out[1]);
        for c in out[0].iter().filter(|c| c.op >= 10) {
            let i = c.op as usize - 10;
            if i == 2 {
                let e = c.status.as_ref().unwrap_err().to_string();
                assert!(e.contains("'size'"), "{e}");
                continue;
            }
            assert!(c.status.is_ok(), "op {}: {:?}", c.op, c.status);
            assert_eq!(c.len, sizes[i], "op {}", c.op);
            let data = if i == 4 {
                c.data.as_ref().expect("owned")
            } else {
                &dst[i]
            };
            assert!(data[..] == src[i][..], "payload of message {i}");
        }
    }

    /// `b` sends `a` the large message `big` (tag 1, op 100) and then `small` (tag 2, op
    /// 101); `a` receives only `small` (into `got_small`, op 2), and polls until the claim of
    /// `big` is under way. The completions so far.
    fn claiming(
        a: &FabricTransport,
        b: &FabricTransport,
        big: &mut [u8],
        small: &mut [u8],
        got_small: &mut [u8],
    ) -> [Vec<Completion>; 2] {
        let to_a = b.insert_peer(&a.address()).expect("insert");
        send_busy(a, b, to_a, 1, big, 100);
        send_busy(a, b, to_a, 2, small, 101);
        a.recv(2, 0, region(got_small), None, 2).expect("recv");
        let start = Instant::now();
        let mut out = [Vec::new(), Vec::new()];
        loop {
            a.poll(&mut out[0]).expect("poll");
            if a.inner.lock().claims.as_ref().expect("claims").inflight == Some(1) {
                return out;
            }
            b.poll(&mut out[1]).expect("poll");
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "no claim: {out:?}"
            );
        }
    }

    #[test]
    fn a_receive_posted_while_its_message_is_being_claimed_waits_for_it() {
        let Some((a, b)) = pair("net", Some("lo")) else {
            return;
        };
        let n = 32 << 20;
        let mut big: Vec<u8> = (0..n).map(|j| (j * 7) as u8).collect();
        let (mut small, mut got_small) = (vec![5u8; 16], vec![0u8; 16]);
        let mut out = claiming(&a, &b, &mut big, &mut small, &mut got_small);
        // Two receives for it: the first gets it, the second waits too and is cancelled.
        let mut got = vec![0u8; n];
        let mut spare = vec![0u8; n];
        a.recv(1, 0, region(&mut got), None, 1).expect("recv");
        a.recv(1, 0, region(&mut spare), None, 3).expect("recv");
        assert_eq!(a.inner.lock().claims.as_ref().unwrap().waiting.len(), 2);
        a.cancel(3);
        let start = Instant::now();
        while out[0].len() < 3 || out[1].len() < 2 {
            a.poll(&mut out[0]).expect("poll");
            b.poll(&mut out[1]).expect("poll");
            assert!(start.elapsed() < Duration::from_secs(10), "{out:?}");
        }
        let by_op = |op| out[0].iter().find(|c| c.op == op).expect("completion");
        assert!(by_op(1).status.is_ok() && by_op(1).len == n);
        assert!(got == big, "payload of the claimed message");
        assert!(by_op(2).status.is_ok() && got_small == small);
        let e = by_op(3).status.as_ref().unwrap_err().to_string();
        assert!(e.contains("cancelled"), "{e}");
        assert!(spare.iter().all(|&x| x == 0));
        assert!(out[1].iter().all(|c| c.status.is_ok()), "{:?}", out[1]);
        let g = a.inner.lock();
        let c = g.claims.as_ref().unwrap();
        assert!(c.waiting.is_empty() && c.taken.is_empty() && c.inflight.is_none());
    }

    #[test]
    fn only_endpoints_of_the_native_tcp_provider_claim() {
        for (provider, claims) in [("net", true), ("tcp", false), ("shm", false)] {
            let domain = (provider != "shm").then_some("lo");
            if let Some((a, _)) = pair(provider, domain) {
                assert_eq!(a.inner.lock().claims.is_some(), claims, "{provider}");
            }
        }
    }

    #[test]
    fn without_a_named_provider_the_engines_take_the_native_tcp_endpoint_and_the_plugin_rxm() {
        // libfabric 1.17 lists tcp;ofi_rxm before net; 1.18 names the native one tcp.
        fn pick_for<'a>(ps: &[&'a str], for_use: Use) -> Option<&'a str> {
            ps.iter()
                .filter_map(|p| provider_rank(p, for_use).map(|r| (r, *p)))
                .min()
                .map(|(_, p)| p)
        }
        let pick = |ps: &[&'static str]| pick_for(ps, Use::Engines);
        assert_eq!(pick(&["shm", "tcp;ofi_rxm", "net"]), Some("net"));
        assert_eq!(pick(&["tcp;ofi_rxm", "tcp", "shm"]), Some("tcp"));
        assert_eq!(pick(&["shm", "tcp;ofi_rxm"]), Some("tcp;ofi_rxm"));
        assert_eq!(pick(&["shm", "efa", "net"]), Some("efa"));
        assert_eq!(pick(&["udp;ofi_rxd", "shm"]), Some("shm"));
        assert_eq!(pick(&["sockets"]), None);
        // The plugin keeps a tcp provider (rxm on 1.17) before net.
        let plugin = |ps: &[&'static str]| pick_for(ps, Use::Plugin);
        assert_eq!(plugin(&["shm", "tcp;ofi_rxm", "net"]), Some("tcp;ofi_rxm"));
        assert_eq!(plugin(&["shm", "net"]), Some("shm"));
        assert_eq!(plugin(&["efa", "tcp;ofi_rxm"]), Some("efa"));
        // What this machine's libfabric offers, unnamed: for the engines a native TCP
        // endpoint where there is one (which claims what stops its connections), for the
        // plugin a tcp provider.
        let cfg = Config::from_lookup(|_| None).expect("config");
        let (Ok(engines), Ok(plugin)) = (discover(&cfg, Use::Engines), discover(&cfg, Use::Plugin))
        else {
            return;
        };
        let has = |p: &str| engines.providers.iter().any(|x| x == p);
        if has("net")
            && has("tcp;ofi_rxm")
            && !engines.providers.iter().any(|p| p.starts_with("efa"))
        {
            assert_eq!(
                engines.chosen.as_deref(),
                Some("net"),
                "{:?}",
                engines.providers
            );
            assert_eq!(
                plugin.chosen.as_deref(),
                Some("tcp;ofi_rxm"),
                "{:?}",
                plugin.providers
            );
        }
    }

    #[test]
    fn receives_that_match_any_tag_get_claimed_and_held_messages_in_the_order_sent() {
        // Of the messages sent before their receives, the provider keeps the first small ones
        // itself and stops at the next; claiming takes that one and the rest. A receive that
        // matches several must still get the oldest.
        let sizes = [100usize, 100, 100, 100, 100, 100, 200_000, 100, 100];
        let Some((a, b, _, out)) = stopped_then_claimed(&sizes) else {
            return;
        };
        let mut dst: Vec<Vec<u8>> = sizes.iter().map(|_| vec![0u8; 200_000]).collect();
        for (i, d) in dst.iter_mut().enumerate() {
            a.recv(0, 0xff, region(d), None, 10 + i as u64)
                .expect("recv");
        }
        let out = completions(&a, &b, sizes.len() + 1, out);
        let mut by_op: Vec<&Completion> = out[0].iter().filter(|c| c.op >= 10).collect();
        by_op.sort_by_key(|c| c.op);
        let tags: Vec<u64> = by_op.iter().map(|c| c.tag).collect();
        let want: Vec<u64> = (10..10 + sizes.len() as u64).collect();
        assert_eq!(tags, want, "the receives, in posted order, got these tags");
    }

    #[test]
    fn a_claim_cut_off_by_its_sender_fails_the_receive_that_waited_for_it() {
        let Some((a, b)) = pair("net", Some("lo")) else {
            return;
        };
        let n = 64 << 20;
        let mut big = vec![3u8; n];
        let (mut small, mut got_small) = (vec![5u8; 16], vec![0u8; 16]);
        let mut out = claiming(&a, &b, &mut big, &mut small, &mut got_small);
        let mut got = vec![0u8; n];
        a.recv(1, 0, region(&mut got), None, 1).expect("recv");
        // The sender goes away with most of the message still unsent.
        drop(b);
        let start = Instant::now();
        while !out[0].iter().any(|c| c.op == 1) {
            // The endpoint may report the broken connection itself; the receive must end.
            let _ = a.poll(&mut out[0]);
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the waiting receive never ended: {:?}",
                out[0]
            );
        }
        let c = out[0].iter().find(|c| c.op == 1).expect("found");
        let e = c.status.as_ref().unwrap_err().to_string();
        assert!(e.contains("claimed message"), "{e}");
        let g = a.inner.lock();
        let cl = g.claims.as_ref().unwrap();
        assert!(cl.inflight.is_none() && cl.waiting.is_empty());
    }
}

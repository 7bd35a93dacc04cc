//! Which provider and which of its domains the endpoints open: `discover`, the devices it
//! finds (`FabricDevice`) and what the running libfabric can do (`runtime_version`,
//! `inject_safe`).
use super::fid::{Info, InfoList};
use super::{check, cstr, sys, tuning};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::transport::Caps;
use std::ffi::CString;
use std::os::raw::c_int;
use std::ptr;

/// The API version we ask for: the oldest we support (Debian bookworm's 1.17).
const API_VERSION: u32 = (1 << 16) | 17;

/// A device: one domain of the chosen provider, with what was probed of it.
pub struct FabricDevice {
    pub(super) info: Info,
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

/// What discovery found: every provider offering tagged RDM endpoints, and the devices of the
/// one chosen.
#[derive(Debug, Default)]
pub struct Discovery {
    pub providers: Vec<String>,
    pub chosen: Option<String>,
    pub devices: Vec<FabricDevice>,
    /// Domains of the chosen provider that were left out (loopback by default), for diagnostics.
    pub skipped: Vec<String>,
}

/// The libfabric version the process runs against, as "major.minor" (what ranks must agree
/// on).
pub fn runtime_version() -> String {
    let v = runtime_code();
    format!("{}.{}", v >> 16, v & 0xffff)
}

/// The libfabric version the process runs against as `FI_VERSION(major, minor)`.
pub(super) fn runtime_code() -> u32 {
    // SAFETY: fi_version has no arguments and no preconditions.
    unsafe { sys::fi_version() }
}

/// The libfabric release the process runs against, in full ("2.1.0"), as the library itself
/// reports it (`fi_tostr` of `FI_TYPE_VERSION`).
pub fn runtime_release() -> String {
    let mut buf = [0 as std::os::raw::c_char; 128];
    // fi_tostr_r reads nothing through `data` for FI_TYPE_VERSION but refuses NULL.
    let data = 0u64;
    // SAFETY: buf is writable for its length; data points to a live u64; fi_tostr_r writes a
    // NUL-terminated string of at most len bytes into buf and returns it, or NULL.
    let p = unsafe {
        sys::fi_tostr_r(
            buf.as_mut_ptr(),
            buf.len(),
            (&data as *const u64).cast(),
            sys::fi_type_FI_TYPE_VERSION,
        )
    };
    if p.is_null() {
        return runtime_version();
    }
    cstr(p)
}

/// The libfabric headers this library was built against ("1.17.0"), from `rdma/fabric.h`.
pub fn header_version() -> String {
    format!(
        "{}.{}.{}",
        sys::FI_MAJOR_VERSION,
        sys::FI_MINOR_VERSION,
        sys::FI_REVISION_VERSION
    )
}

/// Whether `fi_tinject` is safe on this provider. shm before libfabric 1.19 keeps an unexpected
/// inject message in the sender's bounce buffer, which the sender reuses once inject returns:
/// a later message overwrote an earlier one in our tests (ofiwg/libfabric#9143, fixed in 1.19
/// by #9187). There, small sends go through fi_tsend, whose completion waits for the copy.
pub(super) fn inject_safe(provider: &str) -> bool {
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
/// shm. The native endpoint goes before rxm for speed: it is faster at every size in raw
/// `fi_pingpong` (figures in `docs/performance.md`).
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

/// The providers of a `fi_getinfo` list, each once, in the list's order.
fn provider_names(list: &InfoList) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let mut cur = list.0;
    while !cur.is_null() {
        // SAFETY: cur is an element of the list we own; fabric_attr is always allocated.
        let p = cstr(unsafe { (*(*cur).fabric_attr).prov_name });
        if !names.contains(&p) {
            names.push(p);
        }
        // SAFETY: as above.
        cur = unsafe { (*cur).next };
    }
    names
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

/// The entry of `list` for `provider`'s domain `dom` that offers FI_HMEM, with the address
/// format of `like`.
fn hmem_entry(
    list: &InfoList,
    provider: &str,
    dom: &str,
    like: *mut sys::fi_info,
) -> Option<*mut sys::fi_info> {
    // SAFETY: like is an element of a list the caller owns.
    let format = unsafe { (*like).addr_format };
    let mut cur = list.0;
    while !cur.is_null() {
        // SAFETY: cur is an element of the list we own; its attributes are allocated.
        unsafe {
            let i = &*cur;
            if cstr((*i.fabric_attr).prov_name) == provider
                && cstr((*i.domain_attr).name) == dom
                && i.caps & sys::FI_HMEM != 0
                && i.addr_format == format
            {
                return Some(cur);
            }
            cur = i.next;
        }
    }
    None
}

pub(super) fn getinfo_caps(provider: Option<&str>, extra: u64) -> Result<InfoList> {
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
        // Device memory is registered before use, as FI_MR_HMEM asks (shm requires it).
        let hmem_mode = if extra & sys::FI_HMEM != 0 {
            sys::FI_MR_HMEM
        } else {
            0
        };
        (*h.domain_attr).mr_mode = (sys::FI_MR_LOCAL
            | sys::FI_MR_VIRT_ADDR
            | sys::FI_MR_ALLOCATED
            | sys::FI_MR_PROV_KEY
            | sys::FI_MR_ENDPOINT
            | hmem_mode) as c_int;
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

/// Find the provider and its devices, as the configuration asks. A provider the
/// configuration names (`net` read as the native TCP endpoint on every libfabric, see
/// `names`) that is not offered here is an invalid argument naming the variable that named
/// it (`Config::provider_var`) and the providers that do exist.
pub fn discover(cfg: &Config, for_use: Use) -> Result<Discovery> {
    let Some(want) = &cfg.provider else {
        return discover_resolved(cfg, for_use);
    };
    let resolved = Config {
        provider: Some(super::names::resolve(want, cfg.provider_var)),
        ..cfg.clone()
    };
    let disc = discover_resolved(&resolved, for_use)?;
    if disc.chosen.is_some() {
        return Ok(disc);
    }
    let found = match getinfo(None) {
        Ok(list) => provider_names(&list),
        Err(e) => vec![format!("(none listed: {e})")],
    };
    // libfabric itself hides every provider FI_PROVIDER does not name.
    let hidden = match std::env::var("FI_PROVIDER") {
        Ok(v) if !v.trim().is_empty() => {
            format!("; FI_PROVIDER={v} hides the other providers from libfabric")
        }
        _ => String::new(),
    };
    Err(Error::arg(
        cfg.provider_var,
        format!(
            "{want}: no such provider here (libfabric {}; providers found: {}{hidden})",
            runtime_release(),
            if found.is_empty() {
                "none".to_string()
            } else {
                found.join(", ")
            }
        ),
    ))
}

fn discover_resolved(cfg: &Config, for_use: Use) -> Result<Discovery> {
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
    let mut disc = Discovery {
        providers: provider_names(&list),
        ..Discovery::default()
    };
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
        let mut d = discover_resolved(&named, for_use)?;
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
    // The plugin's endpoints, and the engines' unless FABRICOLL_DEVICE_DIRECT=off, may take
    // device memory where CUDA is up in this process and the domain offers FI_HMEM: they are
    // opened from its FI_HMEM entry, without which no CUDA registration can work (whether one
    // does is probed by the plugin, `plugin::gpu`, and by the C API's device calls,
    // `coll::device`).
    let hmem_list = ((for_use == Use::Plugin
        || cfg.device_direct != crate::config::DeviceDirect::Off)
        && crate::cuda::probe().driver().is_some())
    .then(|| getinfo_caps(Some(&chosen), sys::FI_HMEM).ok())
    .flatten();
    for (dom, e) in order {
        let e = hmem_list
            .as_ref()
            .and_then(|l| hmem_entry(l, &chosen, &dom, e))
            .unwrap_or(e);
        // SAFETY: e is an element of the list we own; fi_dupinfo copies it (and not its next).
        let dup = unsafe { sys::fi_dupinfo(e) };
        if dup.is_null() {
            return Err(Error::System("fi_dupinfo returned NULL".into()));
        }
        let info = Info(dup);
        // An FI_HMEM entry opens its domain only with FI_MR_HMEM in its mode (libfabric 2.x's
        // shm checks it at fi_domain, though fi_getinfo may leave the bit out when the hints
        // ask for other modes too); we register device memory before use, which is what the
        // bit asks.
        // SAFETY: dup is a complete fi_info we own; its domain attributes are allocated.
        unsafe {
            if (*dup).caps & sys::FI_HMEM != 0 {
                (*(*dup).domain_attr).mr_mode |= sys::FI_MR_HMEM as c_int;
            }
        }
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
        if for_use == Use::Plugin {
            // Only the plugins' endpoints ask for RMA, and only where the domain offers it.
            super::rma::probe(dup, &mut caps);
        }
        crate::transport::require_tag_bits(&chosen, &dom, tag_format)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::fabric::discover;
    use crate::transport::fabric::Use;

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
        let (engines, plugin) = match (discover(&cfg, Use::Engines), discover(&cfg, Use::Plugin)) {
            (Ok(e), Ok(p)) => (e, p),
            (Err(e), _) | (_, Err(e)) => {
                crate::testing::skip(
                    "without_a_named_provider_the_engines_take_the_native_tcp_endpoint_and_the_plugin_rxm",
                    &format!("discovery failed here: {e}"),
                );
                return;
            }
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
}

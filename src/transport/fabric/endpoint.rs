//! Opening an endpoint: the fabric, domain, address vector and completion queue, one or two
//! enabled endpoints bound to them, peers inserted into the address vector, and memory
//! registration.
use super::discovery::runtime_version;
use super::fid::{scopeguard, DomainFids, MrFid};
use super::shm::matching::{Soft, POOL_BUFS};
use super::shm::{fastbox, siblings, watch, ShmPath};
use super::tender::Tender;
use super::FI_ADDR_UNSPEC;
use super::{check, claim, discovery::FabricDevice, strerror, sys, FabricTransport, Inner};
use crate::error::{Error, Result};
use crate::transport::{Mr, Peer, Region};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use std::collections::{HashMap, VecDeque};
use std::mem::ManuallyDrop;
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::Arc;

impl FabricTransport {
    /// Open an endpoint on `dev`.
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
        if let Some(r) = caps.rma_caps.as_mut() {
            r.inject_size = super::rma::inject_size(ep, r.inject_size);
        }
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
        if let Some(n) = &shm_name {
            siblings::opened(n);
        }
        Ok(FabricTransport {
            caps,
            addr: name,
            wait_fd,
            inner: ManuallyDrop::new(Arc::new(Mutex::new(Inner {
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
                rma_order: VecDeque::new(),
                shm: ShmPath::new(shm_name),
                claims,
                tended_error: None,
            }))),
            tender: None,
        })
        .and_then(|mut t: FabricTransport| {
            if !t.caps.inject_ok {
                let mut g = t.inner.lock();
                g.shm.soft = Some(Soft {
                    small: t.caps.inject_size.max(256),
                    ..Default::default()
                });
                for _ in 0..POOL_BUFS {
                    g.post_pool(None)?;
                }
                if let (true, Some(name)) = (fastbox, g.shm.name.clone()) {
                    match fastbox::Inbox::create(&name) {
                        Ok(ib) => g.shm.inbox = Some(ib),
                        Err(e) => log::warn!("no shared-memory fastbox for {name}: {e}"),
                    }
                }
                let direct_channel = g.shm.inbox.is_some();
                drop(g);
                t.caps.direct_channel = direct_channel;
                log::info!(
                    "{}: small messages are matched in software (libfabric {} shm before 1.19 loses unexpected inject messages, ofiwg/libfabric#9143)",
                    t.caps.domain,
                    runtime_version()
                );
            }
            if let (true, Some(fd)) = (t.inner.lock().claims.is_some(), t.wait_fd) {
                t.tender = Tender::start(Arc::clone(&t.inner), &t.caps, fd);
            }
            Ok(t)
        })
    }

    /// `Transport::insert_peer`: the peer in the address vector, and its shm paths.
    pub(super) fn add_peer(&self, addr: &[u8]) -> Result<Peer> {
        let mut g = self.inner.lock();
        if let Some(p) = g.peers.get(addr) {
            return Ok(Peer(*p));
        }
        // An endpoint of this process (ranks as threads) that was dropped: the provider would
        // map its region through a stale pointer (`siblings`).
        let sibling = g
            .shm
            .name
            .as_ref()
            .and_then(|_| watch::endpoint_in_address(addr))
            .filter(|n| watch::of_this_process(n));
        if let Some(n) = sibling.as_deref().filter(|n| siblings::dropped(n)) {
            return Err(Error::Remote(format!(
                "the peer endpoint {n} of this process was closed (its communicator destroyed)"
            )));
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
        if let (Some(me), Some(peer)) = (&g.shm.name, &sibling) {
            siblings::link(me, peer);
        }
        if g.shm.name.is_some() {
            if let Some(w) = watch::PeerWatch::of_address(addr) {
                g.shm.watch.insert(fi_addr, w);
            }
        }
        if g.shm.inbox.is_some() {
            // Our own inbox says we match in software, so the peer (same library, same
            // libfabric) reads its inbox; without one it gets the provider path.
            if let Some(peer) = watch::endpoint_in_address(addr) {
                let id = fastbox::sender_id(&peer);
                g.shm.peer_senders.insert(fi_addr, id);
                g.shm.sender_peers.insert(id, fi_addr);
            }
            if let Some(name) = fastbox::inbox_of_address(addr) {
                let me = g.shm.name.clone().unwrap_or_default();
                match fastbox::Outbox::open(&name, &me) {
                    Ok(ob) => {
                        g.shm.outbox.insert(fi_addr, ob);
                        g.hello(fi_addr)?;
                    }
                    Err(e) => log::debug!("peer {name}: no fastbox ({e})"),
                }
            }
        }
        Ok(Peer(fi_addr))
    }

    /// `Transport::register`.
    pub(super) fn register_region(&self, region: Region) -> Result<Mr> {
        if !self.caps.mr_local {
            return Ok(Mr {
                desc: 0,
                region,
                keep: None,
                key: None,
                device: None,
            });
        }
        let access = (sys::FI_SEND | sys::FI_RECV) as u64;
        let (keep, desc) = self.mr_reg(region, access, 0)?;
        Ok(Mr {
            desc,
            region,
            keep: Some(Box::new(keep)),
            key: None,
            device: None,
        })
    }

    /// Register exactly `region` with `access` and `requested_key` (`fi_mr_reg`), bound to
    /// the endpoint where the provider asks for it: the registration and its descriptor.
    pub(super) fn mr_reg(
        &self,
        region: Region,
        access: u64,
        requested_key: u64,
    ) -> Result<(MrFid, usize)> {
        self.mr_reg_try(region, access, requested_key)?
            .ok_or_else(|| {
                Error::System(format!(
                    "fi_mr_reg on {}: key {requested_key:#x} is in use",
                    self.caps.domain
                ))
            })
    }

    /// `mr_reg`, with None where the domain already has a registration with `requested_key`
    /// (`-FI_ENOKEY`), so that the caller may try another key.
    pub(super) fn mr_reg_try(
        &self,
        region: Region,
        access: u64,
        requested_key: u64,
    ) -> Result<Option<(MrFid, usize)>> {
        let g = self.inner.lock();
        let mut mr: *mut sys::fid_mr = ptr::null_mut();
        // SAFETY: the domain is open; the region is valid memory per its contract.
        let rc = unsafe {
            sys::fi_mr_reg(
                g.dom.domain,
                region.addr() as *const c_void,
                region.len(),
                access,
                0,
                requested_key,
                0,
                &mut mr,
                ptr::null_mut(),
            )
        };
        if rc as i64 == -(sys::FI_ENOKEY as i64) {
            return Ok(None);
        }
        let what = || {
            format!(
                "fi_mr_reg of {} bytes at {:#x} on {}",
                region.len(),
                region.addr(),
                self.caps.domain
            )
        };
        self.adopt_mr(&g, rc as i64, what, mr).map(Some)
    }

    /// The registration call that returned `rc` and `mr` (`what` names it in an error): kept,
    /// bound to the endpoint and enabled where the provider asks for that (`FI_MR_ENDPOINT`);
    /// with its descriptor.
    pub(super) fn adopt_mr(
        &self,
        g: &Inner,
        rc: i64,
        what: impl FnOnce() -> String,
        mr: *mut sys::fid_mr,
    ) -> Result<(MrFid, usize)> {
        if rc < 0 {
            check(&what(), rc)?;
        }
        let keep = MrFid {
            mr,
            _domain: g.dom.clone(),
        };
        let desc = self.enable_mr(g, mr)?;
        Ok((keep, desc))
    }

    fn enable_mr(&self, g: &Inner, mr: *mut sys::fid_mr) -> Result<usize> {
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
        Ok(unsafe { sys::fi_mr_desc(mr) } as usize)
    }
}

/// An enabled endpoint of `info`, bound to `av` and `cq`, and its shared-memory name when `shm`
/// (see `watch::name_endpoint`); `what` tells its errors apart.
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
        Some(watch::name_endpoint(ep)?)
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
/// receiving endpoints, each direction has its own, which made large exchanges faster
/// (figures in `docs/performance.md`).
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

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::*;
    use crate::config::Config;
    use crate::transport::fabric::discover;
    use crate::transport::fabric::Use;
    use crate::transport::Completion;
    use crate::transport::{Posted, Transport};
    use std::time::{Duration, Instant};

    #[test]
    fn messages_that_arrive_before_their_receive_match_with_our_widest_tags() {
        // libfabric 1.17's net provider keeps tag bit 63 for itself: a message whose tag had it
        // set and that arrived before its receive was never matched. Our tags use bits 0..=62;
        // the widest ones must match however early they arrive, over both TCP providers.
        let widest = (1u64 << crate::transport::TAG_BITS) - 1;
        let tags = [widest, 1 << 62, widest >> 1, 7];
        let sizes = [8usize, 300, 0, 70_000];
        let mut tried = 0;
        for provider in ["net", "tcp"] {
            let Some((a, b)) = try_pair(provider, Some("lo")) else {
                continue;
            };
            tried += 1;
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
        if tried == 0 {
            skip("neither net nor tcp is offered on lo here");
        }
    }

    /// The TCP sockets of this process in state ESTABLISHED with one end at the port of
    /// `addrs` (sockaddr_in/in6 endpoint addresses): other tests' connections do not count.
    fn established_sockets(addrs: &[Vec<u8>]) -> usize {
        let ports: Vec<u16> = addrs
            .iter()
            .filter(|a| a.len() >= 4)
            .map(|a| u16::from_be_bytes([a[2], a[3]]))
            .collect();
        crate::testing::tcp_connections()
            .iter()
            .filter(|(l, r)| ports.contains(&l.port()) || ports.contains(&r.port()))
            .count()
    }

    #[test]
    fn sends_share_the_receiving_endpoint_unless_a_second_one_is_asked_for_and_made() {
        // Endpoint values only compared, never used.
        let (rx, tx) = (
            std::ptr::dangling_mut::<sys::fid_ep>(),
            16 as *mut sys::fid_ep,
        );
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
        assert!(!a.caps().direct_channel, "no direct channel over net");
        for t in [&a, &b] {
            let g = t.inner.lock();
            assert!(g.tx_ep != g.ep, "a send endpoint of its own");
        }
        let ends = [a.address(), b.address()];
        let before = established_sockets(&ends);
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
        assert_eq!(established_sockets(&ends) - before, 4);
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
}

//! Ranks as threads of one process on two "hosts" (coll_tiered.rs runs them as processes): the
//! layout learnt from the ranks' addresses, and the device hint spreading their endpoints.
use super::*;
/// In one process: ranks as threads with their own `FABRICOLL_HOST`, over endpoints of
/// `open_endpoint`; the layout comes from the addresses (`Comm::new`).
#[test]
fn threads_on_two_hosts_learn_the_layout_from_their_addresses() {
    let test = "threads_on_two_hosts_learn_the_layout_from_their_addresses";
    let hosts = ["x", "y", "x"];
    let cfgs: Vec<Config> = hosts
        .iter()
        .map(|h| {
            let mut c = common::fixed_model_on(Some("net"), Some("lo"), 20000);
            c.host = Some(h.to_string());
            c
        })
        .collect();
    let eps: Vec<Arc<dyn Transport>> = match cfgs.iter().map(coll::open_endpoint).collect() {
        Ok(e) => e,
        Err(e) => return skip(test, &format!("no net or shm endpoint ({e})")),
    };
    assert_eq!(eps[0].caps().provider, native_tcp());
    let intra = eps[0].caps().intra.clone().expect("two fabrics");
    assert!(intra.provider.starts_with("shm"), "{}", intra.provider);
    let addrs: Vec<Vec<u8>> = eps.iter().map(|e| e.address()).collect();
    let comms: Vec<Comm> = eps
        .into_iter()
        .enumerate()
        .map(|(r, e)| Comm::new(r, e, &addrs, &cfgs[r]).unwrap())
        .collect();
    assert_eq!(comms[1].hosts().sizes(3), vec![2, 1]);
    assert_eq!(comms[0].provider_to(2), intra.provider);
    assert_eq!(comms[0].provider_to(1), native_tcp());
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || {
                for coll in Collective::ALL {
                    assert!(check_one(c, None, coll, 1000));
                }
            });
        }
    });
    // A split learns its own layout from the envelopes: ranks 2, 1, 0 on hosts x, y, x.
    let cfgs = &cfgs;
    let parts: Vec<Comm> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| s.spawn(move || c.split(0, -(r as i32), &cfgs[r]).unwrap().unwrap()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(parts[0].rank, 2);
    assert_eq!(parts[0].hosts(), algo::Hosts::from_labels(&["x", "y", "x"]));
    assert_eq!(
        parts[0].provider_to(0),
        intra.provider,
        "new rank 0 is old rank 2"
    );
    std::thread::scope(|s| {
        for c in &parts {
            s.spawn(move || assert!(check_one(c, None, Collective::AllReduce, 100)));
        }
    });
    // FABRICOLL_INTRA_PROVIDER=same: one fabric, as before.
    let mut same = cfgs[0].clone();
    same.intra_provider = None;
    let one = coll::open_endpoint(&same).unwrap();
    assert!(one.caps().intra.is_none() && one.caps().provider == native_tcp());
    // An intra provider that was set and does not exist names the variable and the way out;
    // the default one, where it cannot be had, leaves the network for every peer.
    let mut bad = cfgs[0].clone();
    bad.intra_provider = Some("nosuch".into());
    bad.intra_provider_default = true;
    let one = coll::open_endpoint(&bad).expect("the network for every peer");
    assert!(one.caps().intra.is_none() && one.caps().provider == native_tcp());
    bad.intra_provider_default = false;
    let e = coll::open_endpoint(&bad)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("FABRICOLL_INTRA_PROVIDER") && e.contains("same"),
        "{e}"
    );
}

/// Several devices: the network provider's endpoint takes device `hint mod n` of those
/// FABRICOLL_DOMAIN lists, in order (here the interfaces of this machine).
#[test]
fn the_device_hint_spreads_endpoints_over_the_listed_devices() {
    let test = "the_device_hint_spreads_endpoints_over_the_listed_devices";
    let probe = common::fixed_model(Some("net"), 20000);
    let domains: Vec<String> =
        match nccl_net_fabricoll::transport::fabric::discover(&probe, Use::Engines) {
            Ok(d) => {
                let mut v: Vec<String> = d.devices.iter().map(|x| x.caps.domain.clone()).collect();
                v.extend(d.skipped);
                v
            }
            Err(e) => return skip(test, &format!("no net provider ({e})")),
        };
    if domains.len() < 2 {
        return skip(test, &format!("net has one device here ({domains:?})"));
    }
    let mut cfg = probe.clone();
    cfg.domains = Some(domains.clone());
    for hint in 0..2 * domains.len() + 1 {
        let t = coll::open_endpoint_on(&cfg, hint).unwrap();
        assert_eq!(
            t.caps().domain,
            domains[hint % domains.len()],
            "hint {hint}"
        );
        assert!(t.caps().intra.is_some(), "the intra fabric comes along");
    }
}

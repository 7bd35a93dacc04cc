//! fabricoll-info: the libfabric providers found, each device with the properties NCCL will
//! see, and the resolved configuration.
use nccl_net_fabricoll::config::{self, Config, VARS};
use nccl_net_fabricoll::plugin::Plugin;
use nccl_net_fabricoll::transport::fabric;

fn main() {
    let cfg = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fabricoll-info: {e}");
            std::process::exit(2);
        }
    };
    println!(
        "fabricoll {} (libfabric {} at run time)",
        env!("CARGO_PKG_VERSION"),
        fabric::runtime_version()
    );
    println!();
    println!("configuration:");
    for v in VARS {
        match std::env::var(v.name) {
            Ok(val) if !val.trim().is_empty() => println!("  {:<22} = {val}", v.name),
            _ => println!("  {:<22} = (default: {})", v.name, v.default),
        }
    }
    println!("  resolved: {cfg:?}");
    println!();
    match fabric::discover(&cfg, fabric::Use::Engines) {
        Ok(d) => {
            println!(
                "providers with tagged RDM endpoints: {}",
                if d.providers.is_empty() {
                    "none".into()
                } else {
                    d.providers.join(", ")
                }
            );
            println!(
                "chosen for the collective engines: {}",
                d.chosen.as_deref().unwrap_or("none")
            );
            if !d.skipped.is_empty() {
                println!(
                    "skipped domains (name them in FABRICOLL_DOMAIN to use them): {}",
                    d.skipped.join(", ")
                );
            }
            for (i, dev) in d.devices.iter().enumerate() {
                let c = &dev.caps;
                println!(
                    "  device {i}: domain {} fabric {} inject {} B, max msg {} B, mr_mode {:#x} (registration {}), hmem {}, rma {}, tx/rx queue {}/{}, tag format {:#x}",
                    c.domain,
                    c.fabric,
                    c.inject_size,
                    c.max_msg_size,
                    c.mr_mode,
                    if c.mr_local { "required" } else { "optional" },
                    c.hmem,
                    c.rma,
                    c.tx_size,
                    c.rx_size,
                    dev.mem_tag_format
                );
            }
        }
        Err(e) => println!("discovery failed: {e}"),
    }
    println!();
    println!("NCCL properties (ncclNetPlugin_v12 getProperties):");
    match Plugin::discover(&cfg) {
        Ok(p) => {
            println!("  provider: {}", p.provider);
            for d in &p.devices {
                let pr = &d.props;
                println!(
                    "  dev {}: name {:?} pciPath {:?} guid {:#018x} ptrSupport HOST regIsGlobal {} speed {} Mbps latency {} us maxComms {} maxRecvs {} maxP2pBytes {} maxCollBytes {} netDeviceType HOST/0",
                    d.index,
                    pr.name,
                    pr.pci_path,
                    pr.guid,
                    pr.reg_is_global as i32,
                    pr.speed_mbps,
                    pr.latency_us,
                    pr.max_comms,
                    pr.max_recvs,
                    pr.max_p2p_bytes,
                    pr.max_coll_bytes
                );
            }
        }
        Err(e) => println!("  none: {e} (NCCL would fall back to its internal transports)"),
    }
    let _ = config::get();
}

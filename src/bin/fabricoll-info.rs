//! fabricoll-info: the libfabric providers found, each device with the properties NCCL will
//! see, and the resolved configuration; or a unique id, served until its ranks have joined.
use nccl_net_fabricoll::algo::{self, Algorithm, Collective};
use nccl_net_fabricoll::coll::{bootstrap, launch, placement};
use nccl_net_fabricoll::config::{self, Config, VARS};
use nccl_net_fabricoll::cuda;
use nccl_net_fabricoll::plugin::{Flavour, Plugin};
use nccl_net_fabricoll::transport::fabric;
use std::io::Write;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

const USAGE: &str = "usage: fabricoll-info [--core-rtt [CPU CPU]] [--algorithms]
                      [--unique-id [--ranks N] [--bind ADDR]]
  (no argument)      providers, devices, NCCL properties and configuration
  --unique-id        start a bootstrap root, print its unique id (hex, one line, for
                     FABRICOLL_UNIQUE_ID) and close stdout, then serve until N ranks (--ranks;
                     default: as many as the first rank says) have joined, or
                     FABRICOLL_TIMEOUT_MS has passed (exit status 1). --bind: the address (or
                     address:port, or host name) the root listens on; default
                     FABRICOLL_BOOTSTRAP_ADDR, else this host's first address that is up and
                     not loopback. E.g. ID=$(fabricoll-info --unique-id --ranks 8 &)
  --algorithms       the collectives each algorithm implements, one line per algorithm:
                     `ALGO COLL...`, with fabricoll-perf's --algo and --coll names
  --core-rtt         mean round trip of a cache line between each pair of the first 8 CPUs this
                     process may use, or between the two CPUs given; one line per pair:
                     `core-rtt A B NS`. About 50-100 ns means a shared cache; several hundred,
                     separate caches or sockets. Run it on idle CPUs: both threads spin.";

/// Round trips per pair: enough for a steady mean while a pair stays well under a second.
const RTT_ROUNDS: u32 = 200_000;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None => info(),
        Some("--core-rtt") => std::process::exit(core_rtt(&args[1..])),
        Some("--algorithms") if args.len() == 1 => algorithms(),
        Some("--unique-id") => std::process::exit(unique_id(&args[1..])),
        Some("-h" | "--help") => println!("{USAGE}"),
        Some(other) => {
            eprintln!("fabricoll-info: unknown argument {other:?}\n{USAGE}");
            std::process::exit(2);
        }
    }
}

/// The CUDA driver and each device's attributes, or why CUDA is unusable here.
fn cuda_info() {
    match cuda::probe() {
        cuda::Cuda::Up(d) => {
            println!(
                "CUDA: driver {} ({} device(s))",
                cuda::version_string(d.version),
                d.devices.len()
            );
            for dev in &d.devices {
                let yes = |b: bool| if b { "yes" } else { "no" };
                println!(
                    "  cuda device {}: {} (sm_{}{}), GPUDirect RDMA {}, with VMM {}, flush options {:#x} (cuFlushGPUDirectRDMAWrites {}), writes ordering {}, DMA-BUF {}{}",
                    dev.ordinal,
                    dev.name,
                    dev.compute.0,
                    dev.compute.1,
                    yes(dev.gdr),
                    yes(dev.gdr_vmm),
                    dev.flush_options,
                    if dev.flush_options & cuda::caps::FLUSH_OPTION_HOST != 0 {
                        "available"
                    } else {
                        "unavailable: flushes read a device sentinel"
                    },
                    dev.writes_ordering,
                    yes(dev.dma_buf),
                    if dev.unknown.is_empty() {
                        String::new()
                    } else {
                        format!(" (not reported by this driver, read as 0: {})", dev.unknown.join(", "))
                    }
                );
            }
        }
        other => println!(
            "CUDA: unusable: {}",
            other.why_not().unwrap_or("unknown reason")
        ),
    }
}

/// `--algorithms`: what scripts/coll_tests.py runs, so that it never tries a pair that does not
/// exist.
fn algorithms() {
    for a in Algorithm::ALL {
        let colls: Vec<String> = Collective::ALL
            .into_iter()
            .filter(|c| algo::supports(a, *c))
            .map(|c| format!("{c:?}").to_lowercase())
            .collect();
        println!("{} {}", a.name(), colls.join(" "));
    }
}

/// `--bind`'s value: an address with or without a port, or a host name with or without one.
fn bind_addr(v: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = v.parse::<SocketAddr>() {
        return Ok(a);
    }
    if let Ok(ip) = v.trim_matches(['[', ']']).parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, 0));
    }
    let with_port = if v.contains(':') {
        v.to_string()
    } else {
        format!("{v}:0")
    };
    with_port
        .to_socket_addrs()
        .map_err(|e| format!("--bind {v:?}: {e}"))?
        .find(SocketAddr::is_ipv4)
        .ok_or_else(|| format!("--bind {v:?}: no IPv4 address"))
}

/// `--unique-id [--ranks N] [--bind ADDR]`: the exit status.
fn unique_id(args: &[String]) -> i32 {
    let cfg = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fabricoll-info: {e}");
            return 2;
        }
    };
    nccl_net_fabricoll::logging::init(None);
    let (mut ranks, mut bind) = (None, SocketAddr::new(launch::bind_ip(&cfg), 0));
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let value = it.next();
        let parsed = match (a.as_str(), value) {
            ("--ranks", Some(v)) => v
                .parse::<usize>()
                .map(|n| ranks = Some(n))
                .map_err(|_| format!("--ranks {v:?}: a number of ranks expected")),
            ("--bind", Some(v)) => bind_addr(v).map(|b| bind = b),
            ("--ranks" | "--bind", None) => Err(format!("{a} needs a value")),
            _ => Err(format!("--unique-id: unknown argument {a:?}")),
        };
        if let Err(e) = parsed {
            eprintln!("fabricoll-info: {e}\n{USAGE}");
            return 2;
        }
    }
    let root = match bootstrap::listen(bind, None, ranks, cfg.timeout_setting()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("fabricoll-info: --unique-id: {e}");
            return 1;
        }
    };
    println!("{}", root.id.to_hex());
    let _ = std::io::stdout().flush();
    close_stdout();
    eprintln!(
        "fabricoll-info: serving the unique id on {} for {} until FABRICOLL_TIMEOUT_MS ({} ms)",
        root.id.addr,
        ranks.map_or("the ranks the first one says".to_string(), |n| format!(
            "{n} ranks"
        )),
        cfg.timeout.as_millis()
    );
    match root.wait() {
        Ok(()) => {
            eprintln!("fabricoll-info: every rank joined");
            0
        }
        Err(e) => {
            eprintln!("fabricoll-info: --unique-id: {e}");
            1
        }
    }
}

/// Point stdout at /dev/null, so that a shell reading the id (`ID=$(fabricoll-info
/// --unique-id &)`) sees its end while the root serves on.
fn close_stdout() {
    let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") else {
        return;
    };
    // SAFETY: dup2 of an open descriptor onto 1; Rust's stdout has been flushed and later
    // writes to it go to /dev/null.
    unsafe {
        libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), 1);
    }
}

/// `--core-rtt [A B]`: the exit status.
fn core_rtt(args: &[String]) -> i32 {
    let pairs: Vec<(usize, usize)> = match args {
        [] => {
            let cpus: Vec<usize> = placement::allowed_cpus().into_iter().take(8).collect();
            if cpus.len() < 2 {
                eprintln!("fabricoll-info: --core-rtt needs 2 CPUs; this process may use {cpus:?}");
                return 1;
            }
            let mut v = Vec::new();
            for (i, &a) in cpus.iter().enumerate() {
                v.extend(cpus[i + 1..].iter().map(|&b| (a, b)));
            }
            v
        }
        [a, b] => match (a.parse(), b.parse()) {
            (Ok(a), Ok(b)) => vec![(a, b)],
            _ => {
                eprintln!("fabricoll-info: --core-rtt: CPU numbers expected, got {a:?} {b:?}");
                return 2;
            }
        },
        _ => {
            eprintln!("fabricoll-info: --core-rtt takes no CPU or two\n{USAGE}");
            return 2;
        }
    };
    for (a, b) in pairs {
        match placement::core_rtt(a, b, RTT_ROUNDS, std::time::Duration::from_secs(10)) {
            Ok(t) => println!("core-rtt {a} {b} {}", t.as_nanos()),
            Err(e) => {
                eprintln!("fabricoll-info: --core-rtt {a} {b}: {e}");
                return 1;
            }
        }
    }
    0
}

fn info() {
    let cfg = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fabricoll-info: {e}");
            std::process::exit(2);
        }
    };
    println!(
        "fabricoll {} (libfabric {} at run time, built against its {} headers; native TCP endpoint: {})",
        env!("CARGO_PKG_VERSION"),
        fabric::runtime_release(),
        fabric::header_version(),
        fabric::native_tcp()
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
    cuda_info();
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
                let p = cuda::caps::ptr_support(&cuda::facts(c, 0, None));
                println!(
                    "    device memory: ptrSupport {:#x}{}{}",
                    p.bits,
                    p.why_not_cuda
                        .map(|w| format!("; no NCCL_PTR_CUDA: {w}"))
                        .unwrap_or_default(),
                    p.why_not_dmabuf
                        .filter(|_| p.bits & cuda::caps::PTR_CUDA != 0)
                        .map(|w| format!("; no NCCL_PTR_DMABUF: {w}"))
                        .unwrap_or_default()
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
    println!();
    println!("Neuron properties (libnccom-net.so, ncclNetPlugin_v6 getProperties):");
    match Plugin::discover_as(&cfg, Flavour::Neuron) {
        Ok(p) => {
            for d in &p.devices {
                let pr = &d.props;
                let rma = match pr.rma {
                    Some(r) => format!("rma_supported 1 max_write_inline_size {}", r.inline_bytes),
                    None => {
                        "rma_supported 0 (the provider offers no RMA usable by virtual address)"
                            .to_string()
                    }
                };
                println!(
                    "  dev {}: name {:?} ptrSupport HOST regIsGlobal {} maxRecvs 1 port 1 {rma} max_mr_key_size {}",
                    d.index, pr.name, pr.reg_is_global as i32, pr.mr_key_size
                );
            }
        }
        Err(e) => println!("  none: {e} (libnccom's init would fail)"),
    }
    let _ = config::get();
}

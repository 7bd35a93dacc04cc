//! Two fabrics in one communicator, on this one machine: ranks given different `FABRICOLL_HOST`
//! values count as on different hosts, so that ranks of one "host" talk over shm and the others
//! over net (on `lo`). Each rank is a process of this test binary (the `rank_process` test,
//! which does nothing unless started by another test). Checked: every algorithm × collective
//! gives the right answer (2 hosts × 2 ranks; 3 + 2 + 1 ranks, hosts interleaved), the ranks of
//! one host share no TCP connection while ranks of different hosts do, and ranks given
//! different providers all fail at once, naming the rank, instead of hanging; with
//! `FI_PROVIDER` hiding shm, the network serves every peer; compressed calls on interleaved
//! hosts (2 x 2; 3 + 2 + 1: the inter-host level alone compressed) give every rank the same bits.
use nccl_net_fabricoll::algo::{self, Algorithm, Collective};
use nccl_net_fabricoll::coll::bootstrap::{self, UniqueId};
use nccl_net_fabricoll::coll::{self, Call, Comm, Kind};
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::reduce::{DataType, RedOp};
use nccl_net_fabricoll::testing::skip;
use nccl_net_fabricoll::transport::fabric::{answers, native_tcp, Use};
use nccl_net_fabricoll::transport::{Region, Transport};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
mod tiered_threads;

/// Set in a rank process: what it does (`run` or `fail`).
const CHILD: &str = "TIERED_TEST_CHILD";

/// How long a group of rank processes may take in all.
const GROUP_LIMIT: Duration = Duration::from_secs(240);

fn value(r: usize, i: usize) -> f32 {
    ((r * 7 + i * 3) % 5 + 1) as f32
}

fn region(v: &mut [u8]) -> Region {
    // SAFETY: each buffer outlives the blocking call that uses it.
    unsafe { Region::from_raw(v.as_mut_ptr(), v.len()) }
}

/// A sum of `coll` over float data from `bufs.0` into `bufs.1`.
fn float_call(
    coll: Collective,
    bufs: (&mut [u8], &mut [u8]),
    count: usize,
    root: usize,
    algo: Option<Algorithm>,
) -> Call {
    Call {
        kind: Kind::Coll(coll),
        send: region(bufs.0),
        recv: region(bufs.1),
        count,
        dtype: DataType::Float32,
        op: RedOp::Sum,
        root,
        algo,
    }
}

/// Run `coll` with `algo` (None: auto) on `count` floats; check this rank's result. False: a
/// forced algorithm refused this layout of hosts (every rank refuses alike).
fn check_one(c: &Comm, algo: Option<Algorithm>, coll: Collective, count: usize) -> bool {
    let (n, r, root) = (c.nranks, c.rank, c.nranks - 1);
    let p = algo::Problem::new(coll, n, count);
    let mut send: Vec<u8> = (0..p.in_len())
        .flat_map(|i| value(r, i).to_le_bytes())
        .collect();
    let mut out = vec![0xeeu8; p.out_len() * 4];
    let call = float_call(coll, (&mut send, &mut out), count, root, algo);
    let what = format!("{algo:?} {coll:?} n={n} count={count} rank {r}");
    match c.run(&call) {
        Ok(()) => {}
        Err(e) if algo.is_some() && e.to_string().contains("invalid argument: hosts:") => {
            return false;
        }
        Err(e) => panic!("{what}: {e}"),
    }
    let sum = |j: usize| (0..n).map(|q| value(q, j)).sum::<f32>();
    for j in 0..p.out_len() {
        let want = match coll {
            Collective::AllReduce => sum(j),
            Collective::ReduceScatter => sum(r * count + j),
            Collective::Reduce if r == root => sum(j),
            Collective::Reduce => continue,
            Collective::AllGather => value(j / count, j % count),
            Collective::Broadcast => value(root, j),
            Collective::AllToAll => value(j / count, r * count + j % count),
        };
        let got = f32::from_le_bytes(out[j * 4..j * 4 + 4].try_into().unwrap());
        assert_eq!(got, want, "{what}: element {j}");
    }
    true
}

/// A rank process: join, run what its parent asked, print what the parent checks (`@@` lines).
#[test]
#[ignore = "a rank of the layout tests, which start it; alone it has nothing to run"]
fn rank_process() {
    let Ok(mode) = std::env::var(CHILD) else {
        return; // not started as a rank
    };
    // Only this rank's own connections may count (`run_ranks` reads them).
    nccl_net_fabricoll::testing::close_inherited_sockets();
    let get = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} unset"));
    let rank: usize = get("TIERED_TEST_RANK").parse().unwrap();
    let nranks: usize = get("TIERED_TEST_NRANKS").parse().unwrap();
    let id = UniqueId::from_hex(&get("TIERED_TEST_ID"), "TIERED_TEST_ID").unwrap();
    let cfg = Config::from_env().unwrap();
    let made = Comm::init_rank(nranks, &id, rank, &cfg);
    if mode == "fail" {
        let e = made.err().expect("the ranks disagree: creation fails");
        println!("@@error {e}");
        return;
    }
    let c = made.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    let provs: Vec<String> = (0..nranks).map(|q| c.provider_to(q).to_string()).collect();
    println!("@@providers {}", provs.join(","));
    println!("@@hosts {:?}", c.hosts().sizes(nranks));
    if mode == "one" {
        assert!(check_one(&c, None, Collective::AllReduce, 5000));
        println!("@@done yes");
        return;
    }
    if mode == "compress" {
        compressed_rank(&c);
        return;
    }
    if mode == "compress_dies" {
        if r_dies(rank, nranks) {
            // Gone without a word: no destroy, no goodbye.
            std::process::exit(0);
        }
        let started = Instant::now();
        let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| compressed_rank(&c)));
        println!("@@secs {}", started.elapsed().as_secs_f64());
        println!("@@failed {}", e.is_err());
        if let Err(p) = e {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            println!("@@error {}", msg.replace('\n', " "));
        }
        return;
    }
    let mut refused = Vec::new();
    for coll in Collective::ALL {
        for count in [3, 5000] {
            assert!(check_one(&c, None, coll, count));
            for a in Algorithm::ALL {
                if algo::supports(a, coll) && !check_one(&c, Some(a), coll, count) {
                    refused.push(format!("{a}/{coll:?}/{count}"));
                }
            }
        }
    }
    println!("@@refused {}", refused.join(","));
    let conns: Vec<String> = nccl_net_fabricoll::testing::tcp_connections()
        .iter()
        .map(|(l, r)| format!("{l}-{r}"))
        .collect();
    println!("@@tcp {}", conns.join(","));
    // No rank may exit (closing its sockets) before every rank has listed its connections: a
    // connection counts only when both ends list it as established.
    assert!(check_one(&c, None, Collective::AllReduce, 3));
}

/// A rank of `compressed_over_shm_and_net`: an AllReduce and an AllGather compressed as the
/// environment says (FABRICOLL_COMPRESS); prints a digest of each result's bits and the largest
/// error of the AllReduce against the exact sum.
fn compressed_rank(c: &Comm) {
    let (n, r) = (c.nranks, c.rank);
    for coll in [Collective::AllReduce, Collective::AllGather] {
        let count = 5001;
        let p = algo::Problem::new(coll, n, count);
        let x = |q: usize, i: usize| value(q, i) + 0.001 * (i % 97) as f32;
        let mut send: Vec<u8> = (0..p.in_len())
            .flat_map(|i| x(r, i).to_le_bytes())
            .collect();
        let mut out = vec![0u8; p.out_len() * 4];
        let call = float_call(coll, (&mut send, &mut out), count, 0, None);
        c.run(&call)
            .unwrap_or_else(|e| panic!("rank {r} {coll:?}: {e}"));
        let got: Vec<f32> = out
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let err = (0..p.out_len())
            .map(|j| {
                let exact: f64 = match coll {
                    Collective::AllReduce => (0..n).map(|q| f64::from(x(q, j))).sum(),
                    _ => f64::from(x(j / count, j % count)),
                };
                (f64::from(got[j]) - exact).abs()
            })
            .fold(0.0, f64::max);
        // A digest of the bits (FNV-1a): the whole output would fill the pipe the test
        // reads only once the rank has exited.
        let digest = got.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
            (h ^ u64::from(v.to_bits())).wrapping_mul(0x100_0000_01b3)
        });
        println!("@@{coll:?}-bits {digest:016x}");
        println!("@@{coll:?}-err {err}");
    }
}

/// The rank that leaves in `compressed_when_a_rank_dies`: the last.
fn r_dies(rank: usize, nranks: usize) -> bool {
    rank + 1 == nranks
}

/// What each rank process printed (its `@@` lines, by key), or None when net is missing.
fn run_ranks(
    test: &str,
    mode: &str,
    envs: &[Vec<(&str, &str)>],
) -> Option<Vec<Vec<(String, String)>>> {
    let n = envs.len();
    let id = bootstrap::new_unique_id(IpAddr::V4(Ipv4Addr::LOCALHOST), GROUP_LIMIT).unwrap();
    let exe = std::env::current_exe().unwrap();
    let start = Instant::now();
    let mut kids: Vec<_> = envs
        .iter()
        .enumerate()
        .map(|(r, env)| {
            let mut cmd = Command::new(&exe);
            cmd.args([
                "--exact",
                "rank_process",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, mode)
            .env("TIERED_TEST_RANK", r.to_string())
            .env("TIERED_TEST_NRANKS", n.to_string())
            .env("TIERED_TEST_ID", id.to_hex())
            .env("FABRICOLL_DOMAIN", "lo")
            .env("FABRICOLL_ALPHA_US", "5")
            .env("FABRICOLL_BETA_GBPS", "2")
            .env("FABRICOLL_GAMMA_GBPS", "8")
            .env_remove("FABRICOLL_PROVIDER")
            .env_remove("FI_PROVIDER")
            .env_remove("FABRICOLL_INTRA_PROVIDER")
            .env_remove("FABRICOLL_LOCAL_RANKS")
            .env_remove("FABRICOLL_ALGO")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
            for (k, v) in env {
                cmd.env(k, v);
            }
            cmd.spawn().unwrap()
        })
        .collect();
    let mut outs = Vec::new();
    for (r, kid) in kids.iter_mut().enumerate() {
        loop {
            if kid.try_wait().unwrap().is_some() {
                break;
            }
            if start.elapsed() > GROUP_LIMIT {
                let _ = kid.kill();
                panic!("{test}: rank {r} still running after {GROUP_LIMIT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    for (r, kid) in kids.into_iter().enumerate() {
        let o = kid.wait_with_output().unwrap();
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        );
        if err.contains("no libfabric device")
            || err.contains("no such provider here")
            || err.contains("no net endpoint")
        {
            skip(test, &format!("provider net missing here: {err}"));
            return None;
        }
        assert!(o.status.success(), "{test}: rank {r} failed:\n{out}\n{err}");
        let lines = out
            .lines()
            // The harness may have begun the line ("test rank_process ... ").
            .filter_map(|l| l.split_once("@@")?.1.split_once(' '))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        outs.push(lines);
    }
    Some(outs)
}

fn field<'a>(lines: &'a [(String, String)], key: &str) -> &'a str {
    lines
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {key} line in {lines:?}"))
}

/// Every collective right on the hosts `hosts` (one label per rank); shm within a host, net
/// between hosts, and no TCP connection between two ranks of one host.
fn layout(test: &str, hosts: &[&str]) {
    let envs: Vec<Vec<(&str, &str)>> = hosts
        .iter()
        .map(|h| vec![("FABRICOLL_PROVIDER", "net"), ("FABRICOLL_HOST", *h)])
        .collect();
    let Some(outs) = run_ranks(test, "run", &envs) else {
        return;
    };
    let n = hosts.len();
    // Every forced algorithm takes any layout of hosts, uneven and interleaved included.
    for (r, o) in outs.iter().enumerate() {
        let refused = field(o, "refused");
        assert!(
            refused.is_empty(),
            "{test}: rank {r}: forced algorithms refused the layout {hosts:?}: {refused}"
        );
        let provs: Vec<&str> = field(o, "providers").split(',').collect();
        for q in 0..n {
            let want = if hosts[q] == hosts[r] {
                "shm"
            } else {
                native_tcp()
            };
            assert_eq!(provs[q], want, "{test}: rank {r} reaches rank {q}");
        }
    }
    let conns: Vec<Vec<(SocketAddr, SocketAddr)>> = outs
        .iter()
        .map(|o| {
            field(o, "tcp")
                .split(',')
                .filter_map(|c| c.split_once('-'))
                .map(|(l, r)| (l.parse().unwrap(), r.parse().unwrap()))
                .collect()
        })
        .collect();
    let mut between_hosts = 0;
    for a in 0..n {
        for b in 0..n {
            let linked = a != b
                && conns[a]
                    .iter()
                    .any(|&(l, r)| conns[b].iter().any(|&(l2, r2)| l == r2 && r == l2));
            if linked && hosts[a] == hosts[b] {
                panic!(
                    "{test}: ranks {a} and {b} of host {} talked over TCP ({:?} and {:?})",
                    hosts[a], conns[a], conns[b]
                );
            }
            between_hosts += linked as usize;
        }
    }
    assert!(between_hosts > 0, "{test}: no TCP connection between hosts");
}

#[test]
fn two_hosts_of_two_ranks_use_shm_within_and_net_between() {
    layout(
        "two_hosts_of_two_ranks_use_shm_within_and_net_between",
        &["a", "a", "b", "b"],
    );
}

#[test]
fn three_uneven_interleaved_hosts() {
    layout(
        "three_uneven_interleaved_hosts",
        &["a", "b", "a", "c", "a", "b"],
    );
}

/// The environments of ranks on the hosts `hosts` over shm and net, compressing as int8, with
/// `more`.
fn compressed_envs<'a>(
    hosts: &[&'a str],
    more: &[(&'a str, &'a str)],
) -> Vec<Vec<(&'a str, &'a str)>> {
    hosts
        .iter()
        .map(|h| {
            let mut v = vec![
                ("FABRICOLL_PROVIDER", "net"),
                ("FABRICOLL_HOST", *h),
                ("FABRICOLL_COMPRESS", "int8"),
            ];
            v.extend_from_slice(more);
            v
        })
        .collect()
}

/// Compressed calls on two interleaved hosts of two ranks over shm and net (the inter-host
/// level alone compressed, docs/compression.md): every rank ends with the same bits, within
/// int8's error of the exact result.
#[test]
fn compressed_over_shm_and_net() {
    compressed_on("compressed_over_shm_and_net", &["a", "b", "a", "b"], &[]);
}

/// The same on three interleaved hosts of 3, 2 and 1 ranks (one lane; ranks 2, 4 and 5 extra),
/// the calls cut into as many chunks as they may be (`FABRICOLL_COMPRESS_CHUNK=1`, pipelined).
#[test]
fn compressed_on_uneven_hosts_over_shm_and_net() {
    compressed_on(
        "compressed_on_uneven_hosts_over_shm_and_net",
        &["a", "b", "a", "c", "a", "b"],
        &[("FABRICOLL_COMPRESS_CHUNK", "1")],
    );
}

fn compressed_on(test: &str, hosts: &[&str], more: &[(&str, &str)]) {
    let Some(outs) = run_ranks(test, "compress", &compressed_envs(hosts, more)) else {
        return;
    };
    let n = hosts.len() as f64;
    for key in ["AllReduce", "AllGather"] {
        let bits = field(&outs[0], &format!("{key}-bits"));
        for (r, o) in outs.iter().enumerate() {
            assert_eq!(
                field(o, &format!("{key}-bits")),
                bits,
                "{test}: {key} rank {r}"
            );
            // int8: a step is 1/127 of a block's largest magnitude (sums below 6.25 n here,
            // each input below 6), and each element is quantized at most twice.
            let err: f64 = field(o, &format!("{key}-err")).parse().unwrap();
            assert!(err < 0.0625 * n, "{test}: {key} rank {r}: error {err}");
        }
    }
}

/// A rank that exits after joining, before a compressed call on two interleaved hosts of two
/// ranks: every other rank's call fails well before the deadline, having found a peer gone
/// (`exec` asks the transport about the peers a stalled call waits for). Its shm partner sees
/// its process gone: the composition's first message to it, a slice of the data, mostly went
/// into its ring before it exited, so only the receive from it shows it. Its lane partner over
/// net sees its address refuse connections. The fourth rank waits for the shm partner's codes
/// in the lane stage: that rank's call failed, and it left (its process ends after its
/// failure here), so its address refuses too; a rank whose call failed and that stays would
/// hold it until the deadline.
#[test]
fn compressed_when_a_rank_dies() {
    let test = "compressed_when_a_rank_dies";
    // Long, so that failing well inside it says the failure came from noticing the dead
    // rank, even on a busy machine; well inside the group's limit.
    let deadline = Duration::from_secs(60);
    let ms = deadline.as_millis().to_string();
    let envs = compressed_envs(&["a", "b", "a", "b"], &[("FABRICOLL_TIMEOUT_MS", &ms)]);
    let Some(outs) = run_ranks(test, "compress_dies", &envs) else {
        return;
    };
    let n = outs.len();
    let dead = n - 1;
    assert!(r_dies(dead, n));
    for (r, o) in outs.iter().enumerate() {
        if r == dead {
            continue;
        }
        assert_eq!(field(o, "failed"), "true", "{test}: rank {r}");
        let secs: f64 = field(o, "secs").parse().unwrap();
        let e = field(o, "error");
        eprintln!("{test}: rank {r} failed after {secs} s: {e}");
        // A peer gone: noticed while waiting for it (naming its rank), or refused a send
        // posted after its process exited (naming its pid).
        assert!(
            e.contains(" is gone (") || e.contains("has exited"),
            "{test}: rank {r}: {e}"
        );
        assert!(
            secs < deadline.as_secs_f64() / 3.0,
            "{test}: rank {r} failed only after {secs} s of a {deadline:?} deadline: {e}"
        );
    }
}

#[test]
fn ranks_given_different_providers_all_fail_at_once_naming_the_rank() {
    let test = "ranks_given_different_providers_all_fail_at_once_naming_the_rank";
    let envs = vec![
        vec![
            ("FABRICOLL_PROVIDER", "net"),
            ("FABRICOLL_HOST", "a"),
            ("FABRICOLL_TIMEOUT_MS", "120000"),
        ],
        // (the layered provider: plain `tcp` is the native endpoint from libfabric 1.18)
        vec![
            ("FABRICOLL_PROVIDER", "tcp;ofi_rxm"),
            ("FABRICOLL_HOST", "b"),
            ("FABRICOLL_TIMEOUT_MS", "120000"),
        ],
    ];
    let t0 = Instant::now();
    let Some(outs) = run_ranks(test, "fail", &envs) else {
        return;
    };
    // Far less than the deadline: nobody waited for the other.
    assert!(t0.elapsed() < Duration::from_secs(60), "{:?}", t0.elapsed());
    for o in &outs {
        let e = field(o, "error");
        assert!(
            e.contains("rank 1 uses provider tcp;ofi_rxm")
                && e.contains(&format!(
                    "between hosts where rank 0 uses {} (FABRICOLL_PROVIDER)",
                    native_tcp()
                )),
            "{e}"
        );
    }
}

/// Ranks whose compressed calls would run different exchanges (another chunk size, another
/// choice of levels) fail at creation, every one naming the rank, the values and the variable.
#[test]
fn ranks_given_different_compression_layouts_all_fail_at_once_naming_the_variable() {
    let test = "ranks_given_different_compression_layouts_all_fail_at_once_naming_the_variable";
    let cases = [
        (
            ("FABRICOLL_COMPRESS_CHUNK", "1048576"),
            "rank 1 cuts compressed calls into chunks of 1048576 bytes where rank 0 cuts them into chunks of 4194304 (FABRICOLL_COMPRESS_CHUNK",
        ),
        (
            ("FABRICOLL_COMPRESS_LEVELS", "all"),
            "rank 1 compresses every level where rank 0 compresses the inter-host level only (FABRICOLL_COMPRESS_LEVELS=all against inter)",
        ),
    ];
    for (odd, want) in cases {
        let envs = vec![
            vec![("FABRICOLL_HOST", "a"), ("FABRICOLL_TIMEOUT_MS", "120000")],
            vec![
                ("FABRICOLL_HOST", "b"),
                ("FABRICOLL_TIMEOUT_MS", "120000"),
                odd,
            ],
        ];
        let t0 = Instant::now();
        let Some(outs) = run_ranks(test, "fail", &envs) else {
            return;
        };
        assert!(t0.elapsed() < Duration::from_secs(60), "{:?}", t0.elapsed());
        for o in &outs {
            let e = field(o, "error");
            assert!(e.contains(want), "{want:?} not in: {e}");
        }
    }
}

/// `FI_PROVIDER=tcp` and no provider of ours: libfabric hides shm, so the default intra-host
/// provider cannot be had and the network serves every peer; an intra provider that was set
/// and cannot be had stays an error naming its variable.
#[test]
fn fi_provider_hiding_shm_leaves_the_network_for_every_peer() {
    let test = "fi_provider_hiding_shm_leaves_the_network_for_every_peer";
    let envs = vec![vec![("FI_PROVIDER", "tcp")]; 2];
    let Some(outs) = run_ranks(test, "one", &envs) else {
        return;
    };
    for (r, o) in outs.iter().enumerate() {
        assert_eq!(field(o, "done"), "yes");
        let provs: Vec<&str> = field(o, "providers").split(',').collect();
        for (q, p) in provs.iter().enumerate() {
            assert!(
                q == r || answers(p, "tcp"),
                "{test}: rank {r} reaches rank {q} over {p}"
            );
        }
    }
    let envs = vec![vec![("FI_PROVIDER", "tcp"), ("FABRICOLL_INTRA_PROVIDER", "shm")]; 2];
    let Some(outs) = run_ranks(test, "fail", &envs) else {
        return;
    };
    for o in &outs {
        let e = field(o, "error");
        assert!(
            e.contains("argument 'FABRICOLL_INTRA_PROVIDER': shm: no such provider here")
                && e.contains("FI_PROVIDER=tcp hides")
                && e.contains("FABRICOLL_INTRA_PROVIDER=same"),
            "{e}"
        );
    }
}

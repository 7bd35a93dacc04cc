//! Unit tests of the communicator: kept choices, placement-driven spinning, calls whose
//! buffers cannot exist (F2), the two-level model on several hosts (choice, calibration), and
//! calibrations kept for later communicators over the same topology.
use super::calibrate::Calibrated;
use super::placement;
use super::{Call, Comm, Kind};
use crate::algo::{Algorithm, Collective, Hosts, Options, Problem};
use crate::config::Config;
use crate::error::Error;
use crate::reduce::{DataType, RedOp};
use crate::transport::{Region, Transport};
use crate::tune::Model;
use std::sync::Arc;

#[test]
fn auto_choices_are_kept_per_model() {
    use crate::transport::loopback::LoopbackFabric;
    let cfg = Config::from_lookup(|_| None).unwrap();
    let f = LoopbackFabric::new();
    let eps: Vec<Arc<dyn Transport>> = (0..4)
        .map(|_| Arc::new(f.endpoint()) as Arc<dyn Transport>)
        .collect();
    let addrs: Vec<Vec<u8>> = eps.iter().map(|e| e.address()).collect();
    let mut comm = Comm::new(0, eps[0].clone(), &addrs, &cfg).unwrap();
    let p = Problem::new(Collective::AllReduce, 4, 1 << 20);
    let latency_bound = Model::new(1e4, 100.0, 100.0);
    let bandwidth_bound = Model::new(1e-3, 0.01, 100.0);
    let opts = |c: &Comm| c.choose(&p, 4, None).unwrap();
    comm.set_model(latency_bound.clone());
    let first = opts(&comm);
    assert_eq!(first, opts(&comm), "a kept choice is the same choice");
    comm.set_model(bandwidth_bound.clone());
    let second = opts(&comm);
    assert_ne!(
        first.0, second.0,
        "the two models must disagree for this test to mean anything"
    );
    let base = Options {
        slice: comm.slice / 4,
        hosts: comm.hosts,
        intra: Algorithm::Ring,
        inter: Algorithm::Ring,
    };
    assert_eq!(second, bandwidth_bound.choose(&p, 4, base));
    comm.set_model(latency_bound.clone());
    assert_eq!(opts(&comm), latency_bound.choose(&p, 4, base));
    // A forced algorithm is kept under its own key, not as auto's choice.
    assert_eq!(
        comm.choose(&p, 4, Some(Algorithm::Ring)).unwrap().0,
        Algorithm::Ring
    );
}

/// Whether each of the ranks, threads pinned to `sets[r]`, spins after the exchange (and
/// that its cost model knows whether the ranks share CPUs).
fn spins_when_pinned(sets: &[Vec<usize>]) -> Vec<bool> {
    use crate::transport::loopback::LoopbackFabric;
    let cfg = Config::from_lookup(|_| None).unwrap();
    let f = LoopbackFabric::new();
    let eps: Vec<Arc<dyn Transport>> = sets
        .iter()
        .map(|_| Arc::new(f.endpoint()) as Arc<dyn Transport>)
        .collect();
    let addrs: Vec<Vec<u8>> = eps.iter().map(|e| e.address()).collect();
    std::thread::scope(|s| {
        let hs: Vec<_> = sets
            .iter()
            .zip(eps)
            .enumerate()
            .map(|(r, (cpus, ep))| {
                let (addrs, cfg) = (&addrs, &cfg);
                s.spawn(move || {
                    placement::bind_to(cpus).expect("bind");
                    let mut c = Comm::new(r, ep, addrs, cfg).unwrap();
                    c.learn_placement().unwrap();
                    // One machine: its ranks share CPUs exactly when they do not spin.
                    assert_eq!(c.model().shared_cpus, !c.spin, "rank {r}");
                    c.spin
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn waiters_spin_when_the_exchanged_cpu_sets_give_each_rank_a_cpu() {
    let mine = placement::allowed_cpus();
    if mine.len() < 2 {
        crate::testing::skip(
            "waiters_spin_when_the_exchanged_cpu_sets_give_each_rank_a_cpu",
            &format!("needs 2 CPUs, this process may use {mine:?}"),
        );
        return;
    }
    let (a, b) = (mine[0], mine[1]);
    // Bound one per CPU, as mpirun binds: each sees one CPU, and each has one.
    assert_eq!(spins_when_pinned(&[vec![a], vec![b]]), [true, true]);
    // Both bound to one CPU: they share it.
    assert_eq!(spins_when_pinned(&[vec![a], vec![a]]), [false, false]);
    // Unbound on 2 CPUs: 2 ranks fit, 3 do not.
    assert_eq!(spins_when_pinned(&vec![vec![a, b]; 2]), [true, true]);
    assert_eq!(spins_when_pinned(&vec![vec![a, b]; 3]), [false; 3]);
}

/// A communicator of one rank over the loopback transport.
fn one_rank() -> Comm {
    use crate::transport::loopback::LoopbackFabric;
    let cfg = Config::from_lookup(|_| None).unwrap();
    let f = LoopbackFabric::new();
    let ep: Arc<dyn Transport> = Arc::new(f.endpoint());
    Comm::new(0, ep.clone(), &[ep.address()], &cfg).unwrap()
}

/// A call of `count` elements of `dtype` on empty buffers: a call that got past the checks
/// would fault or abort on them.
fn empty_call(kind: Kind, count: usize, dtype: DataType) -> Call {
    Call {
        kind,
        send: Region::empty(),
        recv: Region::empty(),
        count,
        dtype,
        op: RedOp::Sum,
        root: 0,
        algo: None,
    }
}

/// F2: on one rank, a count whose byte size fits 64 bits but not the address space is refused
/// naming `count`, before anything is allocated for it.
#[test]
fn counts_beyond_the_address_space_are_refused_naming_count() {
    let comm = one_rank();
    let call = empty_call;
    let coll = |c: Collective| Kind::Coll(c);
    let cases = [
        (coll(Collective::AllReduce), 1usize << 63, DataType::Int8),
        (coll(Collective::AllGather), 1 << 61, DataType::Float32),
        (coll(Collective::ReduceScatter), 1 << 61, DataType::Float32),
        (coll(Collective::AllToAll), 1 << 61, DataType::Float32),
        (coll(Collective::Broadcast), 1 << 63, DataType::Int8),
        (coll(Collective::Reduce), 1 << 62, DataType::Int32),
        (coll(Collective::AllReduce), usize::MAX, DataType::Float64),
        (Kind::Send { peer: 0 }, 1 << 63, DataType::Int8),
        (Kind::Recv { peer: 0 }, 1 << 62, DataType::Float32),
        (
            Kind::Window {
                coll: Collective::AllGather,
                offset: 0,
                len: 1,
            },
            1 << 62,
            DataType::Float64,
        ),
    ];
    for (kind, count, dtype) in cases {
        for blocking in [true, false] {
            let c = call(kind, count, dtype);
            let r = if blocking {
                comm.run(&c)
            } else {
                comm.start(&c).map(|_| ())
            };
            match r {
                Err(Error::InvalidArgument(m)) => {
                    assert!(
                        m.contains("'count'") && m.contains("isize::MAX"),
                        "{kind:?} x {count}: {m}"
                    )
                }
                other => panic!("{kind:?} x {count} {dtype:?}: {other:?}"),
            }
        }
    }
    assert_eq!(comm.pending(), 0);
    // The largest buffer that fits is still accepted by the check.
    let fits = call(coll(Collective::AllReduce), 0, DataType::Int8);
    comm.run(&fits).unwrap();
}

/// A count whose bytes fit the address space but whose schedule would list more slices than
/// any buffer has (`algo::MAX_SLICES`) is refused naming `count`, before the slices are listed.
#[test]
fn counts_beyond_any_schedule_are_refused_naming_count() {
    let comm = one_rank();
    for (coll, count) in [
        (Collective::AllReduce, 1usize << 62),
        (Collective::AllGather, 1 << 60),
        (Collective::Broadcast, isize::MAX as usize),
    ] {
        let call = empty_call(Kind::Coll(coll), count, DataType::Uint8);
        match comm.run(&call) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("count"), "{coll:?}: {m}"),
            other => panic!("{coll:?} x {count}: {other:?}"),
        }
    }
}

/// `n` communicators over one loopback fabric, rank r's endpoint first in the returned list,
/// made and run each on its own thread by `f`.
fn on_threads<T: Send>(n: usize, f: impl Fn(Comm) -> T + Sync) -> Vec<T> {
    on_threads_with(&Config::from_lookup(|_| None).unwrap(), n, f)
}

/// `on_threads` with the configuration `cfg`.
fn on_threads_with<T: Send>(cfg: &Config, n: usize, f: impl Fn(Comm) -> T + Sync) -> Vec<T> {
    use crate::transport::loopback::LoopbackFabric;
    let fab = LoopbackFabric::new();
    let eps: Vec<Arc<dyn Transport>> = (0..n)
        .map(|_| Arc::new(fab.endpoint()) as Arc<dyn Transport>)
        .collect();
    let addrs: Vec<Vec<u8>> = eps.iter().map(|e| e.address()).collect();
    // The endpoints live until every rank has joined: a rank that returns at once (nothing
    // to calibrate) must not drop its endpoint before the others have inserted it.
    std::thread::scope(|s| {
        let hs: Vec<_> = eps
            .iter()
            .enumerate()
            .map(|(r, ep)| {
                let (addrs, f, ep) = (&addrs, &f, ep.clone());
                s.spawn(move || f(Comm::new(r, ep, addrs, cfg).unwrap()))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn on_several_hosts_auto_and_forced_hier_take_the_models_levels() {
    let mut comm = on_threads(1, |c| c).pop().unwrap();
    // Choosing talks to no peer: one endpoint serves a communicator said to have 4 ranks.
    // At 64 KiB ring x ring takes one more network alpha than the best pair (ring x rd).
    let p = Problem::new(Collective::AllReduce, 4, 1 << 14);
    let mut net = Model::new(50.0, 0.125, 8.0).with_intra(crate::tune::Link {
        alpha_us: 1.0,
        beta_us_per_byte: 2e-4,
        o_us: 0.5,
        eager_bytes: usize::MAX,
    });
    net.inter_o_us = Some(5.0);
    comm.nranks = 4;
    comm.hosts = Hosts::blocks(4, 2);
    comm.set_model(net.clone());
    let base = Options {
        slice: comm.slice / 4,
        hosts: comm.hosts,
        intra: Algorithm::Ring,
        inter: Algorithm::Ring,
    };
    let auto = comm.choose(&p, 4, None).unwrap();
    assert_eq!(auto.0, Algorithm::Hier);
    assert_eq!(auto, net.choose(&p, 4, base));
    let forced = comm.choose(&p, 4, Some(Algorithm::Hier)).unwrap();
    assert_eq!(forced.1, net.levels_for(Algorithm::Hier, &p, 4, base));
    assert_ne!(
        (forced.1.intra, forced.1.inter),
        (Algorithm::Ring, Algorithm::Ring),
        "the model's best pair, not ring x ring"
    );
    assert_eq!(forced.1.hosts, comm.hosts);
    // One host: forced hier keeps ring x ring.
    comm.hosts = Hosts::ONE;
    comm.set_model(net);
    let one = comm.choose(&p, 4, Some(Algorithm::Hier)).unwrap().1;
    assert_eq!((one.intra, one.inter), (Algorithm::Ring, Algorithm::Ring));
}

#[test]
fn calibration_on_several_hosts_measures_each_level_and_every_rank_agrees() {
    for per in [2, 1] {
        let models = on_threads(4, |mut c| {
            c.hosts = Hosts::blocks(4, per);
            c.calibrate().unwrap();
            c.model().clone()
        });
        for m in &models {
            assert_eq!(*m, models[0], "{per} ranks per host");
        }
        let m = &models[0];
        assert!(
            m.inter_o_us.is_some(),
            "the network's per-message cost is measured"
        );
        let i = m.intra;
        assert_eq!(
            i == crate::tune::Link::SHM,
            per == 1,
            "intra measured only where a host has two ranks: {i:?}"
        );
        for x in [
            m.alpha_us,
            m.beta_us_per_byte,
            m.gamma_us_per_byte,
            i.alpha_us,
        ] {
            assert!(x.is_finite() && x > 0.0, "{m:?}");
        }
    }
}

/// A configuration whose alpha is `alpha` (beta and gamma measured), and `more` variables: a
/// fixed alpha no other test uses keys this test's calibrations apart from theirs in the
/// process-wide cache (`calibrate::cache::Key`), since tests run at once in one process.
fn keyed_config(alpha: &str, more: &[(&str, &str)]) -> Config {
    Config::from_lookup(|k| {
        if k == "FABRICOLL_ALPHA_US" {
            return Some(alpha.to_string());
        }
        more.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    })
    .unwrap()
}

/// Each rank's outcome, model and choice of a 64 KiB AllReduce, one communicator of `n`
/// threads over `cfg` calibrated.
fn calibrated(cfg: &Config, n: usize) -> Vec<(Calibrated, Model, Algorithm)> {
    let p = Problem::new(Collective::AllReduce, n, 1 << 14);
    on_threads_with(cfg, n, |mut c| {
        let how = c.calibrate().unwrap();
        let algo = c.choose(&p, 4, None).unwrap().0;
        (how, c.model().clone(), algo)
    })
}

#[test]
fn two_communicators_over_the_same_ranks_calibrate_once_and_every_rank_agrees() {
    let cfg = keyed_config("3.0625", &[("FABRICOLL_TIMEOUT_MS", "20000")]);
    let first = calibrated(&cfg, 3);
    let second = calibrated(&cfg, 3);
    for (r, (a, b)) in first.iter().zip(&second).enumerate() {
        assert_eq!(a.0, Calibrated::Measured, "rank {r}: the first measures");
        assert_eq!(b.0, Calibrated::Kept, "rank {r}: the second takes rank 0's");
        assert_eq!(a.1, first[0].1, "rank {r}: every rank has rank 0's model");
        assert_eq!(
            b.1, first[0].1,
            "rank {r}: the kept model is the measured one"
        );
        assert_eq!(
            (a.2, b.2),
            (first[0].2, first[0].2),
            "rank {r}: same choice"
        );
    }
    assert_eq!(first[0].1.alpha_us, 3.0625, "the configured alpha stays");
    // Another rank count is another topology: measured again.
    assert!(calibrated(&cfg, 2)
        .iter()
        .all(|x| x.0 == Calibrated::Measured));
}

#[test]
fn a_forced_algorithm_skips_calibration() {
    for algo in ["ring", "mesh", "hier"] {
        let cfg = keyed_config("3.1875", &[("FABRICOLL_ALGO", algo)]);
        let base = Model::from_config(&cfg);
        for (r, (how, m, _)) in calibrated(&cfg, 2).into_iter().enumerate() {
            assert_eq!(how, Calibrated::Skipped, "{algo}, rank {r}");
            assert_eq!(m, base, "{algo}, rank {r}: the configured model");
        }
    }
}

/// Over shm endpoints: a parent calibrated (or kept), split in two; each child has the
/// parent's model and makes the same choices on all of its ranks.
#[test]
fn split_communicators_keep_the_parents_calibration_on_every_rank() {
    let test = "split_communicators_keep_the_parents_calibration_on_every_rank";
    let cfg = keyed_config("3.3125", &[("FABRICOLL_PROVIDER", "shm")]);
    let eps: Vec<Arc<dyn Transport>> = match (0..4).map(|_| super::open_endpoint(&cfg)).collect() {
        Ok(e) => e,
        Err(e) => {
            crate::testing::skip(test, &format!("no shm endpoint ({e})"));
            return;
        }
    };
    let addrs: Vec<Vec<u8>> = eps.iter().map(|e| e.address()).collect();
    let p = Problem::new(Collective::AllReduce, 2, 1 << 14);
    let got: Vec<(Model, Model, Algorithm)> = std::thread::scope(|s| {
        let hs: Vec<_> = eps
            .into_iter()
            .enumerate()
            .map(|(r, ep)| {
                let (addrs, cfg, p) = (&addrs, &cfg, &p);
                s.spawn(move || {
                    let mut parent = Comm::new(r, ep, addrs, cfg).unwrap();
                    parent.calibrate().unwrap();
                    let child = parent
                        .split((r % 2) as i32, r as i32, cfg)
                        .unwrap()
                        .expect("every rank has a colour");
                    let algo = child.choose(p, 4, None).unwrap().0;
                    (parent.model().clone(), child.model().clone(), algo)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, (parent, child, algo)) in got.iter().enumerate() {
        assert_eq!(parent, &got[0].0, "rank {r}: rank 0's model");
        assert_eq!(child, parent, "rank {r}: the child keeps it");
        assert_eq!(*algo, got[0].2, "rank {r}: same choice in both children");
    }
}

/// A one-host calibration stored in FABRICOLL_CALIBRATION_CACHE's directory: a later process
/// (played by forgetting what this one kept) takes it instead of measuring, every rank alike;
/// a measurement that looked disturbed is used on every rank but neither stored nor kept.
#[test]
fn a_stored_calibration_serves_a_later_process_unless_it_looked_disturbed() {
    let dir = std::env::temp_dir().join(format!("fabricoll-calibrated-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let alpha = "3.5625";
    let cfg = keyed_config(
        alpha,
        &[("FABRICOLL_CALIBRATION_CACHE", dir.to_str().unwrap())],
    );
    assert_eq!(cfg.calibration_dir.as_deref(), Some(dir.as_path()));
    let stored = || std::fs::read_dir(&dir).map_or(0, |d| d.count());
    let first = calibrated(&cfg, 2);
    assert!(
        first.iter().all(|c| c.0 == Calibrated::Measured),
        "{first:?}"
    );
    assert_eq!(stored(), 1, "the steady calibration is stored");
    super::calibrate::forget_kept_with_alpha(3.5625);
    let later = calibrated(&cfg, 2);
    for (r, (a, b)) in first.iter().zip(&later).enumerate() {
        assert_eq!(b.0, Calibrated::Stored, "rank {r}");
        assert_eq!(b.1, a.1, "rank {r}: the stored model is the measured one");
    }
    // Then kept in the process again.
    assert!(calibrated(&cfg, 2).iter().all(|c| c.0 == Calibrated::Kept));
    // A disturbed measurement (judged so for this alpha): every rank has rank 0's model and
    // says so, and nothing is stored or kept, so the next communicator measures again.
    let busy = "3.6875";
    super::calibrate::force_disturbed(3.6875);
    let cfg = keyed_config(
        busy,
        &[("FABRICOLL_CALIBRATION_CACHE", dir.to_str().unwrap())],
    );
    for _ in 0..2 {
        let got = calibrated(&cfg, 2);
        for (r, g) in got.iter().enumerate() {
            assert_eq!(g.0, Calibrated::Disturbed, "rank {r}");
            assert_eq!(g.1, got[0].1, "rank {r}: rank 0's model");
        }
        assert_eq!(stored(), 1, "a disturbed calibration was stored");
    }
    // Without the variable set, a configuration from the environment alone keeps none in a
    // file (`Config::from_lookup` sees no HOME here), and "0" turns it off.
    assert_eq!(keyed_config(alpha, &[]).calibration_dir, None);
    let off = keyed_config(alpha, &[("FABRICOLL_CALIBRATION_CACHE", "0")]);
    assert_eq!(off.calibration_dir, None);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Creation with and without a kept calibration: the first round measures, the later ones
/// take what it kept, every rank alike. Each round's time is printed as a figure, never
/// asserted (the machine's load decides it):
/// `cargo test --release --lib creation_time -- --nocapture`.
#[test]
fn creation_time_with_and_without_a_kept_calibration() {
    let cfg = keyed_config("3.4375", &[]);
    let t = std::time::Instant::now();
    let how = calibrated(&cfg, 2)[0].0;
    eprintln!(
        "round 0: 2 ranks over loopback, {how:?} in {:.2} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!(how, Calibrated::Measured);
    for round in 1..3 {
        let t = std::time::Instant::now();
        let hows: Vec<Calibrated> = calibrated(&cfg, 2).into_iter().map(|c| c.0).collect();
        eprintln!(
            "round {round}: 2 ranks over loopback, {:?} in {:.2} ms",
            hows[0],
            t.elapsed().as_secs_f64() * 1e3
        );
        assert_eq!(hows, [Calibrated::Kept; 2], "round {round}");
    }
}

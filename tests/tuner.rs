//! The tuner's decisions (`plugin::tuner`), without the ABI: for every `ncclFunc_t`, sizes
//! 1 B to 1 GiB and 1 to 64 nodes, on NCCL-like cost tables with -1 cells, only the usable
//! CollNet/SIMPLE cells of CollNet's collectives change, to NCCL's own ring estimate scaled by
//! the model's ratio CollNet / ring over the plugin, so that NCCL's pick (the smallest usable
//! cell) is CollNet exactly where that cell wins. The pricing itself, by hand, and the replay
//! of the measured table are in tests/tuner_ring.rs.
use nccl_net_fabricoll::algo::{self, Algorithm, Collective, Problem};
use nccl_net_fabricoll::config::{AlgoSetting, Config};
use nccl_net_fabricoll::plugin::tuner::{
    self, Chunking, CostTable, Staging, Tuner, ALGO_COLLNET_CHAIN, ALGO_COLLNET_DIRECT, ALGO_RING,
    IGNORE, MAX_CHUNK, MIN_CHUNK, PROTO_SIMPLE,
};
use nccl_net_fabricoll::tune::{Model, MARGIN};

const NALGO: usize = 7;
const NPROTO: usize = 3;

fn base_model() -> Model {
    Model::from_config(&Config::from_lookup(|_| None).unwrap())
}

/// The models a CollNet comm can have: the defaults on net/shm (no eager limit) and on tcp
/// (ofi_rxm's 16 KiB eager limit), and a fast configured network.
fn models() -> Vec<Model> {
    vec![
        base_model(),
        base_model().with_eager(16 << 10),
        Model::new(2.0, 12.0, 20.0),
    ]
}

/// Sizes 1 B to 1 GiB: every power of two and an odd size beside each.
fn sizes() -> Vec<usize> {
    (0..=30)
        .flat_map(|k| [1usize << k, (1usize << k) + (1 << k) / 3 + 1])
        .filter(|s| *s <= 1 << 30)
        .collect()
}

/// A cheap deterministic generator (xorshift), for which cells NCCL disabled.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// An NCCL-like table for `nbytes`: latency plus bytes over bandwidth per cell, with some
/// cells -1 (always LL128 of CollNet and NVLS, which NCCL never offers with CollNet, and a
/// random few more).
fn nccl_table(nbytes: usize, nodes: usize, rng: &mut Rng) -> Vec<f32> {
    let mut t = vec![0f32; NALGO * NPROTO];
    for a in 0..NALGO {
        for p in 0..NPROTO {
            let lat =
                [6.0, 10.0, 14.0][p] * (1.0 + a as f64 / 4.0) * (nodes as f64).log2().max(1.0);
            let bw = [2.0e3, 6.0e3, 10.0e3][p] / (1.0 + a as f64 / 7.0);
            t[a * NPROTO + p] = (lat + nbytes as f64 / bw) as f32;
            let forbidden = (p != PROTO_SIMPLE && (a == 2 || a == 3)) || a >= 4;
            if forbidden || rng.next().is_multiple_of(5) {
                t[a * NPROTO + p] = IGNORE;
            }
        }
    }
    t
}

/// The model's own prediction of a CollNet call of `bytes` on `n` ranks: the best flat
/// algorithm of one host, as a CollNet communicator's `auto` picks it.
fn call_time(m: &Model, coll: Collective, n: usize, bytes: usize) -> f64 {
    let count = if coll == Collective::AllReduce {
        bytes
    } else {
        bytes.div_ceil(n)
    };
    let p = Problem::new(coll, n, count);
    Algorithm::ALL
        .iter()
        .filter(|a| !matches!(a, Algorithm::Hier | Algorithm::Swizzle))
        .filter(|a| algo::supports(**a, coll))
        .filter_map(|a| m.predict(*a, &p, 1))
        .fold(f64::INFINITY, f64::min)
}

/// The host-staging copies of one call of `bytes` on `n` nodes (`Staging::HOST`): one down, one
/// up, each 10 us plus its bytes at 25 GB/s; an AllGather's input and a ReduceScatter's output
/// are one node's part.
fn staging(coll: Collective, n: usize, bytes: usize) -> f64 {
    let part = bytes.div_ceil(n);
    let moved = match coll {
        Collective::AllReduce => 2 * bytes,
        _ => bytes + part,
    };
    2.0 * 10.0 + moved as f64 / 25e3
}

/// The model's time for `nbytes` in calls of `chunk` bytes, one after another, each with its
/// staging copies.
fn chunked_time(m: &Model, coll: Collective, n: usize, nbytes: usize, chunk: usize) -> f64 {
    let call = |b: usize| call_time(m, coll, n, b) + staging(coll, n, b);
    let (full, rest) = (nbytes / chunk, nbytes % chunk);
    let mut t = full as f64 * call(chunk);
    if rest > 0 || full == 0 {
        t += call(rest);
    }
    t
}

/// NCCL's ring over the plugin on the model: 2(n-1) alphas and 2(n-1)/n of the bytes over beta
/// for an AllReduce, half of each for AllGather and ReduceScatter.
fn ring_time(m: &Model, coll: Collective, n: usize, nbytes: usize) -> f64 {
    let steps = if coll == Collective::AllReduce {
        2.0
    } else {
        1.0
    };
    let n = n as f64;
    steps * ((n - 1.0) * m.alpha_us + (n - 1.0) / n * nbytes as f64 * m.beta_us_per_byte)
}

/// NCCL's estimate the tuner scales from: its best usable RING cell, else its best other.
fn anchor(t: &[f32]) -> Option<f32> {
    let min_of = |row: &dyn Fn(usize) -> bool| {
        (0..t.len())
            .filter(|i| row(i / NPROTO) && t[*i] >= 0.0)
            .map(|i| t[i])
            .reduce(f32::min)
    };
    min_of(&|a| a == ALGO_RING)
        .or_else(|| min_of(&|a| a != ALGO_COLLNET_DIRECT && a != ALGO_COLLNET_CHAIN))
}

/// NCCL's pick: the smallest cell that is not negative.
fn pick(t: &[f32]) -> Option<usize> {
    (0..t.len())
        .filter(|i| t[*i] >= 0.0)
        .min_by(|a, b| t[*a].total_cmp(&t[*b]))
}

fn check_call(tuner: &Tuner, m: &Model, func: i32, nbytes: usize, rng: &mut Rng) {
    let before = nccl_table(nbytes, tuner.nnodes, rng);
    let mut after = before.clone();
    tuner.get_coll_info(
        func,
        nbytes,
        &mut CostTable::new(&mut after, NALGO, NPROTO).unwrap(),
    );
    let what = format!("func {func}, {nbytes} B, {} nodes", tuner.nnodes);
    let priced = tuner.enabled && tuner.nnodes >= 2 && tuner::collective(func).is_some();
    for i in 0..before.len() {
        let (a, p) = (i / NPROTO, i % NPROTO);
        let ours =
            priced && (a == ALGO_COLLNET_DIRECT || a == ALGO_COLLNET_CHAIN) && p == PROTO_SIMPLE;
        if before[i] < 0.0 {
            assert_eq!(
                after[i].to_bits(),
                before[i].to_bits(),
                "{what}: -1 cell {a}/{p} changed"
            );
        } else if !ours {
            assert_eq!(
                after[i].to_bits(),
                before[i].to_bits(),
                "{what}: cell {a}/{p} changed"
            );
        } else {
            let coll = tuner::collective(func).unwrap();
            let chunk = tuner.chunk_for(a, coll, nbytes);
            let ours = chunked_time(m, coll, tuner.nnodes, nbytes, chunk);
            let ring = ring_time(m, coll, tuner.nnodes, nbytes);
            let want = anchor(&before).map_or(ours, |x| f64::from(x) * ours / ring) as f32;
            let rel = (after[i] - want).abs() / want.max(1e-3);
            assert!(
                rel < 1e-5,
                "{what}: CollNet cell {a} is {} us, model and anchor say {want}",
                after[i]
            );
        }
    }
    if priced {
        // NCCL then picks CollNet exactly where our price beats its other cells.
        let others: Vec<f32> = (0..before.len())
            .map(|i| {
                let a = i / NPROTO;
                if a == ALGO_COLLNET_DIRECT || a == ALGO_COLLNET_CHAIN {
                    IGNORE
                } else {
                    before[i]
                }
            })
            .collect();
        let best_other = pick(&others).map(|i| others[i]);
        let best_ours = [ALGO_COLLNET_DIRECT, ALGO_COLLNET_CHAIN]
            .iter()
            .map(|a| after[a * NPROTO + PROTO_SIMPLE])
            .filter(|t| *t >= 0.0)
            .fold(f32::INFINITY, f32::min);
        let chosen = pick(&after).map(|i| i / NPROTO);
        let collnet = chosen.is_some_and(|a| a == ALGO_COLLNET_DIRECT || a == ALGO_COLLNET_CHAIN);
        let should = best_ours.is_finite() && best_other.is_none_or(|o| best_ours < o);
        assert_eq!(
            collnet, should,
            "{what}: NCCL would pick {chosen:?} ({best_ours} us against {best_other:?})"
        );
    }
}

#[test]
fn only_collnet_cells_change_and_to_the_models_price() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for (k, m) in models().into_iter().enumerate() {
        // Every node count for one model; a spread for the others (the run stays short).
        let nodes: Vec<usize> = if k == 0 {
            (1..=64).collect()
        } else {
            vec![1, 2, 3, 4, 7, 8, 16, 33, 64]
        };
        for &n in &nodes {
            for chunking in [Chunking::Ours, Chunking::Nccl] {
                let t = Tuner::new(n * 4, n, m.clone(), true, chunking);
                for func in -1..=15 {
                    let sizes = if tuner::collective(func).is_some() {
                        sizes()
                    } else {
                        vec![1, 4096, 1 << 30]
                    };
                    for &s in &sizes {
                        check_call(&t, &m, func, s, &mut rng);
                    }
                }
            }
        }
    }
}

#[test]
fn off_leaves_every_cell() {
    let mut rng = Rng(7);
    for n in [1, 2, 8, 64] {
        let t = Tuner::new(n, n, base_model(), false, Chunking::Ours);
        for func in 0..=15 {
            for s in sizes() {
                check_call(&t, &base_model(), func, s, &mut rng);
                assert_eq!(t.get_chunk_size(func, s, 2, 2), None);
            }
        }
    }
}

#[test]
fn collnet_wins_where_the_engines_are_faster() {
    // A table where NCCL's other algorithms cost 100 us flat: CollNet must win small sizes
    // (the model predicts tens of microseconds) and lose 1 GiB (hundreds of milliseconds).
    let t = Tuner::new(8, 8, base_model(), true, Chunking::Ours);
    for (bytes, wins) in [(1024usize, true), (1 << 30, false)] {
        let mut cells = vec![100f32; NALGO * NPROTO];
        t.get_coll_info(
            tuner::FUNC_ALLREDUCE,
            bytes,
            &mut CostTable::new(&mut cells, NALGO, NPROTO).unwrap(),
        );
        let a = pick(&cells).unwrap() / NPROTO;
        assert_eq!(
            a == ALGO_COLLNET_DIRECT,
            wins,
            "{bytes} B: picked {a}, {cells:?}"
        );
    }
}

#[test]
fn chunks_are_powers_of_two_where_larger_ones_stop_paying() {
    for m in models() {
        for n in [2, 3, 8, 64] {
            let t = Tuner::new(n, n, m.clone(), true, Chunking::Ours);
            for coll in [
                Collective::AllReduce,
                Collective::AllGather,
                Collective::ReduceScatter,
            ] {
                for s in sizes() {
                    let c = t.best_chunk(coll, s);
                    assert!(
                        c.is_power_of_two() && (MIN_CHUNK..=MAX_CHUNK).contains(&c),
                        "{c}"
                    );
                    let time = |c: usize| chunked_time(&m, coll, n, s, c);
                    if c < MAX_CHUNK && c < s {
                        assert!(
                            time(2 * c) >= time(c) * (1.0 - MARGIN),
                            "{coll:?} {s} B: {c} B"
                        );
                    }
                    if c > MIN_CHUNK {
                        assert!(
                            time(c) < time(c / 2) * (1.0 - MARGIN),
                            "{coll:?} {s} B: {c} B"
                        );
                    }
                    let func = match coll {
                        Collective::AllReduce => tuner::FUNC_ALLREDUCE,
                        Collective::AllGather => tuner::FUNC_ALLGATHER,
                        _ => tuner::FUNC_REDUCESCATTER,
                    };
                    assert_eq!(t.get_chunk_size(func, s, 2, 2), Some(c));
                    assert_eq!(t.get_chunk_size(func, s, 3, 2), Some(c));
                    // Not CollNet, not SIMPLE, not CollNet's collective: left alone.
                    for (f, a, p) in [
                        (func, 1, 2),
                        (func, 0, 2),
                        (func, 2, 0),
                        (func, 6, 2),
                        (0, 2, 2),
                        (5, 2, 2),
                        (99, 2, 2),
                        (func, -1, 2),
                    ] {
                        assert_eq!(t.get_chunk_size(f, s, a, p), None);
                    }
                }
            }
        }
    }
}

#[test]
fn nccl_chunks_stay_in_its_range() {
    for s in sizes() {
        for a in [ALGO_COLLNET_DIRECT, ALGO_COLLNET_CHAIN] {
            let c = tuner::nccl_chunk(a, s);
            assert!(c.is_power_of_two() && (MIN_CHUNK..=MAX_CHUNK).contains(&c));
        }
    }
    assert_eq!(tuner::nccl_chunk(ALGO_COLLNET_DIRECT, 1 << 30), MAX_CHUNK);
    assert_eq!(
        tuner::nccl_chunk(ALGO_COLLNET_CHAIN, 1 << 30),
        MAX_CHUNK / 2
    );
    assert_eq!(tuner::nccl_chunk(ALGO_COLLNET_DIRECT, 1), MIN_CHUNK);
}

#[test]
fn odd_tables_are_left_alone() {
    let t = Tuner::new(4, 4, base_model(), true, Chunking::Ours);
    // Too few rows or columns to hold CollNet/SIMPLE: nothing to write.
    for (na, np) in [(2, 3), (7, 2), (1, 1), (0, 0)] {
        let mut cells = vec![5f32; na * np];
        let before = cells.clone();
        t.get_coll_info(
            tuner::FUNC_ALLREDUCE,
            1 << 20,
            &mut CostTable::new(&mut cells, na, np).unwrap(),
        );
        assert_eq!(cells, before);
    }
    let mut cells = vec![0f32; 5];
    assert!(CostTable::new(&mut cells, 7, 3).is_err());
}

#[test]
fn contexts_open_and_close_once() {
    let id = tuner::open(Tuner::new(2, 2, base_model(), true, Chunking::Ours));
    assert_eq!(tuner::context(id).unwrap().nnodes, 2);
    tuner::close(id).unwrap();
    let e = tuner::close(id).unwrap_err().to_string();
    assert!(e.contains("context"), "{e}");
    assert!(tuner::context(id).is_err());
    assert!(tuner::context(12345).is_err());
}

#[test]
fn fabricoll_tuner_is_0_or_1_and_on_by_default() {
    let parse = |v: Option<&str>| {
        Config::from_lookup(|n| {
            (n == "FABRICOLL_TUNER")
                .then(|| v.map(String::from))
                .flatten()
        })
    };
    assert!(parse(None).unwrap().tuner);
    assert!(parse(Some("1")).unwrap().tuner);
    assert!(!parse(Some(" 0 ")).unwrap().tuner);
    for bad in ["yes", "2", "off"] {
        let e = parse(Some(bad)).unwrap_err().to_string();
        assert!(
            e.contains("FABRICOLL_TUNER") && e.contains("accepted values"),
            "{e}"
        );
    }
}

#[test]
fn a_forced_algorithm_is_priced_as_the_communicator_runs_it() {
    let m = base_model();
    let auto = Tuner::new(8, 8, m.clone(), true, Chunking::Nccl);
    let ring = Tuner::new(8, 8, m.clone(), true, Chunking::Nccl)
        .with_forced(AlgoSetting::parse("FABRICOLL_ALGO", "ring").unwrap());
    let p = Problem::new(Collective::AllReduce, 8, 1024);
    assert_eq!(
        ring.chunk_time(Collective::AllReduce, 1024),
        Some((Algorithm::Ring, m.predict(Algorithm::Ring, &p, 1).unwrap()))
    );
    assert!(
        auto.chunk_time(Collective::AllReduce, 1024).unwrap().1
            <= ring.chunk_time(Collective::AllReduce, 1024).unwrap().1
    );
    // An algorithm that does not implement the collective leaves the model's choice.
    let tree = Tuner::new(8, 8, m, true, Chunking::Nccl)
        .with_forced(AlgoSetting::parse("FABRICOLL_ALGO", "tree").unwrap());
    assert_eq!(
        tree.chunk_time(Collective::AllGather, 4096),
        auto.chunk_time(Collective::AllGather, 4096)
    );
}

/// The CollNet price, computed by hand rather than by the model's own functions, on a model
/// whose numbers keep the arithmetic short: alpha 10 us (so each message costs its sender
/// o = 5 us), beta and gamma 1 GB/s (0.001 us per byte), no eager limit; 2 nodes (one head rank
/// each); an AllReduce of m bytes, below the smallest chunk, so one call. At n = 2 the
/// candidates cost: rd 10 + 0.002 m; mesh1 15 + 0.002 m; ring and rdh 20 + 0.0015 m; tree
/// 20 + 0.004 m; mesh and bidir_ring 30 + 0.0015 m; dbtree 30 + 0.003 m. The cheapest is rd
/// below 20000 B and ring (or rdh, the same) above: 1024 B 12.048 us, 16384 B 42.768 us,
/// 30000 B 65 us. The price is written as it is where NCCL left no other cell usable (every
/// other cell -1) and CollNet's buffers need no staging (`Staging::NONE`); the scaling onto
/// NCCL's ring estimate and the staging copies are checked by hand in tests/tuner_ring.rs.
#[test]
fn collnet_prices_are_the_hand_computed_ones() {
    let t = Tuner::new(2, 2, Model::new(10.0, 1.0, 1.0), true, Chunking::Ours)
        .with_staging(Staging::NONE);
    for (bytes, want) in [(1024usize, 12.048f32), (16384, 42.768), (30000, 65.0)] {
        assert!(bytes < MIN_CHUNK);
        let mut cells = vec![-1f32; NALGO * NPROTO];
        for a in [ALGO_COLLNET_DIRECT, ALGO_COLLNET_CHAIN] {
            cells[a * NPROTO + PROTO_SIMPLE] = 1e9;
        }
        t.get_coll_info(
            tuner::FUNC_ALLREDUCE,
            bytes,
            &mut CostTable::new(&mut cells, NALGO, NPROTO).unwrap(),
        );
        for a in [ALGO_COLLNET_DIRECT, ALGO_COLLNET_CHAIN] {
            let got = cells[a * NPROTO + PROTO_SIMPLE];
            assert!(
                (got - want).abs() < 1e-3,
                "{bytes} B, CollNet cell {a}: {got} us, by hand {want} us"
            );
        }
    }
}

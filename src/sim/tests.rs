//! The simulator against the closed-form model, with contention off.
use super::*;
use crate::algo::{self, Algorithm, Collective, Hosts, Options, Problem};
use crate::tune::Model;

/// Where the closed-form model is an exact account of the plan (unsliced, eager, one host):
/// the simulator must give its figure to rounding. `pow2`: only at powers of two (the fold of
/// other rank counts costs the plan more than the formula's one extra exchange).
fn exact(a: Algorithm, c: Collective, n: usize) -> bool {
    use Algorithm::*;
    use Collective::*;
    match (a, c) {
        (Ring, AllReduce | AllGather | ReduceScatter) => true,
        (Rdh, AllReduce | AllGather | ReduceScatter) | (Rd, AllReduce) | (Tree, Reduce) => {
            n.is_power_of_two()
        }
        (Ring, Broadcast | Reduce) | (Mesh, Reduce) => true,
        (Tree, Broadcast) | (Pairwise, AllToAll) => n == 2,
        _ => false,
    }
}

/// Every algorithm and collective the closed-form model prices, on 2..=16 ranks of one host:
/// equal to 1e-9 where `exact` says the formula accounts for the plan, and somewhere different
/// where it does not (so that the list of exact cases stays true: a formula
/// made exact moves into `exact`). The differences are docs/simulator.md's table.
#[test]
fn no_contention_reproduces_the_closed_form() {
    // The plans are unsliced (`Options::default()`): so is the model's pipeline.
    let m = Model::new(10.0, 2.0, 8.0).with_slice(usize::MAX);
    let params = Params::from_model(&m, Hosts::ONE);
    let mut priced = 0;
    for coll in Collective::ALL {
        for a in Algorithm::ALL {
            let mut differs = false;
            let mut any = false;
            for n in 2..=16usize {
                // 720720 = lcm(1..=16): chunks are even, as the formulas assume.
                let p = Problem::new(coll, n, 720_720);
                let Some(f) = m.predict(a, &p, 4) else {
                    continue;
                };
                let s = algo::build(p, a, &Options::default()).expect("the model prices it");
                let t = simulate(&s, 4, Hosts::ONE, &params).unwrap().time_us;
                any = true;
                let rel = (t - f).abs() / f;
                if exact(a, coll, n) {
                    assert!(
                        rel < 1e-9,
                        "{a} {coll:?} on {n} ranks: simulated {t}, formula {f}"
                    );
                } else if rel > 1e-6 {
                    differs = true;
                }
            }
            if any {
                priced += 1;
                let all_exact = (2..=16).all(|n| exact(a, coll, n));
                assert!(
                    all_exact || differs,
                    "{a} {coll:?}: the formula matches the plan wherever `exact` says it does \
                     not; list it there"
                );
            }
        }
    }
    // 26 pairs: the table of tune::formula.
    assert_eq!(priced, 26);
}

/// With contention on and every limit out of the way (one rank per host, no memory limit, no
/// taper), a host's NIC is its rank's link: the same times as without contention.
#[test]
fn contention_with_one_rank_per_host_changes_nothing() {
    let mut m = Model::new(20.0, 1.0, 4.0);
    m.inter_o_us = Some(2.0);
    let hosts = Hosts::blocks(8, 1);
    let off = Params::from_model(&m, hosts);
    let on = Params {
        contention: true,
        ..off
    };
    for a in [
        Algorithm::Ring,
        Algorithm::Mesh,
        Algorithm::Rdh,
        Algorithm::Tree,
    ] {
        let p = Problem::new(Collective::AllReduce, 8, 1 << 14);
        let opts = Options {
            hosts,
            slice: 1024,
            ..Options::default()
        };
        let s = algo::build(p, a, &opts).unwrap();
        let x = simulate(&s, 4, hosts, &off).unwrap().time_us;
        let y = simulate(&s, 4, hosts, &on).unwrap().time_us;
        assert!((x - y).abs() < 1e-9 * x, "{a}: {x} vs {y}");
    }
}

/// Eight ranks on one host sending across at once share its NIC: a flat mesh AllGather over
/// two hosts of 4 takes longer with contention than without (each rank's link alone), and a
/// core taper of 2 slows it further.
#[test]
fn shared_nic_and_taper_slow_the_mesh() {
    let m = Model::new(5.0, 1.0, 4.0);
    let hosts = Hosts::blocks(8, 4);
    let p = Problem::new(Collective::AllGather, 8, 1 << 16);
    let opts = Options {
        hosts,
        ..Options::default()
    };
    let s = algo::build(p, Algorithm::Mesh, &opts).unwrap();
    let off = Params::from_model(&m, hosts);
    let on = Params {
        contention: true,
        ..off
    };
    let tapered = Params { taper: 2.0, ..on };
    let t = |q: &Params| simulate(&s, 4, hosts, q).unwrap().time_us;
    let (a, b, c) = (t(&off), t(&on), t(&tapered));
    // Each rank sends 4 x 256 KiB across; 4 ranks share the NIC: the network part takes 4x.
    assert!(b > 3.0 * a && c > 1.5 * b, "{a} {b} {c}");
}

/// A schedule whose receive has no matching send is refused with the step named.
#[test]
fn unmatched_receive_is_refused() {
    let p = Problem::new(Collective::AllGather, 2, 4);
    let mut s = algo::build(p, Algorithm::Ring, &Options::default()).unwrap();
    s.ranks[0].retain(|st| !matches!(st.op, algo::Op::Send { .. }));
    let params = Params::from_model(&Model::new(1.0, 1.0, 1.0), Hosts::ONE);
    let e = simulate(&s, 4, Hosts::ONE, &params).unwrap_err();
    assert!(e.contains("rank 1") && e.contains("receives from 0"), "{e}");
}

/// A pair's messages go one after the other (one ordered connection per pair), so a chain
/// pipelines its slices: a 3-rank ring Broadcast of two slices takes three slice times (the
/// first slice's two hops, the second's last hop overlapping the first's), not the four of
/// two slices sharing the root's link fairly and both arriving late.
#[test]
fn a_chain_pipelines_its_slices() {
    let m = Model::new(0.0, 1.0, 1.0);
    let hosts = Hosts::blocks(3, 1);
    let params = Params::from_model(&m, hosts);
    // Two slices of 32768 elements (128 KiB).
    let slice = 1 << 15;
    let p = Problem::new(Collective::Broadcast, 3, 2 * slice);
    let opts = Options {
        hosts,
        slice,
        ..Options::default()
    };
    let s = algo::build(p, Algorithm::Ring, &opts).unwrap();
    let t = simulate(&s, 4, hosts, &params).unwrap().time_us;
    // The time of one slice on the model's link.
    let one = (slice * 4) as f64 / 1e3;
    assert!(t > 2.9 * one && t < 3.1 * one, "{t} us, a slice {one} us");
}

/// A received message costs its receiver's CPU `o`, the last part of its `alpha`: a mesh
/// Reduce's root, whose 4 messages come in together, handles them one at a time. On 5 ranks
/// with alpha `a`, `o = a / 2` (the model's default) and each buffer's bytes and reduction
/// `a / 4`: the root's ingress carries the 4 buffers by `a`; it handles the first message from
/// `1.5 a` to `2 a` (the end of its alpha), the others by `3.5 a`, then reduces the 4 buffers in
/// member order by `4.5 a`. Without a receiver's cost it was `3 a` (all four usable at `2 a`).
#[test]
fn a_receiver_handles_its_messages_one_at_a_time() {
    let m = Model::new(4.0, 1.0, 1.0).with_slice(usize::MAX);
    let params = Params::from_model(&m, Hosts::ONE);
    assert_eq!(params.inter.o_us, 2.0);
    let p = Problem::new(Collective::Reduce, 5, 250);
    let s = algo::build(p, Algorithm::Mesh, &Options::default()).unwrap();
    let t = simulate(&s, 4, Hosts::ONE, &params).unwrap().time_us;
    assert!((t - 18.0).abs() < 1e-9, "{t}");
    // The formula prices the same (the first message's handling inside its alpha).
    let f = m.predict(Algorithm::Mesh, &p, 4).unwrap();
    assert!((f - 18.0).abs() < 1e-9, "{f}");
    // A rank's posts go first: a tiny mesh AllGather on 3 ranks posts its two sends (`o`
    // each: until `a`) before it handles the two messages it received meanwhile (until `2 a`).
    let p = Problem::new(Collective::AllGather, 3, 1);
    let s = algo::build(p, Algorithm::Mesh, &Options::default()).unwrap();
    let t = simulate(&s, 4, Hosts::ONE, &params).unwrap().time_us;
    assert!((t - 8.0).abs() < 1e-9, "{t}");
}

/// `bidir_ring`'s rounds on one host are CPU-bound where each round's two posts, two handled
/// receives and reductions take longer than its bytes: on 4 ranks with alpha `a`, `o = a / 2`,
/// each half chunk's bytes `a / 2` and its reduction `a`, a round's CPU work is `4 a`: 3 rounds,
/// `12 a`, as the model prices it (`tune::ring_overlap`).
#[test]
fn a_cpu_bound_bidirectional_ring_is_priced() {
    let m = Model::new(1.0, 1.0, 0.5);
    let params = Params::from_model(&m, Hosts::ONE);
    let p = Problem::new(Collective::ReduceScatter, 4, 250);
    let s = algo::build(p, Algorithm::BidirRing, &Options::default()).unwrap();
    let t = simulate(&s, 4, Hosts::ONE, &params).unwrap().time_us;
    let f = m.predict(Algorithm::BidirRing, &p, 4).unwrap();
    assert!(
        (t - 12.0).abs() < 1e-9 && (f - 12.0).abs() < 1e-9,
        "{t} {f}"
    );
}

/// The lower bound is one: never above the simulated time, for every algorithm and
/// collective on layouts of one and several hosts, sliced or not, with contention off and on
/// (a memory bus and a tapered core included), and close to it where one resource dominates
/// (a one-shot mesh's bytes through the NICs).
#[test]
fn the_lower_bound_never_exceeds_the_simulated_time() {
    let mut m = Model::new(3.0, 1.0, 4.0);
    m.inter_o_us = Some(1.5);
    m.intra.o_us = 0.3;
    let layouts = [Hosts::ONE, Hosts::blocks(12, 4), Hosts::blocks(9, 3)];
    let mut checked = 0;
    for hosts in layouts {
        let n = if hosts == Hosts::ONE {
            7
        } else {
            hosts.ranks()
        };
        let off = Params::from_model(&m, hosts);
        let on = Params {
            contention: true,
            mem_us_per_byte: Some(0.05),
            taper: 2.0,
            ..off
        };
        for coll in Collective::ALL {
            for a in Algorithm::ALL {
                if !algo::supports(a, coll) {
                    continue;
                }
                for (count, slice) in [(5, 0), (3000, 0), (3000, 256)] {
                    let p = Problem::new(coll, n, count);
                    let opts = Options {
                        hosts,
                        slice,
                        intra: Algorithm::Rdh,
                        inter: Algorithm::Ring,
                    };
                    let Ok(s) = algo::build(p, a, &opts) else {
                        continue;
                    };
                    for q in [&off, &on] {
                        let t = simulate(&s, 4, hosts, q).unwrap().time_us;
                        let b = lower_bound(&s, 4, hosts, q).unwrap();
                        assert!(
                            b > 0.0 && b <= t * (1.0 + 1e-9),
                            "{a} {coll:?} on {n} ranks, count {count}, slice {slice}, \
                             contention {}: bound {b} over simulated {t}",
                            q.contention
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 300, "{checked}");
    // Mesh1 on 2 hosts of 4 with 1 MiB each: 16 MiB leave each NIC; the bound is that.
    let hosts = Hosts::blocks(8, 4);
    let params = Params {
        contention: true,
        ..Params::from_model(&m, hosts)
    };
    let p = Problem::new(Collective::AllReduce, 8, 1 << 18);
    let opts = Options {
        hosts,
        ..Options::default()
    };
    let s = algo::build(p, Algorithm::Mesh1, &opts).unwrap();
    let t = simulate(&s, 4, hosts, &params).unwrap().time_us;
    let b = lower_bound(&s, 4, hosts, &params).unwrap();
    let nic = 16.0 * (1 << 20) as f64 * m.beta_us_per_byte;
    assert!((b - nic).abs() < 1e-9 * nic && b > 0.9 * t, "{b} {nic} {t}");
}

/// `simulate_unless_slower` simulates when the bound is under the cutoff (the same outcome as
/// `simulate`) and leaves the schedule out, with its bound, when it is over.
#[test]
fn a_schedule_bounded_above_the_cutoff_is_not_simulated() {
    let m = Model::new(2.0, 1.0, 4.0);
    let hosts = Hosts::blocks(8, 4);
    let params = Params::from_model(&m, hosts);
    let p = Problem::new(Collective::AllReduce, 8, 1 << 12);
    let opts = Options {
        hosts,
        ..Options::default()
    };
    let s = algo::build(p, Algorithm::Ring, &opts).unwrap();
    let full = simulate(&s, 4, hosts, &params).unwrap();
    let b = lower_bound(&s, 4, hosts, &params).unwrap();
    assert_eq!(
        simulate_unless_slower(&s, 4, hosts, &params, b).unwrap(),
        Bounded::Simulated(full.clone())
    );
    assert_eq!(
        simulate_unless_slower(&s, 4, hosts, &params, b * 0.99).unwrap(),
        Bounded::Slower {
            bound_us: b,
            steps: full.steps
        }
    );
}

/// A binary tree's AllReduce is priced with its pipeline's fill (`tune::pipeline_fill`): on one
/// host without contention, the model's `tree` and `dbtree` are the simulator's within 5 %
/// where the buffer is one slice per tree (the fill is then all of the time but the alphas;
/// without it the model was 2 to 12 times under), and at 4 and 32 slices no more than a tenth
/// under nor a third over: the pipelined limit charges a node's receives and its reductions one
/// after the other (`3 B b + 2 B g`), where the simulator's node receives the next slices while
/// it reduces one.
#[test]
fn the_trees_pipeline_fill_is_priced() {
    let slice = 1usize << 20;
    let m = Model::new(1.0, 50.0, 20.0).with_slice(slice);
    let params = Params::from_model(&m, Hosts::ONE);
    let opts = Options {
        slice: slice / 4,
        ..Options::default()
    };
    for n in [8usize, 64, 512] {
        for a in [Algorithm::Tree, Algorithm::DbTree] {
            for (mib, lo, hi) in [(1usize, 0.95, 1.05), (4, 0.75, 1.1), (32, 0.75, 1.1)] {
                let p = Problem::new(Collective::AllReduce, n, mib << 18);
                let f = m.predict(a, &p, 4).unwrap();
                let s = algo::build(p, a, &opts).unwrap();
                let t = simulate(&s, 4, Hosts::ONE, &params).unwrap().time_us;
                assert!(
                    (lo..=hi).contains(&(t / f)),
                    "{a} on {n} ranks, {mib} MiB: simulated {t:.1} us, model {f:.1} us"
                );
            }
        }
    }
}

/// A sliced binomial Reduce over hosts whose network is slower than the reductions: the
/// root's farthest children are subtrees that pass their slices up only once their CPU has
/// reduced most of them, and the root then waits for them on its NIC. The model follows the
/// slices through the subtrees (`tune::pipeline`); without that it priced the root's own
/// reductions, well under the plan's time. One host of 64 ranks: the flat model's price.
#[test]
fn a_binomial_reduce_over_hosts_is_priced() {
    let slice = 1usize << 20;
    for (hosts_n, per_host) in [(8usize, 8usize), (4, 8), (16, 4), (1, 64)] {
        for gbit in [100.0, 400.0] {
            let mut m = Model::new(1.0, gbit / 8.0, 20.0).with_slice(slice);
            m.inter_o_us = Some(0.5);
            m.intra.alpha_us = 1.0;
            m.intra.beta_us_per_byte = crate::tune::gbps_to_us_per_byte(50.0);
            m.intra.o_us = 0.5;
            let n = hosts_n * per_host;
            let hosts = Hosts::blocks(n, per_host);
            let params = Params {
                contention: true,
                ..Params::from_model(&m, hosts)
            };
            let opts = Options {
                hosts,
                slice: slice / 4,
                ..Options::default()
            };
            for mib in [1usize, 8, 32] {
                let p = Problem::new(Collective::Reduce, n, mib << 18);
                let f = m.predict_on(Algorithm::Tree, &p, 4, &opts).unwrap();
                let s = algo::build(p, Algorithm::Tree, &opts).unwrap();
                let t = simulate(&s, 4, hosts, &params).unwrap().time_us;
                assert!(
                    (0.95..=1.05).contains(&(t / f)),
                    "{hosts_n}x{per_host}, {gbit} Gbit/s, {mib} MiB: simulated {t:.1} us, \
                     model {f:.1} us"
                );
            }
        }
    }
}

//! Export a schedule as GOAL, the schedule language of LogGOPSim and ATLAHS: a `num_ranks`
//! line, then per rank a `rank R { ... }` block of labelled operations (`lI: send Bb to P tag T`,
//! `lI: recv Bb from P tag T`, `lI: calc NS`) and dependencies (`lI requires lJ`: I starts once
//! J has completed). PURE: it writes to any `io::Write` the caller gives.
//!
//! Step i of a rank is labelled `li`. A `Send` and a `Recv` are themselves; a `RecvReduce` is
//! a receive `li` and the reduction `ri: calc` after it (`ri requires li`), and the steps that
//! depend on step i require `ri`; `Reduce` and `Copy` are `calc`s of their CPU time at the
//! parameters' `gamma` and `copy`, in nanoseconds (LogGOPSim's unit), rounded; `Nop` is
//! `calc 0`. Every dependency of a schedule is on completion, so only `requires` is written
//! (GOAL's `irequires`, start after start, has no counterpart). Messages are matched as the
//! executor matches them (the k-th send from a to b with the k-th receive at b from a), so the
//! tag of a message is k: GOAL matches by source and tag, so every send meets exactly its
//! receive whatever order the operations run in.
#![forbid(unsafe_code)]

use super::Params;
use crate::algo::{Op, Schedule};
use rustc_hash::FxHashMap;
use std::io::{self, Write};

/// Nanoseconds of `bytes` at `us_per_byte`, rounded.
fn ns(bytes: usize, us_per_byte: f64) -> u64 {
    (bytes as f64 * us_per_byte * 1e3).round() as u64
}

/// Write `s` as GOAL, with elements of `elem` bytes and CPU work priced by `p`.
pub fn write_goal(s: &Schedule, elem: usize, p: &Params, out: &mut dyn Write) -> io::Result<()> {
    let pr = &s.problem;
    writeln!(
        out,
        "// fabricoll {} {:?}, {} ranks, count {}, {} B elements",
        s.algo, pr.coll, pr.nranks, pr.count, elem
    )?;
    writeln!(out, "num_ranks {}", pr.nranks)?;
    // Messages so far per peer: sends to it, receives from it.
    let mut sent: FxHashMap<usize, u64> = FxHashMap::default();
    let mut received: FxHashMap<usize, u64> = FxHashMap::default();
    for (r, steps) in s.ranks.iter().enumerate() {
        sent.clear();
        received.clear();
        writeln!(out, "\nrank {r} {{")?;
        for (i, st) in steps.iter().enumerate() {
            match st.op {
                Op::Send { peer, src } => {
                    let k = sent.entry(peer).or_insert(0);
                    writeln!(out, "l{i}: send {}b to {peer} tag {k}", src.len * elem)?;
                    *k += 1;
                }
                Op::Recv { peer, dst } | Op::RecvReduce { peer, dst, .. } => {
                    let k = received.entry(peer).or_insert(0);
                    writeln!(out, "l{i}: recv {}b from {peer} tag {k}", dst.len * elem)?;
                    *k += 1;
                }
                Op::Reduce { dst, .. } => writeln!(
                    out,
                    "l{i}: calc {}",
                    ns(dst.len * elem, p.gamma_us_per_byte)
                )?,
                Op::Copy { src, .. } => {
                    writeln!(out, "l{i}: calc {}", ns(src.len * elem, p.copy_us_per_byte))?
                }
                Op::Nop => writeln!(out, "l{i}: calc 0")?,
            }
            for &d in &st.deps {
                let done = if matches!(steps[d].op, Op::RecvReduce { .. }) {
                    'r'
                } else {
                    'l'
                };
                writeln!(out, "l{i} requires {done}{d}")?;
            }
            if let Op::RecvReduce { dst, .. } = st.op {
                writeln!(
                    out,
                    "r{i}: calc {}",
                    ns(dst.len * elem, p.gamma_us_per_byte)
                )?;
                writeln!(out, "r{i} requires l{i}")?;
            }
        }
        writeln!(out, "}}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::check::check;
    use crate::algo::{build, Algorithm, Buf, Builder, Collective, Options, Problem, Span};
    use crate::sim::Level;

    fn params() -> Params {
        let level = Level {
            alpha_us: 1.0,
            beta_us_per_byte: 1e-3,
            o_us: 0.5,
        };
        Params {
            intra: level,
            inter: level,
            gamma_us_per_byte: 2e-3,
            copy_us_per_byte: 1e-3,
            contention: false,
            mem_us_per_byte: None,
            taper: 1.0,
            burst: None,
        }
    }

    fn goal(s: &Schedule, elem: usize) -> String {
        let mut v = Vec::new();
        write_goal(s, elem, &params(), &mut v).unwrap();
        String::from_utf8(v).unwrap()
    }

    /// A GOAL file's operations: (rank, label, kind, bytes or ns, peer, tag), and its
    /// dependencies: (rank, label, required label). Panics on a line it does not know, and on
    /// a dependency that names a label its rank has not defined above it (txt2bin refuses it).
    type Ops = Vec<(usize, String, String, u64, usize, u64)>;
    fn parse(text: &str) -> (usize, Ops, Vec<(usize, String, String)>) {
        let (mut n, mut rank) = (0, None);
        let (mut ops, mut deps) = (Vec::new(), Vec::new());
        let mut defined = std::collections::HashSet::new();
        for line in text.lines().map(str::trim) {
            let w: Vec<&str> = line.split_whitespace().collect();
            match w.as_slice() {
                [] => {}
                [c, ..] if c.starts_with("//") => {}
                ["num_ranks", k] => n = k.parse().unwrap(),
                ["rank", r, "{"] => {
                    rank = Some(r.parse::<usize>().unwrap());
                    defined.clear();
                }
                ["}"] => rank = None,
                [l, "requires", d] => {
                    assert!(defined.contains(*l) && defined.contains(*d), "{line}");
                    deps.push((rank.unwrap(), l.to_string(), d.to_string()))
                }
                [l, kind @ ("send" | "recv"), b, dir, p, "tag", t] => {
                    assert_eq!(*dir, if *kind == "send" { "to" } else { "from" }, "{line}");
                    let bytes = b.strip_suffix('b').unwrap().parse().unwrap();
                    let label = l.strip_suffix(':').unwrap().to_string();
                    let (p, t) = (p.parse().unwrap(), t.parse().unwrap());
                    assert!(defined.insert(label.clone()), "{line}: defined twice");
                    ops.push((rank.unwrap(), label, kind.to_string(), bytes, p, t));
                }
                [l, "calc", c] => {
                    let label = l.strip_suffix(':').unwrap().to_string();
                    let c = c.parse().unwrap();
                    assert!(defined.insert(label.clone()), "{line}: defined twice");
                    ops.push((rank.unwrap(), label, "calc".into(), c, 0, 0));
                }
                _ => panic!("not GOAL: {line}"),
            }
        }
        (n, ops, deps)
    }

    #[test]
    fn a_two_rank_exchange_is_written_as_goal() {
        // Each rank sends its input to the other, copies it to its output, and receive-reduces
        // the other's into the output after the copy.
        let mut b = Builder::new(2);
        for r in 0..2 {
            let inp = Span::new(Buf::In, 0, 3);
            let out = Span::new(Buf::Out, 0, 3);
            b.send(r, 1 - r, inp, &[]);
            let c = b.copy(r, inp, out, &[]).unwrap();
            b.recv_reduce(r, 1 - r, out, out, &[c]);
        }
        let s = b.finish(Problem::new(Collective::AllReduce, 2, 3), Algorithm::Mesh);
        check(&s).unwrap();
        // 12 bytes: the copy at 1 ns a byte, the reduction at 2.
        let rank = |r: usize| {
            format!(
                "rank {r} {{\nl0: send 12b to {p} tag 0\nl1: calc 12\nl2: recv 12b from {p} tag 0\n\
                 l2 requires l1\nr2: calc 24\nr2 requires l2\n}}\n",
                p = 1 - r
            )
        };
        let want = format!(
            "// fabricoll mesh AllReduce, 2 ranks, count 3, 4 B elements\nnum_ranks 2\n\n{}\n{}",
            rank(0),
            rank(1)
        );
        assert_eq!(goal(&s, 4), want);
    }

    /// Every send has exactly one receive of the same size with the same tag at its peer,
    /// every label is defined once per rank before a dependency names it (`parse`), and every
    /// dependency of the plan is written, for several plans.
    #[test]
    fn every_send_meets_its_receive() {
        let cases = [
            (Algorithm::Ring, Collective::AllReduce, 4, 10, 0),
            (Algorithm::Ring, Collective::AllReduce, 5, 23, 2),
            (Algorithm::Rdh, Collective::AllReduce, 6, 17, 3),
            (Algorithm::Tree, Collective::Broadcast, 7, 9, 2),
            (Algorithm::Pairwise, Collective::AllToAll, 4, 3, 0),
            (Algorithm::Mesh, Collective::ReduceScatter, 3, 5, 2),
        ];
        for (algo, coll, n, count, slice) in cases {
            let o = Options {
                slice,
                ..Options::default()
            };
            let s = build(Problem::new(coll, n, count), algo, &o).unwrap();
            let text = goal(&s, 2);
            let (num, ops, deps) = parse(&text);
            assert_eq!(num, n);
            let steps: usize = s.ranks.iter().map(Vec::len).sum();
            let reduces = s
                .ranks
                .iter()
                .flatten()
                .filter(|st| matches!(st.op, Op::RecvReduce { .. }))
                .count();
            assert_eq!(ops.len(), steps + reduces, "{algo} {coll:?}");
            let mut sends: Vec<(usize, usize, u64, u64)> = Vec::new();
            let mut recvs: Vec<(usize, usize, u64, u64)> = Vec::new();
            for (r, _, kind, bytes, peer, tag) in &ops {
                match kind.as_str() {
                    "send" => sends.push((*r, *peer, *tag, *bytes)),
                    "recv" => recvs.push((*peer, *r, *tag, *bytes)),
                    _ => {}
                }
            }
            sends.sort_unstable();
            recvs.sort_unstable();
            assert!(!sends.is_empty());
            assert_eq!(sends, recvs, "{algo} {coll:?}: sends and receives differ");
            sends.dedup_by_key(|m| (m.0, m.1, m.2));
            assert_eq!(
                sends.len(),
                recvs.len(),
                "{algo} {coll:?}: a tag used twice"
            );
            let want: usize = s.ranks.iter().flatten().map(|st| st.deps.len()).sum();
            assert_eq!(deps.len(), want + reduces, "{algo} {coll:?}");
        }
    }
}

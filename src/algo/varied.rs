//! Schedules of the collectives whose blocks differ per rank (AllGatherV, ReduceScatterV,
//! AllToAllV), plus Gather, Scatter and Barrier.
//!
//! A rank of an AllToAllV knows only its own counts, so these schedules are built one rank at a
//! time from that rank's `Spec` (`schedule` takes the ranks to build; the tests build all of
//! them). Every pair of ranks exchanges the same number of messages whatever the counts (an
//! empty block is an empty message, and no block is sliced), so ranks whose counts disagree
//! fail on a message of the wrong size (or a signature that differs) instead of waiting for a
//! message that never comes.
use super::{AlgoError, AlgoResult, Algorithm, Buf, Builder, Collective, Problem, Schedule, Span};
use std::hash::{Hash, Hasher};

/// The collectives of this file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Varied {
    Gather,
    Scatter,
    Barrier,
    AllGatherV,
    ReduceScatterV,
    AllToAllV,
}

/// What a `Problem` of a varied collective adds to the uniform ones: which collective, and a
/// hash of the counts every rank must agree on (part of the call's signature).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shape {
    pub coll: Varied,
    pub hash: u64,
}

/// A block of a buffer: (offset, length) in elements.
pub type Block = (usize, usize);

/// One rank's arguments of a varied collective, in elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Spec {
    /// Every rank's input (`count`) lands as block `rank` of the root's output.
    Gather {
        count: usize,
        root: usize,
    },
    /// Block i (`count`) of the root's input lands in rank i's output.
    Scatter {
        count: usize,
        root: usize,
    },
    Barrier,
    /// Rank i's input lands at `blocks[i]` of every output (the same on every rank).
    AllGatherV {
        blocks: Vec<Block>,
    },
    /// Rank i receives block i (`counts[i]`, blocks packed in the input) of the reduction.
    ReduceScatterV {
        counts: Vec<usize>,
    },
    /// Block `send[j]` of the input goes to rank j; rank i's block lands at `recv[i]`.
    AllToAllV {
        send: Vec<Block>,
        recv: Vec<Block>,
    },
}

fn end(b: &Block) -> usize {
    b.0 + b.1
}

impl Spec {
    pub fn coll(&self) -> Varied {
        match self {
            Spec::Gather { .. } => Varied::Gather,
            Spec::Scatter { .. } => Varied::Scatter,
            Spec::Barrier => Varied::Barrier,
            Spec::AllGatherV { .. } => Varied::AllGatherV,
            Spec::ReduceScatterV { .. } => Varied::ReduceScatterV,
            Spec::AllToAllV { .. } => Varied::AllToAllV,
        }
    }

    /// Elements of rank `r`'s input and output buffers.
    pub fn lens(&self, r: usize, n: usize) -> (usize, usize) {
        match self {
            Spec::Gather { count, root } => (*count, if r == *root { count * n } else { 0 }),
            Spec::Scatter { count, root } => (if r == *root { count * n } else { 0 }, *count),
            Spec::Barrier => (0, 0),
            Spec::AllGatherV { blocks } => (blocks[r].1, blocks.iter().map(end).max().unwrap_or(0)),
            Spec::ReduceScatterV { counts } => (counts.iter().sum(), counts[r]),
            Spec::AllToAllV { send, recv } => (
                send.iter().map(end).max().unwrap_or(0),
                recv.iter().map(end).max().unwrap_or(0),
            ),
        }
    }

    /// The problem (for the executor and the call's signature): the uniform collective nearest
    /// in kind (which decides whether the op applies), the count and root every rank shares,
    /// and a hash of the counts that all ranks must agree on.
    pub fn problem(&self, n: usize) -> Problem {
        let (carrier, count, root, hash) = match self {
            Spec::Gather { count, root } => (Collective::AllGather, *count, *root, 0),
            Spec::Scatter { count, root } => (Collective::Broadcast, *count, *root, 0),
            Spec::Barrier => (Collective::AllGather, 0, 0, 0),
            Spec::AllGatherV { blocks } => {
                let counts: Vec<usize> = blocks.iter().map(|b| b.1).collect();
                (Collective::AllGather, counts.iter().sum(), 0, hash(&counts))
            }
            Spec::ReduceScatterV { counts } => (
                Collective::ReduceScatter,
                counts.iter().sum(),
                0,
                hash(counts),
            ),
            // Each rank knows only its own row and column of the counts: the sizes of the
            // messages are what checks them.
            Spec::AllToAllV { .. } => (Collective::AllToAll, 0, 0, 0),
        };
        let mut p = Problem::new(carrier, n, count).with_root(root);
        p.shape = Some(Shape {
            coll: self.coll(),
            hash,
        });
        p
    }

    /// Check rank `r`'s spec against `n` ranks; the error names the argument.
    fn validate(&self, n: usize, r: usize) -> AlgoResult<()> {
        let bad = |s: String| Err(AlgoError::Invalid(s));
        let len_is_n = |name: &str, len: usize| {
            if len == n {
                Ok(())
            } else {
                bad(format!("{name}: {len} entries for {n} ranks"))
            }
        };
        match self {
            Spec::Gather { root, count } | Spec::Scatter { root, count } => {
                if *root >= n {
                    return bad(format!("root: {root} is not a rank of {n}"));
                }
                if count.checked_mul(n).is_none() {
                    return bad(format!("count: {count} x {n} ranks overflows"));
                }
            }
            Spec::Barrier => {}
            Spec::AllGatherV { blocks } => {
                len_is_n("recvcounts", blocks.len())?;
                disjoint("displs", blocks)?;
            }
            Spec::ReduceScatterV { counts } => {
                len_is_n("recvcounts", counts.len())?;
                counts
                    .iter()
                    .try_fold(0usize, |a, c| a.checked_add(*c))
                    .ok_or_else(|| AlgoError::Invalid("recvcounts: the sum overflows".into()))?;
            }
            Spec::AllToAllV { send, recv } => {
                len_is_n("sendcounts", send.len())?;
                len_is_n("recvcounts", recv.len())?;
                for (name, bs) in [("sdispls", send), ("rdispls", recv)] {
                    if bs.iter().any(|b| b.0.checked_add(b.1).is_none()) {
                        return bad(format!("{name}: a block's end overflows"));
                    }
                }
                disjoint("rdispls", recv)?;
                if send[r].1 != recv[r].1 {
                    return bad(format!(
                        "sendcounts: {} elements to this rank itself, recvcounts: {} from it",
                        send[r].1, recv[r].1
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Fails (naming `name`) when blocks overflow or two non-empty blocks overlap: ranks would
/// write the same elements at once.
fn disjoint(name: &str, blocks: &[Block]) -> AlgoResult<()> {
    if blocks.iter().any(|b| b.0.checked_add(b.1).is_none()) {
        return Err(AlgoError::Invalid(format!(
            "{name}: a block's end overflows"
        )));
    }
    let mut v: Vec<(Block, usize)> = blocks
        .iter()
        .copied()
        .zip(0..)
        .filter(|(b, _)| b.1 > 0)
        .collect();
    v.sort_unstable();
    for w in v.windows(2) {
        if end(&w[0].0) > w[1].0 .0 {
            return Err(AlgoError::Invalid(format!(
                "{name}: the blocks of ranks {} and {} overlap",
                w[0].1, w[1].1
            )));
        }
    }
    Ok(())
}

/// Check rank `r`'s spec against `n` ranks (as `schedule` does); the error ("name: why")
/// names the argument.
pub fn validate(spec: &Spec, n: usize, r: usize) -> AlgoResult<()> {
    if r >= n {
        return Err(AlgoError::Invalid(format!(
            "rank: {r} is not a rank of {n}"
        )));
    }
    spec.validate(n, r)
}

fn hash(counts: &[usize]) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    counts.hash(&mut h);
    h.finish()
}

/// The schedule of the varied collective whose specs `ranks` lists (rank, that rank's spec);
/// ranks not listed get no steps. All specs must be of one collective.
pub fn schedule(n: usize, ranks: &[(usize, &Spec)]) -> AlgoResult<Schedule> {
    if n == 0 {
        return Err(AlgoError::Invalid("nranks: must be at least 1".into()));
    }
    let Some((_, first)) = ranks.first() else {
        return Err(AlgoError::Invalid("ranks: none to build".into()));
    };
    let mut b = Builder::new(n);
    for (r, spec) in ranks {
        if *r >= n || spec.coll() != first.coll() {
            return Err(AlgoError::Invalid(format!(
                "rank: {r} of {n} with {:?}",
                spec.coll()
            )));
        }
        spec.validate(n, *r)?;
        build_rank(&mut b, spec, *r, n);
        if b.ranks[*r].is_empty() {
            b.push(*r, super::Op::Nop, &[]);
        }
    }
    let algo = match first.coll() {
        Varied::AllToAllV => Algorithm::Pairwise,
        _ => Algorithm::Mesh,
    };
    Ok(b.finish(first.problem(n), algo))
}

fn inp(off: usize, len: usize) -> Span {
    Span::new(Buf::In, off, len)
}

fn out(off: usize, len: usize) -> Span {
    Span::new(Buf::Out, off, len)
}

/// Rank `r`'s steps. Peers are visited in pairwise order (send to r+k, receive from r-k), so
/// that at each k every rank has one partner to send to and one to receive from.
fn build_rank(b: &mut Builder, spec: &Spec, r: usize, n: usize) {
    let to = |k: usize| (r + k) % n;
    let from = |k: usize| (r + n - k) % n;
    match spec {
        Spec::Gather { count: c, root } => {
            if r == *root {
                b.copy(r, inp(0, *c), out(r * c, *c), &[]);
                for k in 1..n {
                    b.recv(r, from(k), out(from(k) * c, *c), &[]);
                }
            } else {
                b.send(r, *root, inp(0, *c), &[]);
            }
            confirm(b, r, n);
        }
        Spec::Scatter { count: c, root } => {
            if r == *root {
                for k in 1..n {
                    b.send(r, to(k), inp(to(k) * c, *c), &[]);
                }
                b.copy(r, inp(r * c, *c), out(0, *c), &[]);
            } else {
                b.recv(r, *root, out(0, *c), &[]);
            }
            confirm(b, r, n);
        }
        Spec::Barrier => {
            // Dissemination: in round d a rank tells rank r+d that it and everything it heard
            // of have arrived, once it has heard from rank r-d of the round before.
            let mut prev: Vec<usize> = vec![];
            let mut d = 1;
            while d < n {
                b.send(r, (r + d) % n, inp(0, 0), &prev);
                prev = vec![b.recv(r, (r + n - d) % n, out(0, 0), &[])];
                d *= 2;
            }
        }
        Spec::AllGatherV { blocks } => {
            let own = inp(0, blocks[r].1);
            for k in 1..n {
                b.send(r, to(k), own, &[]);
                let (o, l) = blocks[from(k)];
                b.recv(r, from(k), out(o, l), &[]);
            }
            b.copy(r, own, out(blocks[r].0, blocks[r].1), &[]);
        }
        Spec::ReduceScatterV { counts } => {
            let off = |i: usize| counts[..i].iter().sum::<usize>();
            let mine = out(0, counts[r]);
            let mut last: Vec<usize> = b
                .copy(r, inp(off(r), counts[r]), mine, &[])
                .into_iter()
                .collect();
            for k in 1..n {
                b.send(r, to(k), inp(off(to(k)), counts[to(k)]), &[]);
                last = vec![b.recv_reduce(r, from(k), mine, mine, &last)];
            }
        }
        Spec::AllToAllV { send, recv } => {
            for k in 1..n {
                b.send(r, to(k), inp(send[to(k)].0, send[to(k)].1), &[]);
                b.recv(r, from(k), out(recv[from(k)].0, recv[from(k)].1), &[]);
            }
            b.copy(r, inp(send[r].0, send[r].1), out(recv[r].0, recv[r].1), &[]);
        }
    }
}

/// A rank that only sends (the Gather leaves, the Scatter root) cannot see that another
/// rank's call differs: every rank also sends an empty message to the next rank and
/// receives one from the previous (as `algo::build` does for Broadcast and Reduce).
fn confirm(b: &mut Builder, r: usize, n: usize) {
    if n > 1 {
        b.send(r, (r + 1) % n, inp(0, 0), &[]);
        b.recv(r, (r + n - 1) % n, out(0, 0), &[]);
    }
}

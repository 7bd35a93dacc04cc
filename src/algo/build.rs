//! Building a schedule: the checks of a problem, the dispatch to each algorithm's
//! implementation (the `Collectives` trait), and which collectives each implements.
use super::*;

/// Build the schedule of `algo` for `problem`.
pub fn build(problem: Problem, algo: Algorithm, opts: &Options) -> AlgoResult<Schedule> {
    let n = problem.nranks;
    if n == 0 {
        return Err(AlgoError::Invalid("nranks: must be at least 1".into()));
    }
    if problem.root >= n {
        return Err(AlgoError::Invalid(format!(
            "root: {} is not a rank of {n}",
            problem.root
        )));
    }
    if problem.count.checked_mul(n).is_none() {
        return Err(AlgoError::Invalid("count: count x nranks overflows".into()));
    }
    if let Some((off, len)) = problem.window {
        if !matches!(
            problem.coll,
            Collective::AllGather | Collective::ReduceScatter
        ) {
            return Err(AlgoError::Invalid(
                "window: only AllGather and ReduceScatter take a window".into(),
            ));
        }
        if off.checked_add(len).is_none_or(|e| e > problem.count * n) {
            return Err(AlgoError::Invalid(format!(
                "window: [{off}, +{len}) is outside the {} elements",
                problem.count * n
            )));
        }
        if matches!(algo, Algorithm::Hier | Algorithm::Swizzle) {
            return Err(AlgoError::NotApplicable {
                algo,
                coll: problem.coll,
            });
        }
    }
    let longest = problem.in_len().max(problem.out_len());
    if opts.slice > 0 && longest / opts.slice > MAX_SLICES {
        return Err(AlgoError::Invalid(format!(
            "count: {longest} elements in slices of {} make more than {MAX_SLICES} slices, more \
             steps than a schedule can list",
            opts.slice
        )));
    }
    if !opts.hosts.fits(n) {
        return Err(AlgoError::Invalid(format!(
            "hosts: the layout names {} ranks, the problem has {n}",
            opts.hosts.ranks()
        )));
    }
    let mut b = Builder::new(n);
    // Flat algorithms run in the topology-aware order (each host's ranks contiguous, so that a
    // ring crosses each host boundary once per direction); member m is rank `group[m]` and its
    // chunk and root are that rank's. Two-level algorithms read the layout themselves, and
    // AllToAll's blocks are indexed by member, so they keep the rank order.
    let two_level = matches!(algo, Algorithm::Hier | Algorithm::Swizzle);
    let group: Vec<usize> = if two_level || problem.coll == Collective::AllToAll {
        (0..n).collect()
    } else {
        opts.hosts.order(n)
    };
    let root = group
        .iter()
        .position(|&r| r == problem.root)
        .expect("the root is a rank of the group");
    let start = no_deps(n);
    let inp = |len: usize| vec![Span::new(Buf::In, 0, len); n];
    let out = |len: usize| vec![Span::new(Buf::Out, 0, len); n];
    let c = problem.count;
    let na = || AlgoError::NotApplicable {
        algo,
        coll: problem.coll,
    };
    let algo_impl = implementation(algo).ok_or_else(na)?;
    match problem.coll {
        Collective::AllReduce => {
            algo_impl.all_reduce(&mut b, &group, &inp(c), &out(c), &start, opts)
        }
        Collective::AllGather => {
            let cs: Vec<(usize, usize)> = group.iter().map(|&r| problem.slice(r)).collect();
            let src: Vec<Span> = (0..n).map(|i| Span::new(Buf::In, 0, cs[i].1)).collect();
            algo_impl.all_gather(
                &mut b,
                &group,
                &src,
                &out(problem.out_len()),
                &cs,
                &start,
                opts,
            )
        }
        Collective::ReduceScatter => {
            let cs: Vec<(usize, usize)> = group.iter().map(|&r| problem.slice(r)).collect();
            let dst: Vec<Span> = (0..n).map(|i| Span::new(Buf::Out, 0, cs[i].1)).collect();
            algo_impl.reduce_scatter(
                &mut b,
                &group,
                &inp(problem.in_len()),
                &dst,
                &cs,
                &start,
                opts,
            )
        }
        Collective::Broadcast => {
            algo_impl.broadcast(&mut b, &group, root, &inp(c), &out(c), &start, opts)
        }
        Collective::Reduce => {
            algo_impl.reduce(&mut b, &group, root, &inp(c), &out(c), &start, opts)
        }
        Collective::AllToAll => {
            algo_impl.all_to_all(&mut b, &group, &inp(c * n), &out(c * n), c, &start, opts)
        }
    }
    .map_err(|e| match e {
        AlgoError::NotApplicable { .. } => na(),
        e => e,
    })?;
    if matches!(problem.coll, Collective::Broadcast | Collective::Reduce) && n > 1 {
        confirm_calls(&mut b, n);
    }
    Ok(b.finish(problem, algo))
}

/// Rooted collectives leave some ranks only sending (the Broadcast root, the leaves of a
/// Reduce), and a rank that receives nothing cannot see that another rank's call differs (the
/// executor compares the call signature each message carries). So every rank of a rooted
/// collective also sends an empty message to the next rank and receives one from the previous,
/// none waiting for anything else.
fn confirm_calls(b: &mut Builder, n: usize) {
    for r in 0..n {
        b.send(r, (r + 1) % n, Span::new(Buf::In, 0, 0), &[]);
        b.recv(r, (r + n - 1) % n, Span::new(Buf::Out, 0, 0), &[]);
    }
}

/// What each algorithm implements, over a group of ranks. `src[m]`/`dst[m]` are group member
/// m's spans; `start[g]` are the steps of global rank g the phase waits for. Default methods
/// answer "not applicable".
pub trait Collectives {
    fn algorithm(&self) -> Algorithm;

    fn na(&self, coll: Collective) -> AlgoError {
        AlgoError::NotApplicable {
            algo: self.algorithm(),
            coll,
        }
    }

    /// A sub-algorithm's result, its "not applicable" reported as this algorithm's (for the
    /// compositions of algorithms).
    fn as_own(&self, coll: Collective, r: AlgoResult<()>) -> AlgoResult<()> {
        r.map_err(|e| match e {
            AlgoError::NotApplicable { .. } => self.na(coll),
            e => e,
        })
    }

    /// Every member ends with the reduction of all members' `src` in its `dst` (equal lengths).
    fn all_reduce(
        &self,
        _b: &mut Builder,
        _g: &[usize],
        _src: &[Span],
        _dst: &[Span],
        _start: &Deps,
        _o: &Options,
    ) -> AlgoResult<()> {
        Err(self.na(Collective::AllReduce))
    }

    /// `src[m]` is member m's chunk (length `chunks[m].1`); every member ends with all chunks
    /// in `dst` at `chunks[i].0`.
    #[allow(clippy::too_many_arguments)]
    fn all_gather(
        &self,
        _b: &mut Builder,
        _g: &[usize],
        _src: &[Span],
        _dst: &[Span],
        _chunks: &[(usize, usize)],
        _start: &Deps,
        _o: &Options,
    ) -> AlgoResult<()> {
        Err(self.na(Collective::AllGather))
    }

    /// `src[m]` is member m's whole vector; member m ends with the reduction of chunk m
    /// (`chunks[m]`) of everyone's vector in `dst[m]` (length `chunks[m].1`).
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter(
        &self,
        _b: &mut Builder,
        _g: &[usize],
        _src: &[Span],
        _dst: &[Span],
        _chunks: &[(usize, usize)],
        _start: &Deps,
        _o: &Options,
    ) -> AlgoResult<()> {
        Err(self.na(Collective::ReduceScatter))
    }

    /// Every member ends with member `root`'s `src` in its `dst` (root is a member index).
    #[allow(clippy::too_many_arguments)]
    fn broadcast(
        &self,
        _b: &mut Builder,
        _g: &[usize],
        _root: usize,
        _src: &[Span],
        _dst: &[Span],
        _start: &Deps,
        _o: &Options,
    ) -> AlgoResult<()> {
        Err(self.na(Collective::Broadcast))
    }

    /// Member `root` ends with the reduction of everyone's `src` in its `dst`.
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        _b: &mut Builder,
        _g: &[usize],
        _root: usize,
        _src: &[Span],
        _dst: &[Span],
        _start: &Deps,
        _o: &Options,
    ) -> AlgoResult<()> {
        Err(self.na(Collective::Reduce))
    }

    /// Block j (length `count`) of member i's `src` lands as block i of member j's `dst`.
    #[allow(clippy::too_many_arguments)]
    fn all_to_all(
        &self,
        _b: &mut Builder,
        _g: &[usize],
        _src: &[Span],
        _dst: &[Span],
        _count: usize,
        _start: &Deps,
        _o: &Options,
    ) -> AlgoResult<()> {
        Err(self.na(Collective::AllToAll))
    }
}

/// The implementation of each algorithm.
pub fn implementation(algo: Algorithm) -> Option<&'static dyn Collectives> {
    Some(match algo {
        Algorithm::Ring => &ring::Ring,
        Algorithm::BidirRing => &bidir_ring::BidirRing,
        Algorithm::Mesh => &mesh::Mesh,
        Algorithm::Mesh1 => &mesh1::Mesh1,
        Algorithm::Rdh => &rdh::Rdh,
        Algorithm::Rd => &rd::Rd,
        Algorithm::Tree => &tree::Tree,
        Algorithm::DbTree => &dbtree::DbTree,
        Algorithm::Bruck => &bruck::Bruck,
        Algorithm::Pairwise => &pairwise::Pairwise,
        Algorithm::Hier => &hier::Hier,
        Algorithm::Swizzle => &swizzle::Swizzle,
    })
}

/// The collectives an algorithm implements.
pub fn supports(algo: Algorithm, coll: Collective) -> bool {
    // The cost model asks this for every candidate on every call, so the answer is probed once
    // per pair (by building a 2-rank, 1-element schedule) and then read from a table.
    static TABLE: once_cell::sync::Lazy<Vec<(Algorithm, Collective, bool)>> =
        once_cell::sync::Lazy::new(|| {
            Algorithm::ALL
                .iter()
                .flat_map(|a| Collective::ALL.iter().map(move |c| (*a, *c)))
                .map(|(a, c)| (a, c, probe_support(a, c)))
                .collect()
        });
    TABLE.iter().any(|&(a, c, ok)| a == algo && c == coll && ok)
}

fn probe_support(algo: Algorithm, coll: Collective) -> bool {
    build(Problem::new(coll, 2, 1), algo, &Options::default()).is_ok()
}

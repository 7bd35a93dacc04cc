//! `Plan`: one rank's steps digested for the executor (dependencies, message keys, how far
//! the steps reach into In and Out, the writes into Out).

use super::inplace::{self, InPlace};
use super::MAX_MESSAGES_PER_PEER;
use crate::algo::{Buf, Op, Schedule};
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::sync::Arc;

/// What the executor derives from one rank's steps, computed once per (schedule, rank) and
/// shared by every call that runs it.
#[derive(Debug)]
pub struct Plan {
    pub(super) pending: Vec<u32>,
    pub(super) dependents: Vec<Vec<u32>>,
    pub(super) keys: Vec<u32>,
    pub(super) ready: Vec<usize>,
    pub(super) need_in: usize,
    pub(super) need_out: usize,
    /// Byte ranges `(start, end)` of Out that steps write, each with the In offset it is
    /// copied from when the step is a copy from In.
    out_writes: Vec<(usize, usize, Option<usize>)>,
    /// The largest message this rank sends or receives, in bytes, and the ranks it exchanges
    /// messages with (each once): what `run_direct` needs of the transport.
    pub max_message: usize,
    pub message_peers: Vec<usize>,
    /// In-place analyses (`inplace::analyse`) by the input's offset from the output, made
    /// when a call without restore first needs one (a rank's calls of one plan use one or two).
    in_place: Mutex<Vec<(isize, Arc<InPlace>)>>,
    elem: usize,
}

impl Plan {
    /// Rank `rank`'s plan of `schedule`, for elements of `elem` bytes.
    pub fn new(schedule: &Schedule, rank: usize, elem: usize) -> Result<Plan> {
        let steps = &schedule.ranks[rank];
        let n = steps.len();
        let reach = |b: Buf| {
            steps
                .iter()
                .flat_map(|s| s.op.reads().into_iter().chain(s.op.writes()))
                .filter(|sp| sp.buf == b)
                .map(|sp| sp.end())
                .max()
                .unwrap_or(0)
                * elem
        };
        let mut dependents = vec![Vec::new(); n];
        let mut pending = vec![0u32; n];
        for (i, s) in steps.iter().enumerate() {
            pending[i] = s.deps.len() as u32;
            for &d in &s.deps {
                dependents[d].push(i as u32);
            }
        }
        // Message numbers per peer, in program order (the matching rule of schedules).
        let nr = schedule.problem.nranks;
        let mut sent = vec![0u32; nr];
        let mut recvd = vec![0u32; nr];
        let mut keys = vec![0u32; n];
        for (i, s) in steps.iter().enumerate() {
            match &s.op {
                Op::Send { peer, .. } => {
                    keys[i] = sent[*peer];
                    sent[*peer] += 1;
                }
                Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => {
                    keys[i] = recvd[*peer];
                    recvd[*peer] += 1;
                }
                _ => {}
            }
        }
        let out_writes = steps
            .iter()
            .filter_map(|s| {
                let w = s.op.writes().filter(|w| w.buf == Buf::Out && w.len > 0)?;
                let from = match &s.op {
                    Op::Copy { src, .. } if src.buf == Buf::In => Some(src.off * elem),
                    _ => None,
                };
                Some((w.off * elem, w.end() * elem, from))
            })
            .collect();
        let max_message = steps
            .iter()
            .filter_map(|s| match &s.op {
                Op::Send { src: sp, .. }
                | Op::Recv { dst: sp, .. }
                | Op::RecvReduce { dst: sp, .. } => Some(sp.len * elem),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let message_peers = (0..nr).filter(|&p| sent[p] + recvd[p] > 0).collect();
        if sent
            .iter()
            .chain(&recvd)
            .any(|k| *k as usize > MAX_MESSAGES_PER_PEER)
        {
            return Err(Error::InvalidUsage(
                "schedule has too many messages per peer for the tag space".into(),
            ));
        }
        Ok(Plan {
            ready: (0..n).filter(|i| pending[*i] == 0).collect(),
            pending,
            dependents,
            keys,
            need_in: reach(Buf::In),
            need_out: reach(Buf::Out),
            out_writes,
            max_message,
            message_peers,
            in_place: Mutex::new(Vec::new()),
            elem,
        })
    }

    /// What an in-place call without restore, whose input starts `shift` bytes after its
    /// output's start, must copy aside or wait for; this plan is `schedule`'s for `rank`.
    pub(super) fn in_place(&self, schedule: &Schedule, rank: usize, shift: isize) -> Arc<InPlace> {
        let mut cache = self.in_place.lock();
        if let Some((_, a)) = cache.iter().find(|(s, _)| *s == shift) {
            return a.clone();
        }
        let a = Arc::new(inplace::analyse(schedule, rank, self.elem, shift));
        if cache.len() >= 4 {
            cache.remove(0);
        }
        cache.push((shift, a.clone()));
        a
    }

    /// Whether a call whose input starts `delta` bytes into its output and is `len` bytes
    /// long writes over its own input: any write into those bytes, except a copy of the input
    /// onto itself (which the executor skips). Without one, an in-place call needs no backup:
    /// it reads an input nothing changes and has nothing to restore (AllGather and Broadcast
    /// in NCCL's in-place layout).
    pub(super) fn overwrites_input(&self, delta: usize, len: usize) -> bool {
        self.out_writes.iter().any(|&(a, b, from)| {
            a < delta + len && delta < b && from.map(|src| src + delta) != Some(a)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Plan;
    use crate::algo::{self, Algorithm, Collective, Options, Problem};

    #[test]
    fn in_place_calls_back_up_only_inputs_that_steps_overwrite() {
        let (n, count, el) = (4usize, 1000usize, 4usize);
        let plan = |coll, algo, rank| {
            let p = Problem::new(coll, n, count);
            let opts = Options {
                slice: 128,
                ..Options::default()
            };
            Plan::new(&algo::build(p, algo, &opts).unwrap(), rank, el).unwrap()
        };
        let slot = count * el;
        for algo in [Algorithm::Ring, Algorithm::Rdh, Algorithm::Mesh] {
            // AllGather in NCCL's layout: nothing writes the rank's own slot but the copy onto
            // itself, so no backup; an input anywhere else in the output is overwritten.
            let ag = plan(Collective::AllGather, algo, 2);
            assert!(!ag.overwrites_input(2 * slot, slot), "{algo}");
            assert!(ag.overwrites_input(slot, slot), "{algo}");
            assert!(ag.overwrites_input(2 * slot + 4, slot), "{algo}");
            // AllReduce writes its whole output.
            assert!(plan(Collective::AllReduce, algo, 2).overwrites_input(0, n * slot));
        }
        // Broadcast: the root only reads; other ranks receive into the buffer.
        assert!(!plan(Collective::Broadcast, Algorithm::Ring, 0).overwrites_input(0, n * slot));
        assert!(plan(Collective::Broadcast, Algorithm::Ring, 1).overwrites_input(0, n * slot));
    }
}

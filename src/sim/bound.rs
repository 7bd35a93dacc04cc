//! A lower bound on a schedule's simulated time, from one pass over its steps without the
//! event loop, so that a table of candidates can leave out those that cannot be the fastest
//! (`simulate_unless_slower`) without changing which one is. The simulated time is at least
//! each of:
//! - the critical path, every step as early as its dependencies allow, every message alone on
//!   its links (its bytes at the slowest of their capacities, then `alpha`), with no CPU
//!   waiting for another task of its rank;
//! - per rank, the CPU's work: `o` per send, the handling of every message it receives
//!   (`take_cost`), every reduction and copy (one task at a time);
//! - per link, the bytes that cross it over its capacity.
#![forbid(unsafe_code)]

use super::engine::{Kind, Outcome, Sim};
use super::params::Params;
use crate::algo::{Hosts, Schedule};

/// What `simulate_unless_slower` found.
#[derive(Clone, Debug, PartialEq)]
pub enum Bounded {
    /// Simulated: its outcome.
    Simulated(Outcome),
    /// Not simulated: its lower bound exceeds the cutoff. `steps` as `Outcome::steps`.
    Slower { bound_us: f64, steps: usize },
}

/// A lower bound (us) on `simulate(s, elem, hosts, p)`'s time.
pub fn lower_bound(s: &Schedule, elem: usize, hosts: Hosts, p: &Params) -> Result<f64, String> {
    Sim::prepare(s, elem, hosts, p)?.lower_bound()
}

/// `simulate`, unless the schedule's lower bound exceeds `cutoff_us` (it then cannot finish
/// by the cutoff, so it cannot beat a schedule that does).
pub fn simulate_unless_slower(
    s: &Schedule,
    elem: usize,
    hosts: Hosts,
    p: &Params,
    cutoff_us: f64,
) -> Result<Bounded, String> {
    let mut sim = Sim::prepare(s, elem, hosts, p)?;
    let bound_us = sim.lower_bound()?;
    if bound_us > cutoff_us {
        return Ok(Bounded::Slower {
            bound_us,
            steps: sim.kind.len(),
        });
    }
    sim.run()?;
    Ok(Bounded::Simulated(sim.outcome()))
}

impl Sim<'_> {
    /// The larger of the critical path, the busiest CPU and the busiest link (module doc).
    pub(super) fn lower_bound(&self) -> Result<f64, String> {
        let total = self.kind.len();
        // When each step can start at the earliest: its dependencies done and, for a
        // receive, its message arrived (counted as one more dependency).
        let mut start = vec![0.0f64; total];
        let mut pending = self.pending.clone();
        for m in &self.msgs {
            pending[m.recv as usize] += 1;
        }
        let mut stack: Vec<u32> = (0..total as u32)
            .filter(|&g| pending[g as usize] == 0)
            .collect();
        let mut cpu = vec![0.0f64; self.cpu_ranks()];
        let mut load = vec![0.0f64; self.links.len()];
        let mut path = 0.0f64;
        let mut done_steps = 0usize;
        // Step g may start no earlier than `at`, and waits for one thing fewer.
        let release =
            |g: usize, at: f64, start: &mut [f64], pending: &mut [u32], stack: &mut Vec<u32>| {
                start[g] = start[g].max(at);
                pending[g] -= 1;
                if pending[g] == 0 {
                    stack.push(g as u32);
                }
            };
        while let Some(g) = stack.pop() {
            let gi = g as usize;
            done_steps += 1;
            let rank = self.rank_of[gi] as usize;
            let begin = start[gi];
            let end = match self.kind[gi] {
                Kind::Nop => begin,
                Kind::Cpu => {
                    cpu[rank] += self.arg[gi];
                    begin + self.arg[gi]
                }
                Kind::Recv => begin,
                Kind::RecvReduce => {
                    let dur = self.arg[gi] * self.p.gamma_us_per_byte;
                    cpu[rank] += dur;
                    begin + dur
                }
                Kind::Send => {
                    let m = self.msg_of[gi];
                    let msg = self.msgs[m as usize];
                    let level = self.level(&msg);
                    cpu[rank] += level.o_us;
                    cpu[self.rank_of[msg.recv as usize] as usize] += self.take_cost(&msg);
                    let (hops, k) = self.hops(m);
                    let mut slowest = f64::INFINITY;
                    for &l in &hops[..k] {
                        load[l as usize] += msg.bytes;
                        slowest = slowest.min(self.links.capacity(l));
                    }
                    let drained = if msg.bytes == 0.0 {
                        begin
                    } else {
                        begin + msg.bytes / slowest
                    };
                    let arrives = drained + level.alpha_us;
                    path = path.max(arrives);
                    release(
                        msg.recv as usize,
                        arrives,
                        &mut start,
                        &mut pending,
                        &mut stack,
                    );
                    drained
                }
            };
            path = path.max(end);
            for k in self.dep_start[gi]..self.dep_start[gi + 1] {
                let d = self.dependents[k as usize] as usize;
                release(d, end, &mut start, &mut pending, &mut stack);
            }
        }
        if done_steps != total {
            return Err(format!(
                "schedule: {} of {total} steps never ran (deadlock)",
                total - done_steps
            ));
        }
        let busiest_cpu = cpu.iter().copied().fold(0.0, f64::max);
        let busiest_link = load
            .iter()
            .enumerate()
            .map(|(l, &b)| b / self.links.capacity(l as u32))
            .fold(0.0, f64::max);
        Ok(path.max(busiest_cpu).max(busiest_link))
    }

    /// The number of ranks (one CPU each).
    fn cpu_ranks(&self) -> usize {
        self.rank_of.last().map_or(0, |&r| r as usize + 1)
    }
}

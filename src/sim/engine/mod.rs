//! The event loop: every rank's steps run when their dependencies have completed; sends post on
//! the rank's CPU and become flows on the links (`share`), receives complete `alpha` after
//! their message's last byte, reductions and copies take the rank's CPU. A rank's CPU does one
//! thing at a time and, when it comes free, posts its waiting sends before it starts waiting
//! reductions and copies, as the executor posts every ready step after each batch of
//! completions it reduces: a node of a sliced tree or chain forwards a finished slice before
//! it reduces the next one.
//!
//! A received message costs its receiver's CPU `o` too (`take`): the executor's polling thread
//! reads each completion and runs the provider's receive path for it (matching, the copy out of
//! the wire's or the shared-memory queue's buffer), one message at a time. That work is the last
//! `o` of the message's `alpha` (alpha is half a ping-pong, receiver's handling included), so a
//! message whose receiver is idle completes at `alpha` after its last byte as before; one whose
//! receiver is busy (posting, reducing, handling other messages) waits for it.
//!
//! What a run starts from (the steps, their dependents, the links, the matched messages) is
//! made by `build`.
#![forbid(unsafe_code)]

use super::params::{Level, Params};
use super::share::{LinkId, Links, TIME_EPS};
use crate::algo::{Hosts, Schedule};
use rustc_hash::FxHashMap;
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};

mod build;

/// What a run found.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// When the last step of any rank completed, us from a common start.
    pub time_us: f64,
    /// Messages simulated and the steps they belong to.
    pub messages: usize,
    pub steps: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Send,
    Recv,
    RecvReduce,
    Cpu,
    Nop,
}

/// A piece of a rank's CPU work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Job {
    /// A send's post (the send completes when its bytes have left).
    Post,
    /// A reduction or copy: its step completes.
    Step(u32),
    /// The handling of a received message (its index): it arrives.
    Take(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    /// A rank's CPU finished a piece of work.
    Free(u32, Job),
    /// A message is usable by its receiver.
    Arrive(u32),
    /// A message's bytes are in at its receiver, whose CPU must handle it (`take`).
    Incoming(u32),
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct At(f64, u64, Event);

impl Eq for At {}

impl Ord for At {
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.total_cmp(&o.0).then(self.1.cmp(&o.1))
    }
}

impl PartialOrd for At {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// One message: its bytes, its steps and the links it crosses.
#[derive(Clone, Copy, Debug)]
pub(super) struct Msg {
    pub(super) bytes: f64,
    pub(super) send: u32,
    pub(super) recv: u32,
    pub(super) inter: bool,
    arrived: bool,
}

pub(super) struct Sim<'a> {
    pub(super) p: &'a Params,
    pub(super) rank_of: Vec<u32>,
    pub(super) kind: Vec<Kind>,
    /// Bytes of a step's CPU work (copy, reduce) or its message index (send, receive).
    pub(super) arg: Vec<f64>,
    pub(super) msg_of: Vec<u32>,
    pub(super) pending: Vec<u32>,
    pub(super) dep_start: Vec<u32>,
    pub(super) dependents: Vec<u32>,
    recv_ready: Vec<bool>,
    pub(super) msgs: Vec<Msg>,
    /// Per rank: whether its CPU is busy, the sends waiting to be posted and the reductions,
    /// copies and received messages waiting to be handled (with their durations), in the order
    /// they became ready.
    busy: Vec<bool>,
    posts: Vec<VecDeque<u32>>,
    work: Vec<VecDeque<(Job, f64)>>,
    /// Ranks whose CPU got work since the last dispatch.
    queued: Vec<u32>,
    pub(super) links: Links,
    /// The links of a message from rank a to rank b: (a's, b's) per level, or the hosts'.
    rank_links: Vec<[LinkId; 4]>,
    host_links: Vec<[LinkId; 3]>,
    core: Option<LinkId>,
    host: Vec<u32>,
    heap: BinaryHeap<Reverse<At>>,
    seq: u64,
    now: f64,
    done: usize,
    ready: VecDeque<u32>,
    /// Per (sending rank, receiving rank) with a message on the wire: the messages of that
    /// pair waiting behind it. A pair's messages go one after the other, as on the one ordered
    /// connection (or shared-memory queue) the executor uses per pair, instead of sharing the
    /// pair's links fairly and all finishing together.
    pairs: FxHashMap<(u32, u32), VecDeque<u32>>,
}

/// Simulate `s` with elements of `elem` bytes on ranks placed by `hosts` (the layout the
/// schedule was built for) and the machine `p`.
pub fn simulate(s: &Schedule, elem: usize, hosts: Hosts, p: &Params) -> Result<Outcome, String> {
    let mut sim = Sim::prepare(s, elem, hosts, p)?;
    sim.run()?;
    Ok(sim.outcome())
}

impl<'a> Sim<'a> {
    /// `p` and `hosts` checked, the steps listed and the messages matched: ready to run.
    pub(super) fn prepare(
        s: &Schedule,
        elem: usize,
        hosts: Hosts,
        p: &'a Params,
    ) -> Result<Sim<'a>, String> {
        p.validate()?;
        let n = s.ranks.len();
        if !hosts.fits(n) {
            return Err(format!(
                "hosts: the layout names {} ranks, the schedule has {n}",
                hosts.ranks()
            ));
        }
        Sim::new(s, elem, hosts, p)
    }

    /// What a finished run found.
    pub(super) fn outcome(&self) -> Outcome {
        Outcome {
            time_us: self.now,
            messages: self.msgs.len(),
            steps: self.kind.len(),
        }
    }

    fn push(&mut self, t: f64, e: Event) {
        self.seq += 1;
        self.heap.push(Reverse(At(t, self.seq, e)));
    }

    pub(super) fn level(&self, m: &Msg) -> Level {
        if m.inter {
            self.p.inter
        } else {
            self.p.intra
        }
    }

    /// Queue `dur` of CPU work `job` on `rank`.
    fn cpu(&mut self, rank: u32, job: Job, dur: f64) {
        self.work[rank as usize].push_back((job, dur));
        self.queued.push(rank);
    }

    /// The receiver's CPU cost of message `m`: its level's `o`, at most the level's `alpha`,
    /// of which it is a part (`take`).
    pub(super) fn take_cost(&self, m: &Msg) -> f64 {
        let l = self.level(m);
        l.o_us.min(l.alpha_us)
    }

    /// Start the next piece of work on every idle CPU that has some: a waiting send's post
    /// first (its bytes start to flow as it starts), else the oldest reduction or copy.
    fn dispatch(&mut self) {
        while let Some(rank) = self.queued.pop() {
            let r = rank as usize;
            if self.busy[r] {
                continue;
            }
            if let Some(g) = self.posts[r].pop_front() {
                let m = self.msg_of[g as usize];
                let o = self.level(&self.msgs[m as usize]).o_us;
                self.busy[r] = true;
                self.push(self.now + o, Event::Free(rank, Job::Post));
                self.start_flow(m);
            } else if let Some((job, dur)) = self.work[r].pop_front() {
                self.busy[r] = true;
                self.push(self.now + dur, Event::Free(rank, job));
            }
        }
    }

    /// `rank`'s CPU finished a piece of work: complete its step or take its message, and run
    /// what waits.
    fn freed(&mut self, rank: u32, job: Job) {
        match job {
            Job::Post => {}
            Job::Step(g) => self.complete(g),
            Job::Take(m) => {
                let r = self.msgs[m as usize].recv;
                let ri = r as usize;
                if self.recv_ready[ri] && self.kind[ri] == Kind::RecvReduce {
                    // The executor reduces a completed receive as it handles it, before it
                    // posts what became ready (`exec` posted, `on_completion`).
                    self.msgs[m as usize].arrived = true;
                    let dur = self.arg[ri] * self.p.gamma_us_per_byte;
                    self.push(self.now + dur, Event::Free(rank, Job::Step(r)));
                    return;
                }
                self.arrive(m);
            }
        }
        self.busy[rank as usize] = false;
        self.queued.push(rank);
    }

    pub(super) fn run(&mut self) -> Result<(), String> {
        for g in 0..self.kind.len() {
            if self.pending[g] == 0 {
                self.ready.push_back(g as u32);
            }
        }
        self.drain_ready();
        let mut finished = Vec::new();
        loop {
            let net = self.links.next_finish();
            let ev = self.heap.peek().map(|Reverse(a)| a.0);
            let t = match (net, ev) {
                (None, None) => break,
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) => a,
                (None, Some(b)) => b,
            };
            self.links.advance(t);
            self.now = self.now.max(t);
            finished.clear();
            // A drained message's pair sends its next one at once, on the same links.
            let (pairs, msgs, rank_of) = (&mut self.pairs, &self.msgs, &self.rank_of);
            self.links.take_finished_then(t, &mut finished, |m| {
                let msg = msgs[m as usize];
                let pair = (rank_of[msg.send as usize], rank_of[msg.recv as usize]);
                let next = pairs.get_mut(&pair).and_then(VecDeque::pop_front);
                if next.is_none() {
                    pairs.remove(&pair);
                }
                next.map(|n| (n, msgs[n as usize].bytes))
            });
            for &m in &finished {
                self.drained(m);
            }
            let limit = t + TIME_EPS * t.abs().max(1.0);
            while let Some(Reverse(At(when, _, e))) = self.heap.peek().copied() {
                if when > limit {
                    break;
                }
                self.heap.pop();
                self.now = self.now.max(when);
                match e {
                    Event::Free(rank, job) => self.freed(rank, job),
                    Event::Arrive(m) => self.arrive(m),
                    Event::Incoming(m) => self.take(m),
                }
                self.drain_ready();
            }
            self.drain_ready();
        }
        if self.done != self.kind.len() {
            let stuck = (0..self.kind.len()).find(|&g| self.pending[g] > 0);
            return Err(format!(
                "schedule: {} of {} steps never ran (deadlock){}",
                self.kind.len() - self.done,
                self.kind.len(),
                stuck.map_or(String::new(), |g| format!(
                    ", one of them on rank {}",
                    self.rank_of[g]
                ))
            ));
        }
        Ok(())
    }

    /// Steps whose dependencies have all completed.
    fn drain_ready(&mut self) {
        loop {
            self.make_ready();
            if self.queued.is_empty() {
                break;
            }
            self.dispatch();
        }
    }

    /// Hand each step whose dependencies completed to its CPU, its receive or its end.
    fn make_ready(&mut self) {
        while let Some(g) = self.ready.pop_front() {
            let gi = g as usize;
            let rank = self.rank_of[gi];
            match self.kind[gi] {
                Kind::Nop => self.complete(g),
                Kind::Cpu => self.cpu(rank, Job::Step(g), self.arg[gi]),
                Kind::Send => {
                    self.posts[rank as usize].push_back(g);
                    self.queued.push(rank);
                }
                Kind::Recv | Kind::RecvReduce => {
                    self.recv_ready[gi] = true;
                    let m = self.msg_of[gi];
                    if self.msgs[m as usize].arrived {
                        self.deliver(g);
                    }
                }
            }
        }
    }

    fn complete(&mut self, g: u32) {
        self.done += 1;
        let gi = g as usize;
        for k in self.dep_start[gi]..self.dep_start[gi + 1] {
            let d = self.dependents[k as usize] as usize;
            self.pending[d] -= 1;
            if self.pending[d] == 0 {
                self.ready.push_back(d as u32);
            }
        }
    }

    /// Message `m` is sent: on the wire now, or behind the message its pair has there.
    fn start_flow(&mut self, m: u32) {
        let msg = self.msgs[m as usize];
        if msg.bytes == 0.0 {
            self.drained(m);
            return;
        }
        let pair = (
            self.rank_of[msg.send as usize],
            self.rank_of[msg.recv as usize],
        );
        match self.pairs.entry(pair) {
            std::collections::hash_map::Entry::Occupied(mut q) => q.get_mut().push_back(m),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(VecDeque::new());
                self.on_wire(m);
            }
        }
    }

    /// Message `m`'s bytes start crossing its links.
    fn on_wire(&mut self, m: u32) {
        let (hops, k) = self.hops(m);
        self.links.start(&hops[..k], self.msgs[m as usize].bytes, m);
    }

    /// The links message `m` crosses: the first `k` of the array.
    pub(super) fn hops(&self, m: u32) -> ([LinkId; 3], usize) {
        let msg = self.msgs[m as usize];
        let (a, b) = (
            self.rank_of[msg.send as usize] as usize,
            self.rank_of[msg.recv as usize] as usize,
        );
        let (ra, rb) = (self.rank_links[a], self.rank_links[b]);
        let mut hops = [0; 3];
        let k = if !self.p.contention {
            let (e, i) = if msg.inter { (2, 3) } else { (0, 1) };
            hops[0] = ra[e];
            hops[1] = rb[i];
            2
        } else if msg.inter {
            let (ha, hb) = (self.host[a] as usize, self.host[b] as usize);
            hops[0] = self.host_links[ha][0];
            hops[1] = self.host_links[hb][1];
            match self.core {
                Some(c) => {
                    hops[2] = c;
                    3
                }
                None => 2,
            }
        } else {
            hops[0] = ra[0];
            hops[1] = rb[1];
            let mem = self.host_links[self.host[a] as usize][2];
            if mem != LinkId::MAX {
                hops[2] = mem;
                3
            } else {
                2
            }
        };
        (hops, k)
    }

    /// A message's last byte has left: the send completes, the message arrives `alpha` later,
    /// the last `take_cost` of which its receiver's CPU spends on it (`take`).
    fn drained(&mut self, m: u32) {
        let msg = self.msgs[m as usize];
        // (A pair's next message went on the wire as this one's last byte left: `run`.)
        self.complete(msg.send);
        let alpha = self.level(&msg).alpha_us;
        let take = self.take_cost(&msg);
        if take > 0.0 {
            let at = self.now + alpha - take;
            if at > self.now {
                self.push(at, Event::Incoming(m));
            } else {
                self.take(m);
            }
        } else if alpha == 0.0 {
            self.arrive(m);
        } else {
            self.push(self.now + alpha, Event::Arrive(m));
        }
    }

    /// Message `m` is in at its receiver: its CPU handles it (`take_cost`) once the work queued
    /// before it is done, and it arrives then (`freed`).
    fn take(&mut self, m: u32) {
        let msg = self.msgs[m as usize];
        let dur = self.take_cost(&msg);
        self.cpu(self.rank_of[msg.recv as usize], Job::Take(m), dur);
    }

    fn arrive(&mut self, m: u32) {
        self.msgs[m as usize].arrived = true;
        let r = self.msgs[m as usize].recv;
        if self.recv_ready[r as usize] {
            self.deliver(r);
        }
    }

    /// A posted receive whose message has arrived: done, or reduced first.
    fn deliver(&mut self, g: u32) {
        let gi = g as usize;
        if self.kind[gi] == Kind::RecvReduce {
            let dur = self.arg[gi] * self.p.gamma_us_per_byte;
            self.cpu(self.rank_of[gi], Job::Step(g), dur);
        } else {
            self.complete(g);
        }
    }
}

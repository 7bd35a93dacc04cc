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
#![forbid(unsafe_code)]

use super::params::{Level, Params};
use super::share::{LinkId, Links, TIME_EPS};
use crate::algo::{Hosts, Op, Schedule};
use rustc_hash::FxHashMap;
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};

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

    fn new(s: &Schedule, elem: usize, hosts: Hosts, p: &'a Params) -> Result<Sim<'a>, String> {
        let n = s.ranks.len();
        let total: usize = s.ranks.iter().map(Vec::len).sum();
        let base: Vec<usize> = s
            .ranks
            .iter()
            .scan(0, |acc, r| {
                let b = *acc;
                *acc += r.len();
                Some(b)
            })
            .collect();
        let host: Vec<u32> = (0..n).map(|r| hosts.host_of(r) as u32).collect();
        let nhosts = host.iter().copied().max().map_or(1, |h| h as usize + 1);
        let mut sim = Sim {
            p,
            rank_of: Vec::with_capacity(total),
            kind: Vec::with_capacity(total),
            arg: Vec::with_capacity(total),
            msg_of: vec![u32::MAX; total],
            pending: Vec::with_capacity(total),
            dep_start: Vec::with_capacity(total + 1),
            dependents: Vec::new(),
            recv_ready: vec![false; total],
            msgs: Vec::new(),
            busy: vec![false; n],
            posts: vec![VecDeque::new(); n],
            work: vec![VecDeque::new(); n],
            queued: Vec::new(),
            links: Links::new(),
            rank_links: Vec::with_capacity(n),
            host_links: Vec::with_capacity(nhosts),
            core: None,
            host,
            heap: BinaryHeap::new(),
            seq: 0,
            now: 0.0,
            done: 0,
            ready: VecDeque::new(),
            pairs: FxHashMap::default(),
        };
        sim.build_links(n, nhosts);
        // Dependents in compressed rows: count, then fill.
        let mut count = vec![0u32; total + 1];
        for (r, steps) in s.ranks.iter().enumerate() {
            for (i, st) in steps.iter().enumerate() {
                sim.rank_of.push(r as u32);
                sim.pending.push(st.deps.len() as u32);
                for &d in &st.deps {
                    if d >= i {
                        return Err(format!(
                            "schedule: rank {r} step {i} depends on step {d}, not an earlier one"
                        ));
                    }
                    count[base[r] + d] += 1;
                }
                let bytes = |len: usize| (len * elem) as f64;
                let (k, a) = match &st.op {
                    Op::Send { src, .. } => (Kind::Send, bytes(src.len)),
                    Op::Recv { dst, .. } => (Kind::Recv, bytes(dst.len)),
                    Op::RecvReduce { dst, .. } => (Kind::RecvReduce, bytes(dst.len)),
                    Op::Copy { src, .. } => (Kind::Cpu, bytes(src.len) * p.copy_us_per_byte),
                    Op::Reduce { dst, .. } => (Kind::Cpu, bytes(dst.len) * p.gamma_us_per_byte),
                    Op::Nop => (Kind::Nop, 0.0),
                };
                sim.kind.push(k);
                sim.arg.push(a);
            }
        }
        let mut acc = 0u32;
        for c in count.iter_mut() {
            let v = *c;
            sim.dep_start.push(acc);
            *c = acc;
            acc += v;
        }
        sim.dependents = vec![0; acc as usize];
        for (r, steps) in s.ranks.iter().enumerate() {
            for (i, st) in steps.iter().enumerate() {
                for &d in &st.deps {
                    let slot = &mut count[base[r] + d];
                    sim.dependents[*slot as usize] = (base[r] + i) as u32;
                    *slot += 1;
                }
            }
        }
        sim.match_messages(s, &base)?;
        Ok(sim)
    }

    /// The links: per rank and level without contention; with it, per rank inside a host and
    /// per host (NIC egress, ingress, memory) plus the core.
    fn build_links(&mut self, n: usize, nhosts: usize) {
        let p = self.p;
        let rate = |l: Level| 1.0 / l.beta_us_per_byte;
        for _ in 0..n {
            let ie = self.links.add(rate(p.intra));
            let ii = self.links.add(rate(p.intra));
            let (ee, ei) = if p.contention {
                (0, 0)
            } else {
                (self.links.add(rate(p.inter)), self.links.add(rate(p.inter)))
            };
            self.rank_links.push([ie, ii, ee, ei]);
        }
        if p.contention {
            for _ in 0..nhosts {
                let e = self.links.add(rate(p.inter));
                let i = self.links.add(rate(p.inter));
                let m = p
                    .mem_us_per_byte
                    .map_or(LinkId::MAX, |m| self.links.add(1.0 / m));
                self.host_links.push([e, i, m]);
            }
            if p.taper > 1.0 && nhosts > 1 {
                self.core = Some(self.links.add(nhosts as f64 * rate(p.inter) / p.taper));
            }
        }
    }

    /// Pair the k-th send from a to b with the k-th receive at b from a: sends and receives
    /// sorted by (sender, receiver) and then by step, matched in their groups.
    fn match_messages(&mut self, s: &Schedule, base: &[usize]) -> Result<(), String> {
        let pair = |a: usize, b: usize| ((a as u64) << 32) | b as u64;
        let mut sends: Vec<(u64, u32)> = Vec::new();
        let mut recvs: Vec<(u64, u32)> = Vec::new();
        for (r, steps) in s.ranks.iter().enumerate() {
            for (i, st) in steps.iter().enumerate() {
                let g = (base[r] + i) as u32;
                match st.op {
                    Op::Send { peer, .. } => sends.push((pair(r, peer), g)),
                    Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => {
                        recvs.push((pair(peer, r), g))
                    }
                    _ => {}
                }
            }
        }
        sends.sort_unstable();
        recvs.sort_unstable();
        // The send of each receive (u32::MAX: none), by the receive's step.
        let mut send_of: Vec<u32> = vec![u32::MAX; self.kind.len()];
        let (mut x, mut y) = (0, 0);
        let mut unmatched: Option<u32> = None;
        while y < recvs.len() {
            let key = recvs[y].0;
            if x < sends.len() && sends[x].0 < key {
                let (a, b) = ((sends[x].0 >> 32) as u32, sends[x].0 as u32);
                return Err(format!(
                    "schedule: rank {a} sends to {b} more messages than {b} receives"
                ));
            }
            while y < recvs.len() && recvs[y].0 == key {
                if x < sends.len() && sends[x].0 == key {
                    send_of[recvs[y].1 as usize] = sends[x].1;
                    x += 1;
                } else {
                    unmatched = Some(unmatched.map_or(recvs[y].1, |u| u.min(recvs[y].1)));
                }
                y += 1;
            }
        }
        if let Some(g) = unmatched {
            let gi = g as usize;
            let r = self.rank_of[gi] as usize;
            let peer = s.ranks[r][gi - base[r]].op.peer().unwrap_or(0);
            return Err(format!(
                "schedule: rank {r} step {} receives from {peer}, which sends no match",
                gi - base[r]
            ));
        }
        if let Some(&(k, _)) = sends.get(x) {
            let (a, b) = (k >> 32, k as u32);
            return Err(format!(
                "schedule: rank {a} sends to {b} more messages than {b} receives"
            ));
        }
        self.msgs.reserve(sends.len());
        for (g, &snd) in send_of.iter().enumerate() {
            if snd == u32::MAX {
                continue;
            }
            if self.arg[snd as usize] != self.arg[g] {
                let r = self.rank_of[g] as usize;
                let peer = self.rank_of[snd as usize];
                return Err(format!(
                    "schedule: rank {r} step {} receives {} bytes from {peer}, which sends {}",
                    g - base[r],
                    self.arg[g],
                    self.arg[snd as usize]
                ));
            }
            let m = self.msgs.len() as u32;
            let (a, b) = (self.rank_of[snd as usize], self.rank_of[g]);
            self.msgs.push(Msg {
                bytes: self.arg[g],
                send: snd,
                recv: g as u32,
                inter: self.host[a as usize] != self.host[b as usize],
                arrived: false,
            });
            self.msg_of[snd as usize] = m;
            self.msg_of[g] = m;
        }
        Ok(())
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

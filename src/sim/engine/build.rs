//! A run made ready from a schedule (`Sim::new`): every step with its kind, its cost and its
//! dependents in compressed rows, the machine's links, and each receive matched with its send.
use super::{Kind, Msg, Sim};
use crate::algo::{Hosts, Op, Schedule};
use crate::sim::params::{Level, Params};
use crate::sim::share::{LinkId, Links};
use rustc_hash::FxHashMap;
use std::collections::{BinaryHeap, VecDeque};

impl<'a> Sim<'a> {
    pub(super) fn new(
        s: &Schedule,
        elem: usize,
        hosts: Hosts,
        p: &'a Params,
    ) -> Result<Sim<'a>, String> {
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
            let nic = |links: &mut Links| match p.burst {
                Some(b) => links.add_shaped(rate(p.inter), 1.0 / b.peak_us_per_byte, b.bytes),
                None => links.add(rate(p.inter)),
            };
            for _ in 0..nhosts {
                let e = nic(&mut self.links);
                let i = nic(&mut self.links);
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
}

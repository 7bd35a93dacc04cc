//! Max-min fair sharing of links among flows (progressive filling): every link has a capacity
//! in bytes per microsecond, every flow crosses one to three links, and the rates are the
//! max-min fair allocation: raise every unfrozen flow's rate together until some link is full,
//! freeze the flows crossing it at that rate, repeat. A heap keyed by each link's fair share
//! (its remaining capacity over its unfrozen flows) finds the next link to fill, so one
//! recomputation costs O(flows x links per flow x log links).
//!
//! Rates are recomputed only when a flow starts or ends, only for the flows connected to it
//! through shared links, and once for all the changes of one instant; a flow's remaining bytes
//! are brought up to date only when its rate changes, and a heap of finish times finds the
//! next to end. So a step of a lockstep collective on links of their own costs each flow
//! O(log flows), not a pass over every flow.
#![forbid(unsafe_code)]

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A link of the network (an index into `Links`).
pub type LinkId = u32;

/// The most links one flow crosses.
pub const MAX_HOPS: usize = 3;

/// Relative tolerance under which two instants are one (flows of a lockstep step end together
/// although their finish times differ in the last bits).
pub const TIME_EPS: f64 = 1e-9;

#[derive(Clone, Debug)]
struct Flow {
    links: [LinkId; MAX_HOPS],
    hops: u8,
    /// Bytes left at `updated`.
    remaining: f64,
    updated: f64,
    rate: f64,
    /// When it ends at its current rate.
    finish: f64,
    /// The caller's name for the flow (a message).
    token: u32,
    alive: bool,
    frozen: bool,
    /// Bumped at every new rate, so that stale entries of the finish heap are skipped.
    version: u32,
}

/// A key in a min-heap of f64 (smallest first), with an index and a version.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Key(f64, u32, u32);

impl Eq for Key {}

impl Ord for Key {
    fn cmp(&self, o: &Self) -> Ordering {
        o.0.total_cmp(&self.0).then(o.1.cmp(&self.1))
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// The links, the active flows and their max-min fair rates. A flow's start or end changes
/// only the rates of the flows connected to it through shared links (its component), so only
/// that component is refilled, and a flow's remaining bytes are brought up to date only when
/// its rate changes.
#[derive(Debug, Default)]
pub struct Links {
    cap: Vec<f64>,
    flows: Vec<Flow>,
    free: Vec<u32>,
    alive: usize,
    now: f64,
    /// The flows on each link (dead ones are dropped when next seen).
    on: Vec<Vec<u32>>,
    /// Links whose flows changed since the last filling.
    dirty: Vec<LinkId>,
    finishes: BinaryHeap<Key>,
    // Scratch of the filling, one entry per link or flow, kept between fillings.
    left: Vec<f64>,
    count: Vec<u32>,
    version: Vec<u32>,
    through: Vec<Vec<u32>>,
    seen_link: Vec<u32>,
    seen_flow: Vec<u32>,
    stamp: u32,
}

impl Links {
    pub fn new() -> Links {
        Links::default()
    }

    /// A link of `bytes_per_us` capacity (positive and finite).
    pub fn add(&mut self, bytes_per_us: f64) -> LinkId {
        debug_assert!(bytes_per_us > 0.0 && bytes_per_us.is_finite());
        self.cap.push(bytes_per_us);
        self.left.push(0.0);
        self.count.push(0);
        self.version.push(0);
        self.through.push(Vec::new());
        self.on.push(Vec::new());
        self.seen_link.push(0);
        (self.cap.len() - 1) as LinkId
    }

    pub fn active(&self) -> usize {
        self.alive
    }

    /// Start a flow of `bytes` (> 0) over `links` (1 to `MAX_HOPS`) at the current instant.
    pub fn start(&mut self, links: &[LinkId], bytes: f64, token: u32) {
        debug_assert!(!links.is_empty() && links.len() <= MAX_HOPS && bytes > 0.0);
        let mut l = [0; MAX_HOPS];
        l[..links.len()].copy_from_slice(links);
        let f = Flow {
            links: l,
            hops: links.len() as u8,
            remaining: bytes,
            updated: self.now,
            rate: 0.0,
            finish: f64::INFINITY,
            token,
            alive: true,
            frozen: false,
            version: 0,
        };
        let id = match self.free.pop() {
            Some(i) => {
                let v = self.flows[i as usize].version.wrapping_add(1);
                self.flows[i as usize] = Flow { version: v, ..f };
                i
            }
            None => {
                self.flows.push(f);
                self.seen_flow.push(0);
                (self.flows.len() - 1) as u32
            }
        };
        self.alive += 1;
        for &k in links {
            self.on[k as usize].push(id);
            self.dirty.push(k);
        }
    }

    /// Move the clock to `t` (flows drain at their rates; nothing changes until one ends).
    pub fn advance(&mut self, t: f64) {
        if !self.dirty.is_empty() {
            // Rates changed at `now`: fill before the clock passes it.
            self.fill();
        }
        self.now = self.now.max(t);
    }

    /// When the next flow ends (None without flows).
    pub fn next_finish(&mut self) -> Option<f64> {
        if !self.dirty.is_empty() {
            self.fill();
        }
        while let Some(&Key(t, i, v)) = self.finishes.peek() {
            let f = &self.flows[i as usize];
            if f.alive && f.version == v {
                return Some(t);
            }
            self.finishes.pop();
        }
        None
    }

    /// Remove the flows that end by `t` (within `TIME_EPS`), returning their tokens.
    pub fn take_finished(&mut self, t: f64, out: &mut Vec<u32>) {
        let limit = t + TIME_EPS * t.abs().max(1.0);
        while self.next_finish().is_some_and(|f| f <= limit) {
            let Some(Key(_, i, _)) = self.finishes.pop() else {
                break;
            };
            let f = &mut self.flows[i as usize];
            f.alive = false;
            f.version = f.version.wrapping_add(1);
            out.push(f.token);
            self.alive -= 1;
            let (links, hops) = (f.links, f.hops as usize);
            self.dirty.extend_from_slice(&links[..hops]);
            self.free.push(i);
        }
    }

    /// The current rate of each flow, by token (for tests and reports).
    pub fn rates(&mut self) -> Vec<(u32, f64)> {
        if !self.dirty.is_empty() {
            self.fill();
        }
        self.flows
            .iter()
            .filter(|f| f.alive)
            .map(|f| (f.token, f.rate))
            .collect()
    }

    /// The flows connected to the dirty links, each brought up to date at `now`.
    fn component(&mut self) -> (Vec<u32>, Vec<LinkId>) {
        self.stamp = self.stamp.wrapping_add(1).max(1);
        let stamp = self.stamp;
        let mut links: Vec<LinkId> = Vec::new();
        let mut flows: Vec<u32> = Vec::new();
        let mut stack: Vec<LinkId> = std::mem::take(&mut self.dirty);
        while let Some(l) = stack.pop() {
            let u = l as usize;
            if self.seen_link[u] == stamp {
                continue;
            }
            self.seen_link[u] = stamp;
            links.push(l);
            let flows_ref = &self.flows;
            self.on[u].retain(|&i| flows_ref[i as usize].alive);
            for k in 0..self.on[u].len() {
                let i = self.on[u][k];
                if self.seen_flow[i as usize] == stamp {
                    continue;
                }
                self.seen_flow[i as usize] = stamp;
                flows.push(i);
                let f = &self.flows[i as usize];
                stack.extend_from_slice(&f.links[..f.hops as usize]);
            }
        }
        let now = self.now;
        for &i in &flows {
            let f = &mut self.flows[i as usize];
            f.remaining -= f.rate * (now - f.updated);
            f.updated = now;
        }
        (flows, links)
    }

    /// Progressive filling of the component of the dirty links: its max-min fair rates.
    fn fill(&mut self) {
        let (flows, links) = self.component();
        for &l in &links {
            let u = l as usize;
            self.left[u] = self.cap[u];
            self.count[u] = 0;
            self.through[u].clear();
        }
        for &i in &flows {
            let f = &mut self.flows[i as usize];
            f.frozen = false;
            for &l in &f.links[..f.hops as usize] {
                self.count[l as usize] += 1;
                self.through[l as usize].push(i);
            }
        }
        let mut heap: BinaryHeap<Key> = links
            .iter()
            .filter(|&&l| self.count[l as usize] > 0)
            .map(|&l| {
                let u = l as usize;
                Key(self.left[u] / f64::from(self.count[u]), l, self.version[u])
            })
            .collect();
        // A fresh stamp marks the links changed by one frozen link (0 is never a stamp).
        self.stamp = self.stamp.wrapping_add(1).max(1);
        let stamp = self.stamp;
        let mut changed: Vec<usize> = Vec::new();
        while let Some(Key(share, l, v)) = heap.pop() {
            let u = l as usize;
            if v != self.version[u] || self.count[u] == 0 {
                continue;
            }
            for k in 0..self.through[u].len() {
                let fi = self.through[u][k] as usize;
                let f = &mut self.flows[fi];
                if f.frozen {
                    continue;
                }
                f.frozen = true;
                f.rate = share;
                for &o in &f.links[..f.hops as usize] {
                    let o = o as usize;
                    if o == u {
                        continue;
                    }
                    self.left[o] = (self.left[o] - share).max(0.0);
                    self.count[o] -= 1;
                    if self.seen_link[o] != stamp {
                        self.seen_link[o] = stamp;
                        changed.push(o);
                    }
                }
            }
            self.count[u] = 0;
            // Each link whose share moved goes back on the heap once, with its new share.
            for o in changed.drain(..) {
                self.seen_link[o] = 0;
                self.version[o] = self.version[o].wrapping_add(1);
                if self.count[o] > 0 {
                    let s = self.left[o] / f64::from(self.count[o]);
                    heap.push(Key(s, o as LinkId, self.version[o]));
                }
            }
        }
        let now = self.now;
        for &i in &flows {
            let f = &mut self.flows[i as usize];
            let finish = now + f.remaining.max(0.0) / f.rate;
            // A flow whose rate did not change keeps its entry in the heap (most of a
            // component, most of the time): no stale entries pile up.
            if f.finish.is_finite() && (finish - f.finish).abs() <= TIME_EPS * finish.max(1.0) {
                continue;
            }
            f.finish = finish;
            f.version = f.version.wrapping_add(1);
            self.finishes.push(Key(f.finish, i, f.version));
        }
        // Superseded entries stay in the heap until they reach its top; where rates change
        // far more often than flows end (many flows sharing a NIC, started one post apart)
        // they would pile up, so the heap is rebuilt from the live flows when they dominate.
        if self.finishes.len() > 4 * self.alive + 1024 {
            let flows = &self.flows;
            self.finishes = (0..flows.len() as u32)
                .filter(|&i| flows[i as usize].alive)
                .map(|i| {
                    let f = &flows[i as usize];
                    Key(f.finish, i, f.version)
                })
                .collect();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(l: &mut Links, token: u32) -> f64 {
        l.rates().into_iter().find(|r| r.0 == token).unwrap().1
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1.0)
    }

    /// Two flows on one link of 10: 5 each; when one ends the other gets all 10.
    #[test]
    fn two_flows_one_link() {
        let mut l = Links::new();
        let a = l.add(10.0);
        l.start(&[a], 50.0, 1);
        l.start(&[a], 100.0, 2);
        assert!(close(rate(&mut l, 1), 5.0) && close(rate(&mut l, 2), 5.0));
        // Flow 1 ends at 10 us (50 bytes at 5); flow 2 has 50 left, then drains at 10.
        let t = l.next_finish().unwrap();
        assert!(close(t, 10.0), "{t}");
        let mut done = Vec::new();
        l.advance(t);
        l.take_finished(t, &mut done);
        assert_eq!(done, vec![1]);
        assert!(close(rate(&mut l, 2), 10.0));
        assert!(close(l.next_finish().unwrap(), 15.0));
    }

    /// Two flows on different bottlenecks: A crosses links x (cap 4) and y (cap 10), B only y.
    /// x limits A to 4; B takes the remaining 6 of y (not the equal split of 5).
    #[test]
    fn two_flows_different_bottlenecks() {
        let mut l = Links::new();
        let x = l.add(4.0);
        let y = l.add(10.0);
        l.start(&[x, y], 1.0, 1);
        l.start(&[y], 1.0, 2);
        assert!(close(rate(&mut l, 1), 4.0));
        assert!(close(rate(&mut l, 2), 6.0));
    }

    /// The textbook three-flow line: links p and q of capacity 1; flow 0 crosses both, flow 1
    /// only p, flow 2 only q: each gets 1/2. With q of capacity 2: flow 0 and flow 1 share p at
    /// 1/2 each, and flow 2 takes q's remaining 3/2.
    #[test]
    fn three_flows_line() {
        let mut l = Links::new();
        let p = l.add(1.0);
        let q = l.add(1.0);
        l.start(&[p, q], 1.0, 0);
        l.start(&[p], 1.0, 1);
        l.start(&[q], 1.0, 2);
        for t in 0..3 {
            assert!(close(rate(&mut l, t), 0.5));
        }
        let mut l = Links::new();
        let p = l.add(1.0);
        let q = l.add(2.0);
        l.start(&[p, q], 1.0, 0);
        l.start(&[p], 1.0, 1);
        l.start(&[q], 1.0, 2);
        assert!(close(rate(&mut l, 0), 0.5));
        assert!(close(rate(&mut l, 1), 0.5));
        assert!(close(rate(&mut l, 2), 1.5));
    }

    /// Three flows out of one sender's egress (cap 9) to three receivers whose ingress links
    /// are 2, 9 and 9: the first is held to 2, the other two split the remaining 7.
    #[test]
    fn three_flows_egress_and_ingress() {
        let mut l = Links::new();
        let out = l.add(9.0);
        let ins: Vec<LinkId> = [2.0, 9.0, 9.0].iter().map(|&c| l.add(c)).collect();
        for (t, &i) in ins.iter().enumerate() {
            l.start(&[out, i], 1.0, t as u32);
        }
        assert!(close(rate(&mut l, 0), 2.0));
        assert!(close(rate(&mut l, 1), 3.5));
        assert!(close(rate(&mut l, 2), 3.5));
    }

    /// Flows that end at one instant are taken together, and time advances the others.
    #[test]
    fn lockstep_flows_end_together() {
        let mut l = Links::new();
        let links: Vec<LinkId> = (0..4).map(|_| l.add(2.0)).collect();
        for (t, &k) in links.iter().enumerate() {
            l.start(&[k], 3.0, t as u32);
        }
        let t = l.next_finish().unwrap();
        assert!(close(t, 1.5));
        let mut done = Vec::new();
        l.advance(t);
        l.take_finished(t, &mut done);
        done.sort_unstable();
        assert_eq!(done, vec![0, 1, 2, 3]);
        assert_eq!(l.active(), 0);
        assert_eq!(l.next_finish(), None);
    }
}

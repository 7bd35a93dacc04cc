//! Max-min fair sharing of links among flows (progressive filling): every link has a capacity
//! in bytes per microsecond, every flow crosses one to three links, and the rates are the
//! max-min fair allocation: raise every unfrozen flow's rate together until some link is full,
//! freeze the flows crossing it at that rate, repeat.
//!
//! Flows that cross the same links always get the same rate, so they are kept together as a
//! class (all the slices a rank sends to one peer, all the messages from one host's NIC to
//! another's): the filling works on classes weighted by their flow counts, and a class keeps
//! one count of the bytes it has served each of its flows, so that a flow ends when that count
//! reaches the bytes it had been served when it started plus its own. A heap keyed by each
//! link's fair share (its remaining capacity over its unfrozen flows) finds the next link to
//! fill, so one recomputation costs O(classes x links per class x log links), whatever the
//! number of flows in them.
//!
//! Rates are recomputed only when a flow starts or ends, only for the classes connected to it
//! through shared links, and once for all the changes of one instant; a heap of each class's
//! next finish finds the next flow to end.
#![forbid(unsafe_code)]

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// A link of the network (an index into `Links`).
pub type LinkId = u32;

/// The most links one flow crosses.
pub const MAX_HOPS: usize = 3;

/// Relative tolerance under which two instants are one (flows of a lockstep step end together
/// although their finish times differ in the last bits).
pub const TIME_EPS: f64 = 1e-9;

/// The flows that cross one set of links.
#[derive(Clone, Debug, Default)]
struct Class {
    links: [LinkId; MAX_HOPS],
    hops: u8,
    /// Bytes served to each of its flows since the class was last idle, at `updated`.
    served: f64,
    updated: f64,
    /// Each flow's rate.
    rate: f64,
    /// The flows: `served` when each is done, and its token; the first to end on top.
    flows: BinaryHeap<Key>,
    /// When its first flow ends at the current rate.
    finish: f64,
    frozen: bool,
    /// Bumped at every new finish, so that stale entries of the finish heap are skipped.
    version: u32,
    /// Its index in `on[links[h]]` while it has flows.
    pos: [u32; MAX_HOPS],
}

impl Class {
    fn count(&self) -> u32 {
        self.flows.len() as u32
    }

    fn links(&self) -> &[LinkId] {
        &self.links[..self.hops as usize]
    }

    /// When a flow that is done once `target` bytes are served ends at the current rate.
    fn finish_of(&self, target: f64) -> f64 {
        self.updated + (target - self.served).max(0.0) / self.rate
    }
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

/// The links, the classes of active flows and their max-min fair rates. A flow's start or end
/// changes only the rates of the classes connected to it through shared links (its
/// component), so only that component is refilled.
#[derive(Debug, Default)]
pub struct Links {
    cap: Vec<f64>,
    classes: Vec<Class>,
    /// The class of each set of links that has flows.
    by_links: HashMap<[LinkId; MAX_HOPS], u32>,
    /// Slots of `classes` without flows, for reuse.
    free: Vec<u32>,
    alive: usize,
    now: f64,
    /// The classes with flows on each link.
    on: Vec<Vec<u32>>,
    /// Links whose flows changed since the last filling.
    dirty: Vec<LinkId>,
    finishes: BinaryHeap<Key>,
    // Scratch of the filling, one entry per link or class, kept between fillings.
    left: Vec<f64>,
    count: Vec<u32>,
    heap_scratch: Vec<Key>,
    through: Vec<Vec<u32>>,
    seen_link: Vec<u32>,
    seen_class: Vec<u32>,
    stamp: u32,
    comp_links: Vec<LinkId>,
    comp_classes: Vec<u32>,
    stack: Vec<LinkId>,
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
        self.through.push(Vec::new());
        self.on.push(Vec::new());
        self.seen_link.push(0);
        (self.cap.len() - 1) as LinkId
    }

    /// The links added so far.
    pub fn len(&self) -> usize {
        self.cap.len()
    }

    /// Whether no link has been added.
    pub fn is_empty(&self) -> bool {
        self.cap.is_empty()
    }

    /// Link `l`'s capacity, bytes per microsecond.
    pub fn capacity(&self, l: LinkId) -> f64 {
        self.cap[l as usize]
    }

    /// Active flows.
    pub fn active(&self) -> usize {
        self.alive
    }

    /// Start a flow of `bytes` (> 0) over `links` (1 to `MAX_HOPS` distinct links) at the
    /// current instant.
    pub fn start(&mut self, links: &[LinkId], bytes: f64, token: u32) {
        debug_assert!(!links.is_empty() && links.len() <= MAX_HOPS && bytes > 0.0);
        debug_assert!((1..links.len()).all(|i| !links[..i].contains(&links[i])));
        // Unused hops are LinkId::MAX, so the key names the set and its order.
        let mut l = [LinkId::MAX; MAX_HOPS];
        l[..links.len()].copy_from_slice(links);
        let c = match self.by_links.get(&l) {
            Some(&c) => c,
            None => {
                let c = self.new_class(l, links.len());
                self.by_links.insert(l, c);
                c
            }
        };
        let now = self.now;
        let k = &mut self.classes[c as usize];
        if k.flows.is_empty() {
            k.served = 0.0;
            k.rate = 0.0;
            k.finish = f64::INFINITY;
        } else {
            k.served += k.rate * (now - k.updated);
        }
        k.updated = now;
        k.flows.push(Key(k.served + bytes, token, 0));
        self.alive += 1;
        self.dirty.extend_from_slice(links);
    }

    /// A class without flows over `l`, listed on its links.
    fn new_class(&mut self, l: [LinkId; MAX_HOPS], hops: usize) -> u32 {
        let c = match self.free.pop() {
            Some(c) => c,
            None => {
                self.classes.push(Class::default());
                self.seen_class.push(0);
                (self.classes.len() - 1) as u32
            }
        };
        let k = &mut self.classes[c as usize];
        k.links = l;
        k.hops = hops as u8;
        for (h, &link) in l[..hops].iter().enumerate() {
            k.pos[h] = self.on[link as usize].len() as u32;
            self.on[link as usize].push(c);
        }
        c
    }

    /// Unlist class `c`, which has no flows left, and free its slot.
    fn drop_class(&mut self, c: u32) {
        let k = &mut self.classes[c as usize];
        k.version = k.version.wrapping_add(1);
        let (links, pos, hops) = (k.links, k.pos, k.hops as usize);
        self.by_links.remove(&links);
        for h in 0..hops {
            let (link, p) = (links[h] as usize, pos[h] as usize);
            self.on[link].swap_remove(p);
            if let Some(&moved) = self.on[link].get(p) {
                let m = &mut self.classes[moved as usize];
                let hm = m.links().iter().position(|&x| x as usize == link);
                m.pos[hm.expect("a listed class crosses its link")] = p as u32;
            }
        }
        self.free.push(c);
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
        while let Some(&Key(t, c, v)) = self.finishes.peek() {
            let k = &self.classes[c as usize];
            if !k.flows.is_empty() && k.version == v {
                return Some(t);
            }
            self.finishes.pop();
        }
        None
    }

    /// Remove the flows that end by `t` (within `TIME_EPS`), returning their tokens.
    pub fn take_finished(&mut self, t: f64, out: &mut Vec<u32>) {
        self.take_finished_then(t, out, |_| None);
    }

    /// `take_finished`, where a finished flow may hand its place to a successor over the same
    /// links: `next(token)` gives the successor's token and bytes (> 0), which starts at once
    /// with the finished flow's share (a pair's messages one after the other). A class whose
    /// every finished flow has a successor keeps its flow count, so no rate changes and nothing
    /// is refilled: a queue of slices costs one event per slice, not a filling.
    pub fn take_finished_then(
        &mut self,
        t: f64,
        out: &mut Vec<u32>,
        mut next: impl FnMut(u32) -> Option<(u32, f64)>,
    ) {
        let limit = t + TIME_EPS * t.abs().max(1.0);
        while self.next_finish().is_some_and(|f| f <= limit) {
            let Some(Key(_, c, _)) = self.finishes.pop() else {
                break;
            };
            let k = &mut self.classes[c as usize];
            let mut ended = false;
            while let Some(&Key(target, token, _)) = k.flows.peek() {
                if k.finish_of(target) > limit {
                    break;
                }
                k.flows.pop();
                out.push(token);
                match next(token) {
                    Some((succ, bytes)) => k.flows.push(Key(target + bytes, succ, 0)),
                    None => {
                        self.alive -= 1;
                        ended = true;
                    }
                }
            }
            k.version = k.version.wrapping_add(1);
            if !ended {
                // The same flows at the same rates: only its first finish moved.
                let top = k
                    .flows
                    .peek()
                    .map(|f| f.0)
                    .expect("a successor took the place");
                k.finish = k.finish_of(top);
                self.finishes.push(Key(k.finish, c, k.version));
                continue;
            }
            // Its next finish is pushed by the filling that its change calls for.
            k.finish = f64::INFINITY;
            let (links, hops) = (k.links, k.hops as usize);
            if k.flows.is_empty() {
                self.drop_class(c);
            }
            self.dirty.extend_from_slice(&links[..hops]);
        }
    }

    /// The current rate of each flow, by token (for tests and reports).
    pub fn rates(&mut self) -> Vec<(u32, f64)> {
        if !self.dirty.is_empty() {
            self.fill();
        }
        self.classes
            .iter()
            .flat_map(|k| k.flows.iter().map(move |f| (f.1, k.rate)))
            .collect()
    }

    /// The classes connected to the dirty links (`comp_classes`, over `comp_links`), each
    /// brought up to date at `now`.
    fn component(&mut self) {
        self.stamp = self.stamp.wrapping_add(1).max(1);
        let stamp = self.stamp;
        self.comp_links.clear();
        self.comp_classes.clear();
        let mut stack = std::mem::take(&mut self.stack);
        stack.append(&mut self.dirty);
        while let Some(l) = stack.pop() {
            let u = l as usize;
            if self.seen_link[u] == stamp {
                continue;
            }
            self.seen_link[u] = stamp;
            self.comp_links.push(l);
            for &c in &self.on[u] {
                if self.seen_class[c as usize] == stamp {
                    continue;
                }
                self.seen_class[c as usize] = stamp;
                self.comp_classes.push(c);
                stack.extend_from_slice(self.classes[c as usize].links());
            }
        }
        self.stack = stack;
        let now = self.now;
        for &c in &self.comp_classes {
            let k = &mut self.classes[c as usize];
            k.served += k.rate * (now - k.updated);
            k.updated = now;
        }
    }

    /// Progressive filling of the component of the dirty links: its max-min fair rates.
    fn fill(&mut self) {
        self.component();
        let (links, classes) = (
            std::mem::take(&mut self.comp_links),
            std::mem::take(&mut self.comp_classes),
        );
        for &l in &links {
            let u = l as usize;
            self.left[u] = self.cap[u];
            self.count[u] = 0;
            self.through[u].clear();
        }
        for &c in &classes {
            let k = &mut self.classes[c as usize];
            k.frozen = false;
            let n = k.count();
            for &l in k.links() {
                self.count[l as usize] += n;
                self.through[l as usize].push(c);
            }
        }
        // Each link keyed by its fair share when pushed. A link's share only grows as the
        // classes of other links freeze (they take at most its share each), so a key is a
        // lower bound of its link's share: a popped link whose share has since grown goes
        // back with the new one (once per pop, not once per change), and one whose key is
        // current is the least share left.
        let mut heap = BinaryHeap::from(std::mem::take(&mut self.heap_scratch));
        heap.extend(
            links
                .iter()
                .filter(|&&l| self.count[l as usize] > 0)
                .map(|&l| {
                    let u = l as usize;
                    Key(self.left[u] / f64::from(self.count[u]), l, 0)
                }),
        );
        while let Some(Key(key, l, _)) = heap.pop() {
            let u = l as usize;
            if self.count[u] == 0 {
                continue;
            }
            let share = self.left[u] / f64::from(self.count[u]);
            if share > key {
                heap.push(Key(share, l, 0));
                continue;
            }
            for j in 0..self.through[u].len() {
                let c = self.through[u][j] as usize;
                let k = &mut self.classes[c];
                if k.frozen {
                    continue;
                }
                k.frozen = true;
                k.rate = share;
                let n = k.count();
                for &o in k.links() {
                    let o = o as usize;
                    if o == u {
                        continue;
                    }
                    self.left[o] = (self.left[o] - share * f64::from(n)).max(0.0);
                    self.count[o] -= n;
                }
            }
            self.count[u] = 0;
        }
        self.heap_scratch = heap.into_vec();
        for &c in &classes {
            let k = &mut self.classes[c as usize];
            let Some(&Key(target, _, _)) = k.flows.peek() else {
                continue;
            };
            let finish = k.finish_of(target);
            // A class whose first finish did not move keeps its entry in the heap (most of a
            // component, most of the time): no stale entries pile up.
            if k.finish.is_finite() && (finish - k.finish).abs() <= TIME_EPS * finish.max(1.0) {
                continue;
            }
            k.finish = finish;
            k.version = k.version.wrapping_add(1);
            self.finishes.push(Key(finish, c, k.version));
        }
        (self.comp_links, self.comp_classes) = (links, classes);
        // Superseded entries stay in the heap until they reach its top; where rates change
        // far more often than flows end they would pile up, so the heap is rebuilt from the
        // live classes when they dominate.
        if self.finishes.len() > 4 * self.classes.len() + 1024 {
            let classes = &self.classes;
            self.finishes = (0..classes.len() as u32)
                .filter(|&c| !classes[c as usize].flows.is_empty())
                .map(|c| {
                    let k = &classes[c as usize];
                    Key(k.finish, c, k.version)
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

    /// Flows over the same links share one class: a flow that joins later, and smaller, ends
    /// first, each at its own count of bytes. Link of 10; A 100 bytes from 0; at 5 (A has 50
    /// left) B of 20 joins: 5 each, B ends at 9, A (30 left) at 12 alone at 10.
    #[test]
    fn flows_of_one_class_end_by_their_own_bytes() {
        let mut l = Links::new();
        let a = l.add(10.0);
        l.start(&[a], 100.0, 1);
        assert!(close(l.next_finish().unwrap(), 10.0));
        l.advance(5.0);
        l.start(&[a], 20.0, 2);
        let mut done = Vec::new();
        let t = l.next_finish().unwrap();
        assert!(close(t, 9.0), "{t}");
        l.advance(t);
        l.take_finished(t, &mut done);
        assert_eq!(done, vec![2]);
        assert!(close(rate(&mut l, 1), 10.0));
        let t = l.next_finish().unwrap();
        assert!(close(t, 12.0), "{t}");
        l.advance(t);
        l.take_finished(t, &mut done);
        assert_eq!(done, vec![2, 1]);
        assert_eq!(l.active(), 0);
        // The class is gone and comes back fresh.
        l.start(&[a], 10.0, 3);
        assert!(close(l.next_finish().unwrap(), 13.0));
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

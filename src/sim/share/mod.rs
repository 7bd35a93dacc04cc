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
//! Rates are recomputed only when a flow starts or ends, or a shaped link's bucket runs dry
//! (`bucket`), only for the classes connected to it through shared links, and once for all the
//! changes of one instant; a heap of each class's next finish finds the next flow to end.
#![forbid(unsafe_code)]

use super::bucket::Bucket;
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
    /// The token bucket of each shaped link (`bucket`), whose capacity it sets.
    buckets: Vec<Option<Bucket>>,
    /// When shaped links' buckets run dry (link, bucket version), soonest first.
    dry: BinaryHeap<Key>,
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
        self.buckets.push(None);
        self.left.push(0.0);
        self.count.push(0);
        self.through.push(Vec::new());
        self.on.push(Vec::new());
        self.seen_link.push(0);
        (self.cap.len() - 1) as LinkId
    }

    /// A link of `bytes_per_us` shaped by a token bucket of `burst` bytes, full at the start,
    /// that passes up to `peak` bytes per us while it holds tokens (`bucket`; `peak` above
    /// `bytes_per_us`, `burst` positive).
    pub fn add_shaped(&mut self, bytes_per_us: f64, peak: f64, burst: f64) -> LinkId {
        let l = self.add(bytes_per_us);
        let b = Bucket::new(bytes_per_us, peak, burst);
        self.cap[l as usize] = b.capacity();
        self.buckets[l as usize] = Some(b);
        l
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

    /// When the next flow ends or a shaped link's bucket runs dry, whichever is first (None
    /// without either).
    pub fn next_finish(&mut self) -> Option<f64> {
        let flow = self.next_flow_finish();
        match (flow, self.next_dry()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// When the next shaped link's bucket runs dry, its stale events dropped.
    fn next_dry(&mut self) -> Option<f64> {
        while let Some(&Key(t, l, v)) = self.dry.peek() {
            if self.buckets[l as usize].is_some_and(|b| b.version == v) {
                return Some(t);
            }
            self.dry.pop();
        }
        None
    }

    /// When the next flow ends (None without flows).
    fn next_flow_finish(&mut self) -> Option<f64> {
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
        // Buckets that run dry by `t`: their links fall to their rates.
        while let Some(when) = self.next_dry().filter(|&d| d <= limit) {
            let Some(Key(_, l, _)) = self.dry.pop() else {
                break;
            };
            let b = self.buckets[l as usize].as_mut().expect("a shaped link");
            b.dry(when);
            self.cap[l as usize] = b.capacity();
            self.dirty.push(l);
        }
        while self.next_flow_finish().is_some_and(|f| f <= limit) {
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
        let now = self.now;
        for &l in &links {
            let u = l as usize;
            if let Some(b) = &mut self.buckets[u] {
                b.advance(now);
                self.cap[u] = b.capacity();
            }
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
        // The shaped links' buckets from now at their new throughputs.
        for &l in &links {
            let u = l as usize;
            let Some(b) = &mut self.buckets[u] else {
                continue;
            };
            let thru: f64 = self.on[u]
                .iter()
                .map(|&c| {
                    let k = &self.classes[c as usize];
                    k.rate * f64::from(k.count())
                })
                .sum();
            if let Some(t) = b.carry(thru, now) {
                self.dry.push(Key(t, l, b.version));
            }
        }
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
mod tests;

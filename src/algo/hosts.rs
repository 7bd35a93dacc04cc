//! Which host each rank runs on, as the schedules see it. A host is what shares memory: the
//! ranks of one host talk through shared memory, the others through the network, so that
//! hierarchical schedules keep the network steps few and flat ones cross each host boundary as
//! rarely as their pattern allows.
//!
//! Layouts are interned (one `&'static` slice per distinct layout, for the life of the
//! process), so that `Options` stays `Copy` and choices and schedules can be cached by value.
//! A process meets few distinct layouts (one per communicator shape), so the table stays small.
#![forbid(unsafe_code)]

use parking_lot::Mutex;
use std::collections::HashSet;

/// The host index of every rank (hosts numbered 0.. in order of their first rank), or the
/// empty layout: every rank on one host, whatever their number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Hosts(&'static [u32]);

impl Default for Hosts {
    fn default() -> Hosts {
        Hosts::ONE
    }
}

impl Hosts {
    /// Every rank on one host.
    pub const ONE: Hosts = Hosts(&[]);

    /// The layout where rank r is on host `of[r]` (any labels: hosts are renumbered in order of
    /// their first rank). One host gives `ONE`.
    pub fn from_labels<T: Eq + std::hash::Hash + Clone>(of: &[T]) -> Hosts {
        let mut seen: Vec<T> = Vec::new();
        let idx: Vec<u32> = of
            .iter()
            .map(|h| match seen.iter().position(|s| s == h) {
                Some(i) => i as u32,
                None => {
                    seen.push(h.clone());
                    (seen.len() - 1) as u32
                }
            })
            .collect();
        if seen.len() <= 1 {
            return Hosts::ONE;
        }
        Hosts(intern(idx))
    }

    /// `n` ranks in hosts of `per` consecutive ranks (the last may be smaller); `per` of 0 or at
    /// least `n` gives `ONE`.
    pub fn blocks(n: usize, per: usize) -> Hosts {
        if per == 0 || per >= n {
            return Hosts::ONE;
        }
        let labels: Vec<usize> = (0..n).map(|r| r / per).collect();
        Hosts::from_labels(&labels)
    }

    /// Is every rank on one host?
    pub fn is_one(&self) -> bool {
        self.0.is_empty()
    }

    /// How many hosts `n` ranks occupy.
    pub fn count(&self) -> usize {
        self.0.iter().max().map_or(1, |m| *m as usize + 1)
    }

    /// The host of rank `r`.
    pub fn host_of(&self, r: usize) -> usize {
        self.0.get(r).map_or(0, |h| *h as usize)
    }

    /// How many ranks the layout names (0 for `ONE`, which fits any number).
    pub fn ranks(&self) -> usize {
        self.0.len()
    }

    /// Does this layout describe `n` ranks? (`ONE` describes any number.)
    pub fn fits(&self, n: usize) -> bool {
        self.is_one() || self.0.len() == n
    }

    /// The ranks of each host, in rank order, for `n` ranks.
    pub fn members(&self, n: usize) -> Vec<Vec<usize>> {
        let mut m = vec![Vec::new(); self.count()];
        for r in 0..n {
            m[self.host_of(r)].push(r);
        }
        m
    }

    /// Ranks per host, for `n` ranks.
    pub fn sizes(&self, n: usize) -> Vec<usize> {
        self.members(n).iter().map(Vec::len).collect()
    }

    /// The ranks per host when every host has the same number, else None.
    pub fn even(&self, n: usize) -> Option<usize> {
        let s = self.sizes(n);
        s.iter().all(|x| *x == s[0]).then_some(s[0])
    }

    /// The ranks of host 0, then host 1, ...: the order in which a ring crosses each host
    /// boundary once per direction.
    pub fn order(&self, n: usize) -> Vec<usize> {
        self.members(n).concat()
    }

    /// The hosts of a group of ranks `g`: for each host, in the order hosts first appear in
    /// `g`, the positions in `g` (member indices) of its ranks, in group order.
    pub fn groups(&self, g: &[usize]) -> Vec<Vec<usize>> {
        let mut label: Vec<usize> = Vec::new();
        let mut out: Vec<Vec<usize>> = Vec::new();
        for (m, &r) in g.iter().enumerate() {
            let h = self.host_of(r);
            match label.iter().position(|&x| x == h) {
                Some(i) => out[i].push(m),
                None => {
                    label.push(h);
                    out.push(vec![m]);
                }
            }
        }
        out
    }

    /// Are the ranks of each host consecutive (so that `order` is 0..n)?
    pub fn contiguous(&self, n: usize) -> bool {
        self.order(n).iter().enumerate().all(|(i, r)| i == *r)
    }
}

/// The one `&'static` copy of a layout.
fn intern(v: Vec<u32>) -> &'static [u32] {
    static TABLE: Mutex<Option<HashSet<&'static [u32]>>> = Mutex::new(None);
    let mut t = TABLE.lock();
    let t = t.get_or_insert_with(HashSet::new);
    if let Some(s) = t.get(v.as_slice()) {
        return s;
    }
    let s: &'static [u32] = Box::leak(v.into_boxed_slice());
    t.insert(s);
    s
}

#[cfg(test)]
mod tests {
    use super::Hosts;

    #[test]
    fn layouts_are_renumbered_and_interned() {
        let a = Hosts::from_labels(&["b", "a", "b", "c", "a", "b"]);
        assert_eq!(a.count(), 3);
        assert_eq!(a.members(6), vec![vec![0, 2, 5], vec![1, 4], vec![3]]);
        assert_eq!(a.sizes(6), vec![3, 2, 1]);
        assert_eq!(a.order(6), vec![0, 2, 5, 1, 4, 3]);
        assert!(!a.contiguous(6));
        assert_eq!(a.even(6), None);
        assert_eq!(a.groups(&[3, 1, 0, 4]), vec![vec![0], vec![1, 3], vec![2]]);
        let b = Hosts::from_labels(&[7, 3, 7, 9, 3, 7]);
        assert_eq!(a, b);
        assert!(std::ptr::eq(a.0, b.0), "one copy per layout");
    }

    #[test]
    fn one_host_and_blocks() {
        assert_eq!(Hosts::from_labels(&[1, 1, 1]), Hosts::ONE);
        assert_eq!(Hosts::blocks(4, 4), Hosts::ONE);
        assert_eq!(Hosts::blocks(4, 0), Hosts::ONE);
        assert!(Hosts::ONE.fits(17) && Hosts::ONE.count() == 1);
        let h = Hosts::blocks(6, 2);
        assert_eq!(h.even(6), Some(2));
        assert!(h.contiguous(6) && h.fits(6) && !h.fits(5));
        assert_eq!(Hosts::blocks(5, 2).sizes(5), vec![2, 2, 1]);
    }
}

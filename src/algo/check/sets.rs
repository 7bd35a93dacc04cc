//! Interned sets of ranks, for the checker's contributions at any rank count. A set is a bitset
//! of `u64` words stored once and named by a `SetId`; equal sets get equal ids, so comparing two
//! contributions is comparing two integers. Unions are memoised (the same partial sums meet at
//! many elements), and the last union is cached on its own: consecutive elements of a span
//! usually combine the same two sets.
#![forbid(unsafe_code)]

use rustc_hash::FxHashMap;

/// The name of an interned set.
pub type SetId = u32;

/// Which ranks' contributions an output element must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ranks {
    /// Rank r's alone.
    One(usize),
    /// Every rank's, each once.
    All,
}

/// The sets of one symbolic run.
pub struct Sets {
    nranks: usize,
    words: usize,
    bits: Vec<Box<[u64]>>,
    index: FxHashMap<Box<[u64]>, SetId>,
    /// (smaller id, larger id) -> their union, or None where they overlap.
    unions: FxHashMap<(SetId, SetId), Option<SetId>>,
    last: Option<((SetId, SetId), Option<SetId>)>,
    singles: Vec<Option<SetId>>,
    all: Option<SetId>,
}

impl Sets {
    pub fn new(nranks: usize) -> Sets {
        Sets {
            nranks,
            words: nranks.div_ceil(64).max(1),
            bits: Vec::new(),
            index: FxHashMap::default(),
            unions: FxHashMap::default(),
            last: None,
            singles: vec![None; nranks],
            all: None,
        }
    }

    fn intern(&mut self, bits: Box<[u64]>) -> SetId {
        if let Some(&id) = self.index.get(&bits) {
            return id;
        }
        let id = SetId::try_from(self.bits.len()).expect("fewer than 2^32 distinct sets");
        self.bits.push(bits.clone());
        self.index.insert(bits, id);
        id
    }

    /// `{r}`.
    pub fn one(&mut self, r: usize) -> SetId {
        if let Some(id) = self.singles[r] {
            return id;
        }
        let mut b = vec![0u64; self.words].into_boxed_slice();
        b[r / 64] |= 1 << (r % 64);
        let id = self.intern(b);
        self.singles[r] = Some(id);
        id
    }

    /// Every rank.
    pub fn all(&mut self) -> SetId {
        if let Some(id) = self.all {
            return id;
        }
        let mut b = vec![u64::MAX; self.words].into_boxed_slice();
        let tail = self.nranks % 64;
        if tail != 0 {
            b[self.words - 1] = (1u64 << tail) - 1;
        }
        if self.nranks == 0 {
            b[0] = 0;
        }
        let id = self.intern(b);
        self.all = Some(id);
        id
    }

    /// The set `want` names.
    pub fn of(&mut self, want: Ranks) -> SetId {
        match want {
            Ranks::One(r) => self.one(r),
            Ranks::All => self.all(),
        }
    }

    /// `a ∪ b` where the two are disjoint; None where they share a rank.
    pub fn union(&mut self, a: SetId, b: SetId) -> Option<SetId> {
        let key = (a.min(b), a.max(b));
        if let Some((k, u)) = self.last {
            if k == key {
                return u;
            }
        }
        let u = match self.unions.get(&key) {
            Some(&u) => u,
            None => {
                let (x, y) = (&self.bits[a as usize], &self.bits[b as usize]);
                let u = if x.iter().zip(y.iter()).any(|(p, q)| p & q != 0) {
                    None
                } else {
                    let bits: Box<[u64]> = x.iter().zip(y.iter()).map(|(p, q)| p | q).collect();
                    Some(self.intern(bits))
                };
                self.unions.insert(key, u);
                u
            }
        };
        self.last = Some((key, u));
        u
    }

    /// The set's ranks as ranges, e.g. "0-3,5" (for error messages).
    pub fn describe(&self, id: SetId) -> String {
        let b = &self.bits[id as usize];
        let has = |r: usize| b[r / 64] & (1 << (r % 64)) != 0;
        let mut parts = Vec::new();
        let mut r = 0;
        while r < self.nranks {
            if !has(r) {
                r += 1;
                continue;
            }
            let lo = r;
            while r < self.nranks && has(r) {
                r += 1;
            }
            parts.push(if r - 1 == lo {
                lo.to_string()
            } else {
                format!("{lo}-{}", r - 1)
            });
        }
        format!("{{{}}}", parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_are_interned_and_unions_exact_past_64_ranks() {
        let mut s = Sets::new(130);
        let (a, b, c) = (s.one(0), s.one(64), s.one(129));
        let ab = s.union(a, b).unwrap();
        assert_eq!(s.union(b, a), Some(ab));
        let abc = s.union(ab, c).unwrap();
        assert_eq!(s.union(a, ab), None, "overlap");
        assert_eq!(s.describe(abc), "{0,64,129}");
        // Built in another order, the same set has the same id.
        let bc = s.union(b, c).unwrap();
        assert_eq!(s.union(a, bc), Some(abc));
        let mut all = s.one(0);
        for r in 1..130 {
            let one = s.one(r);
            all = s.union(all, one).unwrap();
        }
        assert_eq!(all, s.of(Ranks::All));
        assert_eq!(s.describe(all), "{0-129}");
        assert_ne!(s.of(Ranks::One(5)), s.of(Ranks::One(69)));
    }
}

//! The one handle table type. Every object handed to C as an opaque pointer (NCCL net and
//! CollNet comms, requests and registrations, the C API's communicators and requests) is a
//! key in a [`HandleTable`], never a real pointer: a stale or garbage pointer from a caller is
//! an error, not a crash. Keys are never reused: a process-wide serial in the high bits, a
//! caller-chosen tag (device and kind) in the low 8 bits.
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, Ordering};

static SERIAL: AtomicU64 = AtomicU64::new(1);

/// A new, never reused key whose low 8 bits are `tag`.
pub fn new_key(tag: u8) -> u64 {
    (SERIAL.fetch_add(1, Ordering::Relaxed) << 8) | tag as u64
}

/// Objects by handle.
#[derive(Debug)]
pub struct HandleTable<T> {
    map: FxHashMap<u64, T>,
}

impl<T> Default for HandleTable<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> HandleTable<T> {
    pub fn new() -> Self {
        HandleTable {
            map: FxHashMap::default(),
        }
    }

    /// Store `v` under a new key tagged `tag`; returns the key.
    pub fn insert(&mut self, tag: u8, v: T) -> u64 {
        let k = new_key(tag);
        self.map.insert(k, v);
        k
    }

    /// Store `v` under a key made by [`new_key`] earlier (an object whose handle exists before
    /// the object does, such as a comm that a state machine is still setting up).
    pub fn insert_at(&mut self, key: u64, v: T) {
        self.map.insert(key, v);
    }

    #[inline]
    pub fn get(&self, key: u64) -> Option<&T> {
        self.map.get(&key)
    }

    #[inline]
    pub fn get_mut(&mut self, key: u64) -> Option<&mut T> {
        self.map.get_mut(&key)
    }

    pub fn contains(&self, key: u64) -> bool {
        self.map.contains_key(&key)
    }

    pub fn remove(&mut self, key: u64) -> Option<T> {
        self.map.remove(&key)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Keep only the entries for which `f` is true.
    pub fn retain(&mut self, mut f: impl FnMut(u64, &mut T) -> bool) {
        self.map.retain(|k, v| f(*k, v))
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, &T)> {
        self.map.iter().map(|(k, v)| (*k, v))
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.map.values_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_unique_and_tagged() {
        let mut t = HandleTable::new();
        let a = t.insert(7, "a");
        let b = t.insert(7, "b");
        assert_ne!(a, b);
        assert_eq!(a & 0xff, 7);
        assert_eq!(t.get(a), Some(&"a"));
        assert_eq!(t.remove(a), Some("a"));
        assert!(t.get(a).is_none() && t.contains(b) && t.len() == 1);
        assert!(t.get(0xdead_beef).is_none());
    }
}

//! Registration cache: a registration covers whole pages and is shared by every later
//! registration that falls inside it, so per-connection `regMr` of sub-ranges is cheap (this is
//! what makes `regIsGlobal=1` true). Reference-counted; closed when the last user deregisters.
//! Device memory is registered exactly as asked (a page beyond a device allocation is not
//! its memory) and shared only with later registrations of the same device inside it.
use crate::error::{Error, Result};
use crate::transport::{DmaBuf, Mr, Region, Transport};
use std::collections::HashMap;

struct Entry {
    span: Region,
    mr: Mr,
    refs: usize,
}

impl Entry {
    /// Whether this registration serves `region` of memory `device` (None: host).
    fn covers(&self, region: &Region, device: Option<i32>) -> bool {
        self.mr.device == device && self.span.contains(region)
    }
}

/// What a memory handle given to NCCL refers to.
#[derive(Debug, Clone, Copy)]
pub struct MrRef {
    entry: u64,
    pub region: Region,
}

#[derive(Default)]
pub struct MrCache {
    entries: HashMap<u64, Entry>,
    next: u64,
    pub shared: bool,
}

impl MrCache {
    pub fn new(shared: bool) -> MrCache {
        MrCache {
            shared,
            ..Default::default()
        }
    }

    /// A registration already covering `region` of memory `device`, now with one more user.
    fn reuse(&mut self, region: Region, device: Option<i32>) -> Option<MrRef> {
        if !self.shared {
            return None;
        }
        let (id, e) = self
            .entries
            .iter_mut()
            .find(|(_, e)| e.covers(&region, device))?;
        e.refs += 1;
        Some(MrRef { entry: *id, region })
    }

    fn insert(&mut self, span: Region, mr: Mr, region: Region) -> MrRef {
        self.next += 1;
        self.entries.insert(self.next, Entry { span, mr, refs: 1 });
        MrRef {
            entry: self.next,
            region,
        }
    }

    /// Register `region`, memory of CUDA device `ordinal`, exactly (or reuse a registration of
    /// that device covering it).
    pub fn register_device(
        &mut self,
        t: &dyn Transport,
        region: Region,
        ordinal: i32,
    ) -> Result<MrRef> {
        if let Some(r) = self.reuse(region, Some(ordinal)) {
            return Ok(r);
        }
        let mr = t.register_device(region, ordinal)?;
        Ok(self.insert(region, mr, region))
    }

    /// `register_device` through the dma-buf `buf` that exports the memory (or reuse a
    /// registration of that device covering it: the memory is the same however it was named).
    pub fn register_dmabuf(
        &mut self,
        t: &dyn Transport,
        region: Region,
        ordinal: i32,
        buf: DmaBuf,
    ) -> Result<MrRef> {
        if let Some(r) = self.reuse(region, Some(ordinal)) {
            return Ok(r);
        }
        let mr = t.register_dmabuf(region, ordinal, buf)?;
        Ok(self.insert(region, mr, region))
    }

    /// Register `region` (or reuse a registration covering it); `remote`: for peers' RMA too.
    pub fn register(&mut self, t: &dyn Transport, region: Region, remote: bool) -> Result<MrRef> {
        if let Some(r) = self.reuse(region, None) {
            return Ok(r);
        }
        let span = if self.shared {
            region.page_span()
        } else {
            region
        };
        let mr = if remote {
            t.register_remote(span)?
        } else {
            t.register(span)?
        };
        Ok(self.insert(span, mr, region))
    }

    pub fn deregister(&mut self, r: MrRef) -> Result<()> {
        let e = self
            .entries
            .get_mut(&r.entry)
            .ok_or_else(|| Error::Internal("registration cache entry missing".into()))?;
        e.refs -= 1;
        if e.refs == 0 {
            self.entries.remove(&r.entry);
        }
        Ok(())
    }

    pub fn mr(&self, r: &MrRef) -> Option<&Mr> {
        self.entries.get(&r.entry).map(|e| &e.mr)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::loopback::LoopbackFabric;

    /// A buffer of three pages, page-aligned, and a region of it.
    struct Pages(Vec<u8>, usize);

    impl Pages {
        fn new() -> Pages {
            let page = 4096;
            let v = vec![0u8; 4 * page];
            let skip = v.as_ptr().align_offset(page);
            Pages(v, skip)
        }

        fn region(&mut self, off: usize, len: usize) -> Region {
            assert!(self.1 + off + len <= self.0.len());
            // SAFETY: within the vector, which outlives every registration of a test.
            unsafe { Region::from_raw(self.0.as_mut_ptr().add(self.1 + off), len) }
        }
    }

    #[test]
    fn shared_registrations_cover_pages_and_are_reused_until_the_last_user_goes() {
        let f = LoopbackFabric::new();
        let t = f.endpoint();
        let mut buf = Pages::new();
        let mut c = MrCache::new(true);
        let a = c.register(&t, buf.region(100, 200), false).unwrap();
        // The registration covers the whole page, and the caller's region stays its own.
        let span = c.mr(&a).unwrap().region;
        assert_eq!((span.addr() % 4096, span.len()), (0, 4096));
        assert_eq!(
            (a.region.addr(), a.region.len()),
            (buf.region(100, 200).addr(), 200)
        );
        // Another sub-range of that page: the same entry, no new registration.
        let b = c.register(&t, buf.region(1000, 3000), false).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(c.mr(&b).unwrap().region.addr(), span.addr());
        // A range reaching into the next page: a registration of its own, of both pages.
        let d = c.register(&t, buf.region(4000, 200), false).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c.mr(&d).unwrap().region.len(), 2 * 4096);
        // Freed with its last user only.
        c.deregister(a).unwrap();
        assert!(c.mr(&b).is_some() && c.len() == 2);
        c.deregister(b).unwrap();
        assert!(c.mr(&b).is_none() && c.len() == 1);
        c.deregister(d).unwrap();
        assert!(c.is_empty());
        // A handle deregistered twice is refused, not a crash or a count below zero.
        let e = c.deregister(d).unwrap_err().to_string();
        assert!(e.contains("missing"), "{e}");
    }

    #[test]
    fn unshared_registrations_are_exact_and_never_reused() {
        let f = LoopbackFabric::new();
        let t = f.endpoint();
        let mut buf = Pages::new();
        let mut c = MrCache::new(false);
        let a = c.register(&t, buf.region(100, 200), false).unwrap();
        let b = c.register(&t, buf.region(100, 200), false).unwrap();
        assert_eq!(c.len(), 2);
        for r in [&a, &b] {
            let mr = c.mr(r).unwrap().region;
            assert_eq!((mr.addr(), mr.len()), (buf.region(100, 200).addr(), 200));
        }
        c.deregister(a).unwrap();
        assert_eq!(c.len(), 1);
        c.deregister(b).unwrap();
        assert!(c.is_empty());
    }

    #[test]
    fn remote_registrations_carry_a_key_and_local_ones_none() {
        let f = LoopbackFabric::new();
        let t = f.endpoint();
        let mut buf = Pages::new();
        let mut c = MrCache::new(false);
        let local = c.register(&t, buf.region(0, 64), false).unwrap();
        let remote = c.register(&t, buf.region(64, 64), true).unwrap();
        assert_eq!(c.mr(&local).unwrap().key, None);
        assert!(c.mr(&remote).unwrap().key.is_some());
    }
}

//! Registration cache: a registration covers whole pages and is shared by every later
//! registration that falls inside it, so per-connection `regMr` of sub-ranges is cheap (this is
//! what makes `regIsGlobal=1` true). Reference-counted; closed when the last user deregisters.
//! Device memory is registered exactly as asked (a page beyond a device allocation is not
//! its memory) and shared only with later registrations of the same device inside it.
use crate::error::{Error, Result};
use crate::transport::{Mr, Region, Transport};
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

//! Registration cache: a registration covers whole pages and is shared by every later
//! registration that falls inside it, so per-connection `regMr` of sub-ranges is cheap (this is
//! what makes `regIsGlobal=1` true). Reference-counted; closed when the last user deregisters.
use crate::error::{Error, Result};
use crate::transport::{Mr, Region, Transport};
use std::collections::HashMap;

struct Entry {
    span: Region,
    mr: Mr,
    refs: usize,
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

    /// Register `region` (or reuse a registration covering it); `remote`: for peers' RMA too.
    pub fn register(&mut self, t: &dyn Transport, region: Region, remote: bool) -> Result<MrRef> {
        if self.shared {
            if let Some((id, e)) = self
                .entries
                .iter_mut()
                .find(|(_, e)| e.span.contains(&region))
            {
                e.refs += 1;
                return Ok(MrRef { entry: *id, region });
            }
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
        self.next += 1;
        self.entries.insert(self.next, Entry { span, mr, refs: 1 });
        Ok(MrRef {
            entry: self.next,
            region,
        })
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

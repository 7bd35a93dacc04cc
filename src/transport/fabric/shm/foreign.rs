//! Another call's messages on libfabric 2.x's shm, found without a receive that could truncate
//! them.
//!
//! 2.x's shm mishandles a message longer than the receive it matches: a saved one kills the
//! receiver inside `fi_trecv` (`smr_copy_saved` follows a null pointer once its copy comes up
//! short), and a receive posted first that such a message truncates never completes
//! (`docs/providers.md`). Ranks whose calls differ send each other exactly such messages. So
//! there a collective's receives match its call's signature exactly (`Caps::truncation_crashes`)
//! and another call's messages wait unexpected; a collective that stalls looks for them
//! (`Transport::take_foreign`): a peek at the first message from the peer in the collective's
//! sequence says which call sent it, and one of another call is received whole, into a buffer
//! of its own length, and dropped.
use super::super::{sys, Inner, Role};
use crate::error::Result;
use crate::transport::Completion;

impl Inner {
    /// `Transport::take_foreign` for this endpoint.
    pub(in super::super) fn take_foreign(
        &mut self,
        tag: u64,
        ignore: u64,
        compare: u64,
    ) -> Result<Option<u64>> {
        self.shm.looked = None;
        if self.post_peek_for(Role::Look, tag, ignore, sys::FI_PEEK as u64) != 0 {
            // Busy, or no peek here: look again at the next stall.
            return Ok(None);
        }
        self.read_cq_to_ready()?;
        let Some((found, _)) = self.shm.looked.take() else {
            return Ok(None);
        };
        if (found ^ tag) & compare == 0 {
            return Ok(None);
        }
        // That message exactly, marked ours and then received whole (`on_settle_peeked`).
        let flags = sys::FI_PEEK as u64 | sys::FI_CLAIM;
        if self.post_peek_for(Role::SettlePeek, found, 0, flags) == 0 {
            self.read_cq_to_ready()?;
        }
        Ok(Some(found))
    }

    /// Read the completion queue, keeping the callers' completions for the next poll.
    fn read_cq_to_ready(&mut self) -> Result<()> {
        let mut entries = std::mem::take(&mut self.entries);
        let mut got: Vec<Completion> = Vec::new();
        let r = self.read_cq(&mut entries, &mut got);
        self.entries = entries;
        self.ready.append(&mut got);
        r
    }
}

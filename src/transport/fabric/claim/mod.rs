//! Messages that stop a connection of libfabric's native TCP endpoint, claimed into memory of
//! ours so that the connection goes on.
//!
//! The native TCP RDM endpoint (xnet: `net` in libfabric 1.17, `tcp` from 1.18) reads each
//! connection as one stream. A tagged message that arrives before its receive is kept only
//! while it is small (the provider's inject size, 128 B) and fewer than `FI_NET_MAX_SAVED`
//! (4) are kept for that connection; any other stops the connection where it is: the provider
//! reads nothing more from that peer until a receive for that message is posted. A receiver
//! that waits for a later message from the same peer before it posts that receive then waits
//! forever. With libfabric 1.17, a message sent after eight whose receives were not yet posted
//! never arrived, where `tcp;ofi_rxm` (which keeps unexpected messages without bound) delivered
//! it at once (the experiment is in `docs/providers.md`). NCCL jobs through aws-ofi-nccl hang
//! on the same (ofiwg/libfabric#8963), and a program that posts a non-blocking send and then
//! runs a collective with the same peer, which that peer runs before its receive, meets it
//! with our own engines.
//!
//! So an endpoint of that provider takes such messages out itself. When a poll has found
//! nothing to complete for `CLAIM_AFTER` (or, on an endpoint that keeps completing other
//! operations, `CLAIM_EVERY` after it last looked), it asks the provider with `FI_PEEK | FI_CLAIM` for
//! any message that waits for a receive (the answer is a completion with its tag and length,
//! or `FI_ENOMSG`), receives it with `FI_CLAIM` into a buffer of its own, and asks again until
//! nothing is left. The connection reads on as soon as its head is claimed. Claimed messages
//! wait in `Claims::taken`, oldest first, for the receive that matches them; a receive looks
//! there before it is posted to the provider, and one that matches the message being claimed
//! waits for it, so a message is never matched out of its order and no receive waits in the
//! provider for a message that we hold.
//!
//! The cost is an extra copy of a claimed message that waited for its receive when the endpoint
//! looked: at most one look per `CLAIM_EVERY` on a busy endpoint, and after `CLAIM_AFTER`
//! without any completion on an idle one.
use super::shm::matching::{deliver, SoftDst, SoftRecv};
use super::{sys, Inner, OpCtx, Role, FI_ADDR_UNSPEC};
use crate::error::{Error, Result};
use crate::transport::{Completion, Posted};
use std::collections::VecDeque;
use std::os::raw::c_void;
use std::ptr;
use std::time::{Duration, Instant};

/// How long an endpoint of the native TCP provider polls without completing anything before it
/// claims the messages that wait for a receive. A stopped connection then costs its receiver
/// this long; a connection that is merely slow costs an extra copy of the claimed message.
pub(super) const CLAIM_AFTER: Duration = Duration::from_millis(1);

/// The longest an endpoint that keeps completing operations goes without looking: a connection
/// stopped behind other peers' traffic would otherwise wait until the endpoint falls idle,
/// which a busy collective, or a loop of short ones, may not do for a long time.
pub(super) const CLAIM_EVERY: Duration = Duration::from_millis(10);

/// Whether `provider`'s RDM endpoint stops a connection at an unexpected message: libfabric's
/// native TCP endpoint (`net` in 1.17; named `tcp` from 1.18, where `tcp;ofi_rxm` is the
/// layered one).
pub(super) fn needed(provider: &str) -> bool {
    provider == "net" || provider == "tcp"
}

/// The claiming state of one endpoint.
#[derive(Default)]
pub(super) struct Claims {
    /// Messages claimed and not yet received: (tag, payload), oldest first.
    pub(super) taken: VecDeque<(u64, Vec<u8>)>,
    /// The tag of the message being claimed (`FI_CLAIM` posted, its data still coming).
    pub(super) inflight: Option<u64>,
    /// Receives posted while a message they match was being claimed, in posted order.
    pub(super) waiting: VecDeque<SoftRecv>,
    /// A peek is in flight: its answer (a message, or none) is the next completion of ours.
    peeking: bool,
    /// Since when polls have completed nothing (None: the last one completed something).
    idle_since: Option<Instant>,
    /// When the last look (a peek) went out; None before the first.
    looked_at: Option<Instant>,
    /// Messages claimed since the endpoint opened (tests, logs).
    pub(super) claimed: u64,
}

impl Claims {
    /// The oldest claimed message that a receive of `tag` / `ignore` matches, taken out.
    fn take(&mut self, tag: u64, ignore: u64) -> Option<(u64, Vec<u8>)> {
        let i = self
            .taken
            .iter()
            .position(|(t, _)| (*t | ignore) == (tag | ignore))?;
        self.taken.remove(i)
    }

    /// The first receive that waits for a message of `tag`, taken out.
    fn take_waiting(&mut self, tag: u64) -> Option<SoftRecv> {
        let i = self
            .waiting
            .iter()
            .position(|r| (r.tag | r.ignore) == (tag | r.ignore))?;
        self.waiting.remove(i)
    }

    /// Whether a receive of `tag` / `ignore` must wait here rather than go to the provider:
    /// it matches the message being claimed, or a peek is in flight (the provider has marked
    /// the message it found as ours, and no receive posted to it could match that message;
    /// which message that is, its answer tells).
    fn must_wait(&self, tag: u64, ignore: u64) -> bool {
        self.peeking
            || self
                .inflight
                .is_some_and(|t| (t | ignore) == (tag | ignore))
    }

    /// Whether a receive must look here at all (anything claimed, being claimed or waiting).
    fn busy(&self) -> bool {
        self.peeking
            || self.inflight.is_some()
            || !self.taken.is_empty()
            || !self.waiting.is_empty()
    }

    /// Note one poll: `completed` whether it completed anything. True when no peek or claim
    /// is in flight and the endpoint has been idle for `CLAIM_AFTER`, or has not looked for
    /// `CLAIM_EVERY`: time to look. (The clock costs little next to the provider's progress,
    /// which reads its sockets.)
    fn idle_long(&mut self, completed: bool, now: impl FnOnce() -> Instant) -> bool {
        if completed {
            self.idle_since = None;
        }
        if self.peeking || self.inflight.is_some() {
            return false;
        }
        let t = now();
        if self
            .looked_at
            .is_none_or(|at| t.saturating_duration_since(at) >= CLAIM_EVERY)
        {
            return true;
        }
        if completed {
            return false;
        }
        match self.idle_since {
            None => {
                self.idle_since = Some(t);
                false
            }
            Some(since) => t.saturating_duration_since(since) >= CLAIM_AFTER,
        }
    }
}

impl Inner {
    /// Whether a receive must go through `claimed_recv` (see `Claims::busy`).
    pub(super) fn claims_busy(&self) -> bool {
        self.claims.as_ref().is_some_and(Claims::busy)
    }

    /// A receive on an endpoint that claims, while claims are busy: from the claimed
    /// messages, or it waits (behind the message being claimed, or behind earlier receives
    /// that wait). Returns it when it should go to the provider as usual.
    pub(super) fn claimed_recv(&mut self, r: SoftRecv) -> Option<SoftRecv> {
        let c = self.claims.as_mut()?;
        if let Some((tag, data)) = c.take(r.tag, r.ignore) {
            self.ready.push(deliver(&r, tag, &data));
            return None;
        }
        if c.must_wait(r.tag, r.ignore) || !c.waiting.is_empty() {
            c.waiting.push_back(r);
            return None;
        }
        Some(r)
    }

    /// Cancel a receive that waits for a claimed message; false if `op` is none of them.
    pub(super) fn cancel_waiting(&mut self, op: crate::transport::OpId) -> bool {
        let Some(c) = self.claims.as_mut() else {
            return false;
        };
        let Some(i) = c.waiting.iter().position(|r| r.op == op) else {
            return false;
        };
        let r = c.waiting.remove(i).expect("index from position");
        self.ready.push(Completion::failed(
            op,
            r.tag,
            Error::InvalidUsage("operation cancelled".into()),
        ));
        true
    }

    /// What a poll does for claiming, after reading the completion queue (`completed`: it
    /// completed something): post the receives that need not wait any more, and ask the
    /// provider for stopped messages once the endpoint has been idle long enough.
    pub(super) fn progress_claims(&mut self, completed: bool) -> Result<()> {
        let Some(c) = self.claims.as_mut() else {
            return Ok(());
        };
        if !c.waiting.is_empty() {
            self.flush_waiting()?;
        }
        let c = self.claims.as_mut().expect("checked above");
        if c.idle_long(completed, Instant::now) {
            self.peek()?;
        }
        Ok(())
    }

    /// Serve or post the waiting receives that need not wait any more, in their order; the
    /// others (and any the provider is too busy to take) stay, in order.
    fn flush_waiting(&mut self) -> Result<()> {
        let Some(c) = self.claims.as_mut() else {
            return Ok(());
        };
        if c.peeking {
            return Ok(());
        }
        let mut todo = std::mem::take(&mut c.waiting);
        let mut keep = VecDeque::new();
        let mut busy = false;
        while let Some(r) = todo.pop_front() {
            let c = self.claims.as_mut().expect("claims");
            if busy || c.must_wait(r.tag, r.ignore) {
                keep.push_back(r);
                continue;
            }
            if let Some((tag, data)) = c.take(r.tag, r.ignore) {
                self.ready.push(deliver(&r, tag, &data));
                continue;
            }
            if let Some(back) = self.post_waiting(r)? {
                // The provider is busy: this one and the rest wait for the next poll.
                keep.push_back(back);
                busy = true;
            }
        }
        self.claims.as_mut().expect("claims").waiting = keep;
        Ok(())
    }

    /// Post a receive that waited to the provider; returns it when the provider is busy.
    fn post_waiting(&mut self, r: SoftRecv) -> Result<Option<SoftRecv>> {
        let (addr, owned) = match r.dst {
            SoftDst::Region(region) => (region.addr(), None),
            SoftDst::Owned => {
                let v = vec![0u8; r.len];
                (v.as_ptr() as usize, Some(v))
            }
        };
        let b = super::OpBuf {
            addr,
            len: r.len,
            desc: r.desc,
            op: r.op,
            owned,
            device: false,
        };
        match self.post_provider_recv(r.tag, r.ignore, b, Role::User)?.0 {
            Posted::Queued => Ok(None),
            Posted::Busy => Ok(Some(r)),
        }
    }

    /// Ask the provider for any message that waits for a receive (`FI_PEEK | FI_CLAIM`): the
    /// answer comes as the completion of a `Role::Peek` context.
    fn peek(&mut self) -> Result<()> {
        let rc = self.post_peek(Role::Peek);
        let c = self.claims.as_mut().expect("claims");
        if rc == 0 {
            c.peeking = true;
            c.looked_at = Some(Instant::now());
            return Ok(());
        }
        // Busy: look again after another idle period.
        c.idle_since = None;
        if rc == -(sys::FI_EAGAIN as isize) {
            return Ok(());
        }
        super::check("fi_trecvmsg (FI_PEEK)", rc as i64)
    }

    /// The answer to a peek: a message of `len` bytes with `tag` waits, now marked ours.
    /// Receive it with `FI_CLAIM` on the same context (the provider knows the claim by it).
    pub(super) fn on_peeked(&mut self, ctx: Box<OpCtx>, tag: u64, len: usize) -> Result<()> {
        let c = self.claims.as_mut().expect("a peek implies claims");
        c.peeking = false;
        c.inflight = Some(tag);
        let (p, rc) = self.post_claim(ctx, Role::Claim, tag, len);
        if rc == 0 {
            // Receives parked while the peek was out that do not match this message go on.
            return self.flush_waiting();
        }
        self.ops.remove(&p);
        // The provider holds the message for this context alone and no receive can match it
        // now: losing it would fail a collective much later, at its deadline. Say so now.
        Err(Error::System(format!(
            "claiming a message of {len} bytes (tag {tag:#x}) that stopped its connection \
             failed: {}",
            super::strerror(rc as i64)
        )))
    }

    /// Ask the provider for any message that waits for a receive (`FI_PEEK | FI_CLAIM`), with
    /// a new context of `role`: the answer is that context's completion (the message's tag and
    /// length; the provider marks the message with the context) or an `FI_ENOMSG` error entry.
    /// Returns the provider's return code; a failed post leaves no context behind.
    pub(super) fn post_peek(&mut self, role: Role) -> isize {
        self.post_peek_for(role, 0, !0, sys::FI_PEEK as u64 | sys::FI_CLAIM)
    }

    /// `post_peek` for the messages whose tag equals `tag` on every bit not set in `ignore`,
    /// with `flags` (`FI_PEEK`, with `FI_CLAIM` to mark the message found).
    pub(super) fn post_peek_for(&mut self, role: Role, tag: u64, ignore: u64, flags: u64) -> isize {
        let ctx = self.new_ctx(0, 0, true, None, role);
        let msg = sys::fi_msg_tagged {
            msg_iov: ptr::null(),
            desc: ptr::null_mut(),
            iov_count: 0,
            addr: FI_ADDR_UNSPEC,
            tag,
            ignore,
            context: ctx,
            data: 0,
        };
        // SAFETY: ep is open; msg is valid for the call; ctx lives in `ops` until the answer
        // (a completion or an error entry) is read.
        let rc = unsafe { sys::fi_trecvmsg(self.ep, &msg, flags) };
        if rc != 0 {
            self.ops.remove(&(ctx as usize));
        }
        rc
    }

    /// Receive the message of `len` bytes with `tag` that a peek marked with `ctx`, whole:
    /// `FI_CLAIM` on the same context, into a buffer of the message's length that the context
    /// owns. The context goes back into `ops` as `role` whatever the provider answers (the
    /// caller decides what a failed post means). Returns its key and the provider's return
    /// code.
    pub(super) fn post_claim(
        &mut self,
        mut ctx: Box<OpCtx>,
        role: Role,
        tag: u64,
        len: usize,
    ) -> (usize, isize) {
        let mut buf = vec![0u8; len];
        let mut iov = sys::iovec {
            iov_base: buf.as_mut_ptr() as *mut c_void,
            iov_len: len,
        };
        ctx.role = role;
        ctx.len = len;
        ctx.owned = Some(buf); // moving the Vec keeps its heap buffer where iov points
        let p = &mut *ctx as *mut OpCtx as *mut c_void;
        let msg = sys::fi_msg_tagged {
            msg_iov: if len == 0 { ptr::null() } else { &mut iov },
            desc: ptr::null_mut(),
            iov_count: usize::from(len != 0),
            addr: FI_ADDR_UNSPEC,
            tag,
            ignore: 0,
            context: p,
            data: 0,
        };
        self.ops.insert(p as usize, ctx);
        // SAFETY: ep is open; the buffer is owned by the context, which stays in `ops` (at
        // the address the peek marked the message with) until its completion is read, or the
        // caller removes it after a failed post, or the endpoint closes.
        let rc = unsafe { sys::fi_trecvmsg(self.ep, &msg, sys::FI_CLAIM) };
        (p as usize, rc)
    }

    /// A claimed message arrived: to the first receive that waited for it, else kept. Then
    /// look for the next one at once (the endpoint was idle: more may wait).
    pub(super) fn on_claimed(&mut self, data: Vec<u8>) -> Result<()> {
        let c = self.claims.as_mut().expect("a claim implies claims");
        // The tag as the peek reported it (the provider marks a claimed message's tag).
        let tag = c.inflight.take().expect("a claim in flight");
        c.claimed += 1;
        log::debug!(
            "claimed a message of {} bytes (tag {tag:#x}) that waited for its receive",
            data.len()
        );
        match c.take_waiting(tag) {
            Some(r) => self.ready.push(deliver(&r, tag, &data)),
            None => c.taken.push_back((tag, data)),
        }
        self.flush_waiting()?;
        self.peek()
    }

    /// A peek found nothing (`FI_ENOMSG`), or a peek or claim failed (`err`, the provider's
    /// error code, positive).
    pub(super) fn on_claim_error(&mut self, role: Role, err: i32) -> Result<()> {
        let c = self.claims.as_mut().expect("a peek implies claims");
        if role == Role::Peek {
            c.peeking = false;
            c.idle_since = None;
            if err != sys::FI_ENOMSG as i32 {
                log::warn!("FI_PEEK failed: {}", super::strerror(err as i64));
            }
            return self.flush_waiting();
        }
        let tag = c.inflight.take().unwrap_or_default();
        // The first receive that waited for it fails; the rest go on.
        let e = Error::System(format!(
            "receiving a claimed message (tag {tag:#x}) failed: {}",
            super::strerror(err as i64)
        ));
        match c.take_waiting(tag) {
            Some(r) => self.ready.push(Completion::failed(r.op, tag, e)),
            None => log::warn!("{e}"),
        }
        self.flush_waiting()
    }

    /// Messages this endpoint has claimed (tests).
    #[cfg(test)]
    pub(super) fn claimed(&self) -> u64 {
        self.claims.as_ref().map_or(0, |c| c.claimed)
    }
}

#[cfg(test)]
mod tests;

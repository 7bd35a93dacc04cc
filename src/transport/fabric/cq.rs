//! The completion queue: reading it dry, turning error entries into failed completions, and
//! sleeping on its wait fd.
use super::shm::matching::{too_large, FREE_BUFS};
use super::{check, cstr, strerror, sys, FabricTransport, Inner, Role};
use crate::error::{Error, Result};
use crate::transport::{Completion, WaitObject};
use std::os::raw::{c_int, c_void};
use std::time::Duration;

impl Inner {
    /// Read the completion queue dry into `out` (`entries` is the read buffer).
    pub(super) fn read_cq(
        &mut self,
        entries: &mut [sys::fi_cq_tagged_entry],
        out: &mut Vec<Completion>,
    ) -> Result<()> {
        loop {
            // SAFETY: cq is open; entries has room for entries.len() tagged entries.
            let n = unsafe {
                sys::fi_cq_read(self.cq, entries.as_mut_ptr() as *mut c_void, entries.len())
            };
            if n == -(sys::FI_EAGAIN as isize) {
                return Ok(());
            }
            if n == -(sys::FI_EAVAIL as isize) {
                self.read_error(out)?;
                continue;
            }
            check("fi_cq_read", n as i64)?;
            for e in &entries[..n as usize] {
                let Some(ctx) = self.take_ctx(e.op_context) else {
                    log::warn!(
                        "completion for an unknown operation context {:p}",
                        e.op_context
                    );
                    continue;
                };
                if ctx.role == Role::Peek {
                    self.on_peeked(ctx, e.tag, e.len)?;
                    continue;
                }
                if ctx.role == Role::SettlePeek {
                    self.on_settle_peeked(ctx, e.tag, e.len);
                    continue;
                }
                let ctx = *ctx;
                let mut owned = ctx.owned;
                match ctx.role {
                    Role::Swallow => continue,
                    Role::Look => {
                        self.shm.looked = Some((e.tag, e.len));
                        continue;
                    }
                    Role::Claim => {
                        let mut data = owned.unwrap_or_default();
                        data.truncate(e.len);
                        self.on_claimed(data)?;
                        continue;
                    }
                    Role::Pool => {
                        let msg = owned.unwrap_or_default();
                        self.on_small(&msg[..e.len.min(msg.len())]);
                        self.post_pool(Some(msg))?;
                        continue;
                    }
                    Role::SmallSend => {
                        if let (Some(soft), Some(b)) = (self.shm.soft.as_mut(), owned.take()) {
                            if soft.free.len() < FREE_BUFS {
                                soft.free.push(b);
                            }
                        }
                    }
                    Role::Dual => {
                        if let Some(soft) = self.shm.soft.as_mut() {
                            soft.posted.retain(|r| r.op != ctx.op);
                        }
                    }
                    Role::Padded => {
                        // A byte in the pad: a longer message, truncated (its size unknown).
                        out.push(match e.len {
                            0 => Completion::done(ctx.op, 0, e.tag, None),
                            _ => Completion::failed(ctx.op, e.tag, too_large(0, 0)),
                        });
                        continue;
                    }
                    // A peek's answer was handled above, before its context was taken apart.
                    Role::User | Role::Peek | Role::SettlePeek => {}
                }
                let len = if ctx.recv { e.len } else { ctx.len };
                let data = owned.map(|mut v| {
                    v.truncate(len);
                    v
                });
                out.push(Completion {
                    op: ctx.op,
                    len,
                    tag: e.tag,
                    status: Ok(()),
                    data,
                });
            }
            if (n as usize) < entries.len() {
                return Ok(());
            }
        }
    }

    pub(super) fn read_error(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        let mut e = sys::fi_cq_err_entry::default();
        // SAFETY: cq is open; e is a valid, zeroed error entry (err_data_size 0: the provider
        // points err_data at its own buffer).
        let rc = unsafe { sys::fi_cq_readerr(self.cq, &mut e, 0) };
        if rc == -(sys::FI_EAGAIN as isize) {
            return Ok(());
        }
        check("fi_cq_readerr", rc as i64)?;
        let mut buf = [0 as std::os::raw::c_char; 256];
        // SAFETY: cq is open; e came from it; buf has 256 writable bytes.
        let prov = unsafe {
            sys::fi_cq_strerror(
                self.cq,
                e.prov_errno,
                e.err_data,
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        let prov = cstr(prov);
        let Some(ctx) = self.take_ctx(e.op_context) else {
            log::warn!(
                "completion error for an unknown operation: {} ({prov})",
                strerror(e.err as i64)
            );
            return Ok(());
        };
        match ctx.role {
            // A peek that found nothing (FI_ENOMSG), or failed: nothing to settle or look at.
            Role::Swallow | Role::SettlePeek | Role::Look => return Ok(()),
            Role::Peek | Role::Claim => return self.on_claim_error(ctx.role, e.err.abs()),
            Role::Pool => {
                if e.err.abs() != sys::FI_ECANCELED as c_int {
                    log::warn!(
                        "small-message pool receive failed: {} ({prov})",
                        strerror(e.err as i64)
                    );
                    self.post_pool(None)?;
                }
                return Ok(());
            }
            Role::Dual => {
                if let Some(soft) = self.shm.soft.as_mut() {
                    soft.posted.retain(|r| r.op != ctx.op);
                }
            }
            Role::User | Role::SmallSend | Role::Padded => {}
        }
        // Some providers (shm) report a negative errno here: compare magnitudes.
        let err = e.err.abs();
        let status = if err == sys::FI_ECANCELED as c_int {
            Err(Error::InvalidUsage("operation cancelled".into()))
        } else if err == sys::FI_ETRUNC as c_int {
            // The provider's overflow counts past the buffer it was given (one byte if padded).
            let given = ctx.len + usize::from(ctx.role == Role::Padded);
            Err(too_large((given + e.olen) as u64, ctx.len))
        } else {
            Err(Error::from_errno(
                e.err as i64,
                format!(
                    "{} failed: {} (provider: {prov})",
                    ctx.what,
                    strerror(e.err as i64)
                ),
            ))
        };
        out.push(Completion {
            op: ctx.op,
            len: 0,
            tag: e.tag,
            status,
            data: None,
        });
        Ok(())
    }
}

impl FabricTransport {
    pub(super) fn wait_cq(&self, timeout: Duration) -> Result<()> {
        let fd = match self.wait_prepare() {
            WaitObject::Ready => return Ok(()),
            WaitObject::Yield => {
                std::thread::yield_now();
                return Ok(());
            }
            WaitObject::Fd(fd) => fd,
        };
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as c_int;
        // SAFETY: pfd is one valid pollfd; the fd belongs to our CQ, open while self lives.
        unsafe { libc::poll(&mut pfd, 1, ms) };
        Ok(())
    }

    /// `Transport::wait_object`: whether the queue's wait fd may be slept on now.
    pub(super) fn wait_prepare(&self) -> WaitObject {
        let Some(fd) = self.wait_fd else {
            return WaitObject::Yield;
        };
        let g = self.inner.lock();
        if !g.ready.is_empty()
            || !g.backlog.is_empty()
            || !g.shm.hellos.is_empty()
            || g.tended_error.is_some()
        {
            return WaitObject::Ready;
        }
        if g.shm.inbox.is_some() {
            // A fastbox frame raises no completion: never sleep past one.
            return WaitObject::Yield;
        }
        if !g.may_wait() {
            return WaitObject::Ready; // something is ready or needs progress: the caller polls
        }
        WaitObject::Fd(fd)
    }
}

impl Inner {
    /// Whether the completion queue's wait fd may be slept on now (`fi_trywait`): false when
    /// something is ready or the provider needs progress first.
    pub(super) fn may_wait(&self) -> bool {
        let mut fids = [self.cq as *mut sys::fid];
        // SAFETY: fabric and cq are open; fids holds one valid fid.
        unsafe { sys::fi_trywait(self.dom.fabric, fids.as_mut_ptr(), 1) == 0 }
    }
}

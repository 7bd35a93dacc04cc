//! Software matching of small messages (shm before libfabric 1.19): they travel untagged into
//! a pool of library-owned receives and are matched here, in posted order, so that the
//! provider never holds an unexpected small message (see `discovery::inject_safe`).
use super::super::{check, sys, Inner, OpBuf, Role, FI_ADDR_UNSPEC};
use super::cma;
use crate::error::{Error, Result};
use crate::transport::{Completion, OpId, Peer, Posted, Region};
use std::collections::VecDeque;
use std::os::raw::c_void;
use std::ptr;

/// Messages up to this size bypass the provider's tag matching on shm before libfabric 1.19:
/// they travel untagged into library-owned receives and are matched here, so that the
/// provider never holds an unexpected small message (see `inject_safe`).
pub(crate) const POOL_BUFS: usize = 256;

/// Where a software-matched receive puts its data.
#[derive(Clone, Copy, Debug)]
pub(crate) enum SoftDst {
    Region(Region),
    Owned,
}

#[derive(Debug)]
pub(crate) struct SoftRecv {
    pub(crate) tag: u64,
    pub(crate) ignore: u64,
    pub(crate) len: usize,
    pub(crate) dst: SoftDst,
    /// The buffer's registration descriptor (0: none).
    pub(crate) desc: usize,
    pub(crate) op: OpId,
    /// Context of the provider receive posted for messages too large for the pool.
    pub(crate) provider: Option<usize>,
}

impl SoftRecv {
    /// A receive of `tag` / `ignore` into `b` (an owned buffer gets a new one on delivery).
    pub(crate) fn of(tag: u64, ignore: u64, b: &OpBuf) -> SoftRecv {
        let dst = if b.owned.is_some() {
            SoftDst::Owned
        } else {
            // SAFETY: Region's contract, forwarded from the caller's recv().
            SoftDst::Region(unsafe { Region::from_raw(b.addr as *mut u8, b.len) })
        };
        SoftRecv {
            tag,
            ignore,
            len: b.len,
            dst,
            desc: b.desc,
            op: b.op,
            provider: None,
        }
    }
}

/// A message that arrived before its receive.
#[derive(Debug)]
pub(crate) enum Unexp {
    /// Its bytes.
    Data(Vec<u8>),
    /// A large message still in its sender's memory (`cma`), announced by the fastbox sender
    /// whose `sender_id` is `from`.
    Rndv { rts: cma::Rts, from: u64 },
}

#[derive(Default)]
pub(crate) struct Soft {
    pub(crate) small: usize,
    pub(crate) posted: VecDeque<SoftRecv>,
    pub(crate) unexpected: VecDeque<(u64, Unexp)>,
    /// Framed send buffers (`small + 8` bytes of capacity) whose sends completed.
    pub(crate) free: Vec<Vec<u8>>,
}

impl Soft {
    /// The first posted receive that matches `tag`, taken out with its position in the list.
    pub(crate) fn take_posted(&mut self, tag: u64) -> Option<(usize, SoftRecv)> {
        let i = self
            .posted
            .iter()
            .position(|r| (r.tag | r.ignore) == (tag | r.ignore))?;
        Some((i, self.posted.remove(i).expect("index from position")))
    }
}

/// Framed small-message buffers kept for reuse.
pub(crate) const FREE_BUFS: usize = 64;

/// Complete a software-matched receive with a message.
pub(crate) fn deliver(r: &SoftRecv, tag: u64, data: &[u8]) -> Completion {
    if data.len() > r.len {
        return Completion::failed(r.op, tag, too_large(data.len() as u64, r.len));
    }
    let len = data.len();
    let data = match r.dst {
        SoftDst::Region(region) => {
            region.write(data);
            None
        }
        SoftDst::Owned => Some(data.to_vec()),
    };
    Completion::done(r.op, len, tag, data)
}

/// The error of a receive of `cap` bytes that a message of `got` bytes arrived for.
/// `got` no larger than `cap` means the provider did not say how large the message was.
pub(crate) fn too_large(got: u64, cap: usize) -> Error {
    if got > cap as u64 {
        Error::InvalidUsage(format!(
            "a message of {got} bytes arrived for a receive buffer of {cap} bytes"
        ))
    } else {
        Error::InvalidUsage(format!(
            "a larger message arrived for a receive buffer of {cap} bytes"
        ))
    }
}

impl Inner {
    /// A small message as an untagged send of `[tag][payload]` into the peer's pool.
    pub(crate) fn post_small(
        &mut self,
        peer: Peer,
        tag: u64,
        addr: usize,
        len: usize,
        op: OpId,
        owned: Option<Vec<u8>>,
    ) -> Result<Posted> {
        let mut msg = self
            .shm
            .soft
            .as_mut()
            .and_then(|s| s.free.pop())
            .unwrap_or_default();
        msg.clear();
        msg.reserve(8 + len);
        msg.extend_from_slice(&tag.to_le_bytes());
        match &owned {
            Some(d) => msg.extend_from_slice(d),
            None => {
                // SAFETY: Region's contract (the caller promised `len` readable bytes at `addr`).
                unsafe { Region::from_raw(addr as *mut u8, len) }.with(|d| msg.extend_from_slice(d))
            }
        }
        let (maddr, mlen) = (msg.as_ptr() as usize, msg.len());
        // A framed copy of caller memory is ours to reuse when the send completes; one
        // framing an owned (control) message stays with its completion.
        let role = if owned.is_none() {
            Role::SmallSend
        } else {
            Role::User
        };
        let ctx = self.new_ctx(op, len, false, Some(msg), role);
        // SAFETY: the message buffer is owned by ctx until its completion; ctx lives until then.
        let rc = unsafe {
            sys::fi_send(
                self.tx_ep,
                maddr as *const c_void,
                mlen,
                ptr::null_mut(),
                peer.0,
                ctx,
            )
        };
        if rc == 0 {
            return Ok(Posted::Queued);
        }
        self.ops.remove(&(ctx as usize));
        if rc == -(sys::FI_EAGAIN as isize) {
            if let Some(data) = owned {
                self.backlog.push_front((peer, tag, data, op));
            }
            return Ok(Posted::Busy);
        }
        check("fi_send", rc as i64)?;
        Ok(Posted::Busy)
    }

    /// Post one receive of the small-message pool, into `reuse` if given (a pool buffer whose
    /// message has been consumed).
    pub(crate) fn post_pool(&mut self, reuse: Option<Vec<u8>>) -> Result<()> {
        let Some(small) = self.shm.soft.as_ref().map(|x| x.small) else {
            return Ok(());
        };
        let buf = match reuse {
            Some(mut b) if b.capacity() >= small + 8 => {
                b.resize(small + 8, 0);
                b
            }
            _ => vec![0u8; small + 8],
        };
        let (addr, len) = (buf.as_ptr() as usize, buf.len());
        let ctx = self.new_ctx(0, len, true, Some(buf), Role::Pool);
        // SAFETY: the buffer is owned by ctx until its completion.
        let rc = unsafe {
            sys::fi_recv(
                self.ep,
                addr as *mut c_void,
                len,
                ptr::null_mut(),
                FI_ADDR_UNSPEC,
                ctx,
            )
        };
        if rc != 0 {
            self.ops.remove(&(ctx as usize));
            check("fi_recv (small-message pool)", rc as i64)?;
        }
        Ok(())
    }

    /// A receive matched in software, plus a provider receive when a large message may come.
    pub(crate) fn post_soft_recv(&mut self, tag: u64, ignore: u64, b: OpBuf) -> Result<Posted> {
        let soft = self.shm.soft.as_mut().expect("soft mode");
        let small = soft.small;
        let mut r = SoftRecv::of(tag, ignore, &b);
        if let Some(i) = soft
            .unexpected
            .iter()
            .position(|(t, _)| (*t | ignore) == (tag | ignore))
        {
            match soft.unexpected.remove(i).expect("index from position") {
                (t, Unexp::Data(data)) => {
                    let c = deliver(&r, t, &data);
                    self.ready.push(c);
                    return Ok(Posted::Queued);
                }
                (t, Unexp::Rndv { rts, from }) => match self.fetch(r, t, rts, from) {
                    None => return Ok(Posted::Queued),
                    // Refused: the provider brings it; post the receive as any other.
                    Some(back) => r = back,
                },
            }
        }
        if b.len > small {
            let op = b.op;
            let (p, ctx) =
                self.post_provider_recv(tag, ignore, OpBuf { owned: None, ..b }, Role::Dual)?;
            if p == Posted::Busy {
                return Ok(Posted::Busy);
            }
            r.provider = Some(ctx);
            let _ = op;
        }
        self.shm
            .soft
            .as_mut()
            .expect("soft mode")
            .posted
            .push_back(r);
        Ok(Posted::Queued)
    }

    /// A pool message arrived: match it in posted order or keep it as unexpected.
    pub(crate) fn on_small(&mut self, msg: &[u8]) {
        if msg.is_empty() {
            return; // a fastbox peer's hello (see `hello`)
        }
        if msg.len() < 8 {
            log::warn!("runt small message ({} bytes) dropped", msg.len());
            return;
        }
        let tag = u64::from_le_bytes(msg[0..8].try_into().expect("8 bytes"));
        let data = &msg[8..];
        let soft = self.shm.soft.as_mut().expect("soft mode");
        match soft.take_posted(tag) {
            Some((_, r)) => {
                if let Some(ctx) = r.provider {
                    self.swallow(ctx);
                }
                let c = deliver(&r, tag, data);
                self.ready.push(c);
            }
            None => soft.unexpected.push_back((tag, Unexp::Data(data.to_vec()))),
        }
    }

    /// Cancel a provider receive whose completion we will drop.
    pub(crate) fn swallow(&mut self, ctx: usize) {
        if let Some(c) = self.ops.get_mut(&ctx) {
            c.role = Role::Swallow;
            // SAFETY: ep is open; ctx is the context of a receive posted on it.
            unsafe { sys::fi_cancel(self.ep as *mut sys::fid, ctx as *mut c_void) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::testutil::*;
    use crate::transport::{Posted, Transport};
    use std::time::Duration;
    use std::time::Instant;

    #[test]
    fn without_the_fastbox_small_shm_messages_reach_a_receive_posted_before_or_after() {
        let Some((a, b)) = pair_with("shm", None, &[("FABRICOLL_SHM_FASTBOX", "0")]) else {
            return;
        };
        assert!(
            a.inner.lock().shm.inbox.is_none(),
            "FABRICOLL_SHM_FASTBOX=0"
        );
        let to_a = b.insert_peer(&a.address()).expect("insert");
        let _to_b = a.insert_peer(&b.address()).expect("insert");
        // One receive posted first, one message that arrives first.
        let (mut early, mut late) = ([0u8; 5], [0u8; 4]);
        a.recv(1, 0, region(&mut early), None, 1).expect("recv");
        let (mut m1, mut m2) = (*b"first", *b"late");
        let start = Instant::now();
        let mut out = [Vec::new(), Vec::new()];
        for (tag, m, op) in [(1u64, &mut m1[..], 11u64), (2, &mut m2[..], 12)] {
            while b.send(to_a, tag, region(m), None, op).expect("send") == Posted::Busy {
                a.poll(&mut out[0]).expect("poll");
                b.poll(&mut out[1]).expect("poll");
                assert!(start.elapsed() < Duration::from_secs(10), "send stays busy");
            }
        }
        let [got, sent] = completions(&a, &b, 1, out);
        assert!(sent.iter().all(|c| c.status.is_ok()), "{sent:?}");
        a.recv(2, 0, region(&mut late), None, 2).expect("recv");
        let [got, _] = completions(&a, &b, 2, [got, sent]);
        assert!(got.iter().all(|c| c.status.is_ok()), "{got:?}");
        assert_eq!((&early, &late), (b"first", b"late"));
    }
}

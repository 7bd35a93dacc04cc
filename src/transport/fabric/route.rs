//! The send router: which path a send takes is one decision (`route`), made from what is known
//! of the send and its peer (`SendFacts`), and `Inner::post_send` performs it.
//!
//! The paths, in the order they are tried: a peer whose process has exited fails the send; a
//! fastbox peer takes messages up to the fastbox payload in its ring; a larger message to a
//! peer that holds a slot in our inbox (and copies from us) goes as a CMA rendezvous; a small
//! message under software matching goes untagged into the peer's pool; a caller's buffer that
//! fits the inject size is injected; anything else is a tagged send. Device memory only ever
//! takes the tagged send: every other path reads the bytes on the CPU.
use super::shm::matching::Soft;
use super::shm::rndv::RndvSend;
use super::shm::{fastbox, peer_exited, watch};
use super::{check, sys, Inner, OpBuf, Role};
use crate::error::Result;
use crate::transport::{Caps, Completion, Peer, Posted};
use std::os::raw::c_void;

/// The path a send takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Route {
    /// The peer's process (this pid) has exited.
    PeerGone(i32),
    /// Into the peer's fastbox ring.
    Fastbox,
    /// An `RTS` frame; the peer copies the data out of our memory (`shm::rndv`).
    Rendezvous,
    /// Untagged, into the peer's small-message pool (`shm::matching`).
    SoftPool,
    /// `fi_tinject`: copied out before the call returns.
    Inject,
    /// `fi_tsend`.
    Tagged,
}

/// What the route of one send depends on.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct SendFacts {
    /// The message's bytes.
    pub(super) len: usize,
    /// The message is ours (a control message), not the caller's buffer.
    pub(super) owned: bool,
    /// The pid of the peer's process if it has exited.
    pub(super) gone: Option<i32>,
    /// We hold a slot in the peer's fastbox inbox.
    pub(super) fastbox: bool,
    /// The peer may take a large message as an `RTS` (`ShmPath::rndv_ok`).
    pub(super) rndv: bool,
    /// The small-message size under software matching, else None.
    pub(super) small: Option<usize>,
    /// `Caps::inject_ok` and `Caps::inject_size`.
    pub(super) inject_ok: bool,
    pub(super) inject_size: usize,
    /// The buffer is device memory (`OpBuf::device`).
    pub(super) device: bool,
}

/// The path a send with `f` takes.
#[inline]
pub(super) fn route(f: &SendFacts) -> Route {
    if let Some(pid) = f.gone {
        return Route::PeerGone(pid);
    }
    if f.device {
        return Route::Tagged;
    }
    if f.len <= fastbox::MAX_PAYLOAD && f.fastbox {
        return Route::Fastbox;
    }
    if f.rndv {
        return Route::Rendezvous;
    }
    if f.small.is_some_and(|small| f.len <= small) {
        return Route::SoftPool;
    }
    if f.inject_ok && f.len <= f.inject_size && !f.owned {
        return Route::Inject;
    }
    Route::Tagged
}

impl Inner {
    /// Post a send of `b` to `peer` on the path `route` picks.
    pub(super) fn post_send(
        &mut self,
        caps: &Caps,
        peer: Peer,
        tag: u64,
        b: OpBuf,
    ) -> Result<Posted> {
        // A send the peer copies itself (an RTS) asks the watcher only: it waits for the
        // peer's ACK, and `progress_rndv` fails it once the watcher sees the peer gone.
        let rndv = b.len > fastbox::MAX_PAYLOAD && self.shm.rndv_ok(peer.0);
        let gone = self
            .shm
            .gone_pid(peer, b.len > watch::FLAG_ONLY_BYTES && !rndv);
        // Looked up once, here, and written to by the `Fastbox` arm.
        let outbox = if gone.is_none() && b.len <= fastbox::MAX_PAYLOAD {
            self.shm.outbox.get_mut(&peer.0)
        } else {
            None
        };
        let facts = SendFacts {
            len: b.len,
            owned: b.owned.is_some(),
            gone,
            fastbox: outbox.is_some(),
            rndv,
            small: self.shm.soft.as_ref().map(|x: &Soft| x.small),
            inject_ok: caps.inject_ok,
            inject_size: caps.inject_size,
            device: b.device,
        };
        let OpBuf {
            addr,
            len,
            desc,
            op,
            owned,
            ..
        } = b;
        match route(&facts) {
            Route::PeerGone(pid) => {
                let e = peer_exited(pid, "");
                if owned.is_some() {
                    // A control message: its operation fails, the endpoint goes on.
                    self.ready.push(Completion {
                        op,
                        len: 0,
                        tag,
                        status: Err(e),
                        data: None,
                    });
                    return Ok(Posted::Queued);
                }
                Err(e)
            }
            Route::Fastbox => {
                let ob = outbox.expect("route saw the outbox");
                let pushed = match &owned {
                    Some(d) => ob.push(tag, d),
                    // SAFETY: Region's contract (the caller promised `len` readable bytes).
                    None => unsafe { crate::transport::Region::from_raw(addr as *mut u8, len) }
                        .with(|d| ob.push(tag, d)),
                };
                match pushed {
                    fastbox::Pushed::Done => {
                        self.sent_now(op, len, tag);
                        Ok(Posted::Queued)
                    }
                    fastbox::Pushed::Full => {
                        if let Some(data) = owned {
                            self.backlog.push_front((peer, tag, data, op));
                        }
                        Ok(Posted::Busy)
                    }
                }
            }
            Route::Rendezvous => {
                let s = RndvSend {
                    peer: peer.0,
                    tag,
                    addr,
                    len,
                    desc,
                    op,
                    owned,
                };
                Ok(self.post_rts(s))
            }
            Route::SoftPool => self.post_small(peer, tag, addr, len, op, owned),
            Route::Inject => {
                // SAFETY: the endpoint is enabled; inject copies the buffer before returning.
                let rc =
                    unsafe { sys::fi_tinject(self.tx_ep, addr as *const c_void, len, peer.0, tag) };
                if rc == 0 {
                    self.sent_now(op, len, tag);
                    return Ok(Posted::Queued);
                }
                if rc != -(sys::FI_EAGAIN as isize) {
                    check("fi_tinject", rc as i64)?;
                }
                Ok(Posted::Busy)
            }
            Route::Tagged => {
                let ctx = self.new_ctx(op, len, false, owned, Role::User);
                // SAFETY: the buffer is valid until completion (Region's contract, or owned by
                // ctx); ctx is a live fi_context2 we keep until its completion is read.
                let rc = unsafe {
                    sys::fi_tsend(
                        self.tx_ep,
                        addr as *const c_void,
                        len,
                        desc as *mut c_void,
                        peer.0,
                        tag,
                        ctx,
                    )
                };
                if rc == 0 {
                    return Ok(Posted::Queued);
                }
                let ctx = self.ops.remove(&(ctx as usize));
                if rc == -(sys::FI_EAGAIN as isize) {
                    // An owned control message goes back to the front of the backlog.
                    if let Some(data) = ctx.and_then(|c| c.owned) {
                        self.backlog.push_front((peer, tag, data, op));
                    }
                    return Ok(Posted::Busy);
                }
                check("fi_tsend", rc as i64)?;
                Ok(Posted::Busy)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A caller's small buffer to a live peer with no shm path, on a provider that injects.
    fn plain(len: usize) -> SendFacts {
        SendFacts {
            len,
            inject_ok: true,
            inject_size: 64,
            ..Default::default()
        }
    }

    #[test]
    fn a_peer_that_has_exited_fails_the_send_before_any_path_is_tried() {
        let f = SendFacts {
            gone: Some(42),
            fastbox: true,
            small: Some(256),
            ..plain(8)
        };
        assert_eq!(route(&f), Route::PeerGone(42));
        let large = SendFacts {
            gone: Some(7),
            rndv: true,
            ..plain(1 << 20)
        };
        assert_eq!(route(&large), Route::PeerGone(7));
    }

    #[test]
    fn a_fastbox_peer_takes_messages_up_to_the_fastbox_payload_in_its_ring() {
        let f = SendFacts {
            fastbox: true,
            small: Some(256),
            ..plain(8)
        };
        assert_eq!(route(&f), Route::Fastbox);
        let full = SendFacts {
            fastbox: true,
            ..plain(fastbox::MAX_PAYLOAD)
        };
        assert_eq!(route(&full), Route::Fastbox);
        let over = SendFacts {
            fastbox: true,
            ..plain(fastbox::MAX_PAYLOAD + 1)
        };
        assert_ne!(route(&over), Route::Fastbox);
    }

    #[test]
    fn a_large_message_to_a_peer_that_copies_from_us_goes_as_a_rendezvous() {
        let f = SendFacts {
            rndv: true,
            small: Some(1 << 30),
            ..plain(fastbox::MAX_PAYLOAD + 1)
        };
        assert_eq!(route(&f), Route::Rendezvous);
    }

    #[test]
    fn under_software_matching_small_messages_go_into_the_peers_pool() {
        let f = SendFacts {
            small: Some(256),
            ..plain(256)
        };
        assert_eq!(route(&f), Route::SoftPool);
        let owned = SendFacts { owned: true, ..f };
        assert_eq!(route(&owned), Route::SoftPool);
        assert_ne!(route(&SendFacts { len: 257, ..f }), Route::SoftPool);
    }

    #[test]
    fn a_callers_buffer_within_the_inject_size_is_injected_where_inject_is_safe() {
        assert_eq!(route(&plain(64)), Route::Inject);
        assert_eq!(route(&plain(0)), Route::Inject);
        let unsafe_inject = SendFacts {
            inject_ok: false,
            ..plain(8)
        };
        assert_eq!(route(&unsafe_inject), Route::Tagged);
    }

    #[test]
    fn owned_or_larger_messages_are_tagged_sends() {
        assert_eq!(route(&plain(65)), Route::Tagged);
        let owned = SendFacts {
            owned: true,
            ..plain(8)
        };
        assert_eq!(route(&owned), Route::Tagged);
    }

    #[test]
    fn device_memory_takes_the_tagged_send_whatever_else_holds() {
        // Every other path reads the bytes on the CPU, which device memory does not allow;
        // only a peer that has exited still fails the send first.
        for len in [
            0usize,
            8,
            64,
            256,
            fastbox::MAX_PAYLOAD,
            fastbox::MAX_PAYLOAD + 1,
        ] {
            for (fastbox, rndv, small) in [(false, false, None), (true, true, Some(256))] {
                let f = SendFacts {
                    device: true,
                    fastbox,
                    rndv,
                    small,
                    ..plain(len)
                };
                assert_eq!(route(&f), Route::Tagged, "{f:?}");
                let gone = SendFacts { gone: Some(7), ..f };
                assert_eq!(route(&gone), Route::PeerGone(7));
                // The same send from host memory, with the shm paths open, takes one of them.
                if fastbox {
                    let host = SendFacts { device: false, ..f };
                    assert_ne!(route(&host), Route::Tagged, "{f:?}");
                }
            }
        }
    }
}

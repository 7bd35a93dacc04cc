//! NCCL's multi-request groups (net v11 and v12). An `isend` / `irecv` whose `*request` is
//! `NCCL_NET_MULTI_REQUEST` on input joins its comm's open group and gets NULL back; the next
//! call on that comm without the hint is the group's last member and gets one handle for the
//! whole group, or NULL while members still wait for room (NCCL then calls again with the same
//! buffer, which is not appended twice; a call with other buffers is not appended at all, but
//! may still receive the handle). `test` on that handle tests every member and reports done once
//! all are; the size it reports is the sum. Members go to the device one by one in call order,
//! each as one ordinary request, so matching on the wire is the ordinary one: the receiver's
//! group has as many members as the sender's, one to one in order.
//!
//! Bad use: a group that would exceed `maxMultiRequestSize` ([`MAX_GROUP`]) and a hinted call
//! after the group's last member are InvalidUsage (logged at the boundary), and leave the group
//! as it was. A group still open, or returned but not finished, when its comm closes is dropped
//! with the comm: its posted members go as the comm's requests do, the queued ones are never
//! posted, and its handle is no longer valid (a warning says so for an open group).
//! The older tables (v6-v10) never see the hint (NCCL reports maxMultiRequestSize 1 for them)
//! and do not use this file. The v11 / v12 entry points (`ffi::net::multi`) read the hint and
//! write NCCL's out-arguments; the groups, their table and their rules are here.
use super::net::{Device, MAX_TAG, RECV_CAPACITY, SEND_CAPACITY};
use super::{Kind, Plugin};
use crate::error::{Error, Result};
use crate::transport::Region;
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `maxMultiRequestSize`: the most members a group may have. Each member is one request of the
/// device, and the whole group must fit in flight on one otherwise idle comm, whose receive side
/// holds `RECV_CAPACITY` requests (the send side more); a larger group could never complete.
pub const MAX_GROUP: usize = if RECV_CAPACITY < SEND_CAPACITY {
    RECV_CAPACITY
} else {
    SEND_CAPACITY
};

/// A member's buffers, as `isend` (one) or `irecv` (n) gives them: (region, tag, mhandle).
pub type Bufs = Vec<(Region, c_int, u64)>;

#[derive(Clone, Copy)]
enum State {
    /// Not yet accepted by the device (it was full, or an earlier member is still queued).
    Queued,
    /// Posted: the device's request.
    Posted(u64),
    /// Finished, with its bytes.
    Done(usize),
}

struct Member {
    bufs: Bufs,
    state: State,
}

struct Group {
    send: bool,
    members: Vec<Member>,
    /// Whether the last member (the first call without the hint) has been appended.
    closed: bool,
    /// `n` of the last member's irecv (1 for sends): how many sizes `test` writes.
    n_last: usize,
    /// Whether a call with other buffers than the last member's was logged (once per group).
    warned: bool,
}

#[derive(Default)]
struct Groups {
    /// Groups whose handle has not been returned yet, by comm (at most one per comm).
    open: HashMap<u64, Group>,
    /// Groups whose handle NCCL holds, by handle, with their comm.
    returned: HashMap<u64, (u64, Group)>,
}

static GROUPS: Lazy<Mutex<Groups>> = Lazy::new(Default::default);
/// How many groups `GROUPS` holds, so that calls on comms without groups (all calls, as long as
/// NCCL sends no hint) skip its lock. Each comm is driven by one thread, so a group handed out
/// or taken by that thread is seen by it.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// Run `f` on the groups, keeping `HELD` up to date.
fn groups<R>(f: impl FnOnce(&mut Groups) -> R) -> R {
    let mut g = GROUPS.lock();
    let r = f(&mut g);
    HELD.store(g.open.len() + g.returned.len(), Ordering::Release);
    r
}

/// Whether any group may exist (see `HELD`).
fn any_held() -> bool {
    HELD.load(Ordering::Acquire) != 0
}

/// Groups alive (open or returned), for leak tests.
#[doc(hidden)]
pub fn live_groups() -> usize {
    let g = GROUPS.lock();
    g.open.len() + g.returned.len()
}

fn kind(send: bool) -> (Kind, &'static str) {
    if send {
        (Kind::Send, "sendComm")
    } else {
        (Kind::Recv, "recvComm")
    }
}

/// Post one member as an ordinary request; `None` when the device has no room now.
fn post(dev: &Device, comm: u64, send: bool, bufs: &Bufs) -> Result<Option<u64>> {
    match (send, bufs.as_slice()) {
        (true, [(r, tag, mh)]) => dev.isend(comm, *r, *tag, *mh),
        (false, _) => dev.irecv(comm, bufs),
        (true, _) => Err(Error::Internal("a send member has one buffer".into())),
    }
}

/// The checks a posted member would fail, made when it joins (it may be posted later).
fn check_member(dev: &Device, send: bool, bufs: &Bufs) -> Result<()> {
    let (tag_name, size_name) = if send {
        ("tag", "size")
    } else {
        ("tags", "sizes")
    };
    for (r, tag, _) in bufs {
        if !(0..=MAX_TAG).contains(tag) {
            return Err(Error::arg(
                tag_name,
                format!("{tag} is outside 0..={MAX_TAG}"),
            ));
        }
        if r.len() > dev.props.max_p2p_bytes {
            return Err(Error::arg(
                size_name,
                format!(
                    "{} bytes is more than maxP2pBytes ({})",
                    r.len(),
                    dev.props.max_p2p_bytes
                ),
            ));
        }
    }
    Ok(())
}

impl Group {
    /// Post the queued members in order, as far as the device takes them; true once every
    /// member is posted (or done).
    fn post_queued(&mut self, dev: &Device, comm: u64) -> Result<bool> {
        for m in self.members.iter_mut() {
            if let State::Queued = m.state {
                match post(dev, comm, self.send, &m.bufs)? {
                    Some(r) => m.state = State::Posted(r),
                    None => return Ok(false),
                }
            }
        }
        Ok(true)
    }

    /// Test the posted members, retiring those that finished (which frees their places);
    /// `all` false stops at the first that has not (the group cannot be done before it).
    fn retire(&mut self, dev: &Device, all: bool) -> Result<()> {
        for m in self.members.iter_mut() {
            if let State::Posted(r) = m.state {
                match dev.test(r)? {
                    Some(f) => m.state = State::Done(f.sizes[..f.n].iter().sum()),
                    None if !all => return Ok(()),
                    None => {}
                }
            }
        }
        Ok(())
    }

    /// Post what is queued; when the device is full, retire what finished and try again.
    /// True once every member is posted (or done).
    fn pump(&mut self, dev: &Device, comm: u64) -> Result<bool> {
        if self.post_queued(dev, comm)? {
            return Ok(true);
        }
        self.retire(dev, true)?;
        self.post_queued(dev, comm)
    }

    /// The bytes of all members once every one is done.
    fn finished(&self) -> Option<usize> {
        self.members
            .iter()
            .try_fold(0usize, |acc, m| match m.state {
                State::Done(n) => Some(acc.saturating_add(n)),
                _ => None,
            })
    }

    fn join(&mut self, bufs: Bufs) {
        self.members.push(Member {
            bufs,
            state: State::Queued,
        });
    }
}

/// `isend` / `irecv` of the v11+ tables on `comm`: `hint` is whether `*request` was
/// `NCCL_NET_MULTI_REQUEST` on input. The answer is what `*request` gets: None (NULL), a
/// request or a group's handle.
pub fn call(p: &Plugin, c: u64, send: bool, bufs: Bufs, hint: bool) -> Result<Option<u64>> {
    let (k, name) = kind(send);
    let dev = p.device_of(c, k, name)?;
    let what = if send { "isend" } else { "irecv" };
    let open = if any_held() {
        groups(|g| g.open.remove(&c))
    } else {
        None
    };
    let Some(mut g) = open else {
        if !hint {
            return post(dev, c, send, &bufs);
        }
        check_member(dev, send, &bufs)?;
        if MAX_GROUP < 2 {
            return Err(too_large(what));
        }
        let mut g = Group {
            send,
            members: Vec::with_capacity(MAX_GROUP),
            closed: false,
            n_last: 1,
            warned: false,
        };
        g.join(bufs);
        let r = g.pump(dev, c);
        groups(|gs| gs.open.insert(c, g));
        return r.map(|_| None);
    };
    let r = step(dev, c, &mut g, bufs, hint, what);
    match r {
        Ok(true) => {
            let handle = super::new_handle(dev.index, Kind::Request);
            groups(|gs| gs.returned.insert(handle, (c, g)));
            Ok(Some(handle))
        }
        other => {
            groups(|gs| gs.open.insert(c, g));
            other.map(|_| None)
        }
    }
}

fn too_large(what: &str) -> Error {
    Error::InvalidUsage(format!(
        "{what}: this NCCL_NET_MULTI_REQUEST call would make the group larger than \
         maxMultiRequestSize ({MAX_GROUP}), counting its last member"
    ))
}

/// One more call on a comm whose group is open: append the member (a hinted one, or the last),
/// then pump; true when the group's handle may be returned.
fn step(dev: &Device, c: u64, g: &mut Group, bufs: Bufs, hint: bool, what: &str) -> Result<bool> {
    if hint {
        if g.closed {
            return Err(Error::InvalidUsage(format!(
                "{what}: NCCL_NET_MULTI_REQUEST after the group's last member, before the \
                 group's handle was returned (call again with the last member's buffer)"
            )));
        }
        check_member(dev, g.send, &bufs)?;
        // The group's last member must still find a place.
        if g.members.len() + 2 > MAX_GROUP {
            return Err(too_large(what));
        }
        g.join(bufs);
        g.pump(dev, c)?;
        return Ok(false);
    }
    if !g.closed {
        check_member(dev, g.send, &bufs)?;
        if g.members.len() + 1 > MAX_GROUP {
            return Err(too_large(what));
        }
        g.n_last = bufs.len();
        g.join(bufs);
        g.closed = true;
    } else if !g.warned && g.members.last().is_some_and(|m| m.bufs != bufs) {
        g.warned = true;
        log::warn!(
            "{what}: a call with other buffers while the group's last member waits for room: \
             not appended (NCCL must call again with the last member's buffers)"
        );
    }
    g.pump(dev, c)
}

/// What `test` finds for a handle of the v11+ tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tested {
    /// Not a group's handle: an ordinary request, tested as such.
    Request,
    /// A group with members still in flight.
    Pending,
    /// A finished group (now gone): `bytes` over all members, and `sizes`, how many sizes
    /// NCCL passed room for (one for a send, the last member's `n` for a receive).
    Done { bytes: usize, sizes: usize },
}

/// `test` of the v11+ tables on handle `r`.
pub fn test(p: &Plugin, r: u64) -> Result<Tested> {
    let mine = if any_held() {
        groups(|g| g.returned.remove(&r))
    } else {
        None
    };
    let Some((comm, mut g)) = mine else {
        return Ok(Tested::Request);
    };
    let (k, name) = kind(g.send);
    // Every member is posted once the handle is out. A failed member fails the group, which
    // is then gone like any failed request.
    g.retire(p.device_of(comm, k, name)?, false)?;
    let Some(bytes) = g.finished() else {
        groups(|gs| gs.returned.insert(r, (comm, g)));
        return Ok(Tested::Pending);
    };
    let sizes = if g.send { 1 } else { g.n_last };
    Ok(Tested::Done { bytes, sizes })
}

/// Drop the groups of a comm being closed (see the file's comment).
pub fn forget_comm(comm: u64, what: &str) {
    if !any_held() {
        return;
    }
    let open = groups(|g| {
        g.returned.retain(|_, (c, _)| *c != comm);
        g.open.remove(&comm)
    });
    if let Some(open) = open {
        let queued = open
            .members
            .iter()
            .filter(|m| matches!(m.state, State::Queued))
            .count();
        log::warn!(
            "{what}: the comm's NCCL_NET_MULTI_REQUEST group was still open ({} member(s), {} \
             never posted): dropped with the comm",
            open.members.len(),
            queued
        );
    }
}

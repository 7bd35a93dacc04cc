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
//! and do not use this file.
use crate::error::{Error, Result};
use crate::ffi::net::*;
use crate::ffi::types::MultiRequestProps;
use crate::ffi::{boundary, h, ptr, region, Out};
use crate::plugin::net::{Device, MAX_TAG, RECV_CAPACITY, SEND_CAPACITY};
use crate::plugin::{self, Kind, Plugin};
use crate::transport::Region;
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `NCCL_NET_MULTI_REQUEST`: the `*request` value of a call that is not its group's last.
pub const NCCL_NET_MULTI_REQUEST: usize = 0x2;

/// `maxMultiRequestSize`: the most members a group may have. Each member is one request of the
/// device, and the whole group must fit in flight on one otherwise idle comm, whose receive side
/// holds `RECV_CAPACITY` requests (the send side more); a larger group could never complete.
pub const MAX_GROUP: usize = if RECV_CAPACITY < SEND_CAPACITY {
    RECV_CAPACITY
} else {
    SEND_CAPACITY
};

/// A member's buffers, as `isend` (one) or `irecv` (n) gives them: (region, tag, mhandle).
type Bufs = Vec<(Region, c_int, u64)>;

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

/// `isend` / `irecv` of the v11+ tables: `hint` is whether `*request` was
/// `NCCL_NET_MULTI_REQUEST` on input; `out` gets NULL, a request or a group's handle.
pub(crate) fn call(
    p: &Plugin,
    comm: VoidP,
    send: bool,
    bufs: Bufs,
    hint: bool,
    out: &Out<VoidP>,
) -> Result<()> {
    let c = h(comm);
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
            out.set(ptr(post(dev, c, send, &bufs)?));
            return Ok(());
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
        return r.map(|_| ());
    };
    let r = step(dev, c, &mut g, bufs, hint, what);
    match r {
        Ok(true) => {
            let handle = plugin::new_handle(dev.index, Kind::Request);
            groups(|gs| gs.returned.insert(handle, (c, g)));
            out.set(ptr(Some(handle)));
            Ok(())
        }
        other => {
            groups(|gs| gs.open.insert(c, g));
            other.map(|_| ())
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

/// `test` of the v11+ tables: a group's handle, else an ordinary request.
pub(crate) fn test_group(
    p: &Plugin,
    request: VoidP,
    done: *mut c_int,
    sizes: *mut c_int,
) -> Result<()> {
    let r = h(request);
    let mine = if any_held() {
        groups(|g| g.returned.remove(&r))
    } else {
        None
    };
    let Some((comm, mut g)) = mine else {
        return test_inner(p, request, done, sizes);
    };
    // SAFETY: the caller passes a writable int*.
    let done = unsafe { Out::new(done, "done") }?;
    done.set(0);
    let (k, name) = kind(g.send);
    // Every member is posted once the handle is out. A failed member fails the group, which
    // is then gone like any failed request.
    g.retire(p.device_of(comm, k, name)?, false)?;
    let Some(total) = g.finished() else {
        groups(|gs| gs.returned.insert(r, (comm, g)));
        return Ok(());
    };
    if !sizes.is_null() {
        // The group's bytes (saturating at INT_MAX) in the first size, the rest 0. NCCL only
        // sums a request's sizes, and one int per member could overrun its array (64 ints; a
        // group has up to 128).
        let n = if g.send { 1 } else { g.n_last };
        for i in 0..n {
            let v = if i == 0 {
                total.min(c_int::MAX as usize) as c_int
            } else {
                0
            };
            // SAFETY: a send passes one int, a receive an int per buffer of the irecv that
            // returned this handle (n_last of them, at most maxRecvs).
            unsafe { sizes.add(i).write(v) };
        }
    }
    done.set(1);
    Ok(())
}

/// Drop the groups of a comm being closed (see the file's comment).
pub(crate) fn forget_comm(comm: u64, what: &str) {
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

// ---- the v11 / v12 entry points that know groups (each inside the panic boundary) ----------

/// NCCL's request out-pointer, set to NULL, and whether NCCL marked the call as a group member
/// (`*request` was NCCL_NET_MULTI_REQUEST; the 0x1 hint of irecv is not a group's and is
/// overwritten like any other value).
///
/// # Safety
/// `req` is NULL or readable and writable, as NCCL's `void**` request argument is.
unsafe fn request_arg(req: VoidPP) -> Result<(bool, Out<VoidP>)> {
    // SAFETY: forwarded from this function's contract.
    let hint = !req.is_null() && unsafe { *req } as usize == NCCL_NET_MULTI_REQUEST;
    // SAFETY: as above.
    let out = unsafe { Out::new(req, "request") }?;
    out.set(std::ptr::null_mut());
    Ok((hint, out))
}

pub(crate) unsafe extern "C" fn isend_v11(
    comm: VoidP,
    data: VoidP,
    size: usize,
    tag: c_int,
    mh: VoidP,
    _ph: VoidP,
    req: VoidPP,
) -> Res {
    boundary("isend", || {
        // SAFETY: NCCL's request argument is a readable and writable void*.
        let (hint, out) = unsafe { request_arg(req) }?;
        // SAFETY: NCCL keeps the buffer valid until test() reports the request done.
        let r = unsafe { region(data, size, "data") }?;
        call(plugin()?, comm, true, vec![(r, tag, h(mh))], hint, &out)
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn irecv_v11(
    comm: VoidP,
    n: c_int,
    data: VoidPP,
    sizes: *mut usize,
    tags: *mut c_int,
    mhs: VoidPP,
    _phs: VoidPP,
    req: VoidPP,
) -> Res {
    boundary("irecv", || {
        // SAFETY: NCCL's request argument is a readable and writable void*.
        let (hint, out) = unsafe { request_arg(req) }?;
        // SAFETY: NCCL's arrays have n elements; buffers live until test() reports done.
        let bufs = unsafe { recv_bufs(n, data, sizes, tags, mhs) }?;
        call(plugin()?, comm, false, bufs, hint, &out)
    })
}

pub(crate) unsafe extern "C" fn test_v11(
    request: VoidP,
    done: *mut c_int,
    sizes: *mut c_int,
) -> Res {
    boundary("test", || test_group(plugin()?, request, done, sizes))
}

pub(crate) unsafe extern "C" fn close_send_v11(comm: VoidP) -> Res {
    boundary("closeSend", || {
        forget_comm(h(comm), "closeSend");
        close_send_inner(comm)
    })
}

pub(crate) unsafe extern "C" fn close_recv_v11(comm: VoidP) -> Res {
    boundary("closeRecv", || {
        forget_comm(h(comm), "closeRecv");
        close_recv_inner(comm)
    })
}

/// getProperties of the v11 / v12 net tables: the common props with [`MAX_GROUP`].
pub(crate) unsafe extern "C" fn get_properties_v11<P>(dev: c_int, props: *mut P) -> Res
where
    P: for<'a> From<&'a plugin::DeviceProps> + MultiRequestProps,
{
    boundary("getProperties", || {
        // SAFETY: NCCL passes a writable props struct of this version's layout.
        let out = unsafe { Out::new(props, "props") }?;
        let mut v = P::from(&plugin()?.device(dev)?.props);
        v.set_max_multi_request_size(MAX_GROUP as c_int);
        out.set(v);
        Ok(())
    })
}

//! The arguments of the C API's gather, scatter, barrier, uneven-count collectives
//! (allgatherv, reducescatterv, alltoallv) and tagged send/recv, as C passes them ([`VArgs`],
//! [`Tagged`]), and their checks into a `Call` (on device buffers, the staged path of
//! `coll::device`: all but alltoallv, which refuses them). Their exports (in `exports`) take
//! the one blocking or non-blocking path of `collectives`, so that group calls apply to them
//! too.
use super::collectives::ToCall;
use super::types::{dtype, redop};
use crate::algo::varied::Varied;
use crate::coll::device::{DevCall, Parts};
use crate::coll::{varied_bytes, Call, Comm, Kind, Layout};
use crate::error::{Error, Result};
use crate::ffi::region;
use crate::reduce::RedOp;
use crate::transport::Region;
use std::os::raw::{c_int, c_void};

/// The largest tag of fabricoll_send_tagged / fabricoll_recv_tagged (tags are 0 ..= this).
/// A literal, so that cbindgen writes it into the header; it is the executor's `MAX_TAG`.
pub const FABRICOLL_MAX_TAG: c_int = 1048575;
const _: () = assert!(FABRICOLL_MAX_TAG as u32 == crate::exec::MAX_TAG);

/// A varied collective's arguments as C passes them. Count arrays hold `nranks` values; those
/// named in `required` must not be NULL, the displacement arrays may be (packed blocks).
pub(super) struct VArgs {
    coll: Varied,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    root: c_int,
    /// (array, its argument's name): counts, displs, recv counts, recv displs.
    arrays: [(*const usize, &'static str); 4],
}

impl VArgs {
    pub(super) fn new(
        coll: Varied,
        send: *const c_void,
        recv: *mut c_void,
        datatype: c_int,
    ) -> VArgs {
        VArgs {
            coll,
            send,
            recv,
            count: 0,
            datatype,
            op: 0,
            root: 0,
            arrays: [(std::ptr::null(), ""); 4],
        }
    }

    /// Gather (`scatter` false) or Scatter of `count` elements per rank at `root`.
    pub(super) fn rooted(
        scatter: bool,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
    ) -> VArgs {
        let coll = if scatter {
            Varied::Scatter
        } else {
            Varied::Gather
        };
        VArgs {
            count,
            root,
            ..VArgs::new(coll, send, recv, datatype)
        }
    }

    pub(super) fn allgatherv(
        send: *const c_void,
        sendcount: usize,
        recv: *mut c_void,
        recvcounts: *const usize,
        displs: *const usize,
        datatype: c_int,
    ) -> VArgs {
        let none = (std::ptr::null(), "");
        VArgs {
            count: sendcount,
            arrays: [(recvcounts, "recvcounts"), (displs, "displs"), none, none],
            ..VArgs::new(Varied::AllGatherV, send, recv, datatype)
        }
    }

    pub(super) fn reducescatterv(
        send: *const c_void,
        recv: *mut c_void,
        recvcounts: *const usize,
        datatype: c_int,
        op: c_int,
    ) -> VArgs {
        let none = (std::ptr::null(), "");
        VArgs {
            op,
            arrays: [(recvcounts, "recvcounts"), none, none, none],
            ..VArgs::new(Varied::ReduceScatterV, send, recv, datatype)
        }
    }

    /// `arrays`: sendcounts, sdispls, recvcounts, rdispls.
    pub(super) fn alltoallv(
        arrays: [*const usize; 4],
        send: *const c_void,
        recv: *mut c_void,
        datatype: c_int,
    ) -> VArgs {
        let names = ["sendcounts", "sdispls", "recvcounts", "rdispls"];
        VArgs {
            arrays: [0, 1, 2, 3].map(|i| (arrays[i], names[i])),
            ..VArgs::new(Varied::AllToAllV, send, recv, datatype)
        }
    }
}

impl ToCall for VArgs {
    fn device(&self, comm: &Comm, stream: bool) -> Result<Option<DevCall>> {
        let call = ToCall::call(self, comm)?;
        // SAFETY: the caller's buffers are valid for the lengths its counts give until the
        // call completes.
        let Some(d) = (unsafe { DevCall::classify(&parts(&call, self.send, self.recv), stream) })?
        else {
            return Ok(None);
        };
        let Kind::Varied(l) = call.kind else {
            return Err(Error::Internal("a varied call of another kind".into()));
        };
        let (n, rank) = (comm.nranks, comm.rank);
        d.with_spec(&l.spec(self.count, call.root, n, rank)?, n, rank)
            .map(Some)
    }

    fn call(&self, comm: &Comm) -> Result<Call> {
        let dt = dtype(self.datatype)?;
        let op = if self.coll == Varied::ReduceScatterV {
            redop(self.op)?
        } else {
            RedOp::Sum
        };
        let root = if matches!(self.coll, Varied::Gather | Varied::Scatter) {
            usize::try_from(self.root)
                .map_err(|_| Error::arg("root", format!("{} is negative", self.root)))?
        } else {
            0
        };
        let (n, rank) = (comm.nranks, comm.rank);
        let words = std::mem::size_of::<usize>() * n;
        let mut r = [Region::empty(); 4];
        for (slot, &(p, name)) in r.iter_mut().zip(&self.arrays) {
            if !p.is_null() {
                // SAFETY: the C API documents every counts and displacements array as holding
                // nranks values, read before the call returns.
                *slot = unsafe { region(p as *mut c_void, words, name) }?;
            }
        }
        let layout = Layout {
            coll: self.coll,
            counts: r[0],
            displs: r[1],
            recv_counts: r[2],
            recv_displs: r[3],
        };
        let spec = layout.spec(self.count, root, n, rank)?;
        let (ib, ob) = varied_bytes(&spec, dt, n, rank)?;
        // SAFETY: the caller's buffers are valid for the lengths the call's counts give, until
        // it completes.
        let (send, recv) = unsafe {
            (
                buffer(self.send as *mut c_void, ib, "sendbuf")?,
                buffer(self.recv, ob, "recvbuf")?,
            )
        };
        Ok(Call {
            kind: Kind::Varied(layout),
            send,
            recv,
            count: self.count,
            dtype: dt,
            op,
            root,
            algo: None,
        })
    }
}

/// The checked `call` with the caller's buffers, as `DevCall::classify` takes it.
fn parts(call: &Call, send: *const c_void, recv: *mut c_void) -> Parts {
    Parts {
        kind: call.kind,
        send,
        recv,
        count: call.count,
        dtype: call.dtype,
        op: call.op,
        root: call.root,
        algo: call.algo,
    }
}

/// A buffer of `len` bytes; NULL is an error only where the rank reads or writes it.
///
/// # Safety
/// A non-NULL `p` must be valid for `len` bytes until the call completes.
unsafe fn buffer(p: *mut c_void, len: usize, name: &str) -> Result<Region> {
    if len == 0 {
        return Ok(Region::empty());
    }
    // SAFETY: forwarded from this function's contract.
    unsafe { region(p, len, name) }
}

/// One side of a tagged transfer as C passes it.
pub(super) struct Tagged {
    pub(super) send: bool,
    pub(super) buf: *mut c_void,
    pub(super) count: usize,
    pub(super) datatype: c_int,
    pub(super) peer: c_int,
    pub(super) tag: c_int,
}

impl ToCall for Tagged {
    fn device(&self, comm: &Comm, stream: bool) -> Result<Option<DevCall>> {
        let call = ToCall::call(self, comm)?;
        let (s, r) = if self.send {
            (self.buf as *const c_void, std::ptr::null_mut())
        } else {
            (std::ptr::null(), self.buf)
        };
        // SAFETY: the caller's buffer is valid for count elements until the call completes.
        unsafe { DevCall::classify(&parts(&call, s, r), stream) }
    }

    fn call(&self, _comm: &Comm) -> Result<Call> {
        let peer = usize::try_from(self.peer)
            .map_err(|_| Error::arg("peer", format!("{} is negative", self.peer)))?;
        let tag = u32::try_from(self.tag)
            .ok()
            .filter(|&t| t <= FABRICOLL_MAX_TAG as u32)
            .ok_or_else(|| {
                Error::arg(
                    "tag",
                    format!(
                        "{} is outside 0 ..= FABRICOLL_MAX_TAG ({FABRICOLL_MAX_TAG})",
                        self.tag
                    ),
                )
            })?;
        let dt = dtype(self.datatype)?;
        let bytes = self.count.checked_mul(dt.size()).ok_or_else(|| {
            Error::arg(
                "count",
                format!("{} elements overflow the address space", self.count),
            )
        })?;
        // SAFETY: the caller's buffer is valid for count elements until the call completes.
        let buf = unsafe { buffer(self.buf, bytes, "buf") }?;
        let (send, recv) = if self.send {
            (buf, Region::empty())
        } else {
            (Region::empty(), buf)
        };
        Ok(Call {
            kind: Kind::Tagged {
                send: self.send,
                peer,
                tag,
            },
            send,
            recv,
            count: self.count,
            dtype: dt,
            op: RedOp::Sum,
            root: 0,
            algo: None,
        })
    }
}

//! The C API's gather, scatter, barrier, uneven-count collectives (allgatherv, reducescatterv,
//! alltoallv) and tagged send/recv, blocking and non-blocking. Each checks its arguments into a
//! `Call` ([`VArgs`], [`Tagged`]) and takes the one blocking or non-blocking path of
//! `collectives` (so that group calls apply to them too).
use super::collectives::{blocking, nonblocking, ToCall};
use super::types::{dtype, fabricoll_comm, fabricoll_request, fabricoll_status, redop};
use crate::algo::varied::Varied;
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
struct VArgs {
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
    fn new(coll: Varied, send: *const c_void, recv: *mut c_void, datatype: c_int) -> VArgs {
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
    fn rooted(
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
}

impl ToCall for VArgs {
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
struct Tagged {
    send: bool,
    buf: *mut c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    tag: c_int,
}

impl ToCall for Tagged {
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

/// Every rank's sendbuf (sendcount elements) lands in rank order in the root's recvbuf
/// (nranks x sendcount; written on the root only, may be NULL elsewhere).
#[no_mangle]
pub extern "C" fn fabricoll_gather(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    sendcount: usize,
    datatype: c_int,
    root: c_int,
    comm: *mut fabricoll_comm,
) -> fabricoll_status {
    let a = VArgs::rooted(false, sendbuf, recvbuf, sendcount, datatype, root);
    blocking("fabricoll_gather", comm, a)
}

/// Non-blocking fabricoll_gather: `*request` completes through fabricoll_test / fabricoll_wait.
#[no_mangle]
pub extern "C" fn fabricoll_igather(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    sendcount: usize,
    datatype: c_int,
    root: c_int,
    comm: *mut fabricoll_comm,
    request: *mut *mut fabricoll_request,
) -> fabricoll_status {
    let a = VArgs::rooted(false, sendbuf, recvbuf, sendcount, datatype, root);
    nonblocking("fabricoll_igather", comm, a, request)
}

/// Block i (recvcount elements) of the root's sendbuf (nranks x recvcount; read on the root
/// only, may be NULL elsewhere) lands in rank i's recvbuf.
#[no_mangle]
pub extern "C" fn fabricoll_scatter(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: usize,
    datatype: c_int,
    root: c_int,
    comm: *mut fabricoll_comm,
) -> fabricoll_status {
    let a = VArgs::rooted(true, sendbuf, recvbuf, recvcount, datatype, root);
    blocking("fabricoll_scatter", comm, a)
}

/// Non-blocking fabricoll_scatter: `*request` completes through fabricoll_test / fabricoll_wait.
#[no_mangle]
pub extern "C" fn fabricoll_iscatter(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: usize,
    datatype: c_int,
    root: c_int,
    comm: *mut fabricoll_comm,
    request: *mut *mut fabricoll_request,
) -> fabricoll_status {
    let a = VArgs::rooted(true, sendbuf, recvbuf, recvcount, datatype, root);
    nonblocking("fabricoll_iscatter", comm, a, request)
}

/// Returns once every rank has called it.
#[no_mangle]
pub extern "C" fn fabricoll_barrier(comm: *mut fabricoll_comm) -> fabricoll_status {
    let a = VArgs::new(Varied::Barrier, std::ptr::null(), std::ptr::null_mut(), 0);
    blocking("fabricoll_barrier", comm, a)
}

/// Non-blocking fabricoll_barrier: `*request` completes once every rank has called it.
#[no_mangle]
pub extern "C" fn fabricoll_ibarrier(
    comm: *mut fabricoll_comm,
    request: *mut *mut fabricoll_request,
) -> fabricoll_status {
    let a = VArgs::new(Varied::Barrier, std::ptr::null(), std::ptr::null_mut(), 0);
    nonblocking("fabricoll_ibarrier", comm, a, request)
}

fn allgatherv(
    sendbuf: *const c_void,
    sendcount: usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    displs: *const usize,
    datatype: c_int,
) -> VArgs {
    let none = (std::ptr::null(), "");
    VArgs {
        count: sendcount,
        arrays: [(recvcounts, "recvcounts"), (displs, "displs"), none, none],
        ..VArgs::new(Varied::AllGatherV, sendbuf, recvbuf, datatype)
    }
}

/// recvbuf + displs[i] (recvcounts[i] elements) = rank i's sendbuf; sendcount must equal
/// recvcounts[rank]. recvcounts (nranks values, the same on every rank) must not be NULL;
/// displs NULL packs the blocks in rank order.
#[no_mangle]
pub extern "C" fn fabricoll_allgatherv(
    sendbuf: *const c_void,
    sendcount: usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    displs: *const usize,
    datatype: c_int,
    comm: *mut fabricoll_comm,
) -> fabricoll_status {
    let a = allgatherv(sendbuf, sendcount, recvbuf, recvcounts, displs, datatype);
    blocking("fabricoll_allgatherv", comm, a)
}

/// Non-blocking fabricoll_allgatherv (the arrays are read before it returns).
#[no_mangle]
pub extern "C" fn fabricoll_iallgatherv(
    sendbuf: *const c_void,
    sendcount: usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    displs: *const usize,
    datatype: c_int,
    comm: *mut fabricoll_comm,
    request: *mut *mut fabricoll_request,
) -> fabricoll_status {
    let a = allgatherv(sendbuf, sendcount, recvbuf, recvcounts, displs, datatype);
    nonblocking("fabricoll_iallgatherv", comm, a, request)
}

fn reducescatterv(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    datatype: c_int,
    op: c_int,
) -> VArgs {
    let none = (std::ptr::null(), "");
    VArgs {
        op,
        arrays: [(recvcounts, "recvcounts"), none, none, none],
        ..VArgs::new(Varied::ReduceScatterV, sendbuf, recvbuf, datatype)
    }
}

/// recvbuf (recvcounts[rank] elements) = block `rank` of the reduction of every rank's
/// sendbuf, whose blocks are recvcounts[0..nranks] packed. recvcounts (the same on every
/// rank) must not be NULL.
#[no_mangle]
pub extern "C" fn fabricoll_reducescatterv(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    datatype: c_int,
    op: c_int,
    comm: *mut fabricoll_comm,
) -> fabricoll_status {
    let a = reducescatterv(sendbuf, recvbuf, recvcounts, datatype, op);
    blocking("fabricoll_reducescatterv", comm, a)
}

/// Non-blocking fabricoll_reducescatterv (the array is read before it returns).
#[no_mangle]
pub extern "C" fn fabricoll_ireducescatterv(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    datatype: c_int,
    op: c_int,
    comm: *mut fabricoll_comm,
    request: *mut *mut fabricoll_request,
) -> fabricoll_status {
    let a = reducescatterv(sendbuf, recvbuf, recvcounts, datatype, op);
    nonblocking("fabricoll_ireducescatterv", comm, a, request)
}

#[allow(clippy::too_many_arguments)]
fn alltoallv(
    sendbuf: *const c_void,
    sendcounts: *const usize,
    sdispls: *const usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    rdispls: *const usize,
    datatype: c_int,
) -> VArgs {
    VArgs {
        arrays: [
            (sendcounts, "sendcounts"),
            (sdispls, "sdispls"),
            (recvcounts, "recvcounts"),
            (rdispls, "rdispls"),
        ],
        ..VArgs::new(Varied::AllToAllV, sendbuf, recvbuf, datatype)
    }
}

/// sendbuf + sdispls[j] (sendcounts[j] elements) goes to rank j, landing at its recvbuf +
/// rdispls[i] (recvcounts[i]) for this rank i. The counts arrays must not be NULL; a NULL
/// displacements array packs its blocks in rank order.
#[no_mangle]
pub extern "C" fn fabricoll_alltoallv(
    sendbuf: *const c_void,
    sendcounts: *const usize,
    sdispls: *const usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    rdispls: *const usize,
    datatype: c_int,
    comm: *mut fabricoll_comm,
) -> fabricoll_status {
    let a = alltoallv(
        sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, datatype,
    );
    blocking("fabricoll_alltoallv", comm, a)
}

/// Non-blocking fabricoll_alltoallv (the arrays are read before it returns).
#[no_mangle]
pub extern "C" fn fabricoll_ialltoallv(
    sendbuf: *const c_void,
    sendcounts: *const usize,
    sdispls: *const usize,
    recvbuf: *mut c_void,
    recvcounts: *const usize,
    rdispls: *const usize,
    datatype: c_int,
    comm: *mut fabricoll_comm,
    request: *mut *mut fabricoll_request,
) -> fabricoll_status {
    let a = alltoallv(
        sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, datatype,
    );
    nonblocking("fabricoll_ialltoallv", comm, a, request)
}

/// Send count elements to `peer` with `tag` (0 ..= FABRICOLL_MAX_TAG), matched in order with
/// its receives of that tag from this rank (fabricoll_send is tag 0).
#[no_mangle]
pub extern "C" fn fabricoll_send_tagged(
    buf: *const c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    tag: c_int,
    comm: *mut fabricoll_comm,
) -> fabricoll_status {
    let a = tagged(true, buf as *mut c_void, count, datatype, peer, tag);
    blocking("fabricoll_send_tagged", comm, a)
}

/// Non-blocking fabricoll_send_tagged.
#[no_mangle]
pub extern "C" fn fabricoll_isend_tagged(
    buf: *const c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    tag: c_int,
    comm: *mut fabricoll_comm,
    request: *mut *mut fabricoll_request,
) -> fabricoll_status {
    let a = tagged(true, buf as *mut c_void, count, datatype, peer, tag);
    nonblocking("fabricoll_isend_tagged", comm, a, request)
}

/// Receive count elements from `peer` with `tag` (fabricoll_recv is tag 0).
#[no_mangle]
pub extern "C" fn fabricoll_recv_tagged(
    buf: *mut c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    tag: c_int,
    comm: *mut fabricoll_comm,
) -> fabricoll_status {
    let a = tagged(false, buf, count, datatype, peer, tag);
    blocking("fabricoll_recv_tagged", comm, a)
}

/// Non-blocking fabricoll_recv_tagged.
#[no_mangle]
pub extern "C" fn fabricoll_irecv_tagged(
    buf: *mut c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    tag: c_int,
    comm: *mut fabricoll_comm,
    request: *mut *mut fabricoll_request,
) -> fabricoll_status {
    let a = tagged(false, buf, count, datatype, peer, tag);
    nonblocking("fabricoll_irecv_tagged", comm, a, request)
}

fn tagged(
    send: bool,
    buf: *mut c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    tag: c_int,
) -> Tagged {
    Tagged {
        send,
        buf,
        count,
        datatype,
        peer,
        tag,
    }
}

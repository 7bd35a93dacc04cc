//! How the C API's calls run: the arguments as C passes them ([`Args`], [`ToCall`]), the one
//! blocking, non-blocking and stream-ordered path every call takes ([`blocking`],
//! [`nonblocking`], [`stream_ordered`]: the panic boundary and the checks live there once), the
//! generic `fabricoll_collective`, and test/wait. The exports of send, receive and the
//! collectives (`exports`) each make one call into this file.
use super::group::{no_group, run_blocking, run_device};
use super::handles::{
    comm_of, register_device_request, register_request, test_request, wait_request,
};
use super::out;
use super::types::{
    algo, coll, dtype, fabricoll_call, fabricoll_comm, fabricoll_request, fabricoll_status, redop,
};
use crate::algo::Collective;
use crate::coll::device::{DevCall, Parts};
use crate::coll::{Call, Comm, Kind};
use crate::error::{Error, Result};
use crate::ffi::boundary::boundary;
use crate::ffi::{arg_ref, region};
use crate::reduce::{DataType, RedOp};
use crate::transport::Region;
use std::os::raw::{c_int, c_void};

/// One call's arguments as C passes them; checked by [`Args::call`].
pub(super) struct Args {
    /// For point-to-point calls the peer in `kind` is a placeholder: `peer` is checked in
    /// `call`.
    kind: Kind,
    peer: c_int,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: c_int,
    op: c_int,
    root: c_int,
    algo: c_int,
}

impl Args {
    fn new(
        kind: Kind,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        datatype: c_int,
    ) -> Args {
        Args {
            kind,
            peer: 0,
            send,
            recv,
            count,
            datatype,
            op: 0,
            root: 0,
            algo: 0,
        }
    }

    /// A send (`send`) or a receive of `count` elements with `peer`.
    pub(super) fn p2p(
        send: bool,
        buf: *mut c_void,
        count: usize,
        datatype: c_int,
        peer: c_int,
    ) -> Args {
        let (kind, s, r) = if send {
            (
                Kind::Send { peer: 0 },
                buf as *const c_void,
                std::ptr::null_mut(),
            )
        } else {
            (Kind::Recv { peer: 0 }, std::ptr::null(), buf)
        };
        Args {
            peer,
            ..Args::new(kind, s, r, count, datatype)
        }
    }

    pub(super) fn coll(
        c: Collective,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        datatype: c_int,
    ) -> Args {
        Args::new(Kind::Coll(c), send, recv, count, datatype)
    }

    pub(super) fn op(self, op: c_int) -> Args {
        Args { op, ..self }
    }

    pub(super) fn root(self, root: c_int) -> Args {
        Args { root, ..self }
    }

    /// The checked arguments on `comm`, the buffers as passed.
    fn parts(&self, comm: &Comm) -> Result<Parts> {
        let peer = || {
            usize::try_from(self.peer)
                .map_err(|_| Error::arg("peer", format!("{} is negative", self.peer)))
        };
        let kind = match self.kind {
            Kind::Send { .. } => Kind::Send { peer: peer()? },
            Kind::Recv { .. } => Kind::Recv { peer: peer()? },
            k => k,
        };
        let dt = dtype(self.datatype)?;
        let op = if matches!(self.kind, Kind::Coll(k) if k.reduces()) {
            redop(self.op)?
        } else {
            RedOp::Sum
        };
        let root = usize::try_from(self.root)
            .map_err(|_| Error::arg("root", format!("{} is negative", self.root)))?;
        lengths(comm, kind, self.count, dt)?;
        Ok(Parts {
            kind,
            send: self.send,
            recv: self.recv,
            count: self.count,
            dtype: dt,
            op,
            root,
            algo: algo(self.algo)?,
        })
    }

    /// The checked call on `comm`.
    fn call(&self, comm: &Comm) -> Result<Call> {
        let p = self.parts(comm)?;
        // SAFETY: the caller's buffers are valid for the documented lengths until completion.
        let (s, r) = unsafe { regions(comm, p.kind, p.send, p.recv, p.count, p.dtype) }?;
        Ok(Call {
            kind: p.kind,
            send: s,
            recv: r,
            count: p.count,
            dtype: p.dtype,
            op: p.op,
            root: p.root,
            algo: p.algo,
        })
    }
}

/// The byte lengths of a call's input and output buffers, from the collective's definition.
fn lengths(comm: &Comm, kind: Kind, count: usize, dt: DataType) -> Result<(usize, usize)> {
    let n = comm.nranks;
    let bytes = |elems: Option<usize>| {
        elems.and_then(|e| e.checked_mul(dt.size())).ok_or_else(|| {
            Error::arg(
                "count",
                format!("{count} elements overflow the address space"),
            )
        })
    };
    let (in_elems, out_elems) = match kind {
        Kind::Coll(Collective::AllGather) => (Some(count), count.checked_mul(n)),
        Kind::Coll(Collective::ReduceScatter) => (count.checked_mul(n), Some(count)),
        Kind::Coll(Collective::AllToAll) => (count.checked_mul(n), count.checked_mul(n)),
        _ => (Some(count), Some(count)),
    };
    Ok((bytes(in_elems)?, bytes(out_elems)?))
}

/// Buffers as regions: lengths from the collective's definition, NULL as an empty region (the
/// executor then reports the buffer a rank needs but lacks).
///
/// # Safety
/// Non-NULL pointers must be valid for the lengths the call's documentation gives, until the
/// call (or its request) completes.
unsafe fn regions(
    comm: &Comm,
    kind: Kind,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dt: DataType,
) -> Result<(Region, Region)> {
    let (ib, ob) = lengths(comm, kind, count, dt)?;
    let mk = |p: *mut c_void, len: usize, name: &str| -> Result<Region> {
        if p.is_null() {
            return Ok(Region::empty());
        }
        // SAFETY: forwarded from this function's contract.
        unsafe { region(p, len, name) }
    };
    Ok((
        mk(send as *mut c_void, ib, "sendbuf")?,
        mk(recv, ob, "recvbuf")?,
    ))
}

/// Arguments as C passes them, checked into a [`Call`] on a communicator: [`Args`], and the
/// varied collectives' and tagged transfers' (`varied`), so that every call takes the one
/// [`blocking`] and [`nonblocking`] path.
pub(super) trait ToCall {
    fn call(&self, comm: &Comm) -> Result<Call>;

    /// The call as a device call, when one of its buffers is device memory (None: the host
    /// path), or, for a stream-ordered call (`stream`), always: pageable host memory is then
    /// an error naming the argument (`DevCall::classify`).
    fn device(&self, comm: &Comm, stream: bool) -> Result<Option<DevCall>>;
}

impl ToCall for Args {
    fn call(&self, comm: &Comm) -> Result<Call> {
        Args::call(self, comm)
    }

    fn device(&self, comm: &Comm, stream: bool) -> Result<Option<DevCall>> {
        // SAFETY: the caller's buffers are valid for the documented lengths until completion.
        unsafe { DevCall::classify(&self.parts(comm)?, stream) }
    }
}

/// Run the call to completion; inside a group (`group`), start it and return.
pub(super) fn blocking(
    what: &'static str,
    comm: *mut fabricoll_comm,
    a: impl ToCall,
) -> fabricoll_status {
    boundary(what, || run(comm, &a))
}

/// A blocking call: on device buffers the staged path (inside a group, started), else the
/// host path once the communicator's device calls before it have started their slices.
fn run(comm: *mut fabricoll_comm, a: &impl ToCall) -> Result<()> {
    let c = comm_of(comm)?;
    if let Some(d) = a.device(&c.comm, false)? {
        return run_device(c, d);
    }
    let call = a.call(&c.comm)?;
    c.streams.settle(&c.comm, &call.kind)?;
    run_blocking(c, &call)
}

/// A stream-ordered call on the caller's CUDA stream `stream`: submitted, and returns.
pub(super) fn stream_ordered(
    what: &'static str,
    comm: *mut fabricoll_comm,
    a: impl ToCall,
    stream: *mut c_void,
) -> fabricoll_status {
    boundary(what, || {
        let c = comm_of(comm)?;
        no_group("a stream-ordered call")?;
        let Some(d) = a.device(&c.comm, true)? else {
            return Err(Error::Internal("a stream-ordered call on no device".into()));
        };
        // SAFETY: the buffers are valid until the stream has passed the call, and `stream` is
        // a live stream of the device (or a reserved handle, refused), as documented.
        unsafe { c.streams.submit(&c.comm, d, stream) }
    })
}

/// Start the call; `*request` (NULL on failure) completes through test / wait.
pub(super) fn nonblocking(
    what: &'static str,
    comm: *mut fabricoll_comm,
    a: impl ToCall,
    request: *mut *mut fabricoll_request,
) -> fabricoll_status {
    boundary(what, || start(comm, &a, request))
}

fn start(
    comm: *mut fabricoll_comm,
    a: &impl ToCall,
    request: *mut *mut fabricoll_request,
) -> Result<()> {
    let req = out(request, "request")?;
    req.set(std::ptr::null_mut());
    let c = comm_of(comm)?;
    if let Some(d) = a.device(&c.comm, false)? {
        let id = c.streams.start(&c.comm, d)?;
        req.set(register_device_request(c, id));
        return Ok(());
    }
    let call = a.call(&c.comm)?;
    c.streams.settle(&c.comm, &call.kind)?;
    let id = c.comm.start(&call)?;
    req.set(register_request(c, id));
    Ok(())
}

/// Any collective with a per-call algorithm: blocking when `request` is NULL, else non-blocking.
///
/// # Safety
/// `call` is NULL or points to a readable `fabricoll_call` whose buffers are valid for the
/// lengths its collective reads and writes until it completes.
#[no_mangle]
pub unsafe extern "C" fn fabricoll_collective(
    c: *const fabricoll_call,
    comm: *mut fabricoll_comm,
    request: *mut *mut fabricoll_request,
) -> fabricoll_status {
    boundary("fabricoll_collective", || {
        // SAFETY: documented as NULL or a readable fabricoll_call.
        let c = unsafe { arg_ref(c, "call") }?;
        let a = Args {
            kind: Kind::Coll(coll(c.coll)?),
            peer: 0,
            send: c.sendbuf,
            recv: c.recvbuf,
            count: c.count,
            datatype: c.datatype,
            op: c.op,
            root: c.root,
            algo: c.algo,
        };
        if request.is_null() {
            run(comm, &a)
        } else {
            start(comm, &a, request)
        }
    })
}

/// `*done` = 1 when the request has completed (the request is then freed; an error also frees
/// it and is returned), else 0.
#[no_mangle]
pub extern "C" fn fabricoll_test(
    request: *mut fabricoll_request,
    done: *mut c_int,
) -> fabricoll_status {
    boundary("fabricoll_test", || {
        let done = out(done, "done")?;
        done.set(0);
        if test_request(request)? {
            done.set(1);
        }
        Ok(())
    })
}

/// Wait for the request (polling, then sleeping on the fabric; at most FABRICOLL_TIMEOUT_MS
/// without progress) and free it.
#[no_mangle]
pub extern "C" fn fabricoll_wait(request: *mut fabricoll_request) -> fabricoll_status {
    boundary("fabricoll_wait", || wait_request(request))
}

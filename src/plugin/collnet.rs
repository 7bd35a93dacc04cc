//! NCCL CollNet semantics: NCCL's head ranks (one per node) form a collective comm and hand it
//! AllReduce, AllGather and ReduceScatter, which run on our engines (`coll`).
//!
//! `listen` opens an endpoint of its own and puts its address in the handle; `connect` gets
//! every rank's handle, so it builds the communicator without a network round trip: it
//! completes in one call, as NCCL requires. Operations start at once and advance whenever NCCL
//! polls `test` (or starts another). AllGather and ReduceScatter take NCCL's windows: the
//! global buffer is `nranks x bytesPerRank`, and one call covers `[windowOffset, +windowBytes)`.
//! Device buffers, where the net device takes them, go through `collnet_device`.
use super::collnet_device::{self as on_device, OnDevice};
use super::handles::HandleTable;
use super::{new_handle, Kind, Plugin, HANDLE_SIZE, NCCL_PTR_CUDA, NCCL_PTR_HOST};
use crate::algo::{Collective, Problem};
use crate::coll::{self, Call, Comm, RequestId};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::reduce::{DataType, RedOp};
use crate::transport::{Region, Scratch, Transport};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

const MAGIC: &[u8; 4] = b"FBCN";
const ADDR_OFF: usize = 8;

/// A listening endpoint waiting for `connect`.
struct ListenComm {
    transport: Arc<dyn Transport>,
    /// The CollNet device's `ptrSupport`.
    ptr_support: i32,
}

/// A collective comm: the communicator, its registrations, and its device calls (None: host
/// memory only).
pub struct CollComm {
    comm: Arc<Comm>,
    mrs: Mutex<HashMap<u64, Region>>,
    device: Option<OnDevice>,
}

/// Data to move once a request completes (scatter-gather parts beyond the first).
struct Scatter {
    staging: Scratch,
    parts: Vec<Region>,
}

struct Request {
    comm: Arc<CollComm>,
    id: Op,
    bytes: usize,
    /// Staging that must live until completion (gathered send parts), or parts to fill.
    staging: Option<Scratch>,
    scatter: Option<Scatter>,
}

/// A request's operation: on the engine (host buffers), or a device call.
#[derive(Clone, Copy)]
enum Op {
    Host(RequestId),
    Device(u64),
}

#[derive(Default)]
struct Tables {
    listens: HandleTable<ListenComm>,
    comms: HandleTable<Arc<CollComm>>,
    requests: HandleTable<Request>,
}

static TABLES: Mutex<Option<Tables>> = Mutex::new(None);

fn with<R>(f: impl FnOnce(&mut Tables) -> R) -> R {
    f(TABLES.lock().get_or_insert_with(Tables::default))
}

/// Which (type, op) pairs the engines reduce: every NCCL type, sum / prod / max / min (NCCL
/// sends Avg to the network as Sum). Unknown values are simply unsupported.
pub fn reduce_support(dtype: i32, op: i32) -> bool {
    DataType::from_nccl(dtype).is_some() && (0..=3).contains(&op)
}

fn dtype(v: i32) -> Result<DataType> {
    DataType::from_nccl(v)
        .ok_or_else(|| Error::arg("dataType", format!("{v} is not an NCCL data type (0..=11)")))
}

fn redop(v: i32) -> Result<RedOp> {
    match v {
        0..=3 => Ok(RedOp::from_nccl(v).expect("0..=3 are NCCL ops")),
        _ => Err(Error::arg(
            "redOp",
            format!("{v}: the network reduces sum, prod, max and min (0..=3)"),
        )),
    }
}

/// `listen` on device `dev`: a new endpoint whose address goes in the handle.
pub fn listen(p: &Plugin, dev: i32) -> Result<([u8; HANDLE_SIZE], u64)> {
    let d = p.device(dev)?;
    let t = d.open_endpoint()?;
    let addr = t.address();
    if addr.is_empty() || addr.len() > HANDLE_SIZE - ADDR_OFF {
        return Err(Error::System(format!(
            "endpoint address of {} bytes does not fit the handle",
            addr.len()
        )));
    }
    let mut h = [0u8; HANDLE_SIZE];
    h[0..4].copy_from_slice(MAGIC);
    h[4..6].copy_from_slice(&(addr.len() as u16).to_le_bytes());
    h[ADDR_OFF..ADDR_OFF + addr.len()].copy_from_slice(&addr);
    let id = new_handle(d.index, Kind::CollListen);
    let ptr_support = d.collnet_props.ptr_support;
    with(|t2| {
        t2.listens.insert_at(
            id,
            ListenComm {
                transport: t,
                ptr_support,
            },
        )
    });
    Ok((h, id))
}

fn parse_handle(h: &[u8; HANDLE_SIZE], rank: usize) -> Result<Vec<u8>> {
    let len = u16::from_le_bytes([h[4], h[5]]) as usize;
    if &h[0..4] != MAGIC || len == 0 || len > HANDLE_SIZE - ADDR_OFF {
        return Err(Error::arg(
            "handles",
            format!("handle of rank {rank} is not a fabricoll CollNet handle"),
        ));
    }
    Ok(h[ADDR_OFF..ADDR_OFF + len].to_vec())
}

/// `connect`: every rank's handle is known, so this completes in one call.
pub fn connect(
    handles: &[[u8; HANDLE_SIZE]],
    rank: usize,
    listen: u64,
    cfg: &Config,
) -> Result<u64> {
    if rank >= handles.len() {
        return Err(Error::arg(
            "rank",
            format!("{rank} is not below nranks ({})", handles.len()),
        ));
    }
    let addrs = handles
        .iter()
        .enumerate()
        .map(|(r, h)| parse_handle(h, r))
        .collect::<Result<Vec<_>>>()?;
    let (t, ptr_support) = with(|t| {
        t.listens
            .get(listen)
            .map(|l| (l.transport.clone(), l.ptr_support))
    })
    .ok_or_else(|| Error::arg("listenComm", "not an open CollNet listen comm"))?;
    if addrs[rank] != t.address() {
        return Err(Error::arg(
            "handles",
            format!("handle {rank} is not this listen comm's (rank {rank})"),
        ));
    }
    let domain = t.caps().domain.clone();
    let comm = Arc::new(Comm::new(rank, t, &addrs, cfg)?);
    let device = OnDevice::new(ptr_support)?;
    log::info!("CollNet comm connected: node {rank} of {} over {domain}; AllReduce/AllGather/ReduceScatter run on fabricoll's engines", addrs.len());
    let id = new_handle(super::handle_dev(listen), Kind::CollComm);
    with(|t| {
        t.comms.insert_at(
            id,
            Arc::new(CollComm {
                comm,
                mrs: Mutex::new(HashMap::new()),
                device,
            }),
        )
    });
    Ok(id)
}

pub fn close_listen(listen: u64) -> Result<()> {
    with(|t| t.listens.remove(listen))
        .map(|_| ())
        .ok_or_else(|| Error::arg("listenComm", "not an open CollNet listen comm"))
}

/// An error unless `id` is an open collective comm.
pub fn check_comm(id: u64) -> Result<()> {
    comm(id).map(|_| ())
}

/// Bytes of this rank's own slice inside a window: what `iallgather` reads from `sendData` and
/// `ireducescatter` writes to `recvData`.
pub fn own_share(id: u64, bytes_per_rank: usize, offset: usize, len: usize) -> Result<usize> {
    let c = comm(id)?;
    let n = c.comm.nranks;
    let (count, woff, wlen) = window(bytes_per_rank, offset, len, n, 1)?;
    Ok(Problem::new(Collective::AllGather, n, count)
        .with_window(woff, wlen)
        .slice(c.comm.rank)
        .1)
}

fn comm(id: u64) -> Result<Arc<CollComm>> {
    with(|t| t.comms.get(id).cloned()).ok_or_else(|| {
        Error::arg(
            "collComm",
            format!("{id:#x} is not an open collective comm"),
        )
    })
}

/// Close a collective comm; its pending operations are aborted.
pub fn close_coll(id: u64) -> Result<()> {
    let c = with(|t| {
        let c = t.comms.remove(id)?;
        t.requests.retain(|_, r| !Arc::ptr_eq(&r.comm, &c));
        Some(c)
    })
    .ok_or_else(|| {
        Error::arg(
            "collComm",
            format!("{id:#x} is not an open collective comm"),
        )
    })?;
    if let Some(d) = &c.device {
        c.comm.abort();
        d.shutdown(&c.comm);
    } else if c.comm.pending() > 0 {
        c.comm.abort();
    }
    if c.comm.had_failures() {
        // Operations to a failed peer may still be pending in the provider, and closing an rxm
        // endpoint in that state crashed inside libfabric 1.17 (the CollNet kill test). After a
        // failure NCCL aborts anyway: keep the endpoint and its memory instead of closing them.
        log::warn!("closeColl after a failure: the comm's endpoint is left open (not closed) to stay clear of the provider");
        std::mem::forget(c);
    }
    Ok(())
}

/// CollNet's properties of device `dev`: the net plugin's, taking CUDA memory only where the
/// net device does (`collnet_device`). Borrowed from the device, which keeps them (`props_of`):
/// the name pointer NCCL receives must outlive the call.
pub fn props(p: &Plugin, dev: i32) -> Result<&super::DeviceProps> {
    Ok(&p.device(dev)?.collnet_props)
}

/// What CollNet advertises for a net device of `props`.
pub fn props_of(props: &super::DeviceProps) -> super::DeviceProps {
    let mut props = props.clone();
    props.ptr_support = on_device::ptr_support(props.ptr_support);
    props
}

pub fn reg_mr(id: u64, region: Region, ptr_type: i32) -> Result<u64> {
    let c = comm(id)?;
    match ptr_type {
        NCCL_PTR_HOST => {}
        NCCL_PTR_CUDA if c.device.is_some() => {}
        NCCL_PTR_CUDA => {
            return Err(Error::arg(
                "type",
                "NCCL_PTR_CUDA: this CollNet device takes host memory only (its ptrSupport is \
                 NCCL_PTR_HOST: the net device took no CUDA buffer)",
            ))
        }
        _ => {
            return Err(Error::arg(
                "type",
                format!("{ptr_type} is neither NCCL_PTR_HOST (1) nor NCCL_PTR_CUDA (2)"),
            ))
        }
    }
    let h = new_handle(super::handle_dev(id), Kind::CollMr);
    c.mrs.lock().insert(h, region);
    Ok(h)
}

pub fn dereg_mr(id: u64, mh: u64) -> Result<()> {
    comm(id)?
        .mrs
        .lock()
        .remove(&mh)
        .map(|_| ())
        .ok_or_else(|| Error::arg("mhandle", "not a registration of this collective comm"))
}

fn start(
    c: Arc<CollComm>,
    call: Call,
    bytes: usize,
    staging: Option<Scratch>,
    scatter: Option<Scatter>,
) -> Result<u64> {
    if let Some(d) = &c.device {
        // Device calls start their slices as they go: the host call starts after all of them,
        // as on every rank (the C API's rule for a host call after device calls).
        d.settle(&c.comm, &call.kind)?;
    }
    let id = Op::Host(c.comm.start(&call)?);
    request(c, id, bytes, staging, scatter)
}

/// Starts a device call on `c` where `p`'s buffers hold device memory: its request, or None
/// (host memory only, or a comm without device calls).
///
/// # Safety
/// NCCL keeps the buffers valid until `test` reports the request done.
unsafe fn start_on_device(
    c: &Arc<CollComm>,
    p: &crate::coll::device::Parts,
    spec: Option<&crate::algo::varied::Spec>,
    bytes: usize,
) -> Result<Option<u64>> {
    let Some(d) = &c.device else {
        return Ok(None);
    };
    // SAFETY: forwarded from this function's contract.
    match unsafe { d.start(&c.comm, p, spec) }? {
        Some(id) => request(c.clone(), Op::Device(id), bytes, None, None).map(Some),
        None => Ok(None),
    }
}

fn request(
    c: Arc<CollComm>,
    id: Op,
    bytes: usize,
    staging: Option<Scratch>,
    scatter: Option<Scatter>,
) -> Result<u64> {
    let h = new_handle(0, Kind::CollRequest);
    with(|t| {
        t.requests.insert_at(
            h,
            Request {
                comm: c,
                id,
                bytes,
                staging,
                scatter,
            },
        )
    });
    Ok(h)
}

pub fn iallreduce(
    id: u64,
    send: Region,
    recv: Region,
    count: usize,
    dt: i32,
    op: i32,
) -> Result<u64> {
    let (dt, op) = (dtype(dt)?, redop(op)?);
    let c = comm(id)?;
    check_max(count.checked_mul(dt.size()))?;
    let p = on_device::allreduce(&send, &recv, count, dt, op);
    // SAFETY: NCCL keeps both buffers valid until `test` reports the request done.
    if let Some(h) = unsafe { start_on_device(&c, &p, None, count * dt.size()) }? {
        return Ok(h);
    }
    let call = Call {
        kind: coll::Kind::Coll(Collective::AllReduce),
        send,
        recv,
        count,
        dtype: dt,
        op,
        root: 0,
        algo: None,
    };
    start(c, call, count * dt.size(), None, None)
}

fn check_max(bytes: Option<usize>) -> Result<usize> {
    match bytes {
        Some(b) if b <= super::MAX_COLL_BYTES => Ok(b),
        _ => Err(Error::arg(
            "count",
            format!("more than maxCollBytes ({})", super::MAX_COLL_BYTES),
        )),
    }
}

fn window(
    bytes_per_rank: usize,
    offset: usize,
    len: usize,
    nranks: usize,
    elem: usize,
) -> Result<(usize, usize, usize)> {
    if !bytes_per_rank.is_multiple_of(elem)
        || !offset.is_multiple_of(elem)
        || !len.is_multiple_of(elem)
    {
        return Err(Error::arg("bytesPerRank", format!("bytesPerRank, windowOffset and windowBytes must be multiples of the element size ({elem})")));
    }
    let total = bytes_per_rank
        .checked_mul(nranks)
        .ok_or_else(|| Error::arg("bytesPerRank", "overflows"))?;
    if offset.checked_add(len).is_none_or(|e| e > total) {
        return Err(Error::arg(
            "windowOffset",
            format!("window [{offset}, +{len}) is outside the {total}-byte buffer"),
        ));
    }
    check_max(Some(len))?;
    Ok((bytes_per_rank / elem, offset / elem, len / elem))
}

/// `iallgather`: `parts` receive the window's bytes in order; `send` is this rank's part of
/// its own slice inside the window.
pub fn iallgather(
    id: u64,
    send_ptr: Option<Region>,
    parts: Vec<Region>,
    bytes_per_rank: usize,
    offset: usize,
    len: usize,
) -> Result<u64> {
    let c = comm(id)?;
    let n = c.comm.nranks;
    let (count, woff, wlen) = window(bytes_per_rank, offset, len, n, 1)?;
    let p = Problem::new(Collective::AllGather, n, count).with_window(woff, wlen);
    let mine = p.slice(c.comm.rank).1;
    let send = match send_ptr {
        Some(r) => r
            .sub(0, mine)
            .ok_or_else(|| Error::arg("sendData", "shorter than this rank's part of the window"))?,
        None if mine == 0 => Region::empty(),
        None => {
            return Err(Error::arg(
                "sendData",
                "NULL, but this rank's slice is in the window",
            ))
        }
    };
    if parts.is_empty() {
        return Err(Error::arg("nRecvParts", "no parts"));
    }
    if parts.iter().map(|r| r.len()).sum::<usize>() != len {
        return Err(Error::arg(
            "recvParts",
            format!(
                "their sizes add up to {} bytes, not windowBytes ({len})",
                parts.iter().map(|r| r.len()).sum::<usize>()
            ),
        ));
    }
    if let Some(d) = &c.device {
        if parts.len() == 1 {
            let (p, spec) = on_device::window(
                Collective::AllGather,
                &send,
                &parts[0],
                (n, count),
                (woff, wlen),
                DataType::Uint8,
                RedOp::Sum,
            );
            // SAFETY: NCCL keeps the buffers valid until `test` reports the request done.
            if let Some(h) = unsafe { start_on_device(&c, &p, Some(&spec), len) }? {
                return Ok(h);
            }
        } else if d.any_on_device(std::iter::once(&send).chain(&parts))? {
            return Err(on_device::several_parts("recvParts"));
        }
    }
    let (recv, scatter) = if parts.len() == 1 {
        (parts[0], None)
    } else {
        let staging = Scratch::new(len);
        // SAFETY: the request owns `staging` until `test` reports it done (or the comm drops
        // it after draining), so the region never outlives it.
        let region = unsafe { staging.region() };
        (region, Some(Scatter { staging, parts }))
    };
    let call = Call {
        kind: coll::Kind::Window {
            coll: Collective::AllGather,
            offset: woff,
            len: wlen,
        },
        send,
        recv,
        count,
        dtype: DataType::Uint8,
        op: RedOp::Sum,
        root: 0,
        algo: None,
    };
    start(c, call, len, None, scatter)
}

/// `ireducescatter`: `parts` hold the window's bytes of this rank's input, in order; `recv`
/// gets the reduction of this rank's slice inside the window.
#[allow(clippy::too_many_arguments)]
pub fn ireducescatter(
    id: u64,
    parts: Vec<Region>,
    recv_ptr: Option<Region>,
    bytes_per_rank: usize,
    offset: usize,
    len: usize,
    dt: i32,
    op: i32,
) -> Result<u64> {
    let (dt, op) = (dtype(dt)?, redop(op)?);
    let c = comm(id)?;
    let n = c.comm.nranks;
    let el = dt.size();
    let (count, woff, wlen) = window(bytes_per_rank, offset, len, n, el)?;
    let p = Problem::new(Collective::ReduceScatter, n, count).with_window(woff, wlen);
    let mine = p.slice(c.comm.rank).1 * el;
    let recv = match recv_ptr {
        Some(r) => r
            .sub(0, mine)
            .ok_or_else(|| Error::arg("recvData", "shorter than this rank's part of the window"))?,
        None if mine == 0 => Region::empty(),
        None => {
            return Err(Error::arg(
                "recvData",
                "NULL, but this rank's slice is in the window",
            ))
        }
    };
    if parts.is_empty() {
        return Err(Error::arg("nSendParts", "no parts"));
    }
    if parts.iter().map(|r| r.len()).sum::<usize>() != len {
        return Err(Error::arg(
            "sendParts",
            "their sizes do not add up to windowBytes",
        ));
    }
    if let Some(d) = &c.device {
        if parts.len() == 1 {
            let (p, spec) = on_device::window(
                Collective::ReduceScatter,
                &parts[0],
                &recv,
                (n, count),
                (woff, wlen),
                dt,
                op,
            );
            // SAFETY: NCCL keeps the buffers valid until `test` reports the request done.
            if let Some(h) = unsafe { start_on_device(&c, &p, Some(&spec), mine) }? {
                return Ok(h);
            }
        } else if d.any_on_device(std::iter::once(&recv).chain(&parts))? {
            return Err(on_device::several_parts("sendParts"));
        }
    }
    let (send, staging) = if parts.len() == 1 {
        (parts[0], None)
    } else {
        let mut staging = Scratch::new(len);
        let mut at = 0;
        for part in &parts {
            part.with(|p| staging.bytes_mut()[at..at + p.len()].copy_from_slice(p));
            at += part.len();
        }
        // SAFETY: the request owns `staging` until `test` reports it done (or the comm drops
        // it after draining), so the region never outlives it.
        let region = unsafe { staging.region() };
        (region, Some(staging))
    };
    let call = Call {
        kind: coll::Kind::Window {
            coll: Collective::ReduceScatter,
            offset: woff,
            len: wlen,
        },
        send,
        recv,
        count,
        dtype: dt,
        op,
        root: 0,
        algo: None,
    };
    start(c, call, mine, staging, None)
}

/// Poll a request: `Some(bytes)` when done (the request is then gone).
pub fn test(req: u64) -> Result<Option<usize>> {
    let (c, id) = with(|t| t.requests.get(req).map(|r| (r.comm.clone(), r.id)))
        .ok_or_else(|| Error::arg("request", "not a pending CollNet request"))?;
    let r = match (id, &c.device) {
        (Op::Host(id), _) => c.comm.test(id),
        (Op::Device(id), Some(d)) => d.test(&c.comm, id),
        (Op::Device(_), None) => Err(Error::Internal(
            "a device request on a comm without device calls".into(),
        )),
    };
    if matches!(r, Ok(false)) {
        return Ok(None);
    }
    let done = with(|t| t.requests.remove(req))
        .ok_or_else(|| Error::Internal("request vanished".into()))?;
    r?;
    if let Some(s) = &done.scatter {
        let mut at = 0;
        for part in &s.parts {
            part.write(&s.staging.bytes()[at..at + part.len()]);
            at += part.len();
        }
    }
    drop(done.staging);
    Ok(Some(done.bytes))
}

/// Live objects, for leak checks: (listens, comms, requests).
pub fn live() -> (usize, usize, usize) {
    with(|t| (t.listens.len(), t.comms.len(), t.requests.len()))
}

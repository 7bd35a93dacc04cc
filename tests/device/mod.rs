//! What the device C API tests share (the emulated device in CI, the GPU in
//! `device_capi_gpu`): buffers on the device or the host, the inputs and the expected results
//! of every collective and send/recv, and the matrix that runs them on `n` ranks.
#![allow(dead_code)] // not every test binary uses each helper
use crate::capi::{comm, last_error, ranks, shm_config};
use nccl_net_fabricoll::coll::device::{install, install_on_thread};
use nccl_net_fabricoll::device::{Device, DeviceBuffer, EmuConfig, HostBuffer, Stream};
use nccl_net_fabricoll::ffi::api::*;
use std::os::raw::{c_int, c_void};
use std::sync::{Barrier, OnceLock};
use std::time::Duration;

use fabricoll_status::*;

pub mod compressed;
pub mod direct;
pub mod stream_ordered;

/// How long a test waits for a stream.
pub const WAIT: Duration = Duration::from_secs(20);

/// The element types of the matrix: integer values small enough to be exact in each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    F32,
    I32,
    F64,
}

impl Ty {
    pub fn size(self) -> usize {
        match self {
            Ty::F32 | Ty::I32 => 4,
            Ty::F64 => 8,
        }
    }

    pub fn c(self) -> c_int {
        (match self {
            Ty::F32 => fabricoll_datatype::FABRICOLL_FLOAT32,
            Ty::I32 => fabricoll_datatype::FABRICOLL_INT32,
            Ty::F64 => fabricoll_datatype::FABRICOLL_FLOAT64,
        }) as c_int
    }

    pub fn encode(self, v: &[i64]) -> Vec<u8> {
        let mut out = Vec::with_capacity(v.len() * self.size());
        for &x in v {
            match self {
                Ty::F32 => out.extend_from_slice(&(x as f32).to_ne_bytes()),
                Ty::I32 => out.extend_from_slice(&(x as i32).to_ne_bytes()),
                Ty::F64 => out.extend_from_slice(&(x as f64).to_ne_bytes()),
            }
        }
        out
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Sum,
    Max,
    Min,
}

impl Op {
    pub fn c(self) -> c_int {
        (match self {
            Op::Sum => fabricoll_redop::FABRICOLL_SUM,
            Op::Max => fabricoll_redop::FABRICOLL_MAX,
            Op::Min => fabricoll_redop::FABRICOLL_MIN,
        }) as c_int
    }

    fn apply(self, a: i64, b: i64) -> i64 {
        match self {
            Op::Sum => a + b,
            Op::Max => a.max(b),
            Op::Min => a.min(b),
        }
    }
}

/// The calls of the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    /// Rank r sends to r+1 and receives from r-1: blocking or stream-ordered, rank 0 sends
    /// first and the others receive first (a chain); non-blocking or grouped, every rank sends
    /// first (which needs the two to progress together once a message needs a rendezvous).
    SendRecv,
    /// SendRecv with tag 7 (fabricoll_send_tagged / fabricoll_recv_tagged).
    Tagged,
    Gather,
    Scatter,
    /// Rank r's block has `uneven(count, n, r)` elements (some empty), packed.
    AllGatherV,
    ReduceScatterV,
}

/// Every call of the C API that takes device buffers.
pub const ALL_COLLS: [Coll; 12] = [
    Coll::AllReduce,
    Coll::AllGather,
    Coll::ReduceScatter,
    Coll::Broadcast,
    Coll::Reduce,
    Coll::AllToAll,
    Coll::SendRecv,
    Coll::Tagged,
    Coll::Gather,
    Coll::Scatter,
    Coll::AllGatherV,
    Coll::ReduceScatterV,
];

/// The calls of the full matrix (every type, place and count): the collectives and untagged
/// send/recv. The others run in `matrix_modes`. Every call has a stream-ordered form.
pub const COLLS: &[Coll] = ALL_COLLS.split_at(7).0;

/// How the calls are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Blocking,
    /// `fabricoll_<op>_stream` on the rank's stream, synchronised after.
    Stream,
    /// `fabricoll_i<op>`, every call started before any is waited for.
    NonBlocking,
    /// The blocking calls between fabricoll_group_start and fabricoll_group_end.
    Grouped,
}

/// Rank r's count of the uneven collectives: some blocks empty, the last `count`.
pub fn uneven(count: usize, n: usize, r: usize) -> usize {
    count * (r + 1) / n
}

/// Where a buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Device,
    /// Pageable host memory.
    Host,
    /// Page-locked host memory from the device.
    Pinned,
}

/// A buffer of the test.
pub enum Buf {
    Device(DeviceBuffer),
    Host(Vec<u8>),
    Pinned(HostBuffer),
}

impl Buf {
    /// `bytes` in a new buffer at `place` (uploaded through `s` on the device).
    pub fn new(dev: &Device, s: &Stream, place: Place, bytes: &[u8]) -> Buf {
        let len = bytes.len().max(1);
        match place {
            Place::Host => {
                let mut v = bytes.to_vec();
                v.resize(len, 0);
                Buf::Host(v)
            }
            Place::Device => {
                let b = dev.alloc(len).expect("device alloc");
                let mut full = bytes.to_vec();
                full.resize(len, 0);
                s.upload(&b.span(), &full, WAIT).expect("upload");
                Buf::Device(b)
            }
            Place::Pinned => {
                let mut b = dev.alloc_host(len).expect("host alloc");
                let m = b.as_mut_slice().expect("idle");
                m.fill(0);
                m[..bytes.len()].copy_from_slice(bytes);
                Buf::Pinned(b)
            }
        }
    }

    pub fn ptr(&mut self) -> *mut c_void {
        match self {
            Buf::Device(b) => b.addr() as *mut c_void,
            Buf::Host(v) => v.as_mut_ptr().cast(),
            Buf::Pinned(b) => b.as_ptr().cast(),
        }
    }

    /// The first `len` bytes (downloaded through `s` from the device).
    pub fn read(&mut self, s: &Stream, len: usize) -> Vec<u8> {
        match self {
            Buf::Device(b) => {
                let mut v = vec![0u8; b.len()];
                s.download(&mut v, &b.span(), WAIT).expect("download");
                v.truncate(len);
                v
            }
            Buf::Host(v) => v[..len].to_vec(),
            Buf::Pinned(b) => b.as_mut_slice().expect("idle")[..len].to_vec(),
        }
    }
}

/// The tests share the device, and page-locked allocations and frees wait for every stream of
/// it (as on the CUDA driver): a test allocating while another's stream waits for a flag
/// would wait for that test. So they run one at a time.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The emulated device, installed once for the process. Its ranks are threads sharing its
/// context, whose streams all share its hardware queues: 32 of them, as scripts/gpu-tests.sh
/// sets CUDA_DEVICE_MAX_CONNECTIONS for ranks as threads (docs/device-calls.md, "Hardware
/// queues").
pub fn dev() -> Device {
    static DEV: OnceLock<Device> = OnceLock::new();
    DEV.get_or_init(|| {
        let d = Device::emulated(EmuConfig {
            max_delay: Duration::from_micros(50),
            queues: 32,
            ..EmuConfig::default()
        })
        .expect("emulated device");
        install(d.clone());
        d
    })
    .clone()
}

/// Element `i` of rank `r`'s input.
pub fn value(r: usize, i: usize) -> i64 {
    ((i * 7 + r * 13) % 50) as i64 - 10
}

/// One rank's input (element count) and expected output of `coll` on `n` ranks, `count`
/// elements per block; None: that side is NULL on this rank.
pub fn expected(
    coll: Coll,
    op: Op,
    n: usize,
    me: usize,
    count: usize,
) -> (Vec<i64>, Option<Vec<i64>>) {
    let root = 1 % n;
    let input = |r: usize, len: usize| (0..len).map(|i| value(r, i)).collect::<Vec<i64>>();
    let reduce = |j: usize| (1..n).fold(value(0, j), |a, r| op.apply(a, value(r, j)));
    match coll {
        Coll::AllReduce => (input(me, count), Some((0..count).map(reduce).collect())),
        Coll::Reduce => (
            input(me, count),
            (me == root).then(|| (0..count).map(reduce).collect()),
        ),
        Coll::Broadcast => (input(me, count), Some(input(root, count))),
        Coll::AllGather => (
            input(me, count),
            Some((0..n).flat_map(|r| input(r, count)).collect()),
        ),
        Coll::ReduceScatter => (
            input(me, n * count),
            Some((0..count).map(|i| reduce(me * count + i)).collect()),
        ),
        Coll::AllToAll => (
            input(me, n * count),
            Some(
                (0..n)
                    .flat_map(|r| (0..count).map(move |i| value(r, me * count + i)))
                    .collect(),
            ),
        ),
        Coll::SendRecv | Coll::Tagged => (input(me, count), Some(input((me + n - 1) % n, count))),
        Coll::Gather => (
            input(me, count),
            (me == root).then(|| (0..n).flat_map(|r| input(r, count)).collect()),
        ),
        Coll::Scatter => (
            input(me, n * count),
            Some((0..count).map(|i| value(root, me * count + i)).collect()),
        ),
        Coll::AllGatherV => (
            input(me, uneven(count, n, me)),
            Some((0..n).flat_map(|r| input(r, uneven(count, n, r))).collect()),
        ),
        Coll::ReduceScatterV => {
            let total = (0..n).map(|r| uneven(count, n, r)).sum();
            let off: usize = (0..me).map(|r| uneven(count, n, r)).sum();
            (
                input(me, total),
                Some((0..uneven(count, n, me)).map(|i| reduce(off + i)).collect()),
            )
        }
    }
}

/// Runs `coll` on rank `me` of `n` (communicator `c`) in `mode` (stream-ordered: on
/// `stream`, which the caller synchronises). The statuses of the calls (two for send/recv, and
/// the waits or the group's end).
#[allow(clippy::too_many_arguments)]
pub fn call(
    c: usize,
    coll: Coll,
    ty: Ty,
    op: Op,
    n: usize,
    me: usize,
    count: usize,
    send: *mut c_void,
    recv: *mut c_void,
    mode: Mode,
    stream: *mut c_void,
) -> Vec<fabricoll_status> {
    let (dt, o, root) = (ty.c(), op.c(), (1 % n) as c_int);
    let cm = comm(c);
    let s = stream;
    let counts: Vec<usize> = (0..n).map(|r| uneven(count, n, r)).collect();
    let cp = counts.as_ptr();
    let (to, from) = (((me + 1) % n) as c_int, ((me + n - 1) % n) as c_int);
    let mut reqs: Vec<*mut fabricoll_request> = Vec::new();
    // Call `which` (0: the call, or the send; 1: the receive) in the mode.
    let mut one = |which: usize| -> fabricoll_status {
        let mut req = std::ptr::null_mut();
        let r = &mut req;
        macro_rules! pick {
            ($blocking:expr, $nb:expr, $stream:expr) => {
                match mode {
                    Mode::Blocking | Mode::Grouped => $blocking,
                    Mode::NonBlocking => $nb,
                    Mode::Stream => $stream,
                }
            };
        }
        let st = match (coll, which) {
            (Coll::AllReduce, _) => pick!(
                fabricoll_allreduce(send, recv, count, dt, o, cm),
                fabricoll_iallreduce(send, recv, count, dt, o, cm, r),
                fabricoll_allreduce_stream(send, recv, count, dt, o, cm, s)
            ),
            (Coll::AllGather, _) => pick!(
                fabricoll_allgather(send, recv, count, dt, cm),
                fabricoll_iallgather(send, recv, count, dt, cm, r),
                fabricoll_allgather_stream(send, recv, count, dt, cm, s)
            ),
            (Coll::ReduceScatter, _) => pick!(
                fabricoll_reducescatter(send, recv, count, dt, o, cm),
                fabricoll_ireducescatter(send, recv, count, dt, o, cm, r),
                fabricoll_reducescatter_stream(send, recv, count, dt, o, cm, s)
            ),
            (Coll::Broadcast, _) => pick!(
                fabricoll_broadcast(send, recv, count, dt, root, cm),
                fabricoll_ibroadcast(send, recv, count, dt, root, cm, r),
                fabricoll_broadcast_stream(send, recv, count, dt, root, cm, s)
            ),
            (Coll::Reduce, _) => pick!(
                fabricoll_reduce(send, recv, count, dt, o, root, cm),
                fabricoll_ireduce(send, recv, count, dt, o, root, cm, r),
                fabricoll_reduce_stream(send, recv, count, dt, o, root, cm, s)
            ),
            (Coll::AllToAll, _) => pick!(
                fabricoll_alltoall(send, recv, count, dt, cm),
                fabricoll_ialltoall(send, recv, count, dt, cm, r),
                fabricoll_alltoall_stream(send, recv, count, dt, cm, s)
            ),
            (Coll::SendRecv, 0) => pick!(
                fabricoll_send(send, count, dt, to, cm),
                fabricoll_isend(send, count, dt, to, cm, r),
                fabricoll_send_stream(send, count, dt, to, cm, s)
            ),
            (Coll::SendRecv, _) => pick!(
                fabricoll_recv(recv, count, dt, from, cm),
                fabricoll_irecv(recv, count, dt, from, cm, r),
                fabricoll_recv_stream(recv, count, dt, from, cm, s)
            ),
            (Coll::Tagged, 0) => pick!(
                fabricoll_send_tagged(send, count, dt, to, 7, cm),
                fabricoll_isend_tagged(send, count, dt, to, 7, cm, r),
                fabricoll_send_tagged_stream(send, count, dt, to, 7, cm, s)
            ),
            (Coll::Tagged, _) => pick!(
                fabricoll_recv_tagged(recv, count, dt, from, 7, cm),
                fabricoll_irecv_tagged(recv, count, dt, from, 7, cm, r),
                fabricoll_recv_tagged_stream(recv, count, dt, from, 7, cm, s)
            ),
            (Coll::Gather, _) => pick!(
                fabricoll_gather(send, recv, count, dt, root, cm),
                fabricoll_igather(send, recv, count, dt, root, cm, r),
                fabricoll_gather_stream(send, recv, count, dt, root, cm, s)
            ),
            (Coll::Scatter, _) => pick!(
                fabricoll_scatter(send, recv, count, dt, root, cm),
                fabricoll_iscatter(send, recv, count, dt, root, cm, r),
                fabricoll_scatter_stream(send, recv, count, dt, root, cm, s)
            ),
            (Coll::AllGatherV, _) => {
                let mine = counts[me];
                pick!(
                    fabricoll_allgatherv(send, mine, recv, cp, std::ptr::null(), dt, cm),
                    fabricoll_iallgatherv(send, mine, recv, cp, std::ptr::null(), dt, cm, r),
                    fabricoll_allgatherv_stream(send, mine, recv, cp, std::ptr::null(), dt, cm, s)
                )
            }
            (Coll::ReduceScatterV, _) => pick!(
                fabricoll_reducescatterv(send, recv, cp, dt, o, cm),
                fabricoll_ireducescatterv(send, recv, cp, dt, o, cm, r),
                fabricoll_reducescatterv_stream(send, recv, cp, dt, o, cm, s)
            ),
        };
        if !req.is_null() {
            reqs.push(req);
        }
        st
    };
    let p2p = matches!(coll, Coll::SendRecv | Coll::Tagged);
    let order: &[usize] = match (p2p, mode) {
        (false, _) => &[0],
        (true, Mode::NonBlocking | Mode::Grouped) => &[0, 1],
        (true, _) if me == 0 => &[0, 1],
        (true, _) => &[1, 0],
    };
    let mut sts = Vec::new();
    if mode == Mode::Grouped {
        assert_eq!(fabricoll_group_start(), FABRICOLL_SUCCESS);
    }
    for &w in order {
        sts.push(one(w));
    }
    if mode == Mode::Grouped {
        sts.push(fabricoll_group_end());
    }
    for r in reqs {
        sts.push(fabricoll_wait(r));
    }
    sts
}

/// One case of the matrix on every rank (`comms`, threads): each rank's buffers at
/// `places` (send, recv), the calls made in `mode`; panics with the case on a wrong result.
/// `devs`: one device that every rank shares, or one per rank (rank r on `devs[r]`, installed
/// for its thread with `install_on_thread`, as ranks that are processes each have their own).
#[allow(clippy::too_many_arguments)]
pub fn run_case(
    devs: &[Device],
    comms: &[usize],
    coll: Coll,
    ty: Ty,
    op: Op,
    count: usize,
    places: (Place, Place),
    mode: Mode,
) {
    let n = comms.len();
    assert!(
        devs.len() == 1 || devs.len() == n,
        "one device, or one per rank"
    );
    let stream = mode == Mode::Stream;
    // Page-locked allocations and frees (pinned buffers, uploads and downloads) wait for every
    // stream of the device: no rank makes one while another's stream may wait for a call.
    let step = std::sync::Barrier::new(n);
    std::thread::scope(|sc| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(me, &c)| {
                let dev = devs[me % devs.len()].clone();
                let own = devs.len() > 1;
                let step = &step;
                sc.spawn(move || {
                    dev.bind().expect("bind");
                    if own {
                        install_on_thread(Some(dev.clone()));
                    }
                    let s = dev.create_stream().expect("stream");
                    let (input, want) = expected(coll, op, n, me, count);
                    let mut send = Buf::new(&dev, &s, places.0, &ty.encode(&input));
                    let out_len = want.as_ref().map_or(0, |w| w.len()) * ty.size();
                    let mut recv = want
                        .as_ref()
                        .map(|w| Buf::new(&dev, &s, places.1, &vec![0xA5; w.len() * ty.size()]));
                    let rp = recv.as_mut().map_or(std::ptr::null_mut(), |b| b.ptr());
                    let handle = if stream {
                        s.handle()
                    } else {
                        std::ptr::null_mut()
                    };
                    let case = format!(
                        "{coll:?} {ty:?} {op:?} n={n} rank {me} count={count} {places:?} {mode:?}"
                    );
                    trace(&case, "starts");
                    step.wait();
                    let sts = call(c, coll, ty, op, n, me, count, send.ptr(), rp, mode, handle);
                    let errors: Vec<String> = sts
                        .iter()
                        .filter(|&&st| st != FABRICOLL_SUCCESS)
                        .map(|st| format!("status {st:?}: {}", last_error()))
                        .collect();
                    trace(&case, "returned");
                    let synced = (stream && errors.is_empty()).then(|| {
                        s.synchronize(WAIT)?;
                        let mut e = FABRICOLL_SUCCESS;
                        let got = fabricoll_comm_get_async_error(comm(c), &mut e);
                        Ok::<_, nccl_net_fabricoll::Error>((got, e, last_error()))
                    });
                    trace(&case, &format!("called and synchronised: {errors:?}"));
                    // Asserted after the step, so that a failing rank does not leave the
                    // others waiting at it.
                    step.wait();
                    assert!(errors.is_empty(), "{case}: {errors:?}");
                    if let Some(r) = synced {
                        let (got, e, msg) = r.expect("synchronize");
                        assert_eq!(got, FABRICOLL_SUCCESS);
                        assert_eq!(e, FABRICOLL_SUCCESS, "{case}: {msg}");
                    }
                    if let (Some(w), Some(b)) = (want, recv.as_mut()) {
                        assert!(b.read(&s, out_len) == ty.encode(&w), "{case}: wrong result");
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().expect("rank panicked");
        }
    });
}

/// With `FABRICOLL_TEST_TRACE` set, prints where a rank is in a case (stderr, with the time):
/// the last line of each rank names the case a hang is in.
pub fn trace(case: &str, what: &str) {
    if std::env::var_os("FABRICOLL_TEST_TRACE").is_some() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        eprintln!("[{}.{:06}] {case}: {what}", t.as_secs(), t.subsec_micros());
    }
}

/// The tests' config: shm, with a timeout long enough for a loaded machine (the calls that are
/// meant to fail set their own).
pub fn config() -> fabricoll_config {
    let mut c = shm_config();
    c.timeout_ms = 10_000;
    c
}

pub fn destroy(cs: &[usize]) {
    for &c in cs {
        assert_eq!(fabricoll_comm_destroy(comm(c)), FABRICOLL_SUCCESS);
    }
}

/// The matrix on `n` ranks (threads over shm): every call, three (type, op) pairs, the buffer
/// placements that apply (pageable host buffers only blocking, page-locked ones only
/// stream-ordered), counts 0, 1, 1000, and one call of several slices each.
pub fn matrix(d: &Device, test: &str, n: usize, stream: bool) {
    let ds = std::slice::from_ref(d);
    let mode = if stream { Mode::Stream } else { Mode::Blocking };
    let Some(cs) = ranks(test, &config(), n) else {
        return;
    };
    let places = [
        (Place::Device, Place::Device),
        (Place::Host, Place::Device),
        (Place::Device, Place::Host),
        (Place::Pinned, Place::Device),
    ];
    let types = [(Ty::F32, Op::Sum), (Ty::I32, Op::Max), (Ty::F64, Op::Min)];
    for &coll in COLLS {
        for (ty, op) in types {
            for p in places {
                let skip = if stream {
                    p.0 == Place::Host || p.1 == Place::Host
                } else {
                    p.0 == Place::Pinned
                };
                if skip {
                    continue;
                }
                for count in [0, 1, 1000] {
                    run_case(ds, &cs, coll, ty, op, count, p, mode);
                }
            }
        }
        // Several slices in flight (1 MiB per block each).
        let dd = (Place::Device, Place::Device);
        run_case(ds, &cs, coll, Ty::F32, Op::Sum, 700_001, dd, mode);
    }
    destroy(&cs);
}

/// The calls `colls` in each of `modes` (those a call has) on `n` ranks: device, mixed
/// device and pageable host, and host only buffers, counts 1 and 1000 (types and ops in
/// turn; only device buffers and 1000 where not `full`), and one call of two slices per block
/// on device buffers (a rendezvous on the fabric, so a send and a receive that both ranks
/// start send first must progress together).
pub fn matrix_modes(d: &Device, test: &str, n: usize, colls: &[Coll], modes: &[Mode], full: bool) {
    let ds = std::slice::from_ref(d);
    let Some(cs) = ranks(test, &config(), n) else {
        return;
    };
    let types = [(Ty::F32, Op::Sum), (Ty::I32, Op::Max), (Ty::F64, Op::Min)];
    let dd = (Place::Device, Place::Device);
    let places = [
        dd,
        (Place::Host, Place::Device),
        (Place::Device, Place::Host),
    ];
    for (i, &coll) in colls.iter().enumerate() {
        for &mode in modes {
            for (j, &p) in places.iter().enumerate() {
                if (mode == Mode::Stream || !full) && p != dd {
                    continue;
                }
                for count in [1, 1000] {
                    if !full && count == 1 {
                        continue;
                    }
                    let (ty, op) = types[(i + j + count) % types.len()];
                    run_case(ds, &cs, coll, ty, op, count, p, mode);
                }
            }
            run_case(ds, &cs, coll, Ty::F32, Op::Sum, 300_000, dd, mode);
        }
    }
    destroy(&cs);
}

/// Four and five ranks: every call in every mode it has (two modes per rank count, device
/// buffers only, to keep the time down).
pub fn four_and_five(d: &Device, test: &str) {
    let (a, b) = (
        [Mode::Stream, Mode::NonBlocking],
        [Mode::Blocking, Mode::Grouped],
    );
    matrix_modes(d, test, 4, &ALL_COLLS, &a, false);
    matrix_modes(d, test, 5, &ALL_COLLS, &b, false);
}

/// Runs `rank(me, comm, barrier)` on `n` ranks (threads, each with the device bound), then
/// destroys the communicators.
pub fn on_ranks(d: &Device, test: &str, n: usize, rank: impl Fn(usize, usize, &Barrier) + Sync) {
    on_ranks_with(d, test, &config(), n, rank)
}

/// `on_ranks` with the communicators made from `cfg`.
pub fn on_ranks_with(
    d: &Device,
    test: &str,
    cfg: &fabricoll_config,
    n: usize,
    rank: impl Fn(usize, usize, &Barrier) + Sync,
) {
    let Some(cs) = ranks(test, cfg, n) else {
        return;
    };
    let ready = Barrier::new(n);
    std::thread::scope(|sc| {
        for (me, &c) in cs.iter().enumerate() {
            let (d, ready, rank) = (d.clone(), &ready, &rank);
            sc.spawn(move || {
                d.bind().unwrap();
                rank(me, c, ready)
            });
        }
    });
    destroy(&cs);
}

/// Asserts that no stream-ordered call of `cm` has failed.
pub fn no_async_error(cm: *mut fabricoll_comm) {
    let mut e = FABRICOLL_SUCCESS;
    assert_eq!(
        fabricoll_comm_get_async_error(cm, &mut e),
        FABRICOLL_SUCCESS
    );
    assert_eq!(e, FABRICOLL_SUCCESS, "{}", last_error());
}

/// Each of 3 ranks sends on one stream and receives on another, both stream-ordered, every
/// rank sending first: the two calls progress together (three slices per message, so a
/// rendezvous, and more than a call's two slots: the receive's third slice reuses the slot of
/// its first, released by its own collective, not after the send's), and each stream is
/// released once its own call has ended.
pub fn two_streams(d: &Device, test: &str) {
    let n = 3;
    const COUNT: usize = 700_001;
    on_ranks(d, test, n, |me, c, ready| {
        let (a, b) = (d.create_stream().unwrap(), d.create_stream().unwrap());
        let (input, want) = expected(Coll::SendRecv, Op::Sum, n, me, COUNT);
        let mut send = Buf::new(d, &a, Place::Device, &Ty::F32.encode(&input));
        let mut recv = Buf::new(d, &a, Place::Device, &vec![0u8; COUNT * 4]);
        let (to, from) = ((me + 1) % n, (me + n - 1) % n);
        ready.wait();
        let (f32t, cm) = (Ty::F32.c(), comm(c));
        let st = fabricoll_send_stream(send.ptr(), COUNT, f32t, to as _, cm, a.handle());
        assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
        let st = fabricoll_recv_stream(recv.ptr(), COUNT, f32t, from as _, cm, b.handle());
        assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
        a.synchronize(WAIT).unwrap();
        b.synchronize(WAIT).unwrap();
        no_async_error(cm);
        ready.wait();
        let got = recv.read(&a, COUNT * 4);
        assert!(
            got == Ty::F32.encode(&want.unwrap()),
            "rank {me}: wrong result"
        );
    });
}

/// Host calls made while non-blocking device calls are in flight start after them on every
/// rank: a device allreduce of several slices, then a host allreduce and a host send/recv
/// pair, then the device call's wait; every result is checked.
pub fn host_after_nonblocking(d: &Device, test: &str) {
    let n = 2;
    const BIG: usize = 700_001;
    on_ranks(d, test, n, |me, c, ready| {
        let s = d.create_stream().unwrap();
        let (input, want) = expected(Coll::AllReduce, Op::Sum, n, me, BIG);
        let mut dev_buf = Buf::new(d, &s, Place::Device, &Ty::F32.encode(&input));
        let (f32t, sum, cm) = (Ty::F32.c(), Op::Sum.c(), comm(c));
        ready.wait();
        let mut req = std::ptr::null_mut();
        let p = dev_buf.ptr();
        let st = fabricoll_iallreduce(p, p, BIG, f32t, sum, cm, &mut req);
        assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
        let mut host = vec![(me + 1) as f32; 1000];
        let h = host.as_mut_ptr().cast::<c_void>();
        let st = fabricoll_allreduce(h, h, 1000, f32t, sum, cm);
        assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
        assert!(
            host.iter().all(|&x| x == 3.0),
            "rank {me}: {:?}",
            &host[..4]
        );
        let mut msg = vec![me as f32; 64];
        let m = msg.as_mut_ptr().cast::<c_void>();
        let peer = (1 - me) as _;
        let st = if me == 0 {
            fabricoll_send(m, 64, f32t, peer, cm)
        } else {
            fabricoll_recv(m, 64, f32t, peer, cm)
        };
        assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
        assert!(msg.iter().all(|&x| x == 0.0), "rank {me}");
        assert_eq!(fabricoll_wait(req), FABRICOLL_SUCCESS, "{}", last_error());
        ready.wait();
        let got = dev_buf.read(&s, BIG * 4);
        assert!(
            got == Ty::F32.encode(&want.unwrap()),
            "rank {me}: wrong result"
        );
    });
}

/// A communicator whose first device call is non-blocking and whose next is stream-ordered,
/// with rank 1 late (ranks as threads on one device, as the tests and a GPU shared by threads
/// have them): rank 0's stream must not wait for the stream-ordered call's flag while rank 1
/// still has to allocate its staging, since allocating page-locked memory and creating
/// streams wait for every stream of the context, so rank 1 would wait for rank 0's stream,
/// which waits for the call that needs rank 1 (a deadlock on a GPU; the emulated device
/// fails the allocation, naming it). Rank 1 starts only once rank 0 has made its first call,
/// and a little later, so that rank 0 is inside its stream-ordered call by then.
pub fn nonblocking_then_stream_ordered(d: &Device, test: &str) {
    let n = 2;
    const COUNT: usize = 1000;
    let first_made = std::sync::atomic::AtomicBool::new(false);
    on_ranks(d, test, n, |me, c, ready| {
        let s = d.create_stream().unwrap();
        let (input, want) = expected(Coll::AllReduce, Op::Sum, n, me, COUNT);
        let bytes = Ty::F32.encode(&input);
        let mut a = Buf::new(d, &s, Place::Device, &bytes);
        let mut b = Buf::new(d, &s, Place::Device, &bytes);
        let (f32t, sum, cm) = (Ty::F32.c(), Op::Sum.c(), comm(c));
        ready.wait();
        if me == 1 {
            let start = std::time::Instant::now();
            while !first_made.load(std::sync::atomic::Ordering::SeqCst) {
                assert!(start.elapsed() < WAIT, "rank 0 never made its first call");
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let mut req = std::ptr::null_mut();
        let p = a.ptr();
        let st = fabricoll_iallreduce(p, p, COUNT, f32t, sum, cm, &mut req);
        first_made.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(st, FABRICOLL_SUCCESS, "rank {me}: {}", last_error());
        let q = b.ptr();
        let st = fabricoll_allreduce_stream(q, q, COUNT, f32t, sum, cm, s.handle());
        assert_eq!(st, FABRICOLL_SUCCESS, "rank {me}: {}", last_error());
        assert_eq!(fabricoll_wait(req), FABRICOLL_SUCCESS, "{}", last_error());
        s.synchronize(WAIT).unwrap();
        no_async_error(cm);
        ready.wait();
        let want = Ty::F32.encode(&want.unwrap());
        assert!(
            a.read(&s, COUNT * 4) == want,
            "rank {me}: non-blocking call"
        );
        assert!(
            b.read(&s, COUNT * 4) == want,
            "rank {me}: stream-ordered call"
        );
    });
}

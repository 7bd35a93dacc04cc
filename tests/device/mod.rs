//! What the device C API tests share (the emulated device in CI, the GPU in
//! `device_capi_gpu`): buffers on the device or the host, the inputs and the expected results
//! of every collective and send/recv, and the matrix that runs them on `n` ranks.
#![allow(dead_code)] // not every test binary uses each helper
use crate::capi::{comm, last_error, ranks, shm_config};
use nccl_net_fabricoll::device::{Device, DeviceBuffer, HostBuffer, Stream};
use nccl_net_fabricoll::ffi::api::*;
use std::os::raw::{c_int, c_void};
use std::time::Duration;

use fabricoll_status::*;

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
        v.iter()
            .flat_map(|&x| match self {
                Ty::F32 => (x as f32).to_ne_bytes().to_vec(),
                Ty::I32 => (x as i32).to_ne_bytes().to_vec(),
                Ty::F64 => (x as f64).to_ne_bytes().to_vec(),
            })
            .collect()
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
    /// Rank r sends to r+1 and receives from r-1 (rank 0 sends first, the others receive
    /// first, so the blocking calls form a chain).
    SendRecv,
}

pub const COLLS: [Coll; 7] = [
    Coll::AllReduce,
    Coll::AllGather,
    Coll::ReduceScatter,
    Coll::Broadcast,
    Coll::Reduce,
    Coll::AllToAll,
    Coll::SendRecv,
];

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
        Coll::SendRecv => (input(me, count), Some(input((me + n - 1) % n, count))),
    }
}

/// Runs `coll` on rank `me` of `n` (communicator `c`): blocking, or on `stream` (then the
/// caller synchronises it). The statuses of the calls (two for send/recv).
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
    stream: Option<*mut c_void>,
) -> Vec<fabricoll_status> {
    let (dt, o, root) = (ty.c(), op.c(), (1 % n) as c_int);
    let cm = comm(c);
    let s = stream.unwrap_or(std::ptr::null_mut());
    let st = stream.is_some();
    macro_rules! pick {
        ($blocking:expr, $stream:expr) => {
            if st {
                $stream
            } else {
                $blocking
            }
        };
    }
    match coll {
        Coll::AllReduce => vec![pick!(
            fabricoll_allreduce(send, recv, count, dt, o, cm),
            fabricoll_allreduce_stream(send, recv, count, dt, o, cm, s)
        )],
        Coll::AllGather => vec![pick!(
            fabricoll_allgather(send, recv, count, dt, cm),
            fabricoll_allgather_stream(send, recv, count, dt, cm, s)
        )],
        Coll::ReduceScatter => vec![pick!(
            fabricoll_reducescatter(send, recv, count, dt, o, cm),
            fabricoll_reducescatter_stream(send, recv, count, dt, o, cm, s)
        )],
        Coll::Broadcast => vec![pick!(
            fabricoll_broadcast(send, recv, count, dt, root, cm),
            fabricoll_broadcast_stream(send, recv, count, dt, root, cm, s)
        )],
        Coll::Reduce => vec![pick!(
            fabricoll_reduce(send, recv, count, dt, o, root, cm),
            fabricoll_reduce_stream(send, recv, count, dt, o, root, cm, s)
        )],
        Coll::AllToAll => vec![pick!(
            fabricoll_alltoall(send, recv, count, dt, cm),
            fabricoll_alltoall_stream(send, recv, count, dt, cm, s)
        )],
        Coll::SendRecv => {
            let (to, from) = (((me + 1) % n) as c_int, ((me + n - 1) % n) as c_int);
            let snd = || {
                pick!(
                    fabricoll_send(send, count, dt, to, cm),
                    fabricoll_send_stream(send, count, dt, to, cm, s)
                )
            };
            let rcv = || {
                pick!(
                    fabricoll_recv(recv, count, dt, from, cm),
                    fabricoll_recv_stream(recv, count, dt, from, cm, s)
                )
            };
            if me == 0 {
                vec![snd(), rcv()]
            } else {
                let r = rcv();
                vec![r, snd()]
            }
        }
    }
}

/// One case of the matrix on every rank (`comms`, threads): each rank's buffers at
/// `places` (send, recv), blocking or stream-ordered; panics with the case on a wrong result.
#[allow(clippy::too_many_arguments)]
pub fn run_case(
    dev: &Device,
    comms: &[usize],
    coll: Coll,
    ty: Ty,
    op: Op,
    count: usize,
    places: (Place, Place),
    stream: bool,
) {
    let n = comms.len();
    // Page-locked allocations and frees (pinned buffers, uploads and downloads) wait for every
    // stream of the device: no rank makes one while another's stream may wait for a call.
    let step = std::sync::Barrier::new(n);
    std::thread::scope(|sc| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(me, &c)| {
                let dev = dev.clone();
                let step = &step;
                sc.spawn(move || {
                    dev.bind().expect("bind");
                    let s = dev.create_stream().expect("stream");
                    let (input, want) = expected(coll, op, n, me, count);
                    let mut send = Buf::new(&dev, &s, places.0, &ty.encode(&input));
                    let out_len = want.as_ref().map_or(0, |w| w.len()) * ty.size();
                    let mut recv = want
                        .as_ref()
                        .map(|w| Buf::new(&dev, &s, places.1, &vec![0xA5; w.len() * ty.size()]));
                    let rp = recv.as_mut().map_or(std::ptr::null_mut(), |b| b.ptr());
                    let handle = stream.then(|| s.handle());
                    step.wait();
                    let sts = call(c, coll, ty, op, n, me, count, send.ptr(), rp, handle);
                    let case = format!(
                        "{coll:?} {ty:?} {op:?} n={n} rank {me} count={count} {places:?} \
                         stream={stream}"
                    );
                    let errors: Vec<String> = sts
                        .iter()
                        .filter(|&&st| st != FABRICOLL_SUCCESS)
                        .map(|st| format!("status {st:?}: {}", last_error()))
                        .collect();
                    let synced = (stream && errors.is_empty()).then(|| {
                        s.synchronize(WAIT)?;
                        let mut e = FABRICOLL_SUCCESS;
                        let got = fabricoll_comm_get_async_error(comm(c), &mut e);
                        Ok::<_, nccl_net_fabricoll::Error>((got, e, last_error()))
                    });
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
    for coll in COLLS {
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
                    run_case(d, &cs, coll, ty, op, count, p, stream);
                }
            }
        }
        // Several slices in flight (1 MiB per block each).
        let dd = (Place::Device, Place::Device);
        run_case(d, &cs, coll, Ty::F32, Op::Sum, 700_001, dd, stream);
    }
    destroy(&cs);
}

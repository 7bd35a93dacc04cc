//! What the direct path's tests share (the loopback transport with "FI_HMEM" on the emulated
//! device in `device_direct`, shm on the GPU in `device_capi_gpu`): the calls that go direct,
//! each communicator's count of direct calls, and a case run on device buffers that checks
//! that count, out of place and in place.
use super::*;
use std::os::raw::{c_int, c_void};

/// Each communicator's count of direct calls.
pub fn direct(cs: &[usize]) -> Vec<u64> {
    cs.iter()
        .map(|&c| device_direct_calls(comm(c)).expect("live communicator"))
        .collect()
}

/// The calls the direct path covers (every call but alltoallv, which takes no device
/// buffers), with how many calls each rank makes of each.
pub const DIRECT: [(Coll, u64); 12] = [
    (Coll::AllReduce, 1),
    (Coll::AllGather, 1),
    (Coll::ReduceScatter, 1),
    (Coll::Broadcast, 1),
    (Coll::Reduce, 1),
    (Coll::AllToAll, 1),
    (Coll::SendRecv, 2),
    (Coll::Tagged, 2),
    (Coll::Gather, 1),
    (Coll::Scatter, 1),
    (Coll::AllGatherV, 1),
    (Coll::ReduceScatterV, 1),
];

pub const DD: (Place, Place) = (Place::Device, Place::Device);
pub const HH: (Place, Place) = (Place::Host, Place::Host);

/// Runs `coll` with `ty` and `op` on device buffers and checks that each rank counted `calls`
/// more direct calls (0: staged); blocking, on host buffers too, which must give the same
/// expected bytes.
pub fn case(
    d: &Device,
    cs: &[usize],
    coll: Coll,
    (ty, op): (Ty, Op),
    count: usize,
    mode: Mode,
    calls: u64,
) {
    let before = direct(cs);
    let ds = std::slice::from_ref(d);
    run_case(ds, cs, coll, ty, op, count, DD, mode);
    let what = format!(
        "{coll:?} {ty:?} {op:?} n={} count={count} {mode:?}",
        cs.len()
    );
    counted(cs, &before, calls, &what);
    if mode == Mode::Blocking {
        run_case(ds, cs, coll, ty, op, count, HH, mode);
    }
}

/// Asserts that each of `cs` counted `calls` direct calls more than `before` for `what`.
pub fn counted(cs: &[usize], before: &[u64], calls: u64, what: &str) {
    for (r, (b, a)) in before.iter().zip(direct(cs)).enumerate() {
        assert_eq!(a - b, calls, "{what}: rank {r}'s direct calls");
    }
}

/// Where rank `me`'s input and output lie in its one buffer in place (NCCL's layouts), in
/// elements: None where `coll` has no in-place form here.
fn in_place_offsets(coll: Coll, me: usize, count: usize) -> Option<(usize, usize)> {
    match coll {
        Coll::AllGather => Some((me * count, 0)),
        Coll::ReduceScatter => Some((0, me * count)),
        Coll::Broadcast | Coll::AllToAll | Coll::AllReduce => Some((0, 0)),
        _ => None,
    }
}

/// `coll` in place on `cs`: each rank's one device buffer holds its input where NCCL's
/// in-place layout puts it; the result must be the out-of-place one. `calls`: the direct calls
/// each rank must count.
pub fn in_place(d: &Device, cs: &[usize], coll: Coll, count: usize, calls: u64) {
    let n = cs.len();
    let before = direct(cs);
    each_rank(d, cs, |me, c, s| {
        let d = s.device();
        let (input, want) = expected(coll, Op::Sum, n, me, count);
        let want = want.expect("every rank has an output");
        let (i, o) = in_place_offsets(coll, me, count).expect("in place");
        let mut start = vec![0i64; (i + input.len()).max(o + want.len())];
        start[i..i + input.len()].copy_from_slice(&input);
        let mut buf = Buf::new(d, s, Place::Device, &Ty::F32.encode(&start));
        let base = buf.ptr().cast::<u8>();
        // SAFETY: both offsets lie in the buffer (made to hold input and output).
        let (send, recv) = unsafe { (base.add(i * 4), base.add(o * 4)) };
        let (send, recv) = (send.cast::<c_void>(), recv.cast::<c_void>());
        let (f32t, sum, root) = (Ty::F32.c(), Op::Sum.c(), (1 % n) as c_int);
        let cm = comm(c);
        let st = match coll {
            Coll::AllGather => fabricoll_allgather(send, recv, count, f32t, cm),
            Coll::Broadcast => fabricoll_broadcast(send, recv, count, f32t, root, cm),
            Coll::AllToAll => fabricoll_alltoall(send, recv, count, f32t, cm),
            Coll::AllReduce => fabricoll_allreduce(send, recv, count, f32t, sum, cm),
            Coll::ReduceScatter => fabricoll_reducescatter(send, recv, count, f32t, sum, cm),
            _ => unreachable!("no in-place form here"),
        };
        assert_eq!(st, FABRICOLL_SUCCESS, "{coll:?} in place: {}", last_error());
        let got = buf.read(s, start.len() * 4);
        assert!(
            got[o * 4..(o + want.len()) * 4] == Ty::F32.encode(&want)[..],
            "{coll:?} in place n={n} rank {me}: wrong result"
        );
    });
    counted(cs, &before, calls, &format!("{coll:?} in place n={n}"));
}

/// Runs `f(rank, communicator, stream)` on every rank of `cs` at once, each a thread with the
/// device bound and a stream of its own.
pub fn each_rank(d: &Device, cs: &[usize], f: impl Fn(usize, usize, &Stream) + Sync) {
    std::thread::scope(|sc| {
        for (me, &c) in cs.iter().enumerate() {
            let (d, f) = (d.clone(), &f);
            sc.spawn(move || {
                d.bind().expect("bind");
                f(me, c, &d.create_stream().expect("stream"))
            });
        }
    });
}

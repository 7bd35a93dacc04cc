use super::*;
use crate::error::Error;
use types::{algo, coll, dtype, redop};

/// The committed header must be exactly what cbindgen generates (build.rs writes it to
/// OUT_DIR). Refresh by copying the generated one into include/.
#[test]
fn committed_header_is_current() {
    let generated = include_str!(concat!(env!("OUT_DIR"), "/fabricoll.h"));
    let committed = include_str!("../../../include/fabricoll.h");
    assert!(
        generated == committed,
        "include/fabricoll.h is stale: copy {}/fabricoll.h (what build.rs generated) to include/",
        env!("OUT_DIR")
    );
}

#[test]
fn status_strings() {
    // SAFETY: both functions return pointers to static NUL-terminated strings.
    unsafe {
        assert_eq!(
            CStr::from_ptr(fabricoll_status_string(6)).to_str().unwrap(),
            "timeout"
        );
        assert_eq!(
            CStr::from_ptr(fabricoll_status_string(-1))
                .to_str()
                .unwrap(),
            "unknown status"
        );
        assert_eq!(
            CStr::from_ptr(fabricoll_version()).to_str().unwrap(),
            env!("CARGO_PKG_VERSION")
        );
    }
    assert_eq!(
        fabricoll_status::from(&Error::Timeout(String::new())) as i32,
        fabricoll_status::FABRICOLL_TIMEOUT as i32
    );
}

fn last_error() -> String {
    // SAFETY: fabricoll_last_error returns this thread's NUL-terminated message.
    unsafe { CStr::from_ptr(fabricoll_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Every C enum value, pinned: a value once published never changes.
#[test]
fn enum_values_are_pinned() {
    use crate::algo::{Algorithm as A, Collective as C};
    use fabricoll_status as S;
    let statuses = [
        (S::FABRICOLL_SUCCESS, 0),
        (S::FABRICOLL_INVALID_ARGUMENT, 1),
        (S::FABRICOLL_INVALID_USAGE, 2),
        (S::FABRICOLL_SYSTEM_ERROR, 3),
        (S::FABRICOLL_INTERNAL_ERROR, 4),
        (S::FABRICOLL_REMOTE_ERROR, 5),
        (S::FABRICOLL_TIMEOUT, 6),
        (S::FABRICOLL_IN_PROGRESS, 7),
    ];
    for (s, v) in statuses {
        assert_eq!(s as i32, v, "{s:?}");
    }
    let algos = [
        (fabricoll_algo::FABRICOLL_ALGO_RING, 1, A::Ring),
        (fabricoll_algo::FABRICOLL_ALGO_BIDIR_RING, 2, A::BidirRing),
        (fabricoll_algo::FABRICOLL_ALGO_MESH, 3, A::Mesh),
        (fabricoll_algo::FABRICOLL_ALGO_MESH1, 4, A::Mesh1),
        (fabricoll_algo::FABRICOLL_ALGO_RDH, 5, A::Rdh),
        (fabricoll_algo::FABRICOLL_ALGO_RD, 6, A::Rd),
        (fabricoll_algo::FABRICOLL_ALGO_TREE, 7, A::Tree),
        (fabricoll_algo::FABRICOLL_ALGO_DBTREE, 8, A::DbTree),
        (fabricoll_algo::FABRICOLL_ALGO_BRUCK, 9, A::Bruck),
        (fabricoll_algo::FABRICOLL_ALGO_PAIRWISE, 10, A::Pairwise),
        (fabricoll_algo::FABRICOLL_ALGO_HIER, 11, A::Hier),
        (fabricoll_algo::FABRICOLL_ALGO_SWIZZLE, 12, A::Swizzle),
    ];
    assert_eq!(algos.len(), A::ALL.len(), "a new algorithm needs a C value");
    assert_eq!(fabricoll_algo::FABRICOLL_ALGO_AUTO as i32, 0);
    assert_eq!(algo(0).unwrap(), None);
    for (c, v, a) in algos {
        assert_eq!(c as i32, v);
        assert_eq!(algo(v).unwrap(), Some(a));
    }
    for bad in [-1, 13] {
        assert!(algo(bad).is_err());
    }
    let colls = [
        (fabricoll_coll::FABRICOLL_COLL_ALLREDUCE, 0, C::AllReduce),
        (fabricoll_coll::FABRICOLL_COLL_ALLGATHER, 1, C::AllGather),
        (
            fabricoll_coll::FABRICOLL_COLL_REDUCESCATTER,
            2,
            C::ReduceScatter,
        ),
        (fabricoll_coll::FABRICOLL_COLL_BROADCAST, 3, C::Broadcast),
        (fabricoll_coll::FABRICOLL_COLL_REDUCE, 4, C::Reduce),
        (fabricoll_coll::FABRICOLL_COLL_ALLTOALL, 5, C::AllToAll),
    ];
    assert_eq!(
        colls.len(),
        C::ALL.len(),
        "a new collective needs a C value"
    );
    for (c, v, k) in colls {
        assert_eq!(c as i32, v);
        assert_eq!(coll(v).unwrap(), k);
    }
    assert!(coll(-1).is_err() && coll(6).is_err());
    use crate::reduce::{DataType as D, RedOp as R};
    let types = [
        (fabricoll_datatype::FABRICOLL_INT8, 0, D::Int8),
        (fabricoll_datatype::FABRICOLL_UINT8, 1, D::Uint8),
        (fabricoll_datatype::FABRICOLL_INT32, 2, D::Int32),
        (fabricoll_datatype::FABRICOLL_UINT32, 3, D::Uint32),
        (fabricoll_datatype::FABRICOLL_INT64, 4, D::Int64),
        (fabricoll_datatype::FABRICOLL_UINT64, 5, D::Uint64),
        (fabricoll_datatype::FABRICOLL_FLOAT16, 6, D::Float16),
        (fabricoll_datatype::FABRICOLL_FLOAT32, 7, D::Float32),
        (fabricoll_datatype::FABRICOLL_FLOAT64, 8, D::Float64),
        (fabricoll_datatype::FABRICOLL_BFLOAT16, 9, D::Bfloat16),
        (fabricoll_datatype::FABRICOLL_FP8_E4M3, 10, D::Float8E4M3),
        (fabricoll_datatype::FABRICOLL_FP8_E5M2, 11, D::Float8E5M2),
    ];
    for (c, v, d) in types {
        assert_eq!(c as i32, v);
        assert_eq!(dtype(v).unwrap(), d);
    }
    // The range an error states is exactly the accepted values.
    for bad in [-1, 12] {
        let e = dtype(bad).unwrap_err().to_string();
        let top: i32 = e
            .split("(0..=")
            .nth(1)
            .and_then(|t| t.split(')').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no range in {e}"));
        assert!(e.contains("'datatype'"), "{e}");
        assert!(dtype(top).is_ok() && dtype(top + 1).is_err(), "{e}");
    }
    let ops = [
        (fabricoll_redop::FABRICOLL_SUM, 0, R::Sum),
        (fabricoll_redop::FABRICOLL_PROD, 1, R::Prod),
        (fabricoll_redop::FABRICOLL_MAX, 2, R::Max),
        (fabricoll_redop::FABRICOLL_MIN, 3, R::Min),
        (fabricoll_redop::FABRICOLL_AVG, 4, R::Avg),
        (fabricoll_redop::FABRICOLL_BAND, 5, R::BAnd),
        (fabricoll_redop::FABRICOLL_BOR, 6, R::BOr),
        (fabricoll_redop::FABRICOLL_BXOR, 7, R::BXor),
    ];
    assert_eq!(ops.len(), R::ALL.len(), "a new op needs a C value");
    for (c, v, o) in ops {
        assert_eq!(c as i32, v);
        assert_eq!(redop(v).unwrap(), o);
    }
    for bad in [-1, 8] {
        let e = redop(bad).unwrap_err().to_string();
        assert!(e.contains("'op'"), "{e}");
    }
}

/// A panic inside the boundary keeps its message in the last error.
#[test]
fn panic_message_reaches_last_error() {
    let s: fabricoll_status =
        crate::ffi::boundary::boundary("panicking_export", || panic!("deliberate {}", 17));
    assert_eq!(s, fabricoll_status::FABRICOLL_INTERNAL_ERROR);
    let e = last_error();
    assert!(
        e.contains("panicking_export") && e.contains("deliberate 17"),
        "{e}"
    );
}

/// A one-rank communicator (the bootstrap root in this process).
fn one_rank_comm() -> Option<*mut fabricoll_comm> {
    let mut id = fabricoll_unique_id { internal: [0; 128] };
    if fabricoll_get_unique_id(&mut id) != fabricoll_status::FABRICOLL_SUCCESS {
        crate::testing::skip("one_rank_comm", &format!("no unique id: {}", last_error()));
        return None;
    }
    let mut comm = std::ptr::null_mut();
    // SAFETY: both pointers are valid for the call.
    let s = unsafe { fabricoll_comm_init_rank(&mut comm, 1, &id, 0) };
    if s != fabricoll_status::FABRICOLL_SUCCESS {
        crate::testing::skip(
            "one_rank_comm",
            &format!("no communicator: {}", last_error()),
        );
        return None;
    }
    Some(comm)
}

/// `fabricoll_wait` and `fabricoll_test` after `fabricoll_comm_abort` say that the
/// communicator was aborted (INVALID_USAGE), as on more ranks, not that the request is unknown.
#[test]
fn wait_after_abort_names_the_abort() {
    let Some(comm) = one_rank_comm() else { return };
    let (send, mut recv) = ([1.0f32; 16], [0.0f32; 16]);
    let mut reqs = [std::ptr::null_mut(); 2];
    for r in reqs.iter_mut() {
        let s = fabricoll_iallreduce(
            send.as_ptr().cast(),
            recv.as_mut_ptr().cast(),
            16,
            fabricoll_datatype::FABRICOLL_FLOAT32 as i32,
            fabricoll_redop::FABRICOLL_SUM as i32,
            comm,
            r,
        );
        assert_eq!(s, fabricoll_status::FABRICOLL_SUCCESS, "{}", last_error());
    }
    assert_eq!(
        fabricoll_comm_abort(comm),
        fabricoll_status::FABRICOLL_SUCCESS
    );
    assert_eq!(
        fabricoll_wait(reqs[0]),
        fabricoll_status::FABRICOLL_INVALID_USAGE
    );
    assert!(last_error().contains("aborted"), "{}", last_error());
    let mut done = 7;
    assert_eq!(
        fabricoll_test(reqs[1], &mut done),
        fabricoll_status::FABRICOLL_INVALID_USAGE
    );
    assert_eq!(done, 0);
    assert!(last_error().contains("aborted"), "{}", last_error());
    // Both requests are freed: a second wait names the request.
    assert_eq!(
        fabricoll_wait(reqs[0]),
        fabricoll_status::FABRICOLL_INVALID_ARGUMENT
    );
    assert_eq!(
        fabricoll_comm_destroy(comm),
        fabricoll_status::FABRICOLL_SUCCESS
    );
}

/// The bitwise ops through the C API: on int32 they run; on float, and for op 8, the call is
/// INVALID_ARGUMENT naming 'op' (and the type).
#[test]
fn bitwise_ops_through_the_c_api() {
    let Some(comm) = one_rank_comm() else { return };
    let send: Vec<i32> = (0..16).map(|i| i * 0x0101_0101 - 7).collect();
    let mut recv = [0i32; 16];
    for op in [
        fabricoll_redop::FABRICOLL_BAND,
        fabricoll_redop::FABRICOLL_BOR,
        fabricoll_redop::FABRICOLL_BXOR,
    ] {
        recv.fill(0);
        let s = fabricoll_allreduce(
            send.as_ptr().cast(),
            recv.as_mut_ptr().cast(),
            16,
            fabricoll_datatype::FABRICOLL_INT32 as i32,
            op as i32,
            comm,
        );
        assert_eq!(s, fabricoll_status::FABRICOLL_SUCCESS, "{}", last_error());
        assert_eq!(recv[..], send[..], "one rank: the reduction is the input");
    }
    let fsend = [1.0f32; 16];
    let mut frecv = [0.0f32; 16];
    for (dt, op, what) in [
        (fabricoll_datatype::FABRICOLL_FLOAT32 as i32, 7, "float"),
        (fabricoll_datatype::FABRICOLL_FLOAT32 as i32, 5, "band"),
        (
            fabricoll_datatype::FABRICOLL_INT32 as i32,
            8,
            "fabricoll_redop",
        ),
    ] {
        let s = fabricoll_allreduce(
            fsend.as_ptr().cast(),
            frecv.as_mut_ptr().cast(),
            16,
            dt,
            op,
            comm,
        );
        assert_eq!(s, fabricoll_status::FABRICOLL_INVALID_ARGUMENT, "op {op}");
        let e = last_error();
        assert!(e.contains("'op'") && e.contains(what), "op {op}: {e}");
    }
    assert_eq!(frecv, [0.0f32; 16]);
    assert_eq!(
        fabricoll_comm_destroy(comm),
        fabricoll_status::FABRICOLL_SUCCESS
    );
}

/// F4: `fabricoll_comm_destroy` from another thread ends a small blocking collective that
/// runs over shm's direct channel (its peer never joins) within milliseconds, not at the
/// deadline.
#[test]
fn destroy_from_another_thread_ends_a_direct_collective() {
    use crate::coll::{self, Call, Comm, Kind};
    use crate::transport::{Region, Transport};
    let test = "destroy_from_another_thread_ends_a_direct_collective";
    let cfg = crate::config::Config::from_lookup(|n| match n {
        "FABRICOLL_PROVIDER" => Some("shm".into()),
        "FABRICOLL_TIMEOUT_MS" => Some("120000".into()),
        "FABRICOLL_ALPHA_US" => Some("5".into()),
        "FABRICOLL_BETA_GBPS" => Some("2".into()),
        "FABRICOLL_GAMMA_GBPS" => Some("8".into()),
        _ => None,
    })
    .unwrap();
    let eps: Vec<std::sync::Arc<dyn Transport>> =
        match (0..2).map(|_| coll::open_endpoint(&cfg)).collect() {
            Ok(e) => e,
            Err(e) => return crate::testing::skip(test, &format!("no shm endpoint ({e})")),
        };
    let addrs: Vec<Vec<u8>> = eps.iter().map(|e| e.address()).collect();
    let peer = eps[0].insert_peer(&addrs[1]).unwrap();
    if eps[0].direct_bytes(peer) == 0 {
        return crate::testing::skip(test, "this libfabric's shm has no direct channel");
    }
    let mut comms: Vec<Comm> = eps
        .into_iter()
        .enumerate()
        .map(|(r, e)| Comm::new(r, e, &addrs, &cfg).unwrap())
        .collect();
    let _absent = comms.pop();
    let handle = handles::register_comm(comms.pop().unwrap()) as usize;
    let entry = handles::comm_of(handle as *mut fabricoll_comm).unwrap();
    let runner = std::thread::spawn(move || {
        let mut data = [1.0f32; 16];
        // SAFETY: `data` outlives the blocking call.
        let x = unsafe { Region::from_raw(data.as_mut_ptr().cast(), 64) };
        let call = Call {
            kind: Kind::Coll(crate::algo::Collective::AllReduce),
            send: x,
            recv: x,
            count: 16,
            dtype: crate::reduce::DataType::Float32,
            op: crate::reduce::RedOp::Sum,
            root: 0,
            algo: None,
        };
        entry.comm.run(&call).unwrap_err().to_string()
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    let t = std::time::Instant::now();
    assert_eq!(
        fabricoll_comm_destroy(handle as *mut fabricoll_comm),
        fabricoll_status::FABRICOLL_SUCCESS
    );
    let e = runner.join().unwrap();
    let took = t.elapsed();
    assert!(e.contains("aborted"), "{e}");
    // Long before the 120 s deadline: the destroy ended it.
    assert!(took < std::time::Duration::from_secs(60), "{took:?}");
}

/// Send and receive name `peer` when it is negative or not a rank, blocking or not, and
/// leave `*request` NULL.
#[test]
fn point_to_point_names_a_bad_peer() {
    let Some(comm) = one_rank_comm() else { return };
    let mut buf = [0u8; 8];
    for peer in [-1, 1] {
        let s = fabricoll_send(buf.as_ptr().cast(), 8, dtype_u8(), peer, comm);
        assert_eq!(
            s,
            fabricoll_status::FABRICOLL_INVALID_ARGUMENT,
            "send to {peer}"
        );
        assert!(last_error().contains("'peer'"), "{}", last_error());
        let mut req = 7usize as *mut fabricoll_request;
        let s = fabricoll_irecv(buf.as_mut_ptr().cast(), 8, dtype_u8(), peer, comm, &mut req);
        assert_eq!(
            s,
            fabricoll_status::FABRICOLL_INVALID_ARGUMENT,
            "irecv from {peer}"
        );
        assert!(last_error().contains("'peer'"), "{}", last_error());
        assert!(req.is_null());
    }
    assert_eq!(
        fabricoll_comm_destroy(comm),
        fabricoll_status::FABRICOLL_SUCCESS
    );
}

fn dtype_u8() -> i32 {
    fabricoll_datatype::FABRICOLL_UINT8 as i32
}

//! The C API's gather, scatter, barrier, uneven-count and tagged calls: their null and
//! argument checks, each call (blocking and not) on one rank, and the uneven ones on two ranks
//! (threads of this process, bootstrapped by fabricoll_get_unique_id).
use nccl_net_fabricoll::ffi::api::*;
use nccl_net_fabricoll::testing::skip;
use std::ffi::CStr;

/// Rank r's input element k.
fn v(r: usize, k: usize) -> i32 {
    (r * 1000 + k) as i32
}

fn last_error() -> String {
    // SAFETY: fabricoll_last_error returns this thread's NUL-terminated message.
    unsafe { CStr::from_ptr(fabricoll_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// A bootstrap id whose root listens in this process, or None (skipped) where it cannot.
fn unique_id(test: &str) -> Option<fabricoll_unique_id> {
    let mut id = fabricoll_unique_id { internal: [0; 128] };
    if fabricoll_get_unique_id(&mut id) != fabricoll_status::FABRICOLL_SUCCESS {
        skip(test, &format!("no unique id: {}", last_error()));
        return None;
    }
    Some(id)
}

/// The C API's null checks and argument checks on a one-rank communicator, and each new call
/// (blocking and not) running there.
#[test]
fn c_api_checks_and_runs_each_call_on_one_rank() {
    let test = "c_api_checks_and_runs_each_call_on_one_rank";
    let Some(id) = unique_id(test) else {
        return;
    };
    let mut comm = std::ptr::null_mut();
    // SAFETY: both pointers are valid for the call.
    if unsafe { fabricoll_comm_init_rank(&mut comm, 1, &id, 0) }
        != fabricoll_status::FABRICOLL_SUCCESS
    {
        skip(test, &format!("no communicator: {}", last_error()));
        return;
    }
    const I32: i32 = fabricoll_datatype::FABRICOLL_INT32 as i32;
    const SUM: i32 = fabricoll_redop::FABRICOLL_SUM as i32;
    const BAD: fabricoll_status = fabricoll_status::FABRICOLL_INVALID_ARGUMENT;
    const OK: fabricoll_status = fabricoll_status::FABRICOLL_SUCCESS;
    let null = std::ptr::null::<usize>();
    let (send, mut recv) = ([7i32, 8, 9], [0i32; 3]);
    let (sp, rp) = (send.as_ptr().cast(), recv.as_mut_ptr().cast());
    let counts = [3usize];
    let expect = |s: fabricoll_status, want: fabricoll_status, name: &str| {
        assert_eq!(s, want, "{}", last_error());
        if want != OK {
            assert!(
                last_error().contains(&format!("'{name}'")),
                "{}",
                last_error()
            );
        }
    };
    expect(
        fabricoll_allgatherv(sp, 3, rp, null, null, I32, comm),
        BAD,
        "recvcounts",
    );
    expect(
        fabricoll_reducescatterv(sp, rp, null, I32, SUM, comm),
        BAD,
        "recvcounts",
    );
    let cp = counts.as_ptr();
    expect(
        fabricoll_alltoallv(sp, null, null, rp, cp, null, I32, comm),
        BAD,
        "sendcounts",
    );
    expect(
        fabricoll_alltoallv(sp, cp, null, rp, null, null, I32, comm),
        BAD,
        "recvcounts",
    );
    expect(fabricoll_gather(sp, rp, 3, I32, 1, comm), BAD, "root");
    expect(fabricoll_scatter(sp, rp, 3, I32, -1, comm), BAD, "root");
    expect(
        fabricoll_allgatherv(sp, 2, rp, cp, null, I32, comm),
        BAD,
        "sendcount",
    );
    expect(
        fabricoll_gather(std::ptr::null(), rp, 3, I32, 0, comm),
        BAD,
        "sendbuf",
    );
    expect(fabricoll_send_tagged(sp, 1, I32, 0, -1, comm), BAD, "tag");
    expect(
        fabricoll_recv_tagged(rp, 1, I32, 0, FABRICOLL_MAX_TAG + 1, comm),
        BAD,
        "tag",
    );
    let mut req = std::ptr::null_mut();
    expect(
        fabricoll_ibarrier(comm, std::ptr::null_mut()),
        BAD,
        "request",
    );
    // Each call runs on one rank: the output is the input.
    let calls: [(
        &str,
        &dyn Fn(*mut *mut fabricoll_request) -> fabricoll_status,
    ); 5] = [
        ("gather", &|q| fabricoll_igather(sp, rp, 3, I32, 0, comm, q)),
        ("scatter", &|q| {
            fabricoll_iscatter(sp, rp, 3, I32, 0, comm, q)
        }),
        ("allgatherv", &|q| {
            fabricoll_iallgatherv(sp, 3, rp, cp, null, I32, comm, q)
        }),
        ("reducescatterv", &|q| {
            fabricoll_ireducescatterv(sp, rp, cp, I32, SUM, comm, q)
        }),
        ("alltoallv", &|q| {
            fabricoll_ialltoallv(sp, cp, null, rp, cp, null, I32, comm, q)
        }),
    ];
    for (what, f) in calls {
        // SAFETY: recv outlives the call; nothing else touches it meanwhile.
        unsafe { std::ptr::write_bytes(rp as *mut i32, 0, 3) };
        expect(f(&mut req), OK, what);
        expect(fabricoll_wait(req), OK, what);
        // SAFETY: the call completed; recv is 3 i32s.
        let got = unsafe { std::slice::from_raw_parts(rp as *const i32, 3) };
        assert_eq!(got, send, "{what}");
    }
    expect(fabricoll_barrier(comm), OK, "barrier");
    expect(fabricoll_ibarrier(comm, &mut req), OK, "ibarrier");
    expect(fabricoll_wait(req), OK, "ibarrier");
    expect(
        fabricoll_isend_tagged(sp, 3, I32, 0, 77, comm, &mut req),
        OK,
        "isend_tagged",
    );
    let mut got = [0i32; 3];
    let gp = got.as_mut_ptr().cast();
    expect(
        fabricoll_recv_tagged(gp, 3, I32, 0, 77, comm),
        OK,
        "recv_tagged",
    );
    expect(fabricoll_wait(req), OK, "isend_tagged");
    assert_eq!(got, send);
    assert_eq!(fabricoll_comm_destroy(comm), OK);
}

/// Two ranks (threads) through the C API: allgatherv, alltoallv (NULL displacements) and a
/// tagged exchange, checked element by element.
#[test]
fn c_api_runs_the_uneven_calls_on_two_ranks() {
    let test = "c_api_runs_the_uneven_calls_on_two_ranks";
    let Some(id) = unique_id(test) else {
        return;
    };
    const I32: i32 = fabricoll_datatype::FABRICOLL_INT32 as i32;
    const OK: fabricoll_status = fabricoll_status::FABRICOLL_SUCCESS;
    let id = &id;
    std::thread::scope(|s| {
        for r in 0..2usize {
            s.spawn(move || {
                let mut comm = std::ptr::null_mut();
                // SAFETY: both pointers are valid for the call.
                let st = unsafe { fabricoll_comm_init_rank(&mut comm, 2, id, r as i32) };
                assert_eq!(st, OK, "rank {r}: {}", last_error());
                let ok = |st: fabricoll_status, what: &str| {
                    assert_eq!(st, OK, "rank {r} {what}: {}", last_error())
                };
                // allgatherv: rank 0 gives 1 element, rank 1 gives 3.
                let counts = [1usize, 3];
                let send: Vec<i32> = (0..counts[r]).map(|k| v(r, k)).collect();
                let mut out = [-1i32; 4];
                let null = std::ptr::null::<usize>();
                ok(
                    fabricoll_allgatherv(
                        send.as_ptr().cast(),
                        counts[r],
                        out.as_mut_ptr().cast(),
                        counts.as_ptr(),
                        null,
                        I32,
                        comm,
                    ),
                    "allgatherv",
                );
                assert_eq!(out, [v(0, 0), v(1, 0), v(1, 1), v(1, 2)], "rank {r}");
                // alltoallv: rank i sends i + j + 1 elements to rank j.
                let sc: Vec<usize> = (0..2).map(|j| r + j + 1).collect();
                let rc: Vec<usize> = (0..2).map(|i| i + r + 1).collect();
                let send: Vec<i32> = (0..sc.iter().sum()).map(|k| v(r, k)).collect();
                let mut out = vec![-1i32; rc.iter().sum()];
                ok(
                    fabricoll_alltoallv(
                        send.as_ptr().cast(),
                        sc.as_ptr(),
                        null,
                        out.as_mut_ptr().cast(),
                        rc.as_ptr(),
                        null,
                        I32,
                        comm,
                    ),
                    "alltoallv",
                );
                let mut want = Vec::new();
                for (i, &c) in rc.iter().enumerate() {
                    let off = if r == 0 { 0 } else { i + 1 };
                    want.extend((0..c).map(|k| v(i, off + k)));
                }
                assert_eq!(out, want, "rank {r}");
                // Tagged: each sends tag 9 to the other.
                let peer = 1 - r as i32;
                let mut req = std::ptr::null_mut();
                let x = [v(r, 9)];
                let mut y = [-1i32];
                ok(
                    fabricoll_isend_tagged(x.as_ptr().cast(), 1, I32, peer, 9, comm, &mut req),
                    "isend_tagged",
                );
                ok(
                    fabricoll_recv_tagged(y.as_mut_ptr().cast(), 1, I32, peer, 9, comm),
                    "recv_tagged",
                );
                ok(fabricoll_wait(req), "wait");
                assert_eq!(y, [v(1 - r, 9)]);
                // Non-blocking tagged receives posted before the sends, for two tags, and the
                // sends made in the other order: each receive takes its own tag's message.
                let (mut r11, mut r12) = ([-1i32; 2], [-1i32; 3]);
                let (mut q11, mut q12) = (std::ptr::null_mut(), std::ptr::null_mut());
                ok(
                    fabricoll_irecv_tagged(
                        r11.as_mut_ptr().cast(),
                        2,
                        I32,
                        peer,
                        11,
                        comm,
                        &mut q11,
                    ),
                    "irecv_tagged 11",
                );
                ok(
                    fabricoll_irecv_tagged(
                        r12.as_mut_ptr().cast(),
                        3,
                        I32,
                        peer,
                        12,
                        comm,
                        &mut q12,
                    ),
                    "irecv_tagged 12",
                );
                let s12: Vec<i32> = (0..3).map(|k| v(r, 120 + k)).collect();
                let s11: Vec<i32> = (0..2).map(|k| v(r, 110 + k)).collect();
                ok(
                    fabricoll_send_tagged(s12.as_ptr().cast(), 3, I32, peer, 12, comm),
                    "send_tagged 12",
                );
                ok(
                    fabricoll_send_tagged(s11.as_ptr().cast(), 2, I32, peer, 11, comm),
                    "send_tagged 11",
                );
                ok(fabricoll_wait(q11), "wait irecv_tagged 11");
                ok(fabricoll_wait(q12), "wait irecv_tagged 12");
                let o = 1 - r;
                assert_eq!(r11, [v(o, 110), v(o, 111)], "rank {r}: tag 11");
                assert_eq!(r12, [v(o, 120), v(o, 121), v(o, 122)], "rank {r}: tag 12");
                ok(fabricoll_barrier(comm), "barrier");
                ok(fabricoll_comm_destroy(comm), "destroy");
            });
        }
    });
}

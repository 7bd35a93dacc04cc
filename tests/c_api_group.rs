//! Group calls through the C API, two ranks as threads of this process over shm: blocking
//! sends and receives that both ranks make in one group do not deadlock (outside a group a
//! large blocking send may wait for its receiver), a failure inside a group comes out of
//! `fabricoll_group_end` after every call has ended, groups nest, and bad use is an error.
use capi::{comm, last_error, pair, shm_config, shm_config_deadline, DEADLINE_MS, LATE};
use nccl_net_fabricoll::ffi::api::*;
use std::os::raw::c_int;
use std::time::{Duration, Instant};

use fabricoll_status::*;

mod capi;

const F32: c_int = fabricoll_datatype::FABRICOLL_FLOAT32 as c_int;

fn send(c: usize, buf: &[f32], peer: c_int) -> fabricoll_status {
    fabricoll_send(buf.as_ptr().cast(), buf.len(), F32, peer, comm(c))
}

fn recv(c: usize, buf: &mut [f32], peer: c_int) -> fabricoll_status {
    fabricoll_recv(buf.as_mut_ptr().cast(), buf.len(), F32, peer, comm(c))
}

/// Run `f(rank, comm)` on both ranks at once; their results.
fn both<T: Send>(cs: [usize; 2], f: impl Fn(usize, usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let f = &f;
                s.spawn(move || f(r, cs[r]))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn send_and_receive_pairs_in_one_group_do_not_deadlock() {
    let Some(cs) = pair(
        "send_and_receive_pairs_in_one_group_do_not_deadlock",
        &shm_config(),
    ) else {
        return;
    };
    // Larger than any eager limit: outside a group each rank's send may wait for the other's
    // receive, which comes after it.
    const N: usize = 1 << 20;
    let out = both(cs, |r, c| {
        let mine = vec![r as f32 + 1.0; N];
        let mut theirs = vec![0.0f32; N];
        let peer = 1 - r as c_int;
        assert_eq!(fabricoll_group_start(), FABRICOLL_SUCCESS);
        assert_eq!(send(c, &mine, peer), FABRICOLL_SUCCESS, "{}", last_error());
        assert_eq!(recv(c, &mut theirs, peer), FABRICOLL_SUCCESS);
        // A collective in the same group, blocking outside it.
        let (one, mut sum) = ([1.0f32; 4], [0.0f32; 4]);
        let st = fabricoll_allreduce(
            one.as_ptr().cast(),
            sum.as_mut_ptr().cast(),
            4,
            F32,
            fabricoll_redop::FABRICOLL_SUM as c_int,
            comm(c),
        );
        assert_eq!(st, FABRICOLL_SUCCESS);
        let end = fabricoll_group_end();
        (end, last_error(), theirs[0], theirs[N - 1], sum)
    });
    for (r, (end, err, first, last, sum)) in out.into_iter().enumerate() {
        assert_eq!(end, FABRICOLL_SUCCESS, "rank {r}: {err}");
        let want = (2 - r) as f32;
        assert_eq!((first, last), (want, want), "rank {r}");
        assert_eq!(sum, [2.0; 4]);
    }
    for c in cs {
        assert_eq!(fabricoll_comm_destroy(comm(c)), FABRICOLL_SUCCESS);
    }
}

#[test]
fn a_failure_in_a_group_comes_out_of_group_end() {
    let test = "a_failure_in_a_group_comes_out_of_group_end";
    let Some(cs) = pair(test, &shm_config_deadline()) else {
        return;
    };
    let out = both(cs, |r, c| {
        let mut buf = [r as f32; 4];
        let t0 = Instant::now();
        assert_eq!(fabricoll_group_start(), FABRICOLL_SUCCESS);
        // A bad argument fails at once, and the group goes on.
        assert_eq!(send(c, &buf, 7), FABRICOLL_INVALID_ARGUMENT);
        assert!(last_error().contains("peer"), "{}", last_error());
        if r == 0 {
            // Matched by rank 1's receive; then a receive rank 1 never sends.
            assert_eq!(send(c, &buf, 1), FABRICOLL_SUCCESS);
            assert_eq!(recv(c, &mut buf, 1), FABRICOLL_SUCCESS);
        } else {
            assert_eq!(recv(c, &mut buf, 0), FABRICOLL_SUCCESS);
        }
        let end = fabricoll_group_end();
        (end, last_error(), t0.elapsed(), buf)
    });
    let (end0, err0, took0, _) = &out[0];
    assert_eq!(*end0, FABRICOLL_TIMEOUT, "{err0}");
    assert!(err0.contains("fabricoll_group_end"), "{err0}");
    assert!(
        *took0 >= Duration::from_millis(DEADLINE_MS as u64)
            && *took0 < Duration::from_millis(DEADLINE_MS as u64) + LATE,
        "{took0:?}"
    );
    let (end1, err1, _, buf1) = &out[1];
    assert_eq!(*end1, FABRICOLL_SUCCESS, "{err1}");
    assert_eq!(*buf1, [0.0; 4], "rank 0's message arrived");
    for c in cs {
        assert_eq!(fabricoll_comm_destroy(comm(c)), FABRICOLL_SUCCESS);
    }
}

#[test]
fn groups_nest_and_an_unmatched_end_is_an_error() {
    assert_eq!(fabricoll_group_end(), FABRICOLL_INVALID_USAGE);
    assert!(
        last_error().contains("fabricoll_group_start"),
        "{}",
        last_error()
    );
    let Some(cs) = pair(
        "groups_nest_and_an_unmatched_end_is_an_error",
        &shm_config(),
    ) else {
        return;
    };
    let out = both(cs, |r, c| {
        let peer = 1 - r as c_int;
        let mine = [r as f32; 8];
        let mut theirs = [9.0f32; 8];
        assert_eq!(fabricoll_group_start(), FABRICOLL_SUCCESS);
        assert_eq!(fabricoll_group_start(), FABRICOLL_SUCCESS);
        assert_eq!(send(c, &mine, peer), FABRICOLL_SUCCESS);
        // The inner end returns at once: nothing has been waited for yet.
        assert_eq!(fabricoll_group_end(), FABRICOLL_SUCCESS);
        assert_eq!(recv(c, &mut theirs, peer), FABRICOLL_SUCCESS);
        let end = fabricoll_group_end();
        (end, theirs)
    });
    for (r, (end, theirs)) in out.into_iter().enumerate() {
        assert_eq!(end, FABRICOLL_SUCCESS);
        assert_eq!(theirs, [(1 - r) as f32; 8]);
    }
    assert_eq!(fabricoll_group_end(), FABRICOLL_INVALID_USAGE);
    for c in cs {
        assert_eq!(fabricoll_comm_destroy(comm(c)), FABRICOLL_SUCCESS);
    }
}

#[test]
fn a_group_over_two_communicators_waits_for_both() {
    let test = "a_group_over_two_communicators_waits_for_both";
    let (Some(a), Some(b)) = (pair(test, &shm_config()), pair(test, &shm_config())) else {
        return;
    };
    // Rank 0 makes its calls on a then b, rank 1 on b then a: each waits for both.
    let out = both([0, 1], |r, _| {
        let (first, second) = if r == 0 { (a[r], b[r]) } else { (b[r], a[r]) };
        let peer = 1 - r as c_int;
        let mine = vec![r as f32; 1 << 18];
        let (mut x, mut y) = (vec![0.0f32; 1 << 18], vec![0.0f32; 1 << 18]);
        assert_eq!(fabricoll_group_start(), FABRICOLL_SUCCESS);
        assert_eq!(send(first, &mine, peer), FABRICOLL_SUCCESS);
        assert_eq!(recv(first, &mut x, peer), FABRICOLL_SUCCESS);
        assert_eq!(send(second, &mine, peer), FABRICOLL_SUCCESS);
        assert_eq!(recv(second, &mut y, peer), FABRICOLL_SUCCESS);
        (fabricoll_group_end(), last_error(), x[0], y[0])
    });
    for (r, (end, err, x, y)) in out.into_iter().enumerate() {
        assert_eq!(end, FABRICOLL_SUCCESS, "{err}");
        assert_eq!((x, y), ((1 - r) as f32, (1 - r) as f32));
    }
    for c in a.into_iter().chain(b) {
        assert_eq!(fabricoll_comm_destroy(comm(c)), FABRICOLL_SUCCESS);
    }
}

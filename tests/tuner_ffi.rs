//! The tuner tables as NCCL calls them, in process: every version's `init`, `getCollInfo`,
//! `getChunkSize` and `finalize`/`destroy`, with bad arguments too. `getCollInfo` and
//! `getChunkSize` answer ncclSuccess whatever they get; `init` and `finalize` name bad
//! arguments with ncclInvalidArgument.
use nccl_net_fabricoll::error::nccl;
use nccl_net_fabricoll::ffi::tuner::*;
use nccl_net_fabricoll::plugin::tuner::{
    ALGO_COLLNET_DIRECT, FUNC_ALLREDUCE, IGNORE, MAX_CHUNK, MIN_CHUNK, PROTO_SIMPLE,
};
use std::ffi::CStr;
use std::os::raw::c_void;
use std::ptr::{null_mut, NonNull};

const NALGO: i32 = 7;
const NPROTO: i32 = 3;

fn table() -> Vec<f32> {
    let mut t = vec![1.0e9f32; 21];
    t[ALGO_COLLNET_DIRECT * 3 + 1] = IGNORE;
    t[3 * 3 + PROTO_SIMPLE] = IGNORE; // Chain forbidden
    t
}

fn is_set(ctx: *mut c_void) -> bool {
    NonNull::new(ctx).is_some()
}

#[test]
fn names_and_every_version_round_trip() {
    for name in [
        ncclTunerPlugin_v2.name,
        ncclTunerPlugin_v3.name,
        ncclTunerPlugin_v4.name,
        ncclTunerPlugin_v5.name,
        ncclTunerPlugin_v6.name,
    ] {
        // SAFETY: the tables' names are static NUL-terminated strings.
        let name = unsafe { CStr::from_ptr(name) };
        assert_eq!(name.to_str().unwrap(), "fabricoll");
    }
    let mut cells = table();
    let before = cells.clone();
    let tp = cells.as_mut_ptr() as *mut *mut f32;
    let mut nch = 0;
    // SAFETY: each call gets what NCCL would pass: a context pointer to fill, a 7 x 3 float
    // table, and writable outputs.
    unsafe {
        // v6: native, with getChunkSize.
        let mut ctx = null_mut();
        let mut consts: ConstantsV5 = std::mem::zeroed();
        let mut nvl = NvlDomainInfoV5 {
            n_nvl_domains: 1,
            min_ranks_per_nvl_domain: 1,
            max_ranks_per_nvl_domain: 1,
        };
        let t = &ncclTunerPlugin_v6;
        assert_eq!(
            (t.init)(&mut ctx, 7, 16, 4, None, &mut nvl, &mut consts),
            nccl::SUCCESS
        );
        assert!(is_set(ctx));
        assert_eq!(
            (t.get_coll_info)(ctx, FUNC_ALLREDUCE, 1024, 1, tp, NALGO, NPROTO, 0, &mut nch),
            nccl::SUCCESS
        );
        assert_eq!(nch, 0, "nChannels stays NCCL's");
        for i in 0..cells.len() {
            if i != ALGO_COLLNET_DIRECT * 3 + PROTO_SIMPLE {
                assert_eq!(cells[i].to_bits(), before[i].to_bits(), "cell {i}");
            }
        }
        let ours = cells[ALGO_COLLNET_DIRECT * 3 + PROTO_SIMPLE];
        assert!(
            (0.0..1.0e9).contains(&ours),
            "CollNet at 1 KiB on 4 nodes: {ours} us"
        );
        let chunk_fn = t.get_chunk_size.unwrap();
        let mut chunk = 12345usize;
        assert_eq!(
            chunk_fn(ctx, FUNC_ALLREDUCE, 1 << 30, 2, 2, 4, &mut chunk),
            nccl::SUCCESS
        );
        assert!(
            chunk.is_power_of_two() && (MIN_CHUNK..=MAX_CHUNK).contains(&chunk),
            "{chunk}"
        );
        let mut ring = 12345usize;
        assert_eq!(
            chunk_fn(ctx, FUNC_ALLREDUCE, 1 << 30, 1, 2, 4, &mut ring),
            nccl::SUCCESS
        );
        assert_eq!(ring, 12345, "RING's chunk is NCCL's");
        assert_eq!(
            chunk_fn(ctx, FUNC_ALLREDUCE, 1 << 30, 2, 2, 4, null_mut()),
            nccl::SUCCESS
        );
        assert_eq!((t.finalize)(ctx), nccl::SUCCESS);
        assert_eq!((t.finalize)(ctx), nccl::INVALID_ARGUMENT, "finalize twice");

        // v5: the same init, NULL nvlDomainInfo and constants accepted.
        let t = &ncclTunerPlugin_v5;
        let mut ctx = null_mut();
        assert_eq!(
            (t.init)(&mut ctx, 8, 2, 2, None, null_mut(), null_mut()),
            nccl::SUCCESS
        );
        assert_eq!(
            (t.get_coll_info)(
                ctx,
                FUNC_ALLREDUCE,
                1 << 20,
                1,
                tp,
                NALGO,
                NPROTO,
                1,
                &mut nch
            ),
            nccl::SUCCESS
        );
        assert_eq!((t.finalize)(ctx), nccl::SUCCESS);

        // v4 and v3: init(nRanks, nNodes, logger, ctx), destroy.
        let t = &ncclTunerPlugin_v4;
        let mut ctx = null_mut();
        assert_eq!((t.init)(8, 8, None, &mut ctx), nccl::SUCCESS);
        assert_eq!(
            (t.get_coll_info)(ctx, 2, 1 << 20, 1, tp, NALGO, NPROTO, 0, &mut nch),
            nccl::SUCCESS
        );
        assert_eq!((t.destroy)(ctx), nccl::SUCCESS);
        let t = &ncclTunerPlugin_v3;
        let mut ctx = null_mut();
        assert_eq!((t.init)(8, 8, None, &mut ctx), nccl::SUCCESS);
        assert_eq!(
            (t.get_coll_info)(ctx, 3, 1 << 20, 1, tp, NALGO, NPROTO, &mut nch),
            nccl::SUCCESS
        );
        assert_eq!((t.destroy)(ctx), nccl::SUCCESS);

        // v2: no cost table; the outputs stay NCCL's.
        let t = &ncclTunerPlugin_v2;
        let mut ctx = null_mut();
        assert_eq!((t.init)(8, 8, None, &mut ctx), nccl::SUCCESS);
        let (mut a, mut p, mut c) = (-1, -1, 0);
        assert_eq!(
            (t.get_coll_info)(ctx, FUNC_ALLREDUCE, 1024, 1, 0, 1, &mut a, &mut p, &mut c),
            nccl::SUCCESS
        );
        assert_eq!((a, p, c), (-1, -1, 0));
        assert_eq!((t.destroy)(ctx), nccl::SUCCESS);
    }
    // The -1 cells stayed -1 through every call.
    assert_eq!(cells[ALGO_COLLNET_DIRECT * 3 + 1], IGNORE);
    assert_eq!(cells[3 * 3 + PROTO_SIMPLE], IGNORE);
}

#[test]
fn bad_arguments_are_errors_only_where_nccl_can_take_one() {
    let mut cells = table();
    let before = cells.clone();
    let tp = cells.as_mut_ptr() as *mut *mut f32;
    let mut nch = 0;
    // SAFETY: NULL and garbage pointers where the tuner must check them; valid ones elsewhere.
    unsafe {
        let t = &ncclTunerPlugin_v6;
        assert_eq!(
            (t.init)(null_mut(), 1, 2, 2, None, null_mut(), null_mut()),
            nccl::INVALID_ARGUMENT
        );
        assert_eq!(
            (ncclTunerPlugin_v2.init)(2, 2, None, null_mut()),
            nccl::INVALID_ARGUMENT
        );
        let garbage = 0xdead_b0b0usize as *mut c_void;
        // An unknown context, a NULL table, a negative or absurd size: success, nothing written.
        assert_eq!(
            (t.get_coll_info)(
                garbage,
                FUNC_ALLREDUCE,
                1024,
                1,
                tp,
                NALGO,
                NPROTO,
                0,
                &mut nch
            ),
            nccl::SUCCESS
        );
        let mut ctx = null_mut();
        assert_eq!(
            (t.init)(&mut ctx, 1, 4, 4, None, null_mut(), null_mut()),
            nccl::SUCCESS
        );
        assert_eq!(
            (t.get_coll_info)(
                ctx,
                FUNC_ALLREDUCE,
                1024,
                1,
                null_mut(),
                NALGO,
                NPROTO,
                0,
                &mut nch
            ),
            nccl::SUCCESS
        );
        assert_eq!(
            (t.get_coll_info)(ctx, FUNC_ALLREDUCE, 1024, 1, tp, -7, NPROTO, 0, &mut nch),
            nccl::SUCCESS
        );
        assert_eq!(
            (t.get_coll_info)(
                ctx,
                FUNC_ALLREDUCE,
                1024,
                1,
                tp,
                1 << 20,
                1 << 20,
                0,
                &mut nch
            ),
            nccl::SUCCESS
        );
        assert_eq!(
            (t.get_coll_info)(
                ctx,
                FUNC_ALLREDUCE,
                1024,
                1,
                tp,
                NALGO,
                NPROTO,
                0,
                null_mut()
            ),
            nccl::SUCCESS
        );
        let mut chunk = 5usize;
        assert_eq!(
            t.get_chunk_size.unwrap()(garbage, FUNC_ALLREDUCE, 1024, 2, 2, 1, &mut chunk),
            nccl::SUCCESS
        );
        assert_eq!(chunk, 5);
        assert_eq!((t.finalize)(garbage), nccl::INVALID_ARGUMENT);
        assert_eq!((t.finalize)(ctx), nccl::SUCCESS);
        assert_eq!(
            (ncclTunerPlugin_v2.get_coll_info)(
                garbage,
                4,
                1,
                0,
                0,
                1,
                null_mut(),
                null_mut(),
                null_mut()
            ),
            nccl::SUCCESS
        );
    }
    // Only the call with a NULL nChannels (which the tuner never writes) priced the table.
    for i in 0..cells.len() {
        if i != ALGO_COLLNET_DIRECT * 3 + PROTO_SIMPLE {
            assert_eq!(cells[i].to_bits(), before[i].to_bits(), "cell {i}");
        }
    }
}

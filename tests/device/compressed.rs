//! Compressed calls on device buffers, shared by the emulated-device tests (`device_capi`)
//! and the GPU's (`device_capi_gpu`).
use super::*;
use crate::capi::{comm, last_error};
use nccl_net_fabricoll::device::Device;
use std::os::raw::c_void;

/// A communicator that compresses (`fabricoll_config.compress`, bf16) compresses its device
/// calls too, blocking and stream-ordered, slice by slice: each element's result depends on
/// the elements alone in bf16 (no block scale: every contribution rounded once, summed in f32
/// in rank order, the sum rounded once), so a device call of several slices must give the
/// host call's bits exactly, and those differ from the uncompressed sum.
pub fn like_the_host_calls(d: &Device, test: &str) {
    let mut cfg = config();
    cfg.compress = fabricoll_compress::FABRICOLL_COMPRESS_BF16 as _;
    let (n, count) = (3, 700_001);
    let inputs: Vec<Vec<f32>> = (0..n)
        .map(|r| nccl_net_fabricoll::testing::values::values(11 + r as u64, count, None))
        .collect();
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_ne_bytes()).collect() };
    on_ranks_with(d, test, &cfg, n, |me, c, ready| {
        let (cm, f32t, sum) = (comm(c), Ty::F32.c(), Op::Sum.c());
        let s = d.create_stream().unwrap();
        let input = bytes(&inputs[me]);
        // The host calls: the reference.
        let mut host = vec![0f32; count];
        let st = fabricoll_allreduce(
            input.as_ptr().cast(),
            host.as_mut_ptr().cast(),
            count,
            f32t,
            sum,
            cm,
        );
        assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
        let plain: Vec<f32> = (0..count)
            .map(|i| inputs.iter().fold(0f32, |a, v| a + v[i]))
            .collect();
        let differ = host
            .iter()
            .zip(&plain)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert!(
            differ > count / 2,
            "rank {me}: the host call was not compressed ({differ} elements differ)"
        );
        let block = count / n;
        let mut host_rs = vec![0f32; block];
        let st = fabricoll_reducescatter(
            input.as_ptr().cast(),
            host_rs.as_mut_ptr().cast(),
            block,
            f32t,
            sum,
            cm,
        );
        assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
        let mut host_ag = vec![0f32; block * n];
        let st = fabricoll_allgather(
            input.as_ptr().cast(),
            host_ag.as_mut_ptr().cast(),
            block,
            f32t,
            cm,
        );
        assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
        // The same calls on device buffers, blocking then stream-ordered.
        let mut x = Buf::new(d, &s, Place::Device, &input);
        for stream in [false, true] {
            let mut y = Buf::new(d, &s, Place::Device, &vec![0u8; count * 4]);
            let mut z = Buf::new(d, &s, Place::Device, &vec![0u8; block * 4]);
            let mut w = Buf::new(d, &s, Place::Device, &vec![0u8; block * n * 4]);
            ready.wait();
            let sts = if stream {
                let h = s.handle();
                [
                    fabricoll_allreduce_stream(x.ptr(), y.ptr(), count, f32t, sum, cm, h),
                    fabricoll_reducescatter_stream(x.ptr(), z.ptr(), block, f32t, sum, cm, h),
                    fabricoll_allgather_stream(x.ptr(), w.ptr(), block, f32t, cm, h),
                ]
            } else {
                [
                    fabricoll_allreduce(x.ptr(), y.ptr(), count, f32t, sum, cm),
                    fabricoll_reducescatter(x.ptr(), z.ptr(), block, f32t, sum, cm),
                    fabricoll_allgather(x.ptr(), w.ptr(), block, f32t, cm),
                ]
            };
            assert_eq!(sts, [FABRICOLL_SUCCESS; 3], "{}", last_error());
            s.synchronize(WAIT).unwrap();
            no_async_error(cm);
            let what = if stream { "stream-ordered" } else { "blocking" };
            assert!(
                y.read(&s, count * 4) == bytes(&host),
                "rank {me}: {what} allreduce"
            );
            assert!(
                z.read(&s, block * 4) == bytes(&host_rs),
                "rank {me}: {what} reducescatter"
            );
            assert!(
                w.read(&s, block * n * 4) == bytes(&host_ag),
                "rank {me}: {what} allgather"
            );
        }
    });
}

/// A call's own compression (`fabricoll_collective_options`) on device buffers of a
/// communicator that compresses nothing: every slice of the call runs with it, blocking and
/// non-blocking (whose slices the worker starts, on its own thread), so the result is the
/// host call's bits under the same option, which differ from the uncompressed sum. A format
/// on a device call it does not apply to is refused when the call is made, naming `compress`.
pub fn own_compression_on_every_slice(d: &Device, test: &str) {
    let (n, count) = (2, 700_001);
    let inputs: Vec<Vec<f32>> = (0..n)
        .map(|r| nccl_net_fabricoll::testing::values::values(31 + r as u64, count, None))
        .collect();
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_ne_bytes()).collect() };
    on_ranks_with(d, test, &config(), n, |me, c, ready| {
        let cm = comm(c);
        let s = d.create_stream().unwrap();
        let mut o = std::mem::MaybeUninit::<fabricoll_call_options>::uninit();
        let size = std::mem::size_of::<fabricoll_call_options>();
        // SAFETY: `o` is writable for `size` bytes.
        let st = unsafe { fabricoll_call_options_init_size(o.as_mut_ptr(), size) };
        assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
        // SAFETY: fabricoll_call_options_init_size wrote every field.
        let mut o = unsafe { o.assume_init() };
        o.compress = fabricoll_compress::FABRICOLL_COMPRESS_BF16 as _;
        let allreduce = |send: *const c_void, recv: *mut c_void| fabricoll_call {
            coll: fabricoll_coll::FABRICOLL_COLL_ALLREDUCE as _,
            sendbuf: send,
            recvbuf: recv,
            count,
            datatype: Ty::F32.c(),
            op: Op::Sum.c(),
            root: 0,
            algo: 0,
        };
        let run = |call: &fabricoll_call, nonblocking: bool| -> fabricoll_status {
            if !nonblocking {
                // SAFETY: the call's buffers outlive the blocking call; the options are whole.
                return unsafe { fabricoll_collective_options(call, &o, cm, std::ptr::null_mut()) };
            }
            let mut req = std::ptr::null_mut();
            // SAFETY: as above; the buffers outlive the wait below.
            let st = unsafe { fabricoll_collective_options(call, &o, cm, &mut req) };
            if st != FABRICOLL_SUCCESS {
                return st;
            }
            fabricoll_wait(req)
        };
        let input = bytes(&inputs[me]);
        let mut host = vec![0f32; count];
        let st = run(
            &allreduce(input.as_ptr().cast(), host.as_mut_ptr().cast()),
            false,
        );
        assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
        let plain: Vec<f32> = (0..count)
            .map(|i| inputs.iter().fold(0f32, |a, v| a + v[i]))
            .collect();
        let differ = (0..count)
            .filter(|&i| host[i].to_bits() != plain[i].to_bits())
            .count();
        assert!(
            differ > count / 2,
            "rank {me}: the host call was not compressed"
        );
        let mut x = Buf::new(d, &s, Place::Device, &input);
        for nonblocking in [false, true] {
            let mut y = Buf::new(d, &s, Place::Device, &vec![0u8; count * 4]);
            ready.wait();
            let st = run(&allreduce(x.ptr(), y.ptr()), nonblocking);
            assert_eq!(st, FABRICOLL_SUCCESS, "{}", last_error());
            no_async_error(cm);
            assert!(
                y.read(&s, count * 4) == bytes(&host),
                "rank {me}: nonblocking {nonblocking}"
            );
        }
        // Broadcast is not compressed: refused at once, naming the option, on every rank.
        let mut y = Buf::new(d, &s, Place::Device, &[0u8; 64]);
        let mut b = allreduce(x.ptr(), y.ptr());
        b.coll = fabricoll_coll::FABRICOLL_COLL_BROADCAST as _;
        b.count = 16;
        assert_eq!(run(&b, false), FABRICOLL_INVALID_ARGUMENT);
        assert!(last_error().contains("'compress'"), "{}", last_error());
        no_async_error(cm);
    });
}

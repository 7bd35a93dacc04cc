//! The device seam on a real GPU (CUDA device 0): the checks of tests/device_emu.rs, plus
//! classification of what the driver allocates directly, every kernel against the host
//! reducers on random data, and the f32 sum kernel's bandwidth at 256 MiB.
//! Every test needs a GPU; scripts/gpu-tests.sh runs them with `--ignored --test-threads=1`.
mod device_checks;

use cudarc::driver::sys;
use nccl_net_fabricoll::device::{Device, DeviceKind, PtrKind};

fn gpu() -> Device {
    nccl_net_fabricoll::testing::backtrace_on_fatal_signal();
    let d = Device::cuda(0).expect("CUDA device 0");
    assert_eq!(d.kind(), DeviceKind::Cuda);
    eprintln!(
        "device: {:?}, compute {:?}, stream memory operations {}",
        d.info().name,
        d.info().compute,
        d.info().stream_mem_ops
    );
    d
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_alloc_and_classify() {
    device_checks::alloc_and_classify(&gpu());
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_classify_driver_allocations() {
    let dev = gpu();
    let mut d: sys::CUdeviceptr = 0;
    let mut h: *mut std::ffi::c_void = std::ptr::null_mut();
    let mut m: sys::CUdeviceptr = 0;
    // SAFETY: the device's context is current (gpu() binds it); each out-parameter is a valid
    // place; the allocations are freed below and not used otherwise.
    unsafe {
        assert_eq!(
            sys::cuMemAlloc_v2(&mut d, 4096),
            sys::CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            sys::cuMemAllocHost_v2(&mut h, 4096),
            sys::CUresult::CUDA_SUCCESS
        );
        let global = sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as u32;
        assert_eq!(
            sys::cuMemAllocManaged(&mut m, 4096, global),
            sys::CUresult::CUDA_SUCCESS
        );
    }
    let malloced = vec![0u8; 4096];
    assert_eq!(
        dev.classify(d as *const _).unwrap(),
        PtrKind::Device { ordinal: 0 }
    );
    assert_eq!(dev.classify(h).unwrap(), PtrKind::PinnedHost);
    assert_eq!(dev.classify(m as *const _).unwrap(), PtrKind::Managed);
    assert_eq!(
        dev.classify(malloced.as_ptr().cast()).unwrap(),
        PtrKind::Host
    );
    // SAFETY: freeing what was allocated above, once, with nothing using it.
    unsafe {
        sys::cuMemFree_v2(d);
        sys::cuMemFreeHost(h);
        sys::cuMemFree_v2(m);
    }
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_copies() {
    device_checks::copies(&gpu());
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_events() {
    device_checks::events(&gpu());
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_flags_both_directions() {
    device_checks::flags(&gpu());
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_flag_timeouts() {
    device_checks::flag_timeouts(&gpu());
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_thousand_round_trips() {
    let dev = gpu();
    let t = std::time::Instant::now();
    device_checks::round_trips(&dev, 1000);
    println!(
        "host flag -> kernel -> copy -> stream flag: {:.1} us per round trip",
        t.elapsed().as_secs_f64() * 1e6 / 1000.0
    );
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_caller_streams() {
    device_checks::caller_streams(&gpu());
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_needs_context() {
    device_checks::needs_context(&gpu());
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_raw_pointer_misuse() {
    device_checks::raw_pointer_misuse(&gpu());
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_drop_while_in_use() {
    device_checks::drop_while_in_use(&gpu());
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_free_device_memory_while_a_stream_waits() {
    device_checks::free_while_a_stream_waits(&gpu(), false);
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_free_page_locked_memory_while_a_stream_waits() {
    // Whether cuMemFreeHost waits for the device: if this fails, the data path must keep its
    // page-locked buffers for the communicator's life (docs/device.md).
    device_checks::free_while_a_stream_waits(&gpu(), true);
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_kernels_match_host() {
    let dev = gpu();
    let t = std::time::Instant::now();
    // An odd count, so that the last block is partial.
    device_checks::kernels_match_host(&dev, (1 << 20) + 3, 0x5eed);
    eprintln!(
        "every dtype x op checked in {:.1} s (NVRTC compile included)",
        t.elapsed().as_secs_f64()
    );
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_kernels_compile() {
    // NVRTC alone (no device needed, but it lives on the GPU machine): every kernel is in the
    // machine code for an old and a new architecture (NVRTC 13 starts at sm_75).
    for cc in [(7, 5), (9, 0)] {
        let image = nccl_net_fabricoll::device::cuda::kernels_image(cc).expect("NVRTC compiles");
        assert_eq!(&image[..4], b"\x7fELF", "{cc:?}: a cubin is an ELF image");
        for name in nccl_net_fabricoll::device::kernels::names() {
            let found = image
                .windows(name.len() + 1)
                .any(|w| &w[..name.len()] == name.as_bytes() && w[name.len()] == 0);
            assert!(found, "{cc:?}: {name} missing");
        }
        eprintln!("sm_{}{}: {} bytes of machine code", cc.0, cc.1, image.len());
    }
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_kernel_small() {
    // One small case: what compute-sanitizer's memcheck runs (scripts/gpu-tests.sh).
    device_checks::kernels_match_host(&gpu(), 1000, 7);
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_kernels_repeat_and_misuse() {
    let dev = gpu();
    device_checks::kernels_repeat(&dev);
    device_checks::kernel_misuse(&dev);
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn gpu_kernel_bandwidth() {
    let dev = gpu();
    let gbs = device_checks::bandwidth(&dev, 256 << 20, 20);
    println!("f32 sum kernel, 256 MiB (dst = a + b): {gbs:.0} GB/s of memory traffic");
    assert!(gbs > 100.0, "{gbs} GB/s");
}

//! The net plugin's device-memory paths on the emulated device (the CI stand-in for a GPU,
//! whose device memory the host cannot touch): regMr's classification of NCCL_PTR_CUDA
//! buffers (device memory and which device; host and freed memory refused, naming what they
//! are), its refusal where the device takes host memory only and where the transport cannot
//! register device memory (the in-process one), and iflush's sentinel read. tests/plugin_gpu.rs
//! runs the same paths for real on a GPU.
mod common;

use common::net_pair as pair;
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::device::{Device, EmuConfig};
use nccl_net_fabricoll::error::Result;
use nccl_net_fabricoll::plugin::{gpu, Plugin, NCCL_PTR_CUDA, NCCL_PTR_HOST};
use nccl_net_fabricoll::transport::loopback::LoopbackFabric;
use nccl_net_fabricoll::transport::Region;

fn emu(ordinal: i32) -> Device {
    Device::emulated(EmuConfig {
        ordinal,
        ..EmuConfig::default()
    })
    .expect("emulated device")
}

fn region_at(addr: u64, len: usize) -> Region {
    // SAFETY: the regions name memory that outlives every use below, and nothing is posted on
    // them (regMr and classification only, or a copy that is waited for).
    unsafe { Region::from_raw(addr as *mut u8, len) }
}

#[test]
fn classification_names_the_device_and_refuses_the_rest() {
    let dev = emu(3);
    let buf = dev.alloc(4096).unwrap();
    assert_eq!(
        gpu::ordinal_on(&dev, &region_at(buf.addr(), 4096)).unwrap(),
        3
    );
    // Inside the allocation too.
    assert_eq!(
        gpu::ordinal_on(&dev, &region_at(buf.addr() + 100, 8)).unwrap(),
        3
    );
    let host = [0u8; 64];
    let e = gpu::ordinal_on(&dev, &region_at(host.as_ptr() as u64, 64)).unwrap_err();
    assert!(e.to_string().contains("not device memory"), "{e}");
    let gone = buf.addr();
    drop(buf);
    let e = gpu::ordinal_on(&dev, &region_at(gone, 4096)).unwrap_err();
    assert!(e.to_string().contains("freed"), "{e}");
}

#[test]
fn the_sentinel_read_reads_device_memory_to_a_deadline() {
    let dev = emu(0);
    let buf = dev.alloc(1 << 16).unwrap();
    let sentinel = gpu::Sentinel::new(&dev).unwrap();
    for _ in 0..3 {
        sentinel
            .read(
                &dev,
                &region_at(buf.addr(), 1 << 16),
                gpu::SENTINEL_DEADLINE,
            )
            .unwrap();
    }
    // A word past the end of the allocation is not the device's: refused, not read.
    let e = sentinel.read(
        &dev,
        &region_at(buf.addr() + (1 << 16) - 2, 2),
        gpu::SENTINEL_DEADLINE,
    );
    assert!(e.is_err(), "a read past the allocation worked");
}

/// NCCL's kernel waits for the proxy's flush: the flush must not wait for the kernel. The
/// emulated device, as the driver, makes allocating page-locked memory wait for every stream
/// of the device, so a flush that allocated its word would time out here.
#[test]
fn a_flush_while_a_kernel_waits_for_it_allocates_nothing() {
    let dev = emu(0);
    let buf = dev.alloc(1 << 16).unwrap();
    let sentinel = gpu::Sentinel::new(&dev).unwrap();
    let kernel = dev.create_stream().unwrap();
    let gate = dev.create_flag("kernel-waits-for-the-flush").unwrap();
    kernel.wait_flag(&gate, 1).unwrap();
    let read = sentinel.read(
        &dev,
        &region_at(buf.addr(), 1 << 16),
        gpu::SENTINEL_DEADLINE,
    );
    gate.set(1);
    read.unwrap();
    kernel.synchronize(gpu::SENTINEL_DEADLINE).unwrap();
}

/// A loopback plugin of one device, 1 MiB of emulated device `ordinal`'s memory, and a
/// classifier of regions on that device, for `test`.
fn with_device_memory(
    ordinal: i32,
    test: impl FnOnce(&mut Plugin, Region, &dyn Fn(Region) -> Box<dyn FnOnce() -> Result<i32>>),
) {
    let dev = emu(ordinal);
    let buf = dev.alloc(1 << 20).unwrap();
    let devmem = region_at(buf.addr(), 1 << 20);
    let f = LoopbackFabric::new();
    let cfg = Config::from_lookup(|_| None).unwrap();
    let mut p = Plugin::loopback(&f, 1, &cfg);
    let classify = |r: Region| -> Box<dyn FnOnce() -> Result<i32>> {
        let d = dev.clone();
        Box::new(move || gpu::ordinal_on(&d, &r))
    };
    test(&mut p, devmem, &classify);
}

#[test]
fn reg_mr_of_device_memory_says_why_it_cannot() {
    with_device_memory(1, |p, devmem, classify| {
        // Host memory only (as every device without a working device registration).
        {
            let d = &p.devices[0];
            let (s, _r) = pair(d);
            let e = d
                .reg_mr_with(s, devmem, NCCL_PTR_CUDA, classify(devmem))
                .unwrap_err();
            assert!(e.to_string().contains("host memory only"), "{e}");
            for bad in [0, 3, 4] {
                let e = d.reg_mr_with(s, devmem, bad, classify(devmem)).unwrap_err();
                assert!(e.to_string().contains("neither"), "{e}");
            }
        }
        // A device that takes device memory: host memory under NCCL_PTR_CUDA is refused by the
        // classification, and device memory reaches the transport, which says it cannot.
        p.devices[0].props.ptr_support = NCCL_PTR_HOST | NCCL_PTR_CUDA;
        let d = &p.devices[0];
        let (s, r) = pair(d);
        let mut host = vec![0u8; 4096];
        // SAFETY: `host` outlives the registration.
        let hr = unsafe { Region::from_raw(host.as_mut_ptr(), host.len()) };
        let e = d
            .reg_mr_with(s, hr, NCCL_PTR_CUDA, classify(hr))
            .unwrap_err();
        assert!(e.to_string().contains("not device memory"), "{e}");
        let e = d
            .reg_mr_with(s, devmem, NCCL_PTR_CUDA, classify(devmem))
            .unwrap_err();
        assert!(
            e.to_string().contains("does not register device memory"),
            "{e}"
        );
        // Host memory still registers, and iflush of a host receive has nothing to flush.
        let mh = d.reg_mr(r, hr, NCCL_PTR_HOST).unwrap();
        assert_eq!(d.iflush(r, &[(hr, 0, mh)]).unwrap(), None);
        d.dereg_mr(r, mh).unwrap();
        assert!(d.iflush(r, &[]).is_err(), "iflush of no buffer");
    });
}

#[test]
fn reg_mr_dmabuf_takes_device_memory_only_where_dmabufs_are_advertised() {
    use nccl_net_fabricoll::cuda::caps::PTR_DMABUF;
    use nccl_net_fabricoll::transport::DmaBuf;
    with_device_memory(2, |p, devmem, classify| {
        let fd = DmaBuf { fd: 7, offset: 0 };
        // Device memory without NCCL_PTR_DMABUF: refused, naming the fd.
        p.devices[0].props.ptr_support = NCCL_PTR_HOST | NCCL_PTR_CUDA;
        {
            let d = &p.devices[0];
            let (s, _r) = pair(d);
            let e = d
                .reg_mr_dmabuf_with(s, devmem, fd, classify(devmem))
                .unwrap_err();
            assert!(
                e.to_string().contains("fd") && e.to_string().contains("NCCL_PTR_DMABUF"),
                "{e}"
            );
        }
        p.devices[0].props.ptr_support = NCCL_PTR_HOST | NCCL_PTR_CUDA | PTR_DMABUF;
        let d = &p.devices[0];
        let (s, r) = pair(d);
        let mut host = vec![0u8; 4096];
        // SAFETY: `host` outlives the registration.
        let hr = unsafe { Region::from_raw(host.as_mut_ptr(), host.len()) };
        // Host memory named as a dma-buf's is not device memory; device memory reaches the
        // transport, which says it cannot take dma-bufs.
        let e = d.reg_mr_dmabuf_with(s, hr, fd, classify(hr)).unwrap_err();
        assert!(e.to_string().contains("not device memory"), "{e}");
        let e = d
            .reg_mr_dmabuf_with(s, devmem, fd, classify(devmem))
            .unwrap_err();
        assert!(e.to_string().contains("does not register dma-bufs"), "{e}");
        // A host buffer, or no fd, registers as regMr does.
        let mh = d.reg_mr_dmabuf(r, hr, NCCL_PTR_HOST, 0, -1).unwrap();
        d.dereg_mr(r, mh).unwrap();
        let mh = d.reg_mr_dmabuf(r, hr, NCCL_PTR_HOST, 0, 5).unwrap();
        d.dereg_mr(r, mh).unwrap();
    });
}

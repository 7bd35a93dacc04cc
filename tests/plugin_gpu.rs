//! The net plugin on device memory, on a GPU (scripts/gpu-tests.sh runs it, with libfabric 2.1
//! built with CUDA on LD_LIBRARY_PATH, whose shm provider takes FI_HMEM_CUDA registrations):
//! through the exported `ncclNetPlugin_v12` table, as NCCL calls it, device 0 reports
//! NCCL_PTR_CUDA (a real registration of a cuMemAlloc buffer worked), regMr takes cuMemAlloc
//! memory as NCCL_PTR_CUDA and refuses host memory under that type, device buffers travel
//! byte-exact between a sending and a receiving thread (sizes 1 B to 8 MiB), `iflush` of a
//! receive into device memory succeeds, and CollNet still reports host memory only. Where the
//! device also reports NCCL_PTR_DMABUF, every other send buffer is registered through
//! regMrDmaBuf with a dma-buf the driver exported for it, as NCCL does.
use cudarc::driver::{result, sys, CudaContext};
use nccl_net_fabricoll::cuda::caps::PTR_DMABUF;
use nccl_net_fabricoll::error::nccl;
use nccl_net_fabricoll::ffi::collnet::ncclCollNetPlugin_v12;
use nccl_net_fabricoll::ffi::net::ncclNetPlugin_v12;
use nccl_net_fabricoll::ffi::types::PropsV12;
use nccl_net_fabricoll::plugin::{NCCL_PTR_CUDA, NCCL_PTR_HOST};
use std::ffi::c_void;
use std::os::raw::c_int;
use std::ptr::null_mut;
use std::sync::Arc;
use std::time::{Duration, Instant};

type P = *mut c_void;

/// A pointer handed to another thread (the plugin's comms and requests are thread-safe).
#[derive(Clone, Copy)]
struct Ptr(P);
// SAFETY: the plugin's handles may be used from any thread (NCCL's proxy does).
unsafe impl Send for Ptr {}

const SIZES: [usize; 5] = [1, 4096, 65536 + 3, (1 << 20) + 5, 8 << 20];

fn deadline(start: Instant, what: &str) {
    assert!(start.elapsed() < Duration::from_secs(30), "{what} hung");
}

/// Device memory of `len` bytes in `ctx` (current on this thread), freed on drop.
struct Dev {
    ptr: sys::CUdeviceptr,
    len: usize,
    ctx: Arc<CudaContext>,
}

impl Dev {
    fn new(ctx: &Arc<CudaContext>, len: usize) -> Dev {
        ctx.bind_to_thread().unwrap();
        // SAFETY: a context is current on this thread.
        let ptr = unsafe { result::malloc_sync(len.max(1)) }.unwrap();
        Dev {
            ptr,
            len,
            ctx: ctx.clone(),
        }
    }

    fn write(&self, data: &[u8]) {
        self.ctx.bind_to_thread().unwrap();
        // SAFETY: `data` fits the allocation.
        unsafe { result::memcpy_htod_sync(self.ptr, data) }.unwrap();
    }

    fn read(&self) -> Vec<u8> {
        self.ctx.bind_to_thread().unwrap();
        let mut v = vec![0u8; self.len];
        // SAFETY: `v` has the allocation's length.
        unsafe { result::memcpy_dtoh_sync(&mut v, self.ptr) }.unwrap();
        v
    }

    fn p(&self) -> P {
        self.ptr as P
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by malloc_sync in this context; no operation uses it any more.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

fn wait(req: P) -> c_int {
    let start = Instant::now();
    let (mut done, mut size): (c_int, c_int) = (0, -1);
    loop {
        // SAFETY: a live request of this plugin; writable out-pointers.
        let rc = unsafe { (ncclNetPlugin_v12.test)(req, &mut done, &mut size) };
        assert_eq!(rc, nccl::SUCCESS, "test");
        if done != 0 {
            return size;
        }
        deadline(start, "request");
    }
}

fn reg(comm: P, d: &Dev, ty: c_int) -> (c_int, P) {
    let mut mh: P = null_mut();
    // SAFETY: a live comm; the buffer outlives the registration.
    let rc = unsafe { (ncclNetPlugin_v12.reg_mr)(comm, d.p(), d.len, ty, &mut mh) };
    (rc, mh)
}

/// regMrDmaBuf of `d` through a dma-buf the driver exports for its whole allocation (whose
/// length must be a multiple of the page size, as the driver requires), closed after the call
/// as NCCL closes it.
fn reg_dmabuf(comm: P, d: &Dev) -> (c_int, P) {
    d.ctx.bind_to_thread().unwrap();
    let mut fd: c_int = -1;
    // SAFETY: a context is current; `fd` is a valid place for the handle; the range is this
    // allocation.
    let r = unsafe {
        sys::cuMemGetHandleForAddressRange(
            (&mut fd as *mut c_int).cast(),
            d.ptr,
            d.len,
            sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
            0,
        )
    };
    assert_eq!(
        r,
        sys::CUresult::CUDA_SUCCESS,
        "cuMemGetHandleForAddressRange"
    );
    let mut mh: P = null_mut();
    // SAFETY: a live comm; the buffer outlives the registration; `fd` is open for the call.
    let rc = unsafe {
        (ncclNetPlugin_v12.reg_mr_dmabuf)(comm, d.p(), d.len, NCCL_PTR_CUDA, 0, fd, &mut mh)
    };
    // SAFETY: the descriptor the driver made for us, closed once.
    unsafe { libc::close(fd) };
    (rc, mh)
}

fn props() -> PropsV12 {
    // SAFETY: all-zero is a valid PropsV12 (pointers NULL, numbers 0) for getProperties to fill.
    let mut p: PropsV12 = unsafe { std::mem::zeroed() };
    // SAFETY: a writable props struct of v12's layout.
    let rc = unsafe { (ncclNetPlugin_v12.get_properties)(0, &mut p) };
    assert_eq!(rc, nccl::SUCCESS);
    p
}

/// Listen on this thread, connect on another, accept here: (send comm, receive comm).
fn pair(ctx: P) -> (P, P) {
    let t = &ncclNetPlugin_v12;
    let mut handle = [0u8; 128];
    let mut listen: P = null_mut();
    // SAFETY: a 128-byte handle and a writable out-pointer.
    let rc = unsafe { (t.listen)(ctx, 0, handle.as_mut_ptr().cast(), &mut listen) };
    assert_eq!(rc, nccl::SUCCESS);
    let c = Ptr(ctx);
    let sender = std::thread::spawn(move || {
        let c = c;
        let mut handle = handle;
        let mut s: P = null_mut();
        let start = Instant::now();
        while s.is_null() {
            // SAFETY: the handle from listen; writable out-pointers.
            let rc = unsafe { (t.connect)(c.0, 0, handle.as_mut_ptr().cast(), &mut s, null_mut()) };
            assert_eq!(rc, nccl::SUCCESS, "connect");
            deadline(start, "connect");
        }
        Ptr(s)
    });
    let mut r: P = null_mut();
    let start = Instant::now();
    while r.is_null() {
        // SAFETY: a live listen comm; writable out-pointers.
        let rc = unsafe { (t.accept)(listen, &mut r, null_mut()) };
        assert_eq!(rc, nccl::SUCCESS);
        deadline(start, "accept");
    }
    let s = sender.join().unwrap();
    // SAFETY: the listen comm from above.
    assert_eq!(unsafe { (t.close_listen)(listen) }, nccl::SUCCESS);
    (s.0, r)
}

#[test]
#[ignore = "needs a GPU: scripts/gpu-tests.sh runs it"]
fn device_memory_through_the_v12_table_over_shm() {
    std::env::set_var("FABRICOLL_PROVIDER", "shm");
    std::env::set_var("FABRICOLL_TIMEOUT_MS", "20000");
    std::env::set_var("FABRICOLL_LOG", "info");
    nccl_net_fabricoll::testing::backtrace_on_fatal_signal();
    let cuda = CudaContext::new(0).expect("CUDA device 0");
    let t = &ncclNetPlugin_v12;
    let mut ctx: P = null_mut();
    // SAFETY: a writable context out-pointer; no config, logger or profiler.
    let rc = unsafe { (t.init)(&mut ctx, 1, null_mut(), None, null_mut()) };
    assert_eq!(rc, nccl::SUCCESS, "init over shm");
    // A real registration of device memory worked at discovery: NCCL_PTR_CUDA (the log line
    // "ptrSupport ..." says why where it did not).
    let p = props();
    assert_eq!(
        p.ptr_support & NCCL_PTR_CUDA,
        NCCL_PTR_CUDA,
        "ptrSupport {:#x}: shm did not take a CUDA buffer (is libfabric 2.1 with CUDA on \
         LD_LIBRARY_PATH?)",
        p.ptr_support
    );
    // CollNet reduces on the CPU: host memory only.
    // SAFETY: all-zero is a valid PropsV12 to fill.
    let mut cp: PropsV12 = unsafe { std::mem::zeroed() };
    // SAFETY: a writable props struct of v12's layout.
    let rc = unsafe { (ncclCollNetPlugin_v12.get_properties)(0, &mut cp) };
    assert_eq!(rc, nccl::SUCCESS);
    assert_eq!(cp.ptr_support, NCCL_PTR_HOST);

    let (s, r) = pair(ctx);
    // Host memory registered as NCCL_PTR_CUDA is refused, naming it.
    let mut host = vec![0u8; 4096];
    let mut mh: P = null_mut();
    // SAFETY: a live comm; the buffer outlives the call.
    let rc = unsafe {
        (t.reg_mr)(
            s,
            host.as_mut_ptr().cast(),
            host.len(),
            NCCL_PTR_CUDA,
            &mut mh,
        )
    };
    assert_ne!(rc, nccl::SUCCESS, "host memory registered as NCCL_PTR_CUDA");

    let dmabufs = p.ptr_support & PTR_DMABUF != 0;
    println!(
        "ptrSupport {:#x}: dma-bufs {}",
        p.ptr_support,
        if dmabufs { "too" } else { "no" }
    );
    for (k, &size) in SIZES.iter().enumerate() {
        let dmabuf = dmabufs && k % 2 == 1;
        let src = Dev::new(
            &cuda,
            if dmabuf {
                size.next_multiple_of(4096)
            } else {
                size
            },
        );
        let dst = Dev::new(&cuda, size + 64);
        let data: Vec<u8> = (0..size).map(|i| (i * 13 + k * 7 + 1) as u8).collect();
        src.write(&data);
        dst.write(&vec![0xA5u8; size + 64]);
        let (rc, smh) = if dmabuf {
            reg_dmabuf(s, &src)
        } else {
            reg(s, &src, NCCL_PTR_CUDA)
        };
        assert_eq!(
            rc,
            nccl::SUCCESS,
            "regMr of {size} B of device memory (send)"
        );
        let (rc, rmh) = reg(r, &dst, NCCL_PTR_CUDA);
        assert_eq!(rc, nccl::SUCCESS, "regMr of device memory (receive)");

        // The send on a thread of its own, as NCCL's proxy of another rank would.
        let (sc, sp, smhp) = (Ptr(s), Ptr(src.p()), Ptr(smh));
        let c2 = cuda.clone();
        let sender = std::thread::spawn(move || {
            let (sc, sp, smhp) = (sc, sp, smhp);
            c2.bind_to_thread().unwrap();
            let mut req: P = null_mut();
            let start = Instant::now();
            while req.is_null() {
                // SAFETY: a live comm; the device buffer outlives the request.
                let rc = unsafe {
                    (ncclNetPlugin_v12.isend)(sc.0, sp.0, size, 7, smhp.0, null_mut(), &mut req)
                };
                assert_eq!(rc, nccl::SUCCESS, "isend");
                deadline(start, "isend");
            }
            wait(req)
        });
        let mut req: P = null_mut();
        let (mut d, mut sz, mut tag, mut m) = (dst.p(), size + 64, 7 as c_int, rmh);
        let start = Instant::now();
        while req.is_null() {
            // SAFETY: one-element arrays; the device buffer outlives the request.
            let rc = unsafe {
                (t.irecv)(
                    r,
                    1,
                    &mut d,
                    &mut sz,
                    &mut tag,
                    &mut m,
                    null_mut(),
                    &mut req,
                )
            };
            assert_eq!(rc, nccl::SUCCESS, "irecv");
            deadline(start, "irecv");
        }
        let got = wait(req);
        assert_eq!(sender.join().unwrap(), size as c_int, "bytes sent");
        assert_eq!(got, size as c_int, "bytes received");
        // iflush of the receive into device memory: done at once (no request).
        let mut fd = dst.p();
        let mut fsize = size as c_int;
        let mut fmh = rmh;
        let mut freq: P = 1 as P;
        // SAFETY: one-element arrays of the finished receive; a writable request pointer.
        let rc = unsafe { (t.iflush)(r, 1, &mut fd, &mut fsize, &mut fmh, &mut freq) };
        assert_eq!(rc, nccl::SUCCESS, "iflush of {size} B of device memory");
        assert!(freq.is_null(), "iflush returned a request");
        let back = dst.read();
        assert!(back[..size] == data[..], "{size} B arrived changed");
        assert!(
            back[size..].iter().all(|b| *b == 0xA5),
            "{size} B: written past the message"
        );
        // SAFETY: registrations of these comms, no operation in flight.
        unsafe {
            assert_eq!((t.dereg_mr)(s, smh), nccl::SUCCESS);
            assert_eq!((t.dereg_mr)(r, rmh), nccl::SUCCESS);
        }
    }
    // SAFETY: comms and context of this plugin, nothing in flight.
    unsafe {
        assert_eq!((t.close_send)(s), nccl::SUCCESS);
        assert_eq!((t.close_recv)(r), nccl::SUCCESS);
        assert_eq!((t.finalize)(ctx), nccl::SUCCESS);
    }
}

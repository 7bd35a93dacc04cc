//! The reduction kernels on the driver: `device::kernels::source()` compiled by NVRTC (loaded
//! at run time through cudarc) once per process and compute capability, loaded once per
//! device context, launched on a stream.
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys;
use cudarc::nvrtc;

use super::{check, Ctx};
use crate::device::backend::{Kernel, RawStream};
use crate::device::kernels;
use crate::{Error, Result};

/// The PTX of `kernels::source()` per compute capability, compiled once per process (or the
/// reason it could not be).
fn ptx(cc: (i32, i32)) -> std::result::Result<Arc<CString>, String> {
    static CACHE: OnceLock<Mutex<HashMap<(i32, i32), std::result::Result<Arc<CString>, String>>>> =
        OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
    c.entry(cc).or_insert_with(|| compile(cc)).clone()
}

fn compile(cc: (i32, i32)) -> std::result::Result<Arc<CString>, String> {
    // SAFETY: only tries to dlopen NVRTC's usual names; touches no cudarc state.
    if !unsafe { nvrtc::sys::is_culib_present() } {
        return Err(
            "NVRTC (libnvrtc.so) is not on the loader path: the reduction kernels are \
                    compiled at run time by it (add the CUDA toolkit's lib directory to \
                    LD_LIBRARY_PATH)"
                .into(),
        );
    }
    // One string per compute capability for the life of the process (cudarc wants 'static).
    let arch: &'static str = Box::leak(format!("compute_{}{}", cc.0, cc.1).into_boxed_str());
    let opts = nvrtc::CompileOptions {
        arch: Some(arch),
        options: kernels::nvrtc_options(),
        name: Some("fabricoll_reduce.cu".into()),
        ..Default::default()
    };
    let src = kernels::source();
    // cudarc panics where NVRTC lacks a function it resolves: a guard, not a path taken.
    let out = std::panic::catch_unwind(|| nvrtc::compile_ptx_with_opts(src, opts))
        .map_err(|_| "NVRTC lacks a function cudarc calls (too old an NVRTC?)".to_string())?;
    let ptx = out.map_err(|e| format!("NVRTC could not compile the kernels for {arch}: {e:?}"))?;
    CString::new(ptx.to_src())
        .map(Arc::new)
        .map_err(|_| "NVRTC's PTX holds a NUL byte".to_string())
}

/// The kernels loaded in one context.
pub(super) struct Module {
    module: sys::CUmodule,
    functions: HashMap<String, sys::CUfunction>,
}

// SAFETY: CUmodule and CUfunction handles may be used from any thread with the context.
unsafe impl Send for Module {}
// SAFETY: launching a function from several threads at once is allowed by the driver.
unsafe impl Sync for Module {}

impl Module {
    /// Loads the kernels in `ctx` (which is current on this thread).
    pub(super) fn load(ctx: &Ctx) -> std::result::Result<Module, String> {
        let ptx = ptx(ctx.compute)?;
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `ptx` is a NUL-terminated PTX image; the context is current.
        check(
            unsafe { sys::cuModuleLoadData(&mut module, ptx.as_ptr().cast()) },
            "cuModuleLoadData (the reduction kernels)",
        )
        .map_err(|e| e.to_string())?;
        let mut functions = HashMap::new();
        for name in kernels::names() {
            let c = CString::new(name.clone()).expect("kernel names have no NUL");
            let mut f: sys::CUfunction = std::ptr::null_mut();
            // SAFETY: `module` is loaded; `c` is a NUL-terminated name.
            check(
                unsafe { sys::cuModuleGetFunction(&mut f, module, c.as_ptr()) },
                "cuModuleGetFunction",
            )
            .map_err(|e| format!("kernel {name}: {e}"))?;
            functions.insert(name, f);
        }
        Ok(Module { module, functions })
    }

    /// Enqueues `k` on `s`.
    ///
    /// # Safety
    /// `s` is a live stream of the module's context, current on this thread; the kernel's
    /// ranges are valid device-visible memory until it completes.
    pub(super) unsafe fn launch(&self, s: RawStream, k: &Kernel, max_blocks: u32) -> Result<()> {
        let (name, count) = match *k {
            Kernel::Reduce {
                dtype, op, count, ..
            } => (kernels::reduce_name(dtype, op), count),
            Kernel::ScaleAvg { dtype, count, .. } => (kernels::scale_name(dtype), count),
        };
        let f = *self
            .functions
            .get(&name)
            .ok_or_else(|| Error::Internal(format!("no kernel {name}")))?;
        // The kernels' parameters, all u64: (dst, a, b, n) and (dst, count, n).
        let (mut args, nargs) = match *k {
            Kernel::Reduce { dst, a, b, .. } => ([dst, a, b, count as u64], 4),
            Kernel::ScaleAvg { dst, n, .. } => ([dst, count as u64, n as u64, 0], 3),
        };
        let mut params: Vec<*mut c_void> = args[..nargs]
            .iter_mut()
            .map(|x| (x as *mut u64).cast())
            .collect();
        let grid = kernels::blocks(count, max_blocks);
        // SAFETY: `f` is a kernel of this module whose parameters are the u64 values `params`
        // points to (alive across the call, which copies them); the caller guarantees the
        // stream and the memory.
        check(
            unsafe {
                sys::cuLaunchKernel(
                    f,
                    grid,
                    1,
                    1,
                    kernels::BLOCK,
                    1,
                    1,
                    0,
                    s.0 as sys::CUstream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            &format!("cuLaunchKernel ({name})"),
        )
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: the module was loaded once and no launch uses it after its backend is gone.
        let _ = unsafe { sys::cuModuleUnload(self.module) };
    }
}

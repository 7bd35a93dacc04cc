//! The reduction kernels on the driver: `device::kernels::source()` compiled by NVRTC (loaded
//! at run time through cudarc) to machine code once per process and compute capability, loaded once per
//! device and process (`super::Shared`), launched on a stream.
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys;
use cudarc::nvrtc;

use super::{check, Ctx};
use crate::device::backend::{Kernel, RawStream};
use crate::device::kernels;
use crate::{Error, Result};

/// The device code of `kernels::source()` per compute capability, compiled once per process
/// (or the reason it could not be).
///
/// NVRTC compiles to a cubin (machine code for `sm_XY`), not PTX: the driver would have to JIT
/// PTX, and a driver older than the NVRTC refuses its newer PTX version, while machine code of
/// the same CUDA major version loads on any of its drivers.
pub(crate) fn image(cc: (i32, i32)) -> std::result::Result<Arc<Vec<u8>>, String> {
    type Cache = Mutex<HashMap<(i32, i32), std::result::Result<Arc<Vec<u8>>, String>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
    c.entry(cc).or_insert_with(|| compile(cc)).clone()
}

fn compile(cc: (i32, i32)) -> std::result::Result<Arc<Vec<u8>>, String> {
    // SAFETY: only tries to dlopen NVRTC's usual names; touches no cudarc state.
    if !unsafe { nvrtc::sys::is_culib_present() } {
        return Err(
            "NVRTC (libnvrtc.so) is not on the loader path: the reduction kernels are \
                    compiled at run time by it (add the CUDA toolkit's lib directory to \
                    LD_LIBRARY_PATH)"
                .into(),
        );
    }
    // cudarc panics where NVRTC lacks a function it resolves: a guard, not a path taken.
    std::panic::catch_unwind(|| compile_cubin(cc))
        .map_err(|_| "NVRTC lacks a function cudarc calls (too old an NVRTC?)".to_string())?
        .map(Arc::new)
}

fn compile_cubin(cc: (i32, i32)) -> std::result::Result<Vec<u8>, String> {
    let arch = format!("sm_{}{}", cc.0, cc.1);
    let src = CString::new(kernels::source()).expect("the source has no NUL");
    let name = c"fabricoll_reduce.cu";
    let prog = nvrtc::result::create_program(&src, Some(name))
        .map_err(|e| format!("nvrtcCreateProgram: {e:?}"))?;
    let mut opts = vec![format!("--gpu-architecture={arch}")];
    opts.extend(kernels::nvrtc_options());
    // SAFETY: `prog` was just created (with `src` and `name` alive until it is destroyed
    // below) and is destroyed once, after its last use.
    let out = unsafe {
        let r = match nvrtc::result::compile_program(prog, &opts) {
            Err(e) => {
                let log = nvrtc::result::get_program_log(prog)
                    .map(|l| {
                        let bytes: Vec<u8> = l.iter().map(|&c| c as u8).collect();
                        String::from_utf8_lossy(&bytes)
                            .trim_end_matches('\0')
                            .to_string()
                    })
                    .unwrap_or_default();
                Err(format!(
                    "NVRTC could not compile the kernels for {arch}: {e:?}: {log}"
                ))
            }
            Ok(()) => {
                let mut size = 0usize;
                let r = nvrtc::sys::nvrtcGetCUBINSize(prog, &mut size).result();
                let mut cubin = vec![0u8; size];
                r.and_then(|_| nvrtc::sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()).result())
                    .map(|_| cubin)
                    .map_err(|e| format!("nvrtcGetCUBIN ({arch}): {e:?}"))
            }
        };
        let _ = nvrtc::result::destroy_program(prog);
        r
    };
    out
}

/// The kernels loaded in one context, for the rest of the process (never unloaded: unloading
/// waits for every stream of the context, as loading does).
pub(super) struct Module {
    _module: sys::CUmodule,
    functions: HashMap<String, sys::CUfunction>,
}

// SAFETY: CUmodule and CUfunction handles may be used from any thread with the context.
unsafe impl Send for Module {}
// SAFETY: launching a function from several threads at once is allowed by the driver.
unsafe impl Sync for Module {}

impl Module {
    /// Loads the kernels in `ctx` (which is current on this thread).
    pub(super) fn load(ctx: &Ctx) -> std::result::Result<Module, String> {
        let image = image(ctx.compute)?;
        let mut module: sys::CUmodule = std::ptr::null_mut();
        check(
            // SAFETY: `image` is a cubin NVRTC built for this device's architecture; the context
            // is current.
            unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr().cast()) },
            "cuModuleLoadData (the reduction kernels)",
        )
        .map_err(|e| e.to_string())?;
        let mut functions = HashMap::new();
        for name in kernels::names() {
            let c = CString::new(name.clone()).expect("kernel names have no NUL");
            let mut f: sys::CUfunction = std::ptr::null_mut();
            check(
                // SAFETY: `module` is loaded; `c` is a NUL-terminated name.
                unsafe { sys::cuModuleGetFunction(&mut f, module, c.as_ptr()) },
                "cuModuleGetFunction",
            )
            .map_err(|e| format!("kernel {name}: {e}"))?;
            functions.insert(name, f);
        }
        Ok(Module {
            _module: module,
            functions,
        })
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

//! Calls on device buffers: which calls need the device (`DevCall::classify`), how a call runs
//! on the device buffers themselves where the provider registers device memory (`direct`), or
//! else how its data is staged through page-locked host slots (`pool`) around the host engine,
//! one slice at a time (`staged`, cut by `slices`), how the calls in flight advance together in call order
//! (`inflight`), and the calls as the C API makes them, blocking, non-blocking, grouped and
//! stream-ordered, with the worker thread that advances them in the background (`stream`).
//! docs/device-calls.md has the model.
//!
//! The device is the calling thread's (`installed`): the device of its current CUDA context,
//! or the emulated device a test installs (`install`). Without either, every pointer is host
//! memory and nothing here runs: the host path is unchanged.
mod direct;
mod inflight;
mod pool;
mod slices;
mod staged;
mod stream;

pub use stream::Streams;

use super::{Kind, Layout};
use crate::algo::varied::Spec;
use crate::algo::Algorithm;
use crate::config::Compression;
use crate::device::{Device, PtrKind};
use crate::error::{Error, Result};
use crate::reduce::{DataType, RedOp};
use parking_lot::{Mutex, RwLock};
use std::os::raw::c_void;

/// The device a test installed (`install`), which takes the place of the CUDA driver's.
static INSTALLED: RwLock<Option<Device>> = parking_lot::const_rwlock(None);

/// The CUDA devices opened so far, by ordinal (None: opening failed).
static CUDA: Mutex<Vec<(i32, Option<Device>)>> = parking_lot::const_mutex(Vec::new());

/// Makes `dev` the device that calls on device buffers use, in place of the CUDA driver's:
/// a test tool (the emulated device in CI), reachable from Rust only, never a fallback for
/// users. Communicators made before keep running; their next device call uses it.
pub fn install(dev: Device) {
    *INSTALLED.write() = Some(dev);
}

/// Undoes `install`: calls on device buffers use the CUDA driver's devices again (a test that
/// ran on the emulated device followed, in the same process, by one on a GPU).
pub fn uninstall() {
    *INSTALLED.write() = None;
}

thread_local! {
    /// The device a test installed for this thread only (`install_on_thread`).
    static ON_THREAD: std::cell::RefCell<Option<Device>> = const { std::cell::RefCell::new(None) };
}

/// Makes `dev` (None: none) the device of the calling thread's calls on device buffers, ahead
/// of `install`'s and the CUDA driver's: a test tool, like `install`, for ranks as threads of
/// one process that each have a device of their own, as ranks that are processes do (each
/// emulated device ordinal is a context of its own).
pub fn install_on_thread(dev: Option<Device>) {
    ON_THREAD.with(|d| *d.borrow_mut() = dev);
}

/// The device of the calling thread, if any: the one installed for it or for the process,
/// else the device of the CUDA context current on this thread (a thread that has made no
/// CUDA call passes no device buffers, and a host-only process opens no context).
pub fn installed() -> Option<Device> {
    if let Some(d) = ON_THREAD.with(|d| d.borrow().clone()) {
        return Some(d);
    }
    if let Some(d) = INSTALLED.read().as_ref() {
        return Some(d.clone());
    }
    let ordinal = crate::cuda::current_device()?;
    let mut opened = CUDA.lock();
    if let Some((_, d)) = opened.iter().find(|(o, _)| *o == ordinal) {
        return d.clone();
    }
    let d = Device::cuda(ordinal)
        .map_err(|e| log::info!("CUDA device {ordinal}: no device calls: {e}"))
        .ok();
    opened.push((ordinal, d.clone()));
    d
}

/// One call on buffers of which at least one is device memory: the checked arguments of the
/// call, the buffers as addresses. Made only by `classify`, whose caller promises the
/// buffers' validity.
#[derive(Clone, Debug)]
pub struct DevCall {
    pub kind: Kind,
    send: u64,
    recv: u64,
    pub count: usize,
    pub dtype: DataType,
    pub op: RedOp,
    pub root: usize,
    pub algo: Option<Algorithm>,
    /// The buffers' kinds, send then recv (None: NULL).
    kinds: [Option<PtrKind>; 2],
    /// The blocks of a varied collective (None: a uniform call, cut by its kind and count).
    blocks: Option<slices::Blocks>,
    /// The call's own compression (the C API's per-call option, read when the call is made:
    /// its slices start later, maybe on the worker); None: the communicator's.
    compress: Option<Compression>,
    dev: Device,
}

/// A call's checked arguments, with its buffers as the caller passed them.
#[derive(Clone, Copy, Debug)]
pub struct Parts {
    pub kind: Kind,
    pub send: *const c_void,
    pub recv: *mut c_void,
    pub count: usize,
    pub dtype: DataType,
    pub op: RedOp,
    pub root: usize,
    pub algo: Option<Algorithm>,
}

impl DevCall {
    /// The call as a device call when a buffer is device (or managed) memory, or `stream` is
    /// set (a stream-ordered call, whose buffers must all be memory a stream can use); None
    /// for a call on host memory alone, which takes the host path. Freed device memory, and a
    /// pageable host buffer in a stream-ordered call, are an error naming the argument.
    ///
    /// # Safety
    /// Non-NULL buffers are valid for the lengths the call's documentation gives until it
    /// completes (for a stream-ordered call: until the stream has passed it).
    pub unsafe fn classify(p: &Parts, stream: bool) -> Result<Option<DevCall>> {
        let Some(dev) = installed() else {
            if stream {
                return Err(Error::InvalidUsage(
                    "a stream-ordered call needs a GPU: this thread has no current CUDA \
                     context (make the device current first, e.g. cudaSetDevice), or the CUDA \
                     driver is absent"
                        .into(),
                ));
            }
            return Ok(None);
        };
        dev.make_current()?;
        let kind = |ptr: *const c_void, name: &str| -> Result<Option<PtrKind>> {
            if ptr.is_null() {
                return Ok(None);
            }
            let k = dev.classify(ptr)?;
            match k {
                PtrKind::Freed { ordinal } => Err(Error::arg(
                    name,
                    format!("{ptr:?} is device memory of device {ordinal} that was freed"),
                )),
                PtrKind::Host if stream => Err(Error::arg(
                    name,
                    format!(
                        "{ptr:?} is pageable host memory: a stream-ordered call takes device, \
                         managed or page-locked host memory (the stream cannot reach pageable \
                         memory in order)"
                    ),
                )),
                PtrKind::Device { ordinal } if ordinal != dev.ordinal() => Err(Error::arg(
                    name,
                    format!(
                        "{ptr:?} is memory of device {ordinal}; this process's calls use device {}",
                        dev.ordinal()
                    ),
                )),
                k => Ok(Some(k)),
            }
        };
        // Point-to-point calls take one buffer, `buf` in the C API.
        let p2p = matches!(
            p.kind,
            Kind::Send { .. } | Kind::Recv { .. } | Kind::Tagged { .. }
        );
        let (send_name, recv_name) = if p2p {
            ("buf", "buf")
        } else {
            ("sendbuf", "recvbuf")
        };
        let kinds = [
            kind(p.send, send_name)?,
            kind(p.recv as *const c_void, recv_name)?,
        ];
        let on_device = kinds
            .iter()
            .flatten()
            .any(|k| matches!(k, PtrKind::Device { .. } | PtrKind::Managed));
        if !stream && !on_device {
            return Ok(None);
        }
        Ok(Some(DevCall {
            kind: p.kind,
            send: p.send as u64,
            recv: p.recv as u64,
            count: p.count,
            dtype: p.dtype,
            op: p.op,
            root: p.root,
            algo: p.algo,
            kinds,
            blocks: None,
            compress: super::compressed::call_compression(),
            dev,
        }))
    }

    /// The call with compression `c` of its own, as a per-call option (Rust callers; the C
    /// API's per-call option is read by `classify`).
    pub fn with_compression(mut self, c: Compression) -> DevCall {
        self.compress = Some(c);
        self
    }

    /// The call as a varied collective (Gather, Scatter, AllGatherV, ReduceScatterV) of rank
    /// `rank` of `nranks` with `spec`: its blocks come from the spec, and the layout keeps no
    /// pointer to the caller's count arrays (valid only while the call is made). AllToAllV
    /// and Barrier are refused: AllToAllV's slices would need every rank's counts, which no
    /// rank has, and Barrier moves no data.
    pub fn with_spec(mut self, spec: &Spec, nranks: usize, rank: usize) -> Result<DevCall> {
        let Kind::Varied(l) = self.kind else {
            return Err(Error::Internal("with_spec on a uniform call".into()));
        };
        let blocks = match spec {
            Spec::AllToAllV { .. } | Spec::Barrier => None,
            s => slices::varied(s, nranks, rank),
        };
        let Some(blocks) = blocks else {
            let on_device =
                |k: &Option<PtrKind>| matches!(k, Some(PtrKind::Device { .. } | PtrKind::Managed));
            return Err(Error::arg(
                if on_device(&self.kinds[0]) {
                    "sendbuf"
                } else {
                    "recvbuf"
                },
                "device memory: fabricoll_alltoallv takes host memory only (a device call is \
                 cut into slices, and how many an AllToAllV needs depends on every rank's \
                 counts, which each rank knows only its own of); use fabricoll_alltoall, or \
                 grouped sends and receives",
            ));
        };
        self.kind = Kind::Varied(Layout::new(l.coll));
        self.blocks = Some(blocks);
        Ok(self)
    }

    pub fn device(&self) -> &Device {
        &self.dev
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Collective;

    fn parts(buf: &mut [f32]) -> Parts {
        Parts {
            kind: Kind::Coll(Collective::AllReduce),
            send: buf.as_ptr().cast(),
            recv: buf.as_mut_ptr().cast(),
            count: buf.len(),
            dtype: DataType::Float32,
            op: RedOp::Sum,
            root: 0,
            algo: None,
        }
    }

    /// The library's unit tests install no device, and a test thread has no CUDA context.
    #[test]
    fn without_a_device_calls_take_the_host_path_and_stream_calls_fail_clearly() {
        let mut buf = [1.0f32; 8];
        // SAFETY: the buffer lives through the calls, which read nothing.
        let host = unsafe { DevCall::classify(&parts(&mut buf), false) };
        assert!(matches!(host, Ok(None)), "{host:?}");
        // SAFETY: as above.
        let stream = unsafe { DevCall::classify(&parts(&mut buf), true) };
        match stream {
            Err(Error::InvalidUsage(m)) => assert!(m.contains("needs a GPU"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}

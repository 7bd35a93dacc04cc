//! CollNet on NCCL's device buffers: where the net device takes CUDA memory (a real
//! registration of a device buffer succeeded, `gpu::ptr_support`), CollNet says so too
//! (`ptr_support`), and its operations on device buffers run through the device calls' staged
//! path (`coll::device`): slices copied to page-locked host slots, reduced by the engine, copied
//! back, several slices in flight.
//!
//! Why CollNet must follow the net device: NCCL fills its topology's NIC node from the CollNet
//! plugin's properties first and the net plugin's second, matched by name, and keeps the first
//! value of each attribute. A CollNet device that reports host memory only under the net
//! device's name turns GPUDirect off for the net plugin too, whether CollNet is enabled or not.
//!
//! NCCL calls CollNet from its proxy thread while its kernels run, and those kernels wait for
//! CollNet's results. Allocating page-locked memory waits for the whole device on CUDA, so
//! nothing here allocates it after `connect`: the staging is made there, and an operation that
//! finds no free slot waits for one (`Streams::start_preallocated`).
use super::{NCCL_PTR_CUDA, NCCL_PTR_HOST};
use crate::algo::varied::{Spec, Varied};
use crate::algo::{Collective, Problem};
use crate::coll::device::{installed, DevCall, Parts, Streams};
use crate::coll::{Comm, Kind, Layout};
use crate::device::PtrKind;
use crate::error::{Error, Result};
use crate::reduce::{DataType, RedOp};
use crate::transport::Region;
use std::os::raw::c_void;
use std::sync::Arc;

/// CollNet's `ptrSupport` on a net device that has `net`: host memory, and CUDA memory where
/// the net device takes it (DMA-BUF is not offered: CollNet has no dma-buf registration).
pub fn ptr_support(net: i32) -> i32 {
    NCCL_PTR_HOST | (net & NCCL_PTR_CUDA)
}

/// A collective comm's device calls.
pub struct OnDevice {
    streams: Streams,
}

impl OnDevice {
    /// The device calls of a comm whose CollNet device has `ptr_support`, with their staging
    /// made now (None where the device takes host memory only). The device is the connecting
    /// thread's (NCCL connects from a thread with its device current).
    pub fn new(ptr_support: i32) -> Result<Option<OnDevice>> {
        if ptr_support & NCCL_PTR_CUDA == 0 {
            return Ok(None);
        }
        let dev = installed().ok_or_else(|| {
            Error::InvalidUsage(
                "CollNet offered NCCL_PTR_CUDA, but the connecting thread has no current CUDA \
                 context: its device buffers could not be staged"
                    .into(),
            )
        })?;
        dev.make_current()?;
        let streams = Streams::default();
        streams.prepare_staging(&dev)?;
        log::info!(
            "CollNet on device {} buffers: staged through page-locked host slots made now",
            dev.ordinal()
        );
        Ok(Some(OnDevice { streams }))
    }

    /// Starts `call` where a buffer is device memory (its request id), None where both are
    /// host memory.
    ///
    /// # Safety
    /// The buffers are valid for the call's lengths until `test` reports it done.
    pub unsafe fn start(
        &self,
        comm: &Arc<Comm>,
        p: &Parts,
        spec: Option<&Spec>,
    ) -> Result<Option<u64>> {
        // SAFETY: forwarded from this function's contract.
        let Some(d) = (unsafe { DevCall::classify(p, false) })? else {
            return Ok(None);
        };
        let d = match spec {
            Some(s) => d.with_spec(s, comm.nranks, comm.rank)?,
            None => d,
        };
        self.streams.start_preallocated(comm, d).map(Some)
    }

    /// Whether any of `regions` is device (or managed) memory of the calling thread's device.
    pub fn any_on_device<'a>(&self, regions: impl IntoIterator<Item = &'a Region>) -> Result<bool> {
        let Some(dev) = installed() else {
            return Ok(false);
        };
        for r in regions.into_iter().filter(|r| !r.is_empty()) {
            if matches!(
                dev.classify(raw(r))?,
                PtrKind::Device { .. } | PtrKind::Managed
            ) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Before a host call of `kind`: the device calls in flight start their last slices
    /// first, so that the host call comes after them on every rank.
    pub fn settle(&self, comm: &Comm, kind: &Kind) -> Result<()> {
        self.streams.settle(comm, kind)
    }

    /// Whether device request `id` has ended (then it is gone, and its error returned).
    pub fn test(&self, comm: &Comm, id: u64) -> Result<bool> {
        self.streams.test(comm, id)
    }

    /// Ends the calls in flight (the comm is being closed) and stops the worker.
    pub fn shutdown(&self, comm: &Comm) {
        self.streams.shutdown(comm);
    }
}

/// An AllReduce's parts.
pub fn allreduce(send: &Region, recv: &Region, count: usize, dtype: DataType, op: RedOp) -> Parts {
    Parts {
        kind: Kind::Coll(Collective::AllReduce),
        send: raw(send),
        recv: raw(recv),
        count,
        dtype,
        op,
        root: 0,
        algo: None,
    }
}

/// A windowed AllGather of bytes or ReduceScatter of `dtype` (the window `[woff, +wlen)` of a
/// global buffer of `count` elements per rank, on `n` ranks) as the varied collective it is:
/// rank i's part of the window is block i, in window order. Its parts and spec.
pub fn window(
    coll: Collective,
    send: &Region,
    recv: &Region,
    (n, count): (usize, usize),
    (woff, wlen): (usize, usize),
    dtype: DataType,
    op: RedOp,
) -> (Parts, Spec) {
    let p = Problem::new(coll, n, count).with_window(woff, wlen);
    let (varied, spec) = match coll {
        Collective::AllGather => (
            Varied::AllGatherV,
            Spec::AllGatherV {
                blocks: (0..n).map(|k| p.slice(k)).collect(),
            },
        ),
        _ => (
            Varied::ReduceScatterV,
            Spec::ReduceScatterV {
                counts: (0..n).map(|k| p.slice(k).1).collect(),
            },
        ),
    };
    let parts = Parts {
        kind: Kind::Varied(Layout::new(varied)),
        send: raw(send),
        recv: raw(recv),
        count: 0,
        dtype,
        op,
        root: 0,
        algo: None,
    };
    (parts, spec)
}

/// A region's address for `DevCall::classify` (NULL where empty: nothing to classify).
fn raw(r: &Region) -> *mut c_void {
    if r.is_empty() {
        std::ptr::null_mut()
    } else {
        r.addr() as *mut c_void
    }
}

/// The error for a scatter-gather list of several parts that holds device memory.
pub fn several_parts(name: &str) -> Error {
    Error::arg(
        name,
        "several parts on a device: CollNet stages device memory for one contiguous part only \
         (NCCL's buffers registered as one region)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collnet_takes_cuda_only_where_the_net_device_does() {
        assert_eq!(ptr_support(NCCL_PTR_HOST), NCCL_PTR_HOST);
        assert_eq!(
            ptr_support(NCCL_PTR_HOST | NCCL_PTR_CUDA),
            NCCL_PTR_HOST | NCCL_PTR_CUDA
        );
        // DMA-BUF (bit 4) is the net device's alone.
        assert_eq!(ptr_support(NCCL_PTR_HOST | 4), NCCL_PTR_HOST);
        // Host-only devices stage nothing.
        assert!(OnDevice::new(NCCL_PTR_HOST).unwrap().is_none());
        // CUDA memory offered without a device current on the connecting thread (the library's
        // unit tests install none, and have no CUDA context): connect fails, saying why.
        match OnDevice::new(NCCL_PTR_HOST | NCCL_PTR_CUDA) {
            Err(e) => assert!(e.to_string().contains("no current CUDA context"), "{e}"),
            Ok(_) => panic!("staged without a device"),
        }
    }

    #[test]
    fn a_window_is_the_varied_call_of_its_parts() {
        let r = Region::empty();
        // 3 ranks of 4 bytes, window [2, +7): rank 0 has [2,4), rank 1 [4,8), rank 2 [8,9).
        let (p, spec) = window(
            Collective::AllGather,
            &r,
            &r,
            (3, 4),
            (2, 7),
            DataType::Uint8,
            RedOp::Sum,
        );
        assert!(p.send.is_null() && p.recv.is_null());
        match spec {
            Spec::AllGatherV { blocks } => assert_eq!(blocks, vec![(0, 2), (2, 4), (6, 1)]),
            s => panic!("{s:?}"),
        }
        let (_, spec) = window(
            Collective::ReduceScatter,
            &r,
            &r,
            (3, 4),
            (2, 7),
            DataType::Float32,
            RedOp::Sum,
        );
        match spec {
            Spec::ReduceScatterV { counts } => assert_eq!(counts, vec![2, 4, 1]),
            s => panic!("{s:?}"),
        }
    }
}

//! The executor on device memory (the C API's direct device calls, docs/device-calls.md): the
//! caller's buffers are device memory registered with the transport, so the steps' sends and
//! receives carry the registrations (`DeviceMem::mr`), and what the executor does with bytes
//! itself runs on the device: copies, reductions (the device seam's kernels, which compute the
//! host reducers' bits) and Avg's division, each waited for by the host; Tmp memory and the
//! staging of receive-and-reduce steps are device memory (`DeviceMem::scratch`). The executor
//! never touches such bytes itself. An input the steps write over is refused (the caller copies
//! an in-place input aside first).

use crate::error::Result;
use crate::reduce::{DataType, RedOp};
use crate::transport::{Mr, Region};

/// What the executor needs of device buffers. Each operation returns once the device has done
/// it, or fails past the call's deadline.
pub trait DeviceMem: Send + Sync {
    /// The registration that covers `r` (None: `r` is host memory).
    fn mr(&self, r: Region) -> Option<&Mr>;
    /// `dst = src` (same length).
    fn copy(&self, dst: Region, src: Region) -> Result<()>;
    /// `dst = a ⊕ b` elementwise for `dt` and `op` (Avg adds; `dst` may be `a`).
    fn reduce(&self, dt: DataType, op: RedOp, dst: Region, a: Region, b: Region) -> Result<()>;
    /// Avg's last step: `dst /= n` (`reduce::scale_avg`'s semantics).
    fn scale_avg(&self, dt: DataType, dst: Region, n: usize) -> Result<()>;
    /// `len` bytes of registered device memory for the schedule's Tmp buffer and the staging of
    /// its receive-and-reduce steps, the same for every call of `scratch` on this value.
    fn scratch(&self, len: usize) -> Result<Region>;
}

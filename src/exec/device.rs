//! The executor on device memory (the C API's direct device calls, docs/device-calls.md): the
//! caller's buffers are device memory registered with the transport, so the steps' sends and
//! receives carry the registrations (`DeviceMem::mr`) and the local copies run on the device
//! (`DeviceMem::copy`), Tmp memory included (`DeviceMem::tmp`). The executor never touches such
//! bytes itself, so it runs only schedules that need no host work beyond that (`moves_only`):
//! no reductions; and no input that the steps write over (the caller copies an in-place input
//! aside first).

use crate::algo::{Op, Schedule};
use crate::error::Result;
use crate::transport::{Mr, Region};

/// What the executor needs of device buffers.
pub trait DeviceMem: Send + Sync {
    /// The registration that covers `r` (None: `r` is host memory).
    fn mr(&self, r: Region) -> Option<&Mr>;
    /// Copies `src` to `dst` (device memory, same length) and returns once it is done, or fails
    /// past the call's deadline.
    fn copy(&self, dst: Region, src: Region) -> Result<()>;
    /// `len` bytes of registered device memory for the schedule's Tmp buffer, the same for
    /// every call of `tmp` on this value.
    fn tmp(&self, len: usize) -> Result<Region>;
}

/// Whether every rank's steps of `s` only move bytes (sends, receives, copies), which the
/// executor can run on device memory.
pub fn moves_only(s: &Schedule) -> bool {
    s.ranks.iter().flatten().all(|step| {
        matches!(
            step.op,
            Op::Send { .. } | Op::Recv { .. } | Op::Copy { .. } | Op::Nop
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::{build, Algorithm, Collective, Options, Problem};

    #[test]
    fn reductions_are_not_moves_and_gathers_are() {
        let o = Options::default();
        let ring = |c| build(Problem::new(c, 4, 1000), Algorithm::Ring, &o).unwrap();
        assert!(moves_only(&ring(Collective::AllGather)));
        let bruck = build(
            Problem::new(Collective::AllToAll, 4, 10),
            Algorithm::Bruck,
            &o,
        );
        assert!(
            moves_only(&bruck.unwrap()),
            "Tmp memory is the device's too"
        );
        assert!(!moves_only(&ring(Collective::AllReduce)));
        assert!(!moves_only(&ring(Collective::ReduceScatter)));
    }
}

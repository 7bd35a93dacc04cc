//! Communicators and the collective front end: choose an algorithm (`tune`), build (and cache)
//! its schedule (`algo`), run it (`exec`). Progress is polled in the caller's thread (blocking
//! calls poll, then sleep on the transport's completion queue instead of spinning), or in the
//! communicator's progress thread for notified requests (`notify`).
//!
//! - `call`: one call (`Call`, `Kind`) and the checks of its arguments;
//! - `comm`: the communicator, how it is made, split, aborted and dropped;
//! - `goodbye`: what a communicator does before it closes, so that what it sent is not lost;
//! - `closer`: the thread that keeps ended communicators' endpoints open until their goodbyes
//!   are done (the lingering close);
//! - `engine`: the request table and the per-call paths (prepare, progress, test, wait, run);
//! - `notify`: notified requests and the progress thread that completes them;
//! - `compressed`: compressed AllReduce, ReduceScatter and AllGather (codes on the wire);
//! - `choice`: which algorithm runs a problem, and the choices kept;
//! - `calibrate`: the communicator's own collectives at creation (placement, calibration);
//! - `bootstrap`: the TCP exchange of endpoint addresses behind a unique id;
//! - `placement`: which machine, host and CPUs each rank runs on;
//! - `agree`: what every rank must agree on when a communicator is made;
//! - `device`: calls on device buffers (direct where the provider registers device memory,
//!   else staged through page-locked host slices) and the stream-ordered calls.
pub mod agree;
pub mod bootstrap;
mod calibrate;
mod call;
mod choice;
mod closer;
mod comm;
mod compressed;
pub mod device;
mod engine;
mod goodbye;
mod late;
pub mod launch;
mod notify;
pub mod placement;
mod progress;
#[cfg(test)]
mod tests;

pub use call::{varied_bytes, Call, Kind, Layout, RequestId};
pub use comm::{open_endpoint, open_endpoint_on, whole, Comm};
pub use compressed::with_call_compression;
pub use notify::Callback;

//! A discrete-event simulator that runs the engines' own `Schedule`s (the plans the executor
//! runs and the checker proves) on a modelled machine, so that algorithms can be priced at rank
//! counts nobody can measure. PURE: no I/O, no unsafe.
//!
//! What it models (docs/simulator.md gives the reasons and the limits):
//! - every step of every rank, with its dependencies, as the schedule lists it: messages at the
//!   size the schedule slices them, matched in program order per pair as the executor does,
//!   and put on the wire one after the other per pair (one ordered connection or queue);
//! - per message: the sending CPU's overhead `o` (a rank's CPU posts one message at a time),
//!   the latency `alpha` from the last byte leaving to the message being usable, the last `o`
//!   of which is the receiving CPU's handling of it (one message at a time, in turn with the
//!   rank's other work), and its bytes at `beta` per byte on the links it crosses;
//! - reductions at `gamma` per byte and copies at `copy` per byte on the rank's CPU, one task
//!   at a time in the order they become ready;
//! - links shared max-min fairly among the flows crossing them (`share`): without contention
//!   (`Params::contention` false) each rank has its own egress and ingress per level, as the
//!   closed-form model assumes; with it, a host's ranks share its NIC (egress and ingress, full
//!   duplex), its memory bandwidth (`mem_us_per_byte`) for the messages inside it, and
//!   inter-host flows cross a core of `hosts x NIC / taper` capacity;
//! - optionally, NICs shaped by a token bucket (`Params::burst`, `bucket`), as the emulated
//!   hosts' links are: after a pause a NIC passes its bucket's bytes at a peak speed.
//!
//! Not modelled: rendezvous handshakes (messages are eager), the executor's polling and
//! sleeping, and any transport's own slicing below the schedule's.
#![forbid(unsafe_code)]

mod bound;
mod bucket;
mod calls;
mod engine;
mod goal;
mod params;
pub mod share;
#[cfg(test)]
mod tests;

pub use bound::{lower_bound, simulate_unless_slower, Bounded};
pub use calls::{back_to_back, per_call_us};
pub use engine::{simulate, Outcome};
pub use goal::write_goal;
pub use params::{parse_calibration, Burst, Level, Params};

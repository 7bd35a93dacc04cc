//! fabricoll: collective communication over libfabric, as an NCCL net / CollNet plugin and a
//! native C API. README.md is for users; docs/architecture.md maps the code.
pub mod algo;
pub mod cli;
pub mod coll;
pub mod compress;
pub mod config;
pub mod cuda;
pub mod device;
pub mod error;
pub mod exec;
pub mod ffi;
pub mod plugin;
pub mod reduce;
pub mod sim;
#[doc(hidden)]
pub mod testing;
pub mod transport;
pub mod tune;

pub use error::{Error, Result};
/// Logging lives with the ABI (it calls NCCL's logger); the tools initialise it from here.
pub use ffi::logging;

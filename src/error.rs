//! The one error type of the library. Converted once, at the ffi edge, to `ncclResult_t`
//! (and later `fabricoll_status`).
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// A caller passed a bad argument; the text names it.
    InvalidArgument(String),
    /// A valid call at the wrong time, or an unsupported feature.
    InvalidUsage(String),
    /// A fabric or OS failure; the text carries the provider's own words.
    System(String),
    /// A bug or broken invariant inside the library (also: a caught panic).
    Internal(String),
    /// The peer failed or went away.
    Remote(String),
    /// A deadline (`FABRICOLL_TIMEOUT_MS`) passed.
    Timeout(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// `ncclResult_t` values (nccl-abi.md, section 1).
pub mod nccl {
    pub const SUCCESS: i32 = 0;
    pub const SYSTEM_ERROR: i32 = 2;
    pub const INTERNAL_ERROR: i32 = 3;
    pub const INVALID_ARGUMENT: i32 = 4;
    pub const INVALID_USAGE: i32 = 5;
    pub const REMOTE_ERROR: i32 = 6;
}

impl Error {
    /// The `ncclResult_t` for this error. A timeout is reported as a remote error: `ncclTimeout`
    /// exists only in NCCL 2.30 headers, and an older NCCL would not know the value.
    pub fn nccl_code(&self) -> i32 {
        match self {
            Error::InvalidArgument(_) => nccl::INVALID_ARGUMENT,
            Error::InvalidUsage(_) => nccl::INVALID_USAGE,
            Error::System(_) => nccl::SYSTEM_ERROR,
            Error::Internal(_) => nccl::INTERNAL_ERROR,
            Error::Remote(_) | Error::Timeout(_) => nccl::REMOTE_ERROR,
        }
    }

    pub fn arg(name: &str, why: impl fmt::Display) -> Error {
        Error::InvalidArgument(format!("argument '{name}': {why}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidArgument(s) => write!(f, "invalid argument: {s}"),
            Error::InvalidUsage(s) => write!(f, "invalid usage: {s}"),
            Error::System(s) => write!(f, "system error: {s}"),
            Error::Internal(s) => write!(f, "internal error: {s}"),
            Error::Remote(s) => write!(f, "remote error: {s}"),
            Error::Timeout(s) => write!(f, "timeout: {s}"),
        }
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_nccl_values() {
        assert_eq!(Error::arg("size", "too big").nccl_code(), 4);
        assert_eq!(Error::System("x".into()).nccl_code(), 2);
        assert_eq!(Error::Timeout("x".into()).nccl_code(), 6);
        assert!(Error::arg("size", "too big").to_string().contains("'size'"));
    }
}

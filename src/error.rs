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

/// `ncclResult_t` values (docs/nccl-abi.md, "Status codes").
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

    /// The error for a call that failed with `errno` (a libfabric `FI_E*` or POSIX value, of
    /// either sign), `msg` naming the call and carrying the provider's words. Neuron's net
    /// plugin maps errno values so (docs/neuron-abi.md, "Status codes"): `EINVAL` is a bug of
    /// ours (Internal); `EMSGSIZE` a call the provider cannot take (InvalidUsage); a
    /// connection aborted, reset, refused or not connected, or a host down or unreachable,
    /// the peer's failure (Remote); anything else a fabric or OS failure (System).
    pub fn from_errno(errno: i64, msg: impl Into<String>) -> Error {
        let msg = msg.into();
        let code = i32::try_from(errno.unsigned_abs()).unwrap_or(i32::MAX);
        match code {
            libc::EINVAL => Error::Internal(msg),
            libc::EMSGSIZE => Error::InvalidUsage(msg),
            libc::ECONNABORTED
            | libc::ECONNRESET
            | libc::ECONNREFUSED
            | libc::ENOTCONN
            | libc::EHOSTDOWN
            | libc::EHOSTUNREACH => Error::Remote(msg),
            _ => Error::System(msg),
        }
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

    #[test]
    fn errno_values_map_as_neuron_maps_them_with_either_sign() {
        let rows: [(i32, i32); 10] = [
            (libc::EINVAL, nccl::INTERNAL_ERROR),
            (libc::EMSGSIZE, nccl::INVALID_USAGE),
            (libc::ECONNABORTED, nccl::REMOTE_ERROR),
            (libc::ECONNRESET, nccl::REMOTE_ERROR),
            (libc::ECONNREFUSED, nccl::REMOTE_ERROR),
            (libc::ENOTCONN, nccl::REMOTE_ERROR),
            (libc::EHOSTDOWN, nccl::REMOTE_ERROR),
            (libc::EHOSTUNREACH, nccl::REMOTE_ERROR),
            (libc::EIO, nccl::SYSTEM_ERROR),
            (libc::ENOMEM, nccl::SYSTEM_ERROR),
        ];
        for (errno, code) in rows {
            for e in [errno as i64, -(errno as i64)] {
                let err = Error::from_errno(e, format!("fi_write failed: words ({e})"));
                assert_eq!(err.nccl_code(), code, "errno {e}: {err}");
                let text = err.to_string();
                assert!(text.contains("fi_write failed: words"), "{text}");
                assert!(!matches!(err, Error::Timeout(_)), "{text}");
            }
        }
        // libfabric's own codes (above 255) and nonsense are fabric failures.
        for e in [-265i64, 0, i64::MIN, 1 << 40] {
            assert!(matches!(Error::from_errno(e, "x"), Error::System(_)), "{e}");
        }
    }
}

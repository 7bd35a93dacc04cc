//! The one panic boundary of the C ABI. Every export runs its body through [`boundary`]; the
//! return type (`ncclResult_t` as `c_int`, or `fabricoll_status`) says through [`AbiReturn`]
//! what success, an error and a caught panic become. A panic never crosses the ABI (it would
//! abort the host process), and its message is always logged.
use crate::error::{Error, Result};
use std::any::Any;
use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A C return type: what a finished body becomes at the boundary.
pub(crate) trait AbiReturn {
    /// The value for `r`, the result of the export `what` (a caught panic arrives as
    /// `Error::Internal` carrying the panic message). Logs or records the error as the API does.
    fn from_result(what: &'static str, r: Result<()>) -> Self;
}

/// `ncclResult_t`: the error is logged (NCCL prints the plugin's warnings) and becomes its code.
impl AbiReturn for c_int {
    fn from_result(what: &'static str, r: Result<()>) -> c_int {
        match r {
            Ok(()) => 0,
            Err(e) => {
                log::warn!("{what}: {e}");
                e.nccl_code()
            }
        }
    }
}

/// Run `f`, turning its result, or a panic inside it, into the C return value `R`.
pub(crate) fn boundary<R: AbiReturn>(what: &'static str, f: impl FnOnce() -> Result<()>) -> R {
    let r = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = panic_message(p.as_ref());
            log::error!("{what}: internal panic caught at the ABI boundary: {msg}");
            Err(Error::Internal(format!(
                "panic caught at the ABI boundary: {msg}"
            )))
        }
    };
    R::from_result(what, r)
}

/// The text a panic was raised with ("" when its payload is not a string).
fn panic_message(p: &(dyn Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::nccl;

    #[test]
    fn nccl_codes_and_panics() {
        assert_eq!(boundary::<c_int>("t", || Ok(())), nccl::SUCCESS);
        assert_eq!(
            boundary::<c_int>("t", || Err(Error::arg("x", "bad"))),
            nccl::INVALID_ARGUMENT
        );
        let n = 7;
        assert_eq!(
            boundary::<c_int>("t", || panic!("deliberate panic {n}")),
            nccl::INTERNAL_ERROR
        );
    }

    #[test]
    fn panic_message_is_kept() {
        let r = catch_unwind(|| panic!("formatted {}", 42)).unwrap_err();
        assert_eq!(panic_message(r.as_ref()), "formatted 42");
        let r = catch_unwind(|| panic!("static")).unwrap_err();
        assert_eq!(panic_message(r.as_ref()), "static");
    }
}

//! Completion notification: `fabricoll_request_notify` hands a non-blocking request to its
//! communicator's progress thread, which calls the caller's function when it ends.
use super::handles::notify_request;
use super::types::{fabricoll_request, fabricoll_status};
use crate::coll::Callback;
use crate::error::Error;
use crate::ffi::boundary::boundary;
use std::os::raw::{c_int, c_void};

/// Called once per notified request, with its final status (a `fabricoll_status` value).
#[allow(non_camel_case_types)]
pub type fabricoll_callback = Option<unsafe extern "C" fn(user_data: *mut c_void, status: c_int)>;

/// The caller's `user_data`, carried to the thread that runs the callback.
struct UserData(*mut c_void);

// SAFETY: the library never dereferences the pointer; it only hands it back to the caller's
// callback. By calling `fabricoll_request_notify` the caller promises that the callback may run
// with it in the progress thread (the documented contract), so moving it there is theirs to
// make sound, as with any C API that takes a callback and a context pointer.
unsafe impl Send for UserData {}

/// Hand a pending non-blocking request to the library: it then completes by itself (the
/// communicator's progress thread advances it, sleeping on the fabric's completion queue when
/// nothing moves; no caller thread polls) and `callback(user_data, status)` runs exactly once
/// when it completes or fails: in the progress thread, or in the calling thread when the
/// request had already completed. On failure, `fabricoll_last_error()` called inside the
/// callback gives the message (peer gone, deadline, calls that differ). The request is freed after the callback returns: the
/// caller must not test or wait on it after this call. Fails (INVALID_ARGUMENT, naming
/// 'request' or 'callback') without taking the request when an argument is bad.
///
/// The callback must not block for long; it may call any fabricoll_* function except
/// destroying the communicator it came from. Aborting or destroying the communicator fails
/// the requests still pending: their callbacks run with the abort status.
#[no_mangle]
pub extern "C" fn fabricoll_request_notify(
    request: *mut fabricoll_request,
    callback: fabricoll_callback,
    user_data: *mut c_void,
) -> fabricoll_status {
    boundary("fabricoll_request_notify", || {
        let f = callback.ok_or_else(|| Error::arg("callback", "is NULL"))?;
        let data = UserData(user_data);
        let cb: Callback = Box::new(move |r| {
            let data = data;
            let status = match &r {
                Ok(()) => fabricoll_status::FABRICOLL_SUCCESS,
                Err(e) => {
                    // The callback's thread may be the progress thread: its last error is
                    // where the callback reads why (fabricoll_last_error).
                    super::set_last_error(&format!("fabricoll_request_notify: {e}"));
                    fabricoll_status::from(e)
                }
            };
            // SAFETY: `f` is the caller's callback, called once with the caller's user_data,
            // as `fabricoll_request_notify` documents.
            unsafe { f(data.0, status as c_int) }
        });
        notify_request(request, cb)
    })
}

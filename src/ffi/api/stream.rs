//! What the stream-ordered calls (`fabricoll_<op>_stream`, generated with the other
//! collectives) report after they return: `fabricoll_comm_get_async_error`.
use super::handles::comm_of;
use super::types::{fabricoll_comm, fabricoll_status};
use super::{out, set_last_error};
use crate::ffi::boundary::boundary;

/// `*status` = FABRICOLL_SUCCESS, or the status of the first stream-ordered call on `comm` that
/// failed after it returned (its message becomes this thread's fabricoll_last_error). Such a
/// call released its stream (later work on it ran without the call's result); every later
/// stream-ordered call on `comm` fails with the same error, so destroy the communicator.
#[no_mangle]
pub extern "C" fn fabricoll_comm_get_async_error(
    comm: *mut fabricoll_comm,
    status: *mut fabricoll_status,
) -> fabricoll_status {
    boundary("fabricoll_comm_get_async_error", || {
        let st = out(status, "status")?;
        st.set(fabricoll_status::FABRICOLL_SUCCESS);
        if let Some(e) = comm_of(comm)?.streams.error() {
            set_last_error(&format!("fabricoll_comm_get_async_error: {e}"));
            st.set(fabricoll_status::from(&e));
        }
        Ok(())
    })
}

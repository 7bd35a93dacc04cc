//! The C API's send, receive and collective exports, blocking (`fabricoll_<op>`), non-blocking
//! (`fabricoll_i<op>`) and, for the calls that take device buffers, stream-ordered
//! (`fabricoll_<op>_stream`). They are written by [`c_exports!`] from the table in
//! `export_table.rs`, which build.rs reads too to declare them to cbindgen (which writes
//! include/fabricoll.h and does not expand macros). Each export gathers its arguments into the
//! call's arguments and makes one call into `collectives` ([`blocking`], [`nonblocking`],
//! [`stream_ordered`]), which holds the panic boundary and every check.
use super::collectives::{blocking, nonblocking, stream_ordered, Args};
use super::types::{fabricoll_comm, fabricoll_request, fabricoll_status};
use super::varied::{Tagged, VArgs};
use crate::algo::varied::Varied;
use crate::algo::Collective::{AllGather, AllReduce, AllToAll, Broadcast, Reduce, ReduceScatter};
use std::os::raw::{c_int, c_void};

/// The exports of `export_table.rs` (its comment gives an entry's form). The entries are taken
/// one at a time (`@each`), so that the optional parts of one are not repeated against its
/// arguments; `@fn` writes one export.
macro_rules! c_exports {
    (
        nonblocking_doc: $nb_pre:literal, $nb_post:literal;
        stream_doc: $st_pre:literal, $st_post:literal;
        $($entries:tt)*
    ) => {
        c_exports!(@each [$nb_pre, $nb_post, $st_pre, $st_post] $($entries)*);
    };
    (@each [$($docs:literal),*]) => {};
    (@each [$nb_pre:literal, $nb_post:literal, $st_pre:literal, $st_post:literal]
        $(#[doc = $doc:literal])+
        $(#[nonblocking_doc = $nb_doc:literal])?
        fn $name:ident, $iname:ident $(, $sname:ident)? ($($params:tt)*) => $args:expr;
        $($rest:tt)*
    ) => {
        c_exports!(@fn [$(#[doc = $doc])+] $name ($($params)*) (comm: *mut fabricoll_comm)
            blocking(stringify!($name), comm, $args));
        c_exports!(@fn [#[doc = c_exports!(@or [$($nb_doc)?] concat!($nb_pre, stringify!($name), $nb_post))]]
            $iname ($($params)*)
            (comm: *mut fabricoll_comm, request: *mut *mut fabricoll_request)
            nonblocking(stringify!($iname), comm, $args, request));
        c_exports!(@stream [$($sname)?] [#[doc = concat!($st_pre, stringify!($name), $st_post)]]
            ($($params)*) $args);
        c_exports!(@each [$nb_pre, $nb_post, $st_pre, $st_post] $($rest)*);
    };
    (@stream [] $($ignored:tt)*) => {};
    (@stream [$sname:ident] [$($doc:tt)*] ($($params:tt)*) $args:expr) => {
        c_exports!(@fn [$($doc)*] $sname ($($params)*) (comm: *mut fabricoll_comm, stream: *mut c_void)
            stream_ordered(stringify!($sname), comm, $args, stream));
    };
    (@or [$doc:literal] $($default:tt)*) => { $doc };
    (@or [] $($default:tt)*) => { $($default)* };
    (@fn [$($doc:tt)*] $name:ident ($($arg:ident: $ty:ty),* $(,)?) ($($tail:tt)*) $call:expr) => {
        $($doc)*
        #[no_mangle]
        pub extern "C" fn $name($($arg: $ty,)* $($tail)*) -> fabricoll_status {
            $call
        }
    };
}

include!("export_table.rs");

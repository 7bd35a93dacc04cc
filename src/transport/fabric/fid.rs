//! RAII owners of libfabric objects: each closes (or frees) its object once, in `Drop`.
use super::sys;
use std::sync::Arc;

/// One `fi_info` we own (a duplicate of an entry of `fi_getinfo`'s list).
pub(super) struct Info(pub(super) *mut sys::fi_info);

// SAFETY: the fi_info is never mutated after duplication; libfabric reads it only during
// fi_fabric/fi_domain/fi_endpoint, which we call with the transport's lock held or before sharing.
unsafe impl Send for Info {}
// SAFETY: see Send: read-only after creation.
unsafe impl Sync for Info {}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: we own this duplicate; fi_freeinfo frees it and its attributes once.
        unsafe { sys::fi_freeinfo(self.0) }
    }
}

/// The head of a list `fi_getinfo` returned, freed with it.
pub(super) struct InfoList(pub(super) *mut sys::fi_info);

impl Drop for InfoList {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: the head of a list fi_getinfo returned; freed once here.
            unsafe { sys::fi_freeinfo(self.0) }
        }
    }
}

/// The fabric and domain, shared by the endpoint and every registration so that a domain is
/// closed only after the last registration made in it.
pub(super) struct DomainFids {
    pub(super) domain: *mut sys::fid_domain,
    pub(super) fabric: *mut sys::fid_fabric,
}

// SAFETY: the domain and fabric are only closed (in Drop, once) and passed to libfabric calls
// that we serialise with the transport's lock.
unsafe impl Send for DomainFids {}
// SAFETY: see Send.
unsafe impl Sync for DomainFids {}

impl Drop for DomainFids {
    fn drop(&mut self) {
        // SAFETY: both fids were opened by us and are closed once, domain before fabric.
        unsafe {
            if !self.domain.is_null() {
                sys::fi_close(self.domain as *mut sys::fid);
            }
            if !self.fabric.is_null() {
                sys::fi_close(self.fabric as *mut sys::fid);
            }
        }
    }
}

/// A memory registration, closed before the domain it was made in.
pub(super) struct MrFid {
    pub(super) mr: *mut sys::fid_mr,
    pub(super) _domain: Arc<DomainFids>,
}

// SAFETY: a registration handle is immutable after creation; closing it is done once, in Drop.
unsafe impl Send for MrFid {}
// SAFETY: see Send.
unsafe impl Sync for MrFid {}

impl Drop for MrFid {
    fn drop(&mut self) {
        // SAFETY: we opened this MR; the domain it belongs to is kept alive by `_domain`.
        unsafe { sys::fi_close(self.mr as *mut sys::fid) };
    }
}

/// Closes a fid on an error path during construction.
pub(super) struct FidGuard(*mut sys::fid);

pub(super) fn scopeguard(f: *mut sys::fid) -> FidGuard {
    FidGuard(f)
}

impl Drop for FidGuard {
    fn drop(&mut self) {
        // SAFETY: only reached on an error path, for a fid we opened and nothing else owns yet.
        unsafe { sys::fi_close(self.0) };
    }
}

//! Device memory: registering CUDA memory with the provider (`fi_mr_regattr` with
//! `FI_HMEM_CUDA`), for endpoints opened with `FI_HMEM` (`discovery`). Whether the provider
//! really takes it is only known by trying (Debian's 1.17 shm advertises FI_HMEM and refuses
//! every CUDA registration): the plugin probes once per device (`plugin::gpu`).
use super::{sys, FabricTransport};
use crate::error::Result;
use crate::transport::{Mr, Region};
use std::os::raw::c_void;
use std::ptr;

impl FabricTransport {
    /// `Transport::register_device`.
    pub(super) fn register_device_region(&self, region: Region, ordinal: i32) -> Result<Mr> {
        let g = self.inner.lock();
        let mut mr: *mut sys::fid_mr = ptr::null_mut();
        // SAFETY: the domain is open; the wrapper builds the attributes (and the iovec they
        // point to) on its stack for the call, which copies them; the region is device memory
        // the caller keeps allocated while registered (Region's contract).
        let rc = unsafe {
            sys::fi_fabricoll_regattr_cuda(
                g.dom.domain,
                region.addr() as *mut c_void,
                region.len(),
                (sys::FI_SEND | sys::FI_RECV) as u64,
                ordinal,
                &mut mr,
            )
        };
        let what = || {
            format!(
                "fi_mr_regattr of {} bytes of CUDA device {ordinal} memory at {:#x} on {} \
                 (FI_HMEM_CUDA)",
                region.len(),
                region.addr(),
                self.caps.domain
            )
        };
        let (keep, desc) = self.adopt_mr(&g, rc as i64, what, mr)?;
        Ok(Mr {
            desc,
            region,
            keep: Some(Box::new(keep)),
            key: None,
            device: Some(ordinal),
        })
    }
}

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
        let iov = sys::iovec {
            iov_base: region.addr() as *mut c_void,
            iov_len: region.len(),
        };
        let attr = sys::fi_mr_attr {
            mr_iov: &iov,
            iov_count: 1,
            access: (sys::FI_SEND | sys::FI_RECV) as u64,
            iface: sys::fi_hmem_iface_FI_HMEM_CUDA,
            device: sys::fi_mr_attr__bindgen_ty_1 { cuda: ordinal },
            ..Default::default()
        };
        let mut mr: *mut sys::fid_mr = ptr::null_mut();
        // SAFETY: the domain is open; attr and the iovec it points to live across the call,
        // which copies them; the region is device memory the caller keeps allocated while
        // registered (Region's contract).
        let rc = unsafe { sys::fi_mr_regattr(g.dom.domain, &attr, 0, &mut mr) };
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

//! Device memory: registering CUDA memory with the provider (`fi_mr_regattr` with
//! `FI_HMEM_CUDA`, by address or by dma-buf), for endpoints opened with `FI_HMEM`
//! (`discovery`). Whether the provider
//! really takes it is only known by trying (Debian's 1.17 shm advertises FI_HMEM and refuses
//! every CUDA registration): the plugin probes once per device (`plugin::gpu`).
use super::rma::{unique_key, KEY_TRIES};
use super::{sys, FabricTransport};
use crate::error::Result;
use crate::transport::{DmaBuf, Mr, Region};
use std::os::raw::{c_int, c_void};
use std::ptr;

impl FabricTransport {
    /// `Transport::register_device` (`dmabuf` None) and `Transport::register_dmabuf`.
    pub(super) fn register_device_region(
        &self,
        region: Region,
        ordinal: i32,
        dmabuf: Option<DmaBuf>,
    ) -> Result<Mr> {
        let g = self.inner.lock();
        let mut mr: *mut sys::fid_mr = ptr::null_mut();
        let (fd, offset) = dmabuf.map_or((-1, 0), |b| (b.fd, b.offset));
        // Where the provider does not choose keys (no FI_MR_PROV_KEY, as 2.x's shm with
        // FI_MR_HMEM), each registration of the domain needs a key of its own: a second one
        // with the same key is refused (-FI_ENOKEY), so a key in use is skipped.
        let prov_key = self.caps.mr_mode & sys::FI_MR_PROV_KEY as u64 != 0;
        let mut rc = 0;
        for _ in 0..KEY_TRIES {
            let key = if prov_key { 0 } else { unique_key() };
            // SAFETY: the domain is open; the wrapper builds the attributes (and the iovec or
            // dma-buf description they point to) on its stack for the call, which copies them;
            // the region is device memory the caller keeps allocated while registered
            // (Region's contract), and a dma-buf's fd is open for the call (the caller's).
            rc = unsafe {
                sys::fi_fabricoll_regattr_cuda(
                    g.dom.domain,
                    region.addr() as *mut c_void,
                    region.len(),
                    (sys::FI_SEND | sys::FI_RECV) as u64,
                    ordinal,
                    fd,
                    offset,
                    key,
                    &mut mr,
                )
            };
            if prov_key || rc != -(sys::FI_ENOKEY as c_int) {
                break;
            }
        }
        let what = || {
            let how = match dmabuf {
                Some(b) => format!("FI_MR_DMABUF: fd {}, offset {}", b.fd, b.offset),
                None => "FI_HMEM_CUDA".into(),
            };
            format!(
                "fi_mr_regattr of {} bytes of CUDA device {ordinal} memory at {:#x} on {} ({how})",
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

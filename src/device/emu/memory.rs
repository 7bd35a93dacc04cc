//! The emulated device's memory. Device memory is a memfd mapped twice: the address handed
//! out is `PROT_NONE`, so any host access to it faults (SIGSEGV), and a second, read-write
//! mapping of the same pages (the alias) is known only to the engine (the stream workers),
//! which translates device addresses to it. Page-locked host memory is ordinary anonymous
//! memory the engine may use directly. A freed device range stays reserved (`PROT_NONE`,
//! without backing pages) for a while, so that a later use of it is reported as a use of freed
//! memory instead of reaching a new allocation.
use std::collections::{BTreeMap, VecDeque};

use crate::device::backend::PtrKind;
use crate::{Error, Result};

/// Freed device ranges kept reserved, in bytes, before the oldest are released.
const QUARANTINE: usize = 1 << 30;

enum Region {
    Device { alias: *mut u8, map_len: usize },
    Pinned { map_len: usize },
    Freed { map_len: usize },
}

/// The device's mappings, by start address.
pub(super) struct Mem {
    ordinal: i32,
    regions: BTreeMap<u64, (usize, Region)>,
    freed: VecDeque<u64>,
    freed_bytes: usize,
}

// SAFETY: the raw alias pointers are only dereferenced by the engine, for ranges of live
// regions; the map itself is plain data behind the backend's mutex.
unsafe impl Send for Mem {}

fn page_round(len: usize) -> usize {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    len.div_ceil(page) * page
}

fn os_err(what: &str) -> Error {
    Error::System(format!(
        "emulated device: {what} failed: {}",
        std::io::Error::last_os_error()
    ))
}

impl Mem {
    pub(super) fn new(ordinal: i32) -> Mem {
        Mem {
            ordinal,
            regions: BTreeMap::new(),
            freed: VecDeque::new(),
            freed_bytes: 0,
        }
    }

    /// `len` bytes of device memory: the PROT_NONE address handed out.
    pub(super) fn alloc_device(&mut self, len: usize) -> Result<u64> {
        let map_len = page_round(len);
        // SAFETY: a fresh descriptor from a NUL-terminated name; closed below.
        let fd =
            unsafe { libc::memfd_create(c"fabricoll-emulated-device".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(os_err("memfd_create"));
        }
        let map = |prot| {
            // SAFETY: a new shared mapping of the whole descriptor; no existing memory is touched.
            unsafe { libc::mmap(std::ptr::null_mut(), map_len, prot, libc::MAP_SHARED, fd, 0) }
        };
        // SAFETY: `fd` is ours.
        let sized = unsafe { libc::ftruncate(fd, map_len as libc::off_t) } == 0;
        let handed = if sized {
            map(libc::PROT_NONE)
        } else {
            libc::MAP_FAILED
        };
        let alias = if handed != libc::MAP_FAILED {
            map(libc::PROT_READ | libc::PROT_WRITE)
        } else {
            libc::MAP_FAILED
        };
        let err = (alias == libc::MAP_FAILED).then(|| os_err("mmap of device memory"));
        // SAFETY: the mappings keep the pages; the descriptor is no longer needed.
        unsafe { libc::close(fd) };
        if let Some(e) = err {
            if handed != libc::MAP_FAILED {
                // SAFETY: unmapping the mapping made above, unused.
                unsafe { libc::munmap(handed, map_len) };
            }
            return Err(e);
        }
        let addr = handed as u64;
        self.regions.insert(
            addr,
            (
                len,
                Region::Device {
                    alias: alias.cast(),
                    map_len,
                },
            ),
        );
        Ok(addr)
    }

    /// Frees device memory: the pages go, the range stays reserved as freed for a while.
    pub(super) fn free_device(&mut self, addr: u64) {
        let Some((len, Region::Device { alias, map_len })) = self.regions.remove(&addr) else {
            log::error!("emulated device: free of {addr:#x}, which is not a device allocation");
            return;
        };
        // SAFETY: the alias is ours and no longer used (the caller guarantees no pending work).
        unsafe { libc::munmap(alias.cast(), map_len) };
        // Replace the handed-out mapping with a reservation without pages (MAP_FIXED over our
        // own range).
        // SAFETY: the range [addr, addr + map_len) is our own mapping.
        let r = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                map_len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if r == libc::MAP_FAILED {
            // SAFETY: our own range.
            unsafe { libc::munmap(addr as *mut libc::c_void, map_len) };
            return;
        }
        self.regions.insert(addr, (len, Region::Freed { map_len }));
        self.freed.push_back(addr);
        self.freed_bytes += map_len;
        while self.freed_bytes > QUARANTINE {
            let Some(old) = self.freed.pop_front() else {
                break;
            };
            if let Some((_, Region::Freed { map_len })) = self.regions.remove(&old) {
                self.freed_bytes -= map_len;
                // SAFETY: our own reservation, unused.
                unsafe { libc::munmap(old as *mut libc::c_void, map_len) };
            }
        }
    }

    /// `len` bytes of "page-locked" host memory (ordinary memory the engine may use).
    pub(super) fn alloc_pinned(&mut self, len: usize) -> Result<*mut u8> {
        let map_len = page_round(len);
        // SAFETY: a new private anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os_err("mmap of page-locked memory"));
        }
        self.regions
            .insert(p as u64, (len, Region::Pinned { map_len }));
        Ok(p.cast())
    }

    pub(super) fn free_pinned(&mut self, p: *mut u8) {
        match self.regions.remove(&(p as u64)) {
            // SAFETY: our own mapping; the caller guarantees no use remains.
            Some((_, Region::Pinned { map_len })) => unsafe {
                libc::munmap(p.cast(), map_len);
            },
            _ => log::error!("emulated device: free of {p:?}, which is not page-locked memory"),
        }
    }

    /// The region holding `addr`: its start, length and kind.
    fn find(&self, addr: u64) -> Option<(u64, usize, &Region)> {
        let (&start, (len, r)) = self.regions.range(..=addr).next_back()?;
        let extent = match r {
            Region::Device { map_len, .. }
            | Region::Pinned { map_len }
            | Region::Freed { map_len } => *map_len,
        };
        (addr < start + extent.max(*len) as u64).then_some((start, *len, r))
    }

    pub(super) fn classify(&self, addr: u64) -> PtrKind {
        let ordinal = self.ordinal;
        match self.find(addr) {
            Some((_, _, Region::Device { .. })) => PtrKind::Device { ordinal },
            Some((_, _, Region::Pinned { .. })) => PtrKind::PinnedHost,
            Some((_, _, Region::Freed { .. })) => PtrKind::Freed { ordinal },
            None => PtrKind::Host,
        }
    }

    /// Where the engine reaches `[addr, addr + len)`: the alias of device memory, or the
    /// page-locked memory itself. Anything else (pageable or freed memory, a range past its
    /// allocation) is an error naming the address: the engine faults where a GPU would.
    pub(super) fn translate(&self, addr: u64, len: usize, arg: &str) -> Result<*mut u8> {
        let fault = |why: &str| {
            Err(Error::InvalidArgument(format!(
                "emulated device: {arg} {addr:#x} (+{len} bytes) {why}"
            )))
        };
        match self.find(addr) {
            Some((start, alen, r)) => {
                if addr + len as u64 > start + alen as u64 {
                    return fault(&format!("runs past its allocation of {alen} bytes"));
                }
                match r {
                    Region::Device { alias, .. } => {
                        // SAFETY: the offset lies within the alias mapping (checked above).
                        Ok(unsafe { alias.add((addr - start) as usize) })
                    }
                    Region::Pinned { .. } => Ok(addr as *mut u8),
                    Region::Freed { .. } => fault("is device memory that was freed"),
                }
            }
            None => fault("is not device or page-locked memory"),
        }
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        for (&addr, (_, r)) in &self.regions {
            // SAFETY: every mapping is ours, and the engine that used them is gone (it holds
            // this map alive).
            unsafe {
                match *r {
                    Region::Device { alias, map_len } => {
                        libc::munmap(alias.cast(), map_len);
                        libc::munmap(addr as *mut libc::c_void, map_len);
                    }
                    Region::Pinned { map_len } | Region::Freed { map_len } => {
                        libc::munmap(addr as *mut libc::c_void, map_len);
                    }
                }
            }
        }
    }
}

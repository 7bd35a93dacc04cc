//! Memory the transport moves: `Region`, a caller's promise about a range of memory, and
//! `Scratch`, memory the library owns for transfers.

/// A memory range that a caller has promised stays valid while operations on it run.
///
/// A `Region` is an address and a length with no lifetime, so every way of making one is
/// `unsafe`: `Region::from_raw`, and `Scratch::region` for the library's own memory. Whoever
/// makes a region promises that the memory outlives every use of it; the safe methods that read
/// and write through it rest on that promise. A region cannot outlive its memory without an
/// `unsafe` block at the place that made it:
///
/// ```compile_fail,E0133
/// use nccl_net_fabricoll::transport::Scratch;
/// // Does not compile: making a region of library memory is unsafe.
/// let stale = { let s = Scratch::new(64); s.region() };
/// let _ = stale.to_vec();
/// ```
///
/// Memory the library owns is read and written through its owner (`Scratch::bytes`,
/// `Scratch::bytes_mut`), whose borrow keeps it alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    addr: usize,
    len: usize,
}

impl Region {
    /// # Safety
    /// `[ptr, ptr+len)` must be valid memory (writable, for receives) that nobody else touches
    /// until every operation posted on this region has completed or been cancelled.
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> Region {
        Region {
            addr: ptr as usize,
            len,
        }
    }

    /// The empty region (a zero-byte message).
    pub fn empty() -> Region {
        Region { addr: 0, len: 0 }
    }

    pub fn addr(&self) -> usize {
        self.addr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when `other` lies inside this region.
    pub fn contains(&self, other: &Region) -> bool {
        other.len == 0
            || (other.addr >= self.addr
                && other
                    .addr
                    .checked_add(other.len)
                    .is_some_and(|e| e <= self.addr + self.len))
    }
}

impl Region {
    /// The page-aligned span covering this region, for registration only (never for transfers).
    pub(crate) fn page_span(&self) -> Region {
        const PAGE: usize = 4096;
        if self.len == 0 {
            return *self;
        }
        let start = self.addr & !(PAGE - 1);
        let end = (self.addr + self.len).div_ceil(PAGE) * PAGE;
        Region {
            addr: start,
            len: end - start,
        }
    }

    /// Copy the region's bytes out (in-process transports).
    pub fn to_vec(self) -> Vec<u8> {
        self.with(|b| b.to_vec())
    }

    /// Copy `data` into the start of the region (in-process transports); `data` must fit.
    pub fn write(self, data: &[u8]) {
        assert!(data.len() <= self.len, "Region::write overflow");
        self.with_mut(|d| crate::reduce::copy(&mut d[..data.len()], data))
    }
}

impl Region {
    /// The sub-range `[off, off+len)` (bytes), checked.
    pub fn sub(&self, off: usize, len: usize) -> Option<Region> {
        let end = off.checked_add(len)?;
        (end <= self.len).then_some(Region {
            addr: if len == 0 { 0 } else { self.addr + off },
            len,
        })
    }

    /// Read access to the region's bytes. The caller is an operation on the region, which its
    /// maker promised the memory to (`Region::from_raw`, `Scratch::region`): no one writes
    /// these bytes meanwhile.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        if self.len == 0 {
            return f(&[]);
        }
        // SAFETY: the maker's promise: `len` valid bytes at `addr` for every use of the region,
        // untouched by others while an operation on it runs; schedules order their accesses.
        f(unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) })
    }

    /// Write access to the region's bytes (same contract as `with`, plus writability).
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        if self.len == 0 {
            return f(&mut []);
        }
        // SAFETY: as in `with`; the maker promised writable memory, and the executor never
        // holds two overlapping views at once (schedules are race-free by the checker).
        f(unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) })
    }
}

/// Memory the library owns for transfers (scratch, staging, backups). Its region stays valid
/// while the `Scratch` lives; owners must not drop it with operations in flight on it (the
/// executor drains or cancels first, and leaks the memory if it cannot).
///
/// Buffers of 4 KiB and more start on a page boundary, smaller ones on 64 bytes. Copies whose
/// destination lies 1 to 31 bytes past the source modulo 4 KiB run many times slower on CPUs
/// with fast `rep movsb` (glibc's memcpy and the kernel's copies for shared-memory
/// transfers both use it; see `reduce::copy`). Page-aligned staging never makes that gap with
/// another page-aligned or 64-byte-aligned buffer, which is what NCCL's and PyTorch's
/// allocators hand out.
///
/// From `MAPPED_BYTES` up the memory is an anonymous mapping of its own: the kernel hands it
/// out zeroed, a page at a time as it is first touched (a huge page from `HUGE_BYTES` up, see
/// `new`), so a collective's workspace costs only the pages its schedule writes. (The
/// allocator's zeroed allocation of page-aligned memory writes every byte first.)
pub struct Scratch {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    layout: std::alloc::Layout,
}

/// Size from which `Scratch` maps its own pages instead of asking the allocator.
const MAPPED_BYTES: usize = 256 << 10;

/// Size from which `Scratch::new` asks for transparent huge pages (one x86-64 huge page).
const HUGE_BYTES: usize = 2 << 20;

// SAFETY: Scratch owns its allocation exclusively (like Box<[u8]>); access to the bytes goes
// through Region, whose users synchronise (the transport's lock, the executor's steps).
unsafe impl Send for Scratch {}
// SAFETY: as above; &Scratch only hands out the address.
unsafe impl Sync for Scratch {}

impl Scratch {
    /// `len` zeroed bytes, aligned to 4 KiB from 4 KiB up, else to 64 bytes; the library's
    /// own memory. From `HUGE_BYTES` up it starts on a huge-page boundary and asks the kernel
    /// for transparent huge pages (`MADV_HUGEPAGE`; honoured where THP is `madvise` or
    /// `always`). A peer's `process_vm_readv` pins the pages it reads one struct page at a
    /// time through the page tables, which is faster from huge pages (figures in
    /// `docs/performance.md`).
    pub fn new(len: usize) -> Scratch {
        Self::with_pages(len, len >= HUGE_BYTES)
    }

    /// `new` without the huge-page advice: what a program's `malloc` hands out (glibc maps
    /// large blocks on 4 KiB pages and advises nothing), for the benchmark's user buffers.
    pub fn plain(len: usize) -> Scratch {
        Self::with_pages(len, false)
    }

    fn with_pages(len: usize, huge: bool) -> Scratch {
        let align = if len >= 4096 { 4096 } else { 64 };
        let layout = std::alloc::Layout::from_size_align(len.max(1), align)
            .expect("scratch size overflows a Layout");
        if len == 0 {
            return Scratch {
                ptr: std::ptr::NonNull::dangling(),
                len,
                layout,
            };
        }
        let p = if len >= MAPPED_BYTES {
            let extra = if huge { HUGE_BYTES } else { 0 };
            // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
            let m = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len + extra,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if m == libc::MAP_FAILED {
                std::ptr::null_mut()
            } else if huge {
                // Keep [start, start + len) of the larger mapping, start on a huge page.
                let base = m as usize;
                let start = base.next_multiple_of(HUGE_BYTES);
                let end = (start + len).next_multiple_of(4096);
                let mapped_end = base + (len + extra).next_multiple_of(4096);
                // SAFETY: both ranges lie inside the mapping just made and are page-aligned;
                // nothing else refers to them. Drop unmaps [start, start + len) later.
                unsafe {
                    if start > base {
                        libc::munmap(m, start - base);
                    }
                    if mapped_end > end {
                        libc::munmap(end as *mut libc::c_void, mapped_end - end);
                    }
                    // Advice only: a kernel without THP says EINVAL and the pages stay small.
                    libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
                }
                start as *mut u8
            } else {
                m.cast::<u8>()
            }
        } else {
            // SAFETY: the layout has a non-zero size.
            unsafe { std::alloc::alloc_zeroed(layout) }
        };
        let ptr =
            std::ptr::NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Scratch { ptr, len, layout }
    }

    /// The region of this memory, to post operations on.
    ///
    /// # Safety
    /// The region must not be used after this `Scratch` is dropped (or leaked memory freed),
    /// nor while a borrow from `bytes_mut` is alive.
    pub unsafe fn region(&self) -> Region {
        Region {
            addr: if self.len == 0 {
                0
            } else {
                self.ptr.as_ptr() as usize
            },
            len: self.len,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte's address (0 when empty), for comparisons and logs.
    pub fn addr(&self) -> usize {
        if self.len == 0 {
            0
        } else {
            self.ptr.as_ptr() as usize
        }
    }

    /// The bytes, borrowed from their owner. Not while a posted operation may write them.
    pub fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `len` bytes allocated (and zeroed) in `new`, owned by self and alive for
        // the borrow; the shared borrow excludes writes through `bytes_mut`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably borrowed from their owner. Not while a posted operation may touch
    /// them.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `bytes`; the exclusive borrow excludes every other view through self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Give up the memory without freeing it (operations may still touch it).
    pub fn leak(self) {
        std::mem::forget(self);
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.len >= MAPPED_BYTES {
            // SAFETY: mapped in `new` with this length and not unmapped since (leak forgets).
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        } else if self.len > 0 {
            // SAFETY: allocated in `new` with this layout and not freed since (leak forgets).
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
        }
    }
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Scratch({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::{Scratch, HUGE_BYTES, MAPPED_BYTES};

    #[test]
    fn scratch_is_zeroed_and_aligned_for_fast_copies() {
        for len in [
            1usize,
            63,
            64,
            4095,
            4096,
            65536,
            MAPPED_BYTES - 1,
            MAPPED_BYTES,
            1 << 20,
        ] {
            let s = Scratch::new(len);
            let align = if len >= 4096 { 4096 } else { 64 };
            assert_eq!(s.addr() % align, 0, "len {len}");
            assert_eq!(s.len(), len);
            assert!(s.bytes().iter().all(|b| *b == 0), "len {len}");
        }
        let empty = Scratch::new(0);
        assert!(empty.is_empty() && empty.bytes().is_empty() && empty.addr() == 0);
    }

    #[test]
    fn large_scratch_starts_on_a_huge_page_and_owns_exactly_its_bytes() {
        // Lengths that are and are not page multiples; every byte writable, and the trimmed
        // mapping's neighbours are no longer ours (a second one maps and drops cleanly).
        for len in [HUGE_BYTES, HUGE_BYTES + 1, 3 * HUGE_BYTES + 4095, 5 << 20] {
            for _ in 0..2 {
                let mut s = Scratch::new(len);
                assert_eq!(s.addr() % HUGE_BYTES, 0, "len {len}");
                assert_eq!(s.len(), len);
                let b = s.bytes_mut();
                b[0] = 1;
                b[len - 1] = 2;
                assert_eq!(s.bytes().iter().map(|&x| x as usize).sum::<usize>(), 3);
            }
        }
        // The benchmark's user buffers: no huge-page alignment asked for (4 KiB is all).
        let p = Scratch::plain(HUGE_BYTES + 4096);
        assert_eq!(p.addr() % 4096, 0);
        assert!(p.bytes().iter().all(|b| *b == 0));
    }

    /// Resident memory of this process, from /proc/self/statm (pages).
    fn resident_bytes() -> usize {
        let s = std::fs::read_to_string("/proc/self/statm").expect("statm");
        let pages: usize = s.split_whitespace().nth(1).unwrap().parse().unwrap();
        pages * 4096
    }

    #[test]
    fn large_scratch_costs_only_the_pages_written() {
        // 1 GiB of workspace, of which one page is written: resident memory grows by far
        // less than the buffer (other tests running meanwhile allocate a little).
        let before = resident_bytes();
        let mut s = Scratch::new(1 << 30);
        s.bytes_mut()[4096..4104].fill(7);
        let grown = resident_bytes().saturating_sub(before);
        assert!(grown < 256 << 20, "resident memory grew by {grown} bytes");
        assert_eq!(&s.bytes()[4096..4105], [7, 7, 7, 7, 7, 7, 7, 7, 0]);
    }
}

//! The `Transport` trait: tagged send/receive between endpoints, memory registration and
//! completion polling, with the semantics of a libfabric RDM endpoint. Two backends:
//! `fabric` (libfabric) and `loopback` (in-process, ranks as threads, for tests).
use crate::error::{Error, Result};
use std::any::Any;
use std::time::Duration;

pub mod fabric;
pub mod loopback;

/// Tag bits every wire tag of ours fits in: bits 0 to 62. libfabric's `net` provider (the
/// native TCP RDM endpoint of 1.17, `tcp` from 1.18) keeps bit 63 for itself, and a message
/// whose tag has it set is never matched once it arrives before its receive.
pub const TAG_BITS: u32 = 63;

/// The tag bits a provider offers, from its `mem_tag_format` (the highest bit it may set; 0,
/// "not stated", is taken as 64).
pub fn provider_tag_bits(mem_tag_format: u64) -> u32 {
    if mem_tag_format == 0 {
        64
    } else {
        64 - mem_tag_format.leading_zeros()
    }
}

/// Refuse a provider (`name` on `domain`) whose tags are narrower than ours.
pub fn require_tag_bits(name: &str, domain: &str, mem_tag_format: u64) -> crate::error::Result<()> {
    let bits = provider_tag_bits(mem_tag_format);
    if bits < TAG_BITS {
        return Err(crate::error::Error::System(format!(
            "provider {name} on {domain} matches {bits}-bit tags (mem_tag_format {mem_tag_format:#x}); fabricoll's tags need {TAG_BITS} bits"
        )));
    }
    Ok(())
}

/// A peer's address as inserted into this endpoint's address vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Peer(pub u64);

/// An operation's identity, chosen by the caller and handed back in its completion.
pub type OpId = u64;

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

/// A registration returned by `Transport::register`; deregistered when dropped.
pub struct Mr {
    /// The descriptor to pass with operations (`fi_mr_desc`), 0 when none.
    pub desc: usize,
    pub region: Region,
    /// Backend state that closes the registration when dropped.
    pub keep: Option<Box<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("desc", &self.desc)
            .field("region", &self.region)
            .finish()
    }
}

/// What a post did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Posted {
    /// The operation is queued; a completion will follow.
    Queued,
    /// The endpoint's queue is full (`-FI_EAGAIN`): progress and try again.
    Busy,
}

/// A finished operation.
#[derive(Debug)]
pub struct Completion {
    pub op: OpId,
    /// Bytes received (receives) or sent (sends).
    pub len: usize,
    /// The matched tag (receives).
    pub tag: u64,
    pub status: Result<()>,
    /// The buffer of an owned receive (`recv_owned`).
    pub data: Option<Vec<u8>>,
}

impl Completion {
    /// A successful operation of `len` bytes.
    pub fn done(op: OpId, len: usize, tag: u64, data: Option<Vec<u8>>) -> Completion {
        Completion {
            op,
            len,
            tag,
            status: Ok(()),
            data,
        }
    }

    /// A failed operation.
    pub fn failed(op: OpId, tag: u64, e: Error) -> Completion {
        Completion {
            op,
            len: 0,
            tag,
            status: Err(e),
            data: None,
        }
    }
}

/// What a backend can do, probed, not assumed. The layers above read these fields, never the
/// provider's name: the transport that fills them in knows its provider's protocols.
#[derive(Debug, Clone)]
pub struct Caps {
    pub provider: String,
    pub fabric: String,
    pub domain: String,
    pub inject_size: usize,
    /// `fi_tinject` may be used for messages up to `inject_size` (see fabric::inject_safe).
    pub inject_ok: bool,
    pub max_msg_size: usize,
    /// Raw libfabric `mr_mode` bits the provider asked for.
    pub mr_mode: u64,
    /// Registration is required for local buffers (`FI_MR_LOCAL` or HMEM).
    pub mr_local: bool,
    pub hmem: bool,
    pub rma: bool,
    /// The endpoint's completion queue has a wait object we can sleep on.
    pub wait_fd: bool,
    pub tx_size: usize,
    pub rx_size: usize,
    /// Largest message the provider sends eagerly; a larger one waits for a rendezvous
    /// handshake, which the cost model prices. `usize::MAX` where every message goes eagerly.
    pub eager_bytes: usize,
    /// Bytes per message when a schedule pipelines a large transfer in slices.
    pub slice_bytes: usize,
    /// How long a waiter polls without progress before it sleeps on the completion queue.
    pub poll_window: Duration,
    /// The receiver copies large messages itself, inside its own progress calls (shm's
    /// cross-memory attach): posting ready sends before ready receives lets both peers copy at
    /// once.
    pub receiver_copies: bool,
}

/// Slice size where the provider says nothing better: small enough to pipeline, large enough
/// to amortise each message's latency.
pub const DEFAULT_SLICE_BYTES: usize = 1 << 20;

/// Poll window where the provider says nothing better.
pub const DEFAULT_POLL_WINDOW: Duration = Duration::from_micros(50);

impl Default for Caps {
    fn default() -> Caps {
        Caps {
            provider: String::new(),
            fabric: String::new(),
            domain: String::new(),
            inject_size: 0,
            inject_ok: false,
            max_msg_size: 0,
            mr_mode: 0,
            mr_local: false,
            hmem: false,
            rma: false,
            wait_fd: false,
            tx_size: 0,
            rx_size: 0,
            eager_bytes: usize::MAX,
            slice_bytes: DEFAULT_SLICE_BYTES,
            poll_window: DEFAULT_POLL_WINDOW,
            receiver_copies: false,
        }
    }
}

/// Tagged point-to-point messaging over one endpoint, the RDM model.
pub trait Transport: Send + Sync {
    fn caps(&self) -> &Caps;
    /// This endpoint's address, to be handed to peers.
    fn address(&self) -> Vec<u8>;
    /// Make a peer reachable; inserting the same address again returns the same `Peer`.
    fn insert_peer(&self, addr: &[u8]) -> Result<Peer>;
    fn register(&self, region: Region) -> Result<Mr>;
    /// Send `region` to `peer` with `tag`.
    fn send(
        &self,
        peer: Peer,
        tag: u64,
        region: Region,
        mr: Option<&Mr>,
        op: OpId,
    ) -> Result<Posted>;
    /// Receive a message whose tag equals `tag` on every bit not set in `ignore`.
    fn recv(
        &self,
        tag: u64,
        ignore: u64,
        region: Region,
        mr: Option<&Mr>,
        op: OpId,
    ) -> Result<Posted>;
    /// Send a buffer the transport owns until completion; never `Busy` (queued inside).
    fn send_owned(&self, peer: Peer, tag: u64, data: Vec<u8>, op: OpId) -> Result<()>;
    /// Receive into a buffer of `len` bytes the transport owns; handed back in the completion.
    fn recv_owned(&self, tag: u64, ignore: u64, len: usize, op: OpId) -> Result<()>;
    /// Cancel a posted receive; its completion (an error) still follows.
    fn cancel(&self, op: OpId);
    /// Append finished operations to `out`; returns how many were added.
    fn poll(&self, out: &mut Vec<Completion>) -> Result<usize>;
    /// Sleep until a completion may be ready, at most `timeout`.
    fn wait(&self, timeout: Duration) -> Result<()>;

    /// The largest payload of the direct channel to and from `peer` (`send_now`, `take_now`):
    /// 0 where there is none (the default). A message of at most that many bytes between the
    /// two endpoints, sent by `send` or `send_now`, is one `take_now` can take, and one `recv`
    /// can match: the two paths share one wire format, so either side may use either.
    fn direct_bytes(&self, _peer: Peer) -> usize {
        0
    }

    /// Send `data` (at most `direct_bytes(peer)` bytes) to `peer` now, without an operation
    /// or a completion: Ok(true) once it is on its way, Ok(false) when the channel is full
    /// (try again; the call has already moved what arrived for us out of the way).
    fn send_now(&self, _peer: Peer, _tag: u64, _data: &[u8]) -> Result<bool> {
        Err(Error::InvalidUsage(
            "this transport has no direct channel (direct_bytes is 0)".into(),
        ))
    }

    /// Take the message from `peer` whose tag is exactly `tag`, if it has arrived: `f` gets
    /// its payload and the message is consumed (Ok(true), or `f`'s error). Ok(false): not
    /// yet. An error when `peer` has gone without sending it. The caller must own `tag`: no
    /// posted `recv` may match it.
    fn take_now(
        &self,
        _peer: Peer,
        _tag: u64,
        _f: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<bool> {
        Err(Error::InvalidUsage(
            "this transport has no direct channel (direct_bytes is 0)".into(),
        ))
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
/// destination lies 1 to 31 bytes past the source modulo 4 KiB run about 6 to 20 times slower
/// on CPUs with fast `rep movsb` (glibc's memcpy and the kernel's copies for shared-memory
/// transfers both use it; see `reduce::copy`). Page-aligned staging never makes that gap with
/// another page-aligned or 64-byte-aligned buffer, which is what NCCL's and PyTorch's
/// allocators hand out.
///
/// From `MAPPED_BYTES` up the memory is an anonymous mapping of its own: the kernel hands it
/// out zeroed, a page at a time as it is first touched (a huge page from `HUGE_BYTES` up, see
/// `new`), so a collective's workspace costs only the pages its schedule writes. (The allocator's zeroed allocation of page-aligned memory
/// writes every byte first: 64 MiB of ReduceScatter workspace took 16k page faults and a
/// memset per call.)
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
    /// time through the page tables: from huge pages it read 1 MiB in 43 us against 87 us from
    /// 4 KiB pages here (a copy within one process takes 23 us either way).
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
    use super::{provider_tag_bits, require_tag_bits, Scratch, HUGE_BYTES, MAPPED_BYTES, TAG_BITS};

    #[test]
    fn tag_bits_come_from_the_highest_bit_of_mem_tag_format() {
        // What libfabric 1.17 reports: shm and tcp;ofi_rxm, then net (xnet).
        assert_eq!(provider_tag_bits(0xaaaa_aaaa_aaaa_aaaa), 64);
        assert_eq!(provider_tag_bits(0x5555_5555_5555_5555), 63);
        assert_eq!(provider_tag_bits(0), 64);
        assert_eq!(provider_tag_bits(0xffff_ffff), 32);
        assert!(provider_tag_bits(0x5555_5555_5555_5555) >= TAG_BITS);
        assert!(provider_tag_bits(0xffff_ffff) < TAG_BITS);
    }

    #[test]
    fn providers_with_narrower_tags_are_refused_by_name() {
        assert!(require_tag_bits("net", "lo", 0x5555_5555_5555_5555).is_ok());
        assert!(require_tag_bits("shm", "shm", 0).is_ok());
        let e = require_tag_bits("narrow", "eth0", 0xffff_ffff)
            .unwrap_err()
            .to_string();
        for part in ["narrow", "eth0", "32-bit", "63 bits"] {
            assert!(e.contains(part), "{part:?} missing from: {e}");
        }
    }

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

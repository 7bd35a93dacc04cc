//! Shared-memory rings for small messages between shm endpoints on one host.
//!
//! With libfabric 1.17's shm, a small message costs an untagged `fi_send` into the peer's
//! receive pool, a completion on each side, the provider's spin lock on the peer's region and a
//! repost of the pool buffer; on top come our software matching's context and map. That is
//! most of a 2-rank AllReduce of 8 bytes, several times Open MPI's, whose shared-memory BTL
//! writes small messages straight into a per-peer "fastbox" (figures in `docs/performance.md`).
//!
//! This module is our fastbox. Every endpoint that matches small messages in software
//! creates an *inbox* next to its shm region, named after it: `/dev/shm/<endpoint name>-fb`.
//! It holds `SLOTS` single-producer single-consumer byte rings. A sender maps the inbox of a
//! peer, claims a free slot (compare-and-swap of its owner word) and from then on writes every
//! message up to `MAX_PAYLOAD` bytes for that peer into its ring: a frame of length, tag and
//! payload, published by a release store of the ring's tail. The receiver's poll reads every
//! claimed ring up to its tail (acquire) and hands each frame to the software matcher, exactly
//! as a pool message; the send completes as soon as the frame is in the ring. The claimant
//! also writes its own endpoint's identity into the slot, so the receiver knows which peers'
//! messages all come through its rings (`Inbox::sends_here`).
//!
//! Messages between the provider's inject size (4 KiB) and `MAX_PAYLOAD` (16 KiB) take the
//! ring too: libfabric 1.17's shm moves them with a command, a `process_vm_readv` by the
//! receiver and a response, several microseconds one way at any of these sizes, where two
//! copies through the ring take a fraction of that. Not beyond 16 KiB: larger frames lose
//! when memory bandwidth is scarce (two copies against the provider's one), while 16 KiB
//! frames won in every case tried (figures in `docs/performance.md`).
//!
//! - No locks live in the shared memory, so a peer that dies mid-write leaves an unpublished
//!   frame and nothing else: the reader never waits on it (unlike the provider's region lock).
//! - Frames are checked before use (length, bounds, tail): a corrupt ring is logged and left
//!   alone, never read past.
//! - Messages for one peer keep their order: once a slot is claimed, every message of up to
//!   `MAX_PAYLOAD` bytes to that peer goes through it; a full ring makes the send `Busy`
//!   (the caller progresses and retries), it never overtakes through the provider.
//! - A frame raises no completion, so a waiter with an inbox never sleeps on its completion
//!   queue: it polls and yields (as every shm waiter does on libfabric 1.17, whose shm queue
//!   has no wait fd).
//! - Without an inbox (another version, no slot left, or `FABRICOLL_SHM_FASTBOX=0`) a sender
//!   uses the provider as before; the receiver accepts both.
//! - Larger messages between two endpoints that each hold a slot in the other's inbox go as
//!   an `RTS` frame that the receiver answers with an `ACK` after copying the data out of the
//!   sender's memory itself (`cma`); the frame's kind word tells them apart.
use crate::error::{Error, Result};
use std::ffi::CString;
use std::hash::Hasher;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const MAGIC: u64 = 0x6662_6f78_0000_0004; // "fbox", layout version 4 (frame kinds)
/// Senders one inbox can take; more use the provider.
pub(crate) const SLOTS: usize = 32;
/// Bytes of one ring: room for 7 frames of the largest payload. The file is sparse: a ring's
/// pages exist once its sender has claimed it.
const RING: usize = 128 << 10;
/// Largest payload that goes through a ring.
pub(crate) const MAX_PAYLOAD: usize = 16 << 10;
const LINE: usize = 64;
/// Header page: magic, then the claimed-slot high-water mark on its own line.
const HEADER: usize = 4096;
const HIGH: usize = LINE;
/// Per slot: owner word, tail (written by the sender), head (written by the receiver), the
/// sender's identity (`sender_id`), each on its own cache line, then the ring.
const SLOT_CTRL: usize = 4 * LINE;
const SLOT_BYTES: usize = SLOT_CTRL + RING;
pub(crate) const FILE_BYTES: usize = HEADER + SLOTS * SLOT_BYTES;
/// Frame header: payload length (u32), kind (u32: `DATA`, `RTS` or `ACK`), tag (u64).
const FRAME_HDR: usize = 16;
/// A message: the payload is the message.
pub(crate) const DATA: u32 = 0;
/// A request to send a larger message: the payload says where it lies in the sender's
/// memory (`Rts`), and the receiver copies it from there itself.
pub(crate) const RTS: u32 = 1;
/// The receiver's answer to an `RTS` (`Ack`).
pub(crate) const ACK: u32 = 2;
/// A length word meaning "the rest of the ring is unused; go on at its start".
const WRAP: u32 = u32::MAX;

fn frame_bytes(len: usize) -> usize {
    FRAME_HDR + len.div_ceil(8) * 8
}

/// The inbox name of the shm endpoint whose address is `addr`, when it is one of ours.
pub(crate) fn inbox_of_address(addr: &[u8]) -> Option<String> {
    super::watch::endpoint_in_address(addr).map(|n| inbox_name(&n))
}

/// The identity a sender writes into the slot it claims: a hash of its endpoint's name (the
/// crate's unseeded `FxHasher`, so every process computes the same), never 0 (a free
/// slot's word).
pub(crate) fn sender_id(endpoint: &str) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    h.write(endpoint.as_bytes());
    h.finish().max(1)
}

/// The inbox name of our endpoint named `endpoint`.
pub(crate) fn inbox_name(endpoint: &str) -> String {
    format!("{endpoint}-fb")
}

/// One mapping of an inbox file.
struct Map {
    base: *mut u8,
}

// SAFETY: the mapping is plain shared memory; every access to it goes through atomics or
// through frames whose ownership the ring protocol hands over (tail/head), never a Rust
// reference to memory another thread writes.
unsafe impl Send for Map {}

impl Map {
    /// Map `name` from /dev/shm; `create` makes a new zeroed file of FILE_BYTES.
    fn open(name: &str, create: bool) -> Result<Map> {
        let path = CString::new(format!("/{name}"))
            .map_err(|_| Error::InvalidArgument(format!("inbox name {name:?} has a NUL")))?;
        let flags = if create {
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL
        } else {
            libc::O_RDWR
        };
        // SAFETY: path is NUL-terminated; shm_open has no other precondition.
        let fd = unsafe { libc::shm_open(path.as_ptr(), flags | libc::O_CLOEXEC, 0o600) };
        if fd < 0 {
            return Err(Error::System(format!(
                "shm_open /dev/shm/{name}: {}",
                std::io::Error::last_os_error()
            )));
        }
        let r = Self::map_fd(fd, name, create);
        // SAFETY: fd is ours; the mapping (if any) keeps the memory without it.
        unsafe { libc::close(fd) };
        if r.is_err() && create {
            // SAFETY: as above; removes the file we just created.
            unsafe { libc::shm_unlink(path.as_ptr()) };
        }
        r
    }

    fn map_fd(fd: i32, name: &str, create: bool) -> Result<Map> {
        let sys = |what: &str| {
            Error::System(format!(
                "{what} /dev/shm/{name}: {}",
                std::io::Error::last_os_error()
            ))
        };
        if create {
            // SAFETY: fd is an open shm file; the new bytes read as zero.
            if unsafe { libc::ftruncate(fd, FILE_BYTES as libc::off_t) } != 0 {
                return Err(sys("ftruncate"));
            }
        } else {
            // SAFETY: st is a valid out-parameter for fstat.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: fd is open; st is writable.
            if unsafe { libc::fstat(fd, &mut st) } != 0 {
                return Err(sys("fstat"));
            }
            if st.st_size as usize != FILE_BYTES {
                return Err(Error::System(format!(
                    "/dev/shm/{name} has {} bytes, not the {FILE_BYTES} of this layout",
                    st.st_size
                )));
            }
        }
        // SAFETY: a fresh shared mapping of FILE_BYTES of an fd of at least that size.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FILE_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(sys("mmap"));
        }
        let m = Map { base: p as *mut u8 };
        if create {
            m.u64_at(0).store(MAGIC, Ordering::Release);
        } else if m.u64_at(0).load(Ordering::Acquire) != MAGIC {
            return Err(Error::System(format!(
                "/dev/shm/{name} is not an inbox of this layout"
            )));
        }
        Ok(m)
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert!(
            off.is_multiple_of(8) && off + 8 <= FILE_BYTES,
            "inbox offset {off}"
        );
        // SAFETY: in bounds and 8-aligned (the mapping is page-aligned); the mapping outlives
        // &self; all accesses to this word, in every process, are atomic.
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        assert!(
            off.is_multiple_of(4) && off + 4 <= FILE_BYTES,
            "inbox offset {off}"
        );
        // SAFETY: as in u64_at, 4-aligned.
        unsafe { &*(self.base.add(off) as *const AtomicU32) }
    }

    fn slot(&self, s: usize) -> usize {
        HEADER + s * SLOT_BYTES
    }
    fn owner(&self, s: usize) -> &AtomicU64 {
        self.u64_at(self.slot(s))
    }
    fn tail(&self, s: usize) -> &AtomicU64 {
        self.u64_at(self.slot(s) + LINE)
    }
    fn head(&self, s: usize) -> &AtomicU64 {
        self.u64_at(self.slot(s) + 2 * LINE)
    }
    fn sender(&self, s: usize) -> &AtomicU64 {
        self.u64_at(self.slot(s) + 3 * LINE)
    }
    fn high(&self) -> &AtomicU32 {
        self.u32_at(HIGH)
    }
    /// Fault in slot `s`'s pages in this mapping now (`advice`: MADV_POPULATE_READ or
    /// _WRITE; writing allocates them in the file), rather than one page at a time as its
    /// ring first goes round, which slowed the first small collectives measurably (figures in
    /// `docs/performance.md`). Kernels before 5.14 refuse the advice (EINVAL), which is no
    /// error here: the pages come on demand. Any other error is: writing the file's pages
    /// then would kill the process with SIGBUS (a full /dev/shm).
    fn populate(&self, s: usize, advice: libc::c_int) -> std::io::Result<()> {
        let start = self.slot(s) / 4096 * 4096;
        let end = self.slot(s) + SLOT_BYTES;
        // SAFETY: [start, end) lies inside the mapping (FILE_BYTES covers every slot); the
        // advice only faults pages in and changes no byte.
        let rc = unsafe {
            libc::madvise(
                self.base.add(start) as *mut libc::c_void,
                end - start,
                advice,
            )
        };
        let e = std::io::Error::last_os_error();
        match rc {
            0 => Ok(()),
            _ if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
            _ => Err(e),
        }
    }

    /// Address of byte `off` of slot `s`'s ring.
    fn ring(&self, s: usize, off: usize) -> *mut u8 {
        assert!(s < SLOTS && off < RING, "ring {s} offset {off}");
        // SAFETY: in bounds of the mapping by the assertion and the layout.
        unsafe { self.base.add(self.slot(s) + SLOT_CTRL + off) }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: base is a mapping of FILE_BYTES made in open and not unmapped since.
        unsafe { libc::munmap(self.base as *mut libc::c_void, FILE_BYTES) };
    }
}

/// A frame as `Inbox::frame` finds it: the position after it and, unless it is a wrap marker,
/// its kind and the address and length of its `[tag][payload]`.
type Frame = (u64, Option<(u32, *const u8, usize)>);

/// A frame `Inbox::drain` hands over.
pub(crate) struct Arrived<'a> {
    /// The `sender_id` of the endpoint holding the slot it came through.
    pub(crate) from: u64,
    /// `DATA`, `RTS` or `ACK`.
    pub(crate) kind: u32,
    /// `[tag (8 bytes LE)][payload]`.
    pub(crate) msg: &'a [u8],
}

/// Our endpoint's inbox: the receiving side.
pub(crate) struct Inbox {
    map: Map,
    pub(crate) name: String,
    /// The process that created it (a forked child must not unlink it).
    owner: u32,
    /// Slots found corrupt, skipped from then on.
    broken: u64,
    /// Slots whose pages this mapping has faulted in (`Map::populate`).
    populated: usize,
}

impl Inbox {
    pub(crate) fn create(endpoint: &str) -> Result<Inbox> {
        let name = inbox_name(endpoint);
        let map = Map::open(&name, true)?;
        super::watch::opened(name.clone());
        Ok(Inbox {
            map,
            name,
            owner: std::process::id(),
            broken: 0,
            populated: 0,
        })
    }

    fn claimed(&self) -> usize {
        (self.map.high().load(Ordering::Acquire) as usize).min(SLOTS)
    }

    /// Whether the endpoint whose `sender_id` is `id` holds a slot here, so that every message
    /// of up to `MAX_PAYLOAD` bytes it sends us comes through this inbox.
    pub(crate) fn sends_here(&self, id: u64) -> bool {
        (0..self.claimed()).any(|s| {
            self.broken & (1 << s) == 0
                && self.map.owner(s).load(Ordering::Acquire) != 0
                && self.map.sender(s).load(Ordering::Acquire) == id
        })
    }

    /// Hand every published frame to `deliver`, in ring order; returns how many were
    /// delivered.
    pub(crate) fn drain(&mut self, mut deliver: impl FnMut(Arrived<'_>)) -> usize {
        let mut n = 0;
        let claimed = self.claimed();
        while self.populated < claimed {
            // Reading maps the sender's pages; nothing to do if that cannot be done early.
            let _ = self.map.populate(self.populated, libc::MADV_POPULATE_READ);
            self.populated += 1;
        }
        for s in 0..claimed {
            if self.broken & (1 << s) != 0 {
                continue;
            }
            let head0 = self.map.head(s).load(Ordering::Relaxed);
            let tail = self.map.tail(s).load(Ordering::Acquire);
            let mut head = head0;
            if head == tail {
                continue;
            }
            let from = self.map.sender(s).load(Ordering::Acquire);
            while head != tail {
                match self.frame(s, head, tail) {
                    Ok((next, Some((kind, p, len)))) => {
                        // SAFETY: the frame lies in the ring (checked in `frame`) and is ours
                        // until head passes it: its sender writes there only after that.
                        let msg = unsafe { std::slice::from_raw_parts(p, len) };
                        deliver(Arrived { from, kind, msg });
                        n += 1;
                        head = next;
                    }
                    Ok((next, None)) => head = next,
                    Err(why) => {
                        log::error!(
                            "fastbox /dev/shm/{} slot {s}: {why}; the slot is ignored from now on",
                            self.name
                        );
                        self.broken |= 1 << s;
                        break;
                    }
                }
            }
            if head != head0 {
                self.map.head(s).store(head, Ordering::Release);
            }
        }
        n
    }

    /// The frame at ring position `head`: the next position and, unless it is a wrap marker,
    /// the address and length of `[tag][payload]`.
    fn frame(&self, s: usize, head: u64, tail: u64) -> std::result::Result<Frame, String> {
        let avail = tail.wrapping_sub(head);
        if avail > RING as u64 || !head.is_multiple_of(8) {
            return Err(format!("head {head} and tail {tail} are inconsistent"));
        }
        let off = (head % RING as u64) as usize;
        // SAFETY: off < RING and 8-aligned, so the 4-byte length word is inside the ring; the
        // sender published it before the tail we read (acquire).
        let len = unsafe { std::ptr::read_volatile(self.map.ring(s, off) as *const u32) };
        if len == WRAP {
            let skip = (RING - off) as u64;
            if skip > avail {
                return Err(format!("a wrap marker at {head} runs past the tail {tail}"));
            }
            return Ok((head + skip, None));
        }
        let len = len as usize;
        let frame = frame_bytes(len);
        if len > MAX_PAYLOAD || off + frame > RING || frame as u64 > avail {
            return Err(format!(
                "a frame of {len} bytes at {head} does not fit (tail {tail})"
            ));
        }
        // SAFETY: the kind word follows the length word inside the frame checked just above.
        let kind = unsafe { std::ptr::read_volatile(self.map.ring(s, off + 4) as *const u32) };
        if kind > ACK {
            return Err(format!("a frame of unknown kind {kind} at {head}"));
        }
        Ok((
            head + frame as u64,
            Some((kind, self.map.ring(s, off + 8) as *const u8, 8 + len)),
        ))
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        if self.owner == std::process::id() {
            if let Ok(c) = CString::new(format!("/{}", self.name)) {
                // SAFETY: c is NUL-terminated; unlinking drops the name, senders keep their maps.
                unsafe { libc::shm_unlink(c.as_ptr()) };
            }
            super::watch::closed(&self.name);
        }
    }
}

static TOKENS: AtomicU64 = AtomicU64::new(1);

/// What a push did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// In the ring: the send is complete.
    Done,
    /// The ring is full: progress and retry.
    Full,
}

/// A slot claimed in a peer's inbox: the sending side.
pub(crate) struct Outbox {
    map: Map,
    slot: usize,
    token: u64,
    /// The process that claimed the slot (a forked child must not give it back).
    pid: u32,
    /// Our copy of the ring's tail (we are its only writer) and the last head we read.
    tail: u64,
    head: u64,
    /// Frames pushed and pushes refused (full), for the log.
    pushes: u64,
    full: u64,
}

impl Outbox {
    /// Claim a slot in the inbox `name` for our endpoint named `sender`. Errors: no such
    /// inbox (a peer without one), a file of another layout, every slot taken.
    pub(crate) fn open(name: &str, sender: &str) -> Result<Outbox> {
        Self::claim(Map::open(name, false)?, name, sender)
    }

    /// `open`'s claim of a free slot of `map` (the inbox `name`).
    fn claim(map: Map, name: &str, sender: &str) -> Result<Outbox> {
        let token = (u64::from(std::process::id()) << 32)
            | (TOKENS.fetch_add(1, Ordering::Relaxed) & 0xffff_ffff);
        for slot in 0..SLOTS {
            // The slot's pages first, before even its owner word is read: on a full /dev/shm
            // touching a page that does not exist yet raises SIGBUS; this is an error instead,
            // and the caller uses the provider.
            if let Err(e) = map.populate(slot, libc::MADV_POPULATE_WRITE) {
                return Err(Error::System(format!(
                    "no memory for a ring of /dev/shm/{name} (is /dev/shm full?): {e}"
                )));
            }
            if map
                .owner(slot)
                .compare_exchange(0, token, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                // Before the high-water mark: a reader that sees the slot sees who holds it.
                map.sender(slot).store(sender_id(sender), Ordering::Release);
                map.high().fetch_max(slot as u32 + 1, Ordering::AcqRel);
                let tail = map.tail(slot).load(Ordering::Acquire);
                let head = map.head(slot).load(Ordering::Acquire);
                return Ok(Outbox {
                    map,
                    slot,
                    token,
                    pid: std::process::id(),
                    tail,
                    head,
                    pushes: 0,
                    full: 0,
                });
            }
        }
        Err(Error::System(format!(
            "every one of the {SLOTS} slots of /dev/shm/{name} is taken"
        )))
    }

    /// Copy `[tag][data]` into the ring as a `DATA` frame; `data.len()` must be at most
    /// MAX_PAYLOAD.
    pub(crate) fn push(&mut self, tag: u64, data: &[u8]) -> Pushed {
        self.push_kind(DATA, tag, data)
    }

    /// `push`, as a frame of `kind`.
    pub(crate) fn push_kind(&mut self, kind: u32, tag: u64, data: &[u8]) -> Pushed {
        assert!(
            data.len() <= MAX_PAYLOAD,
            "fastbox payload over MAX_PAYLOAD"
        );
        let frame = frame_bytes(data.len());
        let off = (self.tail % RING as u64) as usize;
        let wrap = if off + frame > RING { RING - off } else { 0 };
        let need = (wrap + frame) as u64;
        if self.tail + need - self.head > RING as u64 {
            self.head = self.map.head(self.slot).load(Ordering::Acquire);
            if self.tail + need - self.head > RING as u64 {
                self.full += 1;
                return Pushed::Full;
            }
        }
        let s = self.slot;
        let mut at = off;
        if wrap > 0 {
            // SAFETY: off < RING and 8-aligned: the length word is inside the ring, in bytes
            // the receiver has released (head checked above).
            unsafe { std::ptr::write_volatile(self.map.ring(s, off) as *mut u32, WRAP) };
            at = 0;
        }
        // SAFETY: [at, at + frame) is inside the ring (wrap handled) and released by the
        // receiver, which reads none of it before the tail below publishes it; at is
        // 8-aligned, so the header words are aligned. `data` is our caller's memory, not the
        // ring.
        unsafe {
            let p = self.map.ring(s, at);
            std::ptr::write_volatile(p as *mut u32, data.len() as u32);
            std::ptr::write_volatile(p.add(4) as *mut u32, kind);
            std::ptr::write_volatile(p.add(8) as *mut u64, tag.to_le());
            let payload = std::slice::from_raw_parts_mut(p.add(FRAME_HDR), data.len());
            // Not a plain memcpy: its `rep movsb` is many times slower when the ring lies 1 to
            // 63 bytes past the caller's buffer modulo 4 KiB (see `reduce::copy`), which some
            // frame of a ring always does to some buffer.
            crate::reduce::copy(payload, data);
        }
        self.tail += need;
        self.pushes += 1;
        self.map.tail(s).store(self.tail, Ordering::Release);
        Pushed::Done
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        log::debug!(
            "fastbox slot {}: {} frames sent, {} pushes found the ring full",
            self.slot,
            self.pushes,
            self.full
        );
        // Give the slot back when the receiver has read everything, so a later sender can take
        // it; otherwise it stays claimed (read frames must not be overwritten by a newcomer
        // that starts from a tail the receiver has not reached).
        if self.pid == std::process::id()
            && self.map.head(self.slot).load(Ordering::Acquire) == self.tail
        {
            self.map.sender(self.slot).store(0, Ordering::Release);
            let _ = self.map.owner(self.slot).compare_exchange(
                self.token,
                0,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }
}

#[cfg(test)]
mod tests;

//! The `Transport` trait: tagged send/receive between endpoints, memory registration and
//! completion polling, with the semantics of a libfabric RDM endpoint. Two backends:
//! `fabric` (libfabric) and `loopback` (in-process, ranks as threads, for tests), and `tiered`,
//! one transport over two of them (peers of this host on one, the others on the other). `open`
//! opens the collective engines' transport as the configuration asks.
use crate::error::{Error, Result};
use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

pub mod fabric;
pub mod loopback;
mod mem;
pub mod open;
pub mod tiered;

pub use mem::{Region, Scratch};

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

/// A dma-buf that exports device memory, for `Transport::register_dmabuf`: its file
/// descriptor (the caller's, open for the call) and where the registered region starts in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaBuf {
    pub fd: i32,
    pub offset: u64,
}

/// A registration returned by `Transport::register`; deregistered when dropped.
pub struct Mr {
    /// The descriptor to pass with operations (`fi_mr_desc`), 0 when none.
    pub desc: usize,
    pub region: Region,
    /// Backend state that closes the registration when dropped.
    pub keep: Option<Box<dyn Any + Send + Sync>>,
    /// The key peers use to reach this registration remotely (`Transport::register_remote`
    /// only; None for `register`).
    pub key: Option<u64>,
    /// The CUDA device whose memory this is (`Transport::register_device`); None: host memory.
    pub device: Option<i32>,
}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("desc", &self.desc)
            .field("region", &self.region)
            .field("key", &self.key)
            .field("device", &self.device)
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

/// What remote memory access the transport offers (`Caps::rma_caps`; None: no RMA).
///
/// Where it is offered, callers address a peer's memory by the peer's virtual address (the
/// invariant the plugin layer relies on), as the Neuron net plugin's `iwrite`/`iread` hand it
/// over, whatever the provider's mode: where the provider takes offsets into the
/// registration instead (`virt_addr` false), the transport translates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RmaCaps {
    /// The provider's own mode: remote addresses are virtual addresses (libfabric's
    /// `FI_MR_VIRT_ADDR`). Where false, the provider takes offsets into the registration, and
    /// the transport chooses keys that carry each registration's base address and subtracts
    /// it from the caller's virtual address.
    pub virt_addr: bool,
    /// The provider chooses the keys (`FI_MR_PROV_KEY`); otherwise the transport requests
    /// keys (unique in the process, or base-carrying where `virt_addr` is false). Never true
    /// with `virt_addr` false: such keys could not carry the base.
    pub prov_key: bool,
    /// Bytes of a key the provider uses (`mr_key_size`).
    pub key_size: usize,
    /// The largest `Transport::write_inject` (`FI_OPT_INJECT_RMA_SIZE` where the provider
    /// answers it, else the endpoint's inject size).
    pub inject_size: usize,
}

/// What a backend can do, probed, not assumed. The layers above read these fields, never the
/// provider's name: the transport that fills them in knows its provider's protocols.
///
/// A transport over two fabrics (`tiered::Tiered`) reports the inter-host fabric's fields
/// (what the cost model prices: the network), except where noted, and the intra-host
/// fabric's own in `intra`.
#[derive(Debug, Clone)]
pub struct Caps {
    pub provider: String,
    pub fabric: String,
    pub domain: String,
    pub inject_size: usize,
    /// `fi_tinject` may be used for messages up to `inject_size` (see `fabric::discovery::inject_safe`).
    pub inject_ok: bool,
    pub max_msg_size: usize,
    /// Raw libfabric `mr_mode` bits the provider asked for.
    pub mr_mode: u64,
    /// Registration is required for local buffers (`FI_MR_LOCAL` or HMEM).
    pub mr_local: bool,
    pub hmem: bool,
    /// The domain offers `FI_RMA` (in whatever addressing mode; see `rma_caps`).
    pub rma: bool,
    /// The remote memory access this endpoint can do (`Transport::register_remote`, `write`,
    /// `write_inject`, `read`); None where it can do none.
    pub rma_caps: Option<RmaCaps>,
    /// The endpoint's completion queue has a wait object we can sleep on (over two fabrics:
    /// both have one).
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
    /// The endpoint has a direct channel (`Transport::send_now` / `take_now`): to a peer whose
    /// endpoint has one too, `Transport::direct_bytes` is then non-zero (over two fabrics:
    /// the intra-host one has it).
    pub direct_channel: bool,
    /// How many endpoints the net plugin stripes a comm's large messages over by default
    /// (`FABRICOLL_NET_STREAMS` overrides): 1 keeps one endpoint per comm; 0 where striping is
    /// not offered (providers without one connection per endpoint pair, such as shm).
    pub net_streams: usize,
    /// Closing the endpoint may discard messages it sent that the peer has not taken yet,
    /// though their sends completed (a completion means the buffer may be reused, not that
    /// the peer has the message): the communicator says goodbye before it closes
    /// (`coll::goodbye`). False for the in-process loopback, whose messages outlive it.
    pub close_loses: bool,
    /// An endpoint reads the messages of a peer endpoint of the same process in that
    /// endpoint's own memory (shm maps such a peer's region by pointer, not by a mapping of
    /// its own): closing an endpoint while another one here has yet to read its messages
    /// crashes the reader, so ended communicators' endpoints close together
    /// (`coll::closer`).
    pub reads_local_peers: bool,
    /// A receive that a longer message matches kills the process or never completes
    /// (libfabric 2.x's shm): a collective's receives then match its signature exactly, and
    /// other calls' messages are found with `Transport::take_foreign`. Per fabric: see
    /// `Transport::caps_to`.
    pub truncation_crashes: bool,
    /// Endpoint addresses are socket addresses, each endpoint listening on its own port while
    /// it is open (`net`, `tcp`): `Transport::peer_gone` can ask the address.
    pub socket_addresses: bool,
    /// Nominal one-way latency of a message in microseconds (the net plugin's `latency`
    /// property); 0 where the provider is not one we know (NCCL's default).
    pub latency_us: f32,
    /// Over two fabrics, the capabilities of the one between ranks of this host (shared
    /// memory), whose eager limit, slice size and poll window price the intra-host steps; the
    /// other fields describe the fabric between hosts. None over one fabric.
    pub intra: Option<Arc<Caps>>,
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
            rma_caps: None,
            wait_fd: false,
            tx_size: 0,
            rx_size: 0,
            eager_bytes: usize::MAX,
            slice_bytes: DEFAULT_SLICE_BYTES,
            poll_window: DEFAULT_POLL_WINDOW,
            receiver_copies: false,
            direct_channel: false,
            net_streams: 0,
            close_loses: false,
            reads_local_peers: false,
            truncation_crashes: false,
            socket_addresses: false,
            latency_us: 0.0,
            intra: None,
        }
    }
}

/// How a transport's `wait` would sleep now (`Transport::wait_object`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitObject {
    /// Something is ready or needs progress: poll again instead of sleeping.
    Ready,
    /// Nothing to sleep on: yield the CPU.
    Yield,
    /// Nothing is ready, and this file descriptor becomes readable when something is.
    Fd(std::os::raw::c_int),
}

/// Tagged point-to-point messaging over one endpoint, the RDM model.
pub trait Transport: Send + Sync {
    fn caps(&self) -> &Caps;
    /// The capabilities of the fabric that reaches `peer` (over one fabric, `caps`).
    fn caps_to(&self, _peer: Peer) -> &Caps {
        self.caps()
    }
    /// This endpoint's address, to be handed to peers.
    fn address(&self) -> Vec<u8>;
    /// Make a peer reachable; inserting the same address again returns the same `Peer`.
    fn insert_peer(&self, addr: &[u8]) -> Result<Peer>;
    fn register(&self, region: Region) -> Result<Mr>;

    /// Register `region`, memory of CUDA device `ordinal`, exactly (no page rounding) for
    /// sends and receives (`FI_HMEM_CUDA`). Sends from such a registration take the provider's
    /// tagged path, never a path that reads the bytes on the CPU.
    fn register_device(&self, region: Region, ordinal: i32) -> Result<Mr> {
        let _ = (region, ordinal);
        Err(Error::InvalidUsage(format!(
            "{}: this transport does not register device memory",
            self.caps().provider
        )))
    }

    /// `register_device` through a dma-buf that exports the memory (`FI_MR_DMABUF`, libfabric
    /// 1.20 and later): `buf.offset` is where `region` starts in it.
    fn register_dmabuf(&self, region: Region, ordinal: i32, buf: DmaBuf) -> Result<Mr> {
        let _ = (region, ordinal, buf);
        Err(Error::InvalidUsage(format!(
            "{}: this transport does not register dma-bufs",
            self.caps().provider
        )))
    }

    /// Register `region` exactly (no page rounding) for local use and for peers' remote reads
    /// and writes; the key peers use is in `Mr::key`. Only where `caps().rma_caps` is Some.
    fn register_remote(&self, region: Region) -> Result<Mr> {
        let _ = region;
        Err(no_rma())
    }

    /// Write `src` (its registration's `desc`, or 0) into `peer`'s memory at virtual address
    /// `addr` of its registration with `key` (`fi_write`). Its completion, with `len` the
    /// bytes written, comes through `poll` as `op`; `src` must stay untouched until then.
    /// Where the transport translates addresses, one below the registration's start is an
    /// error naming `addr` (as for `write_inject` and `read`).
    fn write(
        &self,
        peer: Peer,
        src: Region,
        desc: usize,
        addr: u64,
        key: u64,
        op: OpId,
    ) -> Result<Posted> {
        let _ = (peer, src, desc, addr, key, op);
        Err(no_rma())
    }

    /// Write `src` (at most `rma_caps.inject_size` bytes, no registration needed) into
    /// `peer`'s memory at `addr` with `key` (`fi_inject_write`): `Queued` means it is on its
    /// way and `src` may be reused at once; no completion follows. `Busy`: try again after
    /// progress.
    fn write_inject(&self, peer: Peer, src: &[u8], addr: u64, key: u64) -> Result<Posted> {
        let _ = (peer, src, addr, key);
        Err(no_rma())
    }

    /// Read `peer`'s memory at virtual address `addr` of its registration with `key` into
    /// `dst` (its registration's `desc`, or 0) (`fi_read`). Its completion, with `len` the
    /// bytes read, comes through `poll` as `op`.
    fn read(
        &self,
        peer: Peer,
        dst: Region,
        desc: usize,
        addr: u64,
        key: u64,
        op: OpId,
    ) -> Result<Posted> {
        let _ = (peer, dst, desc, addr, key, op);
        Err(no_rma())
    }
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
    /// `recv` of a message that only `from` sends: a transport over several fabrics posts it
    /// on the one that reaches `from`; one fabric ignores it (the tag already names the
    /// sender).
    fn recv_from(
        &self,
        from: Peer,
        tag: u64,
        ignore: u64,
        region: Region,
        mr: Option<&Mr>,
        op: OpId,
    ) -> Result<Posted> {
        let _ = from;
        self.recv(tag, ignore, region, mr, op)
    }
    /// Send a buffer the transport owns until completion; never `Busy` (queued inside).
    fn send_owned(&self, peer: Peer, tag: u64, data: Vec<u8>, op: OpId) -> Result<()>;
    /// Receive into a buffer of `len` bytes the transport owns; handed back in the completion.
    fn recv_owned(&self, tag: u64, ignore: u64, len: usize, op: OpId) -> Result<()>;
    /// Cancel a posted receive; its completion (an error) still follows.
    fn cancel(&self, op: OpId);
    /// Whether `peer`'s endpoint is known to be gone: closed or its process exited (shm: the
    /// peer watch, and the endpoint's region or, in this process, its registry), or, with
    /// `ask_address`, its address refuses connections (`Caps::socket_addresses`: a
    /// connection attempt, bounded, so asked only of a peer that looks stuck). False where
    /// nothing is known.
    fn peer_gone(&self, _peer: Peer, _ask_address: bool) -> bool {
        false
    }
    /// Append finished operations to `out`; returns how many were added.
    fn poll(&self, out: &mut Vec<Completion>) -> Result<usize>;
    /// The owner enters (`true`) or leaves (`false`) a blocking wait, in which it polls again
    /// whenever it gets a CPU: a transport that progresses endpoints whose owner stopped
    /// polling (the native TCP tender) leaves them alone meanwhile, however long the owner
    /// goes without a CPU. Calls nest: every enter has its leave.
    fn owner_waits(&self, _on: bool) {}
    /// Sleep until a completion may be ready, at most `timeout`.
    fn wait(&self, timeout: Duration) -> Result<()>;

    /// Prepare to sleep as `wait` would, without sleeping: a transport that waits on several
    /// (`tiered`) sleeps on all their file descriptors at once. After `Fd(fd)`, the caller may
    /// sleep in poll(2) on `fd` until it is readable; it must poll the transport first.
    fn wait_object(&self) -> WaitObject {
        WaitObject::Yield
    }

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

    /// Where receives match a collective's signature exactly (`Caps::truncation_crashes`):
    /// look at the first message from `peer` waiting unexpected whose tag equals `tag` on
    /// every bit not set in `ignore`. One that differs from `tag` in a bit of `compare` (another
    /// call's) is received whole and dropped, and its tag returned; None where it agrees, where
    /// nothing waits, or where the transport has no such hazard.
    fn take_foreign(
        &self,
        _peer: Peer,
        _tag: u64,
        _ignore: u64,
        _compare: u64,
    ) -> Result<Option<u64>> {
        Ok(None)
    }

    /// Take the message from `peer` whose tag equals `tag` on every bit not set in `ignore`,
    /// if it has arrived: `f` gets its tag and payload and the message is consumed (Ok(true),
    /// or `f`'s error). Ok(false): not yet. An error when `peer` has gone without sending it.
    /// The caller must own the tags it matches: no posted `recv` may match them.
    fn take_now(
        &self,
        _peer: Peer,
        _tag: u64,
        _ignore: u64,
        _f: &mut dyn FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<bool> {
        Err(Error::InvalidUsage(
            "this transport has no direct channel (direct_bytes is 0)".into(),
        ))
    }
}

/// The error of an RMA call on a transport without RMA.
fn no_rma() -> Error {
    Error::InvalidUsage("this transport offers no RMA (caps().rma_caps is None)".into())
}

#[cfg(test)]
mod tests {
    use super::{provider_tag_bits, require_tag_bits, TAG_BITS};

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
}

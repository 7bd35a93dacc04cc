//! The emulated device: a test tool that behaves as a GPU does where code gets GPUs wrong,
//! so that every CI run checks the device data path without one. It is not a fallback: where no
//! GPU is present, users get host-only behaviour.
//!
//! What it makes fail, as a real GPU would (or worse, louder):
//! - a host access to device memory: the address handed out is `PROT_NONE`, so the access
//!   faults (SIGSEGV); only the engine reaches the pages, through a second mapping (`memory`);
//! - a missing wait: streams are worker threads that run their work in order after random
//!   delays (`EmuConfig::max_delay`), and events and flags complete when the worker gets there
//!   (`engine`);
//! - a call on a thread without the device's current context (`Device::bind`): an error, as in
//!   CUDA;
//! - a stream that waits for a flag nobody writes: the stream fails after
//!   `EmuConfig::flag_timeout` with an error naming the flag;
//! - a call the CUDA driver makes wait for the whole context (allocating or freeing
//!   page-locked memory, creating a stream, loading the kernels) while a stream waits for a
//!   flag that the caller's side has yet to write: an error naming the driver call after half
//!   the flag timeout, where a GPU would never return. The context is shared by every emulated
//!   device of the ordinal in the process, as the primary context is (`context`);
//! - a flag wait that holds back another stream's work: the context's streams share a few
//!   hardware queues (`EmuConfig::queues`), and an operation starts only after every one
//!   enqueued earlier on its queue has, a wait only once satisfied (`queue`);
//! - a use of freed device memory, through a raw span: the engine reports it (freed ranges stay
//!   reserved for a while, `memory`);
//! - the legacy stream, pageable memory in an asynchronous copy, an event never recorded: the
//!   seam's public layer refuses them for both implementations.
mod context;
mod engine;
mod memory;
mod queue;

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::backend::{
    Backend, DeviceInfo, DeviceKind, HostAlloc, Kernel, PtrKind, RawEvent, RawStream,
};
use super::Device;
use crate::{Error, Result};
use context::StreamTable;
use engine::{Engine, EventState, Op, Worker};
use memory::Mem;

/// How an emulated device behaves.
#[derive(Clone, Debug)]
pub struct EmuConfig {
    /// The device's ordinal (what classification reports).
    pub ordinal: i32,
    /// Each stream operation waits a random time in `[0, max_delay]` before it runs.
    pub max_delay: Duration,
    /// The seed of the delays; None draws one from the clock.
    pub seed: Option<u64>,
    /// How long a stream waits for a flag (or an event) before it fails, naming the flag.
    pub flag_timeout: Duration,
    /// Where the reduction kernels are loaded: false (the CUDA backend's way), when the
    /// process opens its first device of the ordinal; true, at the first kernel launch on any
    /// device of the ordinal, as the driver's lazy loading does for a module loaded late.
    /// Either way loading waits for every stream of the context.
    pub lazy_module: bool,
    /// The context's hardware work queues (`CUDA_DEVICE_MAX_CONNECTIONS`, 1 to 32), over which
    /// its streams are spread round-robin as they are created (`queue`). Read when the first
    /// live device of the ordinal makes the context, as the driver reads the variable when it
    /// makes the context; a device opened on a live context must ask for the same number.
    /// The default is the driver's, 8: what a process gets that does not set the variable,
    /// so that code which meets the hazard of shared queues there fails here too. Tests of
    /// ranks as threads of one process, whose streams all share one context, ask for 32, as
    /// scripts/gpu-tests.sh sets the variable on the GPU.
    pub queues: usize,
}

/// `CUDA_DEVICE_MAX_CONNECTIONS`' default and its largest value.
const DEFAULT_QUEUES: usize = 8;
const MAX_QUEUES: usize = 32;

impl Default for EmuConfig {
    fn default() -> EmuConfig {
        EmuConfig {
            ordinal: 0,
            max_delay: Duration::from_micros(200),
            seed: None,
            flag_timeout: Duration::from_secs(10),
            lazy_module: false,
            queues: DEFAULT_QUEUES,
        }
    }
}

thread_local! {
    /// The emulated device whose context is current on this thread (its id; 0 for none).
    static CURRENT: Cell<u64> = const { Cell::new(0) };
}

/// Ids of emulated devices and their streams and events (never 0, 1 or 2, the values CUDA
/// reserves for its default streams).
static NEXT_ID: AtomicU64 = AtomicU64::new(0x1000);

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// The emulated implementation of `Backend`.
pub struct EmuBackend {
    id: u64,
    info: DeviceInfo,
    seed: u64,
    engine: Engine,
    /// This device's streams; the context (`context`) holds the table weakly.
    streams: Arc<StreamTable>,
    events: Mutex<HashMap<u64, Arc<EventState>>>,
}

impl Device {
    /// An emulated device (a test tool; see `device::emu`). The calling thread is bound to it.
    /// The first device of an ordinal in the process loads the kernels (unless
    /// `EmuConfig::lazy_module`), which waits for every stream of the context, as
    /// `Device::cuda` does; it fails (`Timeout`, naming the call) where a stream of the
    /// ordinal stays blocked past half the flag timeout.
    pub fn emulated(cfg: EmuConfig) -> Result<Device> {
        if !(1..=MAX_QUEUES).contains(&cfg.queues) {
            return Err(Error::arg(
                "queues",
                format!(
                    "{} hardware queues: a context has 1 to {MAX_QUEUES} (as \
                     CUDA_DEVICE_MAX_CONNECTIONS)",
                    cfg.queues
                ),
            ));
        }
        let seed = cfg.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
        let b = EmuBackend {
            id: next_id(),
            info: DeviceInfo {
                kind: DeviceKind::Emulated,
                ordinal: cfg.ordinal,
                name: format!("emulated device {}", cfg.ordinal),
                compute: (0, 0),
                stream_mem_ops: true,
            },
            seed,
            engine: Engine {
                mem: Arc::new(Mutex::new(Mem::new(cfg.ordinal))),
                max_delay: cfg.max_delay,
                flag_timeout: cfg.flag_timeout,
            },
            streams: Arc::default(),
            events: Mutex::new(HashMap::new()),
        };
        context::join(cfg.ordinal, &b.streams, cfg.queues)?;
        if !cfg.lazy_module && !context::kernels_loaded(cfg.ordinal) {
            b.load_kernels("when the process first opens the device")?;
        }
        b.bind()?;
        Ok(Device::from_backend(Arc::new(b)))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl EmuBackend {
    fn mem(&self) -> std::sync::MutexGuard<'_, Mem> {
        lock(&self.engine.mem)
    }

    fn worker(&self, s: RawStream) -> Result<Arc<Worker>> {
        lock(&self.streams)
            .get(&s.0)
            .cloned()
            .ok_or_else(|| Error::arg("stream", format!("{:#x} is not a live stream", s.0)))
    }

    fn event(&self, e: RawEvent) -> Result<Arc<EventState>> {
        lock(&self.events)
            .get(&e.0)
            .cloned()
            .ok_or_else(|| Error::arg("event", format!("{:#x} is not a live event", e.0)))
    }

    /// What the CUDA driver does for a call it makes device-wide (`call`): wait until no
    /// stream of the context (any emulated device of this ordinal in the process) has work
    /// left; past half the flag timeout (before a blocked stream itself fails), an error naming
    /// `call` (`context::wait_idle`).
    fn device_wide(&self, call: &str) -> Result<()> {
        context::wait_idle(self.info.ordinal, self.engine.flag_timeout / 2, call)
    }

    /// Loads the reduction kernels in the context (`when` says why now): waits for the
    /// context, as `cuModuleLoadData` does, then marks them loaded for the process.
    fn load_kernels(&self, when: &str) -> Result<()> {
        self.device_wide(&format!(
            "cuModuleLoadData (loading the reduction kernels {when})"
        ))?;
        context::set_kernels_loaded(self.info.ordinal);
        Ok(())
    }

    /// What the CUDA driver does for an asynchronous copy between two host buffers: it is
    /// synchronous with respect to the host (no copy engine is involved), so the call returns
    /// only once stream `w` has reached and done the copy. Where the stream waits for a flag
    /// that the calling side writes later, a GPU never returns; here the wait ends after half
    /// the flag timeout with a `Timeout` that says so.
    fn host_to_host(&self, w: &Worker) -> Result<()> {
        let limit = self.engine.flag_timeout / 2;
        if context::wait_until(limit, || w.idle()) {
            return Ok(());
        }
        Err(Error::Timeout(format!(
            "emulated device {}: cuMemcpyAsync between two host buffers is synchronous with \
             respect to the host, as on CUDA, and its stream had not reached it after {} ms (a \
             stream blocked on a flag that the calling side has yet to write never does on a \
             GPU: a deadlock)",
            self.info.ordinal,
            limit.as_millis()
        )))
    }

    fn push(&self, s: RawStream, op: Op) -> Result<()> {
        self.worker(s)?.push(op);
        Ok(())
    }
}

impl Drop for EmuBackend {
    fn drop(&mut self) {
        for w in lock(&self.streams).values() {
            w.exit();
        }
    }
}

impl Backend for EmuBackend {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn bind(&self) -> Result<()> {
        CURRENT.with(|c| c.set(self.id));
        Ok(())
    }

    fn check_current(&self) -> Result<()> {
        if CURRENT.with(Cell::get) != self.id {
            return Err(Error::InvalidUsage(format!(
                "emulated device {}'s context is not current on this thread (call \
                 Device::bind on it first, as cudaSetDevice would)",
                self.info.ordinal
            )));
        }
        Ok(())
    }

    fn alloc(&self, len: usize) -> Result<u64> {
        self.mem().alloc_device(len)
    }

    unsafe fn free(&self, addr: u64, _len: usize) {
        self.mem().free_device(addr);
    }

    fn alloc_host(&self, len: usize) -> Result<HostAlloc> {
        self.device_wide("cuMemHostAlloc (allocating page-locked memory)")?;
        let p = self.mem().alloc_pinned(len)?;
        Ok(HostAlloc {
            host: p,
            device: p as u64,
            len,
        })
    }

    unsafe fn free_host(&self, a: HostAlloc) {
        if let Err(e) = self.device_wide("cuMemFreeHost (freeing page-locked memory)") {
            // A free cannot fail; on a GPU it would never return. Say so loudly, then free.
            log::error!("{e}");
        }
        self.mem().free_pinned(a.host);
    }

    fn classify(&self, addr: u64) -> Result<PtrKind> {
        Ok(self.mem().classify(addr))
    }

    fn stream_create(&self) -> Result<RawStream> {
        self.device_wide("cuStreamCreate (creating a stream)")?;
        let id = next_id();
        let w = Worker::spawn(
            self.engine.clone(),
            context::assign_queue(self.info.ordinal),
            self.seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            format!("emu-stream-{id:x}"),
        )?;
        lock(&self.streams).insert(id, w);
        Ok(RawStream(id))
    }

    unsafe fn stream_adopt(&self, handle: u64) -> Result<RawStream> {
        if !lock(&self.streams).contains_key(&handle) {
            return Err(Error::arg(
                "stream",
                format!(
                    "{handle:#x} is not a live stream of emulated device {}",
                    self.info.ordinal
                ),
            ));
        }
        Ok(RawStream(handle))
    }

    unsafe fn stream_destroy(&self, s: RawStream) {
        if let Some(w) = lock(&self.streams).remove(&s.0) {
            w.exit();
        }
    }

    unsafe fn stream_query(&self, s: RawStream) -> Result<bool> {
        self.worker(s)?.query()
    }

    unsafe fn copy(&self, s: RawStream, dst: u64, src: u64, len: usize) -> Result<()> {
        let w = self.worker(s)?;
        w.push(Op::Copy { dst, src, len });
        let host = |a: u64| matches!(self.mem().classify(a), PtrKind::Host | PtrKind::PinnedHost);
        if len > 0 && host(dst) && host(src) {
            self.host_to_host(&w)?;
        }
        Ok(())
    }

    unsafe fn launch(&self, s: RawStream, k: &Kernel) -> Result<()> {
        self.worker(s)?;
        if !context::kernels_loaded(self.info.ordinal) {
            self.load_kernels("at their first launch (lazy loading)")?;
        }
        self.push(s, Op::Kernel(*k))
    }

    fn event_create(&self) -> Result<RawEvent> {
        let id = next_id();
        lock(&self.events).insert(id, Arc::default());
        Ok(RawEvent(id))
    }

    unsafe fn event_destroy(&self, e: RawEvent) {
        // A pending record keeps its state alive (the operation holds it).
        lock(&self.events).remove(&e.0);
    }

    unsafe fn event_record(&self, e: RawEvent, s: RawStream) -> Result<()> {
        let ev = self.event(e)?;
        let w = self.worker(s)?;
        let gen = ev.record();
        w.push(Op::Record(ev, gen));
        Ok(())
    }

    unsafe fn event_query(&self, e: RawEvent) -> Result<bool> {
        self.event(e)?.query()
    }

    unsafe fn stream_wait_event(&self, s: RawStream, e: RawEvent) -> Result<()> {
        let ev = self.event(e)?;
        let gen = ev.target();
        self.push(s, Op::WaitEvent(ev, gen))
    }

    unsafe fn stream_wait_value(
        &self,
        s: RawStream,
        addr: u64,
        value: u32,
        name: &str,
    ) -> Result<()> {
        self.push(
            s,
            Op::WaitValue {
                addr,
                value,
                name: name.to_string(),
            },
        )
    }

    unsafe fn stream_write_value(&self, s: RawStream, addr: u64, value: u32) -> Result<()> {
        self.push(s, Op::WriteValue { addr, value })
    }
}

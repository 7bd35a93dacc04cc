//! A small device backend over host memory for these tests: streams are threads that run
//! their work in order, events and flags are asynchronous, allocations are remembered so that
//! pointers classify (freed ones included), and a thread without the context fails.
use nccl_net_fabricoll::device::{
    Backend, Device, DeviceInfo, DeviceKind, HostAlloc, Kernel, PtrKind, RawEvent, RawStream,
};
use nccl_net_fabricoll::error::{Error, Result};
use nccl_net_fabricoll::reduce;
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

thread_local! {
    static CURRENT: Cell<bool> = const { Cell::new(false) };
}

type Work = Box<dyn FnOnce() + Send>;

struct Queue {
    tx: Mutex<Sender<Work>>,
    enqueued: AtomicU64,
    done: Arc<AtomicU64>,
}

#[derive(Default)]
struct Ev {
    recorded: AtomicU64,
    done: AtomicU64,
}

struct Allocation {
    len: usize,
    pinned: bool,
    live: bool,
    /// The memory (kept after a device free, so that the address stays unique and classifies
    /// as freed).
    _backing: Vec<u64>,
}

pub struct Fake {
    info: DeviceInfo,
    /// Live and freed allocations by start address.
    allocs: Mutex<BTreeMap<u64, Allocation>>,
    streams: Mutex<HashMap<u64, Arc<Queue>>>,
    events: Mutex<HashMap<u64, Arc<Ev>>>,
    next: AtomicU64,
}

/// The fake device.
pub fn device() -> Device {
    Device::from_backend(Arc::new(Fake {
        info: DeviceInfo {
            kind: DeviceKind::Emulated,
            ordinal: 0,
            name: "test host-memory device".into(),
            compute: (0, 0),
            stream_mem_ops: true,
        },
        allocs: Mutex::default(),
        streams: Mutex::default(),
        events: Mutex::default(),
        next: AtomicU64::new(0x1000),
    }))
}

struct Send64(u64);
// SAFETY: an address moved to a stream thread; the seam's contract keeps it valid.
unsafe impl Send for Send64 {}

impl Fake {
    fn queue(&self, s: RawStream) -> Arc<Queue> {
        self.streams.lock().unwrap()[&s.0].clone()
    }

    fn push(&self, s: RawStream, w: Work) -> Result<()> {
        let q = self.queue(s);
        q.enqueued.fetch_add(1, Ordering::SeqCst);
        let done = q.done.clone();
        let sent = q.tx.lock().unwrap().send(Box::new(move || {
            w();
            done.fetch_add(1, Ordering::SeqCst);
        }));
        sent.map_err(|_| Error::Internal("stream gone".into()))
    }

    fn alloc_any(&self, len: usize, pinned: bool) -> u64 {
        let v = vec![0u64; len.div_ceil(8) + 1];
        let addr = v.as_ptr() as u64;
        let a = Allocation {
            len,
            pinned,
            live: true,
            _backing: v,
        };
        self.allocs.lock().unwrap().insert(addr, a);
        addr
    }
}

impl Backend for Fake {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    fn bind(&self) -> Result<()> {
        CURRENT.with(|c| c.set(true));
        Ok(())
    }
    fn check_current(&self) -> Result<()> {
        if CURRENT.with(|c| c.get()) {
            Ok(())
        } else {
            Err(Error::InvalidUsage(
                "no current context: call Device::bind".into(),
            ))
        }
    }
    fn alloc(&self, len: usize) -> Result<u64> {
        Ok(self.alloc_any(len, false))
    }
    unsafe fn free(&self, addr: u64, _len: usize) {
        if let Some(a) = self.allocs.lock().unwrap().get_mut(&addr) {
            a.live = false;
        }
    }
    fn alloc_host(&self, len: usize) -> Result<HostAlloc> {
        let a = self.alloc_any(len, true);
        Ok(HostAlloc {
            host: a as *mut u8,
            device: a,
            len,
        })
    }
    unsafe fn free_host(&self, h: HostAlloc) {
        self.allocs.lock().unwrap().remove(&h.device);
    }
    fn classify(&self, addr: u64) -> Result<PtrKind> {
        let m = self.allocs.lock().unwrap();
        Ok(match m.range(..=addr).next_back() {
            Some((&s, a)) if addr < s + a.len as u64 => match (a.pinned, a.live) {
                (true, _) => PtrKind::PinnedHost,
                (false, true) => PtrKind::Device { ordinal: 0 },
                (false, false) => PtrKind::Freed { ordinal: 0 },
            },
            _ => PtrKind::Host,
        })
    }
    fn stream_create(&self) -> Result<RawStream> {
        let (tx, rx) = channel::<Work>();
        std::thread::spawn(move || {
            for w in rx {
                std::thread::sleep(Duration::from_micros(5));
                w();
            }
        });
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        self.streams.lock().unwrap().insert(
            id,
            Arc::new(Queue {
                tx: Mutex::new(tx),
                enqueued: AtomicU64::new(0),
                done: Arc::new(AtomicU64::new(0)),
            }),
        );
        Ok(RawStream(id))
    }
    unsafe fn stream_adopt(&self, handle: u64) -> Result<RawStream> {
        if !self.streams.lock().unwrap().contains_key(&handle) {
            return Err(Error::arg("stream", "not a stream of this device"));
        }
        Ok(RawStream(handle))
    }
    unsafe fn stream_destroy(&self, s: RawStream) {
        self.streams.lock().unwrap().remove(&s.0);
    }
    unsafe fn stream_query(&self, s: RawStream) -> Result<bool> {
        let q = self.queue(s);
        Ok(q.done.load(Ordering::SeqCst) == q.enqueued.load(Ordering::SeqCst))
    }
    unsafe fn copy(&self, s: RawStream, dst: u64, src: u64, len: usize) -> Result<()> {
        let (d, sr) = (Send64(dst), Send64(src));
        self.push(
            s,
            Box::new(move || {
                let (d, sr) = (d, sr);
                // SAFETY: the seam's contract: both ranges valid until the copy completes.
                unsafe { std::ptr::copy(sr.0 as *const u8, d.0 as *mut u8, len) }
            }),
        )
    }
    unsafe fn launch(&self, s: RawStream, k: &Kernel) -> Result<()> {
        let k = *k;
        let Kernel::Reduce {
            dtype,
            op,
            dst,
            a,
            b,
            count,
        } = k
        else {
            return Err(Error::InvalidUsage("the test device reduces only".into()));
        };
        let (d, a, b) = (Send64(dst), Send64(a), Send64(b));
        self.push(
            s,
            Box::new(move || {
                let (d, a, b) = (d, a, b);
                let n = count * dtype.size();
                // SAFETY: the seam's contract: the ranges are valid until the kernel completes.
                let (av, bv) = unsafe {
                    (
                        std::slice::from_raw_parts(a.0 as *const u8, n).to_vec(),
                        std::slice::from_raw_parts(b.0 as *const u8, n).to_vec(),
                    )
                };
                // SAFETY: as above.
                let dv = unsafe { std::slice::from_raw_parts_mut(d.0 as *mut u8, n) };
                reduce::reduce(dtype, op, &av, &bv, dv).unwrap();
            }),
        )
    }
    fn event_create(&self) -> Result<RawEvent> {
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        self.events.lock().unwrap().insert(id, Arc::default());
        Ok(RawEvent(id))
    }
    unsafe fn event_destroy(&self, e: RawEvent) {
        self.events.lock().unwrap().remove(&e.0);
    }
    unsafe fn event_record(&self, e: RawEvent, s: RawStream) -> Result<()> {
        let ev = self.events.lock().unwrap()[&e.0].clone();
        let g = ev.recorded.fetch_add(1, Ordering::SeqCst) + 1;
        self.push(s, Box::new(move || ev.done.store(g, Ordering::SeqCst)))
    }
    unsafe fn event_query(&self, e: RawEvent) -> Result<bool> {
        let ev = self.events.lock().unwrap()[&e.0].clone();
        Ok(ev.done.load(Ordering::SeqCst) >= ev.recorded.load(Ordering::SeqCst))
    }
    unsafe fn stream_wait_event(&self, _s: RawStream, _e: RawEvent) -> Result<()> {
        Err(Error::InvalidUsage(
            "the test device does not wait for events".into(),
        ))
    }
    unsafe fn stream_wait_value(
        &self,
        s: RawStream,
        addr: u64,
        value: u32,
        _n: &str,
    ) -> Result<()> {
        let a = Send64(addr);
        self.push(
            s,
            Box::new(move || {
                let a = a;
                // SAFETY: a page-locked word, valid until the wait completes.
                let w = unsafe { AtomicU32::from_ptr(a.0 as *mut u32) };
                let t = Instant::now();
                while (w.load(Ordering::Acquire).wrapping_sub(value) as i32) < 0 {
                    assert!(t.elapsed() < Duration::from_secs(60), "flag wait timed out");
                    std::thread::sleep(Duration::from_micros(20));
                }
            }),
        )
    }
    unsafe fn stream_write_value(&self, s: RawStream, addr: u64, value: u32) -> Result<()> {
        let a = Send64(addr);
        self.push(
            s,
            Box::new(move || {
                let a = a;
                // SAFETY: as in stream_wait_value.
                unsafe { AtomicU32::from_ptr(a.0 as *mut u32) }.store(value, Ordering::Release);
            }),
        )
    }
}

//! The device seam's checks, written once against `Device` and run on both implementations:
//! tests/device_emu.rs on the emulated device (every CI run), tests/device_gpu.rs on the CUDA
//! driver (the GPU machine).
#![allow(dead_code)] // each binary uses its share
use std::time::{Duration, Instant};

use nccl_net_fabricoll::device::{kernels, Device, Flag, PtrKind, Span, Stream};
use nccl_net_fabricoll::reduce::{self, DataType, RedOp};
use nccl_net_fabricoll::Error;

pub const T: Duration = Duration::from_secs(20);

/// Deterministic random bytes (xorshift64*).
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 56) as u8
        })
        .collect()
}

pub fn upload(s: &Stream, bytes: &[u8]) -> nccl_net_fabricoll::device::DeviceBuffer {
    let d = s.device().alloc(bytes.len()).expect("alloc");
    s.upload(&d.span(), bytes, T).expect("upload");
    d
}

pub fn download(s: &Stream, span: &Span) -> Vec<u8> {
    let mut v = vec![0u8; span.len()];
    s.download(&mut v, span, T).expect("download");
    v
}

fn expect_err(r: nccl_net_fabricoll::Result<impl std::fmt::Debug>, words: &[&str]) -> Error {
    let e = r.expect_err("expected an error");
    let text = e.to_string();
    for w in words {
        assert!(text.contains(w), "error {text:?} lacks {w:?}");
    }
    e
}

/// Allocation and classification of what the seam allocates and of host memory.
pub fn alloc_and_classify(dev: &Device) {
    let d = dev.alloc(1 << 20).expect("device alloc");
    let mut h = dev.alloc_host(4096).expect("host alloc");
    assert_eq!(d.len(), 1 << 20);
    let ord = dev.ordinal();
    assert_eq!(
        dev.classify(d.addr() as *const _).unwrap(),
        PtrKind::Device { ordinal: ord }
    );
    assert_eq!(
        dev.classify((d.addr() + 4095) as *const _).unwrap(),
        PtrKind::Device { ordinal: ord }
    );
    assert_eq!(
        dev.classify(h.as_ptr() as *const _).unwrap(),
        PtrKind::PinnedHost
    );
    let v = vec![0u8; 4096];
    assert_eq!(dev.classify(v.as_ptr().cast()).unwrap(), PtrKind::Host);
    h.as_mut_slice().expect("idle host buffer").fill(7);
    // While a span of it exists, a stream could be writing it: the host view is refused.
    let span = h.span();
    let e = h.as_mut_slice().expect_err("a span exists");
    assert!(matches!(e, Error::InvalidUsage(_)), "{e:?}");
    drop(span);
    assert!(h.as_mut_slice().is_ok());
    expect_err(dev.alloc(0), &["'len'"]);
    expect_err(dev.alloc_host(0), &["'len'"]);
}

/// Host -> device -> device -> page-locked host, asynchronous where the memory allows, with
/// offsets; and the synchronous pageable paths.
pub fn copies(dev: &Device) {
    let s = dev.create_stream().unwrap();
    let n = 3 << 20;
    let data = random_bytes(n, 11);
    let a = upload(&s, &data);
    let b = dev.alloc(n).unwrap();
    let mut h = dev.alloc_host(n).unwrap();
    s.copy(&b.span(), &a.span()).unwrap();
    // Out of order pieces, into page-locked memory, asynchronously.
    s.copy(&h.slice(n / 2..n).unwrap(), &b.slice(n / 2..n).unwrap())
        .unwrap();
    s.copy(&h.slice(0..n / 2).unwrap(), &b.slice(0..n / 2).unwrap())
        .unwrap();
    s.synchronize(T).unwrap();
    assert!(
        h.is_idle(),
        "the stream let go of the buffer after completing"
    );
    assert!(h.as_mut_slice().unwrap() == &data[..]);
    // Page-locked -> device, then back through the pageable path.
    h.as_mut_slice().unwrap().fill(0x5a);
    s.copy(&a.span(), &h.span()).unwrap();
    let back = download(&s, &a.span());
    assert!(back.iter().all(|&x| x == 0x5a));
    // Length mismatch names the argument.
    expect_err(
        s.copy(&a.slice(0..10).unwrap(), &b.slice(0..11).unwrap()),
        &["'dst'"],
    );
    expect_err(a.slice(0..n + 1), &["'range'"]);
}

/// Events: an event never recorded is an error; a recorded one completes after its work; a
/// stream waits for another's event.
pub fn events(dev: &Device) {
    let s1 = dev.create_stream().unwrap();
    let s2 = dev.create_stream().unwrap();
    let ev = dev.create_event().unwrap();
    expect_err(ev.query(), &["never recorded"]);
    expect_err(s2.wait_event(&ev), &["never recorded"]);
    let gate = dev.create_flag("events-gate").unwrap();
    let n = 1 << 16;
    let src = upload(&s1, &random_bytes(n, 3));
    let mid = dev.alloc(n).unwrap();
    let out = dev.alloc(n).unwrap();
    let _release = Release(&gate, 1);
    s1.wait_flag(&gate, 1).unwrap();
    s1.copy(&mid.span(), &src.span()).unwrap();
    s1.record(&ev).unwrap();
    s2.wait_event(&ev).unwrap();
    s2.copy(&out.span(), &mid.span()).unwrap();
    let done = dev.create_event().unwrap();
    s2.record(&done).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !ev.query().unwrap(),
        "the event completed before its gate opened"
    );
    assert!(!done.query().unwrap(), "s2 ran ahead of s1's event");
    gate.set(1);
    done.wait(T).unwrap();
    assert!(ev.query().unwrap());
    assert_eq!(download(&s2, &out.span()), random_bytes(n, 3));
}

/// The host opens a flag a stream waits for; a stream writes a flag the host waits for.
pub fn flags(dev: &Device) {
    let s = dev.create_stream().unwrap();
    let go = dev.create_flag("host-to-stream").unwrap();
    let reached = dev.create_flag("stream-to-host").unwrap();
    let n = 1 << 20;
    let src = upload(&s, &random_bytes(n, 5));
    let dst = dev.alloc(n).unwrap();
    for round in 1..=3u32 {
        s.wait_flag(&go, round).unwrap();
        s.copy(&dst.span(), &src.span()).unwrap();
        s.write_flag(&reached, round).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            !reached.reached(round),
            "round {round}: the stream passed a closed flag"
        );
        go.set(round);
        reached.wait(round, T).unwrap();
    }
    assert_eq!(download(&s, &dst.span()), random_bytes(n, 5));
    // Wrap-around comparison, as CU_STREAM_WAIT_VALUE_GEQ.
    assert!(nccl_net_fabricoll::device::reached(3, u32::MAX - 1));
    assert!(!nccl_net_fabricoll::device::reached(u32::MAX - 1, 3));
}

/// A wait for a flag nobody writes times out, naming the flag, on the host and through the
/// stream; the stream goes on once the flag is written.
pub fn flag_timeouts(dev: &Device) {
    let s = dev.create_stream().unwrap();
    let f = dev.create_flag("nobody-writes-me").unwrap();
    let e = expect_err(
        f.wait(1, Duration::from_millis(50)),
        &["'nobody-writes-me'", "reach 1"],
    );
    assert!(matches!(e, Error::Timeout(_)), "{e:?}");
    let _release = Release(&f, 1);
    s.wait_flag(&f, 1).unwrap();
    let e = expect_err(
        s.synchronize(Duration::from_millis(100)),
        &["'nobody-writes-me'"],
    );
    assert!(matches!(e, Error::Timeout(_)), "{e:?}");
    let ev = dev.create_event().unwrap();
    s.record(&ev).unwrap();
    expect_err(ev.wait(Duration::from_millis(50)), &["'nobody-writes-me'"]);
    f.set(1);
    s.synchronize(T).unwrap();
    ev.wait(T).unwrap();
}

/// The legacy and per-thread default streams are refused; a caller's stream is used without
/// being owned.
pub fn caller_streams(dev: &Device) {
    for h in [0usize, 1, 2] {
        // SAFETY: refused before any use of the handle.
        let e = expect_err(
            unsafe { dev.wrap_stream(h as *mut _) },
            &["'stream'", "default stream"],
        );
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    }
    let own = dev.create_stream().unwrap();
    assert!(own.is_owned());
    {
        // SAFETY: `own` is a live stream of this device and outlives the wrapper.
        let theirs = unsafe { dev.wrap_stream(own.handle()) }.unwrap();
        assert!(!theirs.is_owned());
        let b = upload(&theirs, &[9u8; 4096]);
        assert_eq!(download(&theirs, &b.span()), vec![9u8; 4096]);
    }
    // Dropping the wrapper left the stream alive.
    let b = upload(&own, &[3u8; 512]);
    assert_eq!(download(&own, &b.span()), vec![3u8; 512]);
}

/// A thread without the device's context fails every call, until it binds.
pub fn needs_context(dev: &Device) {
    let dev2 = dev.clone();
    std::thread::spawn(move || {
        let e = expect_err(dev2.alloc(64), &["not current"]);
        assert!(matches!(e, Error::InvalidUsage(_)), "{e:?}");
        expect_err(dev2.create_stream(), &["not current"]);
        dev2.bind().unwrap();
        dev2.alloc(64).unwrap();
    })
    .join()
    .unwrap();
}

/// Host memory claimed as device memory, freed device memory: errors naming the argument.
pub fn raw_pointer_misuse(dev: &Device) {
    let v = vec![1u8; 4096];
    // SAFETY: refused before any use.
    let e = expect_err(
        unsafe { Span::from_raw(dev, v.as_ptr() as u64, v.len(), "sendbuff") },
        &["'sendbuff'", "pageable host memory"],
    );
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    let d = dev.alloc(1 << 16).unwrap();
    let addr = d.addr();
    // SAFETY: the buffer is alive; the span is dropped before it.
    let span = unsafe { Span::from_raw(dev, addr, 1 << 16, "recvbuff") }.unwrap();
    assert_eq!(
        span.kind(),
        PtrKind::Device {
            ordinal: dev.ordinal()
        }
    );
    drop(span);
    drop(d);
    // SAFETY: refused before any use (the memory is freed).
    expect_err(
        unsafe { Span::from_raw(dev, addr, 1 << 16, "recvbuff") },
        &["'recvbuff'"],
    );
    // SAFETY: refused (null).
    expect_err(
        unsafe { Span::from_raw(dev, 0, 8, "buf") },
        &["'buf'", "null"],
    );
}

/// A buffer dropped while a stream still uses it is freed only after that work.
pub fn drop_while_in_use(dev: &Device) {
    let s = dev.create_stream().unwrap();
    let gate = dev.create_flag("drop-gate").unwrap();
    let n = 1 << 20;
    let src = upload(&s, &random_bytes(n, 9));
    let dst = dev.alloc(n).unwrap();
    let _release = Release(&gate, 1);
    s.wait_flag(&gate, 1).unwrap();
    s.copy(&dst.span(), &src.span()).unwrap();
    drop(src);
    std::thread::sleep(Duration::from_millis(20));
    gate.set(1);
    assert_eq!(download(&s, &dst.span()), random_bytes(n, 9));
}

/// ulps between two encodings of a float type (0 for identical bits), on the line where
/// consecutive encodings of the same sign are one apart.
fn ulps(dt: DataType, x: &[u8], y: &[u8]) -> u64 {
    if x == y {
        return 0;
    }
    let sz = dt.size();
    let read = |b: &[u8]| {
        let mut v = [0u8; 8];
        v[..sz].copy_from_slice(b);
        u64::from_le_bytes(v)
    };
    let sign = 1u64 << (8 * sz - 1);
    let line = |v: u64| -> i128 {
        if v & sign != 0 {
            -((v & !sign) as i128)
        } else {
            v as i128
        }
    };
    (line(read(x)) - line(read(y))).unsigned_abs() as u64
}

/// Every dtype x op on the device against the host reducers on the same random bytes:
/// `dst ⊕= src`, `dst = a ⊕ b`, and Avg's scaling. Integers must be identical, floats within
/// `kernels::FLOAT_ULPS` (0: identical bits).
pub fn kernels_match_host(dev: &Device, count: usize, seed: u64) {
    let s = dev.create_stream().unwrap();
    let mut checked = 0;
    for dt in DataType::ALL {
        let n = count * dt.size();
        let a = random_bytes(n, seed ^ dt as u64);
        let b = random_bytes(n, seed.rotate_left(17) ^ dt as u64);
        let da = upload(&s, &a);
        let db = upload(&s, &b);
        for op in RedOp::ALL {
            if !op.supports(dt) {
                let e = expect_err(s.reduce(dt, op, &da.span(), &db.span()), &["'op'"]);
                assert!(matches!(e, Error::InvalidArgument(_)));
                continue;
            }
            let mut want = vec![0u8; n];
            reduce::reduce(dt, op, &a, &b, &mut want).unwrap();
            // Two-input form into a third buffer, then in place.
            let dc = dev.alloc(n).unwrap();
            s.reduce2(dt, op, &dc.span(), &da.span(), &db.span())
                .unwrap();
            let acc = upload(&s, &a);
            s.reduce(dt, op, &acc.span(), &db.span()).unwrap();
            let got2 = download(&s, &dc.span());
            let got1 = download(&s, &acc.span());
            for (what, got) in [("reduce2", &got2), ("reduce", &got1)] {
                compare(dt, op, what, got, &want, &a, &b);
            }
            if op == RedOp::Avg {
                let mut want_avg = want.clone();
                reduce::scale_avg(dt, &mut want_avg, 3).unwrap();
                s.scale_avg(dt, &acc.span(), 3).unwrap();
                compare(
                    dt,
                    op,
                    "scale_avg",
                    &download(&s, &acc.span()),
                    &want_avg,
                    &want,
                    &want,
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 6 * 8 + 6 * 5);
}

fn compare(dt: DataType, op: RedOp, what: &str, got: &[u8], want: &[u8], a: &[u8], b: &[u8]) {
    let sz = dt.size();
    for i in (0..want.len()).step_by(sz) {
        let (g, w) = (&got[i..i + sz], &want[i..i + sz]);
        let d = if dt.is_float() {
            ulps(dt, g, w)
        } else {
            u64::from(g != w)
        };
        let bound = if dt.is_float() {
            u64::from(kernels::FLOAT_ULPS)
        } else {
            0
        };
        assert!(
            d <= bound,
            "{dt} {op} {what}: element {}: a {:02x?} b {:02x?}: device {g:02x?}, host {w:02x?} \
             ({d} ulp, bound {bound})",
            i / sz,
            &a[i..i + sz],
            &b[i..i + sz]
        );
    }
}

/// The same kernel twice gives the same bits.
pub fn kernels_repeat(dev: &Device) {
    let s = dev.create_stream().unwrap();
    let n = 1 << 20;
    let a = upload(&s, &random_bytes(n * 4, 21));
    let b = upload(&s, &random_bytes(n * 4, 22));
    let mut runs = Vec::new();
    for _ in 0..2 {
        let c = dev.alloc(n * 4).unwrap();
        s.reduce2(
            DataType::Float32,
            RedOp::Sum,
            &c.span(),
            &a.span(),
            &b.span(),
        )
        .unwrap();
        runs.push(download(&s, &c.span()));
    }
    assert!(runs[0] == runs[1]);
}

/// Kernel argument misuse: misaligned addresses, lengths that are not whole elements.
pub fn kernel_misuse(dev: &Device) {
    let s = dev.create_stream().unwrap();
    let a = dev.alloc(64).unwrap();
    let b = dev.alloc(64).unwrap();
    expect_err(
        s.reduce(
            DataType::Float32,
            RedOp::Sum,
            &a.slice(1..33).unwrap(),
            &b.slice(0..32).unwrap(),
        ),
        &["'dst'", "aligned"],
    );
    expect_err(
        s.reduce(
            DataType::Float32,
            RedOp::Sum,
            &a.slice(0..6).unwrap(),
            &b.slice(0..6).unwrap(),
        ),
        &["'dst'", "whole number"],
    );
    expect_err(
        s.reduce(
            DataType::Int32,
            RedOp::Sum,
            &a.slice(0..8).unwrap(),
            &b.slice(0..12).unwrap(),
        ),
        &["'b'"],
    );
    expect_err(s.scale_avg(DataType::Int32, &a.span(), 0), &["'n'"]);
}

/// f32 sum of two `bytes`-byte buffers into a third: GB/s moved (3 x bytes per run).
pub fn bandwidth(dev: &Device, bytes: usize, runs: u32) -> f64 {
    let s = dev.create_stream().unwrap();
    let a = dev.alloc(bytes).unwrap();
    let b = dev.alloc(bytes).unwrap();
    let c = dev.alloc(bytes).unwrap();
    let go = |s: &Stream| {
        s.reduce2(
            DataType::Float32,
            RedOp::Sum,
            &c.span(),
            &a.span(),
            &b.span(),
        )
        .unwrap()
    };
    go(&s);
    s.synchronize(T).unwrap();
    let t = Instant::now();
    for _ in 0..runs {
        go(&s);
    }
    s.synchronize(T).unwrap();
    (3 * bytes) as f64 * f64::from(runs) / t.elapsed().as_secs_f64() / 1e9
}

/// Writes `value` to a flag when dropped, a panic included: a test that fails never leaves a
/// stream blocked on a flag (on a GPU it cannot be cancelled, and the driver's device-wide
/// calls, page-locked allocations and frees, would then wait for it forever).
pub struct Release<'a>(pub &'a Flag, pub u32);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        if !reached(self.0.get(), self.1) {
            self.0.set(self.1);
        }
    }
}

fn reached(word: u32, v: u32) -> bool {
    word.wrapping_sub(v) as i32 >= 0
}

/// Freeing memory while a stream waits for a flag. Device memory (`host` false: from the
/// stream-ordered allocator) is freed at once. Page-locked memory (`host` true) is not: the CUDA
/// driver's `cuMemFreeHost` waits for the whole device, the blocked stream included, as the
/// emulated device does. So a helper thread writes the flag after 300 ms, and the free must
/// return only after that. Nothing here can hang: the flag is written on every path.
pub fn free_while_a_stream_waits(dev: &Device, host: bool) {
    const DELAY: Duration = Duration::from_millis(300);
    let s = dev.create_stream().unwrap();
    let gate = dev.create_flag("free-gate").unwrap();
    let d = dev.alloc(1 << 20).unwrap();
    let h = dev.alloc_host(1 << 20).unwrap();
    let _release = Release(&gate, 1);
    s.wait_flag(&gate, 1).unwrap();
    let written = std::sync::OnceLock::new();
    let freed_at = std::thread::scope(|sc| {
        let g = gate.clone();
        let w = &written;
        sc.spawn(move || {
            std::thread::sleep(DELAY);
            w.set(Instant::now()).unwrap();
            g.set(1);
        });
        let t = Instant::now();
        drop(d);
        let device_free = t.elapsed();
        assert!(
            device_free < DELAY / 2 || written.get().is_none(),
            "freeing device memory waited {device_free:?} for a stream blocked on a flag"
        );
        if host {
            drop(h);
        }
        Instant::now()
    });
    s.synchronize(T).unwrap();
    if host {
        let w = *written.get().expect("the flag was written");
        assert!(
            freed_at >= w,
            "freeing page-locked memory returned before the flag the stream waited for was \
             written: the driver waits for the device there"
        );
    }
}

/// The host opens a flag, the stream reduces and copies into page-locked memory, then writes a
/// flag the host waits for: `rounds` times, each result checked from the host.
pub fn round_trips(dev: &Device, rounds: u32) {
    let s = dev.create_stream().unwrap();
    let go = dev.create_flag("round-go").unwrap();
    let done = dev.create_flag("round-done").unwrap();
    let n = 64;
    let ones: Vec<u8> = (0..n).flat_map(|_| 1u64.to_le_bytes()).collect();
    let one = upload(&s, &ones);
    let acc = upload(&s, &vec![0u8; n * 8]);
    let mut out = dev.alloc_host(n * 8).unwrap();
    for round in 1..=rounds {
        let release = Release(&go, round);
        s.wait_flag(&go, round).unwrap();
        s.reduce(DataType::Uint64, RedOp::Sum, &acc.span(), &one.span())
            .unwrap();
        s.copy(&out.span(), &acc.span()).unwrap();
        s.write_flag(&done, round).unwrap();
        drop(release);
        done.wait(round, T).unwrap();
        // The stream has passed the copy; it lets go of the buffer once it sees that.
        s.query().unwrap();
        let got = out.as_mut_slice().expect("the stream let go of the buffer");
        assert!(
            got.chunks_exact(8)
                .all(|c| u64::from_le_bytes(c.try_into().unwrap()) == u64::from(round)),
            "round {round}"
        );
    }
}

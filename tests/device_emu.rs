//! The device seam on the emulated device, in every CI run: every operation, the misuse the
//! seam must refuse, a host access to device memory faulting (in a child process), a stream
//! that waits for a flag nobody writes failing with the flag's name, and every kernel against
//! the host reducers. tests/device_gpu.rs runs the same checks on a GPU.
mod device_checks;

use std::time::Duration;

use nccl_net_fabricoll::device::{Device, DeviceKind, EmuConfig, Span};
use nccl_net_fabricoll::reduce::{DataType, RedOp};
use nccl_net_fabricoll::Error;

/// A device ordinal no other test of this process uses. Every emulated device of one ordinal
/// shares its context, as devices of one ordinal share the primary context on a GPU, and
/// page-locked allocations, frees and stream creation wait for every stream of the context: the
/// tests run in parallel threads, so one test's stream waiting for a flag would hold up
/// another's allocation. On a GPU these checks run one at a time (tests/device_gpu.rs, with
/// --test-threads=1); here each test has a device of its own.
fn ordinal() -> i32 {
    static NEXT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(10);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

fn emu() -> Device {
    let d = Device::emulated(EmuConfig {
        ordinal: ordinal(),
        max_delay: Duration::from_micros(300),
        ..EmuConfig::default()
    })
    .expect("emulated device");
    assert_eq!(d.kind(), DeviceKind::Emulated);
    d
}

#[test]
fn emu_alloc_and_classify() {
    device_checks::alloc_and_classify(&emu());
}

#[test]
fn emu_copies() {
    device_checks::copies(&emu());
}

#[test]
fn emu_events() {
    device_checks::events(&emu());
}

#[test]
fn emu_flags_both_directions() {
    device_checks::flags(&emu());
}

#[test]
fn emu_flag_timeouts() {
    device_checks::flag_timeouts(&emu());
}

#[test]
fn emu_caller_streams() {
    device_checks::caller_streams(&emu());
    // A handle that is no stream of this device is refused too.
    let dev = emu();
    // SAFETY: refused before any use.
    let e = unsafe { dev.wrap_stream(0x77 as *mut _) }.expect_err("not a stream");
    assert!(e.to_string().contains("'stream'"), "{e}");
}

#[test]
fn emu_needs_context() {
    device_checks::needs_context(&emu());
}

#[test]
fn emu_raw_pointer_misuse() {
    let dev = emu();
    device_checks::raw_pointer_misuse(&dev);
    // The emulated device knows freed memory for what it is.
    let d = dev.alloc(4096).unwrap();
    let addr = d.addr();
    drop(d);
    // SAFETY: refused before any use.
    let e = unsafe { Span::from_raw(&dev, addr, 16, "sendbuff") }.expect_err("freed");
    assert!(e.to_string().contains("was freed"), "{e}");
}

#[test]
fn emu_freed_raw_span_fails_the_stream() {
    // A raw span outliving its memory (the caller broke from_raw's promise): the engine
    // reports the use of freed memory, and the stream's error is sticky.
    let dev = emu();
    let s = dev.create_stream().unwrap();
    let d = dev.alloc(4096).unwrap();
    let other = dev.alloc(4096).unwrap();
    // SAFETY: deliberately broken below, to check the emulated device catches it; the engine
    // never touches freed pages (it refuses them).
    let raw = unsafe { Span::from_raw(&dev, d.addr(), 4096, "buf") }.unwrap();
    drop(d);
    s.copy(&other.span(), &raw).unwrap();
    let e = s
        .synchronize(device_checks::T)
        .expect_err("use of freed memory");
    assert!(e.to_string().contains("freed"), "{e}");
    let e2 = s.query().expect_err("sticky");
    assert_eq!(e, e2);
}

#[test]
fn emu_drop_while_in_use() {
    device_checks::drop_while_in_use(&emu());
}

#[test]
fn emu_free_while_a_stream_waits() {
    device_checks::free_while_a_stream_waits(&emu(), true);
}

#[test]
fn emu_kernels_match_host() {
    device_checks::kernels_match_host(&emu(), 4099, 0x5eed);
}

#[test]
fn emu_kernels_repeat_and_misuse() {
    let dev = emu();
    device_checks::kernels_repeat(&dev);
    device_checks::kernel_misuse(&dev);
}

#[test]
fn emu_in_place_operand_orders() {
    // dst may be either operand (or both): the emulated kernel takes the in-place path.
    let dev = emu();
    let s = dev.create_stream().unwrap();
    let a = device_checks::random_bytes(4000, 1);
    let b = device_checks::random_bytes(4000, 2);
    let mut want = vec![0u8; 4000];
    nccl_net_fabricoll::reduce::reduce(DataType::Int32, RedOp::Sum, &a, &b, &mut want).unwrap();
    let da = device_checks::upload(&s, &a);
    let db = device_checks::upload(&s, &b);
    s.reduce2(
        DataType::Int32,
        RedOp::Sum,
        &db.span(),
        &da.span(),
        &db.span(),
    )
    .unwrap();
    assert_eq!(device_checks::download(&s, &db.span()), want);
    // Partial overlap is refused by the engine.
    let c = device_checks::upload(&s, &a);
    s.reduce2(
        DataType::Int32,
        RedOp::Sum,
        &c.slice(0..2000).unwrap(),
        &c.slice(4..2004).unwrap(),
        &da.slice(0..2000).unwrap(),
    )
    .unwrap();
    let e = s.synchronize(device_checks::T).expect_err("overlap");
    assert!(e.to_string().contains("overlaps"), "{e}");
}

#[test]
fn emu_stream_fails_on_a_flag_nobody_writes() {
    let dev = Device::emulated(EmuConfig {
        ordinal: ordinal(),
        flag_timeout: Duration::from_millis(100),
        ..EmuConfig::default()
    })
    .unwrap();
    let s = dev.create_stream().unwrap();
    let f = dev.create_flag("never-set").unwrap();
    let ev = dev.create_event().unwrap();
    s.wait_flag(&f, 5).unwrap();
    s.record(&ev).unwrap();
    let e = s
        .synchronize(device_checks::T)
        .expect_err("the stream times out");
    assert!(matches!(e, Error::Timeout(_)), "{e:?}");
    assert!(e.to_string().contains("'never-set'"), "{e}");
    // The event recorded after the failed wait reports the stream's error.
    let e = ev
        .wait(device_checks::T)
        .expect_err("the event reports the failure");
    assert!(e.to_string().contains("'never-set'"), "{e}");
}

/// Environment variable that makes `emu_host_access_faults` the child that touches device
/// memory.
const FAULT_CHILD: &str = "FABRICOLL_EMU_FAULT_CHILD";

#[test]
fn emu_host_access_faults() {
    if std::env::var_os(FAULT_CHILD).is_some() {
        // The child: read device memory from the host. This must die of SIGSEGV.
        let dev = emu();
        let d = dev.alloc(4096).unwrap();
        // SAFETY: deliberately not: the emulated device maps this address PROT_NONE, and the
        // parent checks that the read kills this process.
        let x = unsafe { std::ptr::read_volatile(d.addr() as *const u8) };
        println!("read {x} from emulated device memory without a fault");
        std::process::exit(0);
    }
    use std::os::unix::process::ExitStatusExt;
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "emu_host_access_faults",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(FAULT_CHILD, "1")
        .output()
        .unwrap();
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSEGV),
        "the child did not die of SIGSEGV: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn emu_device_memory_is_reachable_through_the_engine_only() {
    // The same buffer the host may not touch holds what the engine copied into it.
    let dev = emu();
    let s = dev.create_stream().unwrap();
    let data = device_checks::random_bytes(10_000, 4);
    let d = device_checks::upload(&s, &data);
    assert_eq!(device_checks::download(&s, &d.span()), data);
    assert_eq!(
        dev.classify(d.addr() as *const _).unwrap(),
        nccl_net_fabricoll::device::PtrKind::Device {
            ordinal: dev.ordinal()
        }
    );
}

#[test]
fn emu_ordering_under_random_delays() {
    // Many chained operations across two streams, each after a random delay: a missing
    // dependency shows up as a wrong sum.
    let dev = Device::emulated(EmuConfig {
        ordinal: ordinal(),
        max_delay: Duration::from_micros(500),
        seed: Some(42),
        ..EmuConfig::default()
    })
    .unwrap();
    let s1 = dev.create_stream().unwrap();
    let s2 = dev.create_stream().unwrap();
    let n = 256;
    let one: Vec<u8> = (0..n).flat_map(|_| 1u32.to_le_bytes()).collect();
    let ones = device_checks::upload(&s1, &one);
    let acc = dev.alloc(n * 4).unwrap();
    let zero = vec![0u8; n * 4];
    s1.upload(&acc.span(), &zero, device_checks::T).unwrap();
    let e1 = dev.create_event().unwrap();
    let e2 = dev.create_event().unwrap();
    for round in 0..50 {
        let (a, b, ea, eb) = if round % 2 == 0 {
            (&s1, &s2, &e1, &e2)
        } else {
            (&s2, &s1, &e2, &e1)
        };
        if round > 0 {
            a.wait_event(eb).unwrap();
        }
        a.reduce(DataType::Uint32, RedOp::Sum, &acc.span(), &ones.span())
            .unwrap();
        a.record(ea).unwrap();
        let _ = b;
    }
    s2.synchronize(device_checks::T).unwrap();
    s1.synchronize(device_checks::T).unwrap();
    let got = device_checks::download(&s1, &acc.span());
    let want: Vec<u8> = (0..n).flat_map(|_| 50u32.to_le_bytes()).collect();
    assert_eq!(got, want);
}

#[test]
fn emu_two_devices_do_not_mix() {
    // Memory, events and streams of one device are refused by another's stream, naming them.
    let d0 = emu();
    let one = ordinal();
    let d1 = Device::emulated(EmuConfig {
        ordinal: one,
        ..EmuConfig::default()
    })
    .unwrap();
    let b1 = d1.alloc(64).unwrap();
    let e1 = d1.create_event().unwrap();
    let s1 = d1.create_stream().unwrap();
    s1.record(&e1).unwrap();
    d0.bind().unwrap();
    let s0 = d0.create_stream().unwrap();
    let b0 = d0.alloc(64).unwrap();
    let e = s0
        .copy(&b0.span(), &b1.span())
        .expect_err("device 1 memory");
    assert!(e.to_string().contains(&format!("device {one}")), "{e}");
    let e = s0.wait_event(&e1).expect_err("device 1 event");
    assert!(e.to_string().contains("'ev'"), "{e}");
    // SAFETY: refused before any use: the handle is a stream of device 1.
    let e = unsafe { d0.wrap_stream(s1.handle()) }.expect_err("device 1 stream");
    assert!(e.to_string().contains("'stream'"), "{e}");
    // Device 1's objects are released on a thread with its context.
    d1.bind().unwrap();
}

#[test]
fn cuda_device_only_where_the_probe_found_a_driver() {
    // Without a usable driver, Device::cuda says why instead of reaching cudarc (which would
    // panic); with one (the GPU machine), device 0 opens and a missing ordinal is refused.
    let probe = nccl_net_fabricoll::cuda::probe();
    match probe.why_not() {
        Some(why) => {
            let e = Device::cuda(0).expect_err("no driver");
            assert!(matches!(e, Error::InvalidUsage(_)), "{e:?}");
            assert!(e.to_string().contains(why), "{e} lacks {why}");
        }
        None => {
            Device::cuda(0).expect("device 0");
            let e = Device::cuda(1 << 20).expect_err("no such device");
            assert!(e.to_string().contains("'ordinal'"), "{e}");
        }
    }
}

#[test]
fn emu_thousand_round_trips() {
    let dev = Device::emulated(EmuConfig {
        ordinal: ordinal(),
        max_delay: Duration::from_micros(30),
        seed: Some(7),
        ..EmuConfig::default()
    })
    .unwrap();
    device_checks::round_trips(&dev, 1000);
}

/// Allocating page-locked memory waits for every stream of the device, as on the CUDA driver;
/// where a stream waits for a flag the allocating side has yet to write (a deadlock on a GPU),
/// it fails after half the flag timeout with an error naming the call.
#[test]
fn emu_page_locked_alloc_waits_for_the_device_and_names_the_call() {
    let dev = Device::emulated(EmuConfig {
        ordinal: ordinal(),
        flag_timeout: Duration::from_millis(600),
        ..EmuConfig::default()
    })
    .unwrap();
    let s = dev.create_stream().unwrap();
    let f = dev.create_flag("alloc-gate").unwrap();
    let _release = device_checks::Release(&f, 1);
    s.wait_flag(&f, 1).unwrap();
    let t = std::time::Instant::now();
    let e = dev.alloc_host(4096).expect_err("the device is blocked");
    assert!(matches!(e, Error::Timeout(_)), "{e:?}");
    assert!(e.to_string().contains("cuMemHostAlloc"), "{e}");
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t.elapsed()
    );
    f.set(1);
    s.synchronize(device_checks::T).unwrap();
    // Idle again: the allocation goes through at once.
    dev.alloc_host(4096).unwrap();
}

/// Every emulated device of one ordinal shares the context, as every `Device::cuda` of one
/// ordinal (a rank per thread, each with its own) shares the primary context: page-locked
/// allocations and stream creation on one wait for the streams of another, and fail, naming
/// the driver call, where one waits for a flag that the caller's side has yet to write. A
/// device of another ordinal is another context.
#[test]
fn emu_devices_of_one_ordinal_share_the_context() {
    // b gives up after 300 ms (half its flag timeout), long before a's stream fails its wait.
    let o = ordinal();
    let a = Device::emulated(EmuConfig {
        ordinal: o,
        ..EmuConfig::default()
    })
    .unwrap();
    let b = Device::emulated(EmuConfig {
        ordinal: o,
        flag_timeout: Duration::from_millis(600),
        ..EmuConfig::default()
    })
    .unwrap();
    let other = Device::emulated(EmuConfig {
        ordinal: ordinal(),
        flag_timeout: Duration::from_millis(600),
        ..EmuConfig::default()
    })
    .unwrap();
    a.bind().unwrap();
    let s = a.create_stream().unwrap();
    let f = a.create_flag("context-gate").unwrap();
    let _release = device_checks::Release(&f, 1);
    s.wait_flag(&f, 1).unwrap();
    b.bind().unwrap();
    let e = b
        .alloc_host(4096)
        .expect_err("a's stream holds the context");
    assert!(matches!(e, Error::Timeout(_)), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("cuMemHostAlloc"), "{msg}");
    assert!(msg.contains(&format!("emulated device {o}")), "{msg}");
    let e = b.create_stream().expect_err("a's stream holds the context");
    assert!(matches!(e, Error::Timeout(_)), "{e:?}");
    assert!(e.to_string().contains("cuStreamCreate"), "{e}");
    {
        other.bind().unwrap();
        let _h = other.alloc_host(4096).unwrap();
        let _s = other.create_stream().unwrap();
    }
    f.set(1);
    a.bind().unwrap();
    s.synchronize(device_checks::T).unwrap();
    b.bind().unwrap();
    let _h = b.alloc_host(4096).unwrap();
    let _s = b.create_stream().unwrap();
}

/// The kernels are loaded when the process first opens a device of the ordinal (as the CUDA
/// backend does), so a launch waits for no stream; with `lazy_module` they are loaded at the
/// first launch, which waits for every stream of the context (the driver's lazy loading) and
/// fails, naming the call, while one waits for a flag. Opening a device that loads them at
/// open waits the same way.
#[test]
fn emu_loading_the_kernels_waits_for_the_context() {
    let run = |lazy: bool| {
        // The launch gives up after 1.5 s and the opening after 0.3 s (half their devices'
        // flag timeouts), both before the stream fails its wait (3 s).
        let cfg = EmuConfig {
            ordinal: ordinal(),
            flag_timeout: Duration::from_secs(3),
            lazy_module: lazy,
            ..EmuConfig::default()
        };
        let dev = Device::emulated(cfg.clone()).unwrap();
        let (waiter, worker) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
        let f = dev.create_flag("load-gate").unwrap();
        let _release = device_checks::Release(&f, 2);
        let ones: Vec<u8> = (0..16).flat_map(|_| 1u32.to_le_bytes()).collect();
        let one = device_checks::upload(&worker, &ones);
        let acc = device_checks::upload(&worker, &[0u8; 64]);
        let add = || worker.reduce(DataType::Uint32, RedOp::Sum, &acc.span(), &one.span());
        waiter.wait_flag(&f, 1).unwrap();
        if lazy {
            let e = add().expect_err("the first launch loads the kernels");
            assert!(matches!(e, Error::Timeout(_)), "{e:?}");
            assert!(e.to_string().contains("cuModuleLoadData"), "{e}");
            assert!(e.to_string().contains("first launch"), "{e}");
            // A device that loads them at open waits too.
            let e = Device::emulated(EmuConfig {
                lazy_module: false,
                flag_timeout: Duration::from_millis(600),
                ..cfg
            })
            .expect_err("opening loads the kernels");
            assert!(e.to_string().contains("first opens"), "{e}");
            dev.bind().unwrap();
            f.set(1);
            waiter.synchronize(device_checks::T).unwrap();
            waiter.wait_flag(&f, 2).unwrap();
            // The kernels were not loaded: this launch loads them, the next finds them.
            f.set(2);
            add().unwrap();
            waiter.synchronize(device_checks::T).unwrap();
            waiter.wait_flag(&f, 3).unwrap();
        }
        add().unwrap();
        worker.synchronize(device_checks::T).unwrap();
        f.set(3);
        waiter.synchronize(device_checks::T).unwrap();
        let want: Vec<u8> = (0..16)
            .flat_map(|_| (if lazy { 2u32 } else { 1 }).to_le_bytes())
            .collect();
        assert_eq!(device_checks::download(&worker, &acc.span()), want);
    };
    run(false);
    run(true);
}

/// The context's hardware queues: with 2 queues, streams a, b, c are on queues 0, 1, 0. A flag
/// wait on a holds back a copy enqueued after it on c (same queue), not one on b (another
/// queue); once the flag is written, c's copy runs. A wait for an event holds its queue the
/// same way. A context's number of queues is fixed while a device holds it, and must be 1 to
/// 32.
#[test]
fn emu_a_wait_holds_back_the_streams_behind_it_on_its_hardware_queue() {
    let o = ordinal();
    let dev = Device::emulated(EmuConfig {
        ordinal: o,
        queues: 2,
        ..EmuConfig::default()
    })
    .unwrap();
    let (a, b, c) = (
        dev.create_stream().unwrap(),
        dev.create_stream().unwrap(),
        dev.create_stream().unwrap(),
    );
    let n = 4096;
    let src = dev.alloc(n).unwrap();
    let bytes = device_checks::random_bytes(n, 9);
    b.upload(&src.span(), &bytes, device_checks::T).unwrap();
    let (db, dc) = (dev.alloc(n).unwrap(), dev.alloc(n).unwrap());
    let f = dev.create_flag("queue-gate").unwrap();
    let release = device_checks::Release(&f, 1);
    a.wait_flag(&f, 1).unwrap();
    c.copy(&dc.span(), &src.span()).unwrap();
    b.copy(&db.span(), &src.span()).unwrap();
    b.synchronize(device_checks::T)
        .expect("b is on another queue");
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !c.query().unwrap(),
        "c's copy ran past a's wait on its queue"
    );
    drop(release);
    c.synchronize(device_checks::T).unwrap();
    a.synchronize(device_checks::T).unwrap();
    let mut got = vec![0u8; n];
    c.download(&mut got, &dc.span(), device_checks::T).unwrap();
    assert!(got == bytes, "c's copy");

    // A wait for an event of b holds back c's copy too.
    let g = dev.create_flag("event-gate").unwrap();
    let release = device_checks::Release(&g, 1);
    let ev = dev.create_event().unwrap();
    b.wait_flag(&g, 1).unwrap();
    b.record(&ev).unwrap();
    a.wait_event(&ev).unwrap();
    c.copy(&dc.span(), &src.span()).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(!c.query().unwrap(), "c's copy ran past a's event wait");
    drop(release);
    c.synchronize(device_checks::T).unwrap();

    let e = Device::emulated(EmuConfig {
        ordinal: o,
        queues: 8,
        ..EmuConfig::default()
    })
    .expect_err("the context has 2 queues");
    assert!(e.to_string().contains("'queues'"), "{e}");
    let e = Device::emulated(EmuConfig {
        ordinal: ordinal(),
        queues: 33,
        ..EmuConfig::default()
    })
    .expect_err("33 queues");
    assert!(e.to_string().contains("1 to 32"), "{e}");
}

#[test]
fn emu_copy_between_host_buffers_waits_for_its_stream() {
    // As on CUDA, a copy between two page-locked buffers returns only once its stream has done
    // it: behind a flag wait, at once after the flag is written, and, where nobody writes the
    // flag, never on a GPU: here a timeout naming the copy.
    let dev = Device::emulated(EmuConfig {
        ordinal: ordinal(),
        flag_timeout: Duration::from_millis(600),
        ..EmuConfig::default()
    })
    .unwrap();
    dev.bind().unwrap();
    // Page-locked memory first: allocating it waits for the device's streams.
    let (a, b) = (dev.alloc_host(64).unwrap(), dev.alloc_host(64).unwrap());
    let s = dev.create_stream().unwrap();
    let flag = dev.create_flag("test gate").unwrap();
    s.wait_flag(&flag, 1).unwrap();
    let e = s
        .copy(&b.span(), &a.span())
        .expect_err("a copy behind a closed gate");
    assert!(
        matches!(e, Error::Timeout(_)) && e.to_string().contains("two host buffers"),
        "{e}"
    );
    flag.set(1);
    s.synchronize(device_checks::T).unwrap_or(());
    let s2 = dev.create_stream().unwrap();
    s2.wait_flag(&flag, 1).unwrap();
    s2.copy(&b.span(), &a.span()).expect("the gate is open");
    s2.synchronize(device_checks::T).unwrap();
}

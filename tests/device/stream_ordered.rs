//! What the tests of stream-ordered calls on the direct path share (`device_direct`): an
//! emulated device of its own per test, ranks as threads each with one stream for the whole
//! test, and one case run on it, checked against the host call and the expected bytes.
//!
//! Each test takes a device of an ordinal of its own (a context of its own) and makes its
//! streams once: while a direct call runs, its caller's stream waits for the call's flag, and a
//! flag wait holds back every stream behind it on its hardware queue, the communicator's copy
//! stream and the loopback fabric's included (docs/device-calls.md, "Hardware queues"). Its 32
//! queues take the test's streams (each rank's, the communicator's copy streams, the fabric's)
//! without sharing one.
use super::direct::counted;
use super::*;
use std::sync::atomic::{AtomicI32, Ordering};

/// An emulated device of an ordinal no other device of this process uses, with 32 hardware
/// queues.
pub fn own_device() -> Device {
    static NEXT: AtomicI32 = AtomicI32::new(60);
    Device::emulated(EmuConfig {
        ordinal: NEXT.fetch_add(1, Ordering::Relaxed),
        max_delay: Duration::from_micros(50),
        queues: 32,
        ..EmuConfig::default()
    })
    .expect("emulated device")
}

/// A barrier of the ranks whose wait fails (panics) past `WAIT`: a rank that failed never gets
/// there, and the others must not wait for it forever.
pub struct Step {
    n: usize,
    /// (arrived in this round, rounds done)
    state: std::sync::Mutex<(usize, u64)>,
    cv: std::sync::Condvar,
}

impl Step {
    fn new(n: usize) -> Step {
        Step {
            n,
            state: std::sync::Mutex::new((0, 0)),
            cv: std::sync::Condvar::new(),
        }
    }

    pub fn wait(&self) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let round = st.1;
        st.0 += 1;
        if st.0 == self.n {
            *st = (0, round + 1);
            self.cv.notify_all();
            return;
        }
        let (st, t) = self
            .cv
            .wait_timeout_while(st, WAIT, |st| st.1 == round)
            .unwrap_or_else(|p| p.into_inner());
        assert!(
            !t.timed_out() || st.1 != round,
            "a rank did not reach the step within {WAIT:?} (it failed?)"
        );
    }
}

/// Runs `f(rank, communicator, stream, step)` on every rank of `cs` at once, each a thread with
/// `d` bound and installed for it, and a stream of its own made once; `step` is a barrier of
/// the ranks.
pub fn on_streams(d: &Device, cs: &[usize], f: impl Fn(usize, usize, &Stream, &Step) + Sync) {
    let step = Step::new(cs.len());
    std::thread::scope(|sc| {
        let hs: Vec<_> = cs
            .iter()
            .enumerate()
            .map(|(me, &c)| {
                let (d, f, step) = (d.clone(), &f, &step);
                sc.spawn(move || {
                    d.bind().expect("bind");
                    install_on_thread(Some(d.clone()));
                    let s = d.create_stream().expect("stream");
                    f(me, c, &s, step);
                    install_on_thread(None);
                })
            })
            .collect();
        for h in hs {
            h.join().expect("rank panicked");
        }
    });
}

/// One call of the tests, on one rank.
pub struct Case {
    pub coll: Coll,
    pub ty: Ty,
    pub op: Op,
    pub count: usize,
    /// Where its buffers lie (send, recv).
    pub places: (Place, Place),
}

impl Case {
    /// `run_in` stream-ordered.
    pub fn run(&self, me: usize, c: usize, s: &Stream, step: &Step, n: usize, calls: u64) {
        self.run_in(me, c, s, step, n, Mode::Stream, calls)
    }

    /// Rank `me` of `n` (communicator `c`, stream `s`) makes the call in `mode` (a
    /// stream-ordered one on `s`, synchronised after), and blocking on host buffers: both give
    /// the expected bytes, and the rank counts `calls` direct calls more. `step`: the ranks'
    /// barrier, so that no rank allocates or frees page-locked memory (uploads, downloads,
    /// page-locked buffers), which waits for every stream of the device, while a stream waits
    /// for a call.
    #[allow(clippy::too_many_arguments)]
    pub fn run_in(
        &self,
        me: usize,
        c: usize,
        s: &Stream,
        step: &Step,
        n: usize,
        mode: Mode,
        calls: u64,
    ) {
        let d = s.device();
        let (coll, ty, op, count) = (self.coll, self.ty, self.op, self.count);
        let what = format!(
            "{coll:?} {ty:?} {op:?} n={n} rank {me} count={count} {:?} {mode:?}",
            self.places
        );
        let (input, want) = expected(coll, op, n, me, count);
        let input = ty.encode(&input);
        let want = want.map(|w| ty.encode(&w));
        let out_len = want.as_ref().map_or(0, Vec::len);
        let buf = |place: Place, bytes: &[u8]| Buf::new(d, s, place, bytes);
        let out = |place: Place| want.as_ref().map(|_| buf(place, &vec![0xA5; out_len]));
        let ptr = |b: &mut Option<Buf>| b.as_mut().map_or(std::ptr::null_mut(), Buf::ptr);
        let (mut hs, mut hr) = (buf(Place::Host, &input), out(Place::Host));
        let (mut ds, mut dr) = (buf(self.places.0, &input), out(self.places.1));
        step.wait();
        let null = std::ptr::null_mut();
        let run = |send, recv, mode, stream| {
            call(c, coll, ty, op, n, me, count, send, recv, mode, stream)
        };
        let sts = run(hs.ptr(), ptr(&mut hr), Mode::Blocking, null);
        assert!(
            sts.iter().all(|&st| st == FABRICOLL_SUCCESS),
            "{what} on host buffers: {sts:?} {}",
            last_error()
        );
        let before = [device_direct_calls(comm(c)).expect("live communicator")];
        let handle = if mode == Mode::Stream {
            s.handle()
        } else {
            null
        };
        let sts = run(ds.ptr(), ptr(&mut dr), mode, handle);
        let errors: Vec<String> = sts
            .iter()
            .filter(|&&st| st != FABRICOLL_SUCCESS)
            .map(|st| format!("status {st:?}: {}", last_error()))
            .collect();
        let synced = s.synchronize(WAIT);
        // Asserted after the step, so that a failing rank does not leave the others there.
        step.wait();
        assert!(errors.is_empty(), "{what}: {errors:?}");
        synced.unwrap_or_else(|e| panic!("{what}: synchronize: {e}"));
        no_async_error(comm(c));
        counted(&[c], &before, calls, &what);
        if let (Some(w), Some(h), Some(o)) = (&want, hr.as_mut(), dr.as_mut()) {
            assert!(h.read(s, out_len) == *w, "{what}: host call: wrong result");
            assert!(o.read(s, out_len) == *w, "{what}: wrong result");
        }
    }
}

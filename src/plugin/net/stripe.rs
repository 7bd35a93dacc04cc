//! Striping (`FABRICOLL_NET_STREAMS` = n > 1): a comm's large messages travel over n endpoints
//! of each device, that is n TCP connections between the two hosts, the way NCCL's Socket
//! transport spreads a message over several sockets.
//!
//! The device's own endpoint carries every message's first piece (the head), and RMA; each of
//! the n-1 helper endpoints carries one further piece and is progressed by its own thread, so the
//! pieces' copies into and out of the kernel run in parallel. A message of S bytes, S at least
//! `STRIPE_MIN` (256 KiB) and n*n pages, is cut into n pieces of P = ceil(S/n) rounded up to a
//! page (the last one shorter): piece e covers [e*P, e*P+P). The head goes with the wire kind
//! `KIND_STRIPE` instead of `KIND_DATA`; the receiver posts every receive of a striped comm
//! ignoring the kind bits, so one receive matches either. A plain head is the whole message. A
//! striped head tells the receiver P (its length), so it then posts pieces 1..n-1 on its helpers
//! at e*P, the last one up to the end of its buffer: a message shorter than the receive still
//! lands byte for byte. Pieces carry the head's wire tag (comm id, NCCL tag, sequence), unique
//! among the messages in flight, so they match whatever order the providers deliver them in.
use super::wire::*;
use super::*;
use crate::transport::OpId;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;

/// Messages below this many bytes go whole over the device's endpoint. NCCL hands the plugin
/// steps of at most 512 KiB by default (NCCL_BUFFSIZE / NCCL_STEPS), so striping must start
/// below that to matter; at 4 streams the pieces are 64 KiB, NCCL Socket's smallest chunk.
pub(super) const STRIPE_MIN: usize = 256 << 10;
/// Pieces start on page boundaries.
const PAGE: usize = 4096;
/// Idle polls before a helper sleeps on its endpoint's completion queue.
const SPIN_POLLS: u32 = 64;

/// The piece length of a striped message of `len` bytes over `n` endpoints, or None when it
/// goes whole.
pub(super) fn piece_len(len: usize, n: usize) -> Option<usize> {
    if n < 2 || len < STRIPE_MIN || len < n * n * PAGE {
        return None;
    }
    Some(len.div_ceil(n).next_multiple_of(PAGE))
}

/// What a helper thread shares with the device.
struct Shared {
    done: Mutex<Vec<Completion>>,
    /// Operations posted and not yet completed: the thread polls only while there are some.
    outstanding: AtomicUsize,
    /// Pieces refused (busy) and waiting for room: the thread polls for them too, since an
    /// endpoint may need progress (connecting to the peer) before it takes them.
    waiting: AtomicUsize,
    stop: AtomicBool,
    error: Mutex<Option<Error>>,
}

/// One helper endpoint and the thread that progresses it.
struct Helper {
    t: Arc<dyn Transport>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Helper {
    fn open(t: Arc<dyn Transport>, index: usize) -> Result<Helper> {
        let shared = Arc::new(Shared {
            done: Mutex::new(Vec::new()),
            outstanding: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
            error: Mutex::new(None),
        });
        let (tt, sh) = (t.clone(), shared.clone());
        let thread = std::thread::Builder::new()
            .name(format!("fabricoll-stripe{index}"))
            .spawn(move || run(&*tt, &sh))
            .map_err(|e| Error::System(format!("cannot start a stripe helper thread: {e}")))?;
        Ok(Helper {
            t,
            shared,
            thread: Some(thread),
        })
    }

    fn wake(&self) {
        if let Some(th) = &self.thread {
            th.thread().unpark();
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(th) = self.thread.take() {
            th.thread().unpark();
            // The loop checks `stop` at least every few milliseconds (park and wait timeouts).
            let _ = th.join();
        }
    }
}

/// A helper thread: poll the endpoint while operations are outstanding, sleep otherwise.
fn run(t: &dyn Transport, sh: &Shared) {
    let mut buf = Vec::new();
    let mut idle = 0u32;
    while !sh.stop.load(Ordering::Acquire) {
        let quiet =
            sh.outstanding.load(Ordering::Acquire) == 0 && sh.waiting.load(Ordering::Acquire) == 0;
        if quiet {
            // Still progress now and then: a peer's helper connecting to this one needs our
            // endpoint to answer before its first piece can be posted here.
            std::thread::park_timeout(Duration::from_millis(1));
        }
        match t.poll(&mut buf) {
            Ok(0) if quiet => {}
            Ok(0) => {
                idle += 1;
                if idle >= SPIN_POLLS {
                    let _ = t.wait(Duration::from_micros(500));
                } else {
                    std::thread::yield_now();
                }
            }
            Ok(n) => {
                idle = 0;
                sh.outstanding.fetch_sub(n, Ordering::AcqRel);
                sh.done.lock().append(&mut buf);
            }
            Err(e) => {
                sh.error.lock().get_or_insert(e);
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// Where a piece belongs: request handle and sub index.
#[derive(Clone, Copy)]
pub(super) struct PieceOf {
    pub h: u64,
    pub sub: usize,
}

/// A piece that waits for room on its helper.
struct Waiting {
    helper: usize,
    send: Option<Peer>,
    tag: u64,
    region: Region,
    op: OpId,
}

/// A device's helper endpoints and the pieces in flight on them.
#[derive(Default)]
pub(super) struct Stripes {
    helpers: Vec<Helper>,
    next_op: OpId,
    pub pieces: HashMap<OpId, PieceOf>,
    waiting: VecDeque<Waiting>,
}

impl Stripes {
    /// Open helpers until there are `n - 1`.
    pub fn ensure(&mut self, n: usize, open: &Opener) -> Result<()> {
        while self.helpers.len() + 1 < n {
            let t = open()?;
            self.helpers.push(Helper::open(t, self.helpers.len() + 1)?);
        }
        Ok(())
    }

    pub fn count(&self) -> usize {
        self.helpers.len()
    }

    pub fn address(&self, i: usize) -> Vec<u8> {
        self.helpers[i].t.address()
    }

    pub fn insert_peer(&self, i: usize, addr: &[u8]) -> Result<Peer> {
        self.helpers[i].t.insert_peer(addr)
    }

    /// Post piece `e` (1..) of request `of`: a send to `to` or a receive.
    pub fn post(
        &mut self,
        e: usize,
        to: Option<Peer>,
        tag: u64,
        region: Region,
        of: PieceOf,
    ) -> Result<()> {
        self.next_op += 1;
        let op = self.next_op;
        self.pieces.insert(op, of);
        let w = Waiting {
            helper: e - 1,
            send: to,
            tag,
            region,
            op,
        };
        if self.waiting.is_empty() && self.try_post(&w)? {
            return Ok(());
        }
        self.wait_for(&w, 1);
        self.waiting.push_back(w);
        Ok(())
    }

    /// Count `w` in (`delta` 1) or out of (`usize::MAX`, that is -1) its helper's waiting pieces.
    fn wait_for(&self, w: &Waiting, delta: usize) {
        let h = &self.helpers[w.helper];
        h.shared.waiting.fetch_add(delta, Ordering::AcqRel);
        if let Some(th) = &h.thread {
            th.thread().unpark();
        }
    }

    fn try_post(&self, w: &Waiting) -> Result<bool> {
        let h = &self.helpers[w.helper];
        // Counted before posting: the thread may see the completion before this call returns.
        h.shared.outstanding.fetch_add(1, Ordering::AcqRel);
        let r = match w.send {
            Some(p) => h.t.send(p, w.tag, w.region, None, w.op),
            None => h.t.recv(w.tag, 0, w.region, None, w.op),
        };
        if r.as_ref().map_or(true, |p| *p == Posted::Busy) {
            h.shared.outstanding.fetch_sub(1, Ordering::AcqRel);
            return r.map(|_| false);
        }
        h.wake();
        Ok(true)
    }

    /// Post waiting pieces and collect the helpers' completions into `out`.
    pub fn progress(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        while let Some(w) = self.waiting.front() {
            if !self.pieces.contains_key(&w.op) {
                self.wait_for(w, usize::MAX);
                self.waiting.pop_front(); // its request is gone
                continue;
            }
            if !self.try_post(w)? {
                break;
            }
            self.wait_for(w, usize::MAX);
            self.waiting.pop_front();
        }
        for h in &self.helpers {
            if let Some(e) = h.shared.error.lock().take() {
                return Err(e);
            }
            out.append(&mut h.shared.done.lock());
        }
        Ok(())
    }

    /// Cancel the posted receive pieces of request `h` and forget all its pieces.
    pub fn drop_request(&mut self, h: u64) {
        let mine: Vec<OpId> = self
            .pieces
            .iter()
            .filter(|(_, p)| p.h == h)
            .map(|(op, _)| *op)
            .collect();
        for op in mine {
            self.pieces.remove(&op);
            if let Some(i) = self.waiting.iter().position(|w| w.op == op) {
                if let Some(w) = self.waiting.remove(i) {
                    self.wait_for(&w, usize::MAX);
                }
            } else {
                for helper in &self.helpers {
                    helper.t.cancel(op); // only receives are cancelled; ops are unique per device
                }
            }
        }
    }
}

impl Device {
    /// How many endpoints a comm of this device stripes over: `FABRICOLL_NET_STREAMS`, else the
    /// provider's default; 1 where the provider offers no striping or needs registered memory
    /// (a helper endpoint has its own domain, where the device's registrations do not hold).
    pub(super) fn stream_count(&self, t: &dyn Transport) -> usize {
        let caps = t.caps();
        if caps.net_streams == 0 || caps.mr_local {
            return 1;
        }
        self.streams.unwrap_or(caps.net_streams).clamp(1, MAX_RECVS)
    }
}

/// A completion from a helper: count it in its request.
pub(super) fn dispatch_piece(st: &mut State, c: Completion) {
    let Some(of) = st.stripes.pieces.remove(&c.op) else {
        return; // its request was closed
    };
    let Some(r) = st.reqs.get_mut(of.h) else {
        return;
    };
    r.last = Instant::now();
    match c.status {
        Ok(()) => {
            let s = &mut r.subs[of.sub];
            s.size += c.len;
            s.parts -= 1;
            if s.parts == 0 && s.head && !s.done {
                s.done = true;
                r.left -= 1;
            }
        }
        Err(e) => {
            r.error.get_or_insert(if super::dispatch::is_cancel(&e) {
                Error::Remote("the provider aborted a stripe (connection to the peer lost)".into())
            } else {
                e
            });
        }
    }
}

/// A striped head of `p` bytes arrived for sub `i` of receive request `h` whose data tag is
/// `tag`: post the other pieces into the rest of its buffer.
pub(super) fn post_receive_pieces(st: &mut State, h: u64, i: usize, tag: u64, p: usize) {
    let Some(r) = st.reqs.get(h) else { return };
    let n = st.recvs.get(r.comm).map_or(1, |c| c.streams);
    let Some(buf) = r.subs[i].stripe_buf else {
        return;
    };
    let fail = |st: &mut State, e: Error| {
        if let Some(r) = st.reqs.get_mut(h) {
            r.error.get_or_insert(e);
        }
    };
    if n < 2 || p == 0 || (n - 1) * p >= buf.len() {
        let why = format!(
            "a striped message with {p}-byte pieces over {n} endpoints does not fit the posted \
             {}-byte receive",
            buf.len()
        );
        return fail(st, Error::Remote(why));
    }
    if let Some(r) = st.reqs.get_mut(h) {
        r.subs[i].parts = n - 1;
    }
    for e in 1..n {
        let off = e * p;
        let len = if e + 1 < n {
            p
        } else {
            (buf.len() - off).min(p)
        };
        let Some(region) = buf.sub(off, len) else {
            return fail(
                st,
                Error::Remote("striped piece outside the receive".into()),
            );
        };
        if let Err(err) = st.stripes.post(e, None, tag, region, PieceOf { h, sub: i }) {
            return fail(st, err);
        }
    }
}

/// Send pieces 1.. of a striped message (`piece_len` said `p`) of request `h`.
pub(super) fn post_send_pieces(
    st: &mut State,
    h: u64,
    peers: &[Peer],
    tag: u64,
    region: Region,
    p: usize,
) -> Result<()> {
    let n = peers.len() + 1;
    for (e, peer) in (1..n).zip(peers) {
        let off = e * p;
        let len = (region.len() - off).min(p);
        let piece = region
            .sub(off, len)
            .ok_or_else(|| Error::System("striped piece outside the send buffer".into()))?;
        st.stripes
            .post(e, Some(*peer), tag, piece, PieceOf { h, sub: 0 })?;
    }
    Ok(())
}

/// The head's wire kind and the receive's ignore mask of a comm over `n` endpoints.
pub(super) fn recv_ignore(n: usize) -> u64 {
    if n > 1 {
        KIND_BITS
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_the_message_and_the_last_is_never_empty() {
        assert_eq!(piece_len(STRIPE_MIN - 1, 4), None);
        assert_eq!(piece_len(64 << 20, 1), None);
        for n in 2..=8 {
            for len in [STRIPE_MIN, STRIPE_MIN + 1, (3 << 20) + 17, 64 << 20] {
                let Some(p) = piece_len(len, n) else {
                    assert!(len < n * n * PAGE);
                    continue;
                };
                assert_eq!(p % PAGE, 0);
                assert!((n - 1) * p < len, "n {n} len {len} p {p}");
                assert!(n * p >= len);
            }
        }
    }
}

//! shm endpoints of one process that talk to each other (siblings: ranks as threads). libfabric's
//! shm (1.17 and 2.1 alike) does not map the region of a peer endpoint of its own process: it
//! takes that endpoint's own mapping, found by name in a process-wide list, and closing an
//! endpoint unmaps its region while the list keeps the stale pointer. A sibling that still has
//! work with the closed one (a message in its queue, a response owed, a command to return), or
//! that reads a message naming it later, dereferences the unmapped region inside `fi_cq_read`
//! and the process dies of SIGSEGV. Peers in other processes map the region themselves and
//! lose nothing when its owner closes it.
//!
//! So an endpoint whose siblings may still hold its region is not closed when it is dropped:
//! its state (fids, contexts, buffers) is parked here, untouched and never progressed. The
//! endpoints linked by talking (one inserted the other) close together, once the last of them
//! is dropped: each first settles what it owes the others (2.x's shm, closing an endpoint,
//! writes into the region of every sibling whose large message it never received), while every
//! region is still mapped, then all are closed. Parked endpoints cost their regions' memory
//! until then. An address of a sibling that was already dropped is refused at insertion,
//! before the provider maps the stale pointer.
//!
//! An endpoint linked with no sibling (every rank its own process: NCCL's net and CollNet
//! plugins) owes no sibling anything and is closed at once, unsettled, as any endpoint was
//! before: settling progresses the endpoint, and 1.17's shm, reading the first message of a
//! peer of another process whose region is gone (that peer closed its endpoint first), maps
//! nothing and dereferences the null mapping (`smr_progress_connreq`). An endpoint linked with
//! siblings that also talked to other processes still settles, and keeps that risk where such
//! a peer's first message was never read before it left.
use super::super::{sys, Inner, OpCtx, Role, FI_ADDR_UNSPEC};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::os::raw::c_void;
use std::ptr;

/// An endpoint's state, as parked.
pub(crate) trait Parked: Send {
    /// Settle what the endpoint owes its siblings, whose regions are all still mapped: called
    /// just before it is dropped.
    fn settle(&mut self);
}

/// What the registry knows of one endpoint of this process, by region name.
enum State {
    Open,
    /// Dropped while a sibling it is linked with, directly or not, was open.
    Parked(Box<dyn Parked>),
    /// Dropped (and closed).
    Closed,
}

struct Sibling {
    state: State,
    /// The siblings this one is linked with.
    links: HashSet<String>,
}

static SIBLINGS: Mutex<Option<HashMap<String, Sibling>>> = Mutex::new(None);

fn with<R>(f: impl FnOnce(&mut HashMap<String, Sibling>) -> R) -> R {
    f(SIBLINGS.lock().get_or_insert_with(HashMap::new))
}

/// The endpoint whose region is `name` is open.
pub(crate) fn opened(name: &str) {
    with(|m| {
        m.insert(
            name.to_string(),
            Sibling {
                state: State::Open,
                links: HashSet::new(),
            },
        )
    });
}

/// Whether the endpoint named `name`, known here, was dropped (a name never opened in this
/// registry, such as another process's, is not).
pub(crate) fn dropped(name: &str) -> bool {
    with(|m| m.get(name).is_some_and(|s| !matches!(s.state, State::Open)))
}

/// Endpoints `a` and `b` of this process talk to each other: they close together. Names
/// unknown here, or closed, are left alone.
pub(crate) fn link(a: &str, b: &str) {
    if a == b {
        return;
    }
    with(|m| {
        let live = |x: &str| m.get(x).is_some_and(|s| !matches!(s.state, State::Closed));
        if !(live(a) && live(b)) {
            return;
        }
        for (x, y) in [(a, b), (b, a)] {
            m.get_mut(x).expect("checked").links.insert(y.to_string());
        }
    });
}

/// The endpoint named `name` is dropped with its `state`. Where every endpoint linked with it,
/// directly or through others, is dropped too, all of them are settled and then dropped
/// (closing them), after the registry's lock is released; else it is parked. An endpoint
/// linked with none, or a name unknown here, is dropped at once, unsettled.
pub(crate) fn release(name: &str, state: Box<dyn Parked>) {
    let mut closing = Vec::new();
    let alone = with(|m| {
        let Some(me) = m.get_mut(name) else {
            return Some(state);
        };
        if me.links.is_empty() {
            me.state = State::Closed;
            return Some(state);
        }
        me.state = State::Parked(state);
        let mut group = HashSet::from([name.to_string()]);
        let mut todo = vec![name.to_string()];
        while let Some(x) = todo.pop() {
            for l in &m[&x].links {
                if m.contains_key(l) && group.insert(l.clone()) {
                    todo.push(l.clone());
                }
            }
        }
        if group.iter().any(|x| matches!(m[x].state, State::Open)) {
            return None;
        }
        for x in group {
            let s = m.get_mut(&x).expect("in the registry");
            s.links.clear();
            if let State::Parked(p) = std::mem::replace(&mut s.state, State::Closed) {
                closing.push(p);
            }
        }
        None
    });
    // Outside the lock: closing may take a while.
    drop(alone);
    for p in &mut closing {
        p.settle();
    }
    drop(closing);
}

/// Most messages `settle` takes off one endpoint: a bound, since peers in other processes may
/// keep sending.
const SETTLE_MAX: usize = 4096;

/// What one peek of `settle` found.
enum Peeked {
    /// A message, now being received whole (or already received) and dropped.
    Message,
    /// Nothing waits.
    Nothing,
    /// The provider takes no `FI_PEEK` here.
    Unsupported,
}

impl Parked for Inner {
    /// Receive, into nothing, every tagged message that waits unexpected, so that closing the
    /// endpoint discards none (a discard writes into the sender's region).
    ///
    /// Each message is found with `FI_PEEK | FI_CLAIM` and received whole into a buffer of its
    /// own length: a receive that truncates a waiting message kills the process inside 2.x's
    /// shm (a saved message longer than its inline data: `smr_copy_saved` follows a null
    /// pointer once the copy comes up short; `docs/providers.md`). Where the provider takes no
    /// peek, zero-byte receives truncate the messages instead, as 1.17's shm allows.
    fn settle(&mut self) {
        let mut entries = std::mem::take(&mut self.entries);
        let mut sink = Vec::new();
        for _ in 0..SETTLE_MAX {
            match self.settle_peek(&mut entries, &mut sink) {
                Peeked::Message => continue,
                Peeked::Nothing => break,
                Peeked::Unsupported => {
                    self.settle_truncating(&mut entries, &mut sink);
                    break;
                }
            }
        }
        self.entries = entries;
    }
}

impl Inner {
    /// Ask the provider for one message that waits unexpected; one found is claimed
    /// (`on_settle_peeked`) while the completion queue is read here.
    fn settle_peek(
        &mut self,
        entries: &mut [sys::fi_cq_tagged_entry],
        sink: &mut Vec<crate::transport::Completion>,
    ) -> Peeked {
        let before = self.shm.settled;
        let rc = self.post_peek(Role::SettlePeek);
        if rc != 0 {
            return if rc == -(sys::FI_EAGAIN as isize) {
                Peeked::Nothing
            } else {
                Peeked::Unsupported
            };
        }
        // The answer is written when the peek is posted; read it (and whatever else completes).
        let _ = self.read_cq(entries, sink);
        if self.shm.settled > before {
            Peeked::Message
        } else {
            // No message (an `FI_ENOMSG` entry), or no answer yet: its context stays in `ops`
            // until the endpoint closes.
            Peeked::Nothing
        }
    }

    /// A settle's peek found a message of `len` bytes with `tag`: receive it with `FI_CLAIM`
    /// on the same context into a buffer of its own length, to be dropped. A message still
    /// being copied in segments completes later or never (its sender gone); the buffer stays
    /// with the context in `ops` until then or until the endpoint closes.
    pub(in super::super) fn on_settle_peeked(&mut self, ctx: Box<OpCtx>, tag: u64, len: usize) {
        self.shm.settled += 1;
        // Kept in `ops` whatever the post returns: the provider marked the message with it.
        let (_, rc) = self.post_claim(ctx, Role::Swallow, tag, len);
        if rc != 0 {
            log::debug!(
                "settling: receiving a waiting message of {len} bytes failed: {}",
                super::super::strerror(rc as i64)
            );
        }
    }

    /// Settle by zero-byte receives that match any waiting message, truncating it: for a
    /// provider without `FI_PEEK`.
    fn settle_truncating(
        &mut self,
        entries: &mut [sys::fi_cq_tagged_entry],
        sink: &mut Vec<crate::transport::Completion>,
    ) {
        for _ in 0..SETTLE_MAX {
            let ctx = self.new_ctx(0, 0, true, None, Role::Swallow);
            // SAFETY: a zero-byte receive matching any tag; ctx lives in `ops` until its
            // completion is read or the endpoint closes.
            let rc = unsafe {
                sys::fi_trecv(
                    self.ep,
                    ptr::null_mut(),
                    0,
                    ptr::null_mut(),
                    FI_ADDR_UNSPEC,
                    0,
                    u64::MAX,
                    ctx,
                )
            };
            if rc != 0 {
                self.ops.remove(&(ctx as usize));
                break;
            }
            // A waiting message matches it at once (truncated: an error completion, swallowed).
            let _ = self.read_cq(entries, sink);
            if self.ops.contains_key(&(ctx as usize)) {
                // Nothing waits: withdraw it.
                // SAFETY: ep is open and ctx is the context of a receive posted on it.
                unsafe { sys::fi_cancel(self.ep as *mut sys::fid, ctx as *mut c_void) };
                let _ = self.read_cq(entries, sink);
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A stand-in for an endpoint's state: counts its settles and drops, and checks that it
    /// was settled before it was dropped.
    struct Fids(Arc<AtomicUsize>, Arc<AtomicUsize>);
    impl Parked for Fids {
        fn settle(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    impl Drop for Fids {
        fn drop(&mut self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn names(tag: &str, n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("siblings-test-{tag}-{}-{i}", std::process::id()))
            .collect()
    }

    /// Counters for `n` stand-ins: (settled, dropped).
    fn counters(n: usize) -> Vec<(Arc<AtomicUsize>, Arc<AtomicUsize>)> {
        (0..n).map(|_| Default::default()).collect()
    }

    fn fids(c: &(Arc<AtomicUsize>, Arc<AtomicUsize>)) -> Box<dyn Parked> {
        Box::new(Fids(c.0.clone(), c.1.clone()))
    }

    fn count(c: &[(Arc<AtomicUsize>, Arc<AtomicUsize>)]) -> Vec<(usize, usize)> {
        c.iter()
            .map(|(s, d)| (s.load(Ordering::SeqCst), d.load(Ordering::SeqCst)))
            .collect()
    }

    #[test]
    fn linked_endpoints_close_together_once_the_last_is_dropped() {
        let n = names("chain", 4);
        for x in &n {
            opened(x);
        }
        // A chain 0 - 1 - 2 (0 and 2 never talked) and 3 on its own; a self-link is ignored.
        link(&n[0], &n[1]);
        link(&n[2], &n[1]);
        link(&n[0], &n[0]);
        let c = counters(4);
        release(&n[0], fids(&c[0]));
        release(&n[2], fids(&c[2]));
        assert_eq!(count(&c)[..3], [(0, 0); 3], "parked: 1 is open");
        assert!(dropped(&n[0]) && !dropped(&n[1]));
        release(&n[3], fids(&c[3]));
        assert_eq!(count(&c)[3], (0, 1), "unlinked: closed at once, unsettled");
        release(&n[1], fids(&c[1]));
        assert_eq!(
            count(&c)[..3],
            [(1, 1); 3],
            "all settled, then closed, once"
        );
        assert!(n.iter().all(|x| dropped(x)));
        // A closed endpoint links with nothing any more.
        opened(&n[3]);
        link(&n[3], &n[0]);
        let c = counters(1);
        release(&n[3], fids(&c[0]));
        assert_eq!(count(&c), [(0, 1)]);
    }

    #[test]
    fn unknown_endpoints_close_at_once_and_hold_nothing() {
        let n = names("alone", 2);
        let c = counters(2);
        // Never opened here (another library's endpoint): closed at once, unsettled, never
        // "dropped".
        release(&n[0], fids(&c[0]));
        assert_eq!(count(&c)[0], (0, 1));
        assert!(!dropped(&n[0]));
        // A link to a name unknown here holds nothing.
        opened(&n[1]);
        link(&n[1], &n[0]);
        release(&n[1], fids(&c[1]));
        assert_eq!(count(&c)[1], (0, 1));
        assert!(dropped(&n[1]));
    }
}

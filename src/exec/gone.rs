//! Noticing a peer that went away. No completion says that a peer is gone: a message sent
//! before its process exited completed (it lies in the peer's fastbox ring, or the provider
//! took it), and a receive posted for a message that process would have sent waits for ever.
//! So a collective (or transfer) that has made no progress for `WATCH_AFTER` asks the
//! transport, at most every `LOOK_EVERY`, whether each peer it has an operation in flight
//! with is gone (`Transport::peer_gone`: over shm its process exited or its endpoint closed);
//! once it has made none for `ASK_AFTER`, at most every `ASK_EVERY` it also asks the peers'
//! addresses (a bounded connection attempt: a socket peer whose endpoint closed refuses it).
//!
//! A peer seen gone fails the call only if the operation with it is still in flight
//! `CONFIRM` later: what the peer sent before it exited may still wait in our queues, unread
//! at the look, and the engine polls the transport many times in between. Only operations in
//! flight count: a peer that finished its part and left may have sent what a receive of ours,
//! not yet posted, will take from our queues.
//!
//! The ranks that wait for a live rank whose call failed so would otherwise wait for the
//! deadline (a ring's ranks not next to the dead one). So a call that fails over a gone rank
//! sends each peer of its schedule a notice saying so (the body `GONE_NOTICE` with the gone
//! rank), twice: under `notice`'s message key, which a stalled call of the same number takes
//! (on the direct path too), and as a late notice, which the communicator takes whatever call
//! it runs (`coll::late`: the peer may have finished its part and started the next call, which
//! waits for this rank). A call told so fails too, naming both ranks, and tells its own peers
//! in turn; a communicator told so fails every collective it runs (each needs every rank).
use super::notice::{LATE_KEY, NOTICE_KEY, NOTICE_STEP, WATCH_AFTER};
use super::tags::{coll_tag, SEQ_MASK, SEQ_SHIFT, SRC_MASK, SRC_SHIFT};
use super::{Exec, St, Tags};
use crate::error::{Error, Result};
use crate::transport::{Peer, Transport};
use std::time::{Duration, Instant};

/// How often a stalled call asks whether the peers it waits for are gone.
const LOOK_EVERY: Duration = Duration::from_millis(20);

/// How long a peer seen gone must keep an operation of the call in flight before the call
/// fails (see the module doc).
const CONFIRM: Duration = Duration::from_millis(50);

/// How long a call makes no progress before it asks its peers' addresses too.
const ASK_AFTER: Duration = Duration::from_secs(1);

/// The interval between two askings of the addresses.
const ASK_EVERY: Duration = Duration::from_secs(2);

/// The most addresses one asking asks (the next asking goes on with the next peers): a host
/// that does not answer holds each attempt for its bound, in the thread that polls.
const ASK_PEERS: usize = 4;

/// Bit of a notice's body: its sender's call failed because the rank in the low bits is gone
/// (without it, a notice says that the calls differ).
const GONE_NOTICE: u64 = 1 << 63;

/// Whether a notice's body says that its sender failed over a gone rank.
pub fn is_gone_notice(body: &[u8]) -> bool {
    body.get(..8)
        .and_then(|b| b.try_into().ok())
        .is_some_and(|b| u64::from_le_bytes(b) & GONE_NOTICE != 0)
}

/// A call's looks for gone peers.
#[derive(Debug, Default)]
pub(super) struct Looks {
    /// The last progress before the call stalled, once the deadline's clock found it stalled
    /// for `WATCH_AFTER` (`Exec::check_deadline`); None while it moves.
    stalled_since: Option<Instant>,
    /// The last look, and the last that asked the addresses.
    looked_at: Option<Instant>,
    asked_at: Option<Instant>,
    /// Where in the peers in flight the next asking of addresses starts.
    ask_from: usize,
    /// Peers seen gone (rank, when first seen) with operations still in flight.
    seen: Vec<(usize, Instant)>,
    /// The gone rank this call failed over, which `fail` tells the peers of.
    pub(super) failed_over: Option<usize>,
}

impl Looks {
    /// Forget the looks of a previous call.
    pub(super) fn reset(&mut self) {
        self.stalled_since = None;
        self.looked_at = None;
        self.asked_at = None;
        self.ask_from = 0;
        self.seen.clear();
        self.failed_over = None;
    }
}

impl Looks {
    /// The deadline's clock, read at `now`, found no progress since `last`.
    pub(super) fn no_progress(&mut self, last: Instant, now: Instant) {
        if now.saturating_duration_since(last) >= WATCH_AFTER {
            self.stalled_since = Some(last);
        }
    }

    /// The call moved: what the last looks saw is forgotten, so a peer seen gone fails the
    /// call only after a stall of its own (bytes from a peer that exited may still be arriving
    /// over a slow link, a step at a time).
    pub(super) fn progress(&mut self) {
        self.stalled_since = None;
        self.seen.clear();
    }
}

impl Exec {
    /// The ranks this call has an operation in flight with, each once, in order.
    fn in_flight_peers(&self) -> Vec<usize> {
        let steps = &self.job.schedule.ranks[self.job.rank];
        let mut v: Vec<usize> = steps
            .iter()
            .zip(&self.state)
            .filter(|(_, s)| **s == St::Posted)
            .filter_map(|(step, _)| step.op.peer())
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Fail the call where a peer it waits for is gone (see the module doc). Nothing but two
    /// flags is read until the deadline's clock finds the call stalled.
    pub(super) fn look_for_gone(&mut self, t: &dyn Transport, peers: &[Peer]) -> Result<()> {
        if self.finished || self.moved {
            return Ok(());
        }
        let Some(last) = self.gone.stalled_since else {
            return Ok(());
        };
        let now = Instant::now();
        let stalled = now.saturating_duration_since(last);
        if self
            .gone
            .looked_at
            .is_some_and(|at| now.saturating_duration_since(at) < LOOK_EVERY)
        {
            return Ok(());
        }
        self.gone.looked_at = Some(now);
        let ask = stalled >= ASK_AFTER
            && self
                .gone
                .asked_at
                .is_none_or(|at| now.saturating_duration_since(at) >= ASK_EVERY);
        if ask {
            self.gone.asked_at = Some(now);
        }
        let mut waited = self.in_flight_peers();
        self.gone.seen.retain(|(p, _)| waited.contains(p));
        if waited.is_empty() {
            return Ok(());
        }
        // The addresses asked this time: the first `ASK_PEERS` from where the last asking
        // stopped.
        let from = self.gone.ask_from % waited.len();
        waited.rotate_left(from);
        let mut asks = if ask { ASK_PEERS } else { 0 };
        if ask {
            self.gone.ask_from = from + ASK_PEERS;
        }
        for p in waited {
            let ask_this = asks > 0;
            asks = asks.saturating_sub(1);
            match self.gone.seen.iter().find(|(q, _)| *q == p) {
                Some(&(_, at)) if now.saturating_duration_since(at) >= CONFIRM => {
                    self.gone.failed_over = Some(p);
                    return Err(self.gone_error(p, stalled));
                }
                Some(_) => {}
                None if t.peer_gone(peers[p], ask_this) => self.gone.seen.push((p, now)),
                None => {}
            }
        }
        Ok(())
    }

    /// Tell each peer of the schedule that this call failed over a gone rank (best effort).
    /// Returns how many notices went out (each completes as an operation of this call, step
    /// `NOTICE_STEP`).
    pub(super) fn send_gone_notices(&self, t: &dyn Transport, peers: &[Peer]) -> usize {
        let (Some(gone), Tags::Coll(seq)) = (self.gone.failed_over, self.job.args.tags) else {
            return 0;
        };
        let body = (GONE_NOTICE | gone as u64).to_le_bytes();
        let op = self.op_id(NOTICE_STEP);
        let mut sent = 0;
        for key in [NOTICE_KEY, LATE_KEY] {
            let tag = coll_tag(seq, self.job.rank, key, self.sig);
            for &p in self.plan.message_peers.iter().filter(|&&p| p != gone) {
                sent += usize::from(t.send_owned(peers[p], tag, body.to_vec(), op).is_ok());
            }
        }
        sent
    }

    /// A late notice (tag `tag`, body `body`) that a rank is gone, taken by the communicator
    /// while this collective runs: the error it fails with (and passes on, see `fail`).
    pub fn told_gone(&mut self, tag: u64, body: &[u8]) -> Option<Error> {
        if !self.is_collective() {
            return None;
        }
        let (e, gone) = self.gone_notice(tag, body)?;
        self.gone.failed_over = Some(gone);
        Some(e)
    }

    /// A notice (tagged `tag`, its body `body`) that says its sender failed over a gone rank:
    /// the error this call fails with, and that rank. None for a notice that the calls differ.
    pub(super) fn gone_notice(&self, tag: u64, body: &[u8]) -> Option<(Error, usize)> {
        let b = u64::from_le_bytes(body.get(..8)?.try_into().ok()?);
        if b & GONE_NOTICE == 0 {
            return None;
        }
        let n = self.job.schedule.problem.nranks;
        let gone = usize::try_from(b & !GONE_NOTICE).ok().filter(|&g| g < n)?;
        let from = ((tag & SRC_MASK) >> SRC_SHIFT) as usize;
        let seq = (tag >> SEQ_SHIFT) & SEQ_MASK;
        let e = Error::Remote(format!(
            "{:?}: rank {from} failed (in collective {seq} of the tag sequence) because rank \
             {gone} is gone (its process exited or its endpoint closed)",
            self.job.args.tags
        ));
        Some((e, gone))
    }

    /// The error of a call whose peer `p` is gone.
    fn gone_error(&self, p: usize, stalled: Duration) -> Error {
        Error::Remote(format!(
            "{:?}: rank {p} is gone (its process exited or its endpoint closed) while this rank \
             waited for it for {stalled:.1?}: {} of {} steps done",
            self.job.args.tags,
            self.done,
            self.state.len()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::{ASK_AFTER, CONFIRM, LOOK_EVERY};
    use crate::exec::recorder::{ring_rank0, Recorder, PEERS};
    use crate::exec::{BufPool, Exec, St};
    use crate::transport::{Peer, Scratch};
    use std::time::{Duration, Instant};

    /// Rank 0 of a 2-rank ring AllReduce advanced once on `t` (its first receive from rank 1
    /// posted), made to look stalled for `for_`.
    fn stalled(t: &Recorder, pool: &mut BufPool, for_: Duration) -> (Box<Exec>, Scratch, Scratch) {
        let (mut x, inp, out) = ring_rank0(t, pool);
        assert_eq!(x.in_flight_peers(), [1], "a receive from rank 1 in flight");
        x.moved = false;
        let now = Instant::now();
        x.gone.no_progress(now - for_, now);
        (x, inp, out)
    }

    /// A transport that says rank 1 (`PEERS[1]`) is gone.
    fn one_gone() -> Recorder {
        Recorder {
            gone: vec![PEERS[1]],
            ..Default::default()
        }
    }

    /// Longer than a look's interval and the confirmation.
    fn a_while() -> Duration {
        CONFIRM.max(LOOK_EVERY) + Duration::from_millis(5)
    }

    #[test]
    fn a_peer_gone_while_an_operation_with_it_is_in_flight_fails_the_call_once_confirmed() {
        let (t, mut pool) = (one_gone(), BufPool::default());
        let (mut x, _inp, _out) = stalled(&t, &mut pool, Duration::from_millis(100));
        // Seen gone: not failed yet, what it sent before it left may still be unread.
        x.look_for_gone(&t, &PEERS).expect("seen, not confirmed");
        assert_eq!(*t.asked.lock(), [(Peer(1), false)], "no address asked yet");
        std::thread::sleep(a_while());
        let e = x.look_for_gone(&t, &PEERS).unwrap_err().to_string();
        assert!(e.contains("rank 1 is gone"), "{e}");
        assert_eq!(
            t.asked.lock().len(),
            1,
            "a peer seen gone is not asked again"
        );
        let _ = x.fail(&t, &PEERS);
    }

    #[test]
    fn a_peer_seen_gone_is_forgotten_when_the_call_moves() {
        let (t, mut pool) = (one_gone(), BufPool::default());
        let (mut x, _inp, _out) = stalled(&t, &mut pool, Duration::from_millis(100));
        x.look_for_gone(&t, &PEERS).expect("seen, not confirmed");
        // A step of the call completed (bytes the peer sent before it left were still coming):
        // the sighting goes with the stall.
        x.gone.progress();
        std::thread::sleep(a_while());
        let now = Instant::now();
        x.gone.no_progress(now - Duration::from_millis(100), now);
        x.look_for_gone(&t, &PEERS)
            .expect("seen anew after the move, not confirmed yet");
        std::thread::sleep(a_while());
        let e = x.look_for_gone(&t, &PEERS).unwrap_err().to_string();
        assert!(e.contains("rank 1 is gone"), "{e}");
        let _ = x.fail(&t, &PEERS);
    }

    #[test]
    fn a_call_that_moves_or_waits_on_live_peers_only_is_not_failed() {
        let (t, mut pool) = (one_gone(), BufPool::default());
        // Gone, but the call moves: nobody is asked.
        let (mut x, _i, _o) = stalled(&t, &mut pool, Duration::from_millis(100));
        x.moved = true;
        x.look_for_gone(&t, &PEERS).unwrap();
        assert!(t.asked.lock().is_empty());
        // Moved since, or stalled for less than the watch's delay: nobody is asked either.
        x.moved = false;
        x.gone.progress();
        x.look_for_gone(&t, &PEERS).unwrap();
        let now = Instant::now();
        x.gone.no_progress(now, now);
        x.look_for_gone(&t, &PEERS).unwrap();
        assert!(t.asked.lock().is_empty());
        let _ = x.fail(&t, &PEERS);
        // Stalled long, the peer alive: the addresses asked from `ASK_AFTER` on, no failure.
        let live = Recorder::default();
        let (mut x, _i, _o) = stalled(&live, &mut pool, ASK_AFTER + Duration::from_millis(1));
        for _ in 0..3 {
            x.look_for_gone(&live, &PEERS).expect("alive");
            std::thread::sleep(LOOK_EVERY + Duration::from_millis(5));
        }
        let asked = live.asked.lock().clone();
        assert_eq!(asked.len(), 3, "one question per look: {asked:?}");
        assert_eq!(asked[0], (Peer(1), true), "the first look asks the address");
        assert!(!asked[1].1 && !asked[2].1, "then not again soon: {asked:?}");
        let _ = x.fail(&live, &PEERS);
    }

    #[test]
    fn one_asking_asks_a_few_addresses_and_the_next_goes_on_with_the_others() {
        use crate::algo::{self, Algorithm, Collective, Options, Problem};
        use crate::exec::recorder::rank0_job;
        use crate::exec::Plan;
        use std::sync::Arc;
        // Rank 0 of a 7-rank mesh AllToAll: a message in flight with each of the 6 others.
        let n = 7;
        let p = Problem::new(Collective::AllToAll, n, 16);
        let schedule = Arc::new(algo::build(p, Algorithm::Mesh, &Options::default()).unwrap());
        let plan = Arc::new(Plan::new(&schedule, 0, 4).unwrap());
        let (inp, out) = (Scratch::new(n * 64), Scratch::new(n * 64));
        let mut pool = BufPool::default();
        let t = Recorder::default();
        let peers: Vec<Peer> = (0..n as u64).map(Peer).collect();
        let mut x = Exec::new(rank0_job(schedule, &inp, &out, false), plan, 1, &mut pool).unwrap();
        x.advance(&t, &peers, &mut pool).unwrap();
        assert_eq!(x.in_flight_peers(), [1, 2, 3, 4, 5, 6]);
        x.moved = false;
        let now = Instant::now();
        x.gone.no_progress(now - ASK_AFTER, now);
        let mut addressed = Vec::new();
        for _ in 0..2 {
            t.asked.lock().clear();
            x.gone.asked_at = None;
            x.gone.looked_at = None;
            x.look_for_gone(&t, &peers).expect("alive");
            let asked = t.asked.lock().clone();
            assert_eq!(
                asked.len(),
                n - 1,
                "every peer in flight looked at: {asked:?}"
            );
            let a: Vec<u64> = asked.iter().filter(|q| q.1).map(|q| q.0 .0).collect();
            assert_eq!(a.len(), super::ASK_PEERS, "{asked:?}");
            addressed.extend(a);
        }
        addressed.sort_unstable();
        addressed.dedup();
        assert_eq!(
            addressed,
            [1, 2, 3, 4, 5, 6],
            "two askings cover the six peers"
        );
        let _ = x.fail(&t, &peers);
    }

    #[test]
    fn a_call_failed_over_a_gone_rank_tells_its_peers_and_a_peer_told_fails_and_passes_it_on() {
        use super::super::notice::{NOTICE_KEY, WATCH_STEP};
        use crate::algo::{self, Algorithm, Collective, Options, Problem};
        use crate::exec::recorder::rank0_job;
        use crate::exec::tags::coll_tag;
        use crate::exec::Plan;
        use crate::transport::Completion;
        use std::sync::Arc;
        let (t, mut pool) = (one_gone(), BufPool::default());
        let (mut x, _i, _o) = stalled(&t, &mut pool, Duration::from_millis(100));
        x.look_for_gone(&t, &PEERS).unwrap();
        std::thread::sleep(a_while());
        assert!(x.look_for_gone(&t, &PEERS).is_err());
        // Its only peer is the gone one: nobody to tell.
        assert_eq!(x.send_gone_notices(&t, &PEERS), 0);
        let _ = x.fail(&t, &PEERS);
        // Rank 0 of a 3-rank ring, told by rank 1 that rank 2 is gone: fails naming both, and
        // tells its own peers but the gone one (rank 1) in turn.
        let p = Problem::new(Collective::AllReduce, 3, 1024);
        let schedule = Arc::new(algo::build(p, Algorithm::Ring, &Options::default()).unwrap());
        let plan = Arc::new(Plan::new(&schedule, 0, 4).unwrap());
        let (inp, out) = (Scratch::new(4096), Scratch::new(4096));
        let live = Recorder::default();
        let peers = [Peer(0), Peer(1), Peer(2)];
        let mut x = Exec::new(rank0_job(schedule, &inp, &out, false), plan, 1, &mut pool).unwrap();
        x.advance(&live, &peers, &mut pool).unwrap();
        let body = (super::GONE_NOTICE | 2).to_le_bytes().to_vec();
        let tag = coll_tag(0, 1, NOTICE_KEY, x.sig);
        let told = Completion::done(x.op_id(WATCH_STEP), 8, tag, Some(body));
        let e = x.on_completion(told, &mut pool).unwrap_err().to_string();
        assert!(
            e.contains("rank 1 failed (in collective 0") && e.contains("rank 2 is gone"),
            "{e}"
        );
        live.posts.lock().clear();
        let (_, notices) = x.fail_noting(&live, &peers);
        assert_eq!(
            notices,
            2,
            "a notice and a late notice: {:?}",
            live.posts.lock()
        );
    }

    #[test]
    fn a_gone_peer_without_an_operation_in_flight_is_not_waited_for() {
        let (t, mut pool) = (one_gone(), BufPool::default());
        let (mut x, _i, _o) = stalled(&t, &mut pool, Duration::from_millis(100));
        // Nothing in flight: the peer may have left after sending what we will take.
        for s in x.state.iter_mut() {
            if *s == St::Posted {
                *s = St::Waiting;
            }
        }
        x.look_for_gone(&t, &PEERS).unwrap();
        std::thread::sleep(a_while());
        x.look_for_gone(&t, &PEERS).unwrap();
        assert!(t.asked.lock().is_empty(), "nobody to ask about");
    }
}

//! A test transport that records the order of posts and answers the direct channel, and the
//! job the executor's tests run on it.

use crate::algo::{self, Algorithm, Collective, Options, Problem};
use crate::error::{Error, Result};
use crate::exec::{Args, BufPool, Exec, Job, Plan, Tags};
use crate::reduce::{DataType, RedOp};
use crate::transport::{Caps, Completion, Mr, OpId, Peer, Posted, Region, Scratch, Transport};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

/// A transport that accepts every post, delivers nothing, and records the posts' order: `S`
/// and `R` for sends and receives, `N` for owned sends (notices), `W` for owned receives (the
/// watch), `C` for cancellations, `T` for direct takes.
/// Its direct channel takes every message and delivers `reply` to every `take_now`; each
/// `send_now` records what `watch` holds at that moment. `peer_gone` says yes of the peers in
/// `gone` and records whether each question asked the address.
#[derive(Default)]
pub(super) struct Recorder {
    pub(super) caps: Caps,
    pub(super) posts: Mutex<Vec<char>>,
    pub(super) reply: Vec<u8>,
    pub(super) watch: Option<Region>,
    pub(super) seen: Mutex<Vec<Vec<u8>>>,
    pub(super) gone: Vec<Peer>,
    pub(super) asked: Mutex<Vec<(Peer, bool)>>,
}

impl Transport for Recorder {
    fn caps(&self) -> &Caps {
        &self.caps
    }
    fn address(&self) -> Vec<u8> {
        Vec::new()
    }
    fn insert_peer(&self, _: &[u8]) -> Result<Peer> {
        Ok(Peer(0))
    }
    fn register(&self, _: Region) -> Result<Mr> {
        Err(Error::Internal("no registration".into()))
    }
    fn send(&self, _: Peer, _: u64, _: Region, _: Option<&Mr>, _: OpId) -> Result<Posted> {
        self.posts.lock().push('S');
        Ok(Posted::Queued)
    }
    fn recv(&self, _: u64, _: u64, _: Region, _: Option<&Mr>, _: OpId) -> Result<Posted> {
        self.posts.lock().push('R');
        Ok(Posted::Queued)
    }
    fn send_owned(&self, _: Peer, _: u64, _: Vec<u8>, _: OpId) -> Result<()> {
        self.posts.lock().push('N');
        Ok(())
    }
    fn recv_owned(&self, _: u64, _: u64, _: usize, _: OpId) -> Result<()> {
        self.posts.lock().push('W');
        Ok(())
    }
    fn cancel(&self, _: OpId) {
        self.posts.lock().push('C');
    }
    fn poll(&self, _: &mut Vec<Completion>) -> Result<usize> {
        Ok(0)
    }
    fn wait(&self, _: Duration) -> Result<()> {
        Ok(())
    }
    fn peer_gone(&self, peer: Peer, ask_address: bool) -> bool {
        self.asked.lock().push((peer, ask_address));
        self.gone.contains(&peer)
    }
    fn direct_bytes(&self, _: Peer) -> usize {
        1 << 20
    }
    fn send_now(&self, _: Peer, _: u64, _: &[u8]) -> Result<bool> {
        self.posts.lock().push('S');
        if let Some(w) = self.watch {
            self.seen.lock().push(w.to_vec());
        }
        Ok(true)
    }
    fn take_now(
        &self,
        _: Peer,
        tag: u64,
        _: u64,
        f: &mut dyn FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<bool> {
        self.posts.lock().push('T');
        f(tag, &self.reply).map(|_| true)
    }
}

/// Rank 0's job of a float sum over `schedule`, the first collective of its communicator.
pub(super) fn rank0_job(
    schedule: Arc<algo::Schedule>,
    inp: &Scratch,
    out: &Scratch,
    sends_first: bool,
) -> Job {
    Job {
        schedule,
        rank: 0,
        args: Args {
            dtype: DataType::Float32,
            op: RedOp::Sum,
            // SAFETY: every test keeps both buffers alive until its executor is done.
            inp: unsafe { inp.region() },
            // SAFETY: as above.
            out: unsafe { out.region() },
            tags: Tags::Coll(0),
            timeout: Duration::from_secs(1).into(),
            sends_first,
            restore: true,
            signature: None,
            device: None,
        },
    }
}

/// The peers of the executor tests' 2-rank schedules.
pub(super) const PEERS: [Peer; 2] = [Peer(0), Peer(1)];

/// Rank 0 of a 2-rank ring AllReduce of 1024 floats, advanced once on `t`, and its buffers.
pub(super) fn ring_rank0(t: &Recorder, pool: &mut BufPool) -> (Box<Exec>, Scratch, Scratch) {
    let p = Problem::new(Collective::AllReduce, 2, 1024);
    let schedule = Arc::new(algo::build(p, Algorithm::Ring, &Options::default()).unwrap());
    let plan = Arc::new(Plan::new(&schedule, 0, 4).unwrap());
    let (inp, out) = (Scratch::new(4096), Scratch::new(4096));
    let mut x = Exec::new(rank0_job(schedule, &inp, &out, false), plan, 1, pool).unwrap();
    x.advance(t, &PEERS, pool).unwrap();
    (x, inp, out)
}

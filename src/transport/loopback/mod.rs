//! In-process transport: endpoints are objects in one process (ranks as threads), with the
//! semantics of a libfabric RDM endpoint: tagged messages matched in posted order, an
//! unexpected-message queue, truncation errors, cancellation, and a waitable completion queue;
//! and remote memory access between them (`rma`); device memory for tests (`hmem`).
use super::{Caps, Completion, Mr, OpId, Peer, Posted, Region, Transport};

mod hmem;
mod rma;
use crate::error::{Error, Result};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// A set of endpoints that can reach each other (one "fabric").
#[derive(Default)]
pub struct LoopbackFabric {
    endpoints: Mutex<HashMap<u64, Weak<Endpoint>>>,
    next: AtomicU64,
    /// The last RMA key given out (`rma`), unique on the fabric.
    next_key: AtomicU64,
    /// The device whose memory the fabric moves (`with_device`).
    mover: Option<Arc<hmem::Mover>>,
}

struct PostedRecv {
    tag: u64,
    ignore: u64,
    region: Option<Region>,
    /// The region is registered device memory: the mover writes it.
    device: bool,
    len: usize,
    op: OpId,
}

#[derive(Default)]
struct State {
    posted: VecDeque<PostedRecv>,
    unexpected: VecDeque<(u64, Vec<u8>)>,
    done: Vec<Completion>,
}

struct Endpoint {
    state: Mutex<State>,
    cv: Condvar,
    /// Registrations peers may write and read, by key (`rma`).
    mrs: Mutex<HashMap<u64, Region>>,
    mover: Option<Arc<hmem::Mover>>,
}

impl Endpoint {
    /// Deliver one message: into the oldest matching posted receive, else the unexpected queue.
    fn deliver(&self, tag: u64, data: Vec<u8>) {
        let mut st = self.state.lock();
        let pos = st
            .posted
            .iter()
            .position(|r| (r.tag | r.ignore) == (tag | r.ignore));
        match pos {
            Some(i) => {
                let r = st.posted.remove(i).expect("index from position");
                let c = complete_recv(r, tag, data, self.mover.as_deref());
                st.done.push(c);
            }
            None => st.unexpected.push_back((tag, data)),
        }
        drop(st);
        self.cv.notify_all();
    }
}

fn complete_recv(
    r: PostedRecv,
    tag: u64,
    data: Vec<u8>,
    mover: Option<&hmem::Mover>,
) -> Completion {
    if data.len() > r.len {
        return Completion {
            op: r.op,
            len: 0,
            tag,
            status: Err(Error::InvalidUsage(format!(
                "a message of {} bytes arrived for a receive buffer of {} bytes",
                data.len(),
                r.len
            ))),
            data: None,
        };
    }
    let len = data.len();
    let data = match (r.region, r.device, mover) {
        (Some(region), true, Some(m)) => {
            if let Err(e) = m.write(region, &data) {
                return Completion::failed(r.op, tag, e);
            }
            None
        }
        (Some(region), _, _) => {
            region.write(&data);
            None
        }
        (None, _, _) => Some(data),
    };
    Completion::done(r.op, len, tag, data)
}

/// One endpoint of a `LoopbackFabric`.
pub struct LoopbackTransport {
    fabric: Arc<LoopbackFabric>,
    id: u64,
    ep: Arc<Endpoint>,
    caps: Caps,
}

impl LoopbackFabric {
    pub fn new() -> Arc<LoopbackFabric> {
        Arc::new(LoopbackFabric::default())
    }

    /// A fabric whose endpoints offer "FI_HMEM" for `dev` (`hmem`): device memory of it
    /// registers where `registers` (else every registration of it fails, as a provider that
    /// advertises FI_HMEM and refuses it does), and moves through the device's copies.
    pub fn with_device(dev: crate::device::Device, registers: bool) -> Arc<LoopbackFabric> {
        Arc::new(LoopbackFabric {
            mover: Some(Arc::new(hmem::Mover::new(dev, registers))),
            ..LoopbackFabric::default()
        })
    }

    /// A new endpoint on this fabric.
    pub fn endpoint(self: &Arc<Self>) -> LoopbackTransport {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let ep = Arc::new(Endpoint {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
            mrs: Mutex::new(HashMap::new()),
            mover: self.mover.clone(),
        });
        self.endpoints.lock().insert(id, Arc::downgrade(&ep));
        LoopbackTransport {
            fabric: self.clone(),
            id,
            ep,
            caps: Caps {
                provider: "loopback".into(),
                fabric: "loopback".into(),
                domain: "loopback".into(),
                inject_size: 0,
                max_msg_size: usize::MAX,
                wait_fd: true,
                tx_size: 1024,
                rx_size: 1024,
                rma: true,
                rma_caps: Some(rma::CAPS),
                hmem: self.mover.is_some(),
                ..Default::default()
            },
        }
    }
}

impl Drop for LoopbackTransport {
    fn drop(&mut self) {
        self.fabric.endpoints.lock().remove(&self.id);
    }
}

impl LoopbackTransport {
    fn push(&self, c: Completion) {
        self.ep.state.lock().done.push(c);
        self.ep.cv.notify_all();
    }

    /// The endpoint of `peer`, or an error where it is closed.
    fn endpoint_of(&self, peer: Peer) -> Result<Arc<Endpoint>> {
        let dest = self
            .fabric
            .endpoints
            .lock()
            .get(&peer.0)
            .and_then(Weak::upgrade);
        dest.ok_or_else(|| Error::Remote(format!("loopback peer {} is closed", peer.0)))
    }

    fn send_bytes(&self, peer: Peer, tag: u64, data: Vec<u8>, op: OpId) {
        let len = data.len();
        let status = self.endpoint_of(peer).map(|d| d.deliver(tag, data));
        self.push(Completion {
            op,
            len,
            tag,
            status,
            data: None,
        });
    }

    fn post(&self, r: PostedRecv) {
        let mut st = self.ep.state.lock();
        let pos = st
            .unexpected
            .iter()
            .position(|(t, _)| (*t | r.ignore) == (r.tag | r.ignore));
        match pos {
            Some(i) => {
                let (tag, data) = st.unexpected.remove(i).expect("index from position");
                let c = complete_recv(r, tag, data, self.ep.mover.as_deref());
                st.done.push(c);
            }
            None => st.posted.push_back(r),
        }
    }
}

impl Transport for LoopbackTransport {
    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn address(&self) -> Vec<u8> {
        self.id.to_le_bytes().to_vec()
    }

    fn insert_peer(&self, addr: &[u8]) -> Result<Peer> {
        let id: [u8; 8] = addr.try_into().map_err(|_| {
            Error::arg(
                "addr",
                format!("a loopback address has 8 bytes, not {}", addr.len()),
            )
        })?;
        let id = u64::from_le_bytes(id);
        if self.fabric.endpoints.lock().contains_key(&id) {
            Ok(Peer(id))
        } else {
            Err(Error::Remote(format!("no loopback endpoint {id}")))
        }
    }

    fn register(&self, region: Region) -> Result<Mr> {
        Ok(Mr {
            desc: 0,
            region,
            keep: None,
            key: None,
            device: None,
        })
    }

    fn register_device(&self, region: Region, ordinal: i32) -> Result<Mr> {
        match &self.ep.mover {
            Some(m) => m.register(&self.caps.provider, region, ordinal),
            None => Err(Error::InvalidUsage(
                "loopback: this fabric does not register device memory".into(),
            )),
        }
    }

    fn register_remote(&self, region: Region) -> Result<Mr> {
        self.register_remote_region(region)
    }

    fn write(
        &self,
        peer: Peer,
        src: Region,
        _desc: usize,
        addr: u64,
        key: u64,
        op: OpId,
    ) -> Result<Posted> {
        self.rma(true, peer, src, addr, key, op);
        Ok(Posted::Queued)
    }

    fn write_inject(&self, peer: Peer, src: &[u8], addr: u64, key: u64) -> Result<Posted> {
        self.inject(peer, src, addr, key)?;
        Ok(Posted::Queued)
    }

    fn read(
        &self,
        peer: Peer,
        dst: Region,
        _desc: usize,
        addr: u64,
        key: u64,
        op: OpId,
    ) -> Result<Posted> {
        self.rma(false, peer, dst, addr, key, op);
        Ok(Posted::Queued)
    }

    fn send(
        &self,
        peer: Peer,
        tag: u64,
        region: Region,
        mr: Option<&Mr>,
        op: OpId,
    ) -> Result<Posted> {
        let data = match (&self.ep.mover, mr.is_some_and(|m| m.device.is_some())) {
            (Some(m), true) => m.read(region)?,
            _ => region.to_vec(),
        };
        self.send_bytes(peer, tag, data, op);
        Ok(Posted::Queued)
    }

    fn recv(
        &self,
        tag: u64,
        ignore: u64,
        region: Region,
        mr: Option<&Mr>,
        op: OpId,
    ) -> Result<Posted> {
        self.post(PostedRecv {
            tag,
            ignore,
            region: Some(region),
            device: mr.is_some_and(|m| m.device.is_some()),
            len: region.len(),
            op,
        });
        Ok(Posted::Queued)
    }

    fn send_owned(&self, peer: Peer, tag: u64, data: Vec<u8>, op: OpId) -> Result<()> {
        self.send_bytes(peer, tag, data, op);
        Ok(())
    }

    fn recv_owned(&self, tag: u64, ignore: u64, len: usize, op: OpId) -> Result<()> {
        self.post(PostedRecv {
            tag,
            ignore,
            region: None,
            device: false,
            len,
            op,
        });
        Ok(())
    }

    fn cancel(&self, op: OpId) {
        let mut st = self.ep.state.lock();
        if let Some(i) = st.posted.iter().position(|r| r.op == op) {
            st.posted.remove(i);
            st.done.push(Completion {
                op,
                len: 0,
                tag: 0,
                status: Err(Error::InvalidUsage("operation cancelled".into())),
                data: None,
            });
        }
    }

    fn poll(&self, out: &mut Vec<Completion>) -> Result<usize> {
        let mut st = self.ep.state.lock();
        let n = st.done.len();
        out.append(&mut st.done);
        Ok(n)
    }

    fn wait(&self, timeout: Duration) -> Result<()> {
        let mut st = self.ep.state.lock();
        if st.done.is_empty() {
            self.ep.cv.wait_for(&mut st, timeout);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(v: &mut [u8]) -> Region {
        // SAFETY: the vectors outlive every operation in these tests, which complete before
        // the vectors are dropped.
        unsafe { Region::from_raw(v.as_mut_ptr(), v.len()) }
    }

    fn drain(t: &LoopbackTransport) -> Vec<Completion> {
        let mut v = Vec::new();
        t.poll(&mut v).unwrap();
        v
    }

    #[test]
    fn matches_in_posted_order_and_queues_unexpected() {
        let f = LoopbackFabric::new();
        let (a, b) = (f.endpoint(), f.endpoint());
        let pb = a.insert_peer(&b.address()).unwrap();
        let mut m1 = vec![1u8; 4];
        let mut m2 = vec![2u8; 4];
        a.send(pb, 7, region(&mut m1), None, 1).unwrap();
        a.send(pb, 7, region(&mut m2), None, 2).unwrap();
        let mut r1 = vec![0u8; 8];
        let mut r2 = vec![0u8; 8];
        b.recv(7, 0, region(&mut r1), None, 10).unwrap();
        b.recv(7, 0, region(&mut r2), None, 11).unwrap();
        let done = drain(&b);
        assert_eq!(done.len(), 2);
        assert_eq!((done[0].op, done[0].len), (10, 4));
        assert_eq!(&r1[..4], &[1, 1, 1, 1]);
        assert_eq!(&r2[..4], &[2, 2, 2, 2]);
        assert_eq!(drain(&a).len(), 2);
    }

    #[test]
    fn truncation_is_an_error_and_cancel_completes() {
        let f = LoopbackFabric::new();
        let (a, b) = (f.endpoint(), f.endpoint());
        let pb = a.insert_peer(&b.address()).unwrap();
        let mut small = vec![0u8; 2];
        b.recv(1, 0, region(&mut small), None, 5).unwrap();
        let mut big = vec![9u8; 16];
        a.send(pb, 1, region(&mut big), None, 6).unwrap();
        let done = drain(&b);
        assert!(done[0]
            .status
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("16 bytes arrived for a receive buffer of 2 bytes"));
        b.recv(2, 0, region(&mut small), None, 8).unwrap();
        b.cancel(8);
        assert!(drain(&b)[0].status.is_err());
        assert!(a.insert_peer(&[1, 2, 3]).is_err());
    }
}

//! Remote memory access for Neuron's tables: the key of a registration, and writes and reads of
//! a peer's registered memory at its virtual addresses. A write goes out on a send comm to its
//! receiver, a read on a receive comm from its connector. Requests complete through `test`.
use super::wire::op;
use super::*;
use crate::plugin::RmaProps;

impl Device {
    fn rma(&self) -> Result<RmaProps> {
        self.props.rma.ok_or_else(|| {
            Error::System(format!(
                "RMA is not supported on device {} (rma_supported = 0): the provider offers no \
                 RMA usable by virtual address",
                self.index
            ))
        })
    }

    /// The key peers use to reach registration `mh` (`getMrKey`).
    pub fn mr_key(&self, mh: u64) -> Result<u64> {
        self.rma()?;
        let st = self.st.lock();
        let r = st.mrs.get(mh).ok_or_else(|| {
            Error::arg(
                "mhandle",
                format!("{mh:#x} is not a registration of this device"),
            )
        })?;
        st.cache
            .mr(r)
            .and_then(|m| m.key)
            .ok_or_else(|| Error::System("the registration has no remote key".into()))
    }

    /// Nothing posted (the transport or the comm is full): progress, so that the caller's next
    /// try can succeed, and tell it to call again. A post that went through needs no progress
    /// of its own: `test` drives it (one completion-queue read per operation fewer, which on
    /// tcp is a socket poll).
    fn busy(&self, st: &mut State) -> Result<Option<u64>> {
        self.progress(st)?;
        Ok(None)
    }

    /// The peer of send or receive comm `comm`, with the comm's in-flight count.
    fn rma_peer(st: &mut State, comm: u64, write: bool) -> Result<(Peer, &mut usize)> {
        if write {
            let c = st.sends.get_mut(comm).ok_or_else(|| {
                Error::arg("sComm", format!("{comm:#x} is not an open send comm"))
            })?;
            Ok((c.peer, &mut c.inflight))
        } else {
            let c = st.recvs.get_mut(comm).ok_or_else(|| {
                Error::arg("rComm", format!("{comm:#x} is not an open receive comm"))
            })?;
            Ok((c.peer, &mut c.inflight))
        }
    }

    /// `iwrite` (write) or `iread` (read) of `local` against the peer's memory at `addr`;
    /// `Ok(None)` when the transport is busy (libnccom calls again).
    pub fn rma_op(
        &self,
        comm: u64,
        write: bool,
        local: Region,
        mh: u64,
        addr: u64,
        key: u64,
    ) -> Result<Option<u64>> {
        self.rma()?;
        self.check_size(local.len())?;
        let mut st = self.st.lock();
        Self::rma_peer(&mut st, comm, write)?;
        let what = if write { "src_mhandle" } else { "dest_mhandle" };
        let mr = self.lookup_mr(&st, mh, local, what)?;
        let desc = mr
            .as_ref()
            .and_then(|r| st.cache.mr(r))
            .map_or(0, |m| m.desc);
        let t = self.transport(&mut st)?;
        let (peer, inflight) = Self::rma_peer(&mut st, comm, write)?;
        let cap = if write { SEND_CAPACITY } else { RECV_CAPACITY };
        if *inflight >= cap {
            return self.busy(&mut st);
        }
        let h = new_handle(self.index, Kind::Request);
        let posted = if write {
            t.write(peer, local, desc, addr, key, op(h, 0))?
        } else {
            t.read(peer, local, desc, addr, key, op(h, 0))?
        };
        if posted == Posted::Busy {
            return self.busy(&mut st);
        }
        *inflight += 1;
        st.reqs.insert_at(h, Request::new(comm, write, 1));
        Ok(Some(h))
    }

    /// `iwriteInline`: `src` goes out at once and may be reused; the request is done already.
    pub fn iwrite_inline(&self, comm: u64, src: &[u8], addr: u64, key: u64) -> Result<Option<u64>> {
        let rma = self.rma()?;
        if src.len() > rma.inline_bytes {
            return Err(Error::arg(
                "size",
                format!(
                    "{} bytes is more than max_write_inline_size ({})",
                    src.len(),
                    rma.inline_bytes
                ),
            ));
        }
        let mut st = self.st.lock();
        Self::rma_peer(&mut st, comm, true)?;
        let t = self.transport(&mut st)?;
        let (peer, inflight) = Self::rma_peer(&mut st, comm, true)?;
        if *inflight >= SEND_CAPACITY || t.write_inject(peer, src, addr, key)? == Posted::Busy {
            return self.busy(&mut st);
        }
        *inflight += 1;
        let h = new_handle(self.index, Kind::Request);
        let mut req = Request::new(comm, true, 1);
        req.left = 0;
        req.subs[0].done = true;
        req.subs[0].size = src.len();
        st.reqs.insert_at(h, req);
        Ok(Some(h))
    }
}

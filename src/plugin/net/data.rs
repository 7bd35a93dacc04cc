//! The data path: memory registration, `isend` / `irecv` / `iflush` with NCCL's matching
//! rules, `test`, and closing the send and receive comms.
use super::wire::*;
use super::*;
use crate::transport::DmaBuf;

impl Device {
    fn check_comm(st: &State, comm: u64) -> Result<()> {
        if st.sends.contains(comm) || st.recvs.contains(comm) {
            Ok(())
        } else {
            Err(Error::arg("comm", format!("{comm:#x} is not an open comm")))
        }
    }

    /// Register host memory for use on `comm`'s device (and, where the device offers RMA, for
    /// peers' writes and reads), or device memory where the device takes it (`plugin::gpu`).
    pub fn reg_mr(&self, comm: u64, region: Region, ptr_type: i32) -> Result<u64> {
        let ordinal = std::cell::Cell::new(None);
        let h = self.reg_mr_with(comm, region, ptr_type, || {
            let o = crate::plugin::gpu::device_of(&region)?;
            ordinal.set(Some(o));
            Ok(o)
        })?;
        if let Some(o) = ordinal.get() {
            use crate::cuda::caps::Flush;
            let how = crate::plugin::gpu::flush_method(self.props.ptr_support, o);
            if how == Flush::SentinelRead {
                // Now, while no kernel of NCCL's waits on a flush (see `gpu::Sentinel`).
                if let Err(e) = crate::plugin::gpu::prepare_flush(o) {
                    log::warn!("regMr: device {o}: flushes not made ready ({e}); the first flush tries again");
                }
            }
        }
        Ok(h)
    }

    /// `regMrDmaBuf`: `reg_mr`, with the NCCL_PTR_CUDA buffer named by the dma-buf `fd` that
    /// exports it (`offset`: where the buffer starts in it). Only where ptrSupport has
    /// NCCL_PTR_DMABUF; a host buffer, or a negative fd, is registered as `reg_mr` does.
    pub fn reg_mr_dmabuf(
        &self,
        comm: u64,
        region: Region,
        ptr_type: i32,
        offset: u64,
        fd: i32,
    ) -> Result<u64> {
        if ptr_type != crate::plugin::NCCL_PTR_CUDA || fd < 0 {
            return self.reg_mr(comm, region, ptr_type);
        }
        self.reg_mr_dmabuf_with(comm, region, DmaBuf { fd, offset }, || {
            crate::plugin::gpu::device_of(&region)
        })
    }

    /// `reg_mr_dmabuf` of device memory, with `ordinal_of` saying whose it is.
    pub fn reg_mr_dmabuf_with(
        &self,
        comm: u64,
        region: Region,
        buf: DmaBuf,
        ordinal_of: impl FnOnce() -> Result<i32>,
    ) -> Result<u64> {
        let support = self.props.ptr_support;
        if support & crate::cuda::caps::PTR_DMABUF == 0 {
            return Err(Error::arg(
                "fd",
                format!(
                    "a dma-buf: this device does not take them (ptrSupport {support:#x} has no \
                     NCCL_PTR_DMABUF; the log says why)"
                ),
            ));
        }
        let ordinal =
            crate::plugin::gpu::memory_kind(crate::plugin::NCCL_PTR_CUDA, support, ordinal_of)?
                .expect("NCCL_PTR_CUDA is device memory");
        let h = self.register_on(comm, region, |st, t| {
            st.cache.register_dmabuf(t, region, ordinal, buf)
        })?;
        Ok(h)
    }

    /// `reg_mr`, with `ordinal_of` saying whose device memory an NCCL_PTR_CUDA buffer is.
    pub fn reg_mr_with(
        &self,
        comm: u64,
        region: Region,
        ptr_type: i32,
        ordinal_of: impl FnOnce() -> Result<i32>,
    ) -> Result<u64> {
        if self.flavour == Flavour::Neuron && ptr_type == crate::plugin::NCCL_PTR_NEURON {
            return Err(Error::InvalidUsage(
                "regMr: Neuron device memory (type 4) cannot be registered: the provider has no \
                 FI_HMEM_NEURON support here (ptrSupport is NCCL_PTR_HOST only)"
                    .into(),
            ));
        }
        let device = crate::plugin::gpu::memory_kind(ptr_type, self.props.ptr_support, ordinal_of)?;
        let remote = self.props.rma.is_some();
        self.register_on(comm, region, |st, t| match device {
            Some(ordinal) => st.cache.register_device(t, region, ordinal),
            None => st.cache.register(t, region, remote),
        })
    }

    /// A registration of `region` on `comm`'s device by `register` (through the cache), as a
    /// new handle; the size is checked first.
    fn register_on(
        &self,
        comm: u64,
        region: Region,
        register: impl FnOnce(&mut State, &dyn Transport) -> Result<MrRef>,
    ) -> Result<u64> {
        if region.len() > 1 << 40 {
            return Err(Error::arg(
                "size",
                format!("{} bytes is more than 1 TiB", region.len()),
            ));
        }
        let mut st = self.st.lock();
        Self::check_comm(&st, comm)?;
        let t = self.transport(&mut st)?;
        let r = register(&mut st, &*t)?;
        let h = new_handle(self.index, Kind::Mr);
        st.mrs.insert_at(h, r);
        Ok(h)
    }

    pub fn dereg_mr(&self, comm: u64, mh: u64) -> Result<()> {
        let mut st = self.st.lock();
        Self::check_comm(&st, comm)?;
        let r = st.mrs.remove(mh).ok_or_else(|| {
            Error::arg(
                "mhandle",
                format!("{mh:#x} is not a registration of this device"),
            )
        })?;
        st.cache.deregister(r)
    }

    pub(super) fn lookup_mr(
        &self,
        st: &State,
        mh: u64,
        region: Region,
        what: &str,
    ) -> Result<Option<MrRef>> {
        if mh == 0 {
            if st.t.as_ref().is_some_and(|t| t.caps().mr_local) && !region.is_empty() {
                return Err(Error::arg(
                    what,
                    "NULL, but the provider needs registered memory (call regMr)",
                ));
            }
            return Ok(None);
        }
        let r = st.mrs.get(mh).ok_or_else(|| {
            Error::arg(
                what,
                format!("{mh:#x} is not a registration of this device"),
            )
        })?;
        if !r.region.contains(&region) {
            return Err(Error::arg(
                what,
                "the buffer is not inside the registered memory",
            ));
        }
        Ok(Some(*r))
    }

    pub(super) fn check_size(&self, len: usize) -> Result<()> {
        if len > self.props.max_p2p_bytes {
            return Err(Error::arg(
                "size",
                format!(
                    "{len} bytes is more than maxP2pBytes ({})",
                    self.props.max_p2p_bytes
                ),
            ));
        }
        Ok(())
    }

    fn check_tag(tag: i32) -> Result<u32> {
        if !(0..=MAX_TAG).contains(&tag) {
            return Err(Error::arg("tag", format!("{tag} is outside 0..={MAX_TAG}")));
        }
        Ok(tag as u32)
    }

    /// Post a send; `Ok(None)` when the plugin cannot take more now (NCCL retries).
    pub fn isend(&self, comm: u64, region: Region, tag: i32, mh: u64) -> Result<Option<u64>> {
        let tag = Self::check_tag(tag)?;
        self.check_size(region.len())?;
        let mut st = self.st.lock();
        if !st.sends.contains(comm) {
            return Err(Error::arg(
                "sendComm",
                format!("{comm:#x} is not an open send comm"),
            ));
        }
        self.progress(&mut st)?;
        let mr = self.lookup_mr(&st, mh, region, "mhandle")?;
        let t = self.transport(&mut st)?;
        let c = st.sends.get_mut(comm).expect("checked above");
        if c.inflight >= SEND_CAPACITY {
            return Ok(None);
        }
        let seq = *c.seq.get(&tag).unwrap_or(&0);
        let wtag = wire_tag(KIND_DATA, c.remote, tag, seq);
        let peer = c.peer;
        // A large message on a striped comm: the head here, the other pieces on the helpers.
        let piece = super::stripe::piece_len(region.len(), c.stripes.len() + 1);
        let (head, htag) = match piece {
            Some(p) => (
                region
                    .sub(0, p)
                    .expect("a piece is shorter than its message"),
                wtag | KIND_STRIPE << 61,
            ),
            None => (region, wtag),
        };
        let h = new_handle(self.index, Kind::Request);
        let mrobj = mr.as_ref().and_then(|r| st.cache.mr(r));
        match t.send(peer, htag, head, mrobj, op(h, 0))? {
            Posted::Busy => {
                let c = st.sends.get_mut(comm).expect("checked above");
                let since = *c.busy_since.get_or_insert_with(Instant::now);
                if self.timed_out(since) {
                    c.busy_since = None;
                    return Err(Error::Timeout(format!(
                        "isend: the transport refused every send to this peer for {} ms \
                         (FABRICOLL_TIMEOUT_MS): is the peer alive?",
                        self.ms()
                    )));
                }
                Ok(None)
            }
            Posted::Queued => {
                let c = st.sends.get_mut(comm).expect("checked above");
                c.busy_since = None;
                c.seq.insert(tag, seq.wrapping_add(1));
                c.inflight += 1;
                let mut req = Request::new(comm, true, 1);
                if let Some(p) = piece {
                    let peers = c.stripes.clone();
                    req.subs[0].parts = peers.len();
                    if let Err(e) =
                        super::stripe::post_send_pieces(&mut st, h, &peers, wtag, region, p)
                    {
                        req.error = Some(e);
                    }
                }
                st.reqs.insert_at(h, req);
                Ok(Some(h))
            }
        }
    }

    /// Post a grouped receive of `bufs` (region, tag, mhandle); one request for all.
    pub fn irecv(&self, comm: u64, bufs: &[(Region, i32, u64)]) -> Result<Option<u64>> {
        if bufs.is_empty() || bufs.len() > MAX_RECVS {
            return Err(Error::arg(
                "n",
                format!("{} is outside 1..={MAX_RECVS} (maxRecvs)", bufs.len()),
            ));
        }
        let mut tags = [0u32; MAX_RECVS];
        for (i, (region, tag, _)) in bufs.iter().enumerate() {
            tags[i] = Self::check_tag(*tag)?;
            self.check_size(region.len())?;
        }
        let mut st = self.st.lock();
        if !st.recvs.contains(comm) {
            return Err(Error::arg(
                "recvComm",
                format!("{comm:#x} is not an open receive comm"),
            ));
        }
        self.progress(&mut st)?;
        let mut mrs = [None; MAX_RECVS];
        for (i, (region, _, mh)) in bufs.iter().enumerate() {
            mrs[i] = self.lookup_mr(&st, *mh, *region, "mhandles")?;
        }
        let t = self.transport(&mut st)?;
        let c = st.recvs.get_mut(comm).expect("checked above");
        if c.inflight >= RECV_CAPACITY {
            return Ok(None);
        }
        // Number the messages now: a receive posted later still gets the right one.
        let id = c.id;
        let ignore = super::stripe::recv_ignore(c.streams);
        let mut wtags = [0u64; MAX_RECVS];
        let mut next = c.seq.clone();
        for (i, tag) in tags.iter().take(bufs.len()).enumerate() {
            let s = next.entry(*tag).or_insert(0);
            wtags[i] = wire_tag(KIND_DATA, id, *tag, *s);
            *s = s.wrapping_add(1);
        }
        let h = new_handle(self.index, Kind::Request);
        let mut req = Request::new(comm, false, bufs.len());
        for (i, (region, _, _)) in bufs.iter().enumerate() {
            let d = Deferred {
                tag: wtags[i],
                ignore,
                region: *region,
                mr: mrs[i],
            };
            if ignore != 0 {
                req.subs[i].stripe_buf = Some(*region);
            }
            let posted = if req.subs[..i].iter().any(|s| s.deferred.is_some()) {
                Posted::Busy // keep posting order: once one waits, the rest wait behind it
            } else {
                t.recv(
                    d.tag,
                    d.ignore,
                    d.region,
                    d.mr.as_ref().and_then(|r| st.cache.mr(r)),
                    op(h, i as u64),
                )?
            };
            if posted == Posted::Busy {
                if i == 0 {
                    return Ok(None); // nothing posted: NCCL retries
                }
                req.subs[i].deferred = Some(d);
                st.deferred.push_back((h, i));
            }
        }
        let c = st.recvs.get_mut(comm).expect("checked above");
        c.seq = next;
        c.inflight += 1;
        st.reqs.insert_at(h, req);
        Ok(Some(h))
    }

    /// Flush received data (`bufs`: the receive's buffers, sizes and registrations) to the
    /// consumer: nothing to do for host memory; for device memory the device's flush
    /// (`plugin::gpu::flush`), done before this returns. Either way it completes at once and
    /// no request is returned. The buffers and their registrations are checked as a receive's
    /// are: a flush of memory that was never registered is the caller's error.
    pub fn iflush(&self, comm: u64, bufs: &[(Region, i32, u64)]) -> Result<Option<u64>> {
        let n = bufs.len();
        if !(1..=MAX_RECVS).contains(&n) {
            return Err(Error::arg("n", format!("{n} is outside 1..={MAX_RECVS}")));
        }
        let mut st = self.st.lock();
        if !st.recvs.contains(comm) {
            return Err(Error::arg(
                "recvComm",
                format!("{comm:#x} is not an open receive comm"),
            ));
        }
        for (region, _, mh) in bufs {
            self.lookup_mr(&st, *mh, *region, "mhandles")?;
        }
        if self.flavour == Flavour::Nccl {
            // One flush orders every write so far: the first device buffer that got data.
            let target = bufs
                .iter()
                .filter(|(r, _, _)| !r.is_empty())
                .find_map(|(r, _, mh)| {
                    let m = st.cache.mr(st.mrs.get(*mh)?)?;
                    m.device.map(|o| (o, *r))
                });
            drop(st);
            if let Some((ordinal, region)) = target {
                let how = crate::plugin::gpu::flush_method(self.props.ptr_support, ordinal);
                crate::plugin::gpu::flush(how, ordinal, &region)?;
            }
            return Ok(None); // NCCL: no request, nothing to wait for
        }
        // libnccom reads a NULL request as "busy, call again": hand it one that is done.
        let h = new_handle(self.index, Kind::Request);
        let mut req = Request::new(comm, false, n);
        req.left = 0;
        for s in req.subs.iter_mut() {
            s.done = true;
        }
        st.recvs.get_mut(comm).expect("checked above").inflight += 1;
        st.reqs.insert_at(h, req);
        Ok(Some(h))
    }

    /// Poll a request: `Ok(Some(..))` once finished (the request is then gone).
    pub fn test(&self, req: u64) -> Result<Option<Finished>> {
        let mut st = self.st.lock();
        if !st.reqs.contains(req) {
            return Err(Error::arg(
                "request",
                format!("{req:#x} is not a pending request (finished, or its comm closed)"),
            ));
        }
        // Under NCCL, a request finished by an earlier call's progress is reported without
        // another: each progress polls the provider (a system call over the socket providers),
        // and NCCL tests its requests one after the other. libnccom polls finished requests
        // (iflush's) to drive progress, so the Neuron flavour always progresses.
        let r = st.reqs.get(req).expect("checked above");
        if self.flavour != Flavour::Nccl || (r.error.is_none() && r.left > 0) {
            self.progress(&mut st)?;
        }
        let r = st.reqs.get(req).expect("checked above");
        let outcome = if let Some(e) = &r.error {
            Some(Err(e.clone()))
        } else if r.left == 0 {
            let mut f = Finished {
                n: r.n,
                sizes: [0; MAX_RECVS],
            };
            for (i, s) in r.subs.iter().take(r.n).enumerate() {
                f.sizes[i] = s.size;
            }
            Some(Ok(f))
        } else if self.timed_out(r.last) {
            Some(Err(Error::Timeout(format!(
                "{} request made no progress for {} ms (FABRICOLL_TIMEOUT_MS): is the peer alive?",
                if r.send { "send" } else { "receive" },
                self.ms()
            ))))
        } else {
            None
        };
        match outcome {
            None => {
                let idle = st.idle;
                drop(st);
                self.polite(idle);
                Ok(None)
            }
            Some(res) => {
                let r = st.reqs.remove(req).expect("present");
                retire(&mut st, req, &r);
                res.map(Some)
            }
        }
    }

    pub fn close_send(&self, comm: u64) -> Result<()> {
        let mut st = self.st.lock();
        let c = st
            .sends
            .remove(comm)
            .ok_or_else(|| Error::arg("sendComm", format!("{comm:#x} is not an open send comm")))?;
        // Sends cannot be cancelled: their completions are dropped when they arrive.
        for h in requests_of(&st, comm) {
            st.reqs.remove(h);
            st.stripes.drop_request(h);
        }
        st.ids.free(c.id);
        self.progress(&mut st)?;
        Ok(())
    }

    pub fn close_recv(&self, comm: u64) -> Result<()> {
        let mut st = self.st.lock();
        let c = st.recvs.remove(comm).ok_or_else(|| {
            Error::arg("recvComm", format!("{comm:#x} is not an open receive comm"))
        })?;
        for h in requests_of(&st, comm) {
            let r = st.reqs.remove(h).expect("listed");
            st.stripes.drop_request(h);
            if let Some(t) = &st.t {
                for (i, s) in r.subs.iter().take(r.n).enumerate() {
                    if !s.done && s.deferred.is_none() {
                        t.cancel(op(h, i as u64));
                    }
                }
            }
        }
        st.ids.free(c.id);
        self.progress(&mut st)?;
        Ok(())
    }
}

/// The requests of `comm`, to drop when it closes.
fn requests_of(st: &State, comm: u64) -> Vec<u64> {
    st.reqs
        .iter()
        .filter(|(_, r)| r.comm == comm)
        .map(|(h, _)| h)
        .collect()
}

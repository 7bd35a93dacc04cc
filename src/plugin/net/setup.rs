//! Connection setup, never blocking: `listen` publishes a handle; `connect` and `accept` are
//! state machines that NCCL calls again until they return a comm (the connect request and its
//! answer travel as tagged messages, see `wire`); `close_listen`.
use super::wire::*;
use super::*;

impl Device {
    pub fn listen(&self) -> Result<([u8; HANDLE_SIZE], u64)> {
        let mut st = self.st.lock();
        let t = self.transport(&mut st)?;
        let addr = t.address();
        if addr.is_empty() || addr.len() > MAX_ADDR {
            return Err(Error::System(format!(
                "endpoint address of {} bytes does not fit the {HANDLE_SIZE}-byte handle",
                addr.len()
            )));
        }
        let id = st.ids.alloc()?;
        let h = new_handle(self.index, Kind::Listen);
        if let Err(e) = t.recv_owned(
            wire_tag(KIND_CONNECT, id, 0, 0),
            LOW_BITS,
            CTRL_LEN,
            op(h, SUB_LISTEN),
        ) {
            st.ids.free(id);
            return Err(e);
        }
        st.listens.insert_at(
            h,
            Listen {
                id,
                queue: VecDeque::new(),
                first_accept: None,
            },
        );
        let mut out = [0u8; HANDLE_SIZE];
        out[0..4].copy_from_slice(HANDLE_MAGIC);
        out[4..6].copy_from_slice(&HANDLE_VERSION.to_le_bytes());
        out[6..8].copy_from_slice(&(addr.len() as u16).to_le_bytes());
        out[8..12].copy_from_slice(&id.to_le_bytes());
        out[HANDLE_ADDR_OFF..HANDLE_ADDR_OFF + addr.len()].copy_from_slice(&addr);
        Ok((out, h))
    }

    /// One step of connecting: `Ok(None)` until the listener has answered.
    pub fn connect(&self, handle: &mut [u8; HANDLE_SIZE]) -> Result<Option<u64>> {
        let view = parse_handle(handle)?;
        let mut st = self.st.lock();
        let t = self.transport(&mut st)?;
        if view.state == 0 {
            let peer = t.insert_peer(&view.addr)?;
            // Helper endpoints to offer the listener (`stripe`); it answers with as many of its
            // own, at most this many.
            let streams = self.stream_count(&*t);
            st.stripes.ensure(streams, &self.open)?;
            let id = st.ids.alloc()?;
            let ph = new_handle(self.index, Kind::Pending);
            if let Err(e) = t.recv_owned(
                wire_tag(KIND_ACK, id, 0, 0),
                LOW_BITS,
                CTRL_LEN,
                op(ph, SUB_ACK),
            ) {
                st.ids.free(id);
                return Err(e);
            }
            let mine = t.address();
            let mut req = Vec::with_capacity(CTRL_LEN);
            req.extend_from_slice(REQ_MAGIC);
            req.extend_from_slice(&id.to_le_bytes());
            req.extend_from_slice(&(mine.len() as u16).to_le_bytes());
            req.extend_from_slice(&mine);
            req.push((streams - 1) as u8);
            t.send_owned(
                peer,
                wire_tag(KIND_CONNECT, view.listen_id, 0, 0),
                req,
                op(ph, SUB_CTRL_SEND),
            )?;
            st.pendings.insert_at(
                ph,
                Pending {
                    id,
                    peer,
                    started: Instant::now(),
                    result: None,
                },
            );
            set_handle_state(handle, ph);
            self.progress(&mut st)?;
            return Ok(None);
        }
        let ph = view.state;
        if !st.pendings.contains(ph) {
            return Err(Error::arg(
                "handle",
                "carries the state of a connect this device does not know",
            ));
        }
        self.progress(&mut st)?;
        let p = st.pendings.get_mut(ph).expect("checked above");
        let outcome = match p.result.take() {
            Some(r) => Some(r),
            None if self.timed_out(p.started) => Some(Err(Error::Timeout(format!(
                "connect: the listener did not answer within {} ms (FABRICOLL_TIMEOUT_MS)",
                self.ms()
            )))),
            None => None,
        };
        let idle = st.idle;
        match outcome {
            None => {
                drop(st);
                self.polite(idle);
                Ok(None)
            }
            Some(r) => {
                let p = st.pendings.remove(ph).expect("present");
                set_handle_state(handle, 0);
                let r = r.and_then(|(remote, addrs)| {
                    let asked = self.stream_count(&*t) - 1;
                    if addrs.len() > asked.min(st.stripes.count()) {
                        return Err(Error::Remote(format!(
                            "the listener answered with {} stripe endpoints; {asked} were offered",
                            addrs.len()
                        )));
                    }
                    let peers = addrs
                        .iter()
                        .enumerate()
                        .map(|(i, a)| st.stripes.insert_peer(i, a))
                        .collect::<Result<Vec<Peer>>>()?;
                    Ok((remote, peers))
                });
                match r {
                    Ok((remote, stripes)) => {
                        let h = new_handle(self.index, Kind::Send);
                        st.sends.insert_at(
                            h,
                            SendComm {
                                id: p.id,
                                remote,
                                peer: p.peer,
                                seq: HashMap::new(),
                                inflight: 0,
                                busy_since: None,
                                stripes,
                            },
                        );
                        Ok(Some(h))
                    }
                    Err(e) => {
                        t.cancel(op(ph, SUB_ACK));
                        st.ids.free(p.id);
                        Err(e)
                    }
                }
            }
        }
    }

    /// One step of accepting on `listen`: `Ok(None)` until a connector arrives.
    pub fn accept(&self, listen: u64) -> Result<Option<u64>> {
        let mut st = self.st.lock();
        if !st.listens.contains(listen) {
            return Err(Error::arg("listenComm", "not an open listen comm"));
        }
        self.progress(&mut st)?;
        let t = self.transport(&mut st)?;
        let l = st.listens.get_mut(listen).expect("checked above");
        let first = *l.first_accept.get_or_insert_with(Instant::now);
        let Some((remote, addr, theirs)) = l.queue.pop_front() else {
            if self.timed_out(first) {
                l.first_accept = None;
                return Err(Error::Timeout(format!(
                    "accept: no connect arrived within {} ms (FABRICOLL_TIMEOUT_MS)",
                    self.ms()
                )));
            }
            let idle = st.idle;
            drop(st);
            self.polite(idle);
            return Ok(None);
        };
        l.first_accept = None;
        let peer = t.insert_peer(&addr)?;
        // Stripe over as many endpoints as both sides have (`stripe`): mismatched settings work.
        let helpers = (self.stream_count(&*t) - 1).min(theirs);
        st.stripes.ensure(helpers + 1, &self.open)?;
        let addrs: Vec<Vec<u8>> = (0..helpers).map(|i| st.stripes.address(i)).collect();
        let ack = connect_answer(0, &addrs)?;
        let id = st.ids.alloc()?;
        let h = new_handle(self.index, Kind::Recv);
        let mut ack = ack;
        ack[4..8].copy_from_slice(&id.to_le_bytes());
        if let Err(e) = t.send_owned(
            peer,
            wire_tag(KIND_ACK, remote, 0, 0),
            ack,
            op(h, SUB_CTRL_SEND),
        ) {
            st.ids.free(id);
            return Err(e);
        }
        st.recvs.insert_at(
            h,
            RecvComm {
                id,
                peer,
                seq: HashMap::new(),
                inflight: 0,
                streams: helpers + 1,
            },
        );
        Ok(Some(h))
    }

    pub fn close_listen(&self, listen: u64) -> Result<()> {
        let mut st = self.st.lock();
        let l = st
            .listens
            .remove(listen)
            .ok_or_else(|| Error::arg("listenComm", "not an open listen comm"))?;
        if let Some(t) = &st.t {
            t.cancel(op(listen, SUB_LISTEN));
        }
        st.ids.free(l.id);
        self.progress(&mut st)?;
        Ok(())
    }
}

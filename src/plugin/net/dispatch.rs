//! Completion dispatch: each completion the transport reports goes to the listen, pending
//! connect, or request it belongs to; receives deferred while the transport was busy are posted.
use super::wire::*;
use super::*;

pub(super) fn is_cancel(e: &Error) -> bool {
    matches!(e, Error::InvalidUsage(m) if m.contains("cancelled"))
}

pub(super) fn dispatch(st: &mut State, t: &dyn Transport, c: Completion) {
    let h = c.op >> 4;
    let sub = c.op & 0xf;
    match (crate::plugin::handle_kind(h), sub) {
        (k, s) if k == Kind::Request as u8 && (s as usize) < MAX_RECVS => {
            let Some(r) = st.reqs.get_mut(h) else { return };
            r.last = Instant::now();
            let i = s as usize;
            let s = &mut r.subs[i];
            match c.status {
                Ok(()) if !s.head => {
                    s.head = true;
                    s.size += c.len;
                    if s.stripe_buf.is_some() && c.tag & KIND_BITS == KIND_STRIPE << 61 {
                        // A striped head: its pieces come over the helpers (`stripe`).
                        let data = c.tag & !KIND_BITS;
                        super::stripe::post_receive_pieces(st, h, i, data, c.len);
                        return;
                    }
                    if s.parts == 0 {
                        s.done = true;
                        r.left -= 1;
                    }
                }
                Ok(()) => {}
                // We cancel only requests we have already dropped: a cancellation reaching a
                // live request came from the provider (rxm does this when a peer's connection
                // is lost).
                Err(e) if is_cancel(&e) => {
                    r.error.get_or_insert(Error::Remote(
                        "the provider aborted the operation (connection to the peer lost)".into(),
                    ));
                }
                Err(e) => {
                    r.error.get_or_insert(e);
                }
            }
        }
        (k, SUB_LISTEN) if k == Kind::Listen as u8 => {
            let Some(l) = st.listens.get_mut(h) else {
                return;
            };
            match c.status {
                Ok(()) => {
                    let d = c.data.unwrap_or_default();
                    match parse_connect_request(&d) {
                        Some(x) => l.queue.push_back(x),
                        None => {
                            log::warn!("ignoring a malformed connect request ({} bytes)", d.len())
                        }
                    }
                }
                Err(e) if is_cancel(&e) => return,
                Err(e) => log::warn!("connect request receive failed: {e}"),
            }
            let tag = wire_tag(KIND_CONNECT, l.id, 0, 0);
            if let Err(e) = t.recv_owned(tag, LOW_BITS, CTRL_LEN, op(h, SUB_LISTEN)) {
                log::warn!("cannot re-post the connect request receive: {e}");
            }
        }
        (k, SUB_ACK) if k == Kind::Pending as u8 => {
            let Some(p) = st.pendings.get_mut(h) else {
                return;
            };
            p.result = Some(match c.status {
                Ok(()) => {
                    let d = c.data.unwrap_or_default();
                    parse_connect_answer(&d).ok_or_else(|| {
                        Error::Remote("malformed connect answer from the listener".into())
                    })
                }
                Err(e) if is_cancel(&e) => return,
                Err(e) => Err(e),
            });
        }
        (k, SUB_CTRL_SEND) if k == Kind::Pending as u8 => {
            if let (Err(e), Some(p)) = (c.status, st.pendings.get_mut(h)) {
                p.result = Some(Err(Error::Remote(format!(
                    "connect request not delivered: {e}"
                ))));
            }
        }
        (_, SUB_CTRL_SEND) => {
            if let Err(e) = c.status {
                log::warn!("connect answer not delivered: {e}");
            }
        }
        _ => log::debug!("completion for unknown operation {:#x}", c.op),
    }
}

pub(super) fn post_deferred(st: &mut State, t: &dyn Transport) -> Result<()> {
    while let Some(&(h, i)) = st.deferred.front() {
        let Some(r) = st.reqs.get(h) else {
            st.deferred.pop_front();
            continue;
        };
        let Some(d) = r.subs[i].deferred else {
            st.deferred.pop_front();
            continue;
        };
        let mr = d.mr.as_ref().and_then(|m| st.cache.mr(m));
        if t.recv(d.tag, d.ignore, d.region, mr, op(h, i as u64))? == Posted::Busy {
            break;
        }
        st.deferred.pop_front();
        if let Some(r) = st.reqs.get_mut(h) {
            r.subs[i].deferred = None;
        }
    }
    Ok(())
}

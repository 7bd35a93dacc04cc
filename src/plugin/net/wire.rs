//! The wire format of the net plugin: 64-bit wire tags, operation ids, the 128-byte connection
//! handle and the connect request/answer messages.
//!
//! Wire tags (64 bits): `kind:2 | comm id:22 | NCCL tag:24 | sequence:16`. The receiver picks
//! the comm id; each (comm, NCCL tag) pair numbers its messages on both sides, so a send
//! always lands in the receive posted for it, in posted order, whatever the provider's own
//! ordering, and grouped receives work for any tag order.
use super::super::HANDLE_SIZE;
use crate::error::{Error, Result};
use crate::transport::OpId;

pub(super) const KIND_DATA: u64 = 0;
pub(super) const KIND_CONNECT: u64 = 1;
pub(super) const KIND_ACK: u64 = 2;
/// The head of a striped message (`stripe`); its other pieces carry `KIND_DATA`.
pub(super) const KIND_STRIPE: u64 = 3;
/// The kind bits of a wire tag: a striped comm's receives ignore them, so that one receive
/// matches a plain message or a striped head. Comm, listen and connect ids come from one pool
/// per device, so no other kind's tag can carry the comm's id.
pub(super) const KIND_BITS: u64 = 3 << 61;
pub(super) const ID_BITS: u32 = 21;
/// Ignore mask for everything below the comm id (user tag and sequence).
pub(super) const LOW_BITS: u64 = (1 << 40) - 1;

pub(super) const SUB_LISTEN: u64 = 0xf;
pub(super) const SUB_ACK: u64 = 0xe;
pub(super) const SUB_CTRL_SEND: u64 = 0xd;

pub(super) const HANDLE_MAGIC: &[u8; 4] = b"FBCL";
pub(super) const HANDLE_VERSION: u16 = 1;
pub(super) const HANDLE_ADDR_OFF: usize = 24;
pub(super) const MAX_ADDR: usize = HANDLE_SIZE - HANDLE_ADDR_OFF;
pub(super) const REQ_MAGIC: &[u8; 4] = b"FBCQ";
pub(super) const ACK_MAGIC: &[u8; 4] = b"FBCA";
pub(super) const CTRL_LEN: usize = 256;

/// `kind:2 | comm id:21 | NCCL tag:24 | sequence:16`: 63 bits (`transport::TAG_BITS`).
pub(super) fn wire_tag(kind: u64, id: u32, tag: u32, seq: u16) -> u64 {
    (kind << 61)
        | ((id as u64 & ((1 << ID_BITS) - 1)) << 40)
        | ((tag as u64 & 0xff_ffff) << 16)
        | seq as u64
}

pub(super) fn op(h: u64, sub: u64) -> OpId {
    (h << 4) | sub
}
/// A connection handle's fields (the 128 bytes NCCL carries from listener to connector).
#[derive(Debug)]
pub(super) struct HandleView {
    pub listen_id: u32,
    pub state: u64,
    pub addr: Vec<u8>,
}

pub(super) fn parse_handle(h: &[u8; HANDLE_SIZE]) -> Result<HandleView> {
    let bad = |why: &str| Error::arg("handle", format!("not a fabricoll listen handle ({why})"));
    if &h[0..4] != HANDLE_MAGIC {
        return Err(bad("wrong magic"));
    }
    if u16::from_le_bytes([h[4], h[5]]) != HANDLE_VERSION {
        return Err(bad("unknown version"));
    }
    let len = u16::from_le_bytes([h[6], h[7]]) as usize;
    if len == 0 || len > MAX_ADDR {
        return Err(bad("address length out of range"));
    }
    let listen_id = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
    if listen_id == 0 || listen_id >= 1 << ID_BITS {
        return Err(bad("listen id out of range"));
    }
    Ok(HandleView {
        listen_id,
        state: u64::from_le_bytes(h[16..24].try_into().expect("8 bytes")),
        addr: h[HANDLE_ADDR_OFF..HANDLE_ADDR_OFF + len].to_vec(),
    })
}

pub(super) fn set_handle_state(h: &mut [u8; HANDLE_SIZE], state: u64) {
    h[16..24].copy_from_slice(&state.to_le_bytes());
}

/// Parse a connect request: the connector's comm id, its address and its helper count.
pub(super) fn parse_connect_request(d: &[u8]) -> Option<(u32, Vec<u8>, usize)> {
    if d.len() < 10 || &d[0..4] != REQ_MAGIC {
        return None;
    }
    let id = u32::from_le_bytes(d[4..8].try_into().ok()?);
    let len = u16::from_le_bytes([d[8], d[9]]) as usize;
    if id == 0 || len == 0 || d.len() < 10 + len {
        return None;
    }
    // Since striping: one more byte, how many helper endpoints the connector has (none when
    // absent, as from an older library).
    let helpers = d.get(10 + len).copied().unwrap_or(0) as usize;
    Some((id, d[10..10 + len].to_vec(), helpers))
}

/// The connect answer: our comm id, then the addresses of the helper endpoints the connector is
/// to stripe over (a count byte, then length-prefixed addresses; absent: none).
pub(super) fn connect_answer(id: u32, helpers: &[Vec<u8>]) -> Result<Vec<u8>> {
    let mut ack = Vec::with_capacity(CTRL_LEN);
    ack.extend_from_slice(ACK_MAGIC);
    ack.extend_from_slice(&id.to_le_bytes());
    ack.push(helpers.len() as u8);
    for a in helpers {
        ack.extend_from_slice(&(a.len() as u16).to_le_bytes());
        ack.extend_from_slice(a);
    }
    if ack.len() > CTRL_LEN {
        return Err(Error::System(format!(
            "the addresses of {} stripe endpoints do not fit the {CTRL_LEN}-byte connect answer              (lower FABRICOLL_NET_STREAMS)",
            helpers.len()
        )));
    }
    Ok(ack)
}

/// Parse a connect answer: the listener's comm id and its helper endpoints' addresses.
pub(super) fn parse_connect_answer(d: &[u8]) -> Option<(u32, Vec<Vec<u8>>)> {
    if d.len() < 8 || &d[0..4] != ACK_MAGIC {
        return None;
    }
    let id = u32::from_le_bytes(d[4..8].try_into().ok()?);
    let mut helpers = Vec::new();
    if let Some(&count) = d.get(8) {
        let mut at = 9;
        for _ in 0..count {
            let len = u16::from_le_bytes([*d.get(at)?, *d.get(at + 1)?]) as usize;
            helpers.push(d.get(at + 2..at + 2 + len)?.to_vec());
            at += 2 + len;
        }
    }
    Some((id, helpers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::net::MAX_TAG;

    #[test]
    fn wire_tags_keep_fields_apart() {
        let t = wire_tag(KIND_DATA, (1 << ID_BITS) - 1, MAX_TAG as u32, 0xffff);
        assert_eq!(t >> 61, KIND_DATA);
        for kind in [KIND_DATA, KIND_CONNECT, KIND_ACK] {
            let t = wire_tag(kind, (1 << ID_BITS) - 1, MAX_TAG as u32, 0xffff);
            assert_eq!(t >> 61, kind);
            assert!(t < 1 << crate::transport::TAG_BITS, "{t:#x}");
        }
        assert_eq!((t >> 40) & ((1 << ID_BITS) - 1), (1 << ID_BITS) - 1);
        assert_eq!(t & 0xffff, 0xffff);
        assert_ne!(wire_tag(KIND_CONNECT, 1, 0, 0), wire_tag(KIND_ACK, 1, 0, 0));
        assert_eq!(
            wire_tag(KIND_DATA, 5, 3, 1) & !LOW_BITS,
            wire_tag(KIND_DATA, 5, 9, 7) & !LOW_BITS
        );
    }

    #[test]
    fn connect_answers_carry_helper_addresses() {
        let helpers = vec![vec![1u8, 2, 3], vec![9u8; 16]];
        let ack = connect_answer(77, &helpers).unwrap();
        assert_eq!(parse_connect_answer(&ack), Some((77, helpers)));
        // An older answer (no count byte) means no helpers; a truncated list is malformed.
        assert_eq!(parse_connect_answer(&ack[..8]), Some((77, vec![])));
        assert_eq!(parse_connect_answer(&ack[..12]), None);
        assert!(connect_answer(1, &vec![vec![0u8; 100]; 3]).is_err());
    }

    #[test]
    fn garbage_handles_are_rejected() {
        let mut h = [0u8; HANDLE_SIZE];
        assert!(parse_handle(&h).is_err());
        h[0..4].copy_from_slice(HANDLE_MAGIC);
        h[4..6].copy_from_slice(&1u16.to_le_bytes());
        h[6..8].copy_from_slice(&200u16.to_le_bytes());
        assert!(parse_handle(&h)
            .unwrap_err()
            .to_string()
            .contains("'handle'"));
    }
}

//! Wire tags: the bit layout of collective and point-to-point tags, `Tags` (how a job's
//! messages are tagged), and how a step's tag is made from them and the plan's message keys.

use super::signature::{SIG_BITS, SIG_MASK};
use super::Exec;

/// Wire tags of collective messages:
/// `kind:1 (1) | sequence:14 | source rank:20 | message:16 | signature:12`, 63 bits in all
/// (`transport::TAG_BITS`: libfabric's net provider keeps bit 63 for itself). The signature
/// (`signature::Signature::bits`) is ignored when receives match and compared when they
/// complete.
pub fn coll_tag(seq: u32, src: usize, k: usize, sig: u64) -> u64 {
    (1u64 << 62)
        | ((seq as u64 & SEQ_MASK) << SEQ_SHIFT)
        | ((src as u64 & 0xf_ffff) << SRC_SHIFT)
        | ((k as u64 & 0xffff) << SIG_BITS)
        | (sig & SIG_MASK)
}

/// The message key's bits in a collective tag.
pub(super) const KEY_MASK: u64 = 0xffff << SIG_BITS;

/// Where the source rank sits in a collective tag, and its bits there.
pub(super) const SRC_SHIFT: u32 = 28;
pub(super) const SRC_MASK: u64 = 0xf_ffff << SRC_SHIFT;

/// The sequence bits of a collective tag: collectives in flight on one communicator must
/// number fewer than this, which `MAX_IN_FLIGHT` keeps them.
pub(super) const SEQ_MASK: u64 = 0x3fff;

/// Where the sequence number sits in a collective tag.
pub(super) const SEQ_SHIFT: u32 = 48;

/// Most collectives one communicator may have in flight: tags repeat after `SEQ_MASK + 1`.
pub const MAX_IN_FLIGHT: usize = 8192;

/// Most messages one collective sends to (or receives from) one peer: the tag's message field
/// holds 16 bits (keys 0 up to this count less one); its three largest values are kept for
/// notices (`notice::NOTICE_KEY`), goodbyes (`GOODBYE_KEY`) and late notices
/// (`notice::LATE_KEY`).
pub const MAX_MESSAGES_PER_PEER: usize = (1 << 16) - 3;

/// The message key of the goodbye a rank sends when its communicator ends (`goodbye_tag`).
const GOODBYE_KEY: usize = MAX_MESSAGES_PER_PEER + 1;

/// The tag of rank `src`'s goodbye: a collective tag with a message key no schedule uses and
/// no notice watch matches, so that it meets only the goodbye receive of its peer.
pub fn goodbye_tag(src: usize) -> u64 {
    coll_tag(0, src, GOODBYE_KEY, 0)
}

/// Wire tags of point-to-point messages: `kind:1 (0) | source rank:20 | key:42`, the key
/// being `p2p_key` of the user's tag and the transfer's number among those of its pair and tag.
pub fn p2p_tag(src: usize, key: u64) -> u64 {
    ((src as u64 & 0xf_ffff) << 42) | (key & ((1 << 42) - 1))
}

/// The largest user tag of a point-to-point transfer (`FABRICOLL_MAX_TAG`).
pub const MAX_TAG: u32 = (1 << TAG_BITS) - 1;

/// Bits of the user tag in a point-to-point key; the other 22 number the transfers of one
/// (pair, tag), so that at most `1 << 22` of them may be in flight at once before the numbers
/// repeat.
const TAG_BITS: u32 = 20;
const P2P_SEQ_BITS: u32 = 42 - TAG_BITS;

/// The key of transfer `seq` of `tag` (at most `MAX_TAG`) between two ranks: `tag:20 | seq:22`.
/// Untagged transfers are tag 0, so they match tag-0 transfers of the other side.
pub fn p2p_key(tag: u32, seq: u64) -> u64 {
    debug_assert!(tag <= MAX_TAG);
    ((tag as u64 & MAX_TAG as u64) << P2P_SEQ_BITS) | (seq & ((1 << P2P_SEQ_BITS) - 1))
}

/// Largest rank count the tags carry.
pub const MAX_RANKS: usize = 1 << 20;

/// Tagging of a job's messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tags {
    /// A collective: its sequence number on the communicator (the same on every rank).
    Coll(u32),
    /// A point-to-point transfer: its key (`p2p_key`: its tag and its number among the
    /// transfers of that tag between the two ranks).
    P2p(u64),
}

impl Exec {
    /// The wire tag of step `step`'s message, sent by rank `src`.
    pub(super) fn tag(&self, src: usize, step: usize) -> u64 {
        match self.job.args.tags {
            Tags::Coll(seq) => coll_tag(seq, src, self.plan.keys[step] as usize, self.sig),
            Tags::P2p(k) => p2p_tag(src, k),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{
        coll_tag, p2p_key, p2p_tag, MAX_IN_FLIGHT, MAX_MESSAGES_PER_PEER, MAX_RANKS, MAX_TAG,
    };
    use crate::exec::signature::{SIG_BITS, SIG_MASK};

    #[test]
    fn wire_tags_fit_63_bits_and_keep_collectives_apart_from_point_to_point() {
        let limit = 1u64 << crate::transport::TAG_BITS;
        let max_rank = MAX_RANKS - 1;
        for seq in [0, 1, 0x3fff, u32::MAX] {
            for (src, k, sig) in [(0, 0, 0), (max_rank, 0xffff, SIG_MASK), (5, 7, 0x123)] {
                let t = coll_tag(seq, src, k, sig);
                assert!(t < limit, "{t:#x}");
                assert_eq!(t >> 62, 1, "collective kind bit");
                assert_eq!((t >> 48) & 0x3fff, seq as u64 & 0x3fff);
                assert_eq!((t >> 28) & 0xf_ffff, src as u64);
                assert_eq!((t >> SIG_BITS) & 0xffff, k as u64);
                assert_eq!(t & SIG_MASK, sig);
            }
        }
        const { assert!(MAX_IN_FLIGHT <= 0x3fff + 1) };
        assert_eq!(MAX_MESSAGES_PER_PEER, 0xfffd);
        // Schedules' keys (below MAX_MESSAGES_PER_PEER), late notices', goodbyes' and
        // notices' differ.
        assert_eq!(crate::exec::notice::LATE_KEY, 0xfffd);
        assert_eq!(crate::exec::notice::NOTICE_KEY, 0xffff);
        assert_eq!((super::goodbye_tag(3) >> SIG_BITS) & 0xffff, 0xfffe);
        assert_eq!(super::goodbye_tag(3), coll_tag(0, 3, 0xfffe, 0));
        for src in [0, 3, max_rank] {
            for seq in [0, 1, (1 << 42) - 1, u64::MAX] {
                let t = p2p_tag(src, seq);
                assert!(t < limit, "{t:#x}");
                assert_eq!(t >> 62, 0, "point-to-point kind bit");
                assert_eq!(t >> 42, src as u64);
            }
        }
        assert_ne!(coll_tag(1, 2, 3, 0), coll_tag(2, 2, 3, 0));
        assert_ne!(p2p_tag(1, 9), p2p_tag(2, 9));
    }

    #[test]
    fn point_to_point_keys_keep_tags_and_sequences_apart() {
        assert_eq!(MAX_TAG, (1 << 20) - 1);
        // Untagged transfers keep their old keys (tag 0).
        assert_eq!(p2p_key(0, 5), 5);
        let mut seen = std::collections::HashSet::new();
        for tag in [0, 1, 7, MAX_TAG] {
            for seq in [0, 1, (1 << 22) - 1] {
                let t = p2p_tag(3, p2p_key(tag, seq));
                assert!(t < 1 << crate::transport::TAG_BITS);
                assert_eq!(t >> 42, 3, "source rank");
                assert!(seen.insert(t), "tag {tag} seq {seq}");
            }
        }
        // Sequences wrap inside their tag, never into the next tag.
        assert_eq!(p2p_key(7, 1 << 22), p2p_key(7, 0));
    }
}

//! The two levels of a communicator over several hosts, as a composed call sees them: a rank's
//! host (its ranks, in rank order) and its lane (the rank of each host with the same local
//! index, in host order), with as many lanes as the smallest host has ranks (the other ranks
//! of bigger hosts are *extra*: they take part in their host's exchanges only); and the
//! exchange of byte pieces among one such group of ranks, the other ranks taking no part (no
//! messages to them, not even empty ones), so that a phase inside a host never touches the
//! network and a phase of a lane crosses it only between the lane's ranks.
//! `coll::compressed` builds its inter-host-only composition on these (docs/compression.md).
#![forbid(unsafe_code)]

use super::{AlgoError, AlgoResult, Algorithm, Buf, Builder, Collective, Hosts, Problem, Schedule};
use super::{Op, Span};

/// A rank's host and lane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lanes {
    /// The ranks of this rank's host, in rank order.
    pub host: Vec<usize>,
    /// The ranks of this rank's lane: host g's rank with this rank's local index, host by
    /// host; for an extra rank, the lane of local index `local % lanes.len()` (the one it
    /// hands its data to).
    pub lane: Vec<usize>,
    /// Every lane: `lanes[k][g]` is host g's rank of local index k.
    pub lanes: Vec<Vec<usize>>,
    /// Every host's ranks, in rank order.
    pub members: Vec<Vec<usize>>,
    /// This rank's index in `host` (its local index; its lane's number unless extra).
    pub local: usize,
    /// Its host's number (its index in `lane`).
    pub at: usize,
}

impl Lanes {
    /// The host and lane of `rank` of `n` when the ranks span at least two hosts and some host
    /// holds at least two ranks; None otherwise (one host, or one rank per host). The lanes
    /// are as many as the smallest host's ranks.
    pub fn of(hosts: Hosts, n: usize, rank: usize) -> Option<Lanes> {
        if hosts.is_one() || !hosts.fits(n) || rank >= n {
            return None;
        }
        let members = hosts.members(n);
        let width = members.iter().map(Vec::len).min()?;
        let widest = members.iter().map(Vec::len).max()?;
        if members.len() < 2 || widest < 2 || width == 0 {
            return None;
        }
        let h = hosts.host_of(rank);
        let local = members[h].iter().position(|&r| r == rank)?;
        let lanes: Vec<Vec<usize>> = (0..width)
            .map(|k| members.iter().map(|m| m[k]).collect())
            .collect();
        Some(Lanes {
            host: members[h].clone(),
            lane: lanes[local % width].clone(),
            lanes,
            members,
            local,
            at: h,
        })
    }

    /// Ranks of this rank's host.
    pub fn per_host(&self) -> usize {
        self.host.len()
    }

    /// Hosts.
    pub fn hosts(&self) -> usize {
        self.lane.len()
    }

    /// Lanes: the smallest host's ranks.
    pub fn width(&self) -> usize {
        self.lanes.len()
    }

    /// Is this rank extra (past the lanes: its host's exchanges only)?
    pub fn extra(&self) -> bool {
        self.local >= self.width()
    }

    /// Does some host hold extra ranks (are the hosts of different sizes)?
    pub fn uneven(&self) -> bool {
        self.members.iter().any(|m| m.len() > self.width())
    }

    /// Ranks per host, host by host.
    pub fn sizes(&self) -> Vec<usize> {
        self.members.iter().map(Vec::len).collect()
    }

    /// The host and local index of every rank of the communicator.
    pub fn places(&self) -> Vec<(usize, usize)> {
        let n = self.members.iter().map(Vec::len).sum();
        let mut p = vec![(0, 0); n];
        for (g, m) in self.members.iter().enumerate() {
            for (j, &r) in m.iter().enumerate() {
                p[r] = (g, j);
            }
        }
        p
    }
}

/// Byte pieces of one rank's part in a group exchange: `send[k]` the pieces of the input that
/// go to the group's member k, one message each in order, and `recv[k]` where member k's
/// pieces land in the output. A member's own entries are copied (input to output) where both
/// name bytes and they differ.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pieces {
    pub send: Vec<Vec<(usize, usize)>>,
    pub recv: Vec<Vec<(usize, usize)>>,
}

/// The schedule of `rank`'s part (rank of `n`, member `group[i]`) in the exchange `pieces`
/// among `group` (global ranks, each once): in pairwise order, at step k sending to the member
/// k after it and receiving from the member k before it, so that every member has one partner
/// each way at each step. The other ranks get no steps. Elements are bytes (`elem` 1).
pub fn exchange(n: usize, rank: usize, group: &[usize], pieces: &Pieces) -> AlgoResult<Schedule> {
    let bad = |s: String| Err(AlgoError::Invalid(s));
    let m = group.len();
    let Some(i) = group.iter().position(|&r| r == rank) else {
        return bad(format!("group: rank {rank} is not a member of {group:?}"));
    };
    if group.iter().any(|&r| r >= n) {
        return bad(format!("group: {group:?} names a rank past {n}"));
    }
    if pieces.send.len() != m || pieces.recv.len() != m {
        return bad(format!(
            "pieces: {} send and {} receive lists for {m} members",
            pieces.send.len(),
            pieces.recv.len()
        ));
    }
    let mut b = Builder::new(n);
    let at = |buf, (off, len): (usize, usize)| Span::new(buf, off, len);
    for k in 1..m {
        let (to, from) = ((i + k) % m, (i + m - k) % m);
        for &p in &pieces.send[to] {
            b.send(rank, group[to], at(Buf::In, p), &[]);
        }
        for &p in &pieces.recv[from] {
            b.recv(rank, group[from], at(Buf::Out, p), &[]);
        }
    }
    for (&s, &d) in pieces.send[i].iter().zip(&pieces.recv[i]) {
        if s.1 != d.1 {
            return bad(format!(
                "pieces: {} bytes to this rank itself, {} from it",
                s.1, d.1
            ));
        }
        b.copy(rank, at(Buf::In, s), at(Buf::Out, d), &[]);
    }
    if b.ranks[rank].is_empty() {
        b.push(rank, Op::Nop, &[]);
    }
    Ok(b.finish(
        Problem::new(Collective::AllToAll, n, 0),
        Algorithm::Pairwise,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_lanes_of_even_interleaved_and_uneven_layouts() {
        // 2 x 2, hosts interleaved: host 0 = {0, 2}, host 1 = {1, 3}.
        let h = Hosts::from_labels(&[0, 1, 0, 1]);
        let l = Lanes::of(h, 4, 2).unwrap();
        assert_eq!(l.host, vec![0, 2]);
        assert_eq!(l.lane, vec![2, 3]);
        assert_eq!(l.lanes, vec![vec![0, 1], vec![2, 3]]);
        assert_eq!((l.local, l.at), (1, 0));
        // 3 x 2 in blocks.
        let l = Lanes::of(Hosts::blocks(6, 2), 6, 3).unwrap();
        assert_eq!(
            (l.host.clone(), l.lane.clone()),
            (vec![2, 3], vec![1, 3, 5])
        );
        assert_eq!((l.per_host(), l.hosts()), (2, 3));
        // Hosts of 1, 3 and 2 ranks: one lane, ranks 2, 3 and 5 extra.
        let h = Hosts::from_labels(&[0, 1, 1, 1, 2, 2]);
        let l = Lanes::of(h, 6, 3).unwrap();
        assert_eq!(l.lanes, vec![vec![0, 1, 4]]);
        assert_eq!((l.local, l.at, l.width(), l.extra()), (2, 1, 1, true));
        assert_eq!(l.lane, vec![0, 1, 4]);
        assert!(l.uneven() && !Lanes::of(h, 6, 4).unwrap().extra());
        assert_eq!(l.sizes(), vec![1, 3, 2]);
        assert_eq!(l.places()[5], (2, 1));
        // 2 + 2 + 1: one lane too.
        assert_eq!(Lanes::of(Hosts::blocks(5, 2), 5, 0).unwrap().width(), 1);
        // One host, one rank per host: no lanes.
        assert_eq!(Lanes::of(Hosts::ONE, 4, 0), None);
        assert_eq!(Lanes::of(Hosts::blocks(3, 1), 3, 0), None);
    }

    #[test]
    fn an_exchange_talks_to_its_group_only() {
        let group = [1, 3, 5];
        let pieces = Pieces {
            send: vec![vec![(0, 4)], vec![(4, 4), (8, 2)], vec![(10, 0)]],
            recv: vec![vec![(0, 4)], vec![(4, 4), (8, 2)], vec![(10, 0)]],
        };
        let s = exchange(6, 3, &group, &pieces).unwrap();
        let peers: Vec<usize> = s.ranks[3]
            .iter()
            .filter_map(|st| match st.op {
                Op::Send { peer, .. } | Op::Recv { peer, .. } => Some(peer),
                _ => None,
            })
            .collect();
        assert!(peers.iter().all(|p| [1, 5].contains(p)), "{peers:?}");
        // One message per piece each way: 1 + 1 to member 2 and from 0, 1 + 1 the other way.
        assert_eq!(peers.len(), 4);
        // Its own two pieces are copied.
        let copies = s.ranks[3]
            .iter()
            .filter(|st| matches!(st.op, Op::Copy { .. }))
            .count();
        assert_eq!(copies, 2);
        assert!(s.ranks[0].is_empty() && s.ranks[2].is_empty());
        assert!(exchange(6, 0, &group, &pieces).is_err());
        let short = Pieces {
            send: pieces.send[..2].to_vec(),
            ..pieces
        };
        assert!(exchange(6, 3, &group, &short).is_err());
    }
}

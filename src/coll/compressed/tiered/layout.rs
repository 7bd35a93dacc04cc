//! Where the data of the inter-host-only composition goes (docs/compression.md, "Levels"): the
//! call's vector cut into segments, each of one lane and one host, and each rank's byte pieces
//! of every exchange. The same on every rank: every rank computes every lane's segments.
//!
//! A segment is AllReduce's piece of the count (the count cut into one slice of whole blocks
//! per lane, each slice into one segment of whole blocks per host, owned by that host's rank
//! of the lane), ReduceScatter(V)'s output of one rank or AllGather(V)'s input of one rank.
//! A rank's segment belongs to the lane of its local index modulo the lanes, and to its own
//! host: an extra rank's segment is owned (ReduceScatter) or contributed (AllGather) by its
//! host's rank of that lane.
use super::{Stage, What};
use crate::algo::lanes::{Lanes, Pieces};
use crate::coll::compressed::flat::chunk_parts;
use crate::compress::{owner, Codec};
use std::ops::Range;

/// One segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Seg {
    /// The host whose rank of the lane owns (AllReduce, ReduceScatter) or contributes
    /// (AllGather) it.
    pub host: usize,
    /// The rank whose output (ReduceScatter) or input (AllGather) it is; AllReduce: its owner.
    pub rank: usize,
    /// Its elements in the call's vector: AllReduce's count, ReduceScatter's input, AllGather's
    /// output.
    pub data: Range<usize>,
    /// Its elements in its lane's vector (the lane's segments back to back).
    pub pos: Range<usize>,
    /// Where its codes lie in its lane's buffer of codes.
    pub wire: Range<usize>,
    /// Its first element's place in the whole segment (a chunk's part of it, `Layout::chunk`).
    pub from: usize,
}

/// Every lane's segments, and this rank's place among them.
pub(super) struct Layout {
    pub what: What,
    pub l: Lanes,
    /// Each lane's segments, host by host, by rank within a host.
    pub lanes: Vec<Vec<Seg>>,
    /// The data's element size.
    el: usize,
}

/// A byte piece of a buffer.
type Piece = (usize, usize);

impl Layout {
    /// AllReduce of `count` elements.
    pub fn all_reduce(codec: &Codec, l: Lanes, count: usize, el: usize) -> Layout {
        let (h, w) = (l.hosts(), l.width());
        let lanes = owner::segments(codec, count, w)
            .into_iter()
            .enumerate()
            .map(|(k, slice)| {
                let segs = owner::segments(codec, slice.len(), h);
                let wire = owner::wire_ranges(codec, &segs);
                segs.into_iter()
                    .zip(wire)
                    .enumerate()
                    .map(|(g, (s, wire))| Seg {
                        host: g,
                        rank: l.lanes[k][g],
                        data: slice.start + s.start..slice.start + s.end,
                        pos: s,
                        wire,
                        from: 0,
                    })
                    .collect()
            })
            .collect();
        Layout {
            what: What::AllReduce,
            l,
            lanes,
            el,
        }
    }

    /// ReduceScatter(V) or AllGather(V): rank r's segment is `blocks[r]` (start, count) of the
    /// call's vector.
    pub fn per_rank(
        what: What,
        codec: &Codec,
        l: Lanes,
        blocks: &[(usize, usize)],
        el: usize,
    ) -> Layout {
        let w = l.width();
        let mut lanes: Vec<Vec<Seg>> = vec![Vec::new(); w];
        let mut ends = vec![(0usize, 0usize); w];
        for (g, m) in l.members.iter().enumerate() {
            for (j, &r) in m.iter().enumerate() {
                let (at, c) = blocks[r];
                let (pos, wire) = &mut ends[j % w];
                let len = codec.wire_len(c);
                lanes[j % w].push(Seg {
                    host: g,
                    rank: r,
                    data: at..at + c,
                    pos: *pos..*pos + c,
                    wire: *wire..*wire + len,
                    from: 0,
                });
                (*pos, *wire) = (*pos + c, *wire + len);
            }
        }
        Layout { what, l, lanes, el }
    }

    /// Elements of every segment, lane by lane: what the call is cut into chunks by.
    pub fn counts(&self) -> Vec<usize> {
        let segs = self.lanes.iter().flatten();
        segs.map(|s| s.data.len()).collect()
    }

    /// Chunk `k` of this layout, laid out as a call of its own: elements [k per, (k + 1) per)
    /// of every segment (`flat::chunk_parts`), `per` whole blocks, so that the chunk's codes
    /// are the bits of the same elements' codes in the whole call.
    pub fn chunk(&self, codec: &Codec, per: usize, k: usize) -> Layout {
        let lanes = self
            .lanes
            .iter()
            .map(|segs| {
                let counts: Vec<usize> = segs.iter().map(|s| s.data.len()).collect();
                let parts = chunk_parts(&counts, per, k);
                let wire = owner::wire_ranges(codec, &parts);
                let mut pos = 0;
                segs.iter()
                    .zip(parts)
                    .zip(wire)
                    .map(|((s, p), wire)| {
                        let seg = Seg {
                            host: s.host,
                            rank: s.rank,
                            data: s.data.start + p.start..s.data.start + p.end,
                            pos: pos..pos + p.len(),
                            wire,
                            from: s.from + p.start,
                        };
                        pos += p.len();
                        seg
                    })
                    .collect()
            })
            .collect();
        Layout {
            what: self.what,
            l: self.l.clone(),
            lanes,
            el: self.el,
        }
    }

    /// Elements of the call's vector: AllReduce's count, ReduceScatter's input, AllGather's
    /// output.
    pub fn vector(&self) -> usize {
        let ends = self.lanes.iter().flatten().map(|s| s.data.end);
        ends.max().unwrap_or(0)
    }

    /// This rank's segment (ReduceScatter, AllGather).
    pub fn mine(&self) -> Option<&Seg> {
        let me = self.l.host[self.l.local];
        self.lanes[self.lane()].iter().find(|s| s.rank == me)
    }

    /// Elements of this rank's input.
    pub fn in_elems(&self) -> usize {
        match self.what {
            What::AllGather => self.mine().map_or(0, |s| s.data.len()),
            _ => self.vector(),
        }
    }

    /// Elements of this rank's output.
    pub fn out_elems(&self) -> usize {
        match self.what {
            What::ReduceScatter => self.mine().map_or(0, |s| s.data.len()),
            _ => self.vector(),
        }
    }

    /// The ranks and the largest piece of bytes of one member of `stage`, on any host or lane:
    /// what the exchange is priced as (the call waits for its slowest group).
    pub fn priced(&self, stage: Stage) -> (usize, usize) {
        let l = &self.l;
        let widest = l.members.iter().map(Vec::len).max().unwrap_or(0);
        let el = self.el;
        let lanes = 0..l.width();
        let extras = || {
            let places = l.places();
            self.lanes
                .iter()
                .flatten()
                .filter(move |s| places[s.rank].1 >= l.width())
        };
        match stage {
            Stage::HostReduce => (widest, lanes.map(|k| self.total(k)).max().unwrap_or(0) * el),
            Stage::HostGather if self.what == What::ReduceScatter => (
                widest,
                extras().map(|s| s.data.len()).max().unwrap_or(0) * el,
            ),
            Stage::HostGather => (widest, lanes.map(|k| self.total(k)).max().unwrap_or(0) * el),
            Stage::HostCodes => (widest, extras().map(|s| s.wire.len()).max().unwrap_or(0)),
            Stage::LaneToOwners | Stage::LaneGather => {
                let most = lanes
                    .flat_map(|k| (0..l.hosts()).map(move |g| (k, g)))
                    .map(|(k, g)| self.owned_wire(k, g).len())
                    .max();
                (l.hosts(), most.unwrap_or(0))
            }
        }
    }

    /// This rank's lane (an extra rank's: the one it hands on to).
    pub fn lane(&self) -> usize {
        self.l.local % self.l.width()
    }

    /// Elements of lane `k`'s vector.
    pub fn total(&self, k: usize) -> usize {
        self.lanes[k].last().map_or(0, |s| s.pos.end)
    }

    /// Bytes of lane `k`'s codes.
    pub fn wire_total(&self, k: usize) -> usize {
        self.lanes[k].last().map_or(0, |s| s.wire.end)
    }

    /// The indices in lane `k` of host `g`'s segments (a lane's are in host order).
    pub fn owned(&self, k: usize, g: usize) -> Range<usize> {
        let segs = &self.lanes[k];
        segs.partition_point(|s| s.host < g)..segs.partition_point(|s| s.host <= g)
    }

    /// Where host `g`'s codes of lane `k` lie in the lane's buffer of codes.
    pub fn owned_wire(&self, k: usize, g: usize) -> Range<usize> {
        let o = self.owned(k, g);
        match (self.lanes[k].get(o.start), o.is_empty()) {
            (Some(first), false) => first.wire.start..self.lanes[k][o.end - 1].wire.end,
            _ => 0..0,
        }
    }

    /// Bytes of this rank's owned codes (its host's in its lane).
    pub fn own_wire(&self) -> usize {
        self.owned_wire(self.lane(), self.l.at).len()
    }

    /// Lane `k`'s segments as runs of adjacent data (data start, lane position, elements),
    /// empty ones left out: the pieces of the host's exchanges, the same on both ends.
    fn runs(&self, k: usize) -> Vec<(usize, usize, usize)> {
        let mut runs: Vec<(usize, usize, usize)> = Vec::new();
        for s in self.lanes[k].iter().filter(|s| !s.data.is_empty()) {
            match runs.last_mut() {
                Some(r) if r.0 + r.2 == s.data.start && r.1 + r.2 == s.pos.start => {
                    r.2 += s.data.len()
                }
                _ => runs.push((s.data.start, s.pos.start, s.data.len())),
            }
        }
        runs
    }

    /// Lane `k`'s data in the call's vector, as byte pieces.
    fn data_pieces(&self, k: usize) -> Vec<Piece> {
        let el = self.el;
        self.runs(k)
            .into_iter()
            .map(|(d, _, n)| (d * el, n * el))
            .collect()
    }

    /// The bytes of this rank's buffers: the host's pieces (HostReduce's output), its lane's
    /// codes, the codes it receives as an owner, and the decoded segments it hands on to
    /// extra ranks (ReduceScatter).
    pub fn buffers(&self) -> [usize; 4] {
        let (k, el) = (self.lane(), self.el);
        let w = self.own_wire();
        if self.l.extra() {
            let codes = match (self.what, self.mine()) {
                (What::AllGather, Some(s)) => s.wire.len(),
                _ => 0,
            };
            return [0, codes, 0, 0];
        }
        let pieces = match self.what {
            What::AllGather => 0,
            _ => self.l.per_host() * self.total(k) * el,
        };
        let got = match self.what {
            What::AllGather => 0,
            _ => self.l.hosts() * w,
        };
        [
            pieces,
            self.wire_total(k),
            got,
            self.handed().map(|(_, _, d)| d.len()).sum::<usize>() * el,
        ]
    }

    /// ReduceScatter: the segments this rank owns for extra ranks of its host, each with its
    /// rank, its index in the lane, and its elements in the buffer of decoded segments.
    pub fn handed(&self) -> impl Iterator<Item = (usize, usize, Range<usize>)> + '_ {
        let (k, g) = (self.lane(), self.l.at);
        let me = self.l.host[self.l.local];
        let mut at = 0;
        let on = self.what == What::ReduceScatter && !self.l.extra();
        self.owned(k, g)
            .filter(move |&i| on && self.lanes[k][i].rank != me)
            .map(move |i| {
                let s = &self.lanes[k][i];
                let r = at..at + s.data.len();
                at = r.end;
                (s.rank, i, r)
            })
    }

    /// This rank's group and byte pieces in `stage` (`lanes::exchange`), on the buffers
    /// `Tiered` gives that stage. A rank that takes no part (an extra rank in a lane's stage)
    /// is a group of itself with nothing to send.
    pub fn pieces(&self, stage: Stage) -> (Vec<usize>, Pieces) {
        let l = &self.l;
        let (k, g, j, el) = (self.lane(), l.at, l.local, self.el);
        let (y, w) = (l.per_host(), l.width());
        let extra = l.extra();
        let me = l.host[j];
        let none = |m: usize| Pieces {
            send: vec![Vec::new(); m],
            recv: vec![Vec::new(); m],
        };
        match stage {
            Stage::LaneToOwners | Stage::LaneGather if extra => (vec![me], none(1)),
            Stage::HostReduce => {
                // Every host rank sends lane m's data to the host's rank m, which lays the
                // pieces out member after member.
                let mut p = none(y);
                for m in 0..w {
                    p.send[m] = self.data_pieces(m);
                }
                if !extra {
                    let t = self.total(k) * el;
                    let runs = self.runs(k);
                    for (m, r) in p.recv.iter_mut().enumerate() {
                        *r = runs
                            .iter()
                            .map(|&(_, at, n)| (m * t + at * el, n * el))
                            .collect();
                    }
                }
                (l.host.clone(), p)
            }
            Stage::HostCodes => {
                // An extra rank's codes (its whole buffer) to its lane's rank of its host.
                let mut p = none(y);
                if extra {
                    p.send[k] = vec![(0, self.buffers()[1])];
                } else {
                    for (i, &r) in l.host.iter().enumerate().skip(w) {
                        if i % w == k {
                            let s = self.lanes[k].iter().find(|s| s.rank == r);
                            let wire = s.map_or(0..0, |s| s.wire.clone());
                            p.recv[i] = vec![(wire.start, wire.len())];
                        }
                    }
                }
                (l.host.clone(), p)
            }
            Stage::LaneToOwners => {
                let own = self.own_wire();
                let h = l.hosts();
                let p = Pieces {
                    send: (0..h)
                        .map(|o| {
                            let r = self.owned_wire(k, o);
                            vec![(r.start, r.len())]
                        })
                        .collect(),
                    recv: (0..h).map(|o| vec![(o * own, own)]).collect(),
                };
                (l.lane.clone(), p)
            }
            Stage::LaneGather => {
                let h = l.hosts();
                let wire = |o: usize| {
                    let r = self.owned_wire(k, o);
                    vec![(r.start, r.len())]
                };
                let mut p = Pieces {
                    send: vec![Vec::new(); h],
                    recv: (0..h).map(wire).collect(),
                };
                match self.what {
                    // The owners' sums, from the start of the buffer they were received in.
                    What::AllReduce => p.send = vec![vec![(0, self.own_wire())]; h],
                    // In place: its host's codes are where they go.
                    _ => {
                        p.send = vec![wire(g); h];
                        (p.send[g], p.recv[g]) = (Vec::new(), Vec::new());
                    }
                }
                (l.lane.clone(), p)
            }
            Stage::HostGather if self.what == What::ReduceScatter => {
                let mut p = none(y);
                if extra {
                    let at = self.mine().map_or(0, |s| s.from);
                    p.recv[k] = vec![(at * el, self.out_elems() * el)];
                } else {
                    for (r, _, d) in self.handed() {
                        let i = l.host.iter().position(|&x| x == r).unwrap_or(0);
                        p.send[i] = vec![(d.start * el, d.len() * el)];
                    }
                }
                (l.host.clone(), p)
            }
            Stage::HostGather => {
                // In place: each lane's rank hands its lane's decoded data to the others.
                let mut p = none(y);
                for m in 0..w {
                    if m != j {
                        p.recv[m] = self.data_pieces(m);
                    }
                }
                if !extra {
                    let mine = self.data_pieces(k);
                    for (i, s) in p.send.iter_mut().enumerate() {
                        if i != j {
                            *s = mine.clone();
                        }
                    }
                }
                (l.host.clone(), p)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Hosts;
    use crate::compress::Format;

    /// Every rank's layout of `what` on hosts `labels`: rank r's segment `blocks[r]`.
    fn layouts(what: What, labels: &[usize], count: usize) -> Vec<Layout> {
        let codec = Codec::new(Format::Int8, 4).unwrap();
        let n = labels.len();
        let hosts = Hosts::from_labels(labels);
        let blocks: Vec<(usize, usize)> = (0..n).map(|r| (r * count, count + r % 3)).collect();
        let blocks: Vec<(usize, usize)> = blocks
            .iter()
            .scan(0, |at, &(_, c)| {
                *at += c;
                Some((*at - c, c))
            })
            .collect();
        (0..n)
            .map(|r| {
                let l = Lanes::of(hosts, n, r).unwrap();
                match what {
                    What::AllReduce => Layout::all_reduce(&codec, l, count, 4),
                    _ => Layout::per_rank(what, &codec, l, &blocks, 4),
                }
            })
            .collect()
    }

    /// What every member sends every other matches, piece by piece, what that one receives
    /// from it, in every exchange of every collective, on hosts of equal and different sizes.
    #[test]
    fn every_piece_sent_is_received_alike() {
        for labels in [
            &[0, 0, 1, 1][..],
            &[0, 0, 1, 1, 2],
            &[0, 0, 0, 1, 2, 2],
            &[0, 1, 0, 2, 1, 0],
        ] {
            for what in [What::AllReduce, What::ReduceScatter, What::AllGather] {
                let all = layouts(what, labels, 9);
                let uneven = all[0].l.uneven();
                for &stage in Stage::of(what, uneven) {
                    let plans: Vec<_> = all.iter().map(|l| l.pieces(stage)).collect();
                    for (r, (group, p)) in plans.iter().enumerate() {
                        let i = group.iter().position(|&x| x == r).unwrap();
                        for (m, &peer) in group.iter().enumerate() {
                            let (pg, pp) = &plans[peer];
                            let Some(pi) = pg.iter().position(|&x| x == r) else {
                                assert!(p.send[m].is_empty() || peer == r);
                                continue;
                            };
                            let lens = |v: &[(usize, usize)]| -> Vec<usize> {
                                v.iter().map(|p| p.1).collect()
                            };
                            if peer != r {
                                assert_eq!(
                                    lens(&p.send[m]),
                                    lens(&pp.recv[pi]),
                                    "{labels:?} {what:?} {stage:?}: {r} to {peer}"
                                );
                            } else {
                                assert_eq!(lens(&p.send[i]), lens(&p.recv[i]));
                            }
                        }
                    }
                }
            }
        }
    }

    /// 3 + 2 ranks: two lanes, rank 2 extra (lane 0). Its ReduceScatter output is owned by rank
    /// 0, which sums and owns two segments; the price takes the largest host and pieces.
    #[test]
    fn an_extra_rank_is_owned_by_its_hosts_lane_rank() {
        let all = layouts(What::ReduceScatter, &[0, 0, 0, 1, 1], 8);
        let ranks: Vec<Vec<usize>> = all[0]
            .lanes
            .iter()
            .map(|l| l.iter().map(|s| s.rank).collect())
            .collect();
        assert_eq!(ranks, vec![vec![0, 2, 3], vec![1, 4]]);
        assert_eq!(all[0].owned(0, 0), 0..2);
        let handed: Vec<usize> = all[0].handed().map(|h| h.0).collect();
        assert_eq!(handed, vec![2]);
        assert!(all[2].l.extra() && all[2].handed().next().is_none());
        // Rank 0 sums lane 0's three segments (8 + 10 + 8 elements) from three host ranks.
        assert_eq!(all[0].buffers()[0], 3 * 26 * 4);
        assert_eq!(all[0].priced(Stage::HostReduce), (3, 26 * 4));
        assert_eq!(all[0].priced(Stage::HostGather), (3, 10 * 4));
        assert_eq!(all[0].priced(Stage::LaneToOwners).0, 2);
    }

    /// The chunks of a layout hold whole blocks of every segment, cover each once and in
    /// order, and lay each lane's parts out back to back as a call of its own.
    #[test]
    fn chunks_cover_every_segment_in_whole_blocks() {
        let codec = Codec::new(Format::Int8, 4).unwrap();
        for what in [What::AllReduce, What::ReduceScatter, What::AllGather] {
            for labels in [&[0, 0, 1, 1][..], &[0, 0, 0, 1, 1]] {
                let lay = &layouts(what, labels, 37)[0];
                for per in [4, 8, 36] {
                    let longest = lay.counts().into_iter().max().unwrap();
                    let chunks: Vec<Layout> = (0..longest.div_ceil(per))
                        .map(|k| lay.chunk(&codec, per, k))
                        .collect();
                    for (k, segs) in lay.lanes.iter().enumerate() {
                        for (i, whole) in segs.iter().enumerate() {
                            let mut at = whole.data.start;
                            for c in &chunks {
                                let s = &c.lanes[k][i];
                                assert_eq!((s.data.start, s.from), (at, at - whole.data.start));
                                assert!(s.data.len() % 4 == 0 || s.data.end == whole.data.end);
                                assert_eq!(s.wire.len(), codec.wire_len(s.data.len()));
                                at = s.data.end;
                            }
                            assert_eq!(at, whole.data.end, "{what:?} {labels:?} per {per}");
                        }
                        for c in &chunks {
                            let l = &c.lanes[k];
                            assert!(l.windows(2).all(|w| w[0].pos.end == w[1].pos.start
                                && w[0].wire.end == w[1].wire.start));
                        }
                    }
                }
            }
        }
    }
}

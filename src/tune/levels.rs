//! Flat algorithms on several hosts, priced per level: the ranks run in topology order (each
//! host's ranks contiguous, `algo::Hosts::order`), and each step costs the level it crosses.
//! A step that crosses hosts pays the network's alpha, and its bytes share the sending host's
//! link with every other rank of that host sending across at the same time; a step inside a
//! host pays shared memory's. Steps that do both take the slower. Per algorithm:
//! - ring: one flow per host boundary and direction, every step crossing somewhere, so the
//!   one-level formula with the slower alpha and beta; a chain (Broadcast, Reduce) pays each
//!   hop's own alpha;
//! - rd, rdh: each exchange step is priced from its pairs (the long-distance steps have all
//!   of a host's ranks crossing at once);
//! - mesh, mesh1: of each rank's traffic the share (n-s)/(n-1) goes to other hosts, and the s
//!   ranks of a host share its link;
//! - pairwise: the same bytes, its window of steps in flight, or its CPU, whichever is slowest;
//! - bruck: each round is priced from its pairs, as rdh's, and the rounds of a host's ranks
//!   overlap on its link;
//! - trees: each level of the tree pays the alpha of the links it uses, and the pipelined
//!   bytes the most loaded host link.
#![forbid(unsafe_code)]

use super::{binomial_piped, exchange, formula, ring_overlap, Round, RENDEZVOUS_ALPHAS};
use crate::algo::{rdh, tree, Algorithm, Collective, Options, Problem};

/// One level's link: alpha (us), beta (us per byte), the sending CPU's cost per message (us)
/// and the eager limit (bytes; `usize::MAX`: no rendezvous).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    pub alpha_us: f64,
    pub beta_us_per_byte: f64,
    pub o_us: f64,
    pub eager_bytes: usize,
}

impl Link {
    /// Shared memory until it is measured (the values below: a guess of the right order).
    pub const SHM: Link = Link {
        alpha_us: 1.0,
        beta_us_per_byte: 1e-4,
        o_us: 0.5,
        eager_bytes: usize::MAX,
    };

    /// The link whose beta is shared by `flows` concurrent senders.
    pub(super) fn shared(self, flows: f64) -> Link {
        Link {
            beta_us_per_byte: self.beta_us_per_byte * flows.max(1.0),
            ..self
        }
    }

    /// What the rendezvous of `msgs` messages of `m` bytes sent at once adds (one handshake
    /// for the round, one per message where ranks share CPUs).
    pub(super) fn rendezvous(&self, msgs: f64, m: f64, serial: bool) -> f64 {
        if self.eager_bytes == usize::MAX || m <= self.eager_bytes as f64 || msgs <= 0.0 {
            return 0.0;
        }
        let handshakes = if serial { msgs } else { 1.0 };
        handshakes * RENDEZVOUS_ALPHAS * self.alpha_us
    }

    /// One message of `m` bytes with `flows` senders sharing the link.
    fn hop(&self, m: f64, flows: f64, serial: bool) -> f64 {
        self.alpha_us + m * self.beta_us_per_byte * flows.max(1.0) + self.rendezvous(1.0, m, serial)
    }
}

/// The two levels and the reduction speed.
#[derive(Clone, Copy, Debug)]
pub(super) struct Net {
    pub intra: Link,
    pub inter: Link,
    pub gamma: f64,
    /// Ranks share CPUs: each message of a round pays its own handshake.
    pub serial: bool,
    /// Bytes per slice of the pipelined schedules (`Model::slice_bytes`).
    pub slice: f64,
}

/// Does `p` run on ranks of several hosts (so that the two-level model applies)?
pub(super) fn spans_hosts(p: &Problem, opts: &Options) -> bool {
    p.nranks > 1 && !opts.hosts.is_one() && opts.hosts.fits(p.nranks) && opts.hosts.count() > 1
}

/// The hosts of the members in topology order: `host[m]` for member m, and the ranks per host.
pub(super) struct Layout {
    pub host: Vec<usize>,
    pub sizes: Vec<usize>,
}

impl Layout {
    pub fn new(p: &Problem, opts: &Options) -> Layout {
        let sizes = opts.hosts.sizes(p.nranks);
        let host = sizes
            .iter()
            .enumerate()
            .flat_map(|(h, &s)| std::iter::repeat_n(h, s))
            .collect();
        Layout { host, sizes }
    }

    pub fn n(&self) -> usize {
        self.host.len()
    }

    pub fn x(&self) -> usize {
        self.sizes.len()
    }

    /// The most ranks on one host.
    pub fn ymax(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(1)
    }

    /// The fewest ranks on one host: how many inter-host groups a hierarchy has.
    pub fn ymin(&self) -> usize {
        self.sizes.iter().copied().min().unwrap_or(1)
    }

    /// A step in which member `from` sends to `to` for each pair: (the most senders of one
    /// host that cross, whether any pair stays inside a host).
    fn crossing(&self, pairs: impl Iterator<Item = (usize, usize)>) -> (usize, bool) {
        let mut out = vec![0usize; self.x()];
        let mut local = false;
        for (a, b) in pairs {
            if self.host[a] == self.host[b] {
                local = true;
            } else {
                out[self.host[a]] += 1;
            }
        }
        (out.into_iter().max().unwrap_or(0), local)
    }
}

impl Net {
    /// A step of messages of `m` bytes, `cross` of one host's ranks sending across at once
    /// and `local` whether some stay inside a host: the slower of the two levels.
    fn step(&self, m: f64, (cross, local): (usize, bool)) -> f64 {
        let inter = if cross > 0 {
            self.inter.hop(m, cross as f64, self.serial)
        } else {
            0.0
        };
        let intra = if local {
            self.intra.hop(m, 1.0, self.serial)
        } else {
            0.0
        };
        inter.max(intra)
    }

    /// The slower of the two links, for algorithms whose every step crosses somewhere and
    /// waits for all (rings).
    fn slower(&self) -> Link {
        let (i, e) = (self.intra, self.inter);
        Link {
            alpha_us: i.alpha_us.max(e.alpha_us),
            beta_us_per_byte: i.beta_us_per_byte.max(e.beta_us_per_byte),
            o_us: i.o_us.max(e.o_us),
            eager_bytes: e.eager_bytes,
        }
    }

    /// One round in which every member sends a message of `m` bytes to every other member:
    /// the slowest host, its link carrying its ranks' remote messages, and each rank's CPU
    /// posting its messages and handling as many received (`exchange`: the posts overlap the
    /// bytes, the handling follows).
    fn all_to_all_round(&self, lay: &Layout, m: f64) -> f64 {
        let n = lay.n() as f64;
        lay.sizes
            .iter()
            .map(|&s| {
                let s = s as f64;
                let remote = n - s;
                let net = self.inter.alpha_us
                    + s * remote * m * self.inter.beta_us_per_byte
                    + self.inter.rendezvous(remote, m, self.serial);
                let shm = if s > 1.0 {
                    self.intra.alpha_us
                        + (s - 1.0) * m * self.intra.beta_us_per_byte
                        + self.intra.rendezvous(s - 1.0, m, self.serial)
                } else {
                    0.0
                };
                let cpu = (s - 1.0) * self.intra.o_us + remote * self.inter.o_us;
                exchange(net.max(shm), 1.0, cpu)
            })
            .fold(0.0, f64::max)
    }

    /// `v` bytes sent by each rank spread over all peers (its share to other hosts crossing
    /// its host's link with its host's other ranks'): the slowest host's transfer time.
    fn spread(&self, lay: &Layout, v: f64) -> f64 {
        let n = lay.n() as f64;
        lay.sizes
            .iter()
            .map(|&s| {
                let s = s as f64;
                let net = s * v * (n - s) / (n - 1.0) * self.inter.beta_us_per_byte;
                let shm = v * (s - 1.0) / (n - 1.0) * self.intra.beta_us_per_byte;
                net.max(shm)
            })
            .fold(0.0, f64::max)
    }

    /// Predicted time of flat `algo` for `coll` on `lay` (topology order) with a whole vector
    /// of `big` bytes, root member `root`; None if not priced.
    pub fn flat(
        &self,
        algo: Algorithm,
        coll: Collective,
        lay: &Layout,
        big: f64,
        root: usize,
    ) -> Option<f64> {
        use Algorithm::*;
        use Collective::*;
        let n = lay.n();
        let nf = n as f64;
        let f = (nf - 1.0) / nf;
        let g = self.gamma;
        let c = big / nf;
        let sl = self.slower();
        let ring_link = |l: Link| (l.alpha_us, l.beta_us_per_byte, l.o_us, g);
        let t = match (algo, coll) {
            (Ring | BidirRing, AllReduce | AllGather | ReduceScatter) => {
                let rounds = if coll == AllReduce { 2.0 } else { 1.0 } * (nf - 1.0);
                let (msgs, m) = if algo == Ring {
                    (1.0, c)
                } else {
                    (2.0, c / 2.0)
                };
                let overlap = if coll == AllGather {
                    0.0
                } else {
                    ring_overlap(algo, nf, big, self.slice, ring_link(sl))
                };
                formula(algo, coll, nf, big, ring_link(sl))?
                    + overlap
                    + rounds * sl.rendezvous(msgs, m, self.serial)
            }
            (Ring, Broadcast | Reduce) => {
                // A pipelined chain: each hop its own alpha, the bytes at the slower link, and
                // the pipeline's fill: the first slice crosses every hop but the slowest on
                // its own (`pipeline_fill`).
                let x = lay.x() as f64;
                let hops = (x - 1.0) * self.inter.alpha_us + (nf - x) * self.intra.alpha_us;
                let red = if coll == Reduce { big * g } else { 0.0 };
                let s = big.min(self.slice);
                let betas = (x - 1.0) * self.inter.beta_us_per_byte
                    + (nf - x) * self.intra.beta_us_per_byte;
                let fill_red = if coll == Reduce {
                    (nf - 2.0).max(0.0) * s * g
                } else {
                    0.0
                };
                // Past the first slice, Reduce receives the next slice while it reduces one.
                let overlap = if coll == Reduce {
                    (big - s) * sl.beta_us_per_byte.min(g)
                } else {
                    0.0
                };
                let fill = s * (betas - sl.beta_us_per_byte).max(0.0) + fill_red - overlap;
                hops + big * sl.beta_us_per_byte
                    + red
                    + fill
                    + (nf - 1.0) * sl.rendezvous(1.0, big, self.serial)
            }
            (Mesh, AllGather | AllToAll) => self.all_to_all_round(lay, c),
            (Mesh, ReduceScatter) => self.all_to_all_round(lay, c) + f * big * g,
            (Mesh, AllReduce) => 2.0 * self.all_to_all_round(lay, c) + f * big * g,
            (Mesh1, AllReduce) => self.all_to_all_round(lay, big) + (nf - 1.0) * big * g,
            (Mesh, Broadcast | Reduce) => {
                let s = lay.sizes[lay.host[root]] as f64;
                let remote = nf - s;
                let net = self.inter.alpha_us
                    + remote * big * self.inter.beta_us_per_byte
                    + self.inter.rendezvous(remote, big, self.serial);
                let shm = self.intra.alpha_us + (s - 1.0) * big * self.intra.beta_us_per_byte;
                // Reduce: the root reduces the n-1 whole buffers it received, in member order.
                let red = if coll == Reduce {
                    (nf - 1.0) * big * g
                } else {
                    0.0
                };
                net.max(shm) + (s - 1.0) * self.intra.o_us + remote * self.inter.o_us + red
            }
            (Pairwise, AllToAll) => self.pairwise(lay, big),
            (Bruck, AllGather | AllToAll) => self.bruck(coll, lay, big),
            (Rd, AllReduce) => self.rd(lay, big),
            (Rdh, _) => self.rdh(coll, lay, big)?,
            (Tree | DbTree, AllReduce) => self.btree(algo, lay, big),
            (Tree, Broadcast | Reduce) => self.binomial(coll, lay, big, root),
            _ => return None,
        };
        Some(t)
    }

    /// Bruck: round k sends to the member 2^k away (AllGather: behind, its first
    /// min(2^k, n-2^k) blocks; AllToAll: ahead, the blocks whose slot has bit k set). A rank's
    /// rounds follow one another, each its alpha and its bytes; but a host's ranks do not enter
    /// a round together (its last rank's partner is on the next host from the first round on,
    /// the others' later), so while one waits out its alpha the others' bytes use the NIC: the
    /// rounds take the longer of one rank's chain of rounds (each alone on its links) and the
    /// busiest NIC's bytes of every round, one alpha after them. Plus the one-level formula's
    /// extra (`formula`: a quarter of the vector for AllGather, half for AllToAll) spread as
    /// before.
    fn bruck(&self, coll: Collective, lay: &Layout, big: f64) -> f64 {
        let n = lay.n();
        let c = big / n as f64;
        let (mut chain, mut nic) = (0.0, 0.0);
        let mut d = 1;
        while d < n {
            let (blocks, pairs): (usize, Vec<(usize, usize)>) = if coll == Collective::AllGather {
                (d.min(n - d), (0..n).map(|v| (v, (v + n - d) % n)).collect())
            } else {
                (
                    (0..n).filter(|j| j & d != 0).count(),
                    (0..n).map(|v| (v, (v + d) % n)).collect(),
                )
            };
            let m = blocks as f64 * c;
            let (cross, local) = lay.crossing(pairs.into_iter());
            chain += self.step(m, (cross.min(1), local));
            nic += cross as f64 * m * self.inter.beta_us_per_byte
                + if cross > 0 {
                    self.inter.rendezvous(1.0, m, self.serial)
                } else {
                    0.0
                };
            d <<= 1;
        }
        let extra = if coll == Collective::AllGather {
            big / 4.0
        } else {
            big / 2.0
        };
        chain.max(nic + self.inter.alpha_us) + self.spread(lay, extra)
    }

    /// Pairwise exchange: step k sends to the member k ahead and receives from the one k
    /// behind, `algo::pairwise::WINDOW` steps in flight, so a rank's steps wait for one
    /// another only a window apart. The longest of that chain of alphas, the rank's CPU
    /// (each of its n-1 messages posted and handled at its level's `o`) and the slowest
    /// host's bytes (`spread`) one alpha after them.
    fn pairwise(&self, lay: &Layout, big: f64) -> f64 {
        let nf = lay.n() as f64;
        let c = big / nf;
        let sl = self.slower();
        let window = crate::algo::pairwise::WINDOW as f64;
        let chain =
            ((nf - 1.0) / window).ceil() * (sl.alpha_us + sl.rendezvous(1.0, c, self.serial));
        let cpu = lay
            .sizes
            .iter()
            .map(|&s| {
                let s = s as f64;
                2.0 * ((s - 1.0) * self.intra.o_us + (nf - s) * self.inter.o_us)
            })
            .fold(0.0, f64::max);
        let bytes = self.spread(lay, (nf - 1.0) / nf * big) + sl.alpha_us;
        chain.max(cpu).max(bytes)
    }

    /// Recursive doubling: the fold, log2 P exchanges of the whole buffer, the unfold.
    fn rd(&self, lay: &Layout, big: f64) -> f64 {
        let (p, r) = rdh::fold(lay.n());
        let fold = (0..r).map(|v| (2 * v, 2 * v + 1));
        let mut t = 0.0;
        if r > 0 {
            t += 2.0 * (self.step(big, lay.crossing(fold)) + big * self.gamma / 2.0);
        }
        for k in 0..p.trailing_zeros() {
            let bit = 1usize << k;
            let pairs = (0..p).map(|v| (rdh::real(v, r), rdh::real(v ^ bit, r)));
            t += self.step(big, lay.crossing(pairs)) + big * self.gamma;
        }
        t
    }

    /// Recursive halving (ReduceScatter: far partners first, halves of the vector) and
    /// doubling (AllGather: near partners first, growing), Rabenseifner's AllReduce both.
    fn rdh(&self, coll: Collective, lay: &Layout, big: f64) -> Option<f64> {
        let (p, r) = rdh::fold(lay.n());
        let steps = p.trailing_zeros();
        let pairs = |bit: usize| (0..p).map(move |v| (rdh::real(v, r), rdh::real(v ^ bit, r)));
        let fold = if r > 0 {
            self.step(big, lay.crossing((0..r).map(|v| (2 * v, 2 * v + 1))))
        } else {
            0.0
        };
        let halving = || {
            (0..steps)
                .map(|s| {
                    let m = big / f64::from(1u32 << (s + 1));
                    self.step(m, lay.crossing(pairs(p >> (s + 1)))) + m * self.gamma
                })
                .sum::<f64>()
        };
        let doubling = || {
            (0..steps)
                .map(|s| {
                    let m = big * f64::from(1u32 << s) / p as f64;
                    self.step(m, lay.crossing(pairs(1 << s)))
                })
                .sum::<f64>()
        };
        let red_fold = if r > 0 { big * self.gamma } else { 0.0 };
        Some(match coll {
            Collective::AllReduce => 2.0 * fold + red_fold + halving() + doubling(),
            Collective::ReduceScatter => fold + red_fold + halving(),
            Collective::AllGather => fold + doubling(),
            _ => return None,
        })
    }

    /// NCCL's binary tree (and the double tree, two of them each on half the data): each level
    /// of the tree pays the alpha of the links it uses, up and down; the pipelined bytes go at
    /// the most loaded host link, and each interior node reduces two children's partials (the
    /// double tree's on half the data). The pipeline's fill is `pipeline_fill`'s, level by level:
    /// the first slice climbs and descends each level at that level's link, two children
    /// sharing their parent's side of it.
    fn btree(&self, algo: Algorithm, lay: &Layout, big: f64) -> f64 {
        let t = tree::btree(lay.n());
        let depth = depths(&t.parent);
        let levels = depth.iter().copied().max().unwrap_or(0);
        let dbtree = algo == Algorithm::DbTree;
        // A slice of each tree (the double tree's halves are sliced apart).
        let s = if dbtree { big / 2.0 } else { big }.min(self.slice);
        let mut lat = 0.0;
        let mut first = 0.0;
        for l in 1..=levels {
            let edges = (0..lay.n())
                .filter(|&v| depth[v] == l)
                .filter_map(|v| Some((v, t.parent[v]?)));
            let (cross, local) = lay.crossing(edges);
            let link = if cross > 0 { self.inter } else { self.intra };
            lat += link.alpha_us + if dbtree { link.o_us } else { 0.0 };
            let mut b = if local {
                self.intra.beta_us_per_byte
            } else {
                0.0
            };
            if cross > 0 {
                b = b.max(cross as f64 * self.inter.beta_us_per_byte);
            }
            // The root has one child: half the level's bytes and reductions.
            let share = if l == 1 && t.children[0].len() < 2 {
                0.5
            } else {
                1.0
            };
            first += share * s * (4.0 * b + 2.0 * self.gamma);
        }
        let edges = || (0..lay.n()).filter_map(|v| Some((v, t.parent[v]?)));
        let (up, local) = lay.crossing(edges());
        let (down, _) = lay.crossing(edges().map(|(a, b)| (b, a)));
        let cross = up.max(down) as f64;
        let mut beta = if local {
            self.intra.beta_us_per_byte
        } else {
            0.0
        };
        if cross > 0.0 {
            beta = beta.max(cross * self.inter.beta_us_per_byte);
        }
        let (bytes, reduced, msg) = if dbtree {
            (2.0, 1.0, big / 2.0)
        } else {
            (3.0, 2.0, big)
        };
        let piped = |v: f64| bytes * v * beta + reduced * v * self.gamma;
        // One slice's share of the pipelined time is in `piped(big)` already.
        let fill = (first - piped(if dbtree { 2.0 * s } else { s })).max(0.0);
        let link = if cross > 0.0 { self.inter } else { self.intra };
        2.0 * lat
            + piped(big)
            + fill
            + 2.0 * f64::from(levels as u32) * link.rendezvous(2.0, msg, self.serial)
    }

    /// Binomial Broadcast / Reduce from `root` in slices (`binomial_piped`): one round per
    /// distance, each at the level it crosses with as many of a host's ranks sending across as
    /// the round has.
    fn binomial(&self, coll: Collective, lay: &Layout, big: f64, root: usize) -> f64 {
        let n = lay.n();
        let s = big.min(self.slice);
        let mut rounds = Vec::new();
        let mut bit = 1;
        while bit < n {
            // Relative members v with lowest set bit `bit` hang under v - bit.
            let edges = (0..n)
                .filter(|v| v & v.wrapping_neg() == bit)
                .map(|v| ((v - bit + root) % n, (v + root) % n));
            let pairs: Vec<(usize, usize)> = match coll {
                Collective::Reduce => edges.map(|(a, b)| (b, a)).collect(),
                _ => edges.collect(),
            };
            let crossing = lay.crossing(pairs.into_iter());
            let alpha = self.step(0.0, crossing);
            rounds.push(Round {
                inter: crossing.0 > 0,
                alpha,
                whole: self.step(big, crossing) - alpha,
                slice: self.step(s, crossing) - alpha,
            });
            bit <<= 1;
        }
        binomial_piped(coll, &rounds, big, s, self.gamma)
    }
}

/// Each node's depth in a tree given by its parents (the root at 0).
fn depths(parent: &[Option<usize>]) -> Vec<usize> {
    (0..parent.len())
        .map(|mut v| {
            let mut d = 0;
            while let Some(p) = parent[v] {
                v = p;
                d += 1;
            }
            d
        })
        .collect()
}

//! The tuner plugin's decisions (NCCL's `ncclTunerPlugin_v2` ... `_v6`; the ABI is
//! `ffi::tuner`). NCCL hands `getCollInfo` its cost table, predicted microseconds per
//! (algorithm, protocol), and runs the smallest entry that is not -1. We rewrite two cells only:
//! COLLNET_DIRECT and COLLNET_CHAIN with the SIMPLE protocol, for the collectives CollNet runs
//! (AllReduce, AllGather, ReduceScatter).
//!
//! Both sides of the comparison are priced with one model, the cost model of `auto`
//! (`tune::Model`, with the parameters a CollNet communicator has, since it does not
//! calibrate: `collnet_model`):
//! - CollNet (`Price::us`): our engines for one rank per node, over the chunks NCCL hands them
//!   one call each (docs/nccl-abi.md, "The collective network plugin"), plus, where NCCL's
//!   CollNet buffers are host memory
//!   (`Staging::HOST`), each call's copy down to the host and back up. The host reduction is
//!   the engines' gamma term.
//! - NCCL's ring over our net plugin (`ring_us`): 2(n-1) alphas and 2(n-1)/n of the bytes per
//!   node over the same beta for an AllReduce ((n-1) and (n-1)/n for the others); its
//!   reductions run on the GPU, so no gamma.
//!
//! NCCL's own estimates are on another scale than measured times (docs/validation.md compares
//! them), so our CollNet price is not written as it is: the cell becomes NCCL's
//! own estimate of its ring (the best usable RING cell) times our ratio CollNet / ring. NCCL then
//! picks CollNet where our model says it beats the ring over the plugin, and compares it with
//! its other algorithms on its own scale. Without a usable RING cell, NCCL's best other cell is
//! the anchor; with no other cell at all, the price itself is written. A -1 cell stays -1,
//! every other cell stays as NCCL wrote it, and nothing here fails: a case we cannot price is
//! left alone.
//!
//! The chunks are ours on v6 (`getChunkSize`: the smallest power of two beyond which larger
//! chunks stop paying, `best_chunk`) and NCCL's own before (`nccl_chunk`, an approximation of
//! what NCCL picks). Chunks are priced one after another, as the engines receive them: a
//! conservative price, since it counts no overlap between NCCL's chunks in flight.
use super::handles::HandleTable;
use super::{handle_tag, Kind};
use crate::algo::{self, Algorithm, Collective, Options, Problem};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::tune::{Model, MARGIN};
use once_cell::sync::OnceCell;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// NCCL's algorithm numbers (`nccl_tuner.h`): the rows of the cost table.
pub const ALGO_RING: usize = 1;
pub const ALGO_COLLNET_DIRECT: usize = 2;
pub const ALGO_COLLNET_CHAIN: usize = 3;
/// NCCL's SIMPLE protocol, the only one CollNet runs: the column we write.
pub const PROTO_SIMPLE: usize = 2;
/// NCCL's mark of a disabled or unsupported cell (`NCCL_ALGO_PROTO_IGNORE`).
pub const IGNORE: f32 = -1.0;
/// `ncclFunc_t` values of the collectives CollNet runs.
pub const FUNC_ALLGATHER: i32 = 2;
pub const FUNC_REDUCESCATTER: i32 = 3;
pub const FUNC_ALLREDUCE: i32 = 4;

/// Smallest chunk we pick: NCCL's own smallest CollNet chunk.
pub const MIN_CHUNK: usize = 32 << 10;
/// Largest chunk we pick: one step of NCCL's default SIMPLE buffer (4 MiB over 8 steps). NCCL
/// clamps a larger answer to its buffer, so pricing larger chunks would promise too much.
pub const MAX_CHUNK: usize = 512 << 10;

/// Doubles in NCCL's `ncclTunerConstants_v5_t` (and v6's, the same struct).
pub const CONSTANTS_LEN: usize = 7 * 3 + 3 * 7 * 3 + 5 * 4 * 3;

const ALGO_NAMES: [&str; 7] = [
    "TREE",
    "RING",
    "COLLNET_DIRECT",
    "COLLNET_CHAIN",
    "NVLS",
    "NVLS_TREE",
    "PAT",
];
const PROTO_NAMES: [&str; 3] = ["LL", "LL128", "SIMPLE"];

/// The collective of an `ncclFunc_t` that CollNet runs; None for every other value (Broadcast,
/// Reduce, SendRecv, values newer than this list): those calls are left untouched.
pub fn collective(func: i32) -> Option<Collective> {
    match func {
        FUNC_ALLGATHER => Some(Collective::AllGather),
        FUNC_REDUCESCATTER => Some(Collective::ReduceScatter),
        FUNC_ALLREDUCE => Some(Collective::AllReduce),
        _ => None,
    }
}

/// Whose chunk size prices CollNet: ours (v6, where NCCL asks `getChunkSize`) or NCCL's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chunking {
    Ours,
    Nccl,
}

/// NCCL's cost table for one collective: `float[nalgo][nproto]`, row-major.
pub struct CostTable<'a> {
    cells: &'a mut [f32],
    nalgo: usize,
    nproto: usize,
}

impl<'a> CostTable<'a> {
    /// The table over `cells`, which must hold `nalgo * nproto` entries.
    pub fn new(cells: &'a mut [f32], nalgo: usize, nproto: usize) -> Result<CostTable<'a>> {
        if nalgo.checked_mul(nproto) != Some(cells.len()) {
            return Err(Error::arg(
                "collCostTable",
                format!("{} cells for {nalgo} x {nproto}", cells.len()),
            ));
        }
        Ok(CostTable {
            cells,
            nalgo,
            nproto,
        })
    }

    /// The cell of (`algo`, `proto`); None outside the table.
    pub fn get(&self, algo: usize, proto: usize) -> Option<f32> {
        (algo < self.nalgo && proto < self.nproto).then(|| self.cells[algo * self.nproto + proto])
    }

    fn set(&mut self, algo: usize, proto: usize, v: f32) {
        self.cells[algo * self.nproto + proto] = v;
    }

    /// NCCL's smallest usable estimate outside CollNet: (time, algorithm, protocol).
    pub fn best_other(&self) -> Option<(f32, usize, usize)> {
        let mut best: Option<(f32, usize, usize)> = None;
        for a in (0..self.nalgo).filter(|a| !is_collnet(*a)) {
            for p in 0..self.nproto {
                let t = self.cells[a * self.nproto + p];
                if t >= 0.0 && best.is_none_or(|b| t < b.0) {
                    best = Some((t, a, p));
                }
            }
        }
        best
    }

    /// NCCL's estimate our CollNet cells are scaled from: its best usable RING cell, else its
    /// best usable cell outside CollNet; None where CollNet is NCCL's only option.
    pub fn anchor(&self) -> Option<(f32, usize, usize)> {
        let ring = (0..self.nproto)
            .filter_map(|p| self.get(ALGO_RING, p).map(|t| (t, ALGO_RING, p)))
            .filter(|c| c.0 >= 0.0)
            .min_by(|x, y| x.0.total_cmp(&y.0));
        ring.or_else(|| self.best_other())
    }
}

/// The value of a CollNet cell for price `p` against NCCL's `anchor` estimate: the anchor
/// times our ratio CollNet / ring, or our price itself without an anchor.
pub fn cell_value(p: &Price, anchor: Option<f32>) -> f64 {
    match anchor {
        Some(a) if p.ring_us > 0.0 => f64::from(a) * p.us / p.ring_us,
        _ => p.us,
    }
}

fn is_collnet(algo: usize) -> bool {
    algo == ALGO_COLLNET_DIRECT || algo == ALGO_COLLNET_CHAIN
}

fn cell_name(algo: usize, proto: usize) -> String {
    format!(
        "{}/{}",
        ALGO_NAMES.get(algo).copied().unwrap_or("?"),
        PROTO_NAMES.get(proto).copied().unwrap_or("?")
    )
}

/// What a CollNet call's data goes through besides the engines: with NCCL's CollNet buffers
/// in host memory (the plugin's ptrSupport is HOST), the GPU's data goes down to host memory
/// before the engines run and comes back up after; with device buffers, neither.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Staging {
    /// Fixed cost of one copy: the copy itself starting and NCCL's proxy noticing its end.
    pub copy_us: f64,
    /// Microseconds per byte copied between device and host.
    pub copy_us_per_byte: f64,
}

/// Fixed cost of one staging copy (a launch and a synchronisation, microseconds).
pub const STAGING_COPY_US: f64 = 10.0;
/// Bandwidth of a staging copy (GB/s): PCIe 4.0 x16 with pinned memory, the slower of the
/// links NCCL's GPUs sit behind.
pub const STAGING_COPY_GBPS: f64 = 25.0;

impl Staging {
    /// NCCL's CollNet buffers are host memory: two copies per call.
    pub const HOST: Staging = Staging {
        copy_us: STAGING_COPY_US,
        copy_us_per_byte: 1.0 / (STAGING_COPY_GBPS * 1e3),
    };
    /// The plugin takes device buffers: no copies.
    pub const NONE: Staging = Staging {
        copy_us: 0.0,
        copy_us_per_byte: 0.0,
    };

    /// The two copies of one call of `coll` over a whole vector of `bytes` on `n` nodes: this
    /// node's input down (the whole vector for AllReduce and ReduceScatter, its part for
    /// AllGather) and its output up (its part for ReduceScatter, the whole vector otherwise).
    pub fn call_us(&self, coll: Collective, n: usize, bytes: usize) -> f64 {
        if *self == Staging::NONE {
            return 0.0;
        }
        let part = bytes.div_ceil(n.max(1));
        let (down, up) = match coll {
            Collective::AllGather => (part, bytes),
            Collective::ReduceScatter => (bytes, part),
            _ => (bytes, bytes),
        };
        2.0 * self.copy_us + (down + up) as f64 * self.copy_us_per_byte
    }
}

/// Our price of one CollNet collective.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    /// Predicted microseconds of the whole collective, staging included.
    pub us: f64,
    /// Of which the staging copies.
    pub staging_us: f64,
    /// NCCL's ring over our net plugin for the same collective, on the same model.
    pub ring_us: f64,
    /// The chunk size it is priced with (a power of two), and how many calls that makes.
    pub chunk: usize,
    pub chunks: usize,
    /// The engines' algorithm for a full chunk.
    pub algo: Algorithm,
}

/// One communicator's tuner: what `init` said, and the model it prices with.
pub struct Tuner {
    pub nranks: usize,
    pub nnodes: usize,
    /// `FABRICOLL_TUNER`: false leaves every call as NCCL gave it.
    pub enabled: bool,
    pub chunking: Chunking,
    /// NCCL's tuning constants (v5 and later), as `init` passed them. Recorded, not edited.
    pub constants: Option<Box<[f64; CONSTANTS_LEN]>>,
    model: Model,
    /// The algorithm the configuration forces on communicators (`FABRICOLL_ALGO`), which a
    /// CollNet communicator runs instead of the model's choice.
    forced: crate::config::AlgoSetting,
    /// Where NCCL's CollNet buffers live, and so what each call copies.
    pub staging: Staging,
    logged: Mutex<HashSet<(i32, u32)>>,
    /// Prices worked out, by (collective, bytes, algorithm): NCCL asks on every call, and a
    /// training loop repeats its sizes.
    prices: Mutex<HashMap<(Collective, usize, usize), Option<Price>>>,
}

/// How many prices a tuner keeps (a new one beyond that clears them).
const PRICES_KEPT: usize = 1024;

impl Tuner {
    pub fn new(
        nranks: usize,
        nnodes: usize,
        model: Model,
        enabled: bool,
        chunking: Chunking,
    ) -> Tuner {
        Tuner {
            nranks,
            nnodes,
            enabled,
            chunking,
            constants: None,
            model,
            forced: Default::default(),
            staging: Staging::HOST,
            logged: Mutex::new(HashSet::new()),
            prices: Mutex::new(HashMap::new()),
        }
    }

    /// This tuner with NCCL's constants recorded.
    pub fn with_constants(mut self, c: [f64; CONSTANTS_LEN]) -> Tuner {
        self.constants = Some(Box::new(c));
        self
    }

    /// This tuner for communicators whose algorithms are forced as `algo` says.
    pub fn with_forced(mut self, algo: crate::config::AlgoSetting) -> Tuner {
        self.forced = algo;
        self
    }

    /// This tuner for CollNet buffers of the kind `staging` describes.
    pub fn with_staging(mut self, staging: Staging) -> Tuner {
        self.staging = staging;
        self
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The engines' choice and predicted time for one CollNet call of `bytes` (the whole
    /// vector: an AllGather / ReduceScatter window covers every node's part) on `nnodes`
    /// ranks, as a CollNet communicator decides it (`coll::Comm::choose` with one host).
    pub fn chunk_time(&self, coll: Collective, bytes: usize) -> Option<(Algorithm, f64)> {
        let n = self.nnodes.max(1);
        let count = match coll {
            Collective::AllReduce => bytes,
            _ => bytes.div_ceil(n),
        };
        let p = Problem::new(coll, n, count);
        // `FABRICOLL_ALGO` forces the communicator's algorithm where it implements `coll`.
        let forced = match self.forced.of(coll) {
            crate::config::Forced::Explicit(a) | crate::config::Forced::Plain(a) => Some(a),
            crate::config::Forced::Auto => None,
        }
        .filter(|a| algo::supports(*a, coll));
        let (algo, t) = match forced.and_then(|a| Some((a, self.model.predict(a, &p, 1)?))) {
            Some(at) => at,
            None => {
                let (a, _) = self.model.choose(&p, 1, Options::default());
                (a, self.model.predict(a, &p, 1)?)
            }
        };
        t.is_finite().then_some((algo, t))
    }

    /// One call of `bytes`: the engines' time and the staging copies around them.
    fn call_time(&self, coll: Collective, bytes: usize) -> Option<(f64, f64)> {
        let (_, t) = self.chunk_time(coll, bytes)?;
        Some((t, self.staging.call_us(coll, self.nnodes, bytes)))
    }

    /// Predicted time of `nbytes` in calls of `chunk` bytes, one after another, staging
    /// included; and the staging's share.
    fn times_in_chunks(&self, coll: Collective, nbytes: usize, chunk: usize) -> Option<(f64, f64)> {
        let chunk = chunk.max(1);
        let (full, rest) = (nbytes / chunk, nbytes % chunk);
        let (mut t, mut s) = (0.0, 0.0);
        if full > 0 {
            let (e, c) = self.call_time(coll, chunk)?;
            t += full as f64 * (e + c);
            s += full as f64 * c;
        }
        if rest > 0 || full == 0 {
            let (e, c) = self.call_time(coll, rest)?;
            t += e + c;
            s += c;
        }
        Some((t, s))
    }

    /// Predicted time of `nbytes` in calls of `chunk` bytes, one after another, staging
    /// included.
    pub fn time_in_chunks(&self, coll: Collective, nbytes: usize, chunk: usize) -> Option<f64> {
        self.times_in_chunks(coll, nbytes, chunk).map(|(t, _)| t)
    }

    /// NCCL's ring over our net plugin for `coll` over `nbytes` (the whole vector) among the
    /// nodes, on the same model as CollNet: for an AllReduce 2(n-1) alphas and 2(n-1)/n of the
    /// bytes over beta, half of each for AllGather and ReduceScatter; no gamma (NCCL reduces
    /// on the GPU) and no staging (NCCL's own pipeline copies). None with fewer than 2 nodes.
    pub fn ring_us(&self, coll: Collective, nbytes: usize) -> Option<f64> {
        if self.nnodes < 2 {
            return None;
        }
        let m = &self.model;
        let t = crate::tune::formula(
            Algorithm::Ring,
            coll,
            self.nnodes as f64,
            nbytes as f64,
            (m.alpha_us, m.beta_us_per_byte, m.alpha_us / 2.0, 0.0),
        )?;
        t.is_finite().then_some(t)
    }

    /// Our chunk for `nbytes`: from `MIN_CHUNK`, doubled while the doubled chunk is predicted
    /// more than `tune::MARGIN` faster, up to `MAX_CHUNK` (a power of two in between). Larger
    /// chunks save per-call latency; past this point the saving is too small to give up the
    /// overlap that smaller chunks leave NCCL.
    pub fn best_chunk(&self, coll: Collective, nbytes: usize) -> usize {
        let mut c = MIN_CHUNK;
        while c < MAX_CHUNK && c < nbytes {
            let (Some(now), Some(next)) = (
                self.time_in_chunks(coll, nbytes, c),
                self.time_in_chunks(coll, nbytes, 2 * c),
            ) else {
                break;
            };
            if next >= now * (1.0 - MARGIN) {
                break;
            }
            c *= 2;
        }
        c
    }

    /// The chunk `algo` runs `nbytes` with under this tuner's `chunking`.
    pub fn chunk_for(&self, algo: usize, coll: Collective, nbytes: usize) -> usize {
        match self.chunking {
            Chunking::Ours => self.best_chunk(coll, nbytes),
            Chunking::Nccl => nccl_chunk(algo, nbytes),
        }
    }

    /// Our price of `coll` over `nbytes` with CollNet algorithm `algo`; None where CollNet is
    /// not ours to price (fewer than two nodes: NCCL enables CollNet from two).
    pub fn price(&self, algo: usize, coll: Collective, nbytes: usize) -> Option<Price> {
        if self.nnodes < 2 || !is_collnet(algo) {
            return None;
        }
        let key = (coll, nbytes, algo);
        if let Some(p) = self.prices.lock().get(&key) {
            return *p;
        }
        let p = self.work_out(algo, coll, nbytes);
        let mut prices = self.prices.lock();
        if prices.len() >= PRICES_KEPT {
            prices.clear();
        }
        prices.insert(key, p);
        p
    }

    /// `price` without the kept prices.
    fn work_out(&self, algo: usize, coll: Collective, nbytes: usize) -> Option<Price> {
        let chunk = self.chunk_for(algo, coll, nbytes);
        let (us, staging_us) = self.times_in_chunks(coll, nbytes, chunk)?;
        let (engine, _) = self.chunk_time(coll, chunk.min(nbytes))?;
        let ring_us = self.ring_us(coll, nbytes)?;
        Some(Price {
            us,
            staging_us,
            ring_us,
            chunk,
            chunks: nbytes.div_ceil(chunk).max(1),
            algo: engine,
        })
    }

    /// `getCollInfo`: write our price into the usable CollNet cells of `table` for CollNet's
    /// collectives; leave everything else. Never fails.
    pub fn get_coll_info(&self, func: i32, nbytes: usize, table: &mut CostTable) {
        let Some(coll) = collective(func).filter(|_| self.enabled && self.nnodes >= 2) else {
            return;
        };
        let before: Vec<(usize, f32)> = [ALGO_COLLNET_DIRECT, ALGO_COLLNET_CHAIN]
            .into_iter()
            .filter_map(|a| table.get(a, PROTO_SIMPLE).map(|t| (a, t)))
            .filter(|(_, t)| *t >= 0.0)
            .collect();
        let anchor = table.anchor();
        let mut ours = Vec::new();
        for &(a, _) in &before {
            let Some(p) = self.price(a, coll, nbytes) else {
                continue;
            };
            let v = cell_value(&p, anchor.map(|x| x.0));
            if v.is_finite() && v <= f64::from(f32::MAX) {
                table.set(a, PROTO_SIMPLE, v as f32);
                ours.push((a, p, v));
            }
        }
        self.log_decision(func, coll, nbytes, table, &before, &ours);
    }

    /// `getChunkSize` (v6): our chunk for CollNet's cells, `chunk` untouched otherwise.
    pub fn get_chunk_size(&self, func: i32, nbytes: usize, algo: i32, proto: i32) -> Option<usize> {
        let coll = collective(func).filter(|_| self.enabled && self.nnodes >= 2)?;
        let algo = usize::try_from(algo).ok().filter(|a| is_collnet(*a))?;
        if usize::try_from(proto).ok() != Some(PROTO_SIMPLE) {
            return None;
        }
        self.price(algo, coll, nbytes).map(|p| p.chunk)
    }

    /// One info line per (collective, power-of-two size class) and communicator: our
    /// prices, NCCL's own CollNet estimates they replaced, and NCCL's best other cell.
    fn log_decision(
        &self,
        func: i32,
        coll: Collective,
        nbytes: usize,
        table: &CostTable,
        before: &[(usize, f32)],
        ours: &[(usize, Price, f64)],
    ) {
        let class = nbytes.max(1).ilog2();
        if !log::log_enabled!(log::Level::Info) || !self.logged.lock().insert((func, class)) {
            return;
        }
        let other = table.best_other();
        let prices: Vec<String> = ours
            .iter()
            .map(|(a, p, v)| {
                let was = before.iter().find(|b| b.0 == *a).map_or(-1.0, |b| b.1);
                format!(
                    "{} {:.1} us ({} in {} call(s) of {} B, {:.1} us of it staging; ring over \
                     the plugin {:.1} us; written {v:.1} us, NCCL said {was:.1} us)",
                    cell_name(*a, PROTO_SIMPLE),
                    p.us,
                    p.algo,
                    p.chunks,
                    p.chunk.min(nbytes.max(1)),
                    p.staging_us,
                    p.ring_us,
                )
            })
            .collect();
        // The anchor reads cells outside CollNet only, which we left as they were.
        let scale = match table.anchor() {
            Some((t, a, p)) => format!("scaled from NCCL's {} ({t:.1} us)", cell_name(a, p)),
            None => "our prices as they are".to_string(),
        };
        let best_ours = ours.iter().map(|o| o.2).fold(f64::INFINITY, f64::min);
        let verdict = match other {
            _ if ours.is_empty() => "CollNet is disabled here: NCCL's choice stands".to_string(),
            Some((t, a, p)) if f64::from(t) <= best_ours => {
                format!("NCCL keeps {} ({t:.1} us)", cell_name(a, p))
            }
            Some((t, a, p)) => {
                format!("CollNet beats NCCL's best, {} ({t:.1} us)", cell_name(a, p))
            }
            None => "CollNet is NCCL's only option".to_string(),
        };
        log::info!(
            "tuner: {coll:?} of {nbytes} B (class 2^{class}) on {} nodes, {} ranks: {} ({scale}); \
             {verdict}",
            self.nnodes,
            self.nranks,
            if prices.is_empty() {
                "no usable CollNet cell".to_string()
            } else {
                prices.join(", ")
            }
        );
    }
}

/// NCCL's own CollNet chunk, approximately: 512 KiB for Direct, 256 KiB for Chain (one step
/// of its default buffer, Chain capped lower), halved while the message would give fewer than
/// eight chunks, down to 32 KiB. What versions without `getChunkSize` run with.
pub fn nccl_chunk(algo: usize, nbytes: usize) -> usize {
    let mut c = if algo == ALGO_COLLNET_CHAIN {
        MAX_CHUNK / 2
    } else {
        MAX_CHUNK
    };
    while c > MIN_CHUNK && nbytes < 8 * c {
        c /= 2;
    }
    c
}

/// The model a CollNet communicator of this process chooses with: the configuration's
/// parameters (`FABRICOLL_ALPHA_US`, ... or the defaults; it does not calibrate) and the eager
/// limit of the plugin's transport, which an endpoint of device 0 reports. Without a usable
/// device, no eager limit.
pub fn collnet_model(cfg: &Config) -> Model {
    static EAGER: OnceCell<usize> = OnceCell::new();
    let eager = *EAGER.get_or_init(|| {
        let t = super::global().and_then(|p| p.device(0)?.open_endpoint());
        match t {
            Ok(t) => t.caps().eager_bytes,
            Err(e) => {
                log::info!(
                    "tuner: no endpoint to read the eager limit from ({e}); pricing without one"
                );
                usize::MAX
            }
        }
    });
    Model::from_config(cfg).with_eager(eager)
}

/// What NCCL's CollNet buffers go through on this process's plugin: no copies where CollNet's
/// device 0 takes device memory (its ptrSupport has NCCL_PTR_CUDA), host staging otherwise
/// (and without a usable device).
pub fn collnet_staging() -> Staging {
    let bits = super::global().and_then(|p| super::collnet::props(p, 0).map(|d| d.ptr_support));
    match bits {
        Ok(bits) if bits & super::NCCL_PTR_CUDA != 0 => Staging::NONE,
        _ => Staging::HOST,
    }
}

/// Tuner contexts handed to NCCL, by handle.
static CONTEXTS: Mutex<Option<HandleTable<Arc<Tuner>>>> = Mutex::new(None);

/// Keep `t` for a communicator; its handle is NCCL's context.
pub fn open(t: Tuner) -> u64 {
    let mut g = CONTEXTS.lock();
    g.get_or_insert_with(HandleTable::new)
        .insert(handle_tag(0, Kind::Ctx), Arc::new(t))
}

/// The tuner of context `id`.
pub fn context(id: u64) -> Result<Arc<Tuner>> {
    CONTEXTS
        .lock()
        .as_ref()
        .and_then(|t| t.get(id).cloned())
        .ok_or_else(|| Error::arg("context", format!("{id:#x} is not an open tuner context")))
}

/// Forget context `id` (`finalize` / `destroy`).
pub fn close(id: u64) -> Result<()> {
    CONTEXTS
        .lock()
        .as_mut()
        .and_then(|t| t.remove(id))
        .map(|_| ())
        .ok_or_else(|| Error::arg("context", format!("{id:#x} is not an open tuner context")))
}

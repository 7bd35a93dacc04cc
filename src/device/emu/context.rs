//! The emulated device's context: what every emulated device of one ordinal in the process
//! shares, as every user of a CUDA device in a process shares its primary context (the CUDA
//! runtime, torch, NCCL, and each `Device::cuda` of that ordinal, ranks as threads included).
//!
//! The CUDA driver makes some calls wait for every stream of the context to drain, under the
//! context's lock: allocating and freeing page-locked memory, creating a stream, loading a
//! module (and, under lazy loading, a kernel's first launch). So a stream of one rank waiting
//! for a flag holds up another rank's allocation on another thread, whatever `Device` object
//! each holds. Here each ordinal has one registry entry, kept for the process's life: the
//! stream tables of its live devices (held weakly, so a dropped device leaves it) and whether
//! its kernels are loaded. `wait_idle` is the driver's device-wide wait. The context also has
//! the hardware queues its streams run on (`queue`), as many as the device that made it asked
//! for.
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use super::engine::Worker;
use super::queue::{HwQueue, Queues};
use crate::{Error, Result};

/// One emulated device's streams, by id.
pub(super) type StreamTable = Mutex<HashMap<u64, Arc<Worker>>>;

/// What the devices of one ordinal share.
#[derive(Default)]
struct Context {
    /// The stream tables of the devices opened on this ordinal (dead ones pruned on use).
    devices: Vec<Weak<StreamTable>>,
    /// Whether the reduction kernels are loaded in the context (once per process, as
    /// `cuda::Shared` loads them).
    kernels_loaded: bool,
    /// The hardware queues (None until a device made the context).
    queues: Option<Queues>,
}

fn registry() -> std::sync::MutexGuard<'static, HashMap<i32, Context>> {
    static REGISTRY: OnceLock<Mutex<HashMap<i32, Context>>> = OnceLock::new();
    // A poisoned lock still holds a consistent map: every update is one push or one store.
    lock(REGISTRY.get_or_init(Default::default))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Adds a device's stream table to `ordinal`'s context, which has `queues` hardware queues:
/// made so where no live device holds the context (the driver reads
/// `CUDA_DEVICE_MAX_CONNECTIONS` when it makes a context), else an error naming `queues` where
/// the context has another number.
pub(super) fn join(ordinal: i32, streams: &Arc<StreamTable>, queues: usize) -> Result<()> {
    let mut r = registry();
    let c = r.entry(ordinal).or_default();
    c.devices.retain(|d| d.strong_count() > 0);
    match &c.queues {
        Some(q) if !c.devices.is_empty() && q.len() != queues => {
            return Err(Error::arg(
                "queues",
                format!(
                    "{queues} hardware queues, but emulated device {ordinal}'s context, made by \
                     a device still open, has {} (a context's queues are fixed when it is made)",
                    q.len()
                ),
            ));
        }
        Some(_) if !c.devices.is_empty() => {}
        _ => c.queues = Some(Queues::new(queues)),
    }
    c.devices.push(Arc::downgrade(streams));
    Ok(())
}

/// The hardware queue of a stream created now on `ordinal` (round-robin).
pub(super) fn assign_queue(ordinal: i32) -> Arc<HwQueue> {
    registry()
        .entry(ordinal)
        .or_default()
        .queues
        .get_or_insert_with(|| Queues::new(1))
        .assign()
}

/// Whether `ordinal`'s kernels are loaded in the process.
pub(super) fn kernels_loaded(ordinal: i32) -> bool {
    registry().get(&ordinal).is_some_and(|c| c.kernels_loaded)
}

/// Records that `ordinal`'s kernels are loaded (for the rest of the process).
pub(super) fn set_kernels_loaded(ordinal: i32) {
    registry().entry(ordinal).or_default().kernels_loaded = true;
}

/// Every stream of `ordinal`'s context, whichever device made it.
fn streams(ordinal: i32) -> Vec<Arc<Worker>> {
    let tables: Vec<Arc<StreamTable>> = {
        let mut r = registry();
        let Some(c) = r.get_mut(&ordinal) else {
            return Vec::new();
        };
        c.devices.retain(|d| d.strong_count() > 0);
        c.devices.iter().filter_map(Weak::upgrade).collect()
    };
    tables
        .iter()
        .flat_map(|t| lock(t).values().cloned().collect::<Vec<_>>())
        .collect()
}

/// What the CUDA driver does for a call it makes device-wide (`call`, named in the error):
/// waits until no stream of `ordinal`'s context has work left, a flag wait included, whichever
/// emulated device of the process made the stream. Where a stream waits for a flag that only
/// the calling side would write, a GPU never returns; here the wait ends after `limit` with a
/// `Timeout` naming `call`.
pub(super) fn wait_idle(ordinal: i32, limit: Duration, call: &str) -> Result<()> {
    let busy = || streams(ordinal).iter().filter(|w| !w.idle()).count();
    if wait_until(limit, || busy() == 0) {
        return Ok(());
    }
    Err(Error::Timeout(format!(
        "emulated device {ordinal}: {call} waits for every stream of the context, as the CUDA \
         driver does, and {} stream(s) still had work after {} ms (the context is shared by \
         every device of ordinal {ordinal} in the process, ranks on other threads included; a \
         stream blocked on a flag that the calling side has yet to write never finishes on a \
         GPU: a deadlock)",
        busy(),
        limit.as_millis()
    )))
}

/// Polls `done` with a growing nap until it holds (true) or `limit` has passed (false): how the
/// emulated driver calls that wait for streams wait.
pub(super) fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    let mut nap = Duration::from_micros(1);
    while !done() {
        if start.elapsed() >= limit {
            return false;
        }
        nap = crate::device::stream::backoff(nap);
    }
    true
}

//! Neuron's plugin lifecycle: `init` once, `fini` closes everything, `init` again works (libnccom
//! unloads and re-loads the plugin in one process). No atexit teardown: the runtime calls `fini`.
use crate::error::{Error, Result};
use crate::ffi::logging::{self, NcclLogger};
use crate::plugin::{self, Flavour, Plugin};
use once_cell::sync::Lazy;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

/// Handles `fini` closed that the runtime may still close (its teardown races `fini`); forgotten
/// past this many, after which such a close is an error again.
const RETIRED_MAX: usize = 1 << 16;

/// Between `init` and `fini` (read on every call; written under `RETIRED`'s lock).
static UP: AtomicBool = AtomicBool::new(false);
/// What `fini` closed; its lock also orders `init` and `fini`.
static RETIRED: Lazy<Mutex<HashSet<u64>>> = Lazy::new(Default::default);

/// `init`: a second one without `fini` in between is a SystemError, as libnccom expects.
pub(crate) fn init(logger: Option<NcclLogger>) -> Result<()> {
    logging::init(logger);
    let _order = RETIRED.lock();
    if UP.load(Ordering::Acquire) {
        return Err(Error::System(
            "init: the plugin is already initialised (call fini first)".into(),
        ));
    }
    let p = plugin::global_as(Flavour::Neuron)?;
    UP.store(true, Ordering::Release);
    log::info!(
        "fabricoll {} Neuron net plugin: provider {}, {} device(s), libfabric {}, RMA {}",
        env!("CARGO_PKG_VERSION"),
        p.provider,
        p.devices.len(),
        crate::transport::fabric::runtime_version(),
        if p.devices.iter().any(|d| d.props.rma.is_some()) {
            "yes"
        } else {
            "no (the provider offers no RMA usable by virtual address)"
        }
    );
    Ok(())
}

/// `fini` (v6): closes every comm, request and registration, and each device's endpoint.
pub(crate) fn fini() -> Result<()> {
    let mut retired = RETIRED.lock();
    if !UP.load(Ordering::Acquire) {
        return Err(Error::System(
            "fini: the plugin is not initialised (a second fini, or no init)".into(),
        ));
    }
    let p = plugin::global_as(Flavour::Neuron)?;
    UP.store(false, Ordering::Release);
    if retired.len() > RETIRED_MAX {
        retired.clear();
    }
    let mut n = 0;
    for d in &p.devices {
        let closed = d.close_all();
        n += closed.len();
        retired.extend(closed);
    }
    log::info!("fini: closed {n} open object(s)");
    Ok(())
}

/// The plugin, between `init` and `fini`.
pub(crate) fn plugin() -> Result<&'static Plugin> {
    if !UP.load(Ordering::Acquire) {
        return Err(Error::InvalidUsage(
            "the Neuron plugin is not initialised (called before init or after fini)".into(),
        ));
    }
    plugin::global_as(Flavour::Neuron)
}

/// True when `fini` already closed handle `h`: closing it again succeeds quietly.
pub(crate) fn closed_by_fini(h: u64) -> bool {
    let closed = RETIRED.lock().remove(&h);
    if closed {
        log::trace!("close of {h:#x}: already closed by fini");
    }
    closed
}

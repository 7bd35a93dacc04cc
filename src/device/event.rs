//! `Event`: a point in a stream's work, to poll from the host (`query`, `wait`) or to make
//! another stream wait for (`Stream::wait_event`). Unlike CUDA, where querying an event never
//! recorded reports success, querying one here is an `InvalidUsage` error: it would otherwise
//! pass for completed work that was never enqueued.
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use super::backend::RawEvent;
use super::stream::{backoff, Shared, Stream};
use super::Device;
use crate::config::Timeout;
use crate::{Error, Result};

/// An event of one device.
pub struct Event {
    dev: Device,
    raw: RawEvent,
    /// The stream of the last record; None while never recorded.
    recorded: Mutex<Option<Weak<Shared>>>,
}

impl Event {
    pub(crate) fn create(dev: &Device) -> Result<Event> {
        dev.check_current()?;
        let raw = dev.backend().event_create()?;
        Ok(Event {
            dev: dev.clone(),
            raw,
            recorded: Mutex::new(None),
        })
    }

    pub(crate) fn record_on(&self, s: &Stream) -> Result<()> {
        self.dev.check_current()?;
        self.same_device(&s.shared.dev)?;
        // SAFETY: the event and the stream are live.
        unsafe { self.dev.backend().event_record(self.raw, s.shared.raw) }?;
        *self.lock() = Some(Arc::downgrade(&s.shared));
        Ok(())
    }

    /// Ok where the event belongs to `dev`; else an `InvalidArgument` naming `ev`.
    pub(crate) fn same_device(&self, dev: &Device) -> Result<()> {
        if !Arc::ptr_eq(&dev.backend_arc(), &self.dev.backend_arc()) {
            return Err(Error::arg(
                "ev",
                "the event belongs to another device than the stream",
            ));
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Weak<Shared>>> {
        self.recorded.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The raw event, if recorded; else the error naming `arg`.
    pub(crate) fn recorded_raw(&self, arg: &str) -> Result<RawEvent> {
        if self.lock().is_none() {
            return Err(Error::InvalidUsage(format!(
                "argument '{arg}': the event was never recorded on a stream"
            )));
        }
        Ok(self.raw)
    }

    /// Whether the work before the last record has completed. An event never recorded is an
    /// `InvalidUsage` error.
    pub fn query(&self) -> Result<bool> {
        let raw = self.recorded_raw("event")?;
        self.dev.check_current()?;
        // SAFETY: the event is live while self is.
        let done = unsafe { self.dev.backend().event_query(raw) }?;
        if done {
            if let Some(s) = self.lock().as_ref().and_then(Weak::upgrade) {
                s.reap_now();
            }
        }
        Ok(done)
    }

    /// Waits on the host until the event completes, at most `timeout`; past it, a `Timeout`
    /// error naming the flags its stream still waits for.
    pub fn wait(&self, timeout: impl Into<Timeout>) -> Result<()> {
        let timeout = timeout.into();
        let start = Instant::now();
        let mut nap = Duration::from_micros(1);
        while !self.query()? {
            if start.elapsed() >= timeout.limit {
                let why = match self.lock().as_ref().and_then(Weak::upgrade) {
                    Some(s) => s.pending_why(),
                    None => "its stream is gone".into(),
                };
                return Err(Error::Timeout(format!(
                    "event did not complete within {timeout}: {why}"
                )));
            }
            nap = backoff(nap);
        }
        Ok(())
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by event_create, destroyed once. CUDA defers an event's destruction
        // while a record of it is pending; the emulated device does too.
        unsafe { self.dev.backend().event_destroy(self.raw) };
    }
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let recorded = self.lock().is_some();
        write!(f, "Event({:#x}, recorded: {recorded})", self.raw.0)
    }
}

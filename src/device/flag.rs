//! `Flag`: a named 32-bit word in page-locked host memory mapped for the device, through
//! which the host and a stream signal each other without a host thread blocking on the stream.
//!
//! - The host sets it (`set`), and a stream waits for it (`Stream::wait_flag`: on CUDA
//!   `cuStreamWaitValue32` with `GEQ`, so the stream's later work starts only after the host's
//!   write, and no host thread waits).
//! - A stream writes it (`Stream::write_flag`: `cuStreamWriteValue32`) when it reaches that
//!   point, and the host polls it (`get`, `reached`) or waits for it with a deadline (`wait`).
//!
//! Values are compared wrap-around safe: a flag has reached `v` when `(word - v) as i32 >= 0`,
//! as `CU_STREAM_WAIT_VALUE_GEQ` does, so a counter that only grows can be reused forever.
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::memory::Span;
use super::{Device, HostBuffer};
use crate::config::Timeout;
use crate::{Error, Result};

/// Whether a word holding `word` has reached `value` (wrap-around safe).
pub fn reached(word: u32, value: u32) -> bool {
    (word.wrapping_sub(value) as i32) >= 0
}

/// A named flag word; clones share it.
#[derive(Clone)]
pub struct Flag {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    buf: HostBuffer,
}

impl Flag {
    pub(crate) fn new(dev: &Device, name: &str) -> Result<Flag> {
        if name.is_empty() {
            return Err(Error::arg("name", "a flag needs a name (errors name it)"));
        }
        let mut buf = dev.alloc_host(64)?;
        buf.as_mut_slice()?.fill(0);
        Ok(Flag {
            inner: Arc::new(Inner {
                name: name.to_string(),
                buf,
            }),
        })
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    fn word(&self) -> &AtomicU32 {
        // SAFETY: the buffer is at least 64 bytes of page-locked host memory, page aligned (so
        // 4-aligned), alive while self is; every host access to the word is atomic, and the
        // device's accesses are 32-bit aligned stores and loads.
        unsafe { AtomicU32::from_ptr(self.inner.buf.as_ptr().cast::<u32>()) }
    }

    /// The word now.
    pub fn get(&self) -> u32 {
        self.word().load(Ordering::Acquire)
    }

    /// Writes `value`; everything the host wrote before is visible to whoever sees it.
    pub fn set(&self, value: u32) {
        self.word().store(value, Ordering::Release);
    }

    /// Whether the word has reached `value` (see the module documentation).
    pub fn reached(&self, value: u32) -> bool {
        reached(self.get(), value)
    }

    /// Waits on the host until the word reaches `value`; past `timeout`, a `Timeout` error
    /// naming the flag, the value awaited and the value it holds.
    pub fn wait(&self, value: u32, timeout: impl Into<Timeout>) -> Result<()> {
        let timeout = timeout.into();
        let start = Instant::now();
        let mut nap = Duration::from_micros(1);
        loop {
            if self.reached(value) {
                return Ok(());
            }
            if start.elapsed() >= timeout.limit {
                return Err(Error::Timeout(format!(
                    "flag '{}' did not reach {value} within {timeout}: it holds {} (nobody wrote it?)",
                    self.name(),
                    self.get()
                )));
            }
            nap = super::stream::backoff(nap);
        }
    }

    /// The word's span, for the stream operations.
    pub(crate) fn span(&self) -> Span {
        self.inner.buf.slice(0..4).expect("a flag holds 64 bytes")
    }
}

impl std::fmt::Debug for Flag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Flag('{}' = {})", self.name(), self.get())
    }
}

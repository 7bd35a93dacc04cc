//! Idle policy: what a waiting thread does between polls that found nothing (`Idle`: spin,
//! then yield), and the collective's deadline, read every few polls.

use super::Exec;
use crate::error::{Error, Result};
use std::time::{Duration, Instant};

/// What a waiting thread does between polls that found nothing: spin while its ranks have a
/// core each (`spin`) for up to `window` of idleness, else (and after that) yield the core so
/// that ranks outnumbering the cores get to run.
pub struct Idle {
    spin: bool,
    window: Duration,
    since: Option<Instant>,
    rounds: u32,
}

impl Idle {
    /// Idle rounds between readings of the clock while spinning.
    const CLOCK_EVERY: u32 = 64;

    pub fn new(spin: bool, window: Duration) -> Idle {
        Idle {
            spin,
            window,
            since: None,
            rounds: 0,
        }
    }

    /// Something moved: the next idle round starts a new idle period.
    pub fn moved(&mut self) {
        self.since = None;
    }

    /// Whether the idle period has lasted `window` (reads the clock; `pause` asks only every
    /// `CLOCK_EVERY` rounds).
    pub fn expired(&mut self) -> bool {
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        now.duration_since(since) >= self.window
    }

    /// One idle round: a pause hint while spinning, else a yield.
    pub fn pause(&mut self) {
        if self.spin {
            self.rounds += 1;
            if self.rounds < Self::CLOCK_EVERY && self.since.is_some() {
                std::hint::spin_loop();
                return;
            }
            self.rounds = 0;
            if !self.expired() {
                std::hint::spin_loop();
                return;
            }
        }
        std::thread::yield_now();
    }
}

impl Exec {
    /// The deadline check: an error if nothing moved for the timeout. The clock is read every
    /// `DEADLINE_POLLS` polls, so the error comes at most that many polls late: little, as a
    /// poll that finds nothing is short (figures in docs/performance.md) and a waiter that
    /// sleeps polls at least every millisecond.
    pub fn check_deadline(&mut self) -> Result<()> {
        const DEADLINE_POLLS: u32 = 32;
        self.polls += 1;
        if self.finished || self.polls < DEADLINE_POLLS {
            return Ok(());
        }
        self.polls = 0;
        let now = Instant::now();
        let last = *self.last.get_or_insert(now);
        if std::mem::take(&mut self.moved) {
            self.last = Some(now);
            self.gone.progress();
            return Ok(());
        }
        self.stalled(now.duration_since(last));
        self.gone.no_progress(last, now);
        if now.duration_since(last) > self.job.args.timeout.limit {
            return Err(Error::Timeout(format!(
                "{:?} made no progress for {}: {} of {} steps done; is every rank alive and making the same call (collective, count, type, op, root)?",
                self.job.args.tags,
                self.job.args.timeout,
                self.done,
                self.state.len()
            )));
        }
        Ok(())
    }
}

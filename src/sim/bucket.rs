//! Token-bucket links: a link shaped as Linux's `tbf` qdisc shapes one. The link carries its
//! rate; its bucket holds up to `size` bytes of tokens, filling at the rate whenever the link
//! carries less than that, and while it holds tokens the link carries up to its `peak` speed
//! (whatever lies behind the shaper), the tokens draining at the difference. A link idle for
//! long enough therefore passes its next `size` bytes at the peak speed: that is what the
//! emulated hosts' links do (`scripts/netns-cluster.sh`), and what some clouds' burst
//! allowances do, but not a NIC's wire, which has no bucket.
//!
//! Between two changes of the link's flows the throughput is constant, so the bucket level is
//! linear in time: `Links` brings it up to date whenever it recomputes the link's rates, and
//! asks for an event when the bucket runs dry, where the link's capacity falls to its rate.
#![forbid(unsafe_code)]

/// Tokens below this many bytes are none (the rounding of a drained bucket).
const EMPTY_BYTES: f64 = 1e-6;

/// The bucket of one link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Bucket {
    /// The shaped rate and the peak speed, bytes per microsecond.
    rate: f64,
    peak: f64,
    /// The bucket's size and its tokens, bytes.
    size: f64,
    tokens: f64,
    /// When `tokens` was last brought up to date, and the link's throughput since.
    at: f64,
    thru: f64,
    /// Bumped by every change of the throughput, so that a stale dry event is skipped.
    pub(super) version: u32,
}

impl Bucket {
    /// A full bucket of `size` bytes on a link of `rate` (and `peak` > `rate`) bytes per us.
    pub(super) fn new(rate: f64, peak: f64, size: f64) -> Bucket {
        debug_assert!(rate > 0.0 && peak > rate && size > 0.0);
        Bucket {
            rate,
            peak,
            size,
            tokens: size,
            at: 0.0,
            thru: 0.0,
            version: 0,
        }
    }

    /// The tokens at `now`, the throughput having been `thru` since the last update.
    pub(super) fn advance(&mut self, now: f64) {
        let dt = (now - self.at).max(0.0);
        self.tokens = (self.tokens + (self.rate - self.thru) * dt).clamp(0.0, self.size);
        self.at = now;
    }

    /// The bucket ran dry at `now` (its event): no tokens left.
    pub(super) fn dry(&mut self, now: f64) {
        self.advance(now);
        self.tokens = 0.0;
    }

    /// What the link carries now: its peak while the bucket holds tokens, else its rate.
    pub(super) fn capacity(&self) -> f64 {
        if self.tokens > EMPTY_BYTES {
            self.peak
        } else {
            self.rate
        }
    }

    /// From `now` the link carries `thru` bytes per us: when its bucket runs dry at that
    /// throughput (None: it does not).
    pub(super) fn carry(&mut self, thru: f64, now: f64) -> Option<f64> {
        self.advance(now);
        self.thru = thru;
        self.version = self.version.wrapping_add(1);
        let excess = thru - self.rate;
        (self.tokens > EMPTY_BYTES && excess > self.rate * 1e-9).then(|| now + self.tokens / excess)
    }
}

#[cfg(test)]
mod tests {
    use super::Bucket;

    #[test]
    fn a_full_bucket_drains_at_the_excess_and_fills_at_the_spare_rate() {
        let mut b = Bucket::new(1.0, 5.0, 100.0);
        assert_eq!(b.capacity(), 5.0);
        // At the peak the bucket drains at the excess over the rate.
        assert_eq!(b.carry(5.0, 0.0), Some(25.0));
        b.dry(25.0);
        assert_eq!(b.capacity(), 1.0);
        // At the rate nothing drains or fills.
        assert_eq!(b.carry(1.0, 25.0), None);
        b.advance(1000.0);
        assert_eq!(b.capacity(), 1.0);
        // Idle, it fills at the rate, up to its size.
        assert_eq!(b.carry(0.0, 1000.0), None);
        b.advance(1040.0);
        assert!((b.tokens - 40.0).abs() < 1e-9);
        b.advance(2000.0);
        assert_eq!(b.tokens, 100.0);
    }
}

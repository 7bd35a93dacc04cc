//! The buffer pool: scratch memory (staging, Tmp, in-place backups) and step lists kept
//! between calls, the limits on both, and `owned`, the one place exec makes a region.

use super::St;
use crate::transport::{Region, Scratch};
use std::collections::VecDeque;

/// Staging memory one collective may hold for receive-and-reduce.
pub const STAGING_LIMIT: usize = 16 << 20;

/// Memory a communicator keeps between calls for staging, Tmp and in-place backups.
pub const POOL_LIMIT: usize = 32 << 20;

/// Scratch buffers kept between calls, so that a collective neither allocates nor zeroes its
/// staging and Tmp memory again (zeroing alone costs as much as a copy). At most `POOL_LIMIT`
/// bytes are kept; a reused buffer holds whatever its last user left (schedules write Tmp and
/// staging before reading them: the symbolic checker proves it).
#[derive(Default)]
pub struct BufPool {
    bufs: Vec<Scratch>,
    bytes: usize,
    /// Step lists of finished collectives, reused by the next ones (a small collective's
    /// allocations cost as much as its messages).
    pub(super) lists: Vec<Lists>,
}

/// An `Exec`'s per-step lists, kept between calls by `BufPool`.
#[derive(Default)]
pub(super) struct Lists {
    pub(super) state: Vec<St>,
    pub(super) pending: Vec<u32>,
    pub(super) ready: VecDeque<usize>,
    pub(super) staging: Vec<Option<(Scratch, usize)>>,
    pub(super) batch: Vec<usize>,
}

/// How many `Lists` a pool keeps.
pub(super) const LISTS_KEPT: usize = 8;

impl BufPool {
    /// A buffer of at least `len` bytes: the smallest kept one that fits, else a new one
    /// (an empty one for `len` 0, which keeps the pool's buffers for real work).
    pub fn take(&mut self, len: usize) -> Scratch {
        if len == 0 {
            return Scratch::new(0);
        }
        let best = self
            .bufs
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len() >= len)
            .min_by_key(|(_, b)| b.len())
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                let b = self.bufs.swap_remove(i);
                self.bytes -= b.len();
                b
            }
            None => Scratch::new(len),
        }
    }

    /// Keep `b` for later calls, unless the pool is full.
    pub fn put(&mut self, b: Scratch) {
        if b.is_empty() || self.bytes + b.len() > POOL_LIMIT {
            return;
        }
        self.bytes += b.len();
        self.bufs.push(b);
    }
}

/// The first `len` bytes of memory an executor owns (Tmp, the backup, a staging buffer), as a
/// region to post and reduce on. The one place exec makes a region.
#[allow(unsafe_code)]
pub(super) fn owned(buf: &Scratch, len: usize) -> Region {
    // SAFETY: an executor's buffers stay owned by it while any step may use their regions;
    // `fail` hands them to the communicator, which keeps them until the provider's operations
    // drain or leaks them. So no region made here outlives its memory.
    let whole = unsafe { buf.region() };
    whole
        .sub(0, len)
        .expect("executor buffers are at least as long as asked")
}

#[cfg(test)]
mod tests {
    use super::{BufPool, POOL_LIMIT};
    use crate::transport::Scratch;

    #[test]
    fn pool_reuses_the_smallest_fit_and_keeps_at_most_its_limit() {
        let mut pool = BufPool::default();
        let (small, big) = (pool.take(4096), pool.take(1 << 20));
        let (small_addr, big_addr) = (small.addr(), big.addr());
        pool.put(big);
        pool.put(small);
        // 1000 bytes fit both: the 4 KiB buffer is taken, the 1 MiB one stays.
        let a = pool.take(1000);
        assert_eq!(a.addr(), small_addr);
        assert_eq!(a.len(), 4096);
        assert_eq!(pool.take(8192).addr(), big_addr);
        // An empty request takes nothing from the pool.
        pool.put(a);
        assert_eq!(pool.take(0).len(), 0);
        assert_eq!(pool.take(4096).addr(), small_addr);
        // The limit: buffers beyond POOL_LIMIT bytes in all are dropped, not kept.
        for _ in 0..3 {
            pool.put(Scratch::new(POOL_LIMIT / 2));
        }
        assert_eq!(pool.bytes, POOL_LIMIT);
        assert_eq!(pool.bufs.len(), 2);
    }
}

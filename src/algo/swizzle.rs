//! Node-swizzled two-level ReduceScatter and its mirror AllGather (not yet built).
#![forbid(unsafe_code)]

use super::{Algorithm, Collectives};

pub struct Swizzle;

impl Collectives for Swizzle {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Swizzle
    }
}

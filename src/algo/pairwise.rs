//! Pairwise AllToAll: N-1 steps, at step s rank r sends to r+s and receives from r-s.
#![forbid(unsafe_code)]

use super::{Algorithm, Collectives};

pub struct Pairwise;

impl Collectives for Pairwise {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Pairwise
    }
}

//! Single-step mesh AllReduce: every rank sends its whole buffer to every peer and reduces all N copies itself, in rank order 0..N-1 (bit-identical on every rank).
#![forbid(unsafe_code)]

use super::{Algorithm, Collectives};

pub struct Mesh1;

impl Collectives for Mesh1 {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Mesh1
    }
}

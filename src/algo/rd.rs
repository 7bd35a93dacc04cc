//! Recursive doubling AllReduce for tiny messages: log2 N exchanges of the whole buffer (any rank count).
#![forbid(unsafe_code)]

use super::{Algorithm, Collectives};

pub struct Rd;

impl Collectives for Rd {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Rd
    }
}

//! Recursive halving ReduceScatter, recursive doubling AllGather and Rabenseifner AllReduce, for any rank count (non-powers of two fold into the nearest power of two first, as in Thakur et al.).
#![forbid(unsafe_code)]

use super::{Algorithm, Collectives};

pub struct Rdh;

impl Collectives for Rdh {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Rdh
    }
}

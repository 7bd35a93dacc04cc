//! Bruck AllGather and AllToAll: ceil(log2 N) steps at any rank count.
#![forbid(unsafe_code)]

use super::{Algorithm, Collectives};

pub struct Bruck;

impl Collectives for Bruck {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Bruck
    }
}

//! Bidirectional ring: two rings in opposite directions, each on half the data.
#![forbid(unsafe_code)]

use super::{Algorithm, Collectives};

pub struct BidirRing;

impl Collectives for BidirRing {
    fn algorithm(&self) -> Algorithm {
        Algorithm::BidirRing
    }
}

//! Binary tree AllReduce (reduce up, broadcast down, pipelined by slices); binomial Broadcast and Reduce.
#![forbid(unsafe_code)]

use super::{Algorithm, Collectives};

pub struct Tree;

impl Collectives for Tree {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Tree
    }
}

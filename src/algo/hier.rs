//! Hierarchical: X nodes x Y local ranks (Options::local), any intra algorithm composed with any inter algorithm.
#![forbid(unsafe_code)]

use super::{Algorithm, Collectives};

pub struct Hier;

impl Collectives for Hier {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Hier
    }
}

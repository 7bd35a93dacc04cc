//! Double binary tree AllReduce: two complementary trees, each carrying half the data, every interior node of one a leaf of the other.
#![forbid(unsafe_code)]

use super::{Algorithm, Collectives};

pub struct DbTree;

impl Collectives for DbTree {
    fn algorithm(&self) -> Algorithm {
        Algorithm::DbTree
    }
}

//! Mesh: every rank exchanges with all peers at once (one step per phase).
#![forbid(unsafe_code)]

use super::{Algorithm, Collectives};

pub struct Mesh;

impl Collectives for Mesh {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Mesh
    }
}

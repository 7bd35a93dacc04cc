pub mod fabric;

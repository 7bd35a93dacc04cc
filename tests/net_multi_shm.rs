//! NCCL's multi-request groups over libfabric's shm provider (see tests/net_multi/mod.rs).
mod net_multi;

#[test]
fn net_multi_over_shm() {
    net_multi::run("shm");
}

//! NCCL's multi-request groups over libfabric's tcp provider (see tests/net_multi/mod.rs).
mod net_multi;

#[test]
fn net_multi_over_tcp() {
    net_multi::run("tcp");
}

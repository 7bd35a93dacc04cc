//! Neuron's tables over libfabric's tcp provider (see tests/neuron/mod.rs).
mod neuron;

#[test]
fn neuron_tables_over_tcp() {
    neuron::run("tcp");
}

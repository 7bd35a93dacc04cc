//! Neuron's tables over libfabric's shm provider (see tests/neuron/mod.rs).
mod neuron;

#[test]
fn neuron_tables_over_shm() {
    neuron::run("shm");
}

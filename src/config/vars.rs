//! The table of `FABRICOLL_*` variables, as users read it: name, accepted values, default and
//! meaning. The README's table is checked against it (tests/readme_config.rs); `Config::from_env`
//! parses the same names.

/// One configuration variable: its name, accepted values, default and meaning.
#[derive(Debug, Clone, Copy)]
pub struct Var {
    pub name: &'static str,
    pub accepted: &'static str,
    pub default: &'static str,
    pub meaning: &'static str,
}

pub const VARS: &[Var] = &[
    Var {
        name: "FABRICOLL_PROVIDER",
        accepted: "a libfabric provider name: efa, tcp, net (the native TCP endpoint on every libfabric), shm, ...",
        default: "FI_PROVIDER if set, else the first found of: efa, the native TCP endpoint (net in libfabric 1.17, tcp from 1.18), tcp;ofi_rxm, shm for the collective engines; efa, tcp (tcp;ofi_rxm in 1.17, the native endpoint from 1.18), shm for the NCCL plugins",
        meaning: "libfabric provider the transport uses",
    },
    Var {
        name: "FABRICOLL_DOMAIN",
        accepted: "comma-separated libfabric domain names (eth0, lo, rdmap0s6-rdm, shm)",
        default: "every domain of the provider except loopback (lo)",
        meaning: "which domains (NICs) become devices, in this order",
    },
    Var {
        name: "FABRICOLL_TIMEOUT_MS",
        accepted: "integer 1..=86400000",
        default: "600000",
        meaning: "deadline for connect, accept and a request without progress",
    },
    Var {
        name: "FABRICOLL_LOG",
        accepted: "off, error, warn, info, debug, trace (env_logger syntax)",
        default: "warn (info when NCCL passes its logger)",
        meaning: "log level; with NCCL the records go to NCCL's logger (subsystem NET)",
    },
    Var {
        name: "FABRICOLL_SPEED_MBPS",
        accepted: "integer 1..=10000000",
        default: "10000",
        meaning: "link speed reported when neither the provider nor sysfs knows it",
    },
    Var {
        name: "FABRICOLL_POLL_US",
        accepted: "integer 0..=1000000",
        default: "1000 over ofi_rxm (tcp), else 50",
        meaning: "busy-poll time before a waiter yields or sleeps on the completion queue",
    },
    Var {
        name: "FABRICOLL_NET_STREAMS",
        accepted: "integer 1..=8",
        default: "1",
        meaning: "net plugin over tcp and net: endpoints (TCP connections) per device, each extra one progressed by its own thread; messages from 256 KiB are striped over them; shm ignores it",
    },
    Var {
        name: "FABRICOLL_ALGO",
        accepted:
            "ALGO, or COLL:ALGO parts separated by ; (at most one plain ALGO); ALGO: auto, ring, bidir_ring, mesh, mesh1, rdh, rd, tree, dbtree, bruck, pairwise, hier, swizzle; COLL: allreduce, allgather, reducescatter, broadcast, reduce, alltoall; case-insensitive",
        default: "auto",
        meaning: "collective algorithm of the engines, as NCCL_ALGO (allreduce:ring;allgather:bruck); auto takes the smallest predicted time; a plain ALGO runs auto, with one warning, on a collective it does not implement, while COLL:ALGO with an ALGO that does not implement COLL is an error",
    },
    Var {
        name: "FABRICOLL_ALPHA_US",
        accepted: "number > 0 (microseconds)",
        default: "measured at communicator creation",
        meaning: "cost model: latency of one message",
    },
    Var {
        name: "FABRICOLL_BETA_GBPS",
        accepted: "number > 0 (GB/s)",
        default: "measured at communicator creation",
        meaning: "cost model: link bandwidth (beta = 1 / bandwidth)",
    },
    Var {
        name: "FABRICOLL_GAMMA_GBPS",
        accepted: "number > 0 (GB/s)",
        default: "measured at communicator creation",
        meaning: "cost model: local reduction speed (gamma = 1 / speed)",
    },
    Var {
        name: "FABRICOLL_INTRA_PROVIDER",
        accepted: "a libfabric provider name (shm, ...), or same",
        default: "shm; where shm cannot be had (FI_PROVIDER hides it), same",
        meaning: "engines: provider between ranks of one host; same: FABRICOLL_PROVIDER for every peer (one fabric)",
    },
    Var {
        name: "FABRICOLL_HOST",
        accepted: "any non-empty string",
        default: "this machine's boot id, host name and network namespace",
        meaning: "engines: ranks with equal values share a host (shared memory between them, the network to the others)",
    },
    Var {
        name: "FABRICOLL_LOCAL_RANKS",
        accepted: "integer >= 1",
        default: "unset (hosts are detected)",
        meaning: "testing: schedules treat each block of this many consecutive ranks as a host (transports still follow the detected hosts)",
    },
    Var {
        name: "FABRICOLL_ROOT",
        accepted: "host:port (IPv6 in brackets) of rank 0's host",
        default: "unset",
        meaning: "launchers without a rank-0 address (mpirun, srun, Hydra): where rank 0 serves the bootstrap",
    },
    Var {
        name: "FABRICOLL_ROOT_FILE",
        accepted: "a path on a file system every rank sees",
        default: "unset",
        meaning: "launchers without a rank-0 address: rank 0 writes its bootstrap id there, the others read it",
    },
    Var {
        name: "FABRICOLL_JOB_ID",
        accepted: "any non-empty string, the same in every rank of the job",
        default: "the launcher's job id (torchrun, Open MPI, Slurm), else unset",
        meaning: "the job's identity: ranks of another job that meet at the same FABRICOLL_ROOT, MASTER_ADDR or FABRICOLL_ROOT_FILE are refused; set it where the launcher gives no job id (fabricoll's own variables, Hydra)",
    },
    Var {
        name: "FABRICOLL_BOOTSTRAP_ADDR",
        accepted: "an IPv4 or IPv6 address of this host",
        default: "127.0.0.1",
        meaning: "address the unique id's bootstrap root listens on (set it for several hosts); FABRICOLL_ROOT_FILE's root and fabricoll-info --unique-id default to this host's first non-loopback address instead",
    },
    Var {
        name: "FABRICOLL_MR_CACHE",
        accepted: "0 or 1",
        default: "1 (0 in libnccom-net.so)",
        meaning: "registration cache; with 1 the plugin reports regIsGlobal=1",
    },
    Var {
        name: "FABRICOLL_TUNER",
        accepted: "0 or 1",
        default: "1",
        meaning: "the tuner plugin (ncclTunerPlugin_v2..v6); 0 turns the tuner off: NCCL keeps its own choices",
    },
    Var {
        name: "FABRICOLL_SHM_FASTBOX",
        accepted: "0 or 1",
        default: "1",
        meaning: "shm before libfabric 1.19: messages up to 16 KiB to a peer go through a shared-memory ring (fastbox) instead of the provider",
    },
    Var {
        name: "FABRICOLL_INPLACE_RESTORE",
        accepted: "0 or 1",
        default: "0",
        meaning: "1: a failed in-place collective restores the caller's input (one extra copy of it per call); 0: the buffer is undefined after a failure, as with MPI and NCCL (fabricoll_config.inplace overrides)",
    },
    Var {
        name: "FABRICOLL_DEVICE_DIRECT",
        accepted: "auto, streams, off",
        default: "auto",
        meaning: "C API on CUDA buffers: auto moves them without a host copy where the provider registers device memory (FI_HMEM, probed), else stages them through page-locked host memory; streams: stream-ordered calls too (needs non-blocking streams); off: always staged (docs/device-calls.md)",
    },
    Var {
        name: "FABRICOLL_COMPRESS",
        accepted: "off, bf16, fp16, fp8e4m3, fp8e5m2, int8, int4",
        default: "off",
        meaning: "engines: AllReduce (sum, avg), ReduceScatter and AllGather of f32, bf16 and f16 send block-scaled codes of this format (docs/compression.md); every rank must set the same (fabricoll_config.compress overrides)",
    },
    Var {
        name: "FABRICOLL_COMPRESS_BLOCK",
        accepted: "integer 1..=1048576",
        default: "256",
        meaning: "elements per scale of FABRICOLL_COMPRESS's codes (fabricoll_config.compress_block overrides)",
    },
    Var {
        name: "FABRICOLL_COMPRESS_LEVELS",
        accepted: "inter, all",
        default: "inter",
        meaning: "engines: on several hosts, some with two ranks or more, compressed collectives compress only the inter-host level and keep shared memory in full precision (inter), or compress every level alike (all); on one host or one rank per host every level is compressed; every rank must set the same (docs/compression.md)",
    },
    Var {
        name: "FABRICOLL_COMPRESS_CHUNK",
        accepted: "bytes, 0..=2^40",
        default: "4194304",
        meaning: "engines: a compressed call of more data is cut into chunks of about this many bytes (whole blocks), pipelined so that the codec overlaps the exchanges (0: one chunk); every rank must set the same",
    },
    Var {
        name: "FABRICOLL_CALIBRATION_CACHE",
        accepted: "a directory, or 0",
        default: "$XDG_CACHE_HOME/fabricoll, else ~/.cache/fabricoll",
        meaning: "where rank 0 keeps the cost model's calibration of a one-host communicator, per machine (boot) and topology, for later processes to reuse; a calibration that looked disturbed is never kept; 0: keep none beyond the process",
    },
    Var {
        name: "FABRICOLL_RANK",
        accepted: "integer 0..FABRICOLL_NRANKS",
        default: "unset",
        meaning: "launchers: this process's rank (with FABRICOLL_NRANKS and one of FABRICOLL_UNIQUE_ID, FABRICOLL_ROOT, FABRICOLL_ROOT_FILE); read by fabricoll-perf and fabricoll_comm_init_env",
    },
    Var {
        name: "FABRICOLL_NRANKS",
        accepted: "integer >= 1",
        default: "unset",
        meaning: "launchers: the rank count (must agree with the launcher's own)",
    },
    Var {
        name: "FABRICOLL_UNIQUE_ID",
        accepted: "hex string of a unique id (fabricoll_get_unique_id)",
        default: "unset",
        meaning: "launchers: the hex id of a bootstrap root someone serves (fabricoll-info --unique-id)",
    },
];

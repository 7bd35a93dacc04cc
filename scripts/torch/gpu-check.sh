#!/usr/bin/env bash
# scripts/torch/gpu-check.sh - the torch backend beside NCCL on a machine with a GPU: the mixed
# group "cpu:fabricoll,cuda:nccl" (tests.test_ops.Mixed) and a DDP step on CUDA with fabricoll
# for the CPU group. Uses the machine's python3 (with torch) and the built library; prints the
# versions first. Output: $OUT (or target/) /gpu-check.log.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${OUT:-target}
mkdir -p "$out"
export PYTHONPATH=$PWD/python FABRICOLL_LIB=$PWD/target/release/libnccl_net_fabricoll.so
{
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.device_count(), "nccl", torch.cuda.nccl.version())'
  nvidia-smi -L
  export FABRICOLL_MIXED_PROVIDER=${FABRICOLL_MIXED_PROVIDER:-shm}
  cd python && FABRICOLL_TEST_STRICT=1 timeout 300 python3 -m tests.run --no-suite tests.test_ops.Mixed
} 2>&1 | tee "$out/gpu-check.log"

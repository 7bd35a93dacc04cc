#!/usr/bin/env bash
# scripts/torch/gpu-check.sh - the torch backend on a machine with a GPU: the mixed group
# "cpu:fabricoll,cuda:nccl" (tests.test_ops.Mixed), with the compiled front built for that
# machine's torch and NCCL carrying its CUDA tensors over our net plugin (every rank its own NCCL
# host, NCCL_NET=fabricoll: NCCL fails rather than fall back if it cannot load the plugin); then
# CUDA tensors on fabricoll itself (tests.gpu_cuda: "fabricoll" for CPU and CUDA tensors).
# Uses the machine's python3 (with torch) and the built library (FABRICOLL_GPU_RELEASE, set by
# scripts/gpu-tests.sh, else target/release). Output: $OUT (or target/) /gpu-check.log.
# When the compiled front does not build, it says so and still runs the test (on the Python
# backend alone where this torch allows it, else to show the import's error), then exits 1.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${OUT:-target}
rel=${FABRICOLL_GPU_RELEASE:-target/release}
mkdir -p "$out"
lib=$PWD/$rel/libnccl-net-fabricoll.so
[ -f "$lib" ] || lib=$PWD/$rel/libnccl_net_fabricoll.so
export PYTHONPATH=$PWD/python FABRICOLL_LIB=$lib
{
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.device_count(), "nccl", torch.cuda.nccl.version())'
  nvidia-smi -L
  echo "building the compiled front for this torch"
  rc=0
  if (cd python && python3 setup.py -q build_ext --inplace -j "$(nproc)") >"$out/torch-ext-build.log" 2>&1; then
    export FABRICOLL_TORCH_EXT=1
  else
    grep -m 20 -E 'error|Error' "$out/torch-ext-build.log"
    echo "FAIL: the compiled front did not build for this torch (log: torch-ext-build.log);" \
      "running the test without it"
    rm -f python/fabricoll/_c10d.*.so  # an older build must not stand in for this one
    rc=1
  fi
  export FABRICOLL_MIXED_PROVIDER=${FABRICOLL_MIXED_PROVIDER:-shm}
  export FABRICOLL_MIXED_NCCL_HOSTS=1 NCCL_NET_PLUGIN=$lib NCCL_NET=fabricoll NCCL_DEBUG=WARN
  (cd python && FABRICOLL_TEST_STRICT=1 timeout 300 python3 -m tests.run --no-suite tests.test_ops.Mixed) || rc=1
  # CUDA tensors on fabricoll itself: the compiled front's stream-ordered operations
  (cd python && FABRICOLL_TEST_STRICT=1 timeout 300 python3 -m tests.run --no-suite tests.gpu_cuda) || rc=1
  echo "gpu-check: exit $rc"
  exit $rc
} 2>&1 | tee "$out/gpu-check.log"
exit "${PIPESTATUS[0]}"

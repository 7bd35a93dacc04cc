#!/usr/bin/env bash
# scripts/gpu-tests.sh - every check that needs a GPU, in one run, from what was built elsewhere
# (the GPU machine has no network and cannot build: carry target/release with the library,
# fabricoll-info and the test binaries). Where there is no GPU it says SKIP and exits 0 (1 under
# FABRICOLL_TEST_STRICT=1).
#
#   1. fabricoll-info: the driver, every device's GPUDirect RDMA / flush / DMA-BUF attributes,
#      and the ptrSupport each provider gets, with the reason for what is missing;
#   2. tests/cuda_probe.rs's binary (built by `cargo test --release --no-run`): the probe on a
#      real driver;
#   3. plugin-tests/nccl_torch.py: real NCCL over the plugin on tcp and net, CollNet on and off;
#   4. with GPU_BENCH=1, scripts/gpu-nccl.sh (issue 32's tables: tuner, CollNet, Socket).
# Output: $OUT (or target/gpu-tests)/gpu-tests.log; the exit status is the number of failed steps.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-target/gpu-tests}
mkdir -p "$out"
log="$out/gpu-tests.log"
: >"$log"
say() { echo "$*" | tee -a "$log"; }

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  say "SKIP: gpu-tests.sh: no GPU here (nvidia-smi finds none)"
  [ "${FABRICOLL_TEST_STRICT:-0}" = 1 ] && exit 1
  exit 0
fi
failed=0
step() { # step NAME TIMEOUT CMD...: runs it, logs it, counts a failure
  local name=$1 t=$2 rc=0
  shift 2
  say "== $name: $*"
  timeout --kill-after=10 "$t" "$@" >>"$log" 2>&1 || rc=$?
  say "== $name: exit $rc"
  [ "$rc" = 0 ] || failed=$((failed + 1))
}

nvidia-smi -L | tee -a "$log"
step info 60 target/release/fabricoll-info
probe=$(find target/release/deps -maxdepth 1 -type f -executable -name 'cuda_probe-*' | head -1)
if [ -n "$probe" ]; then
  step probe 60 "$probe" --nocapture
else
  say "== probe: missing (run cargo test --release --no-run here before carrying target/)"
  failed=$((failed + 1))
fi
lib=target/release/libnccl-net-fabricoll.so
for p in tcp net; do
  step "nccl-$p" 300 python3 plugin-tests/nccl_torch.py --lib "$lib" --mps --provider "$p" --timeout 280
done
step nccl-collnet 300 python3 plugin-tests/nccl_torch.py --lib "$lib" --mps --provider net --collnet --timeout 280
if [ "${GPU_BENCH:-0}" = 1 ]; then
  step gpu-nccl 600 scripts/gpu-nccl.sh
fi
say "gpu-tests: $failed step(s) failed; log: $log"
exit "$failed"

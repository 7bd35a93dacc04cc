#!/usr/bin/env bash
# scripts/gpu-tests.sh - every check that needs a GPU, in one run, from what was built elsewhere.
# The GPU machine has no network, no libfabric and cannot build: scripts/gpu-pack.sh gathers the
# stripped library, fabricoll-info, the test binaries and the libfabric 2.1 build with CUDA into
# target/gpu/, which is carried there; this script uses it when present (else target/release and
# the system's libfabric). Where there is no GPU it says SKIP and exits 0 (1 under
# FABRICOLL_TEST_STRICT=1).
#
#   0. facts: driver, torch and NCCL versions, MPS, compute-sanitizer, NVRTC, libfabric providers;
#   1. fabricoll-info: the driver, every device's GPUDirect RDMA / flush / DMA-BUF attributes,
#      and the ptrSupport each provider gets, with the reason for what is missing;
#   2. the GPU test binaries (GPU_TEST_BINS, default tests/cuda_probe.rs, tests/device_gpu.rs,
#      tests/device_capi_gpu.rs, tests/device_capi_killed.rs and tests/plugin_gpu.rs), with --include-ignored (their GPU tests are ignored elsewhere;
#      --ignored alone would skip cuda_probe's, which are not): the probe and the device seam on a
#      real driver, the reduction kernels against the host reducers and their bandwidth, the C API
#      on device buffers (blocking, stream-ordered, non-blocking, grouped; the direct path, device
#      buffers registered with shm; a killed peer) and its timing table, the net
#      plugin on device memory over shm (libfabric 2.1 with CUDA); then compute-sanitizer's
#      memcheck over one kernel test (device_gpu's gpu_kernel_small); fabricoll-perf --device cuda,
#      blocking and --stream (GPU_PERF=0 skips it);
#      Each binary gets GPU_BIN_S [120] seconds, so that one hang leaves the later steps time.
#   3. plugin-tests/nccl_torch.py: real NCCL over the plugin (CollNet on), every collective checked,
#      over the IP provider and, where shm is present, with NCCL's buffers in device memory
#      (GDRDMA, CollNet on device buffers) (GPU_NCCL_CHECK=0 skips both);
#   4. scripts/torch/gpu-check.sh (GPU_TORCH=0 skips it): the compiled front built for the machine's
#      torch, the mixed group cpu:fabricoll,cuda:nccl with NCCL over our plugin, then CUDA
#      tensors on fabricoll (tests.gpu_cuda);
#   5. with GPU_BENCH=1, scripts/torch/bench_cuda.py (CUDA tensors: fabricoll against gloo and
#      copying to the host), then scripts/gpu-nccl.sh (tuner, CollNet, Socket,
#      FABRICOLL_NET_STREAMS).
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
rel=target/release
if [ -d target/gpu/release ]; then
  rel=target/gpu/release
  export LD_LIBRARY_PATH="$PWD/target/gpu/libfabric/lib:$PWD/target/gpu/cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$PWD/target/gpu/libfabric/bin:$PATH"
fi
export FABRICOLL_GPU_RELEASE=$rel
failed=0
step() { # step NAME TIMEOUT CMD...: runs it, logs it, counts a failure
  local name=$1 t=$2 rc=0
  shift 2
  say "== $name: $*"
  timeout --kill-after=10 "$t" "$@" >>"$log" 2>&1 || rc=$?
  say "== $name: exit $rc"
  [ "$rc" = 0 ] || failed=$((failed + 1))
}

{
  nvidia-smi -L
  nvidia-smi --query-gpu=driver_version,memory.total,compute_mode --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gloo", torch.distributed.is_gloo_available())' 2>&1
  echo "compute-sanitizer: $(command -v compute-sanitizer || echo missing)"
  echo "nvidia-cuda-mps-control: $(command -v nvidia-cuda-mps-control || echo missing)"
  echo "nvrtc: $(ldconfig -p | grep -o '/[^ ]*libnvrtc.so[^ ]*' | head -3 | tr '\n' ' ')"
  python3 -c 'import nvidia, os; [print("wheel lib:", os.path.join(p, d, "lib")) for p in nvidia.__path__ for d in sorted(os.listdir(p)) if os.path.isdir(os.path.join(p, d, "lib"))]' 2>&1 | head -20
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  fi_info -l 2>&1 | grep ':$' | tr '\n' ' '; echo
  for p in shm tcp; do echo "fi_info -p $p: $(fi_info -p "$p" -c FI_HMEM 2>&1 | grep -c 'provider:') entries with FI_HMEM"; done
} 2>&1 | tee -a "$log"

# the IP providers present (1.17: net and tcp;ofi_rxm as tcp; 2.x: tcp), then shm
providers=${GPU_PROVIDERS:-$(for p in net tcp shm; do fi_info -l 2>/dev/null | grep -qx "$p:" && echo "$p"; done | tr '\n' ' ')}
say "providers: $providers"
export GPU_PROVIDERS="$providers"

step info 60 "$rel/fabricoll-info"
# The device seam's kernels are compiled at run time by NVRTC: put the toolkit's copy on the path
# (cudarc looks for libnvrtc.so, .so.12, ...; where only a versioned .so.13 exists, link to it).
for d in /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib64; do
  v=$(ls "$d"/libnvrtc.so.1[0-9] 2>/dev/null | sort -V | tail -1)
  [ -e "$d/libnvrtc.so" ] || [ -n "$v" ] || continue
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
  if [ ! -e "$d/libnvrtc.so" ]; then
    mkdir -p "$out/nvrtc" && ln -sf "$v" "$out/nvrtc/libnvrtc.so"
    export LD_LIBRARY_PATH="$(cd "$out/nvrtc" && pwd):$LD_LIBRARY_PATH"
  fi
  break
done
# The test binaries run their ranks as threads of one process, sharing the device's context and
# its hardware work queues (CUDA_DEVICE_MAX_CONNECTIONS, default 8): streams are spread over
# them, and a stream-ordered call's flag wait at the head of a queue holds back every stream
# behind it, a peer rank's copies too, where the ranks' streams outnumber the queues. Ranks that
# are processes have a context each; in one process the queues are raised to their maximum.
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32}
test_bin() { find "$rel/deps" -maxdepth 1 -type f -executable -name "$1-*" -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2; }
for t in ${GPU_TEST_BINS:-cuda_probe device_gpu device_capi_gpu device_capi_killed plugin_gpu}; do
  bin=$(test_bin "$t")
  if [ -n "$bin" ]; then
    # each case's start and end on stderr (FABRICOLL_TEST_TRACE): a hang's last lines name it
    step "$t" "${GPU_BIN_S:-120}" env FABRICOLL_TEST_TRACE=1 "$bin" --include-ignored --nocapture --test-threads=1
  else
    say "== $t: missing (cargo test --release --no-run, then scripts/gpu-pack.sh)"
    failed=$((failed + 1))
  fi
done
# The direct path for stream-ordered calls is opt-in (FABRICOLL_DEVICE_DIRECT=streams): its test
# again with it.
bin=$(test_bin device_capi_gpu)
if [ -n "$bin" ]; then
  step device_capi_gpu-streams "${GPU_BIN_S:-120}" env FABRICOLL_DEVICE_DIRECT=streams FABRICOLL_TEST_TRACE=1 \
    "$bin" --include-ignored --exact gpu_device_calls_go_direct_where_shm_registers_device_memory --nocapture
fi
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
bin=$(test_bin device_gpu)
if [ -x "$sanitizer" ] && [ -n "$bin" ]; then
  step memcheck 180 "$sanitizer" --tool memcheck --error-exitcode 1 "$bin" --ignored --exact gpu_kernel_small --nocapture
else
  say "== memcheck: skipped (compute-sanitizer: $sanitizer, device_gpu binary: ${bin:-missing})"
  failed=$((failed + 1))
fi
# The C API's device path as a benchmark: 2 ranks as processes on GPU 0 over shm, blocking and
# stream-ordered, each row checked (GPU_PERF=0 skips it).
if [ "${GPU_PERF:-1}" = 1 ]; then
  for mode in "" --stream; do
    step "perf-device${mode:+-stream}" 120 env FABRICOLL_PROVIDER=shm "$rel/fabricoll-perf" --ranks 2 \
      --device cuda $mode -b 8 -e 64M -f 8 -n 10 -w 2
  done
fi
lib=$rel/libnccl-net-fabricoll.so
ip=${providers%% *}
if [ "${GPU_NCCL_CHECK:-1}" = 1 ]; then
  step "nccl-$ip-collnet" 240 python3 plugin-tests/nccl_torch.py --lib "$lib" --mps --provider "$ip" --collnet --timeout 220
  # NCCL's buffers in device memory (GDRDMA channels required), CollNet on device buffers too
  case " $providers " in
    *" shm "*) step nccl-shm-gdr-collnet 180 python3 plugin-tests/nccl_torch.py --lib "$lib" --mps --provider shm --collnet --gdr on --timeout 160 ;;
  esac
fi
if [ "${GPU_TORCH:-1}" = 1 ]; then
  step torch-mixed "${GPU_TORCH_S:-300}" env OUT="$out" scripts/torch/gpu-check.sh
fi
if [ "${GPU_BENCH:-0}" = 1 ]; then
  # CUDA tensors on the torch backend against gloo and copying to the host (needs the compiled
  # front that torch-mixed built)
  [ "${GPU_TORCH:-1}" = 1 ] && step torch-cuda-bench 150 env FABRICOLL_LIB="$PWD/$lib" \
    FABRICOLL_TORCH_EXT=1 python3 scripts/torch/bench_cuda.py --ranks 2 --reps 2 --iters 10
  step gpu-nccl "${GPU_BENCH_S:-600}" env OUT="$out/nccl" scripts/gpu-nccl.sh
fi
say "gpu-tests: $failed step(s) failed; log: $log"
exit "$failed"

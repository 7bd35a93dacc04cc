#!/usr/bin/env bash
# scripts/gpu-pack.sh - gather what scripts/gpu-tests.sh needs on the GPU machine into target/gpu/,
# stripped of debug information, so that one folder can be carried there (that machine has no network and no libfabric,
# and cannot build):
#
#   target/gpu/release/   libnccl-net-fabricoll.so, fabricoll-info, fabricoll-perf and the test
#                         binaries named in GPU_TEST_BINS (default: cuda_probe device_gpu device_capi_gpu
#                         device_capi_killed plugin_gpu), from
#                         target/release (scripts/build.sh; cargo test --release --no-run)
#   target/gpu/libfabric/ lib/libfabric.so.1 and bin/fi_info of the libfabric build with CUDA
#                         support (scripts/libfabric2.sh; LIBFABRIC2_PREFIX overrides)
#   target/gpu/cuda/      libcudart.so (unversioned: the name libfabric 2.1 dlopens) from the
#                         CUDA runtime wheel that build used
#
# Then: the device tool's run with carry ["target/gpu"] and the command
#   scripts/gpu-tests.sh        (it finds target/gpu/ and puts its libraries first)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rel=${CARGO_TARGET_DIR:-target}/release
out=target/gpu
prefix=${LIBFABRIC2_PREFIX:-$HOME/.cache/fabricoll/libfabric-2.1.0-cuda}

rm -rf "$out"
mkdir -p "$out/release/deps" "$out/libfabric/lib" "$out/libfabric/bin" "$out/cuda"
# debug information goes, function names stay (a crash's backtrace names them)
strip_to() { strip --strip-debug -o "$2" "$1"; }

[ -f "$rel/libnccl-net-fabricoll.so" ] || { echo "gpu-pack.sh: $rel/libnccl-net-fabricoll.so missing: run scripts/build.sh" >&2; exit 1; }
strip_to "$rel/libnccl-net-fabricoll.so" "$out/release/libnccl-net-fabricoll.so"
for b in fabricoll-info fabricoll-perf; do
  [ -f "$rel/$b" ] && strip_to "$rel/$b" "$out/release/$b"
done
for t in ${GPU_TEST_BINS:-cuda_probe device_gpu device_capi_gpu device_capi_killed plugin_gpu}; do
  # the newest build of each test binary (cargo keeps old hashes around)
  bin=$(find "$rel/deps" -maxdepth 1 -type f -executable -name "$t-*" -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2)
  if [ -z "$bin" ]; then
    echo "gpu-pack.sh: no $t test binary: run cargo test --release --no-run" >&2
    exit 1
  fi
  strip_to "$bin" "$out/release/deps/$(basename "$bin")"
done

if [ -f "$prefix/lib/libfabric.so.1" ]; then
  cp -L "$prefix/lib/libfabric.so.1" "$out/libfabric/lib/"
  cp -L "$prefix/bin/fi_info" "$out/libfabric/bin/"
  cp -L "$prefix/cuda/lib/libcudart.so" "$out/cuda/libcudart.so"
else
  echo "gpu-pack.sh: no libfabric with CUDA at $prefix: run scripts/libfabric2.sh --cuda" >&2
  exit 1
fi
du -sh "$out"

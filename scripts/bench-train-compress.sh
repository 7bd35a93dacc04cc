#!/usr/bin/env bash
# scripts/bench-train-compress.sh - DDP training with compressed gradients on emulated hosts:
# fabricoll with a compressed format against gloo with PyTorch's bf16_compress_hook (the anchor
# users have today) and against fabricoll uncompressed, the same model, data and steps.
#
#   scripts/bench-train-compress.sh [--layout 4x1] [--rate 100mbit] [--delay 1ms]
#       [--modes gloo-bf16,fp8e4m3,off] [--steps 300] [--reps 2] [--dir DIR] [--no-build]
#       [other options of scripts/torch/train_compress.py: --width, --depth, --batch, ...]
#
# Each mode is a job of its own on the same hosts (scripts/netns-cluster.sh), the modes' order
# turning from one repetition to the next. The caller's FABRICOLL_* variables (FABRICOLL_LOG=info
# shows each compressed call's exchanges and prediction) reach every rank. The table (DIR/summary.txt; default DIR
# $CARGO_TARGET_DIR/bench-train-compress/<date>-<time>) gives per mode the median step time,
# x (the first mode's step time over the mode's), the final loss on held-out data and its
# difference from the uncompressed run, and checks the targets: a compressed format's step at
# least 2x faster than gloo with bf16_compress_hook, its final loss within 1 % of the
# uncompressed run's. The defaults take about 8 minutes on 2 CPUs; run it on an idle machine.
# Needs root, iptables and libnetfilter-queue-dev (scripts/deps.sh --bench), and the torch venv
# with the backend's compiled front (scripts/deps.sh --torch, scripts/torch-ext.sh; built here
# unless --no-build).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
target=$CARGO_TARGET_DIR
build=1 dir="" args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) build=0; shift ;;
    --dir) dir=${2:?--dir needs a value}; shift 2 ;;
    -h | --help) sed -n '2,21p' "$0"; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "bench-train-compress: needs root (network namespaces)" >&2; exit 1; }
scripts/deps.sh --bench --torch >/dev/null
py=${FABRICOLL_TORCH_VENV:-$HOME/.cache/fabricoll/torch-venv}/bin/python
if [ "$build" = 1 ]; then
  NEURON=0 scripts/build.sh
  scripts/torch-ext.sh
fi
lib=$target/release/libnccl_net_fabricoll.so
[ -f "$lib" ] || { echo "bench-train-compress: $lib not found: run scripts/build.sh" >&2; exit 1; }
mkdir -p "$target/multihost"
if [ -z "${FABRICOLL_NFQ_DELAY:-}" ] && { [ ! -x "$target/multihost/nfq-delay" ] ||
  [ scripts/multihost/nfq-delay.c -nt "$target/multihost/nfq-delay" ]; }; then
  gcc -O2 -Wall -o "$target/multihost/nfq-delay" scripts/multihost/nfq-delay.c \
    -lnetfilter_queue -lnfnetlink
fi
dir=${dir:-$target/bench-train-compress/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$dir"
scripts/netns-cluster.sh down --stale
echo "bench-train-compress: $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) CPUs; results in $dir"
exec "$py" scripts/torch/train_compress.py --dir "$dir" --lib "$lib" --python "$py" \
  --prefix "fcn$$" --owner $$ "${args[@]}"

#!/usr/bin/env bash
# scripts/build.sh - release build of fabricoll and of the C test harness.
#
#   1. cargo build --release: the library (cdylib + rlib) and the binaries (fabricoll-info, ...)
#   2. copies $TARGET/release/libnccl_net_fabricoll.so to $TARGET/release/libnccl-net-fabricoll.so,
#      the name NCCL looks for (a copy, not a link; written under a temporary name then renamed,
#      so a process loading the library never sees a half-written file)
#   3. the Neuron flavour (cargo feature `neuron`): cargo build --release --lib --features neuron
#      in $TARGET/neuron (its own directory: a cdylib's file name does not depend on features),
#      copied to $TARGET/release/libnccom-net.so, the name AWS Neuron's libnccom loads.
#      NEURON=0 skips it.
#   4. make -C plugin-tests: net_harness, net_bench and their _asan variants in plugin-tests/build/
#
# $TARGET is $CARGO_TARGET_DIR when set, else target/.  Extra arguments go to cargo build.
# Run scripts/deps.sh first on a fresh machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi

target_dir=${CARGO_TARGET_DIR:-target}
rel="$target_dir/release"

echo "build.sh: cargo build --release $*"
cargo build --release "$@"

src="$rel/libnccl_net_fabricoll.so"
dst="$rel/libnccl-net-fabricoll.so"
if [ ! -f "$src" ]; then
  echo "build.sh: $src was not produced (is crate-type cdylib in Cargo.toml?)" >&2
  exit 1
fi
# install SRC DST: copy under a temporary name, then rename, so that a process loading the
# library never sees a half-written file.
install_lib() {
  tmp="$2.tmp.$$"
  trap 'rm -f "$tmp"' EXIT
  cp -f "$1" "$tmp"
  mv -f "$tmp" "$2"
  trap - EXIT
  echo "build.sh: $2 ($(stat -c %s "$2") bytes)"
}
install_lib "$src" "$dst"

if [ "${NEURON:-1}" != 0 ]; then
  echo "build.sh: cargo build --release --lib --features neuron --target-dir $target_dir/neuron"
  cargo build --release --lib --features neuron --target-dir "$target_dir/neuron"
  install_lib "$target_dir/neuron/release/libnccl_net_fabricoll.so" "$rel/libnccom-net.so"
fi

if [ -f plugin-tests/Makefile ]; then
  echo "build.sh: make -C plugin-tests"
  make -C plugin-tests -j"$(nproc)"
else
  echo "build.sh: WARNING: plugin-tests/Makefile not found: C harness not built" >&2
fi

#!/usr/bin/env bash
# scripts/build.sh - release build of fabricoll and of the C test harness.
#
#   1. cargo build --release: the library (cdylib + rlib) and the binaries (fabricoll-info, ...)
#   2. copies $TARGET/release/libnccl_net_fabricoll.so to $TARGET/release/libnccl-net-fabricoll.so,
#      the name NCCL looks for (a copy, not a link; written under a temporary name then renamed,
#      so a process loading the library never sees a half-written file)
#   3. make -C plugin-tests: net_harness, net_bench and their _asan variants in plugin-tests/build/
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
tmp="$dst.tmp.$$"
trap 'rm -f "$tmp"' EXIT
cp -f "$src" "$tmp"
mv -f "$tmp" "$dst"
trap - EXIT
echo "build.sh: $dst ($(stat -c %s "$dst") bytes)"

if [ -f plugin-tests/Makefile ]; then
  echo "build.sh: make -C plugin-tests"
  make -C plugin-tests -j"$(nproc)"
else
  echo "build.sh: WARNING: plugin-tests/Makefile not found: C harness not built" >&2
fi

#!/usr/bin/env bash
# scripts/libfabric2.sh [--cuda] - build libfabric 2.1.0 from its upstream source, once, cached.
#
# The machines fabricoll is for run libfabric 2.x (EFA installers, Debian 13); Debian 12 ships 1.17.
# This builds the upstream release tarball that Debian 13 carries in its source archive
# (libfabric_2.1.0.orig.tar.xz, fetched with apt-get source through a private sources list, so the
# system's apt configuration is not touched) and installs it under
#   $FABRICOLL_CACHE/libfabric-2.1.0        (plain: the second configuration CI tests)
#   $FABRICOLL_CACHE/libfabric-2.1.0-cuda   (--cuda: FI_HMEM CUDA support, for the GPU machine)
# FABRICOLL_CACHE defaults to ~/.cache/fabricoll. A prefix that already holds lib/libfabric.so.1
# is reused. The last line printed is the prefix.
#
# --cuda: CUDA support compiled in, the CUDA libraries loaded at run time (--enable-cuda-dlopen),
# so the build needs headers only. They come from PyPI wheels: nvidia-cuda-runtime-cu12 (cuda.h,
# cuda_runtime.h), nvidia-cuda-nvcc-cu12 (the crt/ headers cuda_runtime.h includes) and
# nvidia-nvml-dev-cu12 (nvml.h). At run time libfabric dlopens libcudart.so (unversioned),
# libcuda.so.1 and libnvidia-ml.so.1; the wheel's runtime library is kept as
# PREFIX/cuda/lib/libcudart.so for machines that lack an unversioned one.
#
# Providers: tcp, shm, rxm, rxd, udp, sockets (no verbs, efa, psm: this machine has no such NIC).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

cuda=0
for arg in "$@"; do
  case "$arg" in
    --cuda) cuda=1 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "libfabric2.sh: unknown argument: $arg (expected --cuda)" >&2; exit 2 ;;
  esac
done

version=2.1.0
cache=${FABRICOLL_CACHE:-$HOME/.cache/fabricoll}
# (not `$([ "$cuda" = 1 ] && echo -cuda)`: a failing substitution ends the script under set -e)
prefix=$cache/libfabric-$version
if [ "$cuda" = 1 ]; then prefix=$prefix-cuda; fi
log() { echo "libfabric2.sh: $*" >&2; }

if [ -f "$prefix/lib/libfabric.so.1" ]; then
  log "reusing $prefix"
  echo "$prefix"
  exit 0
fi

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
need=()
for tool in autoreconf:autoconf automake:automake libtoolize:libtool xz:xz-utils make:make gcc:gcc; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || need+=("${tool#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  as_root apt-get update -q >/dev/null
  as_root apt-get install -y -q "${need[@]}" >/dev/null
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tarball=$cache/src/libfabric_$version.orig.tar.xz
if [ ! -f "$tarball" ]; then
  # A private apt configuration whose only source is Debian 13's source archive: apt-get source
  # fetches the upstream tarball (the package's .dsc may have moved on; the tarball is what we need)
  mkdir -p "$work/apt/lists/partial" "$work/apt/archives/partial" "$cache/src"
  echo "deb-src http://deb.debian.org/debian trixie main" >"$work/apt/sources.list"
  opts=(-o Dir::Etc::sourcelist="$work/apt/sources.list" -o Dir::Etc::sourceparts=-
    -o Dir::State::Lists="$work/apt/lists" -o Dir::Cache::archives="$work/apt/archives"
    -o APT::Sandbox::User=root)
  log "fetching libfabric_$version.orig.tar.xz from Debian's source archive"
  apt-get "${opts[@]}" update -q >/dev/null
  # apt-get source wants the package's exact version (an upload may add a suffix, 2.1.0-1.1):
  # the first one whose upstream part is $version, and the tarball's SHA-256 as Sources lists it.
  deb_version=$(apt-cache "${opts[@]}" showsrc libfabric 2>/dev/null |
    awk -v v="$version" '$1 == "Version:" && index($2, v "-") == 1 { print $2; exit }')
  [ -n "$deb_version" ] || { log "Debian's source archive lists no libfabric $version"; exit 1; }
  sha=$(apt-cache "${opts[@]}" showsrc "libfabric=$deb_version" 2>/dev/null |
    awk -v f="libfabric_$version.orig.tar.xz" '$1 ~ /^[0-9a-f]{64}$/ && $3 == f { print $1; exit }')
  # The .dsc may be gone from the mirror while the tarball is not: only the tarball counts.
  (cd "$work" && apt-get "${opts[@]}" source --download-only "libfabric=$deb_version" >/dev/null 2>&1 || true)
  [ -f "$work/libfabric_$version.orig.tar.xz" ] || { log "could not fetch libfabric_$version.orig.tar.xz ($deb_version)"; exit 1; }
  if [ -n "$sha" ] && ! echo "$sha  $work/libfabric_$version.orig.tar.xz" | sha256sum -c --quiet -; then
    log "libfabric_$version.orig.tar.xz does not match the SHA-256 Debian lists"; exit 1
  fi
  mv "$work/libfabric_$version.orig.tar.xz" "$tarball"
fi
tar -C "$work" -xJf "$tarball"
src=$work/libfabric-$version

conf=(--prefix="$prefix" --disable-static --enable-only --enable-tcp --enable-shm --enable-rxm
  --enable-rxd --enable-udp --enable-sockets)
if [ "$cuda" = 1 ]; then
  whl=$cache/src/wheels
  mkdir -p "$whl" "$work/cuda/include" "$prefix/cuda/lib"
  for pkg in nvidia-cuda-runtime-cu12 nvidia-cuda-nvcc-cu12 nvidia-nvml-dev-cu12; do
    if ! ls "$whl/${pkg//-/_}"-*.whl >/dev/null 2>&1; then
      log "fetching the $pkg wheel (headers)"
      python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 \
        --python-version 3.11 -d "$whl" "$pkg==12.9.*"
    fi
    python3 -m zipfile -e "$whl/${pkg//-/_}"-*.whl "$work/w-$pkg"
  done
  cp -r "$work"/w-nvidia-cuda-runtime-cu12/nvidia/cuda_runtime/include/. "$work/cuda/include/"
  cp -rn "$work"/w-nvidia-cuda-nvcc-cu12/nvidia/cuda_nvcc/include/. "$work/cuda/include/"
  cp -n "$work"/w-nvidia-nvml-dev-cu12/nvidia/nvml_dev/include/nvml.h "$work/cuda/include/"
  cp "$work"/w-nvidia-cuda-runtime-cu12/nvidia/cuda_runtime/lib/libcudart.so.12 "$prefix/cuda/lib/libcudart.so"
  conf+=(--with-cuda="$work/cuda" --enable-cuda-dlopen)
fi

log "building in $src (${conf[*]})"
(cd "$src" && ./autogen.sh >"$work/autogen.log" 2>&1 && ./configure "${conf[@]}" >"$work/configure.log" 2>&1) ||
  { tail -20 "$work"/*.log >&2; exit 1; }
if [ "$cuda" = 1 ] && ! grep -q '^#define HAVE_CUDA 1' "$src/config.h"; then
  log "configure did not enable CUDA"; exit 1
fi
make -C "$src" -j"$(nproc)" >"$work/make.log" 2>&1 && make -C "$src" install >>"$work/make.log" 2>&1 ||
  { tail -30 "$work/make.log" >&2; rm -rf "$prefix"; exit 1; }
log "installed in $prefix"
echo "$prefix"

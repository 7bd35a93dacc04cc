# scripts/providers.sh - sourced by the test, demo and plugin-test scripts: which libfabric
# providers they run over, in one place.
#   with_net LIST   LIST, plus net where libfabric offers it (1.17's native TCP RDM endpoint;
#                   1.18 renamed it tcp). Where net is left out, the reason is in $NET_SKIPPED
#                   and on stderr: a libfabric from 1.18 on has no net by design (fabricoll reads
#                   net as tcp there, which LIST already holds), so its cases count as skipped; one before 1.18 should have it, so under
#                   FABRICOLL_TEST_STRICT=1 net stays in the list and its cases fail.
#   net_absent      why net is not offered here (empty when it is)
#   is_ip PROV      true for the providers that run over IP (tcp: tcp;ofi_rxm, net), which the
#                   scripts keep on the loopback interface (FABRICOLL_DOMAIN=lo)

# libfabric's version as MAJOR MINOR (from fi_info --version), or nothing.
libfabric_version() {
  fi_info --version 2>/dev/null | sed -nE 's/^libfabric: *([0-9]+)\.([0-9]+).*/\1 \2/p' | head -1
}

net_absent() {
  fi_info -p net -t FI_EP_RDM >/dev/null 2>&1 && return 0
  local v
  v=$(libfabric_version)
  # shellcheck disable=SC2086  # split "MAJOR MINOR" into $1 $2
  set -- $v
  if [ -n "${1:-}" ] && { [ "$1" -gt 1 ] || [ "${2:-0}" -ge 18 ]; }; then
    echo "libfabric $1.$2 has no net provider (1.18 renamed it tcp)"
  else
    echo "libfabric ${1:-?}.${2:-?} offers no net provider, although this version should"
  fi
}

NET_SKIPPED=""
with_net() {
  local why
  why=$(net_absent)
  if [ -z "$why" ]; then echo "$1 net"; return; fi
  case "$why" in
    *"should"*)
      if [ "${FABRICOLL_TEST_STRICT:-0}" = 1 ]; then
        echo "providers: $why: its cases run and fail (FABRICOLL_TEST_STRICT=1)" >&2
        echo "$1 net"
        return
      fi ;;
  esac
  echo "SKIP net: $why" >&2
  NET_SKIPPED=$why
  echo "$1"
}

is_ip() { [ "$1" = tcp ] || [ "$1" = net ]; }

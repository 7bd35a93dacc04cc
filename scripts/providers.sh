# scripts/providers.sh - sourced by the test, demo and plugin-test scripts: which libfabric
# providers they run over, in one place.
#   with_net LIST   LIST, plus net where libfabric offers it (1.17's native TCP RDM endpoint;
#                   1.18 renamed it tcp, which LIST already holds: fabricoll reads net as tcp
#                   there, so adding it would run the same endpoint twice)
#   is_ip PROV      true for the providers that run over IP (tcp: tcp;ofi_rxm, net), which the
#                   scripts keep on the loopback interface (FABRICOLL_DOMAIN=lo)

with_net() {
  if fi_info -p net -t FI_EP_RDM >/dev/null 2>&1; then echo "$1 net"; else echo "$1"; fi
}

is_ip() { [ "$1" = tcp ] || [ "$1" = net ]; }

#!/bin/sh
# scripts/netns-rsh.sh - the "ssh" Open MPI's rsh launcher calls (--mca plm_rsh_agent) to start
# its daemons on the emulated hosts of scripts/netns-cluster.sh: it enters the host's network
# namespace, with the host's own hostname (Open MPI names shared-memory segments after it).
# Called as: netns-rsh.sh [ssh options] HOST COMMAND...; HOST is an address A.B.C.i of the
# cluster (host i) or a namespace name PREFIX-h<i>. NETNS_PREFIX names the cluster.
PREFIX=${NETNS_PREFIX:?netns-rsh: NETNS_PREFIX (the cluster prefix) is not set}
while [ $# -gt 0 ]; do
  case "$1" in
    -x | -T | -t | -q | -n | -a | -A | -4 | -6) shift ;; # ssh flags Open MPI may pass
    -o | -p | -l | -i | -F) shift 2 ;;
    *) break ;;
  esac
done
[ $# -ge 2 ] || { echo "netns-rsh: usage: netns-rsh.sh HOST COMMAND..." >&2; exit 255; }
host=$1
shift
case "$host" in
  "$PREFIX"-h[0-9]*) ns=$host ;;
  *.*.*.*) ns="$PREFIX-h${host##*.}" ;;
  *) echo "netns-rsh: cannot map host '$host' to an emulated host of $PREFIX" >&2; exit 255 ;;
esac
# Open MPI passes the remote command as words of one shell command line, as ssh would.
exec ip netns exec "$ns" unshare --uts /bin/sh -c 'hostname "$0" && eval "$1"' "$ns" "$*"

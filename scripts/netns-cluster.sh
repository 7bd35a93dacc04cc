#!/usr/bin/env bash
# scripts/netns-cluster.sh - K emulated hosts on one Linux machine, for the multi-host tests
# (scripts/multihost-tests.sh) and benchmark (scripts/bench-multihost.sh). Needs root and iproute2.
#
#   netns-cluster.sh up      -p PREFIX [-k K] [-s SUBNET] [-r RATE] [-d DELAY] [--nics 1|2] [--owner PID]
#   netns-cluster.sh reshape -p PREFIX [-r RATE] [-d DELAY]  # change the shaping in place
#   netns-cluster.sh exec    -p PREFIX I CMD...               # CMD inside host I (1-based)
#   netns-cluster.sh down    -p PREFIX                        # idempotent
#   netns-cluster.sh down    --stale                          # every cluster whose owner is gone
#   netns-cluster.sh down    --owner PID                      # every cluster fcn<PID>*
#   netns-cluster.sh status  -p PREFIX
#
# Host i is the network namespace PREFIX-h<i> with interface ccl0 = SUBNET.i/24 (and, with
# --nics 2, a second one ccl1 = SUBNET2.i/24, SUBNET2 being SUBNET with its last number plus 1).
# The hosts are joined by bridges (br0, br1) in a namespace of their own, PREFIX-sw, so nothing
# touches the root namespace's interfaces or addresses and no traffic leaves the namespaces.
# `exec` gives each host its own hostname PREFIX-h<i> (a UTS namespace), as a real host has.
#
# Shaping: RATE (tc syntax: 1gbit, 100mbit; 0 = unlimited, the default) is a tbf on both
# directions of every host link: the switch's port toward a host holds about 5 ms of traffic and
# drops what overflows it, as a switch does; the host's own egress holds 8 MiB (more at rates
# past 13 Gbit/s), because a real host does not drop its own packets: its NIC back-pressures the
# stack. (With a 5 ms queue there too, a host sending to several peers at once dropped its own
# outgoing ACKs; a lost window update stalls its TCP connection until the persist timer's probe,
# at least 200 ms.) DELAY (500us, 1ms; 0 = none, the default) is added once per
# packet on the receiving host by an NFQUEUE delayer (this kernel has no netem): the program
# named by FABRICOLL_NFQ_DELAY, default target/multihost/nfq-delay, built from
# scripts/multihost/nfq-delay.c by scripts/bench-multihost.sh; it needs iptables.
#
# PREFIX: at most 9 characters of [a-z0-9]. Callers name their clusters fcn<their pid><letter>
# (`netns-cluster.sh prefix PID` prints fcn<PID>) and pass --owner PID, so that `down --stale`
# can remove the clusters of callers that died without cleaning up (kill -9): it removes every
# namespace named fcn<PID>...-h<i> or -sw whose PID is no longer alive. State (the owner, the
# delayers' pids) is kept in /run/fabricoll-netns/PREFIX.
set -u
CMD=${1:-}
[ $# -gt 0 ] && shift
K=2 PREFIX="" SUBNET=10.77.0 RATE=0 DELAY=0 NICS=1 OWNER=$PPID OWNED="" STALE=0
die() {
  echo "netns-cluster: $*" >&2
  exit 1
}
while [ $# -gt 0 ]; do
  case "$1" in
    -k) K=${2:?-k needs a value}; shift 2 ;;
    -p) PREFIX=${2:?-p needs a value}; shift 2 ;;
    -s) SUBNET=${2:?-s needs a value}; shift 2 ;;
    -r) RATE=${2:?-r needs a value}; shift 2 ;;
    -d) DELAY=${2:?-d needs a value}; shift 2 ;;
    --nics) NICS=${2:?--nics needs a value}; shift 2 ;;
    --owner) OWNER=${2:?--owner needs a value}; OWNED=$OWNER; shift 2 ;;
    --stale) STALE=1; shift ;;
    *) break ;;
  esac
done
STATE_ROOT=/run/fabricoll-netns
STATE=$STATE_ROOT/$PREFIX
SW=$PREFIX-sw
TARGET=${CARGO_TARGET_DIR:-target}
[ "${TARGET#/}" != "$TARGET" ] || TARGET=$(cd "$(dirname "$0")/.." && pwd)/$TARGET
NFQ=${FABRICOLL_NFQ_DELAY:-$TARGET/multihost/nfq-delay}

need_prefix() {
  [[ "$PREFIX" =~ ^[a-z0-9]{1,9}$ ]] || die "-p PREFIX: '$PREFIX' is not 1-9 characters of [a-z0-9]"
}

# hosts_of PREFIX: the host namespaces of one cluster, in order
hosts_of() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$1-h[0-9]+$" | sort -V
}

# delay_us 500us|1ms|1.5ms|0 -> integer microseconds
delay_us() {
  awk -v d="$1" 'BEGIN{ v = d
    if (d ~ /us$/) { sub(/us$/, "", d); v = d }
    else if (d ~ /ms$/) { sub(/ms$/, "", d); v = d * 1000 }
    else if (d ~ /s$/) { sub(/s$/, "", d); v = d * 1000000 }
    if (v !~ /^[0-9.]+$/) { print "bad"; exit } printf "%d\n", v }'
}

# nics_of HOST: the host's interfaces (ccl0, and ccl1 with --nics 2)
nics_of() {
  ip netns exec "$1" ip -o link show 2>/dev/null | awk -F': ' '$2 ~ /^ccl[0-9]/ {sub(/@.*/, "", $2); print $2}'
}

apply_shaping() {
  local us burst limit host_limit h i n
  us=$(delay_us "$DELAY")
  [ "$us" != bad ] || die "-d DELAY: '$DELAY' is not a delay (500us, 1ms, 0)"
  mkdir -p "$STATE"
  for h in $(hosts_of "$PREFIX"); do
    i=${h##*-h}
    if [ -f "$STATE/delay-$i.pid" ]; then
      kill "$(cat "$STATE/delay-$i.pid")" 2>/dev/null
      rm -f "$STATE/delay-$i.pid"
    fi
    command -v iptables >/dev/null && ip netns exec "$h" iptables -t mangle -F PREROUTING 2>/dev/null
    for n in $(nics_of "$h"); do
      ip netns exec "$h" tc qdisc del dev "$n" root 2>/dev/null
      ip netns exec "$SW" tc qdisc del dev "h${i}${n#ccl}" root 2>/dev/null
      if [ "$RATE" != 0 ]; then
        # burst: at least 128 KiB so that GSO packets pass whole; queues: the host's own egress
        # 8 MiB, the switch port toward it about 5 ms of traffic (see the header)
        read -r burst limit host_limit < <(tc_sizes "$RATE") ||
          die "-r RATE: '$RATE' is not a rate (1gbit, 100mbit)"
        ip netns exec "$h" tc qdisc add dev "$n" root tbf rate "$RATE" burst "$burst" limit "$host_limit" ||
          die "tbf on $h/$n failed (rate '$RATE')"
        ip netns exec "$SW" tc qdisc add dev "h${i}${n#ccl}" root tbf rate "$RATE" burst "$burst" limit "$limit" ||
          die "tbf on $SW/h${i}${n#ccl} failed"
      fi
    done
    if [ "$us" -gt 0 ]; then
      command -v iptables >/dev/null || die "-d needs iptables (scripts/deps.sh --bench)"
      [ -x "$NFQ" ] || die "-d needs the delayer $NFQ (scripts/bench-multihost.sh builds it; FABRICOLL_NFQ_DELAY names another)"
      for n in $(nics_of "$h"); do
        ip netns exec "$h" iptables -t mangle -A PREROUTING -i "$n" -j NFQUEUE --queue-num 0 ||
          die "iptables NFQUEUE in $h failed"
      done
      # real-time priority: ranks that busy-poll every CPU must not hold back the packets
      ip netns exec "$h" setsid chrt -f 50 "$NFQ" -q 0 -d "$us" -l 7200 >"$STATE/delay-$i.log" 2>&1 </dev/null &
      echo $! >"$STATE/delay-$i.pid"
    fi
  done
  printf 'RATE=%s\nDELAY=%s\n' "$RATE" "$DELAY" >"$STATE/shape"
}

# tc_sizes RATE -> "BURST LIMIT HOST_LIMIT" in bytes: the bucket, the switch port's queue and the
# host's own egress queue
tc_sizes() {
  awk -v r="$1" 'BEGIN{ s = tolower(r); m = 1
    if (s ~ /gbit$/) { sub(/gbit$/, "", s); m = 1e9 } else if (s ~ /mbit$/) { sub(/mbit$/, "", s); m = 1e6 }
    else if (s ~ /kbit$/) { sub(/kbit$/, "", s); m = 1e3 } else if (s ~ /bit$/) { sub(/bit$/, "", s) }
    if (s !~ /^[0-9.]+$/ || s == 0) exit 1
    b = s * m; burst = b / 8 / 1000; if (burst < 131072) burst = 131072
    limit = b / 8 * 0.005; if (limit < 4 * burst) limit = 4 * burst
    host = 8 * 1048576; if (host < limit) host = limit
    printf "%d %d %d\n", burst, limit, host }'
}

# down_prefix P: removes cluster P (its processes, namespaces and state); idempotent
down_prefix() {
  local p=$1 h pidf
  for pidf in "$STATE_ROOT/$p"/delay-*.pid; do
    [ -f "$pidf" ] && kill "$(cat "$pidf")" 2>/dev/null
  done
  for h in $(hosts_of "$p") "$p-sw"; do
    ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$h" || continue
    # processes still inside (ranks of a killed run): end them, or the namespace lingers
    ip netns pids "$h" 2>/dev/null | while read -r pid; do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$h" 2>/dev/null || echo "netns-cluster: could not delete namespace $h" >&2
  done
  rm -rf "${STATE_ROOT:?}/$p"
}

do_up() {
  need_prefix
  [[ "$K" =~ ^[0-9]+$ ]] && [ "$K" -ge 1 ] && [ "$K" -le 64 ] || die "-k K: '$K' is not 1..64"
  [ "$NICS" = 1 ] || [ "$NICS" = 2 ] || die "--nics: '$NICS' is not 1 or 2"
  [[ "$SUBNET" =~ ^[0-9]+\.[0-9]+\.([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -lt 255 ] ||
    die "-s SUBNET: '$SUBNET' is not A.B.C with C < 255"
  command -v ip >/dev/null || die "ip (iproute2) not found"
  down_prefix "$PREFIX"
  mkdir -p "$STATE" || die "cannot create $STATE"
  echo "$OWNER" >"$STATE/owner"
  local subnets=("$SUBNET") i h n
  [ "$NICS" = 2 ] && subnets+=("${SUBNET%.*}.$((${SUBNET##*.} + 1))")
  ip netns add "$SW" || die "ip netns add $SW failed (root? iproute2 with netns?)"
  ip netns exec "$SW" ip link set lo up
  for n in $(seq 0 $((NICS - 1))); do
    ip netns exec "$SW" ip link add "br$n" type bridge stp_state 0 forward_delay 0 || die "bridge in $SW failed"
    ip netns exec "$SW" ip link set "br$n" up
  done
  for i in $(seq 1 "$K"); do
    h=$PREFIX-h$i
    ip netns add "$h" || die "ip netns add $h failed"
    ip netns exec "$h" ip link set lo up
    ip netns exec "$h" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    for n in $(seq 0 $((NICS - 1))); do
      # made inside the namespaces directly: no interface ever exists in the root namespace
      ip link add "ccl$n" netns "$h" type veth peer name "h$i$n" netns "$SW" || die "veth for $h failed"
      ip netns exec "$SW" ip link set "h$i$n" master "br$n"
      ip netns exec "$SW" ip link set "h$i$n" up
      ip netns exec "$h" ip addr add "${subnets[$n]}.$i/24" dev "ccl$n"
      ip netns exec "$h" ip link set "ccl$n" up
    done
  done
  apply_shaping
  # bounded wait for the links to come up
  for _ in $(seq 1 50); do
    ip netns exec "$PREFIX-h$K" ip link show ccl0 | grep -q LOWER_UP && break
    sleep 0.1
  done
  echo "# cluster $PREFIX: $K hosts (${subnets[*]}.i/24), rate $RATE, delay $DELAY"
}

do_status() {
  need_prefix
  local h
  echo "# cluster $PREFIX: $(hosts_of "$PREFIX" | wc -l) hosts; owner $(cat "$STATE/owner" 2>/dev/null)"
  [ -f "$STATE/shape" ] && sed 's/^/#   /' "$STATE/shape"
  for h in $(hosts_of "$PREFIX"); do
    printf '%-14s %s\n' "$h" "$(ip netns exec "$h" ip -4 -o addr show 2>/dev/null | awk '$2 != "lo" {printf "%s %s  ", $2, $4}')"
  done
}

# do_down_owned [PID]: removes the clusters fcn<PID>* (no PID: those whose PID is not alive)
do_down_owned() {
  local p owner
  for p in $(ip netns list 2>/dev/null | awk '{print $1}' | sed -nE 's/^(fcn[0-9]+[a-z]*)-(h[0-9]+|sw)$/\1/p' | sort -u); do
    owner=$(sed -nE 's/^fcn([0-9]+)[a-z]*$/\1/p' <<<"$p")
    if [ -n "${1:-}" ]; then
      [ "$owner" = "$1" ] && down_prefix "$p"
    elif [ -n "$owner" ] && ! kill -0 "$owner" 2>/dev/null; then
      echo "netns-cluster: removing stale cluster $p (its owner $owner is gone)"
      down_prefix "$p"
    fi
  done
  [ -n "${1:-}" ] && return 0
  for p in "$STATE_ROOT"/*; do
    [ -f "$p/owner" ] || continue
    kill -0 "$(cat "$p/owner")" 2>/dev/null || down_prefix "$(basename "$p")"
  done
}

case "$CMD" in
  up) do_up ;;
  reshape)
    need_prefix
    [ -n "$(hosts_of "$PREFIX")" ] || die "no cluster $PREFIX"
    apply_shaping ;;
  down)
    if [ "$STALE" = 1 ]; then
      do_down_owned
    elif [ -n "$OWNED" ] && [ -z "$PREFIX" ]; then
      do_down_owned "$OWNED"
    else
      need_prefix
      down_prefix "$PREFIX"
    fi ;;
  status) do_status ;;
  prefix) echo "fcn${1:-$PPID}" ;;
  exec)
    need_prefix
    i=${1:?exec: host index}
    shift
    [ $# -gt 0 ] || die "exec: no command"
    ip netns list | awk '{print $1}' | grep -qx "$PREFIX-h$i" || die "exec: no host $PREFIX-h$i"
    exec ip netns exec "$PREFIX-h$i" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "$PREFIX-h$i" "$@" ;;
  *)
    sed -n '2,25p' "$0"
    exit 2 ;;
esac

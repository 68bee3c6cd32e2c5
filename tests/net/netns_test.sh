#!/bin/bash
# net suite: ranks on two hosts, each host a network namespace of its own joined by a veth pair, so that every
# byte between hosts crosses a real network stack. Addresses exist only inside the namespaces this script makes,
# and both go when it ends, whatever happens.
#
#   tests/net/netns_test.sh BUILD_DIR
#
# Runs collective_check with 4 ranks, 2 per namespace (LOOM_HOSTID tells loom which ranks share a host: the
# namespaces share a kernel, so it could not tell otherwise). Ranks of one host talk over shm, the hosts over tcp.
# Then the same with the link shaped to 200 Mbit/s by tc's tbf, which the tcp path must live with.
# Skips (exit 77) where network namespaces cannot be made (not root, no `ip`).
set -u
build=${1:?usage: netns_test.sh BUILD_DIR}
check=$build/tests/mp_collective_check
[ -x "$check" ] || { echo "netns_test: $check is not built"; exit 1; }
command -v ip >/dev/null || { echo "netns_test: no ip command: skipped"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "netns_test: needs root for network namespaces: skipped"; exit 77; }

tag=loom$$
nsa=$tag-a
nsb=$tag-b
cleanup() {
  ip netns del "$nsa" 2>/dev/null
  ip netns del "$nsb" 2>/dev/null
}
trap cleanup EXIT
if ! ip netns add "$nsa" 2>/dev/null || ! ip netns add "$nsb" 2>/dev/null; then
  echo "netns_test: cannot create network namespaces here: skipped"
  exit 77
fi
# A /24 from 10.0.0.0/8 picked by the pid, so that parallel runs do not collide (and nothing outside sees it).
net=10.$((($$ >> 8) % 200 + 20)).$(($$ % 250))
ip link add "va$$" netns "$nsa" type veth peer name "vb$$" netns "$nsb" || exit 1
ip -n "$nsa" addr add "$net.1/24" dev "va$$" && ip -n "$nsa" link set "va$$" up && ip -n "$nsa" link set lo up
ip -n "$nsb" addr add "$net.2/24" dev "vb$$" && ip -n "$nsb" link set "vb$$" up && ip -n "$nsb" link set lo up

failures=0
# run NAME ARGS...: 4 ranks of collective_check, ranks 0-1 in namespace a and 2-3 in namespace b.
run() {
  local name=$1
  shift
  local secret port pids=() rank status=0
  secret=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  port=$((20000 + $$ % 20000))
  for rank in 0 1 2 3; do
    local ns=$nsa host=host-a
    if [ "$rank" -ge 2 ]; then ns=$nsb host=host-b; fi
    ip netns exec "$ns" env LOOM_RANK=$rank LOOM_NRANKS=4 LOOM_LOCAL_RANK=$((rank % 2)) LOOM_LOCAL_NRANKS=2 \
      LOOM_ROOT_ADDR="$net.1:$port" LOOM_SECRET="$secret" LOOM_HOSTID=$host LOOM_TIMEOUT_MS=120000 \
      LOOM_DEBUG=${LOOM_DEBUG:-WARN} LOOM_DEBUG_SUBSYS=${LOOM_DEBUG_SUBSYS:-} \
      timeout 600 "$check" "$@" > "$workdir/$name.$rank.log" 2>&1 &
    pids+=($!)
  done
  for rank in 0 1 2 3; do
    wait "${pids[$rank]}" || { status=1; echo "netns_test: $name: rank $rank failed:"; cat "$workdir/$name.$rank.log"; }
  done
  if [ "$status" = 0 ]; then echo "netns_test: $name: passed"; else failures=$((failures + 1)); fi
}

workdir=$(mktemp -d)
trap 'cleanup; rm -rf "$workdir"' EXIT
LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=NET run two-hosts 7,70000 1000003 plain
if ! grep -q "messages sent and" "$workdir/two-hosts.0.log"; then
  echo "netns_test: rank 0 logged no tcp traffic:"
  cat "$workdir/two-hosts.0.log"
  failures=$((failures + 1))
fi
LOOM_NCHANNELS=2 run two-hosts-two-channels 7,5000 70000 registered
if ip netns exec "$nsa" tc qdisc add dev "va$$" root tbf rate 200mbit burst 64kb latency 50ms 2>/dev/null &&
  ip netns exec "$nsb" tc qdisc add dev "vb$$" root tbf rate 200mbit burst 64kb latency 50ms 2>/dev/null; then
  run shaped 7,5000 300000 plain
else
  echo "netns_test: tc tbf unavailable: the shaped run is skipped"
fi
exit $((failures > 0))

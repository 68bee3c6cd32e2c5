#!/bin/bash
# net suite: ranks on hosts made of network namespaces joined by a bridge (tests/net/netns.sh), so that every
# byte between hosts crosses a real network stack, and each host has a hostname of its own, as real hosts do.
#
#   tests/net/netns_test.sh BUILD_DIR
#
# 1. The collective matrix (collective_check) on 2 hosts x 2 ranks and on 4 hosts x 1 rank: ranks of one host
#    talk over shm, hosts over tcp. Also with LOOM_SOCKET_IFNAME=eth0, 2 channels and 3 sockets per connection,
#    with the hosts' links shaped to 200 Mbit/s by tc's tbf, over ucx between the hosts (LOOM_NET=ucx: tagged
#    sends, UCX's tcp emulating RMA; and with LOOM_UCX_PUT_EMULATED=1, puts), and over
#    ib on the software verbs device (LOOM_NET=ib, LOOM_IB_PROVIDER=softib); on 4 hosts over tcp, ib and ucx.
# 2. A host's link set down in the middle of AllReduce calls: every rank ends with an error (the others with
#    loomTimeout or loomRemoteError) within LOOM_TIMEOUT_MS plus 3 s.
# 3. A rank on the other host killed with SIGKILL in the middle of AllReduce calls: every survivor ends with
#    loomRemoteError or loomTimeout, the other host's within 5 s.
# Skips (exit 77) where network namespaces cannot be made (not root, no ip).
set -u
build=${1:?usage: netns_test.sh BUILD_DIR}
check=$build/tests/mp_collective_check
loop=$build/tests/net_allreduce_loop
for program in "$check" "$loop"; do [ -x "$program" ] || { echo "netns_test: $program is not built"; exit 1; }; done
source "$(dirname "$0")/netns.sh"

failures=0
fail() {
  echo "netns_test: FAILED: $*"
  failures=$((failures + 1))
}
show_logs() {
  local log
  for log in "$NETNS_WORK/$1".*.log; do echo "--- $log"; tail -n 20 "$log"; done
}

# matrix NAME RANKS_PER_HOST ARGS...: collective_check on every host.
matrix() {
  local name=$1 rph=$2
  shift 2
  netns_job "$name" "$rph" "$check" "$@"
  if netns_wait; then echo "netns_test: $name: passed"; else fail "$name (exit codes ${NETNS_STATUS[*]})"; show_logs "$name"; fi
}

# A rank's "result CODE at SECONDS" line, as "CODE SECONDS".
result_of() { sed -n 's/^result \([0-9]*\) at \([0-9.]*\):.*/\1 \2/p' "$NETNS_WORK/$1.$2.log"; }

# Waits up to 60 s for every rank of job NAME to print "ready".
wait_ready() {
  local name=$1 nranks=$2 tries rank ready
  for ((tries = 0; tries < 600; ++tries)); do
    ready=0
    for ((rank = 0; rank < nranks; ++rank)); do grep -q '^ready' "$NETNS_WORK/$name.$rank.log" 2>/dev/null && ready=$((ready + 1)); done
    [ "$ready" = "$nranks" ] && return 0
    sleep 0.1
  done
  return 1
}

netns_hosts 2
status=$?
if [ "$status" = 77 ]; then echo "netns_test: skipped"; exit 77; fi
[ "$status" = 0 ] || { echo "netns_test: could not make the hosts"; exit 1; }

export LOOM_TIMEOUT_MS=120000 LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=NET,INIT
NETNS_PASS="LOOM_TIMEOUT_MS LOOM_DEBUG LOOM_DEBUG_SUBSYS"
matrix two-hosts 2 7,70000 1000003 plain
grep -q "ready on 2 host(s)" "$NETNS_WORK/two-hosts.0.log" || fail "two-hosts: rank 0 did not see 2 hosts"
grep -q "messages sent and" "$NETNS_WORK/two-hosts.0.log" || fail "two-hosts: rank 0 logged no tcp traffic"
export LOOM_SOCKET_IFNAME=eth0 LOOM_NCHANNELS=2 LOOM_NSOCKS=3 LOOM_DEBUG=WARN
NETNS_PASS="$NETNS_PASS LOOM_SOCKET_IFNAME LOOM_NCHANNELS LOOM_NSOCKS"
matrix eth0-two-channels-three-sockets 2 7,5000 300000 registered
unset LOOM_SOCKET_IFNAME LOOM_NCHANNELS LOOM_NSOCKS
NETNS_PASS="LOOM_TIMEOUT_MS LOOM_DEBUG"
if netns_shape 0 200mbit 2>/dev/null && netns_shape 1 200mbit 2>/dev/null; then
  matrix shaped 2 7,5000 300000 plain
  netns_unshape 0 && netns_unshape 1
else
  echo "netns_test: tc tbf unavailable: the shaped run is skipped"
fi

# 1, over ucx between the hosts (where libucp is installed), on the hosts' eth0.
if ldconfig -p | grep -q 'libucp\.so\.0'; then
  export LOOM_NET=ucx UCX_NET_DEVICES=eth0 LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=NET
  NETNS_PASS="LOOM_TIMEOUT_MS LOOM_DEBUG LOOM_DEBUG_SUBSYS LOOM_NET UCX_NET_DEVICES"
  matrix two-hosts-ucx 2 7,70000 1000003 plain
  grep -q "received over ucx" "$NETNS_WORK/two-hosts-ucx.0.log" || fail "two-hosts-ucx: rank 0 logged no ucx traffic"
  # UCX's tcp emulates RMA: every message goes tagged, unless LOOM_UCX_PUT_EMULATED asks for puts anyway.
  cat "$NETNS_WORK"/two-hosts-ucx.*.log | grep -q "emulates RMA: every message goes tagged" ||
    fail "two-hosts-ucx: no endpoint was found to emulate RMA"
  ! cat "$NETNS_WORK"/two-hosts-ucx.*.log | grep -q "went by RMA put over ucx" ||
    fail "two-hosts-ucx: a rank put messages over emulated RMA"
  export LOOM_UCX_PUT_EMULATED=1
  NETNS_PASS="$NETNS_PASS LOOM_UCX_PUT_EMULATED"
  matrix two-hosts-ucx-puts 2 7,70000 1000003 plain
  cat "$NETNS_WORK"/two-hosts-ucx-puts.*.log | grep -q "went by RMA put over ucx" ||
    fail "two-hosts-ucx-puts: no rank sent a message by RMA put"
  unset LOOM_NET UCX_NET_DEVICES LOOM_DEBUG_SUBSYS LOOM_UCX_PUT_EMULATED
  export LOOM_DEBUG=WARN
  NETNS_PASS="LOOM_TIMEOUT_MS LOOM_DEBUG"
else
  echo "netns_test: libucp.so.0 not installed: the ucx run is skipped"
fi

# 1, over ib between the hosts on the software verbs device (the namespaces share /dev/shm), 2 queue pairs per
# connection. Each host's device has GIDs of its own (its hostname; its eth0 address).
export LOOM_NET=ib LOOM_IB_PROVIDER=softib LOOM_IB_QPS_PER_CONNECTION=2 LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=NET
NETNS_PASS="LOOM_TIMEOUT_MS LOOM_DEBUG LOOM_DEBUG_SUBSYS LOOM_NET LOOM_IB_PROVIDER LOOM_IB_QPS_PER_CONNECTION"
matrix two-hosts-ib 2 7,70000 1000003 plain
grep -q "received over ib" "$NETNS_WORK/two-hosts-ib.0.log" || fail "two-hosts-ib: rank 0 logged no ib traffic"
unset LOOM_NET LOOM_IB_PROVIDER LOOM_IB_QPS_PER_CONNECTION LOOM_DEBUG_SUBSYS
export LOOM_DEBUG=WARN
NETNS_PASS="LOOM_TIMEOUT_MS LOOM_DEBUG"

# 2. Host 1's link goes down 1 s into the loop.
export LOOM_TIMEOUT_MS=5000
netns_job link-down 2 "$loop" 1048576 60
if wait_ready link-down 4; then
  sleep 1
  down_at=$(date +%s.%N)
  netns_link 1 down
  netns_wait
  for rank in 0 1 2 3; do
    read -r code at <<<"$(result_of link-down $rank)"
    if [ "${code:-0}" != 8 ] && [ "${code:-0}" != 6 ]; then
      fail "link-down: rank $rank ended with ${code:-nothing}, expected loomTimeout (8) or loomRemoteError (6)"
    elif awk -v a="$at" -v d="$down_at" 'BEGIN { exit !(a - d > 8.0) }'; then
      fail "link-down: rank $rank took $(awk -v a="$at" -v d="$down_at" 'BEGIN { print a - d }') s to fail"
    fi
  done
  netns_link 1 up
  echo "netns_test: link-down: done"
else
  fail "link-down: the ranks did not all finish a first AllReduce"
  netns_wait
fi
show_logs link-down | grep -E "^---|result"

# 3. Rank 3 (host 1) is killed 1 s into the loop; rank 2 shares its host.
export LOOM_TIMEOUT_MS=10000
netns_job killed 2 "$loop" 1048576 60
victim_pid=${NETNS_PIDS[3]}
if wait_ready killed 4; then
  sleep 1
  killed_at=$(date +%s.%N)
  kill -9 "$victim_pid"
  netns_wait
  [ "${NETNS_STATUS[3]}" = 137 ] || fail "killed: rank 3 ended with ${NETNS_STATUS[3]}, not SIGKILL"
  for rank in 0 1 2; do
    read -r code at <<<"$(result_of killed $rank)"
    if [ "${code:-0}" != 6 ] && [ "${code:-0}" != 8 ]; then
      fail "killed: rank $rank ended with ${code:-nothing}, expected loomRemoteError (6) or loomTimeout (8)"
    elif [ "$rank" -lt 2 ] && [ "$code" = 6 ] && awk -v a="$at" -v d="$killed_at" 'BEGIN { exit !(a - d > 5.0) }'; then
      fail "killed: rank $rank took $(awk -v a="$at" -v d="$killed_at" 'BEGIN { print a - d }') s to see the death"
    fi
  done
  echo "netns_test: killed: done"
else
  fail "killed: the ranks did not all finish a first AllReduce"
  netns_wait
fi
show_logs killed | grep -E "^---|result"

# 1 again, on 4 hosts of one rank each.
export LOOM_TIMEOUT_MS=120000
for ((i = 0; i < NETNS_HOSTS; ++i)); do ip netns del "$NETNS_TAG-h$i"; done
ip netns del "$NETNS_TAG-br"
NETNS_HOSTS=0
netns_hosts 4 || { fail "could not make 4 hosts"; exit 1; }
matrix four-hosts 1 7,70000 1000003 plain
NETNS_PASS="LOOM_TIMEOUT_MS LOOM_DEBUG LOOM_NET LOOM_IB_PROVIDER"
export LOOM_NET=ib LOOM_IB_PROVIDER=softib
matrix four-hosts-ib 1 7,70000 1000003 plain
if ldconfig -p | grep -q 'libucp\.so\.0'; then
  export LOOM_NET=ucx UCX_NET_DEVICES=eth0
  NETNS_PASS="$NETNS_PASS UCX_NET_DEVICES"
  matrix four-hosts-ucx 1 7,70000 1000003 plain
fi

[ "$failures" = 0 ] && echo "netns_test: all passed"
exit $((failures > 0))

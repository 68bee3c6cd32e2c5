# Hosts made of network namespaces, for loom's multi-host tests and benchmarks. Source it, then:
#
#   netns_hosts N         makes N hosts: namespaces $NETNS_TAG-h0 .. h(N-1), each with an interface eth0 that a veth
#                         pair joins to a bridge in a namespace of its own ($NETNS_TAG-br), addresses $NETNS_NET.1 ..
#                         $NETNS_NET.N; tears them down at exit, whatever happens
#   netns_exec I CMD...   becomes CMD on host I (it execs: call it in a subshell): in the host's namespace, with a
#                         hostname of its own (host-I, in a UTS namespace), so loom tells the hosts apart as it
#                         would real ones
#   netns_link I up|down  sets host I's link up or down (its end in the bridge namespace)
#   netns_shape I RATE    shapes host I's traffic both ways with tc's tbf (RATE as tc writes it: 2gbit; a queue of
#                         $NETNS_TBF_LATENCY, 10ms by default)
#   netns_unshape I       takes the shaping off again
#   netns_job NAME RPH PROGRAM ARGS...
#                         runs PROGRAM as a job of N * RPH ranks, RPH per host (rank r on host r / RPH), with
#                         loomCommInitFromEnv's variables; the root listens on host 0. Returns at once; the ranks'
#                         pids are in NETNS_PIDS, their output in $NETNS_WORK/NAME.RANK.log. Environment variables
#                         named in NETNS_PASS (a space-separated list) are passed on to the ranks, and
#                         LOOM_SPIN_COUNT (200 unless set): the hosts share this machine's cores.
#   netns_wait            waits for NETNS_PIDS; returns non-zero if any rank failed, and sets NETNS_STATUS (exit
#                         codes by rank)
#
# Needs root and iproute2; netns_hosts returns 77 (skip) where namespaces cannot be made. Addresses exist only
# inside the namespaces made here, in a /24 of 10.0.0.0/8 picked from the pid.

NETNS_TAG=loom$$
NETNS_NET=10.$((($$ >> 8) % 200 + 20)).$(($$ % 250))
NETNS_HOSTS=0
NETNS_WORK=$(mktemp -d)
NETNS_PIDS=()
NETNS_STATUS=()

netns_cleanup() {
  local pid
  for pid in "${NETNS_PIDS[@]}"; do kill -9 "$pid" 2>/dev/null; done
  local i
  for ((i = 0; i < NETNS_HOSTS; ++i)); do ip netns del "$NETNS_TAG-h$i" 2>/dev/null; done
  ip netns del "$NETNS_TAG-br" 2>/dev/null
  rm -rf "$NETNS_WORK"
}
trap netns_cleanup EXIT

netns_hosts() {
  local n=$1 i
  command -v ip >/dev/null || { echo "netns: no ip command"; return 77; }
  [ "$(id -u)" = 0 ] || { echo "netns: network namespaces need root"; return 77; }
  ip netns add "$NETNS_TAG-br" 2>/dev/null || { echo "netns: cannot create network namespaces here"; return 77; }
  ip -n "$NETNS_TAG-br" link add br0 type bridge || return 1
  ip -n "$NETNS_TAG-br" link set br0 up || return 1
  for ((i = 0; i < n; ++i)); do
    ip netns add "$NETNS_TAG-h$i" || return 1
    NETNS_HOSTS=$((i + 1))
    ip link add eth0 netns "$NETNS_TAG-h$i" type veth peer name "vh$i" netns "$NETNS_TAG-br" || return 1
    ip -n "$NETNS_TAG-br" link set "vh$i" master br0 up || return 1
    ip -n "$NETNS_TAG-h$i" addr add "$NETNS_NET.$((i + 1))/24" dev eth0 || return 1
    ip -n "$NETNS_TAG-h$i" link set eth0 up || return 1
    ip -n "$NETNS_TAG-h$i" link set lo up || return 1
  done
}

netns_exec() {
  local host=$1
  shift
  exec ip netns exec "$NETNS_TAG-h$host" unshare --uts sh -c 'hostname "$0" && exec "$@"' "host-$host" "$@"
}

netns_link() {
  ip -n "$NETNS_TAG-br" link set "vh$1" "$2"
}

netns_shape() {
  local host=$1 rate=$2 latency=${NETNS_TBF_LATENCY:-10ms}
  ip netns exec "$NETNS_TAG-h$host" tc qdisc replace dev eth0 root tbf rate "$rate" burst 256kb latency "$latency" &&
    ip netns exec "$NETNS_TAG-br" tc qdisc replace dev "vh$host" root tbf rate "$rate" burst 256kb latency "$latency"
}

netns_unshape() {
  ip netns exec "$NETNS_TAG-h$1" tc qdisc del dev eth0 root 2>/dev/null
  ip netns exec "$NETNS_TAG-br" tc qdisc del dev "vh$1" root 2>/dev/null
  return 0
}

netns_job() {
  local name=$1 rph=$2
  shift 2
  local nranks=$((NETNS_HOSTS * rph)) secret port rank var
  secret=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  port=$((20000 + RANDOM % 20000))
  # The hosts share this machine's cores, which loom cannot tell from inside a namespace with a hostname of its
  # own: without this, each rank would spin as if it had a core to itself and starve the others' proxies.
  local pass=("LOOM_SPIN_COUNT=${LOOM_SPIN_COUNT:-200}")
  for var in $NETNS_PASS; do pass+=("$var=${!var}"); done
  NETNS_PIDS=()
  for ((rank = 0; rank < nranks; ++rank)); do
    # exec all the way down, so that the pid kept is the rank's own (a test may kill it).
    (netns_exec $((rank / rph)) env LOOM_RANK=$rank LOOM_NRANKS=$nranks LOOM_LOCAL_RANK=$((rank % rph)) \
      LOOM_LOCAL_NRANKS="$rph" LOOM_ROOT_ADDR="$NETNS_NET.1:$port" LOOM_SECRET="$secret" "${pass[@]}" \
      "$@" >"$NETNS_WORK/$name.$rank.log" 2>&1) &
    NETNS_PIDS+=($!)
  done
}

netns_wait() {
  local rank failed=0
  NETNS_STATUS=()
  for rank in "${!NETNS_PIDS[@]}"; do
    wait "${NETNS_PIDS[$rank]}"
    NETNS_STATUS[$rank]=$?
    [ "${NETNS_STATUS[$rank]}" = 0 ] || failed=1
  done
  NETNS_PIDS=()
  return $failed
}

#!/bin/bash
# Network benchmarks on hosts made of network namespaces (tests/net/netns.sh), as root:
#
#   perf/netns_bench.sh [BUILD_DIR] [--rate 2gbit] [--iters 10]
#
# 1. 2 hosts x 2 ranks, each host's link shaped to RATE both ways by tc's tbf: AllReduce busbw with the flat ring
#    against the hierarchical algorithm (reduce-scatter on each host over shm, all-reduce between hosts over tcp,
#    all-gather on each host), 16 to 64 MiB, in one run. The hierarchical one sends 1/2 of the data across the
#    link per host where the ring sends all of it twice.
# 2. 2 ranks on one host, unshaped, over loopback: loom over tcp (LOOM_TRANSPORTS=tcp) against Gloo's TCP
#    transport (perf/peers/gloo_perf), 1 to 64 MiB, in one run, with the ceiling: what TCP moves each way
#    between two processes that send and receive at once (perf/tcp_ceiling), which bounds a 2-rank busbw.
# 3. 2 hosts x 1 rank, unshaped: LOOM_NET=tcp against LOOM_NET=ucx (UCX over the hosts' eth0), 1 to 64 MiB, ucx
#    with its RMA puts (LOOM_UCX_PUT_BYTES=16384, the default) and with tagged sends only (0).
# Prints each table as the perf programs do and a summary of ratios at every size, with the command lines.
set -u
build=build
rate=2gbit
iters=10
while [ $# -gt 0 ]; do
  case $1 in
    --rate) rate=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    *) build=$1; shift ;;
  esac
done
source "$(dirname "$0")/../tests/net/netns.sh"
perf=$build/perf/all_reduce_perf
gloo=$build/perf/peers/gloo_perf
[ -x "$perf" ] || { echo "netns_bench: $perf is not built"; exit 1; }

# busbw_column FILE: "size busbw" per row of a perf table (out of place).
busbw_column() { awk '/^ +[0-9]/ { print $1, $8 }' "$1"; }
# pair A B: "size a b" for the sizes both "size value" files have, in A's order.
pair() { awk 'NR == FNR { b[$1] = $2; next } ($1 in b) { print $1, $2, b[$1] }' "$2" "$1"; }
# job NAME RANKS_PER_HOST TITLE: runs all_reduce_perf on every host with $sizes, prints its table under TITLE
# and keeps its busbw column in $NETNS_WORK/NAME.busbw.
job() {
  local name=$1 rph=$2 title=$3 command="$perf $sizes -n $iters -w 2"
  echo "## $title: $command"
  netns_job "$name" "$rph" $command
  netns_wait || { echo "netns_bench: the $name run failed"; cat "$NETNS_WORK/$name.0.log"; exit 1; }
  grep -E "^#  *(size|\(B\))|^ +[0-9]" "$NETNS_WORK/$name.0.log"
  busbw_column "$NETNS_WORK/$name.0.log" >"$NETNS_WORK/$name.busbw"
}

echo "# netns_bench: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, $(uname -r)"
netns_hosts 2 || exit $?
netns_shape 0 "$rate" && netns_shape 1 "$rate" || { echo "netns_bench: tc tbf is unavailable"; exit 1; }
export LOOM_TIMEOUT_MS=600000
sizes="-b 16M -e 64M -f 2"
for algo in ring hierarchical; do
  export LOOM_ALGO=$algo
  NETNS_PASS="LOOM_TIMEOUT_MS LOOM_ALGO"
  job "$algo" 2 "2 hosts x 2 ranks, links shaped to $rate, LOOM_ALGO=$algo"
done
unset LOOM_ALGO
echo "## hierarchical / ring busbw, links shaped to $rate"
pair "$NETNS_WORK/ring.busbw" "$NETNS_WORK/hierarchical.busbw" |
  awk '{ printf "%12d B  ring %6.3f GB/s  hierarchical %6.3f GB/s  ratio %.2f\n", $1, $2, $3, $3 / $2 }'

# 3. 2 hosts x 1 rank, unshaped: tcp against ucx between the hosts.
netns_unshape 0 && netns_unshape 1
# ucx twice: as it runs by default (RMA puts from 16 KiB), and with tagged sends only (LOOM_UCX_PUT_BYTES=0).
for net in tcp ucx ucx-tagged; do
  if [ "$net" != tcp ] && ! ldconfig -p | grep -q 'libucp\.so\.0'; then
    echo "## $net: libucp.so.0 not installed: skipped"
    continue
  fi
  export LOOM_NET=${net%-tagged} UCX_NET_DEVICES=eth0 LOOM_UCX_PUT_BYTES=16384
  [ "$net" = ucx-tagged ] && LOOM_UCX_PUT_BYTES=0
  NETNS_PASS="LOOM_TIMEOUT_MS LOOM_NET UCX_NET_DEVICES LOOM_UCX_PUT_BYTES"
  sizes="-b 1M -e 64M -f 4"
  job "net-$net" 1 "2 hosts x 1 rank, unshaped veth, LOOM_NET=$LOOM_NET LOOM_UCX_PUT_BYTES=$LOOM_UCX_PUT_BYTES"
done
unset LOOM_NET UCX_NET_DEVICES LOOM_UCX_PUT_BYTES
for variant in ucx ucx-tagged; do
  [ -s "$NETNS_WORK/net-$variant.busbw" ] || continue
  echo "## $variant / tcp busbw, 2 hosts x 1 rank"
  pair "$NETNS_WORK/net-tcp.busbw" "$NETNS_WORK/net-$variant.busbw" |
    awk -v v="$variant" '{ printf "%12d B  tcp %6.3f GB/s  %s %6.3f GB/s  ratio %.2f\n", $1, $2, v, $3, ($2 > 0 ? $3 / $2 : 0) }'
done

loomrun=$build/tools/loomrun
echo "## the ceiling: TCP over loopback, both ways at once: $build/perf/tcp_ceiling 256M 5"
"$build/perf/tcp_ceiling" 256M 5
command="-n 2 $perf -b 1M -e 64M -f 4 -n $iters -w 2"
echo "## 2 ranks, one host, loopback: loom over tcp: LOOM_TRANSPORTS=tcp $loomrun $command"
LOOM_TRANSPORTS=tcp $loomrun $command >"$NETNS_WORK/loom-tcp.log" 2>&1 || { cat "$NETNS_WORK/loom-tcp.log"; exit 1; }
grep -E "^ +[0-9]" "$NETNS_WORK/loom-tcp.log"
if [ -x "$gloo" ]; then
  command="-n 2 $gloo -C all_reduce -b 1M -e 64M -f 4 -n $iters -w 2"
  echo "## the same with Gloo (TCP over loopback): $loomrun $command"
  $loomrun $command >"$NETNS_WORK/gloo.log" 2>&1 || { cat "$NETNS_WORK/gloo.log"; exit 1; }
  grep -E "^ +[0-9]" "$NETNS_WORK/gloo.log"
  echo "## loom (tcp) / Gloo busbw"
  pair <(busbw_column "$NETNS_WORK/loom-tcp.log") <(busbw_column "$NETNS_WORK/gloo.log") |
    awk '{ printf "%12d B  loom %6.3f GB/s  Gloo %6.3f GB/s  ratio %.2f\n", $1, $2, $3, ($3 > 0 ? $2 / $3 : 0) }'
else
  echo "## Gloo: perf/peers/gloo_perf is not built (no libgloo-dev): skipped"
fi

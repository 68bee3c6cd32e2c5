#!/bin/bash
# Network benchmarks on hosts made of network namespaces (tests/net/netns.sh), as root:
#
#   perf/netns_bench.sh [BUILD_DIR] [--rate 2gbit] [--iters 10] [--local-iters 20] [--rounds 3]
#
# --iters: timed calls per size in the namespace runs (1 and 3; a 64 MiB call over the shaped link takes 0.3 s);
# --local-iters: timed calls per size in the loopback runs (2), by default 20 as the perf programs have it. On
# this VM a call that visits a buffer offset not touched for a while runs from cold memory, and with 10 calls over
# the 4 offsets a 16 MiB row walks, such calls are a third of the row.
#
# The two comparisons with targets (1 and 2) run ROUNDS times, the two sides alternating, and compare medians:
# on a shared machine the rate of one run moves by a factor of two from one minute to the next.
# 1. 2 hosts x 2 ranks, each host's link shaped to RATE both ways by tc's tbf: AllReduce busbw with the flat ring
#    against the hierarchical algorithm (reduce-scatter on each host over shm, all-reduce between hosts over tcp,
#    all-gather on each host), 16 to 64 MiB. The hierarchical one sends the buffer across the link once each way
#    where the ring sends 1.5 times it: 1.5 is the most their ratio can be.
# 2. 2 ranks on one host, unshaped, over loopback: loom over tcp (LOOM_TRANSPORTS=tcp) against Gloo's TCP
#    transport (perf/peers/gloo_perf), 1 to 64 MiB, beside what one TCP socket moves each way between two
#    processes that send and receive at once (perf/tcp_ceiling): a 2-rank busbw over one socket each way.
# 3. 2 hosts x 1 rank, unshaped: LOOM_NET=tcp against LOOM_NET=ucx (UCX over the hosts' eth0), 1 to 64 MiB, ucx
#    with its RMA puts (LOOM_UCX_PUT_BYTES=16384, the default) and with tagged sends only (0).
# Prints each table as the perf programs do and a summary of ratios at every size, with the command lines.
set -u
build=build
rate=2gbit
iters=10
local_iters=20
rounds=3
while [ $# -gt 0 ]; do
  case $1 in
    --rate) rate=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --local-iters) local_iters=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) build=$1; shift ;;
  esac
done
source "$(dirname "$0")/../tests/net/netns.sh"
perf=$build/perf/all_reduce_perf
gloo=$build/perf/peers/gloo_perf
[ -x "$perf" ] || { echo "netns_bench: $perf is not built"; exit 1; }

# busbw_column FILE RANKS: "size busbw" per row of an AllReduce perf table (out of place), in GB/s from the time
# column: the table's busbw has two decimals, 5% of the 0.2 GB/s a shaped link gives.
busbw_column() {
  awk -v n="$2" '/^ +[0-9]/ && $6 > 0 { printf "%d %.4f\n", $1, $1 / ($6 * 1e3) * 2 * (n - 1) / n }' "$1"
}
# pair A B: "size a b" for the sizes both "size value" files have, in A's order.
pair() { awk 'NR == FNR { b[$1] = $2; next } ($1 in b) { print $1, $2, b[$1] }' "$2" "$1"; }
# median FILES...: "size median" over "size value" files, by size.
median() {
  awk '{ v[$1] = v[$1] " " $2 } END { for (s in v) print s, v[s] }' "$@" | sort -n |
    awk '{ n = NF - 1; for (i = 2; i <= NF; ++i) x[i - 1] = $i
           for (i = 1; i <= n; ++i) for (j = i + 1; j <= n; ++j) if (x[j] < x[i]) { t = x[i]; x[i] = x[j]; x[j] = t }
           print $1, (n % 2 ? x[(n + 1) / 2] : (x[n / 2] + x[n / 2 + 1]) / 2) }'
}
# rounds_summary A B LABEL_A LABEL_B: per size, every round's B/A ratio and the ratio of the medians, from
# $NETNS_WORK/A.R.busbw and B.R.busbw.
rounds_summary() {
  local a=$1 b=$2 r ratios=$NETNS_WORK/$1-$2.ratios
  : >"$ratios"
  for ((r = 1; r <= rounds; ++r)); do pair "$NETNS_WORK/$a.$r.busbw" "$NETNS_WORK/$b.$r.busbw" >>"$ratios"; done
  pair <(median "$NETNS_WORK"/$a.*.busbw) <(median "$NETNS_WORK"/$b.*.busbw) |
    while read -r size va vb; do
      printf "%12d B  %s %6.3f GB/s  %s %6.3f GB/s  ratio of medians %.2f  rounds:" "$size" "$3" "$va" "$4" "$vb" \
        "$(awk -v a="$va" -v b="$vb" 'BEGIN { print (a > 0 ? b / a : 0) }')"
      awk -v s="$size" '$1 == s { printf " %.2f", ($2 > 0 ? $3 / $2 : 0) }' "$ratios"
      echo
    done
}
# local_job NAME COMMAND...: runs a 2-rank perf program's COMMAND on this host (not in a namespace), prints its
# rows and keeps its busbw column in $NETNS_WORK/NAME.busbw.
local_job() {
  local name=$1
  shift
  "$@" >"$NETNS_WORK/$name.log" 2>&1 || { cat "$NETNS_WORK/$name.log"; exit 1; }
  grep -E "^ +[0-9]" "$NETNS_WORK/$name.log"
  busbw_column "$NETNS_WORK/$name.log" 2 >"$NETNS_WORK/$name.busbw"
}
# job NAME RANKS_PER_HOST TITLE: runs all_reduce_perf on every host with $sizes, prints its table under TITLE
# and keeps its busbw column in $NETNS_WORK/NAME.busbw.
job() {
  local name=$1 rph=$2 title=$3 command="$perf $sizes -n $iters -w 2"
  echo "## $title: $command"
  netns_job "$name" "$rph" $command
  netns_wait || { echo "netns_bench: the $name run failed"; cat "$NETNS_WORK/$name.0.log"; exit 1; }
  grep -E "^#  *(size|\(B\))|^ +[0-9]" "$NETNS_WORK/$name.0.log"
  busbw_column "$NETNS_WORK/$name.0.log" $((2 * rph)) >"$NETNS_WORK/$name.busbw"
}

echo "# netns_bench: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, $(uname -r)"
netns_hosts 2 || exit $?
netns_shape 0 "$rate" && netns_shape 1 "$rate" || { echo "netns_bench: tc tbf is unavailable"; exit 1; }
export LOOM_TIMEOUT_MS=600000
sizes="-b 16M -e 64M -f 2"
for ((round = 1; round <= rounds; ++round)); do
  for algo in ring hierarchical; do
    export LOOM_ALGO=$algo
    NETNS_PASS="LOOM_TIMEOUT_MS LOOM_ALGO"
    job "$algo.$round" 2 "round $round: 2 hosts x 2 ranks, links shaped to $rate, LOOM_ALGO=$algo"
  done
done
unset LOOM_ALGO
echo "## hierarchical / ring busbw, links shaped to $rate, $rounds rounds"
rounds_summary ring hierarchical ring hierarchical

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
loom_command="-n 2 $perf -b 1M -e 64M -f 4 -n $local_iters -w 2"
gloo_command="-n 2 $gloo -C all_reduce -b 1M -e 64M -f 4 -n $local_iters -w 2"
[ -x "$gloo" ] || echo "## Gloo: perf/peers/gloo_perf is not built (no libgloo-dev): loom alone"
for ((round = 1; round <= rounds; ++round)); do
  echo "## round $round, 2 ranks, one host, loopback: loom over tcp: LOOM_TRANSPORTS=tcp $loomrun $loom_command"
  local_job "loom.$round" env LOOM_TRANSPORTS=tcp $loomrun $loom_command
  [ -x "$gloo" ] || continue
  echo "## round $round, the same with Gloo (TCP over loopback): $loomrun $gloo_command"
  local_job "gloo.$round" $loomrun $gloo_command
done
if [ -x "$gloo" ]; then
  echo "## loom (tcp) / Gloo busbw, $rounds rounds"
  rounds_summary gloo loom Gloo loom
fi

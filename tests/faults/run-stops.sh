#!/usr/bin/env bash
# The stop campaigns whose figures docs/RELIABILITY.md reports: on each transport alone, TRIALS trials in which a
# random rank of 2 to 8 is stopped with SIGSTOP inside random collectives (2 s deadline), then killed, resumed once
# the survivors ended, or resumed after a pause shorter than the deadline (fault_inject.cc). tools/test --full runs
# them; CI runs the short form (meson test faults_stop). About 12 minutes per transport on 2 cores.
#
#   tests/faults/run-stops.sh [BUILD_DIR] [TRIALS] [TRANSPORT...]   (defaults: build, 200, ib shm tcp ucx)
#
# Each campaign's lines go to BUILD_DIR/fault_stops_<transport>.txt; the last lines of each are printed. Exit status
# 0 when every campaign held (a transport this build or machine lacks is reported and skipped).
set -uo pipefail
build=${1:-build}
trials=${2:-200}
shift $(($# < 2 ? $# : 2))
transports=("$@")
[ ${#transports[@]} -gt 0 ] || transports=(ib shm tcp ucx)
declare -A seeds=([ib]=99 [shm]=77 [tcp]=78 [ucx]=79)
status=0
for transport in "${transports[@]}"; do
  out="$build/fault_stops_$transport.txt"
  seed=${seeds[$transport]:-1}
  "$build/tests/fault_inject" --transports "$transport" --trials "$trials" --seed "$seed" --timeout-ms 2000 \
    --stop-every 1 >"$out" 2>&1
  code=$?
  if [ $code -eq 2 ] && grep -q "is not available" "$out"; then
    echo "run-stops: $transport: $(head -n 1 "$out")"
    continue
  fi
  echo "run-stops: $transport, seed $seed, $trials trials (exit $code):"
  grep -v ": ok$" "$out" | grep -v "^    " | sed 's/^/  /'
  [ $code -eq 0 ] || status=1
done
exit $status

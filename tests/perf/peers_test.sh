#!/usr/bin/env bash
# The peer perf programs as a test: mpi_perf (under mpirun, Open MPI's defaults) and gloo_perf (under loomrun)
# run every collective at 2 and 3 ranks on sizes up to 256 KiB with checking on, and must exit 0 with
# "# Out of bounds values : 0 OK"; then tools/compare-peers --quick runs once over the built programs (2 ranks,
# with its latency rounds), which fails on any wrong element or failed run; and ep_perf under mpirun (its MPI
# dispatches). Skipped (77) when neither peer was built.
# Sizes stop at 256 KiB because Gloo's ReduceScatter returns wrong values from 512 KiB up at 2 ranks on a busy
# machine (a race inside Gloo, perf/README.md): that is Gloo's bug to report, not this test's to flake on.
# Usage: peers_test.sh BUILD_ROOT SOURCE_ROOT
set -uo pipefail
build=$1
source=$2
loomrun=$build/tools/loomrun
mpi_perf=$build/perf/peers/mpi_perf
gloo_perf=$build/perf/peers/gloo_perf
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

launchers=()
[ -x "$mpi_perf" ] && command -v mpirun >/dev/null && launchers+=(mpi)
[ -x "$gloo_perf" ] && launchers+=(gloo)
if [ ${#launchers[@]} -eq 0 ]; then
  echo "SKIP: neither mpi_perf (MPI) nor gloo_perf (libgloo-dev) is built"
  exit 77
fi

failures=0
# Runs one program; it must exit 0 and report no wrong element. The output is shown only on failure.
check() {
  local output status
  output=$("$@" 2>&1)
  status=$?
  if [ $status -ne 0 ] || ! grep -q "^# Out of bounds values : 0 OK" <<<"$output"; then
    echo "FAILED (exit $status): $*"
    echo "$output"
    failures=$((failures + 1))
  else
    echo "ok: $*"
  fi
}

flags=(-b 8 -e 256K -f 8 -n 2 -w 1 -c 1 -d float -o sum)
for nranks in 2 3; do
  for collective in all_reduce reduce_scatter all_gather broadcast alltoall; do
    for launcher in "${launchers[@]}"; do
      if [ "$launcher" = mpi ]; then
        check timeout 300 mpirun -n "$nranks" --oversubscribe --allow-run-as-root --bind-to none \
          "$mpi_perf" -C "$collective" "${flags[@]}"
      else
        check "$loomrun" -n "$nranks" --timeout 300 "$gloo_perf" -C "$collective" "${flags[@]}"
      fi
    done
  done
done

# ep_perf under mpirun sets the two MPI dispatches beside loom's; it exits 0 only if no combine was wrong.
if [[ " ${launchers[*]} " == *" mpi "* ]] && [ -x "$build/perf/ep_perf" ]; then
  output=$(timeout 300 mpirun -n 2 --oversubscribe --allow-run-as-root --bind-to none "$build/perf/ep_perf" \
    --tokens 16 --hidden 200 --topk 3 --experts 12 -n 3 -w 1 --copy-mib 8 2>&1)
  if [ $? -eq 0 ] && grep -q "^  MPI per expert dispatch" <<<"$output" && grep -q "^  MPI per rank" <<<"$output"; then
    echo "ok: mpirun -n 2 ep_perf"
  else
    echo "FAILED: mpirun -n 2 ep_perf"
    echo "$output"
    failures=$((failures + 1))
  fi
fi

outdir=$(mktemp -d)
trap 'rm -rf "$outdir"' EXIT
if "$source/tools/compare-peers" --quick -e 256K --no-build -B "$build" -o "$outdir" >"$outdir/stdout" 2>&1 &&
  [ -s "$outdir/compare-peers.md" ] && grep -q "^AllReduce, float sum, 2 ranks" "$outdir/stdout" &&
  grep -q "^8-byte AllReduce latency, 2 rounds of 2000 calls" "$outdir/stdout"; then
  echo "ok: tools/compare-peers --quick"
else
  echo "FAILED: tools/compare-peers --quick -e 256K --no-build -B $build -o $outdir"
  cat "$outdir/stdout"
  failures=$((failures + 1))
fi

echo "$failures failure(s)"
[ $failures -eq 0 ]

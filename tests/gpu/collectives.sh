#!/usr/bin/env bash
# The collective matrix on CUDA communicators: 2, 4 and 8 ranks (processes under loomrun) sharing the machine's
# GPUs (local rank r on device r modulo their number: all on one GPU where there is one), every collective, type
# and op at small counts, float and int32 at a big one, on device buffers and a stream, once with each of the two
# stream gates (LOOM_CUDA_GATE). Exits 77 (skipped) without a device.
#   tests/gpu/collectives.sh BUILD_DIR [RANKS...]        (default ranks: 2 4 8)
# Each run is stopped after CUDA_MATRIX_TIMEOUT seconds (default 600).
set -uo pipefail
build=$1
shift
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(2 4 8)
status=0
for gate in memop kernel; do
  for n in "${ranks[@]}"; do
    start=$SECONDS
    LOOM_CUDA_GATE=$gate timeout "${CUDA_MATRIX_TIMEOUT:-600}" "$build/tools/loomrun" -n "$n" \
      "$build/tests/mp_collective_check" 0,1,7,1000 262147 cuda
    rc=$?
    [ $rc -eq 77 ] && exit 77
    echo "cuda collectives: $n ranks, gate $gate: $([ $rc -eq 0 ] && echo passed || echo "FAILED ($rc)")" \
      "in $((SECONDS - start)) s"
    [ $rc -eq 0 ] || status=1
  done
done
exit $status

#!/usr/bin/env bash
# The collective matrix on CUDA communicators: 2, 4 and 8 ranks (processes under loomrun) sharing the machine's
# GPUs (local rank r on device r modulo their number: all on one GPU where there is one), every collective, type
# and op at small counts, float and int32 at a big one, on device buffers and a stream. The staged path runs once
# with each of the two stream gates (LOOM_CUDA_GATE); the GPU executor (LOOM_CUDA_PATH=device) once. Exits 77
# (skipped) without a device.
#   tests/gpu/collectives.sh BUILD_DIR [RANKS...]        (default ranks: 2 4 8)
# CUDA_PATHS (default "staged device") picks the paths. Each run is stopped after CUDA_MATRIX_TIMEOUT seconds
# (default 600). Processes sharing one GPU without MPS take turns on it, so the GPU executor's kernels, which wait
# for their peers' kernels, move slowly there; ranks as threads of one process (tests/gpu/kernels_test.cc, perf -t)
# run side by side.
set -uo pipefail
build=$1
shift
ranks=("$@")
[ ${#ranks[@]} -gt 0 ] || ranks=(2 4 8)
runs=()
for path in ${CUDA_PATHS:-staged device}; do
  case $path in
    staged) runs+=(staged:memop staged:kernel) ;;
    device) runs+=(device:auto) ;;
    *) echo "collectives.sh: CUDA_PATHS: unknown path $path (staged, device)"; exit 2 ;;
  esac
done
status=0
for run in "${runs[@]}"; do
  path=${run%%:*}
  gate=${run#*:}
  for n in "${ranks[@]}"; do
    start=$SECONDS
    LOOM_CUDA_PATH=$path LOOM_CUDA_GATE=$gate timeout "${CUDA_MATRIX_TIMEOUT:-600}" "$build/tools/loomrun" -n "$n" \
      "$build/tests/mp_collective_check" 0,1,7,1000 262147 cuda
    rc=$?
    [ $rc -eq 77 ] && exit 77
    echo "cuda collectives: $n ranks, $path path, gate $gate: $([ $rc -eq 0 ] && echo passed || echo "FAILED ($rc)")" \
      "in $((SECONDS - start)) s"
    [ $rc -eq 0 ] || status=1
  done
done
exit $status

#!/usr/bin/env bash
# The checks that need a GPU, in one run, for a machine that has one:
#
#   tests/gpu/run-on-gpu.sh [BUILD_DIR]        (default build-gpu)
#
# 1. builds with CUDA required (-Dcuda=enabled) and warnings as errors;
# 2. runs the unit suite and the gpu suite (the CUDA kernels against the host kernels);
# 3. measures the CUDA kernels beside cudaMemcpy (tests/bench/cuda_kernels_perf, 1 GiB buffers);
# 4. prints a short summary table last.
# The collective matrix on 2, 4 and 8 ranks of one GPU and the perf programs with CUDA buffers join it with the
# CUDA executor and transport (docs/DESIGN.md). Sized to finish well within 8 minutes on one H200.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-gpu}
missing=""
for tool in meson ninja nvcc nvidia-smi; do
  command -v "$tool" >/dev/null || [ -x "/usr/local/cuda/bin/$tool" ] || missing+=" $tool"
done
if [ -n "$missing" ]; then
  echo "run-on-gpu: not found:$missing (tools/install-deps installs the build's packages; the GPU driver and CUDA"
  echo "toolkit come with the machine)"
  exit 1
fi
export PATH=$PATH:/usr/local/cuda/bin
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
summary=()
failed=0
step() {  # step NAME COMMAND...: runs it, keeps "NAME: ok/failed (seconds)" for the summary
  local name=$1 start=$SECONDS status=0
  shift
  echo "## $name: $*"
  "$@" || status=$?
  [ $status -eq 0 ] || failed=1
  summary+=("$(printf '%-34s %-8s %4d s' "$name" "$([ $status -eq 0 ] && echo ok || echo "failed($status)")" \
    $((SECONDS - start)))")
  return $status
}
if [ -f "$build/build.ninja" ]; then
  step "configure" meson configure "$build" -Dcuda=enabled -Dwerror=true -Dtests=true
else
  step "configure" meson setup "$build" -Dcuda=enabled -Dwerror=true -Dtests=true
fi
step "build" ninja -C "$build" || { printf '%s\n' "${summary[@]}"; exit 1; }
step "unit and gpu tests" meson test -C "$build" --suite unit --suite gpu --print-errorlogs
step "kernel bandwidth (1 GiB)" "$build/tests/cuda_kernels_perf" 1G 20 >"$build/cuda_kernels_perf.txt"
cat "$build/cuda_kernels_perf.txt"
echo "## summary"
printf '%s\n' "${summary[@]}"
grep -E "^# |^  " "$build/cuda_kernels_perf.txt" 2>/dev/null
python3 - "$build/meson-logs/testlog.json" <<'PY' 2>/dev/null || true
import json, sys
counts = {}
for line in open(sys.argv[1]):
    result = json.loads(line)["result"]
    counts[result] = counts.get(result, 0) + 1
print("  tests: " + ", ".join(f"{n} {r.lower()}" for r, n in sorted(counts.items())))
PY
exit $failed

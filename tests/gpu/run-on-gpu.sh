#!/usr/bin/env bash
# The checks that need a GPU, in one run, for a machine that has one:
#
#   tests/gpu/run-on-gpu.sh [BUILD_DIR]        (default build-gpu)
#
# 1. builds with CUDA required (-Dcuda=enabled);
# 2. runs the CUDA kernels' tests: their shared arithmetic on the host, the kernels against the host kernels, and
#    the parallel layer's CUDA kernels against their CPU references;
# 3. runs the collective matrix on CUDA communicators with 2, 4 and 8 ranks on the machine's GPUs (all on one
#    where there is one), staged with each stream gate, and on the GPU executor with 2 ranks
#    (tests/gpu/collectives.sh);
# 4. measures the CUDA kernels beside cudaMemcpy, and the pinned host copies (tests/bench/cuda_kernels_perf);
# 5. runs all_reduce_perf, all_gather_perf and alltoall_perf with CUDA buffers at 2 and 8 ranks, each beside the
#    same run on host buffers, and all_reduce_perf on the GPU executor with 2 and 8 ranks as threads of one process
#    (whose kernels share the GPU at once, as processes' do not) up to 1 GiB;
# 6. trains the reference GPT on the GPU: the parallel layer's training tests (bf16 accounting, one rank against the
#    CPU, 2 ranks sharing the GPU against one), then loom-train with gpt2-124m in bf16 on 1 and 2 ranks (DDP) and 2
#    ranks (ZeRO-3), for tokens/s and the memory header;
# 7. runs loom's libnccl.so.2 on CUDA communicators: the NCCL API test (tests/nccl) on device buffers, then
#    PyTorch's ProcessGroupNCCL with the library preloaded, at 2 and 4 ranks sharing the GPU (tests/gpu/torch_nccl.py;
#    skipped where python3 has no torch 2.x with CUDA); and loom_torch on CUDA tensors (the same checks, 2 ranks);
# 8. prints a short summary table last.
# Warnings are errors in CI, which compiles the same code; here a newer compiler's new warning must not cost the
# run. Sized to finish within 10 minutes on one H200. Writes its logs to BUILD_DIR/gpu-run/.
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
step() {  # step NAME COMMAND...: runs it, keeps "NAME: ok/skipped/failed (seconds)" for the summary (77: skipped)
  local name=$1 start=$SECONDS status=0 word=ok
  shift
  echo "## $name: $*"
  "$@" || status=$?
  if [ $status -eq 77 ]; then
    word=skipped
  elif [ $status -ne 0 ]; then
    word="failed($status)"
    failed=1
  fi
  summary+=("$(printf '%-34s %-8s %4d s' "$name" "$word" $((SECONDS - start)))")
  return $status
}
if [ -f "$build/build.ninja" ]; then
  step "configure" meson configure "$build" -Dcuda=enabled -Dtests=true
else
  step "configure" meson setup "$build" -Dcuda=enabled -Dtests=true
fi
step "build" ninja -C "$build" || { printf '%s\n' "${summary[@]}"; exit 1; }
logs=$build/gpu-run
mkdir -p "$logs"
# A stuck call fails in a minute with loom's message, rather than at the default deadline.
export LOOM_TIMEOUT_MS=${LOOM_TIMEOUT_MS:-60000} CUDA_MATRIX_TIMEOUT=${CUDA_MATRIX_TIMEOUT:-150}
step "CUDA kernel tests" meson test -C "$build" --print-errorlogs device_ops cuda_kernels parallel_cuda_kernels
CUDA_PATHS=staged step "collective matrix, staged, 2/4/8 ranks" bash tests/gpu/collectives.sh "$build" 2 4 8
CUDA_PATHS=device step "collective matrix, GPU executor, 2 ranks" bash tests/gpu/collectives.sh "$build" 2
step "kernel bandwidth (1 GiB)" "$build/tests/cuda_kernels_perf" 1G 20 >"$logs/cuda_kernels_perf.txt"
cat "$logs/cuda_kernels_perf.txt"
perf_rows=()
for program in all_reduce_perf all_gather_perf alltoall_perf; do
  for n in 2 8; do
    for device in cuda host; do
      log=$logs/${program}_${n}_${device}.txt
      step "$program $n ranks $device" timeout 150 "$build/tools/loomrun" -n "$n" "$build/perf/$program" \
        -b 8 -e 128M -f 8 -w 2 -n 10 -D "$device" >"$log" 2>&1
      tail -n 25 "$log"
      # For the summary: size, time and busbw (out of place) of the 32 KiB, 2 MiB and 128 MiB rows.
      perf_rows+=("$(awk -v name="$program $n $device" '$1 ~ /^[0-9]+$/ && ($1 == 2097152 || $1 == 134217728 ||
        $1 == 32768) { cells = cells sprintf("  %9s B %9s us %7s GB/s", $1, $6, $8) } END { print name ":" cells }' \
        "$log")")
    done
  done
done
for n in 2 8; do
  log=$logs/all_reduce_perf_${n}_device.txt
  LOOM_CUDA_PATH=device step "all_reduce_perf -t $n GPU executor" timeout 150 "$build/perf/all_reduce_perf" -t "$n" \
    -b 8 -e 1G -f 8 -w 2 -n 10 -D cuda >"$log" 2>&1
  tail -n 25 "$log"
  perf_rows+=("$(awk -v name="all_reduce_perf -t $n device" '$1 ~ /^[0-9]+$/ && ($1 == 8 || $1 == 32768 ||
    $1 == 2097152 || $1 == 1073741824) { cells = cells sprintf("  %10s B %9s us %7s GB/s", $1, $6, $8) }
    END { print name ":" cells }' "$log")")
done
step "parallel training tests" meson test -C "$build" --print-errorlogs parallel_cuda_train
for layout in "1 0" "2 0" "2 3"; do
  read -r n zero <<<"$layout"
  log=$logs/loom_train_${n}_zero${zero}.txt
  step "loom-train gpt2-124m bf16 $n ranks zero $zero" timeout 240 "$build/tools/loomrun" -n "$n" \
    "$build/tools/loom-train" --device cuda --model gpt2-124m --zero "$zero" --batch 4 --seq 1024 --steps 20 \
    --log-every 5 >"$log" 2>&1
  cat "$log"
  perf_rows+=("$(awk -v name="loom-train gpt2-124m bf16 n=$n zero=$zero" '/^# memory/ { memory = $0 }
    /^step/ { last = $0 } END { print name ": " last "\n    " memory }' "$log")")
done
step "NCCL API on CUDA communicators" meson test -C "$build" --print-errorlogs nccl_api_cuda nccl_symbols
step "torch ProcessGroupNCCL on loom's libnccl" timeout 560 python3 tests/gpu/torch_nccl.py \
  "$build/plugins/nccl/libnccl.so.2" >"$logs/torch_nccl.txt" 2>&1
cat "$logs/torch_nccl.txt"
# loom_torch itself on CUDA tensors (staged through host memory), on the torch 2.x it was built for.
torch2_python=/opt/loom-torch2/bin/python
[ -x "$torch2_python" ] || torch2_python=python3
PYTHONPATH="$build/plugins/torch/torch2${PYTHONPATH:+:$PYTHONPATH}" LD_LIBRARY_PATH="$build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  step "loom_torch on CUDA tensors" timeout 300 "$torch2_python" tests/gpu/torch_nccl.py --loom-cuda --ranks 2 \
  "$build/plugins/nccl/libnccl.so.2" >"$logs/torch_loom_cuda.txt" 2>&1
cat "$logs/torch_loom_cuda.txt"
echo "## summary"
printf '%s\n' "${summary[@]}"
grep -E "^# |^  " "$logs/cuda_kernels_perf.txt" 2>/dev/null
printf '%s\n' "${perf_rows[@]}"
python3 - "$build/meson-logs/testlog.json" <<'PY' 2>/dev/null || true
import json, sys
counts = {}
for line in open(sys.argv[1]):
    result = json.loads(line)["result"]
    counts[result] = counts.get(result, 0) + 1
print("  tests: " + ", ".join(f"{n} {r.lower()}" for r, n in sorted(counts.items())))
PY
exit $failed

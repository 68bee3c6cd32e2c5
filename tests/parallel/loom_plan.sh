#!/usr/bin/env bash
# loom-plan end to end: a given layout prints the accounting tests/parallel/plan_test.cc checks (here through the
# tool's tables), --recommend applies the prescription on a 512-GPU fat tree and times its candidates with the
# simulator, and bad input is refused with a message naming the problem.
#   tests/parallel/loom_plan.sh BUILD_DIR
set -uo pipefail
plan=$1/tools/loom-plan
status=0
expect() {  # expect NAME PATTERN OUTPUT
  if grep -qE -- "$2" <<<"$3"; then
    echo "ok: $1"
  else
    echo "FAILED: $1: no line matching /$2/ in:"
    echo "$3"
    status=1
  fi
}
out=$("$plan" --model gpt2-124m --tp 4 --sp --pp 2 --dp 4 --zero 1 --batch 64 --recompute selective --topo fattree:4)
expect "parameter count" "parameters: 124439808 " "$out"
expect "selective activations per layer (6,684,672 bytes)" "tensor \+ sequence \+ selective +6\.7 MB" "$out"
expect "activations without parallelism (89,653,248 bytes)" "no tensor parallelism +89\.7 MB" "$out"
expect "1F1B bubble (p-1)/m = 1/16" "1f1b 6\.2%" "$out"
expect "a predicted step" "^predicted step: [0-9.]+ s" "$out"
out=$("$plan" --model gpt3-175b --topo fattree:64 --batch 1536 --recommend)
expect "recommend: a layout within a node's 8 GPUs of tensor parallelism" "^## layout: tp=[1248] sp pp=[0-9]+ dp=" "$out"
expect "recommend: memory within 80 GB" "^per GPU: .* = [0-9.]+ GB \(of 80 GB: fits\)" "$out"
out=$("$plan" --model gpt2-124m --tp 5 --batch 5 --topo fattree:1 2>&1)
code=$?
expect "tp 5 is refused" "does not divide the 12 heads" "$out"
[ "$code" -ne 0 ] || { echo "FAILED: tp 5 exited 0"; status=1; }
out=$("$plan" --model nope 2>&1)
code=$?
expect "an unknown model is refused" "--model nope: not a preset" "$out"
[ "$code" -eq 2 ] || { echo "FAILED: an unknown model exited $code, not 2"; status=1; }
out=$("$plan" --model gpt2-124m --dp 64 --topo fattree:1 2>&1)
expect "a layout larger than the cluster is refused" "needs 64 GPUs; --topo fattree:1 has 8" "$out"
exit $status

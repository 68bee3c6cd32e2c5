#!/usr/bin/env bash
# loom-train --deterministic: DDP and ZeRO-1/2/3 at 2 and 4 ranks end with checkpoints identical byte for byte
# (parameters and AdamW moments) whatever loom's choice of AllReduce and ReduceScatter algorithm, channels and
# protocol. The control: without --deterministic, the ring and the double binary tree end 4 ranks of DDP with
# different parameters (at 2 ranks every sum is a + b, the same bits under any algorithm).
#   tests/parallel/loom_train_deterministic.sh BUILD_DIR
set -euo pipefail
build=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--model gpt-tiny --seq 16 --batch 2 --accumulation 2 --lr 3e-3 --steps 6 --log-every 100)
status=0
train() {  # train RANKS ZERO OUT [ENV...] [-- ARGS...]
  local ranks=$1 zero=$2 out=$3
  shift 3
  local env=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do env+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  env "${env[@]}" "$build/tools/loomrun" -n "$ranks" "$build/tools/loom-train" "${common[@]}" --zero "$zero" \
    --save "$out" "$@" >/dev/null
}
# The choices --deterministic must not show through: the tuner's pick, each rank-order algorithm forced, and rules
# that allow the ring as well; one channel and four; the tuner's protocol, LL and Simple.
choices=("LOOM_NCHANNELS=1"
  "LOOM_ALGO=allreduce:direct;reducescatter:direct LOOM_NCHANNELS=4 LOOM_PROTO=LL"
  "LOOM_ALGO=allreduce:twoshot LOOM_PROTO=Simple"
  "LOOM_ALGO=allreduce:ring,twoshot;reducescatter:ring,direct LOOM_NCHANNELS=4")
for ranks in 2 4; do
  for zero in 0 1 2 3; do
    first=""
    for i in "${!choices[@]}"; do
      # shellcheck disable=SC2086
      train "$ranks" "$zero" "$dir/run$i.ckpt" ${choices[$i]} -- --deterministic
      if [ -z "$first" ]; then
        first="$dir/run$i.ckpt"
      elif ! cmp -s "$first" "$dir/run$i.ckpt"; then
        echo "--deterministic, $ranks ranks, --zero $zero: the checkpoint under ${choices[$i]} DIFFERS from the one" \
          "under ${choices[0]}"
        status=1
      fi
    done
    echo "--deterministic, $ranks ranks, --zero $zero: ${#choices[@]} choices of algorithm, channels and protocol," \
      "$([ $status = 0 ] && echo "one checkpoint, byte for byte" || echo "NOT one checkpoint")"
  done
done
train 4 0 "$dir/ring.ckpt" "LOOM_ALGO=allreduce:ring"
train 4 0 "$dir/tree.ckpt" "LOOM_ALGO=allreduce:tree"
if cmp -s "$dir/ring.ckpt" "$dir/tree.ckpt"; then
  echo "control: without --deterministic the ring and the tree gave the same checkpoint: the test cannot tell"
  status=1
else
  echo "control: without --deterministic the ring's and the tree's checkpoints differ, as expected"
fi
# Bad input: rules that leave AllReduce no rank-order algorithm are refused at init, naming them (at 4 ranks: at
# 2 every algorithm sums in rank order).
if out=$(train 4 0 "$dir/refused.ckpt" "LOOM_ALGO=allreduce:ring" -- --deterministic 2>&1); then
  echo "--deterministic with LOOM_ALGO=allreduce:ring trained instead of refusing"
  status=1
elif ! grep -q "no algorithm that reduces in rank order" <<<"$out"; then
  echo "--deterministic with LOOM_ALGO=allreduce:ring failed without naming why:"
  echo "$out" | tail -3
  status=1
fi
exit $status

#!/usr/bin/env bash
# loom-train's --save and --resume: a run stopped after 3 steps and resumed from its checkpoint must print, for
# steps 4 to 6, bit for bit the losses of a run that never stopped. For one rank with DDP, and two ranks (processes
# under loomrun) with DDP and with ZeRO-2 and ZeRO-3, whose checkpoints gather the sharded parameters and moments.
#   tests/parallel/loom_train_resume.sh BUILD_DIR
set -euo pipefail
build=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--model gpt-tiny --seq 16 --batch 2 --lr 3e-3 --log-every 100)
status=0
for config in "1 0" "2 0" "2 2" "2 3"; do
  read -r ranks zero <<<"$config"
  train() {
    "$build/tools/loomrun" -n "$ranks" "$build/tools/loom-train" "${common[@]}" --zero "$zero" "$@" >/dev/null
  }
  train --steps 6 --metrics "$dir/full.csv"
  train --steps 3 --save "$dir/checkpoint"
  train --steps 6 --resume "$dir/checkpoint" --metrics "$dir/resumed.csv"
  # step,loss of steps 4 to 6 from both
  want=$(awk -F, 'NR > 1 && $1 >= 4 { print $1 "," $2 }' "$dir/full.csv")
  got=$(awk -F, 'NR > 1 { print $1 "," $2 }' "$dir/resumed.csv")
  if [ "$want" = "$got" ] && [ -n "$got" ]; then
    echo "resume: $ranks rank(s), zero $zero: steps 4-6 identical"
  else
    echo "resume: $ranks rank(s), zero $zero: DIFFERENT"
    echo "uninterrupted:"; echo "$want"
    echo "resumed:"; echo "$got"
    status=1
  fi
done
exit $status

#!/usr/bin/env bash
# loom-train's --save and --resume: a run stopped after 3 steps and resumed from its checkpoint must print, for
# steps 4 to 6, bit for bit the losses of a run that never stopped. For one rank with DDP, and two ranks (processes
# under loomrun) with DDP and with ZeRO-2 and ZeRO-3, whose checkpoints gather the sharded parameters and moments,
# and with tensor (and sequence) parallelism over 2 ranks, whose checkpoints assemble the ranks' parts; a tensor-
# parallel run's checkpoint also resumes as a one-rank run, to the same losses within fp32 relative error 1e-5 (the
# two layouts sum in different orders). The same with pipeline parallelism (2 stages; and 2 stages of 2 tensor-
# parallel ranks under ZeRO-1, resumed on one rank), and moe-tiny with its experts over 2 expert-parallel ranks,
# alone and on 2 pipeline stages. Then the layouts loom-train must refuse, each with its reason.
# Every run takes its steps in 2 micro-batches (the pipeline's).
#   tests/parallel/loom_train_resume.sh BUILD_DIR
set -euo pipefail
build=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--model gpt-tiny --seq 16 --batch 2 --accumulation 2 --lr 3e-3 --log-every 100)
status=0
for config in "1 0" "2 0" "2 2" "2 3" "2 0 --tp 2 --sp" "2 0 --tp 2 =1" "2 0 --pp 2 --pp-schedule zb-h1" \
  "4 1 --tp 2 --pp 2 =1" "2 0 --model moe-tiny --ep 2" "4 0 --model moe-tiny --ep 2 --pp 2"; do
  read -r ranks zero layout <<<"$config"
  resumeRanks=$ranks
  if [[ $layout == *=1 ]]; then  # resume on one rank without tensor parallelism
    layout=${layout% =1}
    resumeRanks=1
  fi
  run() {  # run RANKS LAYOUT ARGS...
    local n=$1 parallel=$2
    shift 2
    # shellcheck disable=SC2086
    "$build/tools/loomrun" -n "$n" "$build/tools/loom-train" "${common[@]}" --zero "$zero" $parallel "$@" >/dev/null
  }
  run "$ranks" "$layout" --steps 6 --metrics "$dir/full.csv"
  run "$ranks" "$layout" --steps 3 --save "$dir/checkpoint"
  if [ "$resumeRanks" = 1 ] && [ "$ranks" != 1 ]; then
    run 1 "" --steps 6 --resume "$dir/checkpoint" --metrics "$dir/resumed.csv"
    config="$config (resumed on 1 rank)"
  else
    run "$ranks" "$layout" --steps 6 --resume "$dir/checkpoint" --metrics "$dir/resumed.csv"
  fi
  # step,loss of steps 4 to 6 from both
  want=$(awk -F, 'NR > 1 && $1 >= 4 { print $1 "," $2 }' "$dir/full.csv")
  got=$(awk -F, 'NR > 1 { print $1 "," $2 }' "$dir/resumed.csv")
  same=no
  if [ "$resumeRanks" = "$ranks" ]; then
    [ "$want" = "$got" ] && [ -n "$got" ] && same=yes
  else
    close=$(paste -d, <(echo "$want") <(echo "$got") | awk -F, 'NF == 4 && $1 == $3 {
      d = $2 - $4; if (d < 0) d = -d; if (d <= 1e-5 * ($2 < 0 ? -$2 : $2)) n++ } END { print n + 0 }')
    [ "$close" = 3 ] && same=yes
  fi
  if [ $same = yes ]; then
    echo "resume: $config: steps 4-6 $([ "$resumeRanks" = "$ranks" ] && echo identical || echo "within 1e-5")"
  else
    echo "resume: $config: DIFFERENT"
    echo "uninterrupted:"; echo "$want"
    echo "resumed:"; echo "$got"
    status=1
  fi
done
refuse() {  # refuse RANKS REASON ARGS...: loom-train exits with status 2 and names the reason
  local n=$1 reason=$2
  shift 2
  local out code=0
  out=$("$build/tools/loomrun" -n "$n" "$build/tools/loom-train" "${common[@]}" --steps 1 "$@" 2>&1) || code=$?
  if [ $code -ne 0 ] && grep -q -- "$reason" <<<"$out"; then
    echo "refused: $*: $reason"
  else
    echo "NOT REFUSED as expected ($reason): $* (status $code)"; echo "$out" | tail -3
    status=1
  fi
}
refuse 2 "with --pp use --zero 0 or 1" --pp 2 --zero 2
refuse 2 "2 layers do not split into 2 x 2 virtual stages" --pp 2 --pp-schedule interleaved
refuse 1 "does not lay out the job's 1 ranks" --pp 2
refuse 2 "not a multiple of 2" --layers 4 --pp 2 --pp-schedule interleaved --accumulation 3
refuse 2 "train with DDP" --model moe-tiny --ep 2 --zero 1
refuse 2 "are for a mixture of experts" --ep 2
refuse 2 "do not combine with tensor parallelism" --model moe-tiny --tp 2
refuse 2 "with --ep 2 within data parallelism" --model moe-tiny --ep 2 --pp 2
exit $status

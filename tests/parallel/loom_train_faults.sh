#!/usr/bin/env bash
# loom-train and failures.
# 1. A rank killed with SIGKILL in the middle of a 2-rank run that saves a checkpoint every 10 steps: the job ends
#    (loomrun stops the other rank) within 30 s, and a new run resumes from the last checkpoint to losses bit for
#    bit those of a run that never failed.
# 2. The writer of the checkpoint killed with SIGKILL at random moments of a run saving one every step (writes go
#    to FILE.tmp, then fsync, rename and an fsync of the directory): after every kill the checkpoint loads, whether
#    or not the kill landed inside a save (counted: a FILE.tmp left behind).
#   tests/parallel/loom_train_faults.sh BUILD_DIR
set -euo pipefail
build=$1
dir=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
train=("$build/tools/loom-train" --model gpt-tiny --seq 16 --batch 2 --accumulation 2 --lr 3e-3 --log-every 1000)
status=0
steps=400

# Waits up to $2 seconds for process $1 to end; its exit status in $ended (124: still running, then killed).
waitFor() {
  local pid=$1 limit=$2 start=$SECONDS
  while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - start)) -lt "$limit" ]; do sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    ended=124
  else
    ended=0
    wait "$pid" || ended=$?
  fi
}

# 1. A rank lost mid-run, then a resume.
"$build/tools/loomrun" -n 2 "${train[@]}" --steps $steps --metrics "$dir/full.csv" >/dev/null
"$build/tools/loomrun" -n 2 "${train[@]}" --steps $steps --save "$dir/job.ckpt" --save-every 10 >"$dir/failed.log" 2>&1 &
job=$!
for _ in $(seq 1 600); do [ -f "$dir/job.ckpt" ] && break; sleep 0.05; done
sleep 0.3
victim=$(pgrep -n -f "loom-train.*$dir/job.ckpt" || true)
if [ -z "$victim" ]; then
  echo "rank failure: no rank of the job to kill (it ended early?)"; cat "$dir/failed.log"; exit 1
fi
kill -9 "$victim"
waitFor "$job" 30
if [ "$ended" = 0 ] || [ "$ended" = 124 ]; then
  echo "rank failure: the job $([ "$ended" = 0 ] && echo "finished anyway" || echo "did not end within 30 s")"
  status=1
fi
"$build/tools/loomrun" -n 2 "${train[@]}" --steps $steps --resume "$dir/job.ckpt" --metrics "$dir/resumed.csv" \
  >"$dir/resumed.log"
first=$(awk -F, 'NR == 2 { print $1 }' "$dir/resumed.csv")
want=$(awk -F, -v from="$first" 'NR > 1 && $1 >= from { print $1 "," $2 }' "$dir/full.csv")
got=$(awk -F, 'NR > 1 { print $1 "," $2 }' "$dir/resumed.csv")
if [ -n "$got" ] && [ "$want" = "$got" ]; then
  echo "rank failure: the job ended (status $ended); resumed at step $first, steps $first-$steps identical to a run" \
    "that never failed"
else
  echo "rank failure: the resumed losses DIFFER from a run that never failed (resumed at step $first)"
  status=1
fi

# 2. The writer killed at random moments; the checkpoint must load every time.
inside=0
for trial in 1 2 3 4 5 6; do
  "${train[@]}" --steps 100000 --save "$dir/save.ckpt" --save-every 1 >/dev/null 2>&1 &
  writer=$!
  for _ in $(seq 1 600); do [ -f "$dir/save.ckpt" ] && break; sleep 0.05; done
  sleep "0.$((RANDOM % 9 + 1))"
  kill -9 "$writer"
  wait "$writer" 2>/dev/null || true
  [ -f "$dir/save.ckpt.tmp" ] && inside=$((inside + 1))
  # Loading it: loom-train refuses a --steps the checkpoint is already past and says its step; one step more must
  # then resume and train.
  out=$("${train[@]}" --steps 1 --resume "$dir/save.ckpt" 2>&1 || true)
  at=$(sed -n 's/.* is at step \([0-9]*\),.*/\1/p' <<<"$out")
  if [ -z "$at" ] || ! out=$("${train[@]}" --steps $((at + 1)) --resume "$dir/save.ckpt" 2>&1); then
    echo "save killed (trial $trial): the checkpoint does NOT load:"; echo "$out" | tail -3
    status=1
  fi
  rm -f "$dir/save.ckpt" "$dir/save.ckpt.tmp"
done
echo "save killed 6 times ($inside inside a save, a .tmp left behind): the checkpoint loaded every time"
exit $status

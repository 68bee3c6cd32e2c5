#!/usr/bin/env bash
# Compares two builds of loom, or one build under two settings, on all_reduce_perf (or another perf program) over
# shared memory, alternating the sides round by round so that the machine's drift from one minute to the next
# falls on both alike, and prints each side's median time per size and rank count with the ratio new / old
# (below 1: the new side is faster). Out-of-place times.
#
#   perf/compare_builds.sh OLD_BUILD NEW_BUILD [--rounds N] [--ranks "2 4"] [--sizes "8 1M 64M 256M"] [--pin]
#                            [--iters-factor F] [--program NAME] [--old-env "VAR=VALUE ..."]
#                            [--new-env "VAR=VALUE ..."]
#
# --program: any perf program of the build (reduce_scatter_perf, ...; all_reduce_perf by default). --old-env and
# --new-env: settings for one side's ranks, e.g. the cost of deterministic reductions on one build:
#   perf/compare_builds.sh build build --new-env LOOM_DETERMINISTIC=1 --sizes "64K 1M 64M 256M"
#
# --pin binds rank r to CPU r mod (the CPUs this script may use), with taskset: where ranks outnumber cores, or
# other work shares them, the scheduler's placement of the ranks otherwise moves single runs by 2x and more.
# Passing OLD_BUILD twice measures that noise floor (an A/A comparison). --iters-factor F runs F times the
# iterations below per run, so that one preemption weighs less in each run's mean.
#
# Each build directory must hold tools/loomrun and perf/all_reduce_perf. Every call's data is checked (-c 1), so
# a build that computes a wrong sum fails the comparison. Iterations: 2000 below 64 KiB, 20 below 64 MiB, 5 above.
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
old=$1 new=$2
shift 2
rounds=3 ranks="2 4" sizes="8 1M 64M 256M" pin=0 factor=1 program=all_reduce_perf oldEnv="" newEnv=""
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --pin) pin=1; shift ;;
    --iters-factor) factor=$2; shift 2 ;;
    --program) program=$2; shift 2 ;;
    --old-env) oldEnv=$2; shift 2 ;;
    --new-env) newEnv=$2; shift 2 ;;
    *) echo "compare_builds: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
for build in "$old" "$new"; do
  for needed in tools/loomrun "perf/$program"; do
    [ -x "$build/$needed" ] || { echo "compare_builds: $build/$needed is missing (build it first)" >&2; exit 2; }
  done
done
case $rounds in '' | *[!0-9]* | 0) echo "compare_builds: --rounds must be a positive integer" >&2; exit 2 ;; esac
case $factor in '' | *[!0-9]* | 0) echo "compare_builds: --iters-factor must be a positive integer" >&2; exit 2 ;; esac
for setting in $oldEnv $newEnv; do
  [[ $setting == [A-Z]*=* ]] || { echo "compare_builds: '$setting' in --old-env/--new-env is not VAR=VALUE" >&2; exit 2; }
done
if ((pin)) && ! command -v taskset > /dev/null; then echo "compare_builds: --pin needs taskset (util-linux)" >&2; exit 2; fi
cpus=$(nproc)

bytesOf() {  # 1M -> 1048576
  local v=$1
  case $v in
    *K) echo $((${v%K} << 10)) ;;
    *M) echo $((${v%M} << 20)) ;;
    *G) echo $((${v%G} << 30)) ;;
    *) echo "$v" ;;
  esac
}
itersFor() {
  local b
  b=$(bytesOf "$1")
  if [ "$b" -lt 65536 ]; then echo $((2000 * factor)); elif [ "$b" -lt 67108864 ]; then echo $((20 * factor)); else echo $((5 * factor)); fi
}
# One run: the out-of-place time (us) of the program at SIZE on N ranks of BUILD, under the settings SETTINGS.
timeOf() {
  local build=$1 n=$2 size=$3 settings=$4 out pinned=()
  # loomrun gives each rank its LOOM_RANK; a pinned rank binds itself before it starts the program.
  ((pin)) && pinned=(bash -c 'exec taskset -c $((LOOM_RANK % $0)) "$@"' "$cpus")
  # shellcheck disable=SC2086
  out=$(env $settings "$build/tools/loomrun" -n "$n" "${pinned[@]}" "$build/perf/$program" -b "$size" -e "$size" \
    -n "$(itersFor "$size")" -w 2 -c 1 2>&1) || { echo "compare_builds: $build ($settings) failed at $size on $n ranks:" >&2; echo "$out" >&2; exit 1; }
  echo "$out" | awk -v want="$(bytesOf "$size")" '$1 == want && $9 == 0 { print $6; found = 1 } END { exit !found }' ||
    { echo "compare_builds: no checked result for $size in:" >&2; echo "$out" >&2; exit 1; }
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "# compare_builds: $program; old $old${oldEnv:+ ($oldEnv)}, new $new${newEnv:+ ($newEnv)}; $rounds rounds; $cpus CPUs$( ((pin)) && echo ', ranks pinned'); iterations x$factor; $(date -u '+%Y-%m-%d %H:%M UTC')"
printf '%-6s %-8s %14s %14s %8s   %s\n' ranks size "old (us)" "new (us)" new/old "rounds (old/new)"
for n in $ranks; do
  for size in $sizes; do
    olds=() news=() each=()
    for ((r = 0; r < rounds; ++r)); do
      # Alternate which side goes first, so that neither always runs on a warmer (or busier) machine.
      if ((r % 2 == 0)); then
        o=$(timeOf "$old" "$n" "$size" "$oldEnv") && w=$(timeOf "$new" "$n" "$size" "$newEnv")
      else
        w=$(timeOf "$new" "$n" "$size" "$newEnv") && o=$(timeOf "$old" "$n" "$size" "$oldEnv")
      fi
      olds+=("$o") news+=("$w") each+=("$(awk -v a="$w" -v b="$o" 'BEGIN { printf "%.3f", a / b }')")
    done
    mo=$(printf '%s\n' "${olds[@]}" | median) mn=$(printf '%s\n' "${news[@]}" | median)
    printf '%-6s %-8s %14s %14s %8s   %s\n' "$n" "$size" "$mo" "$mn" "$(awk -v a="$mn" -v b="$mo" 'BEGIN { printf "%.3f", a / b }')" \
      "${each[*]}"
  done
done

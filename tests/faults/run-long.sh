#!/usr/bin/env bash
# The long fault-injection run whose figures docs/RELIABILITY.md reports: 200 trials (SIGKILL, every fifth a
# SIGSTOP) over every transport available, 2 to 8 ranks, a 3 s deadline. Takes about ten minutes on 2 cores.
#
#   tests/faults/run-long.sh [BUILD_DIR] [TRIALS]      (defaults: build, 200)
#
# Writes the per-trial lines and the totals to BUILD_DIR/fault_inject_long.txt as well.
set -euo pipefail
build=${1:-build}
trials=${2:-200}
"$build/tests/fault_inject" --trials "$trials" --seed 2026 --timeout-ms 3000 | tee "$build/fault_inject_long.txt"

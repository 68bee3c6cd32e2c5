#!/usr/bin/env python3
"""loom-tune and loom-sim, one cost model: on the same preset, size and algorithm (the tuner's pick), with the
channels and chunk the tuner chooses, the simulator's time is within 10% of the tuner's. The cases are those where
the two models agree today (docs/SIMULATION.md, "loom-sim beside loom-tune", lists where they do not).

  tune_sim_agree_test.py BUILD_DIR
"""
import re
import subprocess
import sys

build = sys.argv[1]
tune, sim = build + "/tools/loom-tune", build + "/tools/loom-sim"
CASES = [  # preset, ranks, bytes
    ("dgx-h100", 8, 8), ("dgx-h100", 8, 2048), ("dgx-h100", 8, 32768), ("dgx-h100", 8, 134217728),
    ("dgx-h100", 8, 1073741824), ("fullmesh:8", 8, 2048), ("fullmesh:8", 8, 134217728), ("pcie-8gpu", 8, 128),
    ("torus2d:4x4", 16, 2048), ("torus2d:4x4", 16, 134217728), ("fattree:2", 16, 2048), ("fattree:4", 32, 8),
]
failed = 0
for preset, ranks, size in CASES:
    out = subprocess.run([tune, "-n", str(ranks), "--topo", preset, "-b", str(size), "-e", str(size)],
                         capture_output=True, text=True, timeout=300).stdout
    header = next(line for line in out.splitlines() if line.strip().startswith("bytes")).split()
    row = next(line for line in out.splitlines() if re.match(r"\s+%d\s" % size, line)).split()
    pick = row[-1].rstrip("*")
    tuned = float(row[header.index(pick)])
    out = subprocess.run([sim, "--topo", preset, "-b", str(size), "-e", str(size), "--algorithm", pick],
                         capture_output=True, text=True, timeout=300).stdout
    simulated = float(next(line for line in out.splitlines() if re.match(r"\s+\d+\s+\d+\s", line)).split()[6])
    ratio = simulated / tuned
    ok = 0.9 <= ratio <= 1.1
    failed += not ok
    print("%s: %s %d B, pick %s: loom-tune %.2f us, loom-sim %.2f us (%.2fx)" % (
        "ok" if ok else "FAILED", preset, size, pick, tuned, simulated, ratio))
sys.exit(1 if failed else 0)

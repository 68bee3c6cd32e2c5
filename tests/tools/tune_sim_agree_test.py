#!/usr/bin/env python3
"""loom-tune and loom-sim, one cost model. On every preset and size of docs/SIMULATION.md's table, for every
algorithm with the channels and chunk the tuner chooses for it, loom-sim's time is within 10% of loom-tune's
column wherever loom-sim timed the row with its exact engine (the tuner's event timer: no "(fast engine)" mark),
and the tuner's pick is always timed so. Beyond that (calls too large to take every slice as an event), the two
use different approximations; those cells are printed, not checked.

  tune_sim_agree_test.py BUILD_DIR
"""
import re
import subprocess
import sys

build = sys.argv[1]
tune, sim = build + "/tools/loom-tune", build + "/tools/loom-sim"
PRESETS = [  # preset, ranks, sizes (-b, -e, -f)
    ("dgx-h100", 8, "8", "128M", "16"), ("dgx-h100", 8, "1G", "1G", "2"), ("fullmesh:8", 8, "8", "128M", "16"),
    ("pcie-8gpu", 8, "8", "128M", "16"), ("torus2d:4x4", 16, "8", "128M", "16"), ("fattree:2", 16, "8", "128M", "16"),
    ("fattree:4", 32, "8", "128M", "16"),
]


def run(command):
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.exit("%s: exit %d\n%s" % (" ".join(command), done.returncode, done.stderr))
    return done.stdout


failed = checked = unchecked = 0
ratios = []
for preset, ranks, low, high, factor in PRESETS:
    sizes = ["-b", low, "-e", high, "-f", factor]
    out = run([tune, "-n", str(ranks), "--topo", preset] + sizes).splitlines()
    header = next(line for line in out if line.strip().startswith("bytes")).split()
    tuned, picks = {}, {}
    for line in out:
        fields = line.split()
        if fields and fields[0].isdigit():
            size = int(fields[0])
            picks[size] = fields[-1].rstrip("*")
            for name, cell in zip(header[1:-1], fields[1:-1]):
                if cell != "-":
                    tuned[(size, name)] = float(cell)
    rows = [line for line in run([sim, "--topo", preset] + sizes).splitlines() if re.match(r"\s+\d+\s+\d+\s", line)]
    for line in rows:
        fields = line.split()
        size, name, simulated = int(fields[0]), fields[5], float(fields[6])
        if (size, name) not in tuned:
            continue
        ratio = simulated / tuned[(size, name)]
        exact = "(fast engine)" not in line
        pick = picks.get(size) == name
        ok = 0.9 <= ratio <= 1.1 if exact else not pick
        if exact:
            checked += 1
            ratios.append(ratio)
        else:
            unchecked += 1
        failed += not ok
        if not ok or pick or not exact:
            print("%s: %s %d B %s%s: loom-tune %.2f us, loom-sim %.2f us (%.2fx)%s" % (
                "ok" if ok else "FAILED", preset, size, name, " (the pick)" if pick else "", tuned[(size, name)],
                simulated, ratio, "" if exact else ", beyond the event timer: not compared"))
print("%d cells compared (sim/tune %.3f to %.3f), %d failed; %d beyond the event timer" % (
    checked, min(ratios, default=0), max(ratios, default=0), failed, unchecked))
sys.exit(1 if failed or checked == 0 else 0)

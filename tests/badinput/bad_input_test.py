#!/usr/bin/env python3
"""Bad input, as a newcomer gives it: every program's flags and output paths, and every LOOM_* setting, tried with
malformed values. Each case must end with a clear message (naming the flag, path or variable), a non-zero exit
status, no hang (a deadline per case), no crash (no signal, no core) and nothing left in /dev/shm; a message a job's
ranks would all give is printed once. The cases for the bugs docs/CHANGELOG.md lists under "A newcomer's first
hour" are marked with the bug.

  bad_input_test.py BUILD_DIR SOURCE_DIR
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

BUILD, SOURCE = (os.path.abspath(p) for p in sys.argv[1:3])
LOOMRUN = os.path.join(BUILD, "tools", "loomrun")
TOOLS = os.path.join(BUILD, "tools")
PERF = os.path.join(BUILD, "perf")
WORK = tempfile.mkdtemp(prefix="loom-bad-input-")
failures = []
checked = 0


def shm_entries():
    try:
        return {name for name in os.listdir("/dev/shm") if "loom" in name}
    except OSError:
        return set()


def run(argv, env=None, timeout=120, cwd=None):
    environment = dict(os.environ)
    environment.setdefault("LOOM_TIMEOUT_MS", "30000")
    environment.update(env or {})
    try:
        done = subprocess.run(argv, env=environment, capture_output=True, text=True, timeout=timeout, cwd=cwd or WORK,
                              errors="replace")
        return done.returncode, done.stdout + done.stderr, False
    except subprocess.TimeoutExpired as expired:
        out = (expired.stdout or b"").decode(errors="replace") + (expired.stderr or b"").decode(errors="replace")
        return None, out, True


def case(name, argv, says, env=None, status="nonzero", once=None, timeout=120, absent=None):
    """Runs argv; it must exit as `status` says ("nonzero", or a number), print every string of `says` (regular
    expressions), none of `absent`, and `once` (an expression) exactly one time."""
    global checked
    checked += 1
    before = shm_entries()
    code, out, hung = run(argv, env, timeout)
    problems = []
    if hung:
        problems.append("did not end within %d s" % timeout)
    elif code < 0 or code >= 128:
        problems.append("ended by a signal (status %d)" % code)
    elif status == "nonzero" and code == 0:
        problems.append("exited 0")
    elif status != "nonzero" and code != status:
        problems.append("exited %d, expected %d" % (code, status))
    for pattern in says:
        if not re.search(pattern, out):
            problems.append("does not say /%s/" % pattern)
    for pattern in absent or []:
        if re.search(pattern, out):
            problems.append("says /%s/" % pattern)
    if once is not None and len(re.findall(once, out)) != 1:
        problems.append("says /%s/ %d times, not once" % (once, len(re.findall(once, out))))
    if re.search(r"Segmentation fault|core dumped|AddressSanitizer|terminate called", out):
        problems.append("crashed")
    left = shm_entries() - before
    if left:
        problems.append("left %s in /dev/shm" % sorted(left))
    if problems:
        failures.append(name)
        print("FAILED: %s: %s\n  command: %s%s\n  output:\n%s" % (
            name, "; ".join(problems), " ".join("%s=%s" % kv for kv in (env or {}).items()) + " ", " ".join(argv),
            "\n".join("    " + line for line in out.splitlines()[-25:])))
    else:
        print("ok: %s" % name)


def tool(name):
    return os.path.join(TOOLS, name)


def perf(name):
    return os.path.join(PERF, name)


def write(name, content):
    path = os.path.join(WORK, name)
    with open(path, "w") as f:
        f.write(content)
    return path


missing_dir = os.path.join(WORK, "no", "such", "folder")

# ---- loom-train ----------------------------------------------------------------------------------------------
train = tool("loom-train")
empty = write("empty.txt", "")
short = write("short.txt", "too short")
os.makedirs(os.path.join(WORK, "a-directory"), exist_ok=True)
case("loom-train --data an empty file (was SIGSEGV)", [train, "--data", empty, "--steps", "1"], ["--data", "is empty"])
case("loom-train --data a directory (was SIGSEGV)", [train, "--data", os.path.join(WORK, "a-directory"), "--steps", "1"],
     ["--data", "is a directory"])
case("loom-train --data shorter than one sequence (trained anyway)",
     [train, "--data", short, "--tokenizer", "char", "--steps", "1"], ["--data", "a sequence needs", "--seq"])
for flag in ["--save", "--metrics", "--plot"]:
    value = os.path.join(missing_dir, "out" + {"--save": ".ckpt", "--metrics": ".csv", "--plot": ".png"}[flag])
    case("loom-train %s to an unwritable path (checked only after training, exit 0)" % flag,
         [train, flag, value, "--steps", "100000"], [flag, "does not exist"], timeout=60, absent=[r"^step "])
case("loom-train --pp-timeline to an unwritable path",
     [train, "--pp", "2", "--accumulation", "2", "--pp-timeline", os.path.join(missing_dir, "t.png"), "--steps", "1"],
     ["--pp-timeline", "does not exist"])
case("loom-train --plot with a name that is neither .png nor .svg (--plot x.svg wrote PNG data)",
     [train, "--plot", os.path.join(WORK, "loss.jpg"), "--steps", "1"], ["--plot", r"\.png or \.svg"])
case("loom-train --save-every without --save", [train, "--save-every", "5", "--steps", "10"], ["--save-every", "--save"])
case("loom-train --steps x", [train, "--steps", "x"], ["--steps x", "integer"])
case("loom-train --model nope", [train, "--model", "nope"], ["--model nope", "gpt-tiny"])
case("loom-train, 2 ranks, --steps 0: said once", [LOOMRUN, "-n", "2", train, "--steps", "0"], ["--steps"],
     once=r"loom-train: --steps")
# --resume from a later step than --steps (did nothing, exit 0). The checkpoint: 2 steps of a small model.
checkpoint = os.path.join(WORK, "two-steps.ckpt")
small = ["--layers", "1", "--batch", "1", "--seq", "16"]
code, out, hung = run([train] + small + ["--steps", "2", "--save", checkpoint], timeout=300)
if code != 0 or not os.path.exists(checkpoint):
    failures.append("loom-train: the checkpoint for the --resume cases")
    print("FAILED: could not write a 2-step checkpoint (exit %s):\n%s" % (code, out[-2000:]))
else:
    case("loom-train --resume at step 2 with --steps 2 (did nothing, exit 0)",
         [train] + small + ["--steps", "2", "--resume", checkpoint], ["--resume", "at step 2", "--steps 2"])
svg = os.path.join(WORK, "loss.svg")
if shutil.which("gnuplot"):
    case("loom-train --plot x.svg writes SVG", [train] + small + ["--steps", "2", "--plot", svg], [r"step +2/2"],
         status=0)
    with open(svg, "rb") as f:
        head = f.read(256)
    checked += 1
    if b"<svg" not in head and b"<?xml" not in head:
        failures.append("loom-train --plot x.svg: not SVG")
        print("FAILED: %s does not start as SVG: %r" % (svg, head[:40]))
    else:
        print("ok: %s is SVG" % svg)

# ---- ep_perf ---------------------------------------------------------------------------------------------------
ep = perf("ep_perf")
case("ep_perf --topk above the experts, 2 ranks (both spun forever)",
     [LOOMRUN, "-n", "2", "--timeout", "60", ep, "--experts", "4", "--topk", "8"], ["--topk 8", "4 experts"],
     once=r"--topk 8 is more", timeout=90)
case("ep_perf --help (was 'flag without a value')", [ep, "--help"], ["usage: ep_perf", "--experts"], status=0)
case("ep_perf --modes bogus (ran nothing, exit 0)", [ep, "--modes", "bogus"], ["--modes bogus", "ll, normal"])
case("ep_perf -e (nccl-tests' maxbytes)", [ep, "-e", "16"], ["-e is nccl-tests'", "--experts"])
case("ep_perf -c (nccl-tests' check)", [ep, "-c", "1"], ["-c is nccl-tests'", "--capacity"])
case("ep_perf --experts 3 over 2 ranks", [LOOMRUN, "-n", "2", "--timeout", "60", ep, "--experts", "3", "--topk", "2"],
     ["--experts 3", "multiple of the rank count"], once=r"--experts 3 does not", timeout=90)
case("ep_perf --tokens x", [ep, "--tokens", "x"], ["--tokens"])

# ---- the perf programs -----------------------------------------------------------------------------------------
allreduce = perf("all_reduce_perf")
for program in ["all_reduce_perf", "alltoall_perf", "sendrecv_perf"]:
    case("%s -J to an unwritable path, 2 ranks (ran the sweep, exit 0)" % program,
         [LOOMRUN, "-n", "2", perf(program), "-b", "8", "-e", "64M", "-J", os.path.join(missing_dir, "r.json")],
         ["-J", "does not exist"], once=r"-J \S+: cannot write", timeout=60, absent=[r"^ +\d+ +\d+ +float"])
case("all_reduce_perf -J a directory", [allreduce, "-J", WORK], ["-J", "is a directory"])
case("all_reduce_perf -b 1x", [allreduce, "-b", "1x"], ["1x", "-b"])
case("all_reduce_perf -d nope", [allreduce, "-d", "nope"], ["nope"])
case("all_reduce_perf -t 0", [allreduce, "-t", "0"], ["-t"])
case("all_reduce_perf, 4 ranks, -o nope: said once", [LOOMRUN, "-n", "4", allreduce, "-o", "nope"], ["nope"],
     once=r"invalid op 'nope'")

# ---- LOOM_* settings -------------------------------------------------------------------------------------------
# Every row of the params table (docs/ENVIRONMENT.md is generated from it) that is an integer, one word or a list,
# given a value it cannot take: the communicator's init fails, naming the variable and what it accepts.
rows = []
with open(os.path.join(SOURCE, "docs", "ENVIRONMENT.md")) as page:
    for line in page:
        cells = [cell.strip() for cell in line.split("|")]
        if len(cells) > 3 and cells[1].startswith("`") and cells[2] in ("integer", "one word", "list"):
            rows.append((cells[1].strip("`"), cells[2]))
launcher = {"RANK", "WORLD_SIZE", "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS"}
checked_rows = 0
for variable, kind in rows:
    value = "not-a-number" if kind == "integer" else "no-such-word"
    # A launcher's rank variable makes the program join as that launcher's rank: loomCommInitFromEnv checks too.
    argv = [allreduce, "-b", "8", "-e", "8", "-n", "1", "-w", "0"]
    env = {variable: value}
    if variable in launcher:
        env.update({"LOOM_ROOT_ADDR": "127.0.0.1:1"})
    case("%s=%s" % (variable, value), argv, [re.escape(variable) + r"=\"?" + value, "expected"], env=env, timeout=60)
    checked_rows += 1
if checked_rows < 30:
    failures.append("the settings table")
    print("FAILED: only %d settings found in docs/ENVIRONMENT.md" % checked_rows)
# Words in any case, as NCCL reads them; clamped integers said once at WARN, per process.
for variable, value in [("LOOM_PROTO", "simple"), ("LOOM_TRANSPORTS", "SHM"), ("LOOM_DEBUG", "info"),
                        ("LOOM_ALGO", "Ring")]:
    case("%s=%s is accepted" % (variable, value), [allreduce, "-b", "8", "-e", "8", "-n", "1"], [r"Out of bounds values : 0 OK"],
         env={variable: value}, status=0)
for variable, value, said in [("LOOM_NCHANNELS", "1000", "outside 1 to 32: using 32"),
                              ("LOOM_FIFO_DEPTH", "0", "outside 2 to 64: using 2"),
                              ("LOOM_SIMPLE_SLOT_BYTES", "1", "outside 4096 to 67108864: using 4096"),
                              ("LOOM_CHUNK_BYTES", "5", "outside 0, or 1024 or more: using 1024")]:
    case("%s=%s is clamped, said once" % (variable, value), [allreduce, "-b", "8", "-e", "1M", "-n", "2"],
         [r"Out of bounds values : 0 OK", re.escape(said)], env={variable: value}, status=0,
         once=re.escape(variable + "=" + value))
# Free-text settings, checked where they are used.
for variable, value, says in [("LOOM_ALGO", "ring,warp-drive", "LOOM_ALGO"), ("LOOM_TORUS_DIMS", "3x", "LOOM_TORUS_DIMS"),
                              ("LOOM_TOPO_FILE", os.path.join(missing_dir, "t.xml"), "t.xml"),
                              ("LOOM_SOCKET_IFNAME", "=nosuchif0", "nosuchif0"),
                              ("LOOM_SECRET", "xyz", "LOOM_SECRET must be 32 hex digits")]:
    env = {variable: value}
    argv = [allreduce, "-b", "8", "-e", "8", "-n", "1"]
    if variable == "LOOM_SOCKET_IFNAME":
        argv = [LOOMRUN, "-n", "2", "--timeout", "60"] + argv
    if variable == "LOOM_SECRET":  # loomrun sets its own: a job started by hand, as another launcher would
        env.update({"LOOM_RANK": "0", "LOOM_NRANKS": "1", "LOOM_ROOT_ADDR": "127.0.0.1:29999"})
    case("%s=%s" % (variable, value), argv, [says], env=env, timeout=90)

# The log after a failure: a stopped rank's peers, each call of a stream failing alike, say it once per line kind.
# (A stopped rank in stream mode with SIGUSR1 left 188,497 identical WARN lines.)

# ---- the tools -------------------------------------------------------------------------------------------------
tune, sim, plan, topo = tool("loom-tune"), tool("loom-sim"), tool("loom-plan"), tool("loom-topo")
case("loom-tune -c sendrecv (printed a time of -1.00)", [tune, "-n", "4", "-c", "sendrecv"],
     ["sendrecv", "does not choose", "allreduce"], absent=[r"-1\.00"])
case("loom-tune -c nope lists the names", [tune, "-n", "4", "-c", "nope"], ["nope", r"allreduce \(all_reduce\)"])
case("loom-tune -c all_reduce (the peers' spelling)", [tune, "-n", "2", "-c", "all_reduce", "-b", "8", "-e", "8"],
     ["AllReduce on 2 ranks"], status=0)
case("loom-tune --help lists the names", [tune, "--help"], [r"allreduce \(all_reduce\)", "reducescatter"], status=0)
case("loom-tune -n x", [tune, "-n", "x"], ["-n"])
case("loom-tune --deterministic with rules that leave AllReduce no rank-order algorithm",
     [tune, "-n", "4", "--algo", "allreduce:ring", "--deterministic"], ["--deterministic", "AllReduce", "direct,twoshot"])
case("loom-sim --collective all_gather (the peers' spelling)",
     [sim, "--topo", "fullmesh:4", "--collective", "all_gather", "-b", "1M", "-e", "1M"], [r"ring"], status=0)
case("loom-sim --collective nope lists the names", [sim, "--topo", "fullmesh:4", "--collective", "nope"],
     ["nope", r"allreduce \(all_reduce\)"])
case("loom-sim --topo nope", [sim, "--topo", "nope"], ["nope", "presets"])
case("loom-sim -b x", [sim, "--topo", "dgx-h100", "-b", "x"], ["-b"])
case("loom-plan: a layout larger than fattree:4 sizes the cluster (failed)",
     [plan, "--model", "gpt2-124m", "--tp", "4", "--dp", "16", "--batch", "64"], [r"fattree:8 \(sized to the layout"],
     status=0)
case("loom-plan: a layout that does not fit says so (printed 405 GB (of 80 GB))",
     [plan, "--model", "gpt3-175b", "--tp", "1", "--dp", "8", "--batch", "8"], ["DOES NOT FIT", "does not fit:"])
case("loom-plan --recommend explains its rule (spoke of a prescription)",
     [plan, "--model", "gpt2-124m", "--batch", "32", "--recommend"], ["the rule", "## recommended"], status=0,
     absent=["prescription"])
case("loom-plan --tp 0", [plan, "--tp", "0"], ["--tp"])
loom_xml = os.path.join(WORK, "dgx.xml")
code, out, hung = run([topo, "--preset", "dgx-h100", "--xml"])
with open(loom_xml, "w") as f:
    f.write(out)
case("loom-topo --hwloc on loom's XML (said 'Invalid argument (unhandled system error)')", [topo, "--hwloc", loom_xml],
     ["loom's topology XML", "--file"], absent=["unhandled system error"])
case("loom-topo --hwloc on a missing file", [topo, "--hwloc", os.path.join(missing_dir, "x.xml")], ["cannot open"])
case("loom-topo --path on dgx-h100 explains its parallel switches (a 125 GB/s hop under 450 GB/s)",
     [topo, "--preset", "dgx-h100", "--path", "0", "1"], ["450 GB/s", r"1 of 4 switches in parallel"], status=0)
for preset in ["dgx-h100", "pcie-8gpu", "fattree:2", "fattree:64", "torus2d:4x4", "torus3d:4x4x2", "fullmesh:16"]:
    target = os.path.join(WORK, preset.replace(":", "-") + ".svg")
    case("loom-topo --dot for %s ends (fattree:2 never did)" % preset, [topo, "--preset", preset, "--dot", target],
         ["wrote"], status=0, timeout=120)
    if preset.startswith("torus"):
        with open(target[:-4] + ".dot") as f:
            text = f.read()
        checked += 1
        if text.count("pos=") < 16:
            failures.append("loom-topo --dot %s: not a grid" % preset)
            print("FAILED: loom-topo --dot %s: the chips are not placed on a grid" % preset)
case("loom-topo --dot x.jpg", [topo, "--preset", "dgx-h100", "--dot", os.path.join(WORK, "x.jpg")], [r"\.dot, \.svg or \.png"])
case("loom-topo --path 0 999", [topo, "--preset", "dgx-h100", "--path", "0", "999"], ["--path"])
case("loom-topo --preset nope", [topo, "--preset", "nope"], ["nope"])
scripts = os.path.join(SOURCE, "tools")
case("tune-check --save to an unwritable path (checked after the measurements)",
     [sys.executable, os.path.join(scripts, "tune-check"), "--build", BUILD, "-c", "All_Reduce", "--save", os.path.join(missing_dir, "m.json")],
     ["--save", "cannot write"], timeout=60)
case("compare-peers -o an unwritable folder", [sys.executable, os.path.join(scripts, "compare-peers"), "-B", BUILD,
                                              "-o", "/proc/no-such-folder"], ["-o", "cannot write"], timeout=60)
case("compare-peers -C nope lists the names", [sys.executable, os.path.join(scripts, "compare-peers"), "-B", BUILD,
                                               "-C", "nope"], ["nope", "all_reduce"], timeout=60)
case("loomrun -n 0", [LOOMRUN, "-n", "0", "true"], ["-n"])
case("loomrun with no program", [LOOMRUN, "-n", "2"], ["usage|program"])
case("loomrun, a program that does not exist", [LOOMRUN, "-n", "2", os.path.join(missing_dir, "prog")], ["prog"])

# ---- the torch backend -----------------------------------------------------------------------------------------
# A Python without torch, or with another torch than the build's (said only "initialization failed").
plain = [p for p in ("/root/.pyenv/shims/python3", shutil.which("python3")) if p and os.path.exists(p)]
no_torch = None
for python in plain:
    if run([python, "-c", "import torch"])[0] not in (0, None):
        no_torch = python
        break
for build, label in [(os.path.join(BUILD, "plugins", "torch"), "torch 1.13's build"),
                     (os.path.join(BUILD, "plugins", "torch", "torch2"), "torch 2.x's build")]:
    if not any(name.startswith("loom_torch") for name in (os.listdir(build) if os.path.isdir(build) else [])):
        continue
    if no_torch:
        case("import loom_torch (%s) without torch" % label, [no_torch, "-c", "import loom_torch"],
             ["this build is for torch", "cannot import"], env={"PYTHONPATH": build})
    other = "/usr/bin/python3" if build.endswith("torch2") else "/opt/loom-torch2/bin/python"
    if os.path.exists(other) and run([other, "-c", "import torch"])[0] == 0:
        case("import loom_torch (%s) with the other torch" % label, [other, "-c", "import loom_torch"],
             ["this build is for torch", "but this Python has torch"], env={"PYTHONPATH": build})

shutil.rmtree(WORK, ignore_errors=True)
print("%d checks, %d failed%s" % (checked, len(failures), (": " + "; ".join(failures)) if failures else ""))
sys.exit(1 if failures else 0)

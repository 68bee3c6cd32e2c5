#!/usr/bin/python3
"""A dead or stopped rank, as torch users meet it: every survivor's exception names it.

  PYTHON tests/torch/torch_root_cause_test.py BUILD_DIR

Four ranks are started without a launcher, with the variables torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT; init_method "env://"), and loop all_reduce on backend "loom" with a 3 s timeout. One rank,
drawn at random, is killed with SIGKILL, then (a fresh world) one is stopped with SIGSTOP. The exception every
survivor's all_reduce raises must name that rank as loom does, "rank 3 (pid 4242 on host node1)", and why: "was
killed by signal 9 (SIGKILL)" or "is stopped". Runs on the torch of the interpreter it is given (Debian's 1.13 or
a 2.x); exits 77 (skipped) when torch or loom_torch cannot be imported.
"""
import datetime
import os
import random
import select
import signal
import socket
import subprocess
import sys
import time

import ranks

SIZE = 4
TIMEOUT_S = 3


def worker():
    import torch
    import torch.distributed as dist
    import loom_torch  # noqa: F401  (registers the backend)

    dist.init_process_group("loom", init_method="env://", timeout=datetime.timedelta(seconds=TIMEOUT_S))
    rank = dist.get_rank()
    tensor = torch.full((1 << 16,), float(rank + 1))
    calls = 0
    try:
        while True:
            dist.all_reduce(tensor)
            tensor.fill_(float(rank + 1))
            calls += 1
            if calls == 1:
                print("R", flush=True)
    except Exception as error:  # what a survivor's training loop sees
        print("RAISED after %d calls: %s" % (calls, " ".join(str(error).split())), flush=True)
    sys.stdout.flush()
    os._exit(0)  # the group is broken; torch's exit handlers would only wait on it


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(build, sig):
    """Starts SIZE ranks, signals a random one once all have finished an all_reduce, and returns (victim, its pid,
    every rank's exit code and output)."""
    port = free_port()
    procs = []
    for rank in range(SIZE):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(SIZE), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(SIZE), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PYTHONWARNINGS="ignore")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker"], stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, env=env))
    victim = random.randrange(SIZE)
    outputs = [""] * SIZE
    ready = set()
    deadline = time.time() + 120
    while len(ready) < SIZE and time.time() < deadline:
        readable, _, _ = select.select([p.stdout for p in procs], [], [], 1)
        for stream in readable:
            rank = [p.stdout for p in procs].index(stream)
            line = stream.readline()
            outputs[rank] += line
            if line.strip() == "R":
                ready.add(rank)
            if not line:  # ended before its first all_reduce
                ready.add(rank)
    time.sleep(0.5)
    procs[victim].send_signal(sig)
    codes = [None] * SIZE
    for rank, proc in enumerate(procs):  # the survivors first: a killed victim stays a zombie meanwhile
        if rank == victim:
            continue
        try:
            text, _ = proc.communicate(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate()
            text += "\n(killed: still running)"
        outputs[rank] += text
        codes[rank] = proc.returncode
    procs[victim].kill()
    outputs[victim] += procs[victim].communicate()[0]
    codes[victim] = procs[victim].returncode
    return victim, procs[victim].pid, codes, outputs


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker()
        return 0
    build = os.path.abspath(sys.argv[1])
    probe = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__.split('.')[0])"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        print("skipped: cannot import torch")
        return 77
    major = int(probe.stdout.strip())
    os.environ["PYTHONPATH"] = ranks.plugin_dir(build, major) + os.pathsep + os.environ.get("PYTHONPATH", "")
    os.environ["LD_LIBRARY_PATH"] = build + os.pathsep + os.environ.get("LD_LIBRARY_PATH", "")
    if subprocess.run([sys.executable, "-c", "import torch, loom_torch"], capture_output=True).returncode != 0:
        print("skipped: cannot import loom_torch")
        return 77
    status = 0
    for sig, why in ((signal.SIGKILL, "was killed by signal 9 (SIGKILL)"), (signal.SIGSTOP, "is stopped")):
        victim, pid, codes, outputs = run_world(build, sig)
        named = "rank %d (pid %d on host %s) %s" % (victim, pid, socket.gethostname(), why)
        wrong = [r for r in range(SIZE) if r != victim and (codes[r] != 0 or named not in outputs[r])]
        print("%s of rank %d of %d: %s" % (sig.name, victim, SIZE,
                                           "every survivor's exception says \"%s\"" % named if not wrong else
                                           "FAILED on ranks %s" % wrong))
        if wrong:
            status = 1
            for r in range(SIZE):
                print("--- rank %d (exit %s):\n%s" % (r, codes[r], outputs[r][-3000:]))
        else:
            survivor = min(r for r in range(SIZE) if r != victim)
            print("  rank %d: %s" % (survivor, outputs[survivor].strip().splitlines()[-1][:600]))
    return status


if __name__ == "__main__":
    sys.exit(main())

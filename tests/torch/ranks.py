"""Shared by the torch tests: where loom_torch is built for a torch, and running a test's ranks as processes of
this host that meet through a file (torch's FileStore)."""
import os
import subprocess
import sys
import tempfile
import time


def plugin_dir(build, major):
    """Where loom_torch is built for torch `major` (1: Debian's 1.13; 2: the torch 2.x of torch2_python)."""
    return os.path.join(build, "plugins", "torch", *(["torch2"] if major >= 2 else []))


def run_ranks(script, size, args, timeout=300):
    """Runs `script --worker ARGS... RANK SIZE STORE` for each rank (ARGS: `args(rank, store)` before the rank);
    returns every rank's exit code and output, killing those still running after `timeout` seconds."""
    handle, store = tempfile.mkstemp(prefix="loom-torch-")
    os.close(handle)
    os.remove(store)  # a fresh name: no port to race other tests for
    env = dict(os.environ, PYTHONWARNINGS="ignore")  # torch 2.x deprecates names the tests call
    procs = [subprocess.Popen([sys.executable, script, "--worker", *args(r, store)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env)
             for r in range(size)]
    outputs, codes = [], []
    deadline = time.time() + timeout
    for p in procs:
        try:
            text, _ = p.communicate(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
            text += "\n(killed: over %d s)" % timeout
        outputs.append(text)
        codes.append(p.returncode)
    if os.path.exists(store):
        os.remove(store)
    return codes, outputs

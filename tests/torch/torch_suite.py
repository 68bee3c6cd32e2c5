#!/usr/bin/env python3
"""PyTorch's own distributed test suite on the backend "loom", beside gloo.

  PYTHON tests/torch/torch_suite.py BUILD_DIR [--world-size N]... [--all | TEST...] [--json FILE]

Runs torch/testing/_internal/distributed/distributed_test.py, as shipped with the torch PYTHON imports (Debian's
1.13 in /usr/bin/python3, or the 2.x of tools/install-deps), the way PyTorch runs it on its own backends
(test/distributed/test_distributed_spawn.py: a process per rank, spawned per test), once with BACKEND=gloo and once
with BACKEND=loom, loom declared as PyTorch declares a plug-in backend (DistTestCases.backend_feature "plugin",
and "ddp" and "subgroup", which gloo has too) before the suite is imported. Without --all or TEST names it runs
CI_TESTS, a subset that calls every operation. Prints, per world size, the counts (passed, failed, skipped) on
each backend, every test that passes on gloo and fails on loom, and the tests the suite runs on gloo only by name
(skipped on loom with their reason). Exits 1 if a test passes on gloo and fails on loom, but for those in KNOWN
(each with its reason, printed); 77 (skipped) if PYTHON cannot import torch and loom_torch.

  PYTHON tests/torch/torch_suite.py --run BACKEND WORLD_SIZE OUT [TEST...]     one backend (internal)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from ranks import plugin_dir

# One test at least per operation, its async and group forms, and DDP: what CI runs (about 3 minutes a run).
CI_TESTS = [
    "test_broadcast", "test_all_reduce_sum", "test_all_reduce_coalesced_max", "test_all_reduce_sum_async", "test_reduce_sum", "test_reduce_product", "test_all_gather",
    "test_all_gather_coalesced_simple", "test_all_gather_into_tensor_basic", "test_gather", "test_scatter",
    "test_reduce_scatter_tensor", "test_all_to_all", "test_all_to_all_single_equal_split",
    "test_all_to_all_single_unequal_split", "test_send_recv", "test_isend", "test_irecv",
    "test_send_recv_any_source", "test_barrier", "test_barrier_group", "test_DistributedDataParallelCPU",
    "test_new_subgroups", "test_all_reduce_complex",
]


# Tests that fail on loom, pass on gloo, and why: counted as failures and printed, but not failing the run.
KNOWN = {
    "test_ddp_logging_data_cpu": "DDP logs the ProcessGroup's backend name, which torch sets to 'custom' for every "
                                 "plug-in backend, while the test expects dist.get_backend()'s 'loom'",
}


def run_one(backend, world_size, out, names):
    """In a child interpreter: runs the suite (or `names`) on `backend`, writes {test: [outcome, detail]} to out."""
    import unittest
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_suite_spawn import TestDistBackendWithSpawn
    loader = unittest.TestLoader()
    if names:
        suite = unittest.TestSuite(TestDistBackendWithSpawn(n) for n in names
                                   if hasattr(TestDistBackendWithSpawn, n))
    else:
        suite = loader.loadTestsFromTestCase(TestDistBackendWithSpawn)
    outcomes = {}

    class Recorder(unittest.TextTestResult):
        def addSuccess(self, test):
            super().addSuccess(test)
            outcomes[test._testMethodName] = ["passed", ""]

        def addFailure(self, test, err):
            super().addFailure(test, err)
            outcomes[test._testMethodName] = ["failed", self._exc_info_to_string(err, test)[-1500:]]

        def addError(self, test, err):
            super().addError(test, err)
            outcomes[test._testMethodName] = ["failed", self._exc_info_to_string(err, test)[-1500:]]

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            outcomes[test._testMethodName] = ["skipped", str(reason)]

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            outcomes[test._testMethodName] = ["passed", "expected failure"]

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            outcomes[test._testMethodName] = ["failed", "unexpected success"]

    unittest.TextTestRunner(resultclass=Recorder, verbosity=1, stream=sys.stderr).run(suite)
    with open(out, "w") as f:
        json.dump(outcomes, f, indent=1, sort_keys=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--run":
        backend, world_size, out = sys.argv[2], int(sys.argv[3]), sys.argv[4]
        run_one(backend, world_size, out, sys.argv[5:])
        return 0
    build = os.path.abspath(sys.argv[1])
    args = sys.argv[2:]
    sizes, names, everything, json_out = [], [], False, None
    while args:
        arg = args.pop(0)
        if arg == "--world-size":
            sizes.append(int(args.pop(0)))
        elif arg == "--all":
            everything = True
        elif arg == "--json":
            json_out = args.pop(0)
        else:
            names.append(arg)
    sizes = sizes or [2]
    if not everything and not names:
        names = CI_TESTS
    try:
        import torch
        major = int(torch.__version__.split(".")[0])
    except ImportError:
        print("skipped: this interpreter cannot import torch")
        return 77
    plugin = plugin_dir(build, major)
    if major < 2:  # Debian's python3 has no expecttest, which the suite imports: tools/install-deps puts it there
        plugin += os.pathsep + os.environ.get("LOOM_EXPECTTEST_DIR", "/opt/loom-torch2/for-python3")
    env = dict(os.environ, PYTHONPATH=plugin + os.pathsep + os.environ.get("PYTHONPATH", ""),
               LD_LIBRARY_PATH=build + os.pathsep + os.environ.get("LD_LIBRARY_PATH", ""),
               PYTHONWARNINGS="ignore")
    probe = subprocess.run([sys.executable, "-c", "import torch, loom_torch"], capture_output=True, text=True,
                           env=env)
    if probe.returncode != 0:
        print("skipped: cannot import torch and loom_torch:", probe.stderr.strip().splitlines()[-1:])
        return 77
    print("torch %s, distributed_test.py, %s" % (torch.__version__,
                                                   "every test" if everything else "%d tests" % len(names)))
    status = 0
    report = {"torch": torch.__version__, "sizes": {}}
    for size in sizes:
        results = {}
        for backend in ("gloo", "loom"):
            work = tempfile.mkdtemp(prefix="loom-suite-")
            out = os.path.join(work, "outcomes.json")
            start = time.time()
            run = subprocess.run([sys.executable, os.path.abspath(__file__), "--run", backend, str(size), out] +
                                 ([] if everything else names),
                                 env=dict(env, BACKEND=backend, WORLD_SIZE=str(size), TEMP_DIR=work),
                                 capture_output=True, text=True, timeout=6 * 3600)
            if not os.path.exists(out):
                print("%s at %d ranks: the suite did not run:\n%s" % (backend, size, run.stderr[-3000:]))
                shutil.rmtree(work, ignore_errors=True)
                return 1
            with open(out) as f:
                results[backend] = json.load(f)
            shutil.rmtree(work, ignore_errors=True)
            counts = {k: sum(1 for o in results[backend].values() if o[0] == k)
                      for k in ("passed", "failed", "skipped")}
            print("%d ranks, %s: %d passed, %d failed, %d skipped (%.0f s)" % (
                size, backend, counts["passed"], counts["failed"], counts["skipped"], time.time() - start))
            report["sizes"].setdefault(str(size), {})[backend] = counts
        gloo, loom = results["gloo"], results["loom"]
        regressions = sorted(t for t, o in gloo.items() if o[0] == "passed" and loom.get(t, ["missing"])[0] == "failed")
        gated = sorted(t for t, o in gloo.items() if o[0] == "passed" and loom.get(t, ["missing"])[0] == "skipped")
        for t in regressions:
            why = [line for line in loom[t][1].splitlines() if "Error" in line][-1:] or loom[t][1].splitlines()[-1:]
            print("  FAILS on loom, passes on gloo%s: %s\n    %s" % (
                " (known: %s)" % KNOWN[t] if t in KNOWN else "", t, why))
        for t in gated:
            print("  gated to gloo: %s (%s)" % (t, loom[t][1]))
        report["sizes"][str(size)]["regressions"] = regressions
        report["sizes"][str(size)]["gated"] = {t: loom[t][1] for t in gated}
        if any(t not in KNOWN for t in regressions):
            status = 1
    if json_out:
        with open(json_out, "w") as f:
            json.dump(report, f, indent=1, sort_keys=True)
    return status


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""torch.distributed all_reduce bus bandwidth with the "loom" backend against "gloo", in the same run.

  perf/torch_allreduce.py BUILD_DIR [--ranks N] [--sizes 1M,16M,64M] [--iters K] [--warmup W] [--rounds R]

Each round starts N processes on this host, which build one default process group and time torch.distributed
all_reduce (float32, SUM, in place) with each backend in turn, alternating backends size by size: K timed calls
after W untimed, the slowest rank's time per call. Bus bandwidth as nccl-tests counts it for an all-reduce:
bytes x 2 (N - 1) / N / time. Prints, per size, each backend's median over the rounds and their ratio.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def worker(rank, size, port, sizes, iters, warmup):
    import datetime
    import torch
    import torch.distributed as dist
    import loom_torch  # noqa: F401

    dist.init_process_group("gloo", init_method="file://" + port, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=120))
    groups = {"gloo": dist.new_group(list(range(size)), backend="gloo"),
              "loom": dist.new_group(list(range(size)), backend="loom")}
    for nbytes in sizes:
        tensor = torch.ones(nbytes // 4)
        for name in ("loom", "gloo"):
            group = groups[name]
            for _ in range(warmup):
                dist.all_reduce(tensor, group=group)
            dist.barrier(group=group)
            start = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(tensor, group=group)
            elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=groups["gloo"])
            if rank == 0:
                print("%s %d %.9f" % (name, nbytes, elapsed.item()), flush=True)
    dist.destroy_process_group()


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        rank, size, iters, warmup = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[5]), int(sys.argv[6])
        port = sys.argv[4]
        worker(rank, size, port, [int(x) for x in sys.argv[7].split(",")], iters, warmup)
        return 0
    parser = argparse.ArgumentParser()
    parser.add_argument("build")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--sizes", default="1M,16M,64M")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    build = os.path.abspath(args.build)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(build, "plugins", "torch") + os.pathsep + env.get("PYTHONPATH", "")
    env["LD_LIBRARY_PATH"] = build + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    results = {}
    for _ in range(args.rounds):
        handle, port = tempfile.mkstemp(prefix="loom-torch-perf-")  # the FileStore's rendezvous file
        os.close(handle)
        os.remove(port)
        procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(r), str(args.ranks), str(port),
                                   str(args.iters), str(args.warmup), ",".join(map(str, sizes))],
                                  env=env, stdout=subprocess.PIPE, text=True) for r in range(args.ranks)]
        out = procs[0].communicate()[0]
        for p in procs[1:]:
            p.communicate()
        if any(p.returncode for p in procs):
            print("a rank failed")
            return 1
        for line in out.split("\n"):
            if line:
                name, nbytes, seconds = line.split()
                results.setdefault((name, int(nbytes)), []).append(float(seconds))
    print("# torch %s all_reduce, float32 sum, %d ranks on one host, %d rounds x %d calls (medians)" % (
        "1.13", args.ranks, args.rounds, args.iters))
    print("%12s %14s %14s %8s" % ("bytes", "loom busbw", "gloo busbw", "ratio"))
    factor = 2.0 * (args.ranks - 1) / args.ranks
    for nbytes in sizes:
        bw = {name: nbytes * factor / statistics.median(results[(name, nbytes)]) / 1e9 for name in ("loom", "gloo")}
        print("%12d %11.2f GB/s %11.2f GB/s %7.2fx" % (nbytes, bw["loom"], bw["gloo"], bw["loom"] / bw["gloo"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""PyTorch's ProcessGroupNCCL running on loom's libnccl.so.2, on a machine with a GPU.

    python3 tests/gpu/torch_nccl.py build-gpu/plugins/nccl/libnccl.so.2 [--ranks 2 4]

For each rank count, starts that many processes sharing GPU 0, each with LD_PRELOAD=libnccl.so.2 ahead of the NCCL
that torch loads, and in each: all_reduce (sum, max, avg, and PREMUL_SUM where torch has it), broadcast,
all_gather, reduce_scatter, all_to_all (even and uneven splits) in float32, bfloat16 and int32, and one DDP step
of a small model. Every result is checked against the same computation on the CPU. A rank also checks that the
NCCL symbols torch calls resolve to the preloaded library, and loom's log must show its communicators.

Needs torch 2.x with CUDA and a GPU; exits 77 (skipped) without them. With --cpu, the same checks run on the CPU
through loom's own torch backend (loom_torch on PYTHONPATH), which tests this script where there is no GPU. With
--loom-cuda, they run on CUDA tensors through loom_torch (backend "loom", each tensor staged through host memory),
with no library preloaded.
"""
import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
import time


def check_preloaded(library):
    """The NCCL symbols of this process resolve to the preloaded library."""

    class DlInfo(ctypes.Structure):
        _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p),
                    ("saddr", ctypes.c_void_p)]

    where = DlInfo()
    address = ctypes.cast(ctypes.CDLL(None).ncclAllReduce, ctypes.c_void_p)
    assert ctypes.CDLL("libc.so.6").dladdr(address, ctypes.byref(where)) != 0, "dladdr failed"
    resolved = os.path.realpath(where.fname.decode())
    assert resolved == os.path.realpath(library), f"ncclAllReduce resolves to {resolved}, not {library}"


def worker(rank, world, store_path, library, mode):
    """mode: "nccl" (torch's NCCL backend on the preloaded library), "cpu" or "loom-cuda" (loom_torch)."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    cpu = mode == "cpu"
    if mode != "nccl":
        import loom_torch  # noqa: F401  registers "loom"
    if cpu:
        device = torch.device("cpu")
    else:
        torch.cuda.set_device(0)
        device = torch.device("cuda", 0)
    if mode == "nccl":
        check_preloaded(library)
    dist.init_process_group("nccl" if mode == "nccl" else "loom", init_method="file://" + store_path, rank=rank,
                            world_size=world)

    def data(r, shape, dtype, salt=0):
        generator = torch.Generator().manual_seed(1000 * salt + r)
        return torch.randint(-8, 9, shape, generator=generator).to(dtype)

    checks = []

    def check(name, got, want, tol=0.0):
        got = got.cpu()
        if tol == 0.0:
            ok = torch.equal(got.to(want.dtype), want)
        else:
            ok = torch.allclose(got.double(), want.double(), atol=tol, rtol=tol)
        assert ok, f"rank {rank}: {name}: max difference {(got.double() - want.double()).abs().max().item()}"
        checks.append(name)

    n = 4096 + 3
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        inputs = [data(r, (n,), dtype, 1) for r in range(world)]
        stacked = torch.stack([x.double() for x in inputs])
        for op, want in ((dist.ReduceOp.SUM, stacked.sum(0)), (dist.ReduceOp.MAX, stacked.max(0).values)):
            t = inputs[rank].to(device, copy=True)
            dist.all_reduce(t, op=op)
            check(f"all_reduce {op} {dtype}", t, want.to(dtype))
        if dtype == torch.float32:
            t = inputs[rank].to(device, copy=True)
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            check("all_reduce avg float32", t, (stacked.sum(0) / world).float(), tol=1e-6)
            if not cpu and hasattr(dist, "_make_nccl_premul_sum"):  # loom_torch refuses PREMUL_SUM
                t = inputs[rank].to(device, copy=True)
                dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
                check("all_reduce premul_sum(0.5) float32", t, (stacked.sum(0) * 0.5).float(), tol=1e-6)
        t = inputs[rank].to(device, copy=True)
        dist.broadcast(t, src=world - 1)
        check(f"broadcast {dtype}", t, inputs[world - 1])
        out = torch.empty(world * n, dtype=dtype, device=device)
        dist.all_gather_into_tensor(out, inputs[rank].to(device, copy=True))
        check(f"all_gather_into_tensor {dtype}", out, torch.cat(inputs))
        parts = [torch.empty(n, dtype=dtype, device=device) for _ in range(world)]
        dist.all_gather(parts, inputs[rank].to(device, copy=True))
        check(f"all_gather {dtype}", torch.cat(parts), torch.cat(inputs))
        big = [data(r, (world * n,), dtype, 2) for r in range(world)]
        out = torch.empty(n, dtype=dtype, device=device)
        dist.reduce_scatter_tensor(out, big[rank].to(device, copy=True))
        check(f"reduce_scatter_tensor {dtype}", out,
              torch.stack([b.double() for b in big]).sum(0)[rank * n:(rank + 1) * n].to(dtype))
        # all_to_all, even splits: block p of rank r goes to rank p's block r.
        out = torch.empty(world * n, dtype=dtype, device=device)
        dist.all_to_all_single(out, big[rank].to(device, copy=True))
        check(f"all_to_all_single {dtype}", out, torch.cat([big[p][rank * n:(rank + 1) * n] for p in range(world)]))
        # Uneven splits: rank r sends (r + p + 1) * 7 elements to rank p.
        sends = [(rank + p + 1) * 7 for p in range(world)]
        recvs = [(p + rank + 1) * 7 for p in range(world)]
        source = data(rank, (sum(sends),), dtype, 3)
        out = torch.empty(sum(recvs), dtype=dtype, device=device)
        dist.all_to_all_single(out, source.to(device, copy=True), output_split_sizes=recvs, input_split_sizes=sends)
        want = []
        for p in range(world):
            theirs = data(p, (sum((p + q + 1) * 7 for q in range(world)),), dtype, 3)
            offset = sum((p + q + 1) * 7 for q in range(rank))
            want.append(theirs[offset:offset + (p + rank + 1) * 7])
        check(f"all_to_all_single uneven {dtype}", out, torch.cat(want))

    # One DDP step against the CPU: the mean of every rank's gradient, applied by SGD.
    def model():
        torch.manual_seed(7)
        return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def batch(r):
        generator = torch.Generator().manual_seed(50 + r)
        return torch.randn(8, 16, generator=generator), torch.randn(8, 4, generator=generator)

    ddp = nn.parallel.DistributedDataParallel(model().to(device), device_ids=None if cpu else [0])
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    x, y = batch(rank)
    nn.functional.mse_loss(ddp(x.to(device, copy=True)), y.to(device, copy=True)).backward()
    optimizer.step()
    reference = model().double()
    grads = [torch.zeros_like(p) for p in reference.parameters()]
    for r in range(world):
        reference.zero_grad()
        x, y = batch(r)
        nn.functional.mse_loss(reference(x.double()), y.double()).backward()
        for g, p in zip(grads, reference.parameters()):
            g += p.grad / world
    with torch.no_grad():
        for g, p in zip(grads, reference.parameters()):
            p -= 0.1 * g
    for (name, got), want in zip(ddp.module.named_parameters(), reference.parameters()):
        check(f"DDP step {name}", got.detach(), want.detach(), tol=1e-5)

    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: {len(checks)} checks passed", flush=True)


def run(world, library, timeout, mode):
    cpu = mode != "nccl"  # loom_torch's own: no library preloaded, loom's lines seen without "over loom"
    with tempfile.TemporaryDirectory(prefix="loom-torch-nccl-") as tmp:
        store = os.path.join(tmp, "store")
        env = dict(os.environ, LOOM_DEBUG="INFO", LOOM_DEBUG_SUBSYS="INIT",
                   LOOM_TIMEOUT_MS=os.environ.get("LOOM_TIMEOUT_MS", "60000"))
        if not cpu:
            env["LD_PRELOAD"] = os.path.realpath(library)
        procs, logs = [], []
        for rank in range(world):
            log = open(os.path.join(tmp, f"rank{rank}.log"), "w+")
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), library, "--worker", str(rank), str(world), store,
                 "--mode", mode],
                env=env, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout
        codes = []
        for proc in procs:
            try:
                codes.append(proc.wait(timeout=max(1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append("timeout")
        ok = True
        for rank, (code, log) in enumerate(zip(codes, logs)):
            log.seek(0)
            text = log.read()
            shows_loom = ("over loom" in text or cpu) and "ready on" in text
            if code != 0 or not shows_loom:
                ok = False
                print(f"--- {world} ranks, rank {rank}: exit {code}, loom's init lines {'seen' if shows_loom else 'MISSING'}")
                print(text[-6000:])
            else:
                print(f"{world} ranks, rank {rank}: " + text.strip().splitlines()[-1])
        return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("library")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--timeout", type=float, default=240)
    parser.add_argument("--cpu", action="store_true", help="run the checks on the CPU through loom_torch")
    parser.add_argument("--loom-cuda", action="store_true", help="run them on CUDA tensors through loom_torch")
    parser.add_argument("--worker", nargs=3, metavar=("RANK", "WORLD", "STORE"))
    parser.add_argument("--mode", default="nccl")
    args = parser.parse_args()
    if args.worker:
        worker(int(args.worker[0]), int(args.worker[1]), args.worker[2], args.library, args.mode)
        return 0
    try:
        import torch
    except ImportError:
        print("torch_nccl: python3 cannot import torch: skipped")
        return 77
    if args.cpu:
        ok = all([run(world, args.library, args.timeout, "cpu") for world in args.ranks])
        print("torch_nccl --cpu: " + ("all checks passed" if ok else "FAILED"))
        return 0 if ok else 1
    if not torch.cuda.is_available() or int(torch.__version__.split(".")[0]) < 2:
        print(f"torch_nccl: needs torch 2.x with CUDA and a GPU (torch {torch.__version__}, "
              f"CUDA available: {torch.cuda.is_available()}): skipped")
        return 77
    if args.loom_cuda:
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}: CUDA tensors through loom_torch")
        ok = all([run(world, args.library, args.timeout, "loom-cuda") for world in args.ranks])
        print("torch_nccl --loom-cuda: " + ("all checks passed" if ok else "FAILED"))
        return 0 if ok else 1
    if not os.path.exists(args.library):
        print(f"torch_nccl: {args.library} not found")
        return 1
    print(f"torch {torch.__version__} (built with NCCL {torch.cuda.nccl.version()}), "
          f"{torch.cuda.get_device_name(0)}, loom's {os.path.realpath(args.library)} preloaded")
    ok = all([run(world, args.library, args.timeout, "nccl") for world in args.ranks])
    print("torch_nccl: " + ("all checks passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""torch 2.x's own distributed clients on the backend "loom" (plugins/torch/torch2) against gloo.

  PYTHON tests/torch/torch_clients_test.py BUILD_DIR [CLIENT...]

PYTHON is the interpreter of a torch 2.x (tools/install-deps makes /opt/loom-torch2). Each client trains a small
model for a few steps on CPU ranks of one host, once with backend "loom" and once with "gloo", from the same seed
and data, and compares the losses and the final (full) parameters:
  ddp       DistributedDataParallel, buckets of 1 KiB, with a communication hook (averaging through the future of
            an all_reduce), at 2 and 4 ranks;
  fsdp2     fully_shard on a two-layer transformer, with MixedPrecisionPolicy(param_dtype=bfloat16,
            reduce_dtype=float32), at 2 and 4 ranks;
  tp2d      a 2 x 2 DeviceMesh ("dp", "tp"): DTensor tensor parallelism (ColwiseParallel, RowwiseParallel) on "tp"
            and fully_shard on "dp", at 4 ranks;
  dcp       torch.distributed.checkpoint: the fsdp2 model's sharded state saved after 3 steps, loaded into a fresh
            model, 3 more steps: the same as 6 steps straight, at 2 ranks.
First, torchrun (this interpreter's) launches tests/torch/torchrun_job.py on 4 ranks of loom, as the README does.
At 2 ranks every sum is a + b in either library, so the results must be bitwise equal; at 4 ranks the two reduce in
a different order, so they must agree within 1e-6 relative (the test prints which held). Exits 77 (skipped) when
this interpreter's torch is not 2.x or cannot import loom_torch.
"""
import datetime
import os
import subprocess
import sys
import tempfile
import time

from ranks import plugin_dir, run_ranks

CLIENTS = {"ddp": (2, 4), "fsdp2": (2, 4), "tp2d": (4,), "dcp": (2,)}  # client: rank counts
STEPS = 6


def launch(client, backend, size, out, timeout=600):
    return run_ranks(__file__, size, lambda r, store: [client, backend, str(r), str(size), store, out], timeout)


# ---------------------------------------------------------------------------------------------------------------
# Worker side.

def batches(torch, rank, steps, shape):
    gen = torch.Generator().manual_seed(1000 + rank)
    return [torch.randn(*shape, generator=gen) for _ in range(steps)]


def transformer(torch, seed=0):
    torch.manual_seed(seed)

    class Block(torch.nn.Module):
        def __init__(self, dim=32, hidden=64):
            super().__init__()
            self.norm = torch.nn.LayerNorm(dim)
            self.attn = torch.nn.MultiheadAttention(dim, 4, batch_first=True)
            self.w1 = torch.nn.Linear(dim, hidden)
            self.w2 = torch.nn.Linear(hidden, dim)

        def forward(self, x):
            h = self.norm(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.w2(torch.nn.functional.gelu(self.w1(x)))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block(), Block()])
            self.head = torch.nn.Linear(32, 8)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x).mean(dim=1)

    return Model()


def full_params(model):
    """Every parameter whole (DTensors gathered), in a fixed order, as one float64 vector."""
    import torch
    flat = []
    for _, p in sorted(model.named_parameters()):
        t = p.detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        flat.append(t.to(torch.float64).reshape(-1))
    return torch.cat(flat)


def optimizer(torch, model):
    """SGD with momentum: its step is proportional to the gradient, so a last-bit difference stays one (AdamW's
    normalised step turns one on a near-zero gradient into a whole step)."""
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def train(torch, model, rank, steps, start=0):
    opt = optimizer(torch, model)
    data = batches(torch, rank, start + steps, (4, 6, 32))[start:]
    targets = batches(torch, rank + 100, start + steps, (4, 8))[start:]
    losses = []
    for x, y in zip(data, targets):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().to(torch.float64))
    return torch.stack(losses), opt


def worker(client, backend, rank, size, store, out):
    import torch
    import torch.distributed as dist
    import loom_torch  # noqa: F401  (registers the backend)

    dist.init_process_group(backend, init_method="file://" + store, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=120))
    torch.manual_seed(0)
    if client == "ddp":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model = transformer(torch)
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)
        ddp.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)
        losses, _ = train(torch, ddp, rank, STEPS)
        params = full_params(model)
    elif client == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        model = transformer(torch)
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.blocks:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        losses, _ = train(torch, model, rank, STEPS)
        params = full_params(model)
    elif client == "tp2d":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        model = transformer(torch)
        for block in model.blocks:
            parallelize_module(block, mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        # Ranks of one "tp" group see the same data: the data-parallel rank picks it.
        losses, _ = train(torch, model, mesh["dp"].get_local_rank(), STEPS)
        params = full_params(model)
    elif client == "dcp":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
        from torch.distributed.fsdp import fully_shard

        def sharded():
            model = transformer(torch)
            for block in model.blocks:
                fully_shard(block)
            fully_shard(model)
            return model
        directory = out + ".dcp"
        first = sharded()
        losses_a, opt = train(torch, first, rank, STEPS // 2)
        model_state, optim_state = get_state_dict(first, opt)
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=directory)
        second = sharded()
        opt2 = optimizer(torch, second)
        model_state, optim_state = get_state_dict(second, opt2)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=directory)
        set_state_dict(second, opt2, model_state_dict=state["model"], optim_state_dict=state["optim"])
        # The loaded optimizer goes on: train() makes a new one, so step by hand here.
        data = batches(torch, rank, STEPS, (4, 6, 32))[STEPS // 2:]
        targets = batches(torch, rank + 100, STEPS, (4, 8))[STEPS // 2:]
        losses_b = []
        for x, y in zip(data, targets):
            opt2.zero_grad()
            loss = torch.nn.functional.mse_loss(second(x), y)
            loss.backward()
            opt2.step()
            losses_b.append(loss.detach().to(torch.float64))
        losses = torch.cat([losses_a, torch.stack(losses_b)])
        params = full_params(second)
        # The same 6 steps without the checkpoint, for the comparison.
        straight = sharded()
        straight_losses, _ = train(torch, straight, rank, STEPS)
        straight_params = full_params(straight)  # a collective: every rank
        if rank == 0:
            torch.save({"losses": straight_losses, "params": straight_params}, out + ".straight")
    else:
        raise SystemExit("unknown client " + client)
    if rank == 0:
        torch.save({"losses": losses, "params": params}, out)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # not sys.exit: torch 2.15's interpreter exit after gloo groups sometimes aborts


# ---------------------------------------------------------------------------------------------------------------
# Driver side.

def compare(torch, a, b, bitwise):
    """'bitwise equal', 'within 1e-6 relative (X)' or None when neither holds as required. Relative is the norm of
    the difference over the norm of gloo's (element by element, a weight near zero makes any ratio)."""
    if torch.equal(a, b):
        return "bitwise equal"
    relative = ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
    if bitwise:
        print("  differs: %.3g relative" % relative)
        return None
    if relative > 1e-6:
        print("  differs: %.3g relative" % relative)
        return None
    return "within 1e-6 relative (%.2g)" % relative


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7])
        return 0
    build = os.path.abspath(sys.argv[1])
    wanted = sys.argv[2:] or list(CLIENTS)
    os.environ["PYTHONPATH"] = plugin_dir(build, 2) + os.pathsep + \
        os.environ.get("PYTHONPATH", "")
    os.environ["LD_LIBRARY_PATH"] = build + os.pathsep + os.environ.get("LD_LIBRARY_PATH", "")
    probe = subprocess.run([sys.executable, "-c", "import torch, loom_torch; assert torch.__version__ >= '2'"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        print("skipped: this interpreter cannot import a torch 2.x and loom_torch:",
              probe.stderr.strip().splitlines()[-1:])
        return 77
    import torch
    print("torch", torch.__version__)
    status = 0
    # torchrun, as the README writes it (the torch it names is this interpreter's: its bin/torchrun).
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    if os.path.exists(torchrun):
        job = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchrun_job.py")
        run = subprocess.run([torchrun, "--nproc_per_node", "4", job], capture_output=True, text=True, timeout=300,
                             env=dict(os.environ, PYTHONWARNINGS="ignore"))
        said = [line for line in run.stdout.splitlines() if line.startswith("torchrun job:")]
        print(said[0] if said else "torchrun: FAILED (exit %d)\n%s" % (run.returncode, run.stderr[-3000:]))
        if run.returncode != 0 or not said or "on loom" not in said[0]:
            status = 1
    work = tempfile.mkdtemp(prefix="loom-clients-")
    for client in wanted:
        for size in CLIENTS[client]:
            results = {}
            for backend in ("loom", "gloo"):
                out = os.path.join(work, "%s-%d-%s.pt" % (client, size, backend))
                start = time.time()
                codes, outputs = launch(client, backend, size, out)
                if any(codes):
                    print("%s at %d ranks on %s: FAILED (exit codes %s)" % (client, size, backend, codes))
                    for text in outputs:
                        print(text[-3000:])
                    status = 1
                    break
                results[backend] = torch.load(out)
                results[backend]["seconds"] = time.time() - start
                if client == "dcp":
                    results[backend]["straight"] = torch.load(out + ".straight")
            if len(results) < 2:
                continue
            bitwise = size == 2
            verdicts = [compare(torch, results["loom"][key], results["gloo"][key], bitwise)
                        for key in ("losses", "params")]
            line = "%s at %d ranks: losses %s, parameters %s (loom %.1f s, gloo %.1f s; last loss %.6f)" % (
                client, size, verdicts[0], verdicts[1], results["loom"]["seconds"], results["gloo"]["seconds"],
                results["loom"]["losses"][-1].item())
            if client == "dcp":  # resumed from the checkpoint = trained straight through, on loom
                resumed = compare(torch, results["loom"]["params"], results["loom"]["straight"]["params"], True)
                line += "; resumed from the checkpoint vs straight: %s" % resumed
                verdicts.append(resumed)
            print(line)
            if any(v is None for v in verdicts):
                status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())

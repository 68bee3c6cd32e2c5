#!/usr/bin/env python3
"""A job for torchrun, as the README launches one: every rank joins the backend "loom" from torchrun's variables,
all-reduces its rank, and rank 0 prints the sum and the backend."""
import torch
import torch.distributed as dist
import loom_torch  # noqa: F401  (registers the backend)

dist.init_process_group("loom")
t = torch.full((1024,), float(dist.get_rank()))
dist.all_reduce(t)
size = dist.get_world_size()
assert torch.equal(t, torch.full((1024,), float(size * (size - 1) // 2))), t[:4]
if dist.get_rank() == 0:
    print("torchrun job: %d ranks on %s, all_reduce of the ranks = %d" % (size, dist.get_backend(), int(t[0])))
dist.destroy_process_group()

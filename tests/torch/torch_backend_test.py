#!/usr/bin/python3
"""The torch.distributed backend "loom" (plugins/torch) against gloo and against results computed locally.

  tests/torch/torch_backend_test.py BUILD_DIR

Runs, each as processes of one host meeting through a file (torch's FileStore):
  - every operation at 2 and 4 ranks (and at 2 with every tensor staged through host copies, the path of CUDA
    tensors: LOOM_TORCH_STAGE=1), for every dtype the operation takes on the CPU, on inputs each rank can
    compute for every other: loom's result against the expected one computed here in float64 (exact for integers),
    and against gloo's on the same inputs where gloo has the operation (what gloo refused is listed); receiving
    from any source; a message of the wrong size refused, naming both sizes, and the next one taken;
  - torch DDP training a small model for 20 steps with backend "loom" and with "gloo" (same seed, data and order):
    the same parameters;
  - on torch 2.x, abort() ending an all_reduce the peer never joins, and split_group into pairs;
  - loom_torch.set_deterministic(True): all_reduce and reduce at 4 ranks equal the sum in rank order bit for bit
    (float32, float64), and LOOM_ALGO=allreduce:ring with it is refused when the group is made;
  - a peer killed before an all_reduce: the survivor's all_reduce raises within the group's timeout.
Exits 77 (skipped) when torch or loom_torch cannot be imported.
"""
import datetime
import os
import subprocess
import sys
import time
import warnings

import ranks
from ranks import run_ranks

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64", "bool"]
REDUCING = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64"]
OPS = ["SUM", "PRODUCT", "MIN", "MAX"]
TORCH2 = False  # set in the worker


def plugin_dir(build):
    """Where loom_torch is built for the torch this interpreter imports: 1.13 or 2.x."""
    try:
        import torch
        major = int(torch.__version__.split(".")[0])
    except ImportError:
        major = 1
    return ranks.plugin_dir(build, major)


def launch(mode, size, timeout=300, extra=()):
    return run_ranks(__file__, size, lambda r, store: [mode, str(r), str(size), store, *extra], timeout)


# ---------------------------------------------------------------------------------------------------------------
# Worker side.

def leave(code):
    """Ends a worker whose groups are destroyed. Not sys.exit: torch 2.15's interpreter exit after a gloo group
    sometimes aborts ("terminate called without an active exception"), with or without loom_torch imported."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

def worker(mode, rank, size, store):
    global TORCH2
    import torch
    TORCH2 = int(torch.__version__.split(".")[0]) >= 2
    import torch.distributed as dist
    import loom_torch  # noqa: F401  (registers the backend)

    def init(backend, seconds=60):
        dist.init_process_group(backend, init_method="file://" + store, rank=rank, world_size=size,
                                timeout=datetime.timedelta(seconds=seconds))

    if mode == "ops":
        init("gloo")
        loom = dist.new_group(list(range(size)), backend="loom")
        gloo = dist.new_group(list(range(size)), backend="gloo")
        failures, checked, gloo_checked = run_ops(torch, dist, rank, size, loom, gloo)
        # A message of another size than the receive: the receive fails naming both, and the link goes on.
        if rank == 0:
            dist.send(torch.ones(5), 1, group=loom)
            dist.send(torch.full((7,), 2.0), 1, group=loom)
        elif rank == 1:
            try:
                dist.recv(torch.zeros(7), 0, group=loom)
                failures.append("a 5-element message went into a 7-element receive without an error")
            except RuntimeError as error:
                if "sent 20 bytes; this receive takes 28" not in str(error):
                    failures.append("the wrong-size receive said: %s" % str(error)[:300])
            after = torch.zeros(7)
            dist.recv(after, 0, group=loom)
            if not torch.equal(after, torch.full((7,), 2.0)):
                failures.append("the message after a wrong-size one arrived as %s" % after.tolist())
            checked += 2
        print("rank %d: %d results checked, %d of them also against gloo (the others: gloo refused them)" % (
            rank, checked, gloo_checked))
        for f in failures[:20]:
            print("FAIL", f)
        dist.barrier()
        dist.destroy_process_group()
        leave(1 if failures else 0)
    if mode == "ddp":
        backend = sys.argv[6]
        init(backend)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)  # several buckets
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        gen = torch.Generator().manual_seed(100 + rank)
        for _ in range(20):
            x = torch.randn(8, 16, generator=gen)
            y = torch.randn(8, 4, generator=gen)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
        if rank == 0:
            flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            torch.save(flat, sys.argv[7])
        dist.destroy_process_group()
        leave(0)
    if mode == "abort":  # torch 2.x: ProcessGroup.abort ends a call its peer never joins
        init("loom", 60)
        t = torch.ones(1024)
        dist.all_reduce(t)
        if rank == 1:
            time.sleep(4)  # never joins the second all_reduce
            leave(0)
        work = dist.all_reduce(t, async_op=True)
        time.sleep(0.5)
        start = time.time()
        dist.group.WORLD.abort()
        try:
            work.wait()
        except RuntimeError as error:
            print("raised %.1f s after abort(): %s" % (time.time() - start, str(error).splitlines()[0][:200]))
            leave(0 if time.time() - start < 5 else 1)
        print("no exception")
        leave(1)
    if mode == "split":  # torch 2.x: split_group makes loom subgroups of the pairs (0, 1) and (2, 3)
        init("loom")
        t = torch.ones(16)
        dist.all_reduce(t)  # the parent joined
        pair = dist.split_group(split_ranks=[[0, 1], [2, 3]])
        t = torch.full((16,), float(rank))
        dist.all_reduce(t, group=pair)
        want = float(sum(r for r in range(size) if r // 2 == rank // 2))
        print("rank %d: pair sum %s (want %s)" % (rank, t[0].item(), want))
        dist.destroy_process_group()
        leave(0 if torch.equal(t, torch.full((16,), want)) else 1)
    if mode == "deterministic":  # loom_torch.set_deterministic: sums in rank order, bit for bit
        if loom_torch.deterministic() is not None:
            print("deterministic() is %r before set_deterministic" % loom_torch.deterministic())
            leave(1)
        loom_torch.set_deterministic(True)
        expect_refusal = sys.argv[6] == "refused"
        try:
            init("loom")
        except RuntimeError as error:
            said = str(error)
            print("init refused: %s" % said.splitlines()[0][:300])
            leave(0 if expect_refusal and "no algorithm that reduces in rank order" in said else 1)
        if expect_refusal:
            print("init took LOOM_ALGO=%s with set_deterministic(True)" % os.environ.get("LOOM_ALGO"))
            leave(1)
        failures = []
        for dtype in (torch.float32, torch.float64):
            inputs = []
            for r in range(size):  # every rank's input, on every rank: values over six decades, both signs
                gen = torch.Generator().manual_seed(1000 + r)
                scale = torch.pow(10.0, torch.randint(-3, 4, (100003,), generator=gen).to(torch.float64))
                inputs.append((torch.randn(100003, generator=gen, dtype=torch.float64) * scale).to(dtype))
            want = inputs[0].clone()
            for r in range(1, size):
                want += inputs[r]  # ((x0 + x1) + x2) ...: the order loom promises
            got = inputs[rank].clone()
            dist.all_reduce(got)
            if not torch.equal(got, want):
                failures.append("all_reduce %s: %d elements differ from rank order" % (dtype, int((got != want).sum())))
            reduced = inputs[rank].clone()
            dist.reduce(reduced, dst=size - 1)
            if rank == size - 1 and not torch.equal(reduced, want):
                failures.append("reduce %s: %d elements differ from rank order" % (dtype, int((reduced != want).sum())))
        print("rank %d: all_reduce and reduce in rank order: %s" % (rank, "; ".join(failures) or "bit for bit"))
        dist.destroy_process_group()
        leave(1 if failures else 0)
    if mode == "kill":
        seconds = int(sys.argv[6])
        init("loom", seconds)
        t = torch.ones(1024)
        dist.all_reduce(t)  # both alive
        if rank == 1:
            os._exit(0)  # dies without a word
        start = time.time()
        try:
            dist.all_reduce(t)
        except RuntimeError as error:
            print("raised after %.1f s: %s" % (time.time() - start, str(error).splitlines()[0][:200]))
            os._exit(0)
        print("no exception")
        os._exit(1)


def values(torch, dtype_name, rank, n, salt):
    """Rank `rank`'s input for an operation: small values, so that products and sums stay exact in every type."""
    import torch as t
    dtype = getattr(t, dtype_name)
    base = (t.arange(n, dtype=t.int64) * 7 + rank * 13 + salt * 3) % 5
    if dtype_name == "bool":
        return (base % 2 == 1)
    if dtype_name.startswith("float") or dtype_name == "bfloat16":
        return ((base.to(t.float64) - 2) / 2).to(dtype)
    if dtype_name == "uint8":
        return base.to(dtype)
    return (base - 2).to(dtype)


def reduce_all(torch, inputs, op):
    acc = inputs[0].to(torch.float64)
    for x in inputs[1:]:
        x = x.to(torch.float64)
        acc = {"SUM": acc + x, "PRODUCT": acc * x, "MIN": torch.minimum(acc, x), "MAX": torch.maximum(acc, x)}[op]
    return acc


def close(torch, got, want, dtype_name):
    if dtype_name == "bool":
        return torch.equal(got, want.to(torch.bool))
    got = got.to(torch.float64)
    want = want.to(torch.float64)
    if dtype_name in ("int8", "uint8", "int32", "int64"):
        return torch.equal(got, want)
    tolerance = {"float32": 1e-6, "float64": 1e-12, "float16": 2e-3, "bfloat16": 2e-2}[dtype_name]
    return bool(torch.allclose(got, want, rtol=tolerance, atol=tolerance))


def run_ops(torch, dist, rank, size, loom, gloo):
    failures = []
    counts = [0, 0]
    refused = set()

    def check(name, dtype_name, compute, want):
        """compute(group) returns a tensor (or list); checks loom's against want, and gloo's when gloo has it."""
        if os.environ.get("LOOM_TORCH_TRACE"): print(name, dtype_name, flush=True)
        got = compute(loom)
        gots = got if isinstance(got, list) else [got]
        wants = want if isinstance(want, list) else [want]
        counts[0] += 1
        if len(gots) != len(wants) or not all(close(torch, g, w, dtype_name) for g, w in zip(gots, wants)):
            failures.append("%s %s on rank %d: loom %s, expected %s" % (name, dtype_name, rank,
                                                                      [g.tolist() for g in gots][:4],
                                                                      [w.tolist() for w in wants][:4]))
            return
        try:
            reference = compute(gloo)
        except (RuntimeError, ValueError) as error:  # gloo has no such operation for this type: listed
            refused.add("%s %s (%s)" % (name, dtype_name, str(error).splitlines()[0][:80]))
            return
        refs = reference if isinstance(reference, list) else [reference]
        counts[1] += 1
        if not all(close(torch, g, r.to(torch.float64) if dtype_name != "bool" else r, dtype_name)
                   for g, r in zip(gots, refs)):
            failures.append("%s %s on rank %d: loom differs from gloo" % (name, dtype_name, rank))

    n = 37
    root = size - 1
    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        mine = values(torch, dtype_name, rank, n, 0)
        every = [values(torch, dtype_name, r, n, 0) for r in range(size)]

        def broadcast(group):
            t = mine.clone()
            dist.broadcast(t, src=root, group=group)
            return t
        check("broadcast", dtype_name, broadcast, every[root])

        def all_gather(group):
            out = [torch.zeros(n, dtype=dtype) for _ in range(size)]
            dist.all_gather(out, mine, group=group)
            return out
        check("all_gather", dtype_name, all_gather, every)

        def all_gather_base(group):
            out = torch.zeros(n * size, dtype=dtype)
            dist._all_gather_base(out, mine, group=group)
            return out
        check("_all_gather_base", dtype_name, all_gather_base, torch.cat(every))

        def gather(group):
            out = [torch.zeros(n, dtype=dtype) for _ in range(size)] if rank == root else None
            dist.gather(mine, out, dst=root, group=group)
            return out if rank == root else mine
        check("gather", dtype_name, gather, every if rank == root else mine)

        def scatter(group):
            out = torch.zeros(n, dtype=dtype)
            dist.scatter(out, [values(torch, dtype_name, r, n, 1) for r in range(size)] if rank == root else None,
                         src=root, group=group)
            return out
        check("scatter", dtype_name, scatter, values(torch, dtype_name, rank, n, 1))

        # all_to_all_single with uneven splits: rank r sends (r + p) % 3 + 1 rows of 3 to each p.
        splits = lambda r: [(r + p) % 3 + 1 for p in range(size)]
        rows = lambda r: torch.cat([values(torch, dtype_name, r * 100 + p, splits(r)[p] * 3, 2) for p in range(size)])

        def all_to_all_single(group):
            out = torch.zeros(sum(splits(p)[rank] for p in range(size)) * 3, dtype=dtype)
            dist.all_to_all_single(out.view(-1, 3), rows(rank).view(-1, 3),
                                   output_split_sizes=[splits(p)[rank] for p in range(size)],
                                   input_split_sizes=splits(rank), group=group)
            return out
        check("all_to_all_single", dtype_name, all_to_all_single,
              torch.cat([values(torch, dtype_name, p * 100 + rank, splits(p)[rank] * 3, 2) for p in range(size)]))

        def all_to_all(group):
            out = [torch.zeros(splits(p)[rank], dtype=dtype) for p in range(size)]
            dist.all_to_all(out, [values(torch, dtype_name, rank * 10 + p, splits(rank)[p], 3) for p in range(size)],
                            group=group)
            return out
        check("all_to_all", dtype_name, all_to_all,
              [values(torch, dtype_name, p * 10 + rank, splits(p)[rank], 3) for p in range(size)])

        def ring(group):
            out = torch.zeros(n, dtype=dtype)
            right, left = (rank + 1) % size, (rank - 1) % size
            send = dist.isend(mine, right, group=group)
            dist.recv(out, left, group=group)
            send.wait()
            return out
        check("send/recv", dtype_name, ring, every[(rank - 1) % size])

        def ring_receiving_first(group):  # the receive posted first, then a blocking send
            out = torch.zeros(n, dtype=dtype)
            right, left = (rank + 1) % size, (rank - 1) % size
            receive = dist.irecv(out, right, group=group)
            dist.send(mine, left, group=group)
            receive.wait()
            return out
        check("irecv/send", dtype_name, ring_receiving_first, every[(rank + 1) % size])

        if dtype_name not in REDUCING:
            continue
        for op in OPS:
            red = getattr(dist.ReduceOp, op)
            want = reduce_all(torch, every, op)

            def all_reduce(group):
                t = mine.clone()
                dist.all_reduce(t, op=red, group=group)
                return t
            check("all_reduce " + op, dtype_name, all_reduce, want)

            def all_reduce_async(group):
                t = mine.clone()
                work = dist.all_reduce(t, op=red, group=group, async_op=True)
                return work.get_future().wait()[0]
            check("all_reduce future " + op, dtype_name, all_reduce_async, want)

            def reduce(group):  # the result on the root; elsewhere nothing to check
                t = mine.clone()
                dist.reduce(t, dst=root, op=red, group=group)
                return t if rank == root else torch.zeros(0)
            check("reduce " + op, dtype_name, reduce, want if rank == root else torch.zeros(0))

            def coalesced(group):
                a, b = mine.clone(), values(torch, dtype_name, rank, 5, 4)
                dist.all_reduce_coalesced([a, b], op=red, group=group)
                return [a, b]
            check("all_reduce_coalesced " + op, dtype_name, coalesced,
                  [want, reduce_all(torch, [values(torch, dtype_name, r, 5, 4) for r in range(size)], op)])

            chunk = 6
            inputs = lambda r: [values(torch, dtype_name, r * size + p, chunk, 5) for p in range(size)]
            want_rs = reduce_all(torch, [inputs(r)[rank] for r in range(size)], op)

            def reduce_scatter(group):
                out = torch.zeros(chunk, dtype=dtype)
                dist.reduce_scatter(out, inputs(rank), op=red, group=group)
                return out
            check("reduce_scatter " + op, dtype_name, reduce_scatter, want_rs)

            def reduce_scatter_base(group):
                out = torch.zeros(chunk, dtype=dtype)
                dist._reduce_scatter_base(out, torch.cat(inputs(rank)), op=red, group=group)
                return out
            check("_reduce_scatter_base " + op, dtype_name, reduce_scatter_base, want_rs)

    # Coalesced all-gathers and reduce-scatters: lists of inputs of different sizes, each list of one type (as
    # torch requires), in one call.
    for dtype_name in ("float32", "int64", "bool"):
        sizes = (5, 3, 4)
        mixed = [values(torch, dtype_name, rank, k, 6 + j) for j, k in enumerate(sizes)]
        every_mixed = [[values(torch, dtype_name, r, k, 6 + j) for r in range(size)] for j, k in enumerate(sizes)]

        def all_gather_coalesced(group, mixed=mixed):  # outs[r][j]: rank r's input j
            outs = [[torch.zeros_like(t) for t in mixed] for _ in range(size)]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # deprecated in 2.x, still handed to backends
                dist.all_gather_coalesced(outs, mixed, group=group)
            return [t for out in outs for t in out]
        check("all_gather_coalesced", dtype_name, all_gather_coalesced,
              [every_mixed[j][r] for r in range(size) for j in range(len(sizes))])
        if not TORCH2:
            continue

        def all_gather_into_tensor_coalesced(group, mixed=mixed):
            outs = [torch.zeros(t.numel() * size, dtype=t.dtype) for t in mixed]
            group.allgather_into_tensor_coalesced(outs, mixed).wait()
            return outs
        check("allgather_into_tensor_coalesced", dtype_name, all_gather_into_tensor_coalesced,
              [torch.cat(e) for e in every_mixed])
        if dtype_name == "bool":
            continue
        parts = lambda r, k, j: torch.cat([values(torch, dtype_name, r * size + p, k, 9 + j) for p in range(size)])

        def reduce_scatter_tensor_coalesced(group):
            ins = [parts(rank, k, j) for j, k in enumerate(sizes)]
            outs = [torch.zeros(k, dtype=getattr(torch, dtype_name)) for k in sizes]
            group.reduce_scatter_tensor_coalesced(outs, ins).wait()
            return outs
        check("reduce_scatter_tensor_coalesced", dtype_name, reduce_scatter_tensor_coalesced,
              [reduce_all(torch, [parts(r, k, j).narrow(0, rank * k, k) for r in range(size)], "SUM")
               for j, k in enumerate(sizes)])

    if TORCH2:
        # uint32 and uint64 (torch 2.3 on): moved, and reduced by loom.
        for name in ("uint32", "uint64"):
            dtype = getattr(torch, name)
            mine_u = values(torch, "uint8", rank, n, 10).to(dtype)
            every_u = [values(torch, "uint8", r, n, 10).to(torch.int64) for r in range(size)]

            def all_reduce_u(group, dtype=dtype, mine_u=mine_u):
                t = mine_u.clone()
                dist.all_reduce(t, group=group)
                return t.to(torch.int64)
            check("all_reduce SUM (%s)" % name, "int64", lambda g: all_reduce_u(g), reduce_all(torch, every_u, "SUM"))

    # AVG, PREMUL_SUM, complex through the real view, bool reduced, the bitwise ops.
    floats = values(torch, "float64", rank, n, 11)
    every_f = [values(torch, "float64", r, n, 11) for r in range(size)]

    def all_reduce_with(op, t):
        def run(group):
            x = t.clone()
            dist.all_reduce(x, op=op, group=group)
            return x
        return run
    check("all_reduce AVG", "float64", all_reduce_with(dist.ReduceOp.AVG, floats),
          reduce_all(torch, every_f, "SUM") / size)
    check("all_reduce PREMUL_SUM", "float64", all_reduce_with(dist._make_nccl_premul_sum(0.5), floats),
          reduce_all(torch, every_f, "SUM") * 0.5)
    complexes = torch.complex(floats, values(torch, "float64", rank, n, 12))
    want_c = reduce_all(torch, [torch.view_as_real(torch.complex(every_f[r], values(torch, "float64", r, n, 12)))
                                for r in range(size)], "SUM")
    check("all_reduce SUM (complex128)", "float64",
          lambda g: torch.view_as_real(all_reduce_with(dist.ReduceOp.SUM, complexes)(g)), want_c)
    flags = values(torch, "bool", rank, n, 13)
    every_b = [values(torch, "bool", r, n, 13) for r in range(size)]
    for op, fn in (("MAX", torch.logical_or), ("MIN", torch.logical_and), ("SUM", torch.logical_or),
                   ("PRODUCT", torch.logical_and)):
        want_b = every_b[0]
        for b in every_b[1:]:
            want_b = fn(want_b, b)
        check("all_reduce %s (bool)" % op, "bool", all_reduce_with(getattr(dist.ReduceOp, op), flags), want_b)
    for dtype_name in ("int32", "uint8", "int64", "bool"):
        mine_i = values(torch, dtype_name, rank, n, 14)
        every_i = [values(torch, dtype_name, r, n, 14) for r in range(size)]
        for op, fn in (("BAND", torch.bitwise_and), ("BOR", torch.bitwise_or), ("BXOR", torch.bitwise_xor)):
            want_i = every_i[0]
            for x in every_i[1:]:
                want_i = fn(want_i, x)
            red = getattr(dist.ReduceOp, op)
            check("all_reduce " + op, dtype_name, all_reduce_with(red, mine_i), want_i)

            def reduce_bitwise(group, red=red, mine_i=mine_i):
                t = mine_i.clone()
                dist.reduce(t, dst=root, op=red, group=group)
                return t if rank == root else mine_i
            check("reduce " + op, dtype_name, reduce_bitwise, want_i if rank == root else mine_i)

            chunks = lambda r: [values(torch, dtype_name, r * size + p, 6, 15) for p in range(size)]
            want_rs = chunks(0)[rank]
            for r in range(1, size):
                want_rs = fn(want_rs, chunks(r)[rank])

            def reduce_scatter_bitwise(group, red=red):
                out = torch.zeros(6, dtype=getattr(torch, dtype_name))
                dist.reduce_scatter(out, chunks(rank), op=red, group=group)
                return out
            check("reduce_scatter " + op, dtype_name, reduce_scatter_bitwise, want_rs)

    # Receiving from any source: every rank sends a tensor naming itself to every other, then takes size - 1
    # messages from whoever comes first; the senders and contents must be exactly the others'.
    def any_source(group):
        sends = [dist.isend(torch.full((7,), float(rank)), p, group=group) for p in range(size) if p != rank]
        got = []
        for _ in range(size - 1):
            t = torch.zeros(7)
            source = dist.recv(t, group=group)  # src=None: any source
            got.append(torch.tensor([float(source), t[0].item(), float(bool(torch.all(t == t[0])))]))
        for work in sends:
            work.wait()
        return sorted(got, key=lambda row: row[0].item())
    check("recv from any source", "float32", any_source,
          [torch.tensor([float(p), float(p), 1.0]) for p in range(size) if p != rank])

    def barrier(group):
        dist.barrier(group=group)
        return torch.ones(1)
    check("barrier", "float32", barrier, torch.ones(1))
    if rank == 0:
        for what in sorted(refused):
            print("gloo refused:", what)
    return failures, counts[0], counts[1]


# ---------------------------------------------------------------------------------------------------------------
# Driver side.

def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        return 0
    build = os.path.abspath(sys.argv[1])
    os.environ["PYTHONPATH"] = plugin_dir(build) + os.pathsep + os.environ.get("PYTHONPATH", "")
    os.environ["LD_LIBRARY_PATH"] = build + os.pathsep + os.environ.get("LD_LIBRARY_PATH", "")
    probe = subprocess.run([sys.executable, "-c", "import torch, loom_torch"], capture_output=True, text=True)
    if probe.returncode != 0:
        print("skipped: cannot import torch and loom_torch:", probe.stderr.strip().splitlines()[-1:])
        return 77
    status = 0
    # The last run: every tensor through host copies, as CUDA tensors go (LOOM_TORCH_STAGE=1 stages CPU ones too).
    for size, staged in ((2, False), (4, False), (2, True)):
        if staged:
            os.environ["LOOM_TORCH_STAGE"] = "1"
        codes, outputs = launch("ops", size)
        os.environ.pop("LOOM_TORCH_STAGE", None)
        ok = all(c == 0 for c in codes)
        print("ops at %d ranks%s: %s; %s" % (size, ", every tensor staged" if staged else "", "ok" if ok else "FAILED",
                                            outputs[0].strip().splitlines()[-1:]))
        if not ok:
            status = 1
            for out in outputs:
                print(out[-3000:])
    params = {}
    for backend in ("loom", "gloo"):
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "loom-ddp-%s-%d.pt" % (backend, os.getpid()))
        codes, outputs = launch("ddp", 2, extra=(backend, path))
        if any(codes):
            print("DDP with %s FAILED" % backend)
            print("\n".join(o[-2000:] for o in outputs))
            return 1
        import torch
        params[backend] = torch.load(path)
        os.remove(path)
    import torch
    difference = (params["loom"] - params["gloo"]).abs().max().item()
    print("DDP, 2 ranks, 20 steps: parameters differ by at most %.3g between loom and gloo" % difference)
    if not torch.equal(params["loom"], params["gloo"]):  # two ranks: every sum is a + b, the same bits
        status = 1
    if int(torch.__version__.split(".")[0]) >= 2:
        codes, outputs = launch("abort", 2, timeout=120)
        print("abort(): %s" % outputs[0].strip().splitlines()[-1:])
        if any(codes) or "raised" not in outputs[0]:
            status = 1
            print(outputs[0][-2000:])
        codes, outputs = launch("split", 4, timeout=120)
        print("split_group: %s" % "; ".join(o.strip().splitlines()[-1] for o in outputs if o.strip()))
        if any(codes):
            status = 1
            print("\n".join(o[-2000:] for o in outputs))
    # loom_torch.set_deterministic(True): rank order at 4 ranks; refused at init under LOOM_ALGO=allreduce:ring.
    for algo, expect in (("", "taken"), ("allreduce:ring", "refused")):
        os.environ["LOOM_ALGO"] = algo
        codes, outputs = launch("deterministic", 4, timeout=300, extra=(expect,))
        os.environ.pop("LOOM_ALGO")
        print("set_deterministic%s: %s" % (" with LOOM_ALGO=" + algo if algo else "",
                                           outputs[0].strip().splitlines()[-1:]))
        if any(codes):
            status = 1
            print("\n".join(o[-2000:] for o in outputs))
    seconds = 10
    start = time.time()
    codes, outputs = launch("kill", 2, timeout=4 * seconds, extra=(str(seconds),))
    elapsed = time.time() - start
    print("killed peer: survivor %s (%.1f s in all, timeout %d s)" % (outputs[0].strip().splitlines()[-1:], elapsed,
                                                                       seconds))
    if codes[0] != 0 or "raised" not in outputs[0] or elapsed > 3 * seconds:
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())

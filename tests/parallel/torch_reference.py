#!/usr/bin/python3
"""The reference GPT checked against PyTorch on the same weights.

    torch_reference.py GPT_DUMP

Runs GPT_DUMP (tests/parallel/gpt_dump.cc) into a temporary directory, builds the same model in PyTorch from the
loom checkpoint it wrote (docs/DESIGN.md, "Checkpoints"), and compares, in fp32: the logits and the loss of one
forward (relative 1e-5), every parameter's gradient (relative 1e-4, as a whole tensor), and the losses before each
of 10 AdamW steps with gradient clipping (relative 1e-5). Exits 77 (skipped) when python3 cannot import torch
(Debian's python3-torch).
"""
import math
import os
import struct
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("torch_reference: python3 cannot import torch (install python3-torch): skipped")
    sys.exit(77)


def read_checkpoint(path):
    data = open(path, "rb").read()
    if data[:8] != b"LOOMCKPT":
        raise SystemExit(f"{path}: not a loom checkpoint")
    version, header = struct.unpack_from("<II", data, 8)
    layers, heads, channels, max_t, vocab = struct.unpack_from("<5i", data, 16)
    (count,) = struct.unpack_from("<Q", data, 40)
    if version != 1 or header != 64:
        raise SystemExit(f"{path}: version {version}, expected 1")
    params = torch.frombuffer(bytearray(data), dtype=torch.float32, count=count, offset=64).clone()
    return dict(layers=layers, heads=heads, channels=channels, max_t=max_t, vocab=vocab), params


def parameter_shapes(cfg):
    """The model's parameters in loom's layout order (parallel/model/gpt.cc, GptLayout::of)."""
    c, v = cfg["channels"], cfg["vocab"]
    shapes = [("wte.weight", (v, c)), ("wpe.weight", (cfg["max_t"], c))]
    for layer in range(cfg["layers"]):
        p = f"h.{layer}."
        shapes += [(p + "ln_1.weight", (c,)), (p + "ln_1.bias", (c,)),
                   (p + "attn.c_attn.weight", (3 * c, c)), (p + "attn.c_attn.bias", (3 * c,)),
                   (p + "attn.c_proj.weight", (c, c)), (p + "attn.c_proj.bias", (c,)),
                   (p + "ln_2.weight", (c,)), (p + "ln_2.bias", (c,)),
                   (p + "mlp.c_fc.weight", (4 * c, c)), (p + "mlp.c_fc.bias", (4 * c,)),
                   (p + "mlp.c_proj.weight", (c, 4 * c)), (p + "mlp.c_proj.bias", (c,))]
    shapes += [("ln_f.weight", (c,)), ("ln_f.bias", (c,))]
    return shapes


def split(flat, shapes):
    tensors, offset = {}, 0
    for name, shape in shapes:
        count = math.prod(shape)
        tensors[name] = flat[offset:offset + count].view(shape).clone().requires_grad_(True)
        offset += count
    if offset != flat.numel():
        raise SystemExit(f"layout holds {offset} parameters, the checkpoint {flat.numel()}")
    return tensors


def forward(cfg, w, inputs, targets):
    """GPT-2's forward, written out: pre-norm blocks, causal attention, tanh GELU, head tied to wte."""
    b, t = inputs.shape
    c, nh = cfg["channels"], cfg["heads"]
    hs = c // nh
    x = w["wte.weight"][inputs] + w["wpe.weight"][:t]
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    for layer in range(cfg["layers"]):
        p = f"h.{layer}."
        h = F.layer_norm(x, (c,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps=1e-5)
        qkv = F.linear(h, w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"])
        q, k, v = qkv.split(c, dim=2)
        q, k, v = (z.view(b, t, nh, hs).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + F.linear(y, w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"])
        h = F.layer_norm(x, (c,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps=1e-5)
        h = F.gelu(F.linear(h, w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"]), approximate="tanh")
        x = x + F.linear(h, w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (c,), w["ln_f.weight"], w["ln_f.bias"], eps=1e-5)
    logits = x @ w["wte.weight"].t()
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
    return logits, loss


def relative(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    torch.set_num_threads(1)
    failures = []
    with tempfile.TemporaryDirectory() as work:
        subprocess.run([sys.argv[1], work], check=True)
        cfg, flat = read_checkpoint(os.path.join(work, "model.ckpt"))
        shapes = parameter_shapes(cfg)
        w = split(flat, shapes)

        def read(name, dtype):
            return torch.frombuffer(bytearray(open(os.path.join(work, name), "rb").read()), dtype=dtype).clone()

        inputs = read("inputs.bin", torch.int32).long().view(4, -1)
        targets = read("targets.bin", torch.int32).long().view(4, -1)
        logits, loss = forward(cfg, w, inputs, targets)
        loom_logits = read("logits.bin", torch.float32).view_as(logits)
        loom_loss = float(open(os.path.join(work, "loss.txt")).read())
        loss.backward()
        loom_grads = split(read("grads.bin", torch.float32), shapes)

        checks = [("logits", relative(loom_logits, logits.detach()), 1e-5),
                  ("loss", abs(loom_loss - loss.item()) / abs(loss.item()), 1e-5)]
        checks += [(f"gradient of {name}", relative(loom_grads[name].detach(), w[name].grad), 1e-4)
                   for name, _ in shapes]

        # 10 AdamW steps, weight decay on the matrices only, gradients clipped to norm 1.
        w = split(flat, shapes)
        decay = [w[name] for name, shape in shapes if len(shape) == 2]
        plain = [w[name] for name, shape in shapes if len(shape) != 2]
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                       {"params": plain, "weight_decay": 0.0}],
                                      lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
        torch_losses = []
        for _ in range(10):
            optimizer.zero_grad()
            _, step_loss = forward(cfg, w, inputs, targets)
            torch_losses.append(step_loss.item())
            step_loss.backward()
            torch.nn.utils.clip_grad_norm_(list(w.values()), 1.0)
            optimizer.step()
        loom_losses = [float(line) for line in open(os.path.join(work, "losses.txt"))]
        for step, (mine, theirs) in enumerate(zip(loom_losses, torch_losses)):
            checks.append((f"loss before AdamW step {step + 1}", abs(mine - theirs) / abs(theirs), 1e-5))
        if len(loom_losses) != 10:
            failures.append(f"losses.txt holds {len(loom_losses)} losses, expected 10")

    for what, error, tolerance in checks:
        status = "ok" if error <= tolerance else "FAILED"
        if error > tolerance:
            failures.append(what)
        print(f"{status:6} {what}: relative error {error:.2e} (at most {tolerance:.0e})")
    print(f"losses: loom {loom_losses[0]:.6f} -> {loom_losses[-1]:.6f}, "
          f"torch {torch_losses[0]:.6f} -> {torch_losses[-1]:.6f}")
    if failures:
        print("torch_reference: FAILED: " + ", ".join(failures))
        sys.exit(1)
    print("torch_reference: loom's GPT matches PyTorch")


if __name__ == "__main__":
    main()

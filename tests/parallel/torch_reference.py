#!/usr/bin/python3
"""The reference GPT checked against PyTorch on the same weights.

    torch_reference.py GPT_DUMP

Runs GPT_DUMP (tests/parallel/gpt_dump.cc) into a temporary directory, builds the same model in PyTorch from the
loom checkpoint it wrote (docs/PARALLEL.md, "Checkpoints"), and compares, in fp32: the logits and the loss of one
forward (relative 1e-5), every parameter's gradient (relative 1e-4, as a whole tensor), and the losses before each
of 10 AdamW steps with gradient clipping (relative 1e-5). Exits 77 (skipped) when python3 cannot import torch
(Debian's python3-torch).
"""
import os
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    print("torch_reference: python3 cannot import torch (install python3-torch): skipped")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from gpt_torch import adamw, forward, parameter_shapes, read_checkpoint, split  # noqa: E402


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
        optimizer = adamw(w, shapes, 1e-3)
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

"""The reference GPT in PyTorch, for the parallel layer's check (tests/parallel/torch_reference.py) and its
benchmark against PyTorch eager (tools/train-vs-torch): loom's checkpoint reader, its parameter layout, and
GPT-2's forward written out with the same conventions as parallel/model/gpt.cc."""
import math
import struct

import torch
import torch.nn.functional as F


def read_checkpoint(path):
    """The config and the flat fp32 parameters of a loom checkpoint (docs/PARALLEL.md, "Checkpoints")."""
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
    """Leaf tensors, one per parameter, from the flat buffer."""
    tensors, offset = {}, 0
    for name, shape in shapes:
        count = math.prod(shape)
        tensors[name] = flat[offset:offset + count].view(shape).clone().requires_grad_(True)
        offset += count
    if offset != flat.numel():
        raise SystemExit(f"layout holds {offset} parameters, the checkpoint {flat.numel()}")
    return tensors


def forward(cfg, w, inputs, targets):
    """GPT-2's forward: pre-norm blocks, causal attention, tanh GELU, head tied to wte. Returns logits, mean loss."""
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
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
    return logits, loss


def adamw(w, shapes, lr):
    """AdamW as loom's trainers set it up: weight decay 0.1 on matrices only, betas (0.9, 0.95), eps 1e-8."""
    decay = [w[name] for name, shape in shapes if len(shape) == 2]
    plain = [w[name] for name, shape in shapes if len(shape) != 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": plain, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8)

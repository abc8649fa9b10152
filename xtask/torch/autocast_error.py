"""PyTorch autocast's error on the same weights as `cargo xtask bench --suite autocast --torch`.

The Rust side writes one JSON file per model (Burn's parameter paths, shapes and values, the
input, the loss's targets and its own f32 output); this script rebuilds the model from those
weights with plain torch.nn.functional calls (F.linear, F.layer_norm, softmax, F.gelu,
F.conv2d, as nn.Linear / nn.LayerNorm / nn.Conv2d run them), then prints one JSON line:

- `f32_vs_burn`: relative L2 distance of its f32 output from Burn's f32 output (checks that
  the two models are the same; expect ~1e-6);
- `output_error`, `grad_error`: relative L2 distance from its own f32 run of the output and
  of all parameter gradients (one global vector) under torch.autocast("cpu", dtype).

    python3 autocast_error.py --weights FILE --dtype bfloat16|float16

Models: "encoder" (Burn's TransformerEncoder, post-norm by default; loss sum(out * r)) and
"vit" (crates/demos/src/models/vit.rs: conv patches + position embedding, Burn's
pre-norm TransformerEncoderLayer blocks, LayerNorm, mean over tokens, Linear head;
cross-entropy loss).
"""

import argparse
import json
import math

import torch
import torch.nn.functional as F


def linear(p, name, x):
    # Burn stores Linear weights as [d_in, d_out].
    return F.linear(x, p[name + ".weight"].t(), p.get(name + ".bias"))


def layer_norm(p, name, x):
    return F.layer_norm(x, x.shape[-1:], p[name + ".gamma"], p.get(name + ".beta"), 1e-5)


def attention(p, name, x, heads):
    b, s, d = x.shape
    hd = d // heads
    split = lambda t: t.reshape(b, s, heads, hd).transpose(1, 2)
    q, k, v = (split(linear(p, f"{name}.{w}", x)) for w in ("query", "key", "value"))
    probs = (q @ k.transpose(2, 3) / math.sqrt(hd)).softmax(dim=3)
    return linear(p, name + ".output", (probs @ v).transpose(1, 2).reshape(b, s, d))


def feed_forward(p, name, x):
    return linear(p, name + ".linear_outer", F.gelu(linear(p, name + ".linear_inner", x)))


def encoder_layer(p, name, x, heads, norm_first):
    """Burn's TransformerEncoderLayer::forward, dropout 0."""
    if norm_first:
        x = x + attention(p, name + ".mha", layer_norm(p, name + ".norm_2", x), heads)
        return x + feed_forward(p, name + ".pwff", layer_norm(p, name + ".norm_1", x))
    x = layer_norm(p, name + ".norm_1", x + attention(p, name + ".mha", x, heads))
    return layer_norm(p, name + ".norm_2", x + feed_forward(p, name + ".pwff", x))


def forward(spec, p, x):
    heads, layers = spec["heads"], spec["layers"]
    if spec["model"] == "encoder":
        for i in range(layers):
            x = encoder_layer(p, f"layers.{i}", x, heads, spec["norm_first"])
        return x
    patch = p["patch_embed.weight"].shape[-1]
    x = F.conv2d(x, p["patch_embed.weight"], p["patch_embed.bias"], stride=patch)
    b, d = x.shape[:2]
    x = x.reshape(b, d, -1).transpose(1, 2) + p["pos_embed"]
    for i in range(layers):
        x = encoder_layer(p, f"blocks.{i}.block", x, heads, True)
    return linear(p, "head", layer_norm(p, "norm", x).mean(dim=1))


def loss_of(spec, out):
    if spec["model"] == "encoder":
        return (out.float() * tensor(spec["r"])).sum()
    return F.cross_entropy(out.float(), torch.tensor(spec["labels"]))


def tensor(t):
    return torch.tensor(t["data"], dtype=torch.float32).reshape(t["shape"])


def run(spec, dtype):
    """Output and gradients (in the file's parameter order) with or without autocast."""
    p = {name: tensor(t).requires_grad_() for name, t in spec["params"]}
    x = tensor(spec["input"])
    with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
        out = forward(spec, p, x)
    loss_of(spec, out).backward()
    grads = torch.cat([p[name].grad.flatten() for name, _ in spec["params"]])
    return out.detach().float().flatten(), grads


def rel_l2(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--weights", required=True)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    args = parser.parse_args()
    with open(args.weights) as f:
        spec = json.load(f)
    torch.manual_seed(0)
    out32, grads32 = run(spec, None)
    out, grads = run(spec, getattr(torch, args.dtype))
    burn32 = torch.tensor(spec["f32_output"], dtype=torch.float32)
    print(json.dumps({
        "torch": torch.__version__,
        "f32_vs_burn": rel_l2(out32, burn32),
        "output_error": rel_l2(out, out32),
        "grad_error": rel_l2(grads, grads32),
    }))


if __name__ == "__main__":
    main()

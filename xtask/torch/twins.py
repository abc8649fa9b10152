"""PyTorch twins of `cargo xtask bench`'s models, timed the way the Rust side times them.

Run by `cargo xtask bench --torch` (xtask/src/bench/torch.rs), one configuration per process:

    python3 twins.py --model transformer|vit --precision 32-true|bf16-mixed|16-mixed \
        --checkpoint none|all --batch N --steps N --warmup N

It prints one JSON line: ms per step (forward, backward, optimizer step), the peak live heap
bytes during forward + backward above those live at the step's start (when the process runs
under the bench's heap-counting preload shim, heapcount.so; null otherwise) and the final loss.

The models match the Rust ones (crates/demos/src/models): the 12-block GPT-style
transformer (d_model 256, 4 heads, 4x GELU MLP, vocabulary 256, 64 tokens) and the ViT
(6 pre-norm encoder layers, d_model 128, MLP 256, 4 heads, 2x2 patches of 8x8 one-channel
images, mean pooling). AdamW (lr 1e-4), as the Rust side. Mixed precision is torch.autocast
on the CPU (with a GradScaler for 16-mixed); checkpointing is torch.utils.checkpoint per block.
"""

import argparse
import contextlib
import ctypes
import json
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

SEQ_LEN = 64
VOCAB = 256


class Block(nn.Module):
    """One pre-norm block: x + attn(norm1(x)), then x + mlp(norm2(x)); causal attention."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=2)
        split = lambda t: t.reshape(b, s, self.heads, hd).transpose(1, 2)
        q, k, v = split(q), split(k), split(v)
        scores = (q @ k.transpose(2, 3)) * (hd ** -0.5)
        mask = torch.ones(s, s, dtype=torch.bool).tril()
        probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=3)
        x = x + self.proj((probs @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class Transformer(nn.Module):
    def __init__(self, d=256, heads=4, layers=12):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, d)
        self.positions = nn.Embedding(SEQ_LEN, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, tokens, checkpointed):
        positions = torch.arange(tokens.shape[1])
        x = self.tokens(tokens) + self.positions(positions)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if checkpointed else block(x)
        return self.head(self.norm(x))


class Vit(nn.Module):
    def __init__(self, d=128, d_ff=256, heads=4, layers=6, patch=2, size=8, classes=10):
        super().__init__()
        self.patch_embed = nn.Conv2d(1, d, patch, stride=patch)
        self.pos_embed = nn.Parameter(torch.randn(1, (size // patch) ** 2, d) * 0.02)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d, heads, d_ff, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
            )
            for _ in range(layers)
        )
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, images, checkpointed):
        x = self.patch_embed(images).flatten(2).transpose(1, 2) + self.pos_embed
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if checkpointed else block(x)
        return self.head(self.norm(x).mean(dim=1))


def heap_counter():
    """The preload shim's counters, or None when the process runs without it."""
    lib = ctypes.CDLL(None)
    try:
        live, peak, reset = lib.heapcount_live, lib.heapcount_peak, lib.heapcount_reset_peak
    except AttributeError:
        return None
    live.restype = peak.restype = ctypes.c_size_t
    return live, peak, reset


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["transformer", "vit"], required=True)
    p.add_argument("--precision", choices=["32-true", "bf16-mixed", "16-mixed"], default="32-true")
    p.add_argument("--checkpoint", choices=["none", "all"], default="none")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=2)
    a = p.parse_args()

    torch.manual_seed(0)
    checkpointed = a.checkpoint == "all"
    if a.model == "transformer":
        model = Transformer()
        batches = [torch.randint(0, VOCAB, (a.batch, SEQ_LEN + 1)) for _ in range(2)]

        def loss_of(i):
            batch = batches[i % len(batches)]
            logits = model(batch[:, :SEQ_LEN], checkpointed)
            return F.cross_entropy(logits.float().reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
    else:
        model = Vit()
        # The Rust side batches 2 x batch digits per step; values do not change the time.
        images = [torch.rand(2 * a.batch, 1, 8, 8) for _ in range(4)]
        labels = [torch.randint(0, 10, (2 * a.batch,)) for _ in range(4)]

        def loss_of(i):
            logits = model(images[i % 4], checkpointed)
            return F.cross_entropy(logits.float(), labels[i % 4])

    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    half = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(a.precision)
    autocast = (lambda: torch.autocast("cpu", dtype=half)) if half else contextlib.nullcontext
    scaler = torch.amp.GradScaler("cpu") if a.precision == "16-mixed" else None
    counter = heap_counter()

    total, peak, loss_value = 0.0, 0, float("nan")
    for i in range(a.warmup + a.steps):
        live_before = counter[0]() if counter else 0
        if counter:
            counter[2]()
        start = time.perf_counter()
        with autocast():
            loss = loss_of(i)
        (scaler.scale(loss) if scaler else loss).backward()
        step_peak = counter[1]() - live_before if counter else 0
        if scaler:
            scaler.step(optim)
            scaler.update()
        else:
            optim.step()
        optim.zero_grad(set_to_none=True)
        if i >= a.warmup:
            total += time.perf_counter() - start
            peak = max(peak, step_peak)
        loss_value = loss.item()
    print(
        json.dumps(
            {
                "ms_per_step": total / a.steps * 1e3,
                "fwd_bwd_peak_bytes": peak if counter else None,
                "final_loss": loss_value,
                "threads": torch.get_num_threads(),
                "torch": torch.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()

"""PyTorch twins of the bench presets (xtask/src/bench/presets.rs): ViT-B/16 and GPT-2 small,
timed the way `cargo xtask bench --suite presets` and `cargo xtask gpu-check` time them, so a
GPU run can put PyTorch's throughput beside afterburner's on the same GPU.

    python3 preset_twins.py --model gpt2-small|vit-b16 \
        --precision 32-true|bf16-mixed|16-mixed --batch N --steps N --warmup N [--size N] \
        [--compile] [--tf32 on|off] [--attention sdpa|math] [--device cuda|cpu] [--quick]

It prints one JSON line (the fields are listed at the end of this docstring). Errors that are
not the script's own (torch missing, CUDA or bf16 absent) end it with a one-line message on
stderr and exit status 2, not a traceback.

The models are those of crates/demos/src/models, built by the presets' configs:

- gpt2-small (`TransformerConfig::gpt2().with_max_seq_len(seq)`): token and learned position
  embeddings (N(0, 1), `seq` positions: the Rust preset sizes its position table to the run's
  sequence), 12 pre-norm blocks `x + proj(attn(ln1(x)))`, `x + fc2(gelu(fc1(ln2(x))))` of
  width 768 with 12 heads, a fused qkv Linear, causal attention, a 4x exact-erf GELU MLP,
  biases everywhere, LayerNorm eps 1e-5, a final LayerNorm and an UNTIED head with a bias
  (vocabulary 50,257): 163,087,441 parameters at 1,024 positions, as the Rust model (GPT-2's
  own count, with the head tied to the embedding, is 124M).
- vit-b16 (`VitConfig` channels 3, patch 16, d_model 768, 12 heads, 12 layers, d_ff 3072,
  10 classes): a strided Conv2d patch embedding with a bias, learned position embeddings
  (N(0, 0.02)) and no class token, 12 pre-norm encoder layers (Burn's
  `TransformerEncoderLayer` with `norm_first`, dropout 0: the same block as above without the
  causal mask), a final LayerNorm, mean pooling over the patches and a Linear head:
  85,804,810 parameters at 224 px. Burn's attention has separate q, k and v Linears; here they
  are one fused Linear (the same parameters and FLOPs, one GEMM instead of three).

Training as presets.rs: AdamW with Burn's `AdamWConfig` defaults (betas 0.9 / 0.999, eps 1e-5,
weight decay 1e-4, applied to every parameter), lr 1e-4, `fused=False` and PyTorch's default
`foreach`; mean cross-entropy (logits cast to f32) on the GPT's `[batch * seq, vocab]` logits
against uniform random targets, or on the ViT's `[batch, 10]` logits against uniform random
labels. Synthetic data with a fixed seed, made once (on the CPU with seed 1, then moved to the
device) before timing: token ids uniform in the vocabulary, images uniform in [0, 1) as Burn's
`Distribution::Default` (the values do not change the time). Weights are drawn on the CPU
with seed 0 (PyTorch's defaults, which have Burn's distributions: Linear and Conv2d uniform in
+-1/sqrt(fan_in), embeddings N(0, 1)) and then moved, so every device starts from the same
model.

Precisions: 32-true is plain f32. bf16-mixed is `torch.autocast(device, dtype=torch.bfloat16)`
around forward + loss, f32 master weights and optimizer, as PyTorch eager users run it (on the
CPU: `torch.autocast("cpu", dtype=torch.bfloat16)`). 16-mixed is the same with float16 and a
`torch.amp.GradScaler`.

`--tf32 on|off` sets `torch.backends.cuda.matmul.allow_tf32`, `torch.backends.cudnn.allow_tf32`
and `torch.set_float32_matmul_precision("high" | "highest")` explicitly. The default is OFF, so
32-true is true f32 (IEEE fp32 matmuls), whatever the installed PyTorch's own default is; the
JSON says which was used. TF32 matters for 32-true only (bf16-mixed's matmuls run in bf16).

`--attention sdpa` (the default, what PyTorch users write) runs
`F.scaled_dot_product_attention` (flash or memory-efficient kernels on CUDA); `--attention
math` spells it out as the Rust models do (scores, scale, mask, softmax, matmul), for a
kernel-for-kernel comparison.

`--compile` wraps the model in `torch.compile` (default mode); the warm-up steps then include
the compilation (the JSON's `warmup_s`).

Timing as presets.rs's `timed`: `--warmup` steps, then (on CUDA) `torch.cuda.synchronize()`,
the clock, `--steps` steps (forward, loss, backward, AdamW step, zero_grad), synchronize, the
clock; ms per step = elapsed / steps. Defaults: 3 warm-up and 10 timed steps (gpu-check's),
batch 8 of 1,024 tokens (gpt2-small) or batch 16 of 224 px (vit-b16; the Rust presets also
run 64); flags given explicitly win over them. `--quick` makes a tiny run, as `bench --quick`
does, and like it wins over `--batch`, `--size`, `--steps` and `--warmup`: 1 warm-up, 1 step,
batch 2 of 64 px or batch 1 of 32 tokens, the architectures unchanged (with `--device cpu`,
seconds at 32-true on a CPU, for dry runs without a GPU; bf16 is slow on CPUs without native
bf16 matmuls).

FLOPs per step, two ways:
- `flops_per_step_counted`: counted with `torch.utils.flop_counter.FlopCounterMode` over one
  forward + loss + backward of the eager (uncompiled) model on the timed batch, before the
  warm-up, with attention forced to the math kernel so that its matmuls are counted on every
  device. Matmuls, Linears, convolutions and attention, forward and backward, a multiply-add
  counting 2, only the gradients that run (the patch embedding's input gradient does not):
  the convention of afterburner's `count_flops`, which presets.rs divides by the step time.
  The counting pass's gradients are dropped and the CUDA peak-memory counter is reset after it.
- `flops_per_step_6nd`: 6 * N * T, N the weights of every matmul (the blocks' four Linears,
  the GPT's head or the ViT's patch-embedding convolution and head; no embeddings, biases or
  norms), T the tokens per step (batch * seq, or batch * patches). It leaves out the attention
  score matmuls (about 15% of GPT-2 small's at 1,024 tokens) and overcounts what the ViT's
  head and patch input do not run.
`tflops_counted` and `tflops_6nd` are each over the measured step time; `tflops` is
`tflops_counted` (`tflops_6nd` where the counter is missing).

JSON fields: model, precision, device, device_name, torch, batch, size (tokens or pixels),
tokens_per_sample, warmup, steps, compile, tf32, float32_matmul_precision, attention, params,
ms_per_step, throughput with unit (tokens/s or img/s) and the same as tokens_per_s or
images_per_s, flops_per_step_counted, flops_per_step_6nd, tflops_counted, tflops_6nd, tflops,
warmup_s, peak_memory_bytes and peak_memory_mib (`torch.cuda.max_memory_allocated` over the
warm-up and timed steps), memory_allocated_bytes and memory_reserved_bytes after them (all
null on the CPU), final_loss (the last timed step's), threads (the CPU's intra-op threads).
"""

import argparse
import contextlib
import json
import platform
import sys
import time
import warnings


def fail(message):
    """Ends the script with `message` on stderr (no traceback), exit status 2."""
    print(f"preset_twins.py: {message}", file=sys.stderr)
    sys.exit(2)


try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    fail(
        f"PyTorch is not importable ({e}); install it (pip install torch) or run an "
        "interpreter that has it"
    )

GPT2_VOCAB = 50257
VIT_CLASSES = 10
D_MODEL, HEADS, LAYERS = 768, 12, 12
PATCH = 16

# Burn's AdamWConfig defaults, and the preset's learning rate.
LR, BETAS, EPS, WEIGHT_DECAY = 1e-4, (0.9, 0.999), 1e-5, 1e-4

# (batch, size) of `shapes` in presets.rs: full, then quick.
SHAPES = {
    "gpt2-small": ((8, 1024), (1, 32)),
    "vit-b16": ((16, 224), (2, 64)),
}
STEPS, WARMUP = 10, 3


class Block(nn.Module):
    """One pre-norm block: x + proj(attention(norm1(x))), then x + fc2(gelu(fc1(norm2(x))))."""

    def __init__(self, d, heads, d_ff, causal, attention):
        super().__init__()
        self.heads, self.causal, self.attention = heads, causal, attention
        self.norm1 = nn.LayerNorm(d, eps=1e-5)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d, eps=1e-5)
        self.fc1 = nn.Linear(d, d_ff)
        self.fc2 = nn.Linear(d_ff, d)

    def forward(self, x):
        b, s, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=2)
        split = lambda t: t.reshape(b, s, self.heads, hd).transpose(1, 2)
        q, k, v = split(q), split(k), split(v)
        if self.attention == "sdpa":
            context = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        else:
            scores = (q @ k.transpose(2, 3)) * (hd**-0.5)
            if self.causal:
                mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
                scores = scores.masked_fill(~mask, float("-inf"))
            context = scores.softmax(dim=3) @ v
        x = x + self.proj(context.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class Gpt(nn.Module):
    """The demo Transformer at GPT-2 small's shape: untied head, `seq` learned positions."""

    def __init__(self, seq, attention):
        super().__init__()
        d = D_MODEL
        self.tokens = nn.Embedding(GPT2_VOCAB, d)
        self.positions = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(
            Block(d, HEADS, 4 * d, True, attention) for _ in range(LAYERS)
        )
        self.norm = nn.LayerNorm(d, eps=1e-5)
        self.head = nn.Linear(d, GPT2_VOCAB)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tokens(tokens) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def matmul_weights(self):
        blocks = sum(b.qkv.weight.numel() + b.proj.weight.numel() + b.fc1.weight.numel()
                     + b.fc2.weight.numel() for b in self.blocks)
        return blocks + self.head.weight.numel()


class Vit(nn.Module):
    """The demo ViT at ViT-B/16's shape: no class token, mean pooling, 10 classes."""

    def __init__(self, size, attention):
        super().__init__()
        d = D_MODEL
        self.patch_embed = nn.Conv2d(3, d, PATCH, stride=PATCH)
        self.pos_embed = nn.Parameter(torch.randn(1, (size // PATCH) ** 2, d) * 0.02)
        self.blocks = nn.ModuleList(
            Block(d, HEADS, 3072, False, attention) for _ in range(LAYERS)
        )
        self.norm = nn.LayerNorm(d, eps=1e-5)
        self.head = nn.Linear(d, VIT_CLASSES)

    def forward(self, images):
        x = self.patch_embed(images).flatten(2).transpose(1, 2) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))

    def matmul_weights(self):
        blocks = sum(b.qkv.weight.numel() + b.proj.weight.numel() + b.fc1.weight.numel()
                     + b.fc2.weight.numel() for b in self.blocks)
        return blocks + self.patch_embed.weight.numel() + self.head.weight.numel()


def set_tf32(on):
    """Sets TF32 for matmuls and cuDNN explicitly; returns float32_matmul_precision."""
    precision = "high" if on else "highest"
    with warnings.catch_warnings():
        # Newer PyTorch deprecates these flags for its fp32_precision API; they still work.
        warnings.simplefilter("ignore")
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on
        torch.set_float32_matmul_precision(precision)
    return torch.get_float32_matmul_precision()


def math_attention():
    """A context that forces scaled_dot_product_attention onto its math kernel (matmuls the
    FLOP counter sees on every device); a no-op where this PyTorch cannot."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(SDPBackend.MATH)
    except ImportError:
        return contextlib.nullcontext()


def count_flops(forward_backward):
    """FLOPs of one `forward_backward()` by FlopCounterMode, or None where it is missing."""
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return None
    counter = FlopCounterMode(display=False)
    with math_attention(), counter:
        forward_backward()
    return counter.get_total_flops()


def parse_args():
    p = argparse.ArgumentParser(
        description="PyTorch twins of the bench presets; prints one JSON line."
    )
    p.add_argument("--model", choices=["gpt2-small", "vit-b16"], required=True)
    p.add_argument(
        "--precision", choices=["32-true", "bf16-mixed", "16-mixed"], default="32-true"
    )
    p.add_argument("--batch", type=int, help="sequences or images per step")
    p.add_argument(
        "--size", type=int, help="sequence length (gpt2-small) or image side (vit-b16)"
    )
    p.add_argument("--steps", type=int, help=f"timed steps (default {STEPS}; 1 with --quick)")
    p.add_argument("--warmup", type=int, help=f"warm-up steps (default {WARMUP}; 1 with --quick)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument(
        "--tf32", choices=["on", "off"], default="off", help="TF32 matmuls (default off)"
    )
    p.add_argument("--attention", choices=["sdpa", "math"], default="sdpa")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--quick", action="store_true", help="a tiny run: small inputs, 1 + 1 steps")
    a = p.parse_args()
    full, quick = SHAPES[a.model]
    if a.quick:
        # As presets.rs: --quick wins over the shape and step flags.
        (a.batch, a.size), a.steps, a.warmup = quick, 1, 1
    else:
        a.batch = full[0] if a.batch is None else a.batch
        a.size = full[1] if a.size is None else a.size
        a.steps = STEPS if a.steps is None else a.steps
        a.warmup = WARMUP if a.warmup is None else a.warmup
    if a.batch < 1 or a.size < 1 or a.steps < 1 or a.warmup < 0:
        p.error("--batch, --size and --steps must be at least 1, --warmup at least 0")
    if a.model == "vit-b16" and a.size % PATCH:
        p.error(f"--size must be a multiple of the patch side {PATCH} for vit-b16")
    return a


def main():
    a = parse_args()
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        fail(
            f"--device cuda, but this PyTorch ({torch.__version__}) sees no CUDA device "
            "(a CPU-only build, or no GPU/driver); pass --device cpu for a CPU run"
        )
    if cuda and a.precision == "bf16-mixed" and not torch.cuda.is_bf16_supported():
        fail(f"bf16-mixed: {torch.cuda.get_device_name()} does not support bfloat16")
    device = torch.device(a.device)
    matmul_precision = set_tf32(a.tf32 == "on")

    torch.manual_seed(0)
    if a.model == "gpt2-small":
        model = Gpt(a.size, a.attention)
        tokens_per_sample = a.size
    else:
        model = Vit(a.size, a.attention)
        tokens_per_sample = (a.size // PATCH) ** 2
    params = sum(p.numel() for p in model.parameters())
    model = model.to(device)

    data = torch.Generator().manual_seed(1)
    if a.model == "gpt2-small":
        inputs = torch.randint(0, GPT2_VOCAB, (a.batch, a.size), generator=data)
        targets = torch.randint(0, GPT2_VOCAB, (a.batch * a.size,), generator=data)
    else:
        inputs = torch.rand(a.batch, 3, a.size, a.size, generator=data)
        targets = torch.randint(0, VIT_CLASSES, (a.batch,), generator=data)
    inputs, targets = inputs.to(device), targets.to(device)

    half = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(a.precision)
    autocast = (
        (lambda: torch.autocast(a.device, dtype=half)) if half else contextlib.nullcontext
    )
    scaler = torch.amp.GradScaler(a.device) if a.precision == "16-mixed" else None

    def loss_of(net):
        with autocast():
            logits = net(inputs)
            return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets)

    counted = count_flops(lambda: loss_of(model).backward())
    model.zero_grad(set_to_none=True)
    flops_6nd = 6 * model.matmul_weights() * a.batch * tokens_per_sample

    net = torch.compile(model) if a.compile else model
    optim = torch.optim.AdamW(
        model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, fused=False
    )

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def step():
        loss = loss_of(net)
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(optim)
            scaler.update()
        else:
            loss.backward()
            optim.step()
        optim.zero_grad(set_to_none=True)
        return loss

    if cuda:
        sync()
        torch.cuda.reset_peak_memory_stats()
    warmup_start = time.perf_counter()
    for _ in range(a.warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    sync()
    elapsed = time.perf_counter() - start
    warmup_s = start - warmup_start

    step_s = elapsed / a.steps
    items = a.batch * (a.size if a.model == "gpt2-small" else 1)
    throughput = items / step_s
    unit = "tokens/s" if a.model == "gpt2-small" else "img/s"
    tflops_counted = counted / step_s / 1e12 if counted else None
    peak = torch.cuda.max_memory_allocated(device) if cuda else None
    result = {
        "model": a.model,
        "precision": a.precision,
        "device": a.device,
        "device_name": torch.cuda.get_device_name(device)
        if cuda
        else (platform.processor() or platform.machine() or "cpu"),
        "torch": torch.__version__,
        "batch": a.batch,
        "size": a.size,
        "tokens_per_sample": tokens_per_sample,
        "warmup": a.warmup,
        "steps": a.steps,
        "compile": a.compile,
        "tf32": a.tf32 == "on",
        "float32_matmul_precision": matmul_precision,
        "attention": a.attention,
        "params": params,
        "ms_per_step": step_s * 1e3,
        "throughput": throughput,
        "unit": unit,
        ("tokens_per_s" if a.model == "gpt2-small" else "images_per_s"): throughput,
        "flops_per_step_counted": counted,
        "flops_per_step_6nd": flops_6nd,
        "tflops_counted": tflops_counted,
        "tflops_6nd": flops_6nd / step_s / 1e12,
        "tflops": tflops_counted if tflops_counted is not None else flops_6nd / step_s / 1e12,
        "warmup_s": warmup_s,
        "peak_memory_bytes": peak,
        "peak_memory_mib": peak / 2**20 if cuda else None,
        "memory_allocated_bytes": torch.cuda.memory_allocated(device) if cuda else None,
        "memory_reserved_bytes": torch.cuda.memory_reserved(device) if cuda else None,
        "final_loss": loss.item(),
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()

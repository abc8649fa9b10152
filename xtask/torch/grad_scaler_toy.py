"""PyTorch's GradScaler sequence on the 16-mixed toy of crates/accelerate/tests/grad_scaler_toy.rs.

The toy's loss comes from an f32 parameter whose squares overflow f16 (300^2 > 65504):
out = (p * x) ** 2, loss = out.mean(), under torch.autocast("cpu", dtype=torch.float16),
SGD (lr 0.1) and a GradScaler started near f32's limit (init_scale 2^120, growth_interval 2),
so the *scaled* loss overflows f32 at some scales and not at others. Prints one line per step:
the scale used, whether the step was taken, and p after it. The Rust test holds these figures:

    python3 xtask/torch/grad_scaler_toy.py
"""

import torch

p = torch.nn.Parameter(torch.tensor([300.0, -250.0, 200.0, 320.0]))
x = torch.ones(4)
optimizer = torch.optim.SGD([p], lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**120, growth_interval=2)
for step in range(1, 13):
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        out = (p * x) ** 2
    loss = out.float().mean()
    scale = scaler.get_scale()
    before = p.detach().clone()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    stepped = not torch.equal(before, p.detach())
    print(step, f"2^{int(torch.log2(torch.tensor(scale)))}", "stepped" if stepped else "skipped",
          [float(v) for v in p.detach()], f"loss {loss.item():.1f}")

"""PyTorch's GradScaler sequences on the 16-mixed toys of crates/accelerator/tests/grad_scaler_toy.rs.

Toy 1: the loss comes from an f32 parameter whose squares overflow f16 (300^2 > 65504):
out = (p * x) ** 2, loss = out.mean(), under torch.autocast("cpu", dtype=torch.float16),
SGD (lr 0.1) and a GradScaler started near f32's limit (init_scale 2^120, growth_interval 2),
so the scaled gradients overflow f32 at some scales and not at others.

Toy 2: a Linear(4, 4) whose weight gradient, computed in f16 in the backward pass, overflows
at the larger scales: out = linear(x) under autocast, loss = out.float().mean(), SGD (lr 0.01),
GradScaler(init_scale 2^16, growth_interval 2).

Prints one line per step: the scale used, whether the step was taken, and the parameters
after it. The Rust tests hold these figures:

    python3 xtask/torch/grad_scaler_toy.py
"""

import torch


def report(step, scale, stepped, values):
    print(step, f"2^{int(torch.log2(torch.tensor(scale)))}", "stepped" if stepped else "skipped",
          [round(float(v), 6) for v in values])


print("toy 1: f32 parameter, (p * x) ** 2")

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
    report(step, scale, not torch.equal(before, p.detach()), p.detach())

print("toy 2: Linear(4, 4), weight gradient in f16")
# Burn stores the weight as [d_in, d_out]: w_burn[i][j] = 0.1 * (i - j) + 0.05.
w_burn = torch.tensor([[0.1 * (i - j) + 0.05 for j in range(4)] for i in range(4)])
linear = torch.nn.Linear(4, 4)
with torch.no_grad():
    linear.weight.copy_(w_burn.t())
    linear.bias.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0]))
x = torch.tensor([[(r + 1) * (c + 1) / 2 for c in range(4)] for r in range(8)])
optimizer = torch.optim.SGD(linear.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=2)
for step in range(1, 9):
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        out = linear(x)
    loss = out.float().mean()
    scale = scaler.get_scale()
    before = linear.weight.detach().clone()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    stepped = not torch.equal(before, linear.weight.detach())
    report(step, scale, stepped, linear.weight.detach().t().flatten())

"""Fills the device in 64 MiB steps with PyTorch, running a kernel it has not
run before after each step (the driver loads such code lazily, and takes
local memory for it), until PyTorch is refused; then prints one JSON line
(its pid, how much it holds, whether it was refused) and holds everything
until a line arrives on stdin, so the caller can ask the driver.

    python torch_fill_lazy.py"""

import json
import os
import sys

import torch

OPS = [torch.sin, torch.cos, torch.exp, torch.tanh, torch.sigmoid, torch.sqrt, torch.log1p,
       torch.erf, torch.atan, torch.sinh, torch.cosh, torch.asinh, torch.digamma, torch.lgamma]

held, refused = [], False
x = torch.ones(1 << 20, device="cuda")
for step in range(1 << 12):
    try:
        held.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
        OPS[step % len(OPS)](x + step)
        torch.cuda.synchronize()
    except torch.OutOfMemoryError:
        refused = True
        break
print(json.dumps({"host_pid": os.getpid(), "held_mib": len(held) * 64, "refused": refused}),
      flush=True)
sys.stdin.readline()

"""A PyTorch matmul loop on a real GPU: prints JSON, matmuls per second over
SECONDS (after a warm-up).  Exits 77, saying why, without PyTorch or a GPU.

    python torch_matmul.py SECONDS"""

import json
import sys
import time

try:
    import torch
except ImportError as exc:
    print(f"PyTorch is not installed ({exc})")
    sys.exit(77)
if not torch.cuda.is_available():
    print("PyTorch sees no CUDA GPU")
    sys.exit(77)

a = torch.randn(4096, 4096, device="cuda")
b = torch.randn(4096, 4096, device="cuda")
for _ in range(20):
    a @ b
torch.cuda.synchronize()
count, start = 0, time.perf_counter()
while time.perf_counter() - start < float(sys.argv[1]):
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    count += 10
print(json.dumps({"matmuls_per_s": count / (time.perf_counter() - start)}))

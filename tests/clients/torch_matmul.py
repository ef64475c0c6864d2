"""A PyTorch matmul loop on a real GPU: prints JSON, matmuls per second over
SECONDS (after a warm-up), on STREAMS CUDA streams at once (default 1: the
default stream), each multiplying its own matrices.  Exits 77, saying why,
without PyTorch or a GPU.

    python torch_matmul.py SECONDS [STREAMS]"""

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

nstreams = int(sys.argv[2]) if len(sys.argv) > 2 else 1
streams = [torch.cuda.current_stream()] if nstreams == 1 else [torch.cuda.Stream() for _ in range(nstreams)]
operands = [(torch.randn(4096, 4096, device="cuda"), torch.randn(4096, 4096, device="cuda")) for _ in streams]


def round_of(matmuls: int) -> None:
    """`matmuls` on each stream, the streams' launches interleaved."""
    for _ in range(matmuls):
        for stream, (a, b) in zip(streams, operands):
            with torch.cuda.stream(stream):
                a @ b


round_of(20)
torch.cuda.synchronize()
count, start = 0, time.perf_counter()
while time.perf_counter() - start < float(sys.argv[1]):
    round_of(10)
    torch.cuda.synchronize()
    count += 10 * len(streams)
print(json.dumps({"matmuls_per_s": count / (time.perf_counter() - start)}))

"""Real PyTorch programs for benchmarks/real_gpu.py, each timed for SECONDS after
a warm-up; prints one JSON line of rates.  Exits 77, saying why, without
PyTorch or a GPU.

    python torch_programs.py matmul SECONDS   # 8192x8192 bf16 matmuls (GPU-bound, power-limited)
    python torch_programs.py compile SECONDS  # a torch.compile'd elementwise chain (Triton kernels)
    python torch_programs.py launch SECONDS   # 40 small elementwise ops, eager (launch-bound),
                                              # then the same 40 replayed as a CUDA graph
"""

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

MATMUL_N = 8192
SMALL_OPS = 40


def timed(step, seconds: float, per_step: int) -> float:
    """Runs step() until `seconds` have passed, synchronising after each;
    work items per second (per_step items a step)."""
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        torch.cuda.synchronize()
        count += per_step
    return count / (time.perf_counter() - start)


def matmul(seconds: float) -> dict:
    a = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(a)

    def four() -> None:
        for _ in range(4):
            torch.matmul(a, b, out=out)

    four()
    torch.cuda.synchronize()
    rate = timed(four, seconds, 4)
    return {"matmuls_per_s": rate, "tflops": rate * 2 * MATMUL_N ** 3 / 1e12}


def compiled(seconds: float) -> dict:
    def chain(x):
        return ((x.sin() * x.cos() + x * 0.5).tanh() * 1.0001 + x.exp() * 1e-3).sigmoid()

    x = torch.randn(64 << 20, device="cuda")
    fn = torch.compile(chain)
    began = time.perf_counter()
    for _ in range(3):
        fn(x)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - began

    def ten() -> None:
        for _ in range(10):
            fn(x)

    return {"calls_per_s": timed(ten, seconds, 10), "compile_s": compile_s}


def small_ops(x) -> None:
    for i in range(SMALL_OPS // 2):
        x.mul_(0.999)
        x.add_(1e-3 * (i + 1))


def launch(seconds: float) -> dict:
    x = torch.ones(4096, device="cuda")
    for _ in range(5):
        small_ops(x)
    torch.cuda.synchronize()
    eager = timed(lambda: [small_ops(x) for _ in range(25)], seconds, 25 * SMALL_OPS)
    static = torch.ones(4096, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        small_ops(static)       # warm-up outside the capture, as PyTorch asks
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        small_ops(static)
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()

    def replays() -> None:
        for _ in range(25):
            graph.replay()

    replayed = timed(replays, seconds, 25 * SMALL_OPS)
    return {"eager_kernels_per_s": eager, "graph_kernels_per_s": replayed}


MODES = {"matmul": matmul, "compile": compiled, "launch": launch}

if __name__ == "__main__":
    result = MODES[sys.argv[1]](float(sys.argv[2]))
    result["torch"] = torch.__version__
    print(json.dumps(result), flush=True)

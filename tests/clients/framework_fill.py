"""A framework filling the GPU as users fill it, for the memory rows of
benchmarks/real_gpu.py: allocates BLOCK_MIB blocks with FRAMEWORK's own
allocator until refused or LIMIT_MIB are held, running a kernel it has not
run before after each block (the driver loads such code lazily and takes
memory of its own for it); then frees half of the blocks and allocates again.
Prints one JSON line (what the framework and the driver showed it, the first
refusal, the blocks allocated after freeing), then holds everything until a
line arrives on stdin, so the caller can ask the driver what it lists for the
process.  Exits 77, saying why, when the framework is not installed or sees
no GPU.

    python framework_fill.py torch|cupy|jax BLOCK_MIB LIMIT_MIB

PyTorch's allocator is chosen by PYTORCH_CUDA_ALLOC_CONF, as users choose it
(expandable_segments:True, backend:cudaMallocAsync)."""

from __future__ import annotations

import ctypes
import json
import os
import sys

MiB = 1 << 20


def driver_meminfo() -> tuple[int, int] | None:
    """cuMemGetInfo on device 0's primary context, as the process's driver
    (the shim, where it is loaded) answers it: (free, total) bytes."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    dev, ctx, popped = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    if cu.cuInit(0) or cu.cuDeviceGet(ctypes.byref(dev), 0):
        return None
    if cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev):
        return None
    try:
        if cu.cuCtxPushCurrent_v2(ctx):
            return None
        rc = cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
        cu.cuCtxPopCurrent_v2(ctypes.byref(popped))
        return (free.value, total.value) if rc == 0 else None
    finally:
        cu.cuDevicePrimaryCtxRelease_v2(dev)


def refusal(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}"[:200]


class Torch:
    def __init__(self) -> None:
        import torch
        if not torch.cuda.is_available():
            raise LookupError("PyTorch sees no CUDA GPU")
        self.torch = torch
        self.x = torch.ones(1 << 20, device="cuda")
        self.ops = [torch.sin, torch.cos, torch.exp, torch.tanh, torch.sigmoid, torch.sqrt,
                    torch.log1p, torch.erf, torch.atan, torch.sinh, torch.cosh, torch.asinh,
                    torch.digamma, torch.lgamma, torch.erfc, torch.expm1]

    def meminfo(self) -> tuple[int, int]:
        return self.torch.cuda.mem_get_info()

    def alloc(self, nbytes: int, step: int):
        block = self.torch.empty(nbytes, dtype=self.torch.uint8, device="cuda")
        self.ops[step % len(self.ops)](self.x + step)
        self.torch.cuda.synchronize()
        return block

    def release(self) -> None:
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()

    def extra(self) -> dict:
        cuda = self.torch.cuda
        return {"version": self.torch.__version__, "allocator": cuda.get_allocator_backend(),
                "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                "reserved_bytes": cuda.memory_reserved(), "allocated_bytes": cuda.memory_allocated()}


class Cupy:
    def __init__(self) -> None:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise LookupError("CuPy sees no CUDA GPU")
        self.cupy = cupy
        self.x = cupy.ones(1 << 20, dtype=cupy.float32)
        self.ops = [cupy.sin, cupy.cos, cupy.exp, cupy.tanh, cupy.sqrt, cupy.log1p, cupy.arctan,
                    cupy.sinh, cupy.cosh, cupy.arcsinh, cupy.expm1, cupy.log, cupy.square,
                    cupy.reciprocal, cupy.cbrt, cupy.exp2]

    def meminfo(self) -> tuple[int, int]:
        return self.cupy.cuda.runtime.memGetInfo()

    def alloc(self, nbytes: int, step: int):
        block = self.cupy.empty(nbytes, dtype=self.cupy.uint8)
        self.ops[step % len(self.ops)](self.x + step)
        self.cupy.cuda.runtime.deviceSynchronize()
        return block

    def release(self) -> None:
        self.cupy.get_default_memory_pool().free_all_blocks()

    def extra(self) -> dict:
        pool = self.cupy.get_default_memory_pool()
        return {"version": self.cupy.__version__, "pool_total_bytes": pool.total_bytes(),
                "pool_used_bytes": pool.used_bytes()}


class Jax:
    def __init__(self) -> None:
        import jax
        import jax.numpy as jnp
        devices = [d for d in jax.devices() if d.platform == "gpu"]
        if not devices:
            raise LookupError("JAX sees no GPU")
        self.jax, self.jnp, self.device = jax, jnp, devices[0]
        self.x = jnp.ones(1 << 20, dtype=jnp.float32)
        self.ops = [jnp.sin, jnp.cos, jnp.exp, jnp.tanh, jnp.sqrt, jnp.log1p, jnp.arctan,
                    jnp.sinh, jnp.cosh, jnp.arcsinh, jnp.expm1, jnp.log, jnp.square,
                    jnp.reciprocal, jnp.cbrt, jnp.exp2]

    def meminfo(self) -> tuple[int, int] | None:
        return driver_meminfo()

    def alloc(self, nbytes: int, step: int):
        block = self.jnp.zeros((nbytes,), dtype=self.jnp.uint8).block_until_ready()
        self.ops[step % len(self.ops)](self.x + step).block_until_ready()
        return block

    def release(self) -> None:
        pass

    def extra(self) -> dict:
        stats = self.device.memory_stats() or {}
        return {"version": self.jax.__version__,
                "preallocated_bytes": stats.get("bytes_limit"),
                "in_use_bytes": stats.get("bytes_in_use"),
                "preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true (default)"),
                "mem_fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75 (default)")}


FRAMEWORKS = {"torch": Torch, "cupy": Cupy, "jax": Jax}


def fill(fw, held: list, block: int, limit: int) -> tuple[int, str]:
    """Blocks allocated until refused or at the limit; the refusal or 'none'.
    Any error ends the fill and is reported as it came: the allocator's own
    OOM (torch.OutOfMemoryError, cupy's OutOfMemoryError, JAX's
    RESOURCE_EXHAUSTED), or a driver error from loading a kernel lazily
    ('CUDA error: out of memory'); the caller judges which it was."""
    added = 0
    while (len(held) + 1) * block <= limit:
        try:
            held.append(fw.alloc(block, len(held)))
        except Exception as exc:  # noqa: BLE001 -- reported, and judged by the caller
            return added, refusal(exc)
        added += 1
    return added, "none"


def main() -> int:
    name, block, limit = sys.argv[1], int(sys.argv[2]) * MiB, int(sys.argv[3]) * MiB
    try:
        fw = FRAMEWORKS[name]()
    except (ImportError, LookupError) as exc:
        print(f"{name}: {exc}")
        return 77
    seen = fw.meminfo()
    held: list = []
    blocks, error = fill(fw, held, block, limit)
    freed = blocks // 2
    del held[len(held) - freed:]
    fw.release()
    again, again_error = fill(fw, held, block, limit)
    report = {"framework": name, "pid": os.getpid(),
              "free_bytes": seen[0] if seen else None, "total_bytes": seen[1] if seen else None,
              "driver_meminfo": driver_meminfo(), "block_bytes": block, "blocks": blocks,
              "error": error, "freed": freed, "again": again, "again_error": again_error,
              "held_bytes": len(held) * block, "extra": fw.extra()}
    print(json.dumps(report), flush=True)
    sys.stdin.readline()
    return 0


if __name__ == "__main__":
    sys.exit(main())

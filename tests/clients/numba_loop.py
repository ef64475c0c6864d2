"""A numba-cuda kernel loop: compiles a kernel with @cuda.jit (NVRTC, NVVM,
nvJitLink: a real compiler), launches it LAUNCHES times and waits for it.
Prints JSON: the loop's seconds.  Exits 77, saying why, when numba-cuda or
its CUDA compiler wheels are not installed.

    python numba_loop.py LAUNCHES"""

import json
import sys
import time

try:
    import numpy as np
    from numba import cuda
except ImportError as exc:
    print(f"numba-cuda is not installed ({exc}); pip install 'numba-cuda[cu13]'")
    sys.exit(77)


@cuda.jit
def bump(values):
    i = cuda.grid(1)
    if i < values.size:
        values[i] += 1


try:
    values = cuda.to_device(np.zeros(1024, dtype=np.float32))
    bump[4, 256](values)  # compiles
    cuda.synchronize()
except Exception as exc:  # the compiler wheels are looked up on first use
    if "nvrtc" in str(exc).lower() or "nvjitlink" in str(exc).lower() or "nvvm" in str(exc).lower():
        print(f"numba-cuda cannot compile here ({exc}); pip install 'numba-cuda[cu13]'")
        sys.exit(77)
    raise

start = time.perf_counter()
for _ in range(int(sys.argv[1])):
    bump[4, 256](values)
cuda.synchronize()
print(json.dumps({"seconds": time.perf_counter() - start}))

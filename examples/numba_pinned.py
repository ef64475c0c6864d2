"""A numba-cuda program of the usual shape: a @cuda.jit kernel, page-locked
(pinned) host buffers, two streams that each copy a block in, run the kernel
on it and copy it out, and events that time each round.  Its kernel repeats
its arithmetic PASSES times (default 4096), so that the kernel, not the
copies nor Python, keeps the GPU busy, and a compute share has something to
hold back.  Runs on a GPU, or on none: the simulated GPU runs no kernel code,
but keeps its time, and is told how long this kernel runs
(SIMGPU_KERNEL_US, microseconds; see docs/simulated-gpu.md):

    SIMGPU_KERNEL_US=20000 vgpulimit run --simulate --memory 1GiB --cores 50 -- \
        python examples/numba_pinned.py [SECONDS [PASSES]]

It runs for SECONDS (default 5), then prints one JSON line: the rounds done,
the GPU time per round as the events measured it, and whether the bytes came
back through the pinned buffers."""

import json
import sys
import time

import numpy as np
from numba import cuda

N = 1 << 22  # 16 MiB of float32 per block


@cuda.jit
def scale(values, factor, passes):
    i = cuda.grid(1)
    if i < values.size:
        value = values[i]
        for _ in range(passes):   # the GPU's work: exact, so the value stays
            value = value * factor / factor
        values[i] = value * factor


def main(seconds: float, passes: int) -> dict:
    streams = [cuda.stream() for _ in range(2)]
    pinned_in = [cuda.pinned_array(N, dtype=np.float32) for _ in streams]
    pinned_out = [cuda.pinned_array(N, dtype=np.float32) for _ in streams]
    device = [cuda.device_array(N, dtype=np.float32) for _ in streams]
    # Host memory the kernel could reach at the same address (not used by it here).
    flags = cuda.mapped_array(2, dtype=np.int32)
    flags[:] = 0
    threads = 256
    blocks = (N + threads - 1) // threads
    rounds = 0
    round_ms = []
    copied_back = True
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        events = []
        for k, stream in enumerate(streams):
            pinned_in[k][:16] = rounds + k  # a marker the copies must carry back
            start, end = cuda.event(), cuda.event()
            start.record(stream)
            device[k].copy_to_device(pinned_in[k], stream=stream)
            scale[blocks, threads, stream](device[k], 2.0, passes)
            device[k].copy_to_host(pinned_out[k], stream=stream)
            end.record(stream)
            events.append((start, end))
        for k, stream in enumerate(streams):
            stream.synchronize()
            # A GPU doubles the values, the simulated GPU leaves them: either way
            # the copies carried the marker there and back.
            copied_back &= pinned_out[k][0] in (rounds + k, 2 * (rounds + k))
        round_ms.append(max(cuda.event_elapsed_time(start, end) for start, end in events))
        rounds += 1
    return {
        "rounds": rounds,
        "round_ms": round(sorted(round_ms)[len(round_ms) // 2], 3) if round_ms else None,
        "copied_back": copied_back,
        "mapped": flags.tolist(),
    }


if __name__ == "__main__":
    print(json.dumps(main(float(sys.argv[1]) if len(sys.argv) > 1 else 5.0,
                          int(sys.argv[2]) if len(sys.argv) > 2 else 4096)))

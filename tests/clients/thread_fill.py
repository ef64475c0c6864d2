"""A cuda-bindings program of THREADS threads (a data loader's workers, say):
each round, every thread allocates and frees BLOCK bytes 50 times, then, once
all have, allocates BLOCK bytes at a time until it is refused, the threads
racing each other; then all free what they hold.  Prints, as JSON, what the
threads held together at the end of each round, what cuMemGetInfo said then,
and how many of the 50 allocations were refused.

    python thread_fill.py THREADS ROUNDS BLOCK"""

import json
import sys
import threading

from cuda.bindings import driver as cu


def check(result):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise SystemExit(f"thread_fill: {cu.cuGetErrorName(err)[1]!r}")
    return values[0] if len(values) == 1 else values


def one_round(context, threads: int, block: int) -> tuple[int, int, int]:
    held = [[] for _ in range(threads)]
    refusals = []
    churned = threading.Barrier(threads)
    full = threading.Barrier(threads + 1)
    done = threading.Barrier(threads + 1)

    def worker(mine):
        check(cu.cuCtxSetCurrent(context))
        for _ in range(50):
            err, ptr = cu.cuMemAlloc(block)
            if err == cu.CUresult.CUDA_SUCCESS:
                check(cu.cuMemFree(ptr))
            else:
                refusals.append(err)
        churned.wait()
        while True:
            err, ptr = cu.cuMemAlloc(block)
            if err != cu.CUresult.CUDA_SUCCESS:
                break
            mine.append(ptr)
        full.wait()
        done.wait()
        for ptr in mine:
            check(cu.cuMemFree(ptr))

    workers = [threading.Thread(target=worker, args=(held[i],)) for i in range(threads)]
    for w in workers:
        w.start()
    full.wait()
    check(cu.cuCtxSetCurrent(context))
    filled = sum(len(mine) for mine in held) * block
    free = int(check(cu.cuMemGetInfo())[0])
    done.wait()
    for w in workers:
        w.join()
    return filled, free, len(refusals)


def main():
    threads, rounds, block = map(int, sys.argv[1:4])
    check(cu.cuInit(0))
    context = check(cu.cuDevicePrimaryCtxRetain(check(cu.cuDeviceGet(0))))
    results = [one_round(context, threads, block) for _ in range(rounds)]
    filled, free_at_full, refused = (list(column) for column in zip(*results, strict=True))
    print(json.dumps({"filled": filled, "free_at_full": free_at_full, "refused": refused}))


main()

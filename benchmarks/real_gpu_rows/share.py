"""The compute share: timer-bound spin kernels at shares 10-90 %, and two
containers at 30 + 60 %."""

from __future__ import annotations

import time
from dataclasses import dataclass

from real_gpu_rows.bench import Bench, failed
from real_gpu_rows.rows import SHARE_TOLERANCE_PP, Row, Spec, pct, verdict


@dataclass(frozen=True)
class Kernels:
    us: int                 # a kernel's length: 20, 1000 or 20000 (spin_timer.ptx's kernels)
    geometry: str           # "1": one block; "sm": one block per SM; "full": every SM full
    streams: int

    def text(self) -> str:
        length = f"{self.us // 1000} ms" if self.us >= 1000 else f"{self.us} us"
        shape = {"1": "1 block", "sm": "1 block per SM", "full": "full GPU"}[self.geometry]
        return f"{length}, {shape}, {self.streams} stream{'s' if self.streams > 1 else ''}"


def share_plan(quick: bool) -> tuple[list[tuple[Kernels, tuple[int, ...]]], list[Kernels]]:
    """The cells: kernels with the shares tried on them, and the kernels the
    30 + 60 pair runs."""
    if quick:
        return [(Kernels(1000, "1", 1), (30,)), (Kernels(1000, "full", 2), (30,))], [Kernels(1000, "1", 1)]
    return ([(Kernels(1000, "1", 1), (10, 30, 60, 90)),
             (Kernels(20, "1", 1), (30, 90)),
             (Kernels(20000, "1", 1), (30,)),
             (Kernels(1000, "sm", 1), (30,)),
             (Kernels(20, "sm", 1), (30,)),
             (Kernels(20000, "sm", 1), (30,)),
             (Kernels(1000, "full", 2), (30,)),
             (Kernels(20, "full", 2), (30,))],
            [Kernels(1000, "1", 1), Kernels(20000, "1", 1)])


def share_timing(bench: Bench, kernels: Kernels) -> tuple[float, float]:
    """(settle, window) seconds: 20 ms kernels need a longer window to count."""
    if bench.quick:
        return 0.5, 1.5
    return (1.0, 4.0) if kernels.us >= 20000 else (1.0, 2.5)


def spin_env(bench: Bench, kernels: Kernels) -> dict[str, str]:
    """On the simulated GPU, kernels of two streams one at a time, as 'full'
    kernels run on a GPU (simgpu does not model occupancy)."""
    if bench.simulate and kernels.streams > 1:
        return dict(bench.env, SIMGPU_CONCURRENT_KERNELS="1")
    return bench.env


def progress(output: str) -> dict[str, list[tuple[float, int]]]:
    samples: dict[str, list[tuple[float, int]]] = {}
    for line in output.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[0] == "progress":
            samples.setdefault(fields[1], []).append((float(fields[2]), int(fields[3])))
    return samples


def kernels_share(output: str, kernel_ns: float, settle_s: float) -> float | None:
    """The share (%) of the GPU's time: kernels completed x their length over
    the wall time, from the first progress report `settle_s` after the start to
    the last.  Several processes: the sum."""
    total, counted = 0.0, False
    for points in progress(output).values():
        start = points[0][0] + settle_s
        inside = [p for p in points if p[0] >= start]
        if len(inside) >= 2 and inside[-1][0] > inside[0][0]:
            (t0, n0), (t1, n1) = inside[0], inside[-1]
            total += (n1 - n0) * kernel_ns * 1e-9 / (t1 - t0)
            counted = True
    return 100 * total if counted else None


def spin_once(bench: Bench, kernels: Kernels, cores: int | None, calibrate: bool) -> tuple[str, float]:
    settle, window = share_timing(bench, kernels)
    command = bench.spin(kernels.us, settle + window, kernels.geometry, kernels.streams, int(calibrate))
    if cores is not None:
        command = bench.capped(["--cores", str(cores)], command)
    began = time.monotonic()
    result = bench.run(command, settle + window + 60, f"spin {kernels.text()}", spin_env(bench, kernels))
    if result.returncode != 0:
        raise RuntimeError(failed(f"the spin client ({kernels.text()}, cores {cores})", result))
    return result.stdout, time.monotonic() - began


def kernel_ns_of(output: str, kernels: Kernels) -> float:
    for line in output.splitlines():
        if line.startswith("kernel_ns "):
            return float(line.split()[1])
    return kernels.us * 1000.0


def share_spec(kernels: Kernels, shares: tuple[int, ...]) -> Spec:
    def fn(bench: Bench) -> list[Row]:
        settle, _ = share_timing(bench, kernels)
        free_out, _ = spin_once(bench, kernels, None, calibrate=True)
        kernel_ns = kernel_ns_of(free_out, kernels)
        free = kernels_share(free_out, kernel_ns, settle)
        # Kernels of two streams overlap where one ends and the next begins, so
        # kernels x length counts more than the wall time of a busy GPU (106 %
        # uncapped on an H200 with 20 us kernels): the GPU's time is that figure
        # over what the same count gives uncapped.
        overlap = max(1.0, (free or 0.0) / 100)
        rows = []
        for cores in shares:
            out, _ = spin_once(bench, kernels, cores, calibrate=False)
            counted = kernels_share(out, kernel_ns, settle)
            got = None if counted is None else counted / overlap
            nominal = kernels_share(out, kernels.us * 1000.0, settle)
            ok = got is not None and abs(got - cores) <= SHARE_TOLERANCE_PP
            seen = (f"{pct(got)} of the GPU's time ({pct(counted)} by kernels x length, over the "
                    f"{pct(free)} that counts uncapped)" if overlap > 1 else pct(got))
            rows.append(Row("share", f"{kernels.text()} at {cores} %",
                            uncapped=f"{pct(free)} (a kernel {kernel_ns / 1e3:.1f} us by events)",
                            capped=f"{seen} (by its nominal length {pct(nominal)})",
                            expect=f"{cores} +- {SHARE_TOLERANCE_PP:g} pp", verdict=verdict(ok),
                            data={"kernel_ns": kernel_ns, "uncapped_pct": free, "capped_pct": got,
                                  "counted_pct": counted, "nominal_pct": nominal, "cores": cores}))
        return rows
    settle, window = (1.0, 4.0) if kernels.us >= 20000 else (1.0, 2.5)
    budget = (1 + len(shares)) * (settle + window + 8) + 30
    return Spec(f"share.{kernels.us}us.{kernels.geometry}.{kernels.streams}", f"{kernels.text()}", budget, fn)


def pair_spec(kernels: Kernels) -> Spec:
    def fn(bench: Bench) -> list[Row]:
        settle, window = share_timing(bench, kernels)
        free_out, _ = spin_once(bench, kernels, None, calibrate=True)
        kernel_ns = kernel_ns_of(free_out, kernels)
        command = bench.spin(kernels.us, settle + window, kernels.geometry, kernels.streams, 0)
        procs = [bench.start(bench.capped(["--cores", str(c)], command), spin_env(bench, kernels))
                 for c in (30, 60)]
        got = []
        for cores, proc in zip((30, 60), procs, strict=True):
            out, err = bench.finish(proc, settle + window + 60, f"the {cores} % container")
            if proc.returncode != 0:
                raise RuntimeError(failed(f"the {cores} % container", (proc.returncode, err)))
            got.append(kernels_share(out, kernel_ns, settle))
        ok = all(g is not None and abs(g - c) <= SHARE_TOLERANCE_PP for g, c in zip(got, (30, 60), strict=True))
        return [Row("share", f"{kernels.text()}: two containers at 30 % + 60 %",
                    uncapped=f"{pct(kernels_share(free_out, kernel_ns, settle))} alone",
                    capped=f"{pct(got[0])} + {pct(got[1])}",
                    expect=f"each +- {SHARE_TOLERANCE_PP:g} pp", verdict=verdict(ok),
                    data={"kernel_ns": kernel_ns, "shares_pct": got})]
    return Spec(f"share.pair.{kernels.us}us", f"{kernels.text()}: 30 % + 60 %", 60, fn)


# The steps sellers quote for a share (Alibaba's cGPU 2 %, Tencent's qGPU 5 %):
# 5-95 % in steps of 5, kernels of 20 us, 1 ms and 20 ms, one process and four.
GRANULARITY_SHARES = tuple(range(5, 100, 5))
GRANULARITY_KERNELS_US = (20, 1000, 20000)
GRANULARITY_PROCESSES = (1, 4)


def granularity_plan(quick: bool, full: bool) -> list[tuple[int, int, tuple[int, ...]]]:
    """(kernel us, processes, shares) per spec: the whole grid where asked for
    (`--only granularity`, about 14 minutes on a GPU, or one of its specs,
    `--only granularity.20000us.4`), else its ends and middle at 1 ms (quick:
    one process)."""
    if full:
        return [(us, n, GRANULARITY_SHARES) for us in GRANULARITY_KERNELS_US for n in GRANULARITY_PROCESSES]
    return [(1000, n, (5, 50, 95)) for n in ((1,) if quick else GRANULARITY_PROCESSES)]


def granularity_timing(bench: Bench, kernel_us: int) -> tuple[float, float]:
    """(settle, window) seconds: processes of 20 ms kernels started together
    repay their first kernels (charged before they were measured) in the
    seconds after, and count few kernels in a window."""
    if bench.quick and kernel_us < 20000:
        return 0.5, 1.5
    return (2.0, 8.0) if kernel_us >= 20000 else (1.0, 3.0)


def common_share(output: str, kernel_ns: float, settle_s: float) -> float | None:
    """The share (%) of several processes over one window, from `settle_s`
    after the last of them began to when the first of them ended: each one's
    kernels completed by a time are those of its last report by then (a
    process reports after each batch it waited for, none while its launch
    waits for budget)."""
    points = progress(output)
    if not points or any(len(p) < 2 for p in points.values()):
        return None
    start = max(p[0][0] for p in points.values()) + settle_s
    end = min(p[-1][0] for p in points.values())
    if end <= start:
        return None

    def done_by(p: list[tuple[float, int]], t: float) -> int:
        return max((n for at, n in p if at <= t), default=0)

    kernels = sum(done_by(p, end) - done_by(p, start) for p in points.values())
    return 100 * kernels * kernel_ns * 1e-9 / (end - start)


def granularity_spec(kernel_us: int, processes: int, shares: tuple[int, ...]) -> Spec:
    """One kernel length and process count at each share: the container's
    share of the GPU's time (its processes' kernels completed x a kernel's
    length as events time it, over the wall time) against the share."""
    kernels = Kernels(kernel_us, "1", 1)
    label = f"{kernels.text()}, {processes} process{'es' if processes > 1 else ''}"

    def fn(bench: Bench) -> list[Row]:
        settle, window = granularity_timing(bench, kernel_us)
        free_out, _ = spin_once(bench, kernels, None, calibrate=True)
        kernel_ns = kernel_ns_of(free_out, kernels)
        rows = []
        for cores in shares:
            spin = " ".join(map(str, bench.spin(kernel_us, settle + window, "1", 1, 0)))
            command = bench.capped(["--cores", str(cores)],
                                   ["sh", "-c", " & ".join([spin] * processes) + " & wait"])
            result = bench.run(command, settle + window + 60, f"spin {label}", bench.env)
            if result.returncode != 0:
                raise RuntimeError(failed(f"the spin clients ({label}, cores {cores})", result))
            got = common_share(result.stdout, kernel_ns, settle)
            ok = got is not None and abs(got - cores) <= SHARE_TOLERANCE_PP
            rows.append(Row("granularity", f"{label} at {cores} %", uncapped=f"a kernel {kernel_ns / 1e3:.1f} us",
                            capped=f"{pct(got)} ({got - cores:+.1f} pp)" if got is not None else pct(got),
                            expect=f"{cores} +- {SHARE_TOLERANCE_PP:g} pp", verdict=verdict(ok),
                            data={"kernel_ns": kernel_ns, "capped_pct": got, "cores": cores,
                                  "processes": processes}))
        return rows
    settle, window = (2.0, 8.0) if kernel_us >= 20000 else (1.0, 3.0)
    budget = (1 + len(shares)) * (settle + window + 8) + 30
    return Spec(f"granularity.{kernel_us}us.{processes}", label, budget, fn)

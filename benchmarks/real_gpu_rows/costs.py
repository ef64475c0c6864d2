"""Costs from C: an empty launch and an allocation with a free, with and
without the shim."""

from __future__ import annotations

import statistics

from real_gpu_rows.bench import PTX, Bench, failed
from real_gpu_rows.rows import CAP_FLAG, Row, Spec


def costs_spec() -> Spec:
    def fn(bench: Bench) -> list[Row]:
        launches, pairs = (20_000, 500) if bench.simulate else (100_000, 2_000)
        rounds = 3 if bench.quick else 5
        command = [bench.c_client(), "cost", str(PTX), str(launches), str(pairs)]
        variants = {"without the shim": command,
                    "shim, no limits": bench.capped([], command),
                    "cap + share 100": bench.capped(["--memory", CAP_FLAG, "--cores", "100"], command)}
        got: dict[str, dict[str, list[float]]] = {v: {"launch": [], "alloc_free": []} for v in variants}
        names = list(variants)
        for r in range(rounds):             # interleaved, the order turned each round
            for name in names[r % 3:] + names[:r % 3]:
                result = bench.run(variants[name], 60, f"the cost client ({name})")
                if result.returncode != 0:
                    raise RuntimeError(failed(f"the cost client ({name})", result))
                for line in result.stdout.splitlines():
                    key, value = line.split()
                    got[name][key].append(float(value))
        rows = []
        for key, title in (("launch", "empty cuLaunchKernel"), ("alloc_free", "cuMemAlloc + cuMemFree, 1 MiB")):
            base = statistics.median(got["without the shim"][key])
            rows.append(Row("costs", f"{title} ({rounds} rounds, medians)",
                            uncapped=f"without the shim {cost_text(got['without the shim'][key], None)}",
                            capped=f"shim, no limits {cost_text(got['shim, no limits'][key], base)}; "
                                   f"cap + share 100 {cost_text(got['cap + share 100'][key], base)}",
                            expect="reported (the H200 showed +-15 % run to run)",
                            data={v: got[v][key] for v in variants}))
        return rows
    return Spec("costs.c", "costs from C", 120, fn)


def cost_text(values: list[float], base_ns: float | None) -> str:
    """'4.52 us (4.41-4.70), +2 %': the median, the range of the rounds, the median's change from the base."""
    def shown(ns: float) -> str:
        return f"{ns / 1e3:.2f}" if ns >= 1000 else f"{ns / 1e3:.3f}"
    median = statistics.median(values)
    change = f", {(median - base_ns) / base_ns * 100:+.0f} %" if base_ns else ""
    return f"{shown(median)} us ({shown(min(values))}-{shown(max(values))}){change}"

"""Real programs: PyTorch matmuls, torch.compile, launch-bound eager ops and
their CUDA graph."""

from __future__ import annotations

import json
import statistics

from real_gpu_rows.bench import Bench, failed
from real_gpu_rows.driver_view import PowerSampler
from real_gpu_rows.rows import LAUNCH_BOUND_KEPT, SHARE_TOLERANCE_PP, Row, Skip, Spec, verdict


def program_once(bench: Bench, mode: str, seconds: float, cores: int | None,
                 budget_s: float) -> dict:
    """A torch_programs.py run, uncapped or at `cores`; its JSON, with the
    power and SM clock of its measured phase where NVML gives them."""
    command = bench.python("torch_programs.py", mode, seconds)
    if cores is not None:
        command = bench.capped(["--cores", str(cores)], command)
    sampler = PowerSampler(bench.driver)
    try:
        result = bench.run(command, budget_s, f"torch_programs.py {mode} (cores {cores})")
    finally:
        power = sampler.stop(seconds)
    if result.returncode == 77:
        raise Skip(result.stdout.strip())
    if result.returncode != 0:
        raise RuntimeError(failed(f"torch_programs.py {mode} (cores {cores})", result))
    report = json.loads(result.stdout.strip().splitlines()[-1])
    bench.versions["torch"] = report.get("torch", "?")
    return dict(report, **power)


def power_text(run: dict) -> str:
    return f", {run['watts']:.0f} W, SM {run['sm_mhz']:.0f} MHz" if "watts" in run else ""


def matmul_spec() -> Spec:
    def fn(bench: Bench) -> list[Row]:
        seconds = 4.0
        first = program_once(bench, "matmul", seconds, None, 90)
        alone = program_once(bench, "matmul", seconds, 30, 90)
        command = bench.python("torch_programs.py", "matmul", seconds)
        pair = []
        procs = [(c, bench.start(bench.capped(["--cores", str(c)], command))) for c in (30, 60)]
        for cores, proc in procs:
            out, err = bench.finish(proc, 90, f"the {cores} % matmul tenant")
            if proc.returncode != 0:
                raise RuntimeError(failed(f"the {cores} % matmul tenant", (proc.returncode, err)))
            pair.append(json.loads(out.strip().splitlines()[-1]))
        last = program_once(bench, "matmul", seconds, None, 90)
        base = statistics.mean([first["tflops"], last["tflops"]])
        ratio = alone["tflops"] / base
        rows = [Row("programs", "bf16 matmul 8192^3 at 30 % alone",
                    uncapped=f"{base:.0f} TFLOP/s{power_text(first)}",
                    capped=f"{ratio:.3f} of uncapped = {ratio / 0.30:.2f}x per second of its 30 % "
                           f"({base * ratio / 0.30:.0f} TFLOP/s while it runs){power_text(alone)}",
                    expect="reported (a duty-cycled GPU runs faster)",
                    data={"uncapped": [first, last], "capped": alone, "ratio": ratio})]
        ratios = [p["tflops"] / base for p in pair]
        rows.append(Row("programs", "bf16 matmul, tenants at 30 % + 60 % at once",
                        uncapped=f"{base:.0f} TFLOP/s alone",
                        capped=f"{ratios[0]:.3f} + {ratios[1]:.3f} of uncapped",
                        expect="reported", data={"pair": pair, "ratios": ratios}))
        return rows
    return Spec("programs.matmul", "bf16 matmul", 150, fn, ("torch",))


def compile_spec() -> Spec:
    def fn(bench: Bench) -> list[Row]:
        seconds = 3.0
        free = program_once(bench, "compile", seconds, None, 150)   # the cold compile
        capped = program_once(bench, "compile", seconds, 30, 90)
        ratio = capped["calls_per_s"] / free["calls_per_s"]
        return [Row("programs", "torch.compile (Triton kernels) at 30 %",
                    uncapped=f"{free['calls_per_s']:.0f} calls/s (compiled in {free['compile_s']:.0f} s)",
                    capped=f"{ratio:.3f} of uncapped",
                    expect="reported (throttled: well under 1)", data={"uncapped": free, "capped": capped})]
    return Spec("programs.compile", "torch.compile", 200, fn, ("torch",))


def launch_spec() -> Spec:
    """Launch-bound eager PyTorch and the same ops as a CUDA graph (issue 24's
    cells on a real GPU; benchmarks/compute_share.py runs them on simgpu)."""
    def fn(bench: Bench) -> list[Row]:
        seconds = 2.5
        runs = {}
        first = program_once(bench, "launch", seconds, None, 60)
        for cores in (50, 90):
            runs[cores] = program_once(bench, "launch", seconds, cores, 60)
        last = program_once(bench, "launch", seconds, None, 60)
        rows = []
        for kind, key in (("eager", "eager_kernels_per_s"), ("graph", "graph_kernels_per_s")):
            base = statistics.mean([first[key], last[key]])
            for cores in (50, 90):
                ratio = runs[cores][key] / base
                if kind == "eager":
                    ok = ratio >= LAUNCH_BOUND_KEPT
                    expect = f">= {LAUNCH_BOUND_KEPT:.2f} of uncapped (it keeps the GPU ~11 % busy)"
                else:
                    ok = abs(ratio * 100 - cores) <= SHARE_TOLERANCE_PP
                    expect = f"{cores / 100:.2f} +- 0.02 of uncapped (GPU-bound)"
                name = ("40 small ops, eager (launch-bound)" if kind == "eager"
                        else "the same 40 ops as a CUDA graph") + f" at {cores} %"
                rows.append(Row("programs", name,
                                uncapped=f"{base / 1e3:.0f}k kernels/s",
                                capped=f"{ratio:.3f} of uncapped ({runs[cores][key] / 1e3:.0f}k/s)",
                                expect=expect, verdict=verdict(ok),
                                data={"uncapped": [first[key], last[key]], "capped": runs[cores][key],
                                      "ratio": ratio, "cores": cores}))
        return rows
    return Spec("programs.launch", "launch-bound eager and CUDA graph", 150, fn, ("torch",))

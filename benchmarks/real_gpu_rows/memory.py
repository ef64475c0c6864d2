"""The memory cap (4 GiB) met by the driver API from C, PyTorch's three
allocators, CuPy and JAX."""

from __future__ import annotations

import json

from real_gpu_rows.bench import Bench, failed
from real_gpu_rows.rows import (
    BLOCK_MIB,
    CAP_BYTES,
    CAP_FLAG,
    DRIVER_SLACK_BYTES,
    GiB,
    MiB,
    Row,
    Skip,
    Spec,
    oom,
    size,
    verdict,
)

MEMORY_CLIENTS = (
    # id, row, framework (None: the C client), PYTORCH_CUDA_ALLOC_CONF
    ("c", "driver API from C (cuMemAlloc)", None, None),
    ("torch", "PyTorch, caching allocator", "torch", None),
    ("torch-expandable", "PyTorch, expandable_segments:True", "torch", "expandable_segments:True"),
    ("torch-async", "PyTorch, backend:cudaMallocAsync", "torch", "backend:cudaMallocAsync"),
    ("cupy", "CuPy", "cupy", None),
    ("jax", "JAX (preallocates)", "jax", None),
)


def fill_once(bench: Bench, command: list[str], env: dict[str, str], what: str) -> dict:
    """Runs a fill client until it reports, asks the driver what it lists for
    it while it holds its memory, then lets it go."""
    proc = bench.start(command, env)
    report = None
    while report is None:       # its JSON line, after whatever a framework prints first
        line = proc.line(bench.left(150))
        if line is None:
            break
        try:
            report = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(report, dict) or "pid" not in report:
            report = None
    if report is not None:
        report["driver_lists_bytes"] = bench.driver.process_bytes().get(report["pid"])
        report["driver_listed"] = bench.driver.nvml is not None
    proc.send("\n")
    out, err = bench.finish(proc, 60, what)
    if proc.returncode == 77:
        raise Skip(out.strip() or "the client cannot run here")
    if report is None:
        raise RuntimeError(failed(what, (proc.returncode, err or out)))
    return report


def memory_spec(client_id: str, name: str, framework: str | None, conf: str | None) -> Spec:
    def fn(bench: Bench) -> list[Row]:
        env = dict(bench.env)
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        seen = {}
        for setup, limit in (("uncapped", CAP_BYTES + GiB), ("capped", 4 * CAP_BYTES)):
            command = ([bench.c_client(), "fill", str(BLOCK_MIB), str(limit // MiB)] if framework is None
                       else bench.python("framework_fill.py", framework, BLOCK_MIB, limit // MiB))
            if setup == "capped":
                command = bench.capped(["--memory", CAP_FLAG], command)
            seen[setup] = fill_once(bench, command, env, f"{name} ({setup})")
        extra = seen["capped"].get("extra") or {}
        if framework and extra.get("version"):
            bench.versions[framework] = extra["version"]
        return [judge_memory(name, seen["uncapped"], seen["capped"], framework)]
    needs = (framework,) if framework else ()
    return Spec(f"memory.{client_id}", name, 200, fn, needs)


def judge_memory(name: str, free: dict, capped: dict, framework: str | None) -> Row:
    total = capped.get("total_bytes")
    if framework == "jax":      # JAX has no mem_get_info of its own: the driver's, in the process
        total = (capped.get("driver_meminfo") or [None, None])[1]
    listed = capped.get("driver_lists_bytes")
    held_at_refusal = capped["blocks"] * capped["block_bytes"]
    checks = {
        "sees the cap as the total": total == CAP_BYTES,
        "refused with an out-of-memory error": oom(capped["error"]),
        "held no more than the cap": held_at_refusal <= CAP_BYTES,
        "allocates again after freeing half": capped["again"] >= 1,
        "the driver lists no more than the cap + 1 % + 16 MiB":
            listed is not None and listed <= CAP_BYTES * 1.01 + DRIVER_SLACK_BYTES,
    }
    missing = [what for what, ok in checks.items() if not ok]
    extra = capped.get("extra") or {}
    prealloc = extra.get("preallocated_bytes")
    return Row("memory", name,
               uncapped=fill_text(free, framework),
               capped=fill_text(capped, framework) + (f"; preallocated {size(prealloc)}" if prealloc else ""),
               expect="total = cap; refused with its OOM error; allocates again after freeing half; "
                      "driver lists <= cap + 1 % + 16 MiB",
               verdict=verdict(not missing),
               note="" if not missing else "not: " + "; ".join(missing)
               + ("" if listed is not None or not capped.get("driver_listed") else
                  " (the driver did not list the process)"),
               data={"uncapped": free, "capped": capped, "checks": checks})


def fill_text(report: dict, framework: str | None) -> str:
    total = report.get("total_bytes")
    if framework == "jax":
        total = (report.get("driver_meminfo") or [None, None])[1]
    got = report["blocks"]
    error = report["error"]
    stop = "no refusal" if error == "none" else f"then {error[:70]}"
    return (f"sees {size(total)}; {got} x {BLOCK_MIB} MiB, {stop}; after freeing {report['freed']}: "
            f"{report['again']} more; driver lists {size(report.get('driver_lists_bytes'))}")

"""Frameworks sharing device memory between processes, and giving it back and
taking it again, under the 4 GiB cap (tests/clients/framework_share.py): at
each step, what the driver lists for each of the container's processes (NVML)
against what the region counts for it.  The driver charges shared memory to
one process at a time; the shim charges each holder's container, the
importer's from the open (docs/memory.md, "Framework paths"), so a process's
region figure is never below the driver's, and an importer's is above it by
what it opened while its exporter still holds it."""

from __future__ import annotations

import json

from real_gpu_rows.bench import Bench, failed
from real_gpu_rows.rows import (
    CAP_BYTES,
    CAP_FLAG,
    NODE_TOLERANCE_BYTES,
    MiB,
    Row,
    Skip,
    Spec,
    size,
    verdict,
)

SHARED_MIB = 1024
SLEEP_WAKE_MIB, SLEEP_WAKE_ROUNDS = 2048, 20

SHARING_WAYS = (
    # id, row, way, PYTORCH_CUDA_ALLOC_CONF, the module it needs
    ("torch-ipc", "torch.multiprocessing, CUDA IPC", "torch-ipc", None, "torch"),
    ("torch-ipc-expandable", "torch.multiprocessing, expandable_segments:True", "torch-ipc",
     "expandable_segments:True", "torch"),
    ("nccl", "torch.distributed NCCL, world size 1", "nccl", None, "torch"),
    ("cupy-ipc", "CuPy IPC memory handles", "cupy-ipc", None, "cupy"),
    ("sleep-wake", f"VMM sleep/wake x {SLEEP_WAKE_ROUNDS} (vLLM's pattern)", "sleep-wake", None, None),
)
SIMULATED_SLEEP_WAKE = ("compares the real driver's per-process figures; on the simulated GPU "
                        "tests/test_framework_paths.py runs this loop and its double release")


def region_view(bench: Bench, region: str) -> tuple[dict[int, int], int | None]:
    """What the region counts: per host pid, and for the device."""
    result = bench.run(bench.vgpulimit("status", "--region", region, "--json"), 30, "vgpulimit status")
    if result.returncode != 0:
        raise RuntimeError(failed("vgpulimit status", result))
    status = json.loads(result.stdout)
    procs = {p["host_pid"]: p["used_bytes"] or 0 for p in status.get("processes", []) if p.get("host_pid")}
    [device] = status["devices"][:1] or [{}]
    return procs, device.get("used_bytes")


def compare(bench: Bench, region: str, report: dict) -> dict:
    """One step: the driver's list and the region's, for the processes the client names."""
    pids = [p for p in (report.get("pid"), report.get("child_pid")) if p]
    listed = bench.driver.process_bytes()
    counted, used = region_view(bench, region)
    per_pid = {pid: (listed.get(pid), counted.get(pid)) for pid in pids}
    # What the shim charges a process is at least the driver's figure for it (overhead.c), to
    # within the node view's tolerance, and never past the cap.
    matched = all(driver is None or (ours is not None and ours + NODE_TOLERANCE_BYTES >= driver)
                  for driver, ours in per_pid.values())
    return {"step": report.get("step"), "per_pid": per_pid, "region_used": used,
            "within_cap": used is not None and used <= CAP_BYTES, "matched": matched, "client": report}


def run_sharing(bench: Bench, way_id: str, name: str, way: str, conf: str | None,
                rounds: int = SLEEP_WAKE_ROUNDS) -> Row:
    """The client under the cap, each of its steps compared."""
    env = dict(bench.env)
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    region = str(bench.work / f"sharing-{way_id}.region")
    args = [way, SLEEP_WAKE_MIB, rounds] if way == "sleep-wake" else [way, SHARED_MIB]
    proc = bench.start(bench.capped(["--memory", CAP_FLAG, "--region", region],
                                    bench.python("framework_share.py", *args)), env)
    steps = []
    while True:
        line = proc.line(bench.left(120))
        if line is None:
            break
        try:
            report = json.loads(line)
        except json.JSONDecodeError:
            continue                    # what a framework prints of its own
        steps.append(compare(bench, region, report))
        proc.write("\n")
    out, err = bench.finish(proc, 60, name)
    if proc.returncode == 77:
        raise Skip(out.strip().splitlines()[-1] if out.strip() else "the client cannot run here")
    if proc.returncode != 0 or not steps:
        raise RuntimeError(failed(name, (proc.returncode, err or out)))
    return judge_sharing(name, way, steps)


def sharing_spec(way_id: str, name: str, way: str, conf: str | None, module: str | None) -> Spec:
    def fn(bench: Bench) -> list[Row]:
        if module is None and bench.simulate:
            raise Skip(SIMULATED_SLEEP_WAKE)
        return [run_sharing(bench, way_id, name, way, conf)]
    return Spec(f"sharing.{way_id}", name, 240, fn, (module,) if module else ())


def judge_sharing(name: str, way: str, steps: list[dict]) -> Row:
    checks = {
        "every step: each process's region figure at least the driver's (less 16 MiB)": all(
            s["matched"] for s in steps),
        "every step: the region within the cap": all(s["within_cap"] for s in steps),
    }
    if way == "sleep-wake":
        awake = [s for s in steps if s["step"] == "awake"]
        asleep = [s for s in steps if s["step"] == "asleep"]
        checks["every wake maps the whole model again"] = all(s["client"].get("rc") == 0 for s in awake)
        checks["every sleep gives the model's bytes back to the region"] = all(
            a["region_used"] is not None and s["region_used"] is not None
            and a["region_used"] - s["region_used"] >= SLEEP_WAKE_MIB * MiB
            for a, s in zip(awake, asleep, strict=False))
        checks["a double release is refused"] = all(s["client"].get("double_release") not in (0, None)
                                                    for s in asleep)
    elif way in ("torch-ipc", "cupy-ipc"):
        shared = steps[0]
        parent, child = shared["client"].get("pid"), shared["client"].get("child_pid")
        checks["the child saw the parent's tensor"] = shared["client"].get("child_saw") == 7.0
        # The driver charges the tensor to the process that made it; the region charges the
        # child too, from its open (docs/memory.md, "Framework paths").
        driver_parent, _ = shared["per_pid"].get(parent, (None, None))
        driver_child, region_child = shared["per_pid"].get(child, (None, None))
        checks["the driver lists the tensor for the parent; the region charges the child it too"] = (
            driver_parent is not None and driver_parent >= SHARED_MIB * MiB
            and driver_child is not None and driver_child < SHARED_MIB * MiB
            and region_child is not None and region_child >= SHARED_MIB * MiB)
    missing = [what for what, ok in checks.items() if not ok]

    def text(s: dict) -> str:
        return f"{s['step']}: " + ", ".join(f"pid {pid} driver {size(d)} region {size(r)}"
                                             for pid, (d, r) in s["per_pid"].items())
    shown = steps if len(steps) <= 4 else [steps[0], steps[1], steps[-2], steps[-1]]
    return Row("sharing", name,
               uncapped="; ".join(text(s) for s in shown),
               capped=f"region used at the end {size(steps[-1]['region_used'])}, "
                      f"{len(steps)} steps checked",
               expect="per process: region >= driver's list - 16 MiB at every step; region <= cap"
                      + ("; each sleep gives 2 GiB back, each wake takes it again" if way == "sleep-wake" else ""),
               verdict=verdict(not missing), note="" if not missing else "not: " + "; ".join(missing),
               data={"steps": steps, "checks": checks})

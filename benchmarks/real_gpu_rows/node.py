"""The node view: two capped containers at once, as status --all and metrics
--all show them against the driver's list."""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from pathlib import Path

from real_gpu_rows.bench import Bench, failed
from real_gpu_rows.rows import BLOCK_MIB, NODE_TOLERANCE_BYTES, MiB, Row, Spec, size, verdict

NODE_TENANTS = (("a", "6GiB", 1024), ("b", "10GiB", 2048))   # region, cap, MiB held


def scrape_metrics(bench: Bench, directory: Path) -> str:
    proc = bench.start(bench.vgpulimit("metrics", "--all", str(directory), "--listen", "127.0.0.1:0"))
    try:
        deadline = time.monotonic() + bench.left(30)
        url = None
        while url is None and time.monotonic() < deadline:
            line = proc.line(max(0.1, deadline - time.monotonic()), stderr=True)
            if not line:
                break
            if "serving metrics on " in line:
                url = line.split("serving metrics on ")[1].strip()
        if url is None:
            raise RuntimeError("vgpulimit metrics did not say where it serves")
        with urllib.request.urlopen(url, timeout=bench.left(20)) as response:
            return response.read().decode()
    finally:
        proc.kill()


def metric_values(text: str, name: str) -> list[tuple[str, float]]:
    out = []
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            labels, _, value = line.rpartition(" ")
            out.append((labels, float(value)))
    return out


def node_spec() -> Spec:
    def fn(bench: Bench) -> list[Row]:
        directory = bench.work / "node"
        shutil.rmtree(directory, ignore_errors=True)
        holders = {}
        for tenant, cap, held_mib in NODE_TENANTS:
            (directory / tenant).mkdir(parents=True)
            command = bench.capped(["--memory", cap, "--region", str(directory / tenant / "region")],
                                   [bench.c_client(), "fill", str(BLOCK_MIB), str(held_mib)])
            holders[tenant] = bench.start(command)
        pids = {}
        for tenant, proc in holders.items():
            line = proc.line(bench.left(60))
            if line is None:
                _, err = bench.finish(proc, 10, f"container {tenant}")
                raise RuntimeError(failed(f"container {tenant}", (proc.returncode, err)))
            pids[tenant] = json.loads(line)["pid"]
        try:
            status = bench.run(bench.vgpulimit("status", "--all", str(directory), "--json", "--interval", "0"),
                               30, "vgpulimit status --all")
            text = bench.run(bench.vgpulimit("status", "--all", str(directory), "--interval", "0"),
                             30, "vgpulimit status --all")
            listed = bench.driver.process_bytes()
            memory = bench.driver.memory()
            smi = None
            if shutil.which("nvidia-smi"):
                smi = bench.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                 "--format=csv,noheader,nounits"], 30, "nvidia-smi").stdout
            metrics = scrape_metrics(bench, directory)
        finally:
            for proc in holders.values():
                proc.send("\n")
        if status.returncode != 0:
            raise RuntimeError(failed("vgpulimit status --all", status))
        return judge_node(json.loads(status.stdout), text.stdout, pids, listed, memory, smi, metrics)
    return Spec("node.view", "node view", 90, fn)


def judge_node(status: dict, text: str, pids: dict[str, int], listed: dict[int, int], memory: dict,
               smi: str | None, metrics: str) -> list[Row]:
    per_process = {p["host_pid"]: p["used_bytes"] for region in status.get("regions", [])
                   for p in region.get("processes", []) if p.get("host_pid")}
    smi_bytes = {}
    for line in (smi or "").splitlines():
        try:
            pid, mib = line.split(",")
            smi_bytes[int(pid)] = int(mib.strip()) * MiB
        except ValueError:
            continue
    rows = []
    driver = {t: listed.get(pid) for t, pid in pids.items()}
    shown = {t: per_process.get(pid) for t, pid in pids.items()}
    ok = all(driver[t] is not None and shown[t] is not None
             and abs(driver[t] - shown[t]) <= NODE_TOLERANCE_BYTES for t in pids)
    source = "nvidia-smi" if smi else "NVML"
    outside = {t: smi_bytes.get(pid, listed.get(pid)) for t, pid in pids.items()}
    rows.append(Row("node", "per-process memory, two capped containers",
                    uncapped=f"{source}: " + ", ".join(f"{t} {size(outside[t])}" for t in pids),
                    capped="status --all: " + ", ".join(f"{t} {size(shown[t])}" for t in pids),
                    expect=f"each within {NODE_TOLERANCE_BYTES // MiB} MiB of the driver's list",
                    verdict=verdict(ok), data={"driver": driver, "status": shown, "nvidia_smi": smi_bytes,
                                               "pids": pids}))
    [gpu] = status.get("gpus") or [None]
    if gpu is None:
        rows.append(Row("node", "GPU used and the driver's reserve", verdict="FAIL",
                        note=f"status --all shows no GPU: {status.get('gpus_error')}"))
    else:
        want = (memory.get("used_bytes"), memory.get("reserved_bytes"))
        got = (gpu.get("used_bytes"), gpu.get("reserved_bytes"))
        ok = all(w is not None and g is not None and abs(w - g) <= NODE_TOLERANCE_BYTES
                 for w, g in zip(want, got, strict=True))
        rows.append(Row("node", "GPU used and the driver's reserve",
                        uncapped=f"NVML v2: used {size(want[0])}, reserved {size(want[1])} "
                                 f"(v1 used {size(memory.get('v1_used_bytes'))})",
                        capped=f"status --all: used {size(got[0])}, reserved {size(got[1])}, "
                               f"outside any cap {size(gpu.get('outside_bytes'))}",
                        expect=f"used and reserved within {NODE_TOLERANCE_BYTES // MiB} MiB of NVML v2",
                        verdict=verdict(ok), data={"nvml": memory, "gpu": gpu, "text": text}))
    used = metric_values(metrics, "vgpulimit_memory_used_bytes")
    gpu_used = metric_values(metrics, "vgpulimit_gpu_memory_used_bytes")
    reserved = metric_values(metrics, "vgpulimit_gpu_memory_reserved_bytes")
    regions = {r["region"]: sum(d["used_bytes"] or 0 for d in r.get("devices", []))
               for r in status.get("regions", [])}
    matched = all(any(f'region="{path}"' in labels and abs(value - nbytes) <= NODE_TOLERANCE_BYTES
                      for labels, value in used) for path, nbytes in regions.items())
    ok = matched and len(regions) == len(pids) and bool(gpu_used) and bool(reserved)
    rows.append(Row("node", "metrics --all, scraped once",
                    uncapped=f"{len(metrics.splitlines())} lines",
                    capped=f"{len(used)} container series, GPU used {size(gpu_used[0][1]) if gpu_used else 'absent'}, "
                           f"reserved {size(reserved[0][1]) if reserved else 'absent'}",
                    expect="both containers' memory as status shows it; the GPU's used and reserve",
                    verdict=verdict(ok), data={"metrics": metrics[-6000:]}))
    return rows

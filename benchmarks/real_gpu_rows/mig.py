"""On one MIG instance: the memory cap, the compute share and the tools, with
the limits named by the instance's MIG-<uuid>.  They run where a GPU is in MIG
mode with instances already; the run never enables, disables or changes MIG,
and without an instance the rows are skipped with the reason.  On the
simulated GPU they run on a simulated H100 in MIG mode of their own
(SIMGPU_MIG)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys

from real_gpu_rows.bench import Bench, failed
from real_gpu_rows.memory import fill_once
from real_gpu_rows.rows import (
    BLOCK_MIB,
    CAP_BYTES,
    CAP_FLAG,
    SHARE_TOLERANCE_PP,
    MiB,
    Row,
    Skip,
    Spec,
    oom,
    pct,
    size,
    verdict,
)
from real_gpu_rows.share import Kernels, kernel_ns_of, kernels_share, share_timing
from real_gpu_rows.tools import tool_commands

SIMULATED_LAYOUT = {"SIMGPU_PROFILE": "h100-80gb", "SIMGPU_MIG": "3g.40gb,2g.20gb,1g.10gb"}
SHARE_PCT = 30

# The first MIG device of the first GPU in MIG mode, by NVML, as JSON; or why there is none.
_FIND = """
import json, pynvml as n
n.nvmlInit()
for i in range(n.nvmlDeviceGetCount()):
    g = n.nvmlDeviceGetHandleByIndex(i)
    try:
        on = n.nvmlDeviceGetMigMode(g)[0] == 1
    except n.NVMLError:
        on = False
    for k in range(n.nvmlDeviceGetMaxMigDeviceCount(g) if on else 0):
        try:
            m = n.nvmlDeviceGetMigDeviceHandleByIndex(g, k)
        except n.NVMLError:
            continue
        print(json.dumps({"uuid": n.nvmlDeviceGetUUID(m), "name": n.nvmlDeviceGetName(m),
                          "total": n.nvmlDeviceGetMemoryInfo(m).total}))
        raise SystemExit(0)
print(json.dumps({"none": "no GPU here is in MIG mode with an instance (this run never changes MIG)"}))
"""


def mig_env(bench: Bench) -> dict[str, str]:
    if not bench.simulate:
        return dict(bench.env)
    return dict(bench.env, **SIMULATED_LAYOUT, SIMGPU_STATE=str(bench.work / "mig.simgpu"))


def find_instance(bench: Bench, env: dict[str, str]) -> dict:
    """The MIG device the rows use; Skip where there is none."""
    result = subprocess.run([sys.executable, "-c", _FIND], env=env, capture_output=True, text=True,
                            timeout=bench.left(60), check=False)
    if result.returncode != 0:
        raise Skip(f"NVML cannot say whether a GPU is in MIG mode: {result.stderr.strip()[-200:]}")
    found = json.loads(result.stdout.strip().splitlines()[-1])
    if "none" in found:
        raise Skip(found["none"])
    return found


def instance_env(bench: Bench) -> tuple[dict[str, str], dict]:
    env = mig_env(bench)
    found = find_instance(bench, env)
    # What the toolkit's device nodes leave a container given it: that one device.
    return dict(env, CUDA_VISIBLE_DEVICES=found["uuid"]), found


def cap_spec() -> Spec:
    def fn(bench: Bench) -> list[Row]:
        env, found = instance_env(bench)
        flags = ["--memory-device", f"{found['uuid']}={CAP_FLAG}"]
        command = [bench.c_client(), "fill", str(BLOCK_MIB), str(4 * CAP_BYTES // MiB)]
        capped = fill_once(bench, bench.capped(flags, command), env, "fill on the MIG instance")
        held = capped["blocks"] * capped["block_bytes"]
        checks = {"sees the cap as the total": capped.get("total_bytes") == CAP_BYTES,
                  "refused with an out-of-memory error": oom(capped["error"]),
                  "held no more than the cap": held <= CAP_BYTES,
                  "allocates again after freeing half": capped["again"] >= 1}
        missing = [what for what, ok in checks.items() if not ok]
        return [Row("mig", f"memory cap {CAP_FLAG} on {found['name']}",
                    uncapped=f"the instance: {size(found['total'])}",
                    capped=f"sees {size(capped.get('total_bytes'))}; {capped['blocks']} x {BLOCK_MIB} MiB, "
                           f"then {capped['error'][:60]}; {capped['again']} more after freeing",
                    expect="total = cap; refused with OOM; allocates again", verdict=verdict(not missing),
                    note="" if not missing else "not: " + "; ".join(missing),
                    data={"instance": found, "capped": capped, "checks": checks})]
    return Spec("mig.cap", "memory cap on a MIG instance", 120, fn)


def share_spec() -> Spec:
    kernels = Kernels(1000, "1", 1)

    def fn(bench: Bench) -> list[Row]:
        env, found = instance_env(bench)
        settle, window = share_timing(bench, kernels)

        def spin(cores: int | None, calibrate: bool) -> str:
            command = bench.spin(kernels.us, settle + window, kernels.geometry, kernels.streams, int(calibrate))
            if cores is not None:
                command = bench.capped(["--cores-device", f"{found['uuid']}={cores}"], command)
            result = bench.run(command, settle + window + 60, "spin on the MIG instance", env)
            if result.returncode != 0:
                raise RuntimeError(failed("the spin client on the MIG instance", result))
            return result.stdout

        free_out = spin(None, True)
        kernel_ns = kernel_ns_of(free_out, kernels)
        free = kernels_share(free_out, kernel_ns, settle)
        got = kernels_share(spin(SHARE_PCT, False), kernel_ns, settle)
        ok = got is not None and abs(got - SHARE_PCT) <= SHARE_TOLERANCE_PP
        return [Row("mig", f"{kernels.text()} at {SHARE_PCT} % of {found['name']}",
                    uncapped=f"{pct(free)} (a kernel {kernel_ns / 1e3:.1f} us by events)", capped=pct(got),
                    expect=f"{SHARE_PCT} +- {SHARE_TOLERANCE_PP:g} pp", verdict=verdict(ok),
                    data={"instance": found, "kernel_ns": kernel_ns, "uncapped_pct": free,
                          "capped_pct": got})]
    return Spec("mig.share", "compute share on a MIG instance", 60, fn)


def tools_spec() -> Spec:
    def fn(bench: Bench) -> list[Row]:
        env, found = instance_env(bench)
        env["COLUMNS"] = "160"
        flags = ["--memory-device", f"{found['uuid']}={CAP_FLAG}"]
        rows = []
        for name in ("nvidia-smi", "nvitop -1", "gpustat --json"):
            command, needs = tool_commands()[name]
            title = f"{name} in a container capped on {found['name']}"
            missing = (shutil.which(needs) is None if needs == "nvidia-smi"
                       else importlib.util.find_spec(needs) is None)
            if missing:
                rows.append(Row("mig", title, verdict="SKIP", note=f"{needs} is not here"))
                continue
            result = bench.run(bench.capped(flags, command), 60, f"{name} on the MIG instance", env)
            shown = str(CAP_BYTES // MiB) in result.stdout
            ok = result.returncode == 0 and shown
            rows.append(Row("mig", title,
                            capped=f"exit {result.returncode}" + (f", shows {CAP_BYTES // MiB} MiB" if shown else ""),
                            expect=f"exit 0, shows {CAP_BYTES // MiB} MiB", verdict=verdict(ok),
                            note="" if ok else failed(name, result)[:300],
                            data={"rc": result.returncode, "stdout": result.stdout[-4000:],
                                  "stderr": result.stderr[-2000:]}))
        return rows
    return Spec("mig.tools", "tools on a MIG instance", 150, fn)


def mig_specs() -> list[Spec]:
    return [cap_spec(), share_spec(), tools_spec()]

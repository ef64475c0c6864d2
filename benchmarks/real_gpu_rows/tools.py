"""nvidia-smi, nvitop, gpustat and `vgpulimit verify`, inside the cap."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys

from real_gpu_rows.bench import Bench, failed
from real_gpu_rows.rows import CAP_BYTES, CAP_FLAG, MiB, Row, Skip, Spec, pct, verdict

TOOL_IDS = {"nvidia-smi": "smi", "nvidia-smi --query-gpu": "smi-query", "nvidia-smi -q": "smi-q",
            "nvitop -1": "nvitop", "gpustat --json": "gpustat"}


def tool_commands() -> dict[str, tuple[list[str], str]]:
    """name -> (command, the module it needs or the executable it is)."""
    return {
        "nvidia-smi": (["nvidia-smi"], "nvidia-smi"),
        "nvidia-smi --query-gpu": (["nvidia-smi", "--query-gpu=memory.total,memory.used",
                                    "--format=csv,noheader,nounits"], "nvidia-smi"),
        "nvidia-smi -q": (["nvidia-smi", "-q", "-d", "MEMORY,UTILIZATION,PIDS"], "nvidia-smi"),
        "nvitop -1": ([sys.executable, "-m", "nvitop", "-1"], "nvitop"),
        "gpustat --json": ([sys.executable, "-m", "gpustat", "--json"], "gpustat"),
    }


def shown_total_mib(name: str, output: str) -> str | None:
    """The memory total a tool printed, as text; None where it cannot be read."""
    try:
        if name == "gpustat --json":
            return str(json.loads(output)["gpus"][0]["memory.total"])
        if name == "nvidia-smi --query-gpu":
            return output.split(",")[0].strip()
    except (ValueError, KeyError, IndexError):
        return None
    return None


def shows_cap(name: str, output: str) -> bool:
    cap_mib = str(CAP_BYTES // MiB)
    if name in ("gpustat --json", "nvidia-smi --query-gpu"):
        return shown_total_mib(name, output) == cap_mib
    return cap_mib in output


def tool_spec(name: str) -> Spec:
    def fn(bench: Bench) -> list[Row]:
        command, needs = tool_commands()[name]
        if needs == "nvidia-smi" and shutil.which("nvidia-smi") is None:
            raise Skip("no nvidia-smi here (the NVIDIA driver's tool; the simulated GPU has none)"
                       if bench.simulate else "no nvidia-smi on the PATH")
        if needs != "nvidia-smi" and importlib.util.find_spec(needs) is None:
            raise Skip(f"{needs} is not installed (pip install '.[test]'; on a lent machine, carry its wheel)")
        env = dict(bench.env, COLUMNS="160")
        free = bench.run(command, 60, name, env)
        capped = bench.run(bench.capped(["--memory", CAP_FLAG], command), 60, f"{name} (capped)", env)
        ok = capped.returncode == 0 and shows_cap(name, capped.stdout)
        note = ""
        if capped.returncode != 0:
            note = failed(name, capped)
        elif not ok:
            note = f"its output does not show {CAP_BYTES // MiB} MiB"
        return [Row("tools", name, uncapped=tool_text(name, free), capped=tool_text(name, capped),
                    expect=f"exit 0, shows {CAP_BYTES // MiB} MiB", verdict=verdict(ok), note=note,
                    data={"uncapped": {"rc": free.returncode, "stdout": free.stdout[-4000:],
                                       "stderr": free.stderr[-2000:]},
                          "capped": {"rc": capped.returncode, "stdout": capped.stdout[-4000:],
                                     "stderr": capped.stderr[-2000:]}})]
    return Spec(f"tools.{TOOL_IDS[name]}", name, 150, fn)


def tool_text(name: str, result: subprocess.CompletedProcess) -> str:
    total = shown_total_mib(name, result.stdout)
    shown = f", total {total} MiB" if total else (", shows 4096" if shows_cap(name, result.stdout) else "")
    return f"exit {result.returncode}{shown}"


def verify_spec() -> Spec:
    def fn(bench: Bench) -> list[Row]:
        flags = ["--simulate"] if bench.simulate else []
        result = bench.run(bench.vgpulimit("verify", *flags, "--memory", CAP_FLAG, "--cores", "30", "--json"),
                           90, "vgpulimit verify")
        try:
            document = json.loads(result.stdout)
        except json.JSONDecodeError:
            return [Row("tools", "vgpulimit verify", expect="exit 0", verdict="FAIL",
                        note=failed("vgpulimit verify", result))]
        facts = document.get("facts", {})
        checks = document.get("checks", [])
        failing = [f"{c['name']}: {c['message']}" for c in checks if c.get("status") == "fail"]
        past = (facts.get("fill") or {}).get("past_cap")
        libcuda = (facts.get("cuda") or {}).get("libcuda") or ""
        ok = (result.returncode == 0 and past == "CUDA_ERROR_OUT_OF_MEMORY"
              and (bench.simulate or "simgpu" not in libcuda))
        share = (facts.get("share") or {}).get("achieved_pct")
        passed = sum(c.get("status") == "pass" for c in checks)
        return [Row("tools", "vgpulimit verify --memory 4GiB --cores 30",
                    uncapped="(nothing to check without limits)",
                    capped=f"exit {result.returncode}; {passed} of {len(checks)} checks pass; past the cap: "
                           f"{past}; share {pct(share)} at 30",
                    expect="exit 0; past the cap CUDA_ERROR_OUT_OF_MEMORY; the real libcuda",
                    verdict=verdict(ok), note="; ".join(failing)[:300],
                    data={"rc": result.returncode, "document": document})]
    return Spec("tools.verify", "vgpulimit verify", 120, fn)

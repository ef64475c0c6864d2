"""The tools people run first in a capped container — an NVML client making
nvidia-smi's default-view calls, `nvitop -1`, `gpustat --json` and pynvml —
on a simulated GPU that answers NVML as the H200's driver did: the
process-utilisation size query gets a fixed count, and the call with a buffer
then NOT_FOUND while nothing ran (all three tools died there with SIGSEGV
under the shim on the H200). Each runs to its end and shows the cap, idle and
beside a busy neighbour."""

from __future__ import annotations

import json
import re
import sys

import pytest
from conftest import C_DIR, GiB, MiB, compile_c, have, run, vgpulimit_cmd
from containers import CLIENTS, container, joined, outsider


@pytest.fixture(scope="module")
def smi_view(tmp_path_factory):
    return compile_c(tmp_path_factory.mktemp("smi") / "smi_view", [C_DIR / "smi_view.c"], "-ldl")


def tool(name: str, smi_view) -> list:
    return {
        "nvidia-smi calls": [smi_view],
        "nvitop -1": [sys.executable, "-m", "nvitop", "-1"],
        "gpustat --json": [sys.executable, "-m", "gpustat", "--json"],
        "pynvml": [sys.executable, CLIENTS / "nvml_view.py"],
    }[name]


UNITS = {"B": 1, "KiB": 1 << 10, "MiB": MiB, "GiB": GiB}


def shown(name: str, out: str) -> tuple[int, int]:
    """(used, total) in MiB as the tool shows them."""
    if name == "gpustat --json":
        [gpu] = json.loads(out)["gpus"]
        return gpu["memory.used"], gpu["memory.total"]
    if name == "pynvml":
        [dev] = json.loads(out)["devices"]
        return dev["v2"]["used"] // MiB, dev["v2"]["total"] // MiB
    used, unit, total = re.search(r"([\d.]+) ?(B|KiB|MiB|GiB) / (\d+)MiB", out).groups()
    return round(float(used) * UNITS[unit] / MiB), int(total)


TOOLS = ["nvidia-smi calls", "nvitop -1", "gpustat --json", "pynvml"]


def skip_without(name: str):
    if name == "gpustat --json" and not have("gpustat"):
        pytest.skip("gpustat is not installed (pip install '.[test]' installs it)")


@pytest.mark.parametrize("name", TOOLS)
def test_a_tool_on_an_idle_capped_device(sim_env, smi_view, name):
    """Nothing has run: the driver's samples are none (NOT_FOUND after the
    size query), and the tool shows the cap."""
    skip_without(name)
    result = run(vgpulimit_cmd("run", "--simulate", "--memory", "1GiB", "--",
                               *map(str, tool(name, smi_view))), dict(sim_env, COLUMNS="120"))
    assert shown(name, result.stdout) == (0, 1024)


@pytest.mark.parametrize("name", TOOLS)
def test_a_tool_joined_to_a_busy_container(sim_env, tmp_path, shim_path, smi_view, name):
    """A tool exec'd into a container whose process holds 512 MiB under a
    2 GiB cap, beside a process of no container holding 1 GiB: it shows the
    cap, the container's use and only its process."""
    skip_without(name)
    region = tmp_path / "c" / "region"
    with outsider(sim_env, tmp_path, 1 * GiB) as other, \
            container(sim_env, region, ["--memory", "2GiB"], [(512 * MiB, 1)]) as [holder]:
        out = run(tool(name, smi_view), joined(sim_env, region, shim_path, COLUMNS="120")).stdout
    assert shown(name, out) == (512, 2048)
    if name == "nvidia-smi calls":
        assert f"Process: {holder['pid']}  512 MiB" in out
        assert f"Process: {other['pid']} " not in out
    if name == "gpustat --json":
        [gpu] = json.loads(out)["gpus"]
        assert [p["pid"] for p in gpu["processes"]] == [holder["pid"]]

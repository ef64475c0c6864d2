"""On a real GPU (skipped elsewhere): the tools a user types first in a capped
container — the real nvidia-smi (its default view, --query-gpu, -q), nvitop's
one-shot view and gpustat — exit 0 and show the cap; and memory the driver
takes on its own after the context (modules loaded at a kernel's first
launch, local memory) keeps what it lists for the process within the cap."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import MiB, base_env, have, real_gpu_missing, run, vgpulimit_cmd
from containers import CLIENTS

pytestmark = pytest.mark.gpu

CAP = ["--memory", "4GiB"]
TOOLS = {
    "nvidia-smi": ["nvidia-smi"],
    "nvidia-smi --query-gpu": ["nvidia-smi", "--query-gpu=memory.total,memory.used",
                               "--format=csv,noheader,nounits"],
    "nvidia-smi -q": ["nvidia-smi", "-q", "-d", "MEMORY,UTILIZATION,PIDS"],
    "nvitop -1": [sys.executable, "-m", "nvitop", "-1"],
    "gpustat --json": [sys.executable, "-m", "gpustat", "--json"],
}


@pytest.fixture(autouse=True)
def real_gpu():
    reason = real_gpu_missing()
    if reason:
        pytest.skip(reason)


@pytest.mark.parametrize("name", TOOLS)
def test_a_tool_in_a_capped_container_shows_the_cap(name):
    if name == "gpustat --json" and not have("gpustat"):
        pytest.skip("gpustat is not installed (pip install '.[test]' installs it)")
    result = run(vgpulimit_cmd("run", *CAP, "--", *TOOLS[name]), dict(base_env(), COLUMNS="160"),
                 check=False)
    assert result.returncode == 0, f"{name} exited {result.returncode}\n{result.stderr}"
    if name == "gpustat --json":
        assert json.loads(result.stdout)["gpus"][0]["memory.total"] == 4096
    elif name == "nvidia-smi --query-gpu":
        assert result.stdout.split(",")[0].strip() == "4096"
    else:
        assert "4096" in result.stdout, result.stdout


def test_memory_the_driver_takes_later_stays_within_the_cap():
    """PyTorch fills a 4 GiB cap in 64 MiB steps, running a new kernel (a
    module the driver loads lazily) after each: at its refusal, what the
    driver lists for the process is within 1 % of the cap + 16 MiB."""
    pytest.importorskip("torch", reason="PyTorch is needed for this check")
    program = CLIENTS / "torch_fill_lazy.py"
    proc = subprocess.Popen([*vgpulimit_cmd("run", *CAP, "--"), sys.executable, str(program)],
                            env=base_env(), stdout=subprocess.PIPE, stdin=subprocess.PIPE,
                            text=True)
    try:
        report = json.loads(proc.stdout.readline())
        assert report["refused"], report
        listed = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                 "--format=csv,noheader,nounits"], capture_output=True,
                                text=True, check=True).stdout
        used = {int(p): int(m) for p, m in (line.split(",") for line in listed.splitlines())}
        assert used[report["host_pid"]] * MiB <= 4096 * MiB * 1.01 + 16 * MiB, (used, report)
    finally:
        proc.communicate("\n", timeout=60)

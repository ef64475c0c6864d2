"""The README's "try it with no GPU" example: a numba-cuda program
(examples/numba_pinned.py: a @cuda.jit kernel, pinned host buffers, two
streams, events) under `vgpulimit run --simulate --memory 1GiB --cores 50`,
with `vgpulimit status` read while it runs."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import ROOT, MiB, vgpulimit_cmd

EXAMPLE = ROOT / "examples" / "numba_pinned.py"


def test_the_numba_example_runs_on_the_simulated_gpu(sim_env, tmp_path):
    pytest.importorskip("numba.cuda", reason="numba-cuda is not installed (pip install '.[test]')")
    region = tmp_path / "region"
    proc = subprocess.Popen(
        vgpulimit_cmd("run", "--simulate", "--memory", "1GiB", "--cores", "50", "--region", str(region),
                      "--", sys.executable, str(EXAMPLE), "4"),
        env=sim_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = None
    while proc.poll() is None:
        status = subprocess.run(vgpulimit_cmd("status", "--json", "--region", str(region)), env=sim_env,
                                capture_output=True, text=True, check=False)
        if status.returncode == 0:
            look = json.loads(status.stdout)
            # A look taken as the program exits lists it gone, its bytes no longer
            # its own: that is not "while it ran".
            if look["devices"][0]["used_bytes"] and not any(p["gone"] for p in look["processes"]):
                seen = look
        time.sleep(0.3)
    out, err = proc.communicate(timeout=60)
    if proc.returncode != 0 and any(word in err.lower() for word in ("nvrtc", "nvjitlink", "nvvm")):
        pytest.skip(f"numba-cuda cannot compile here: {err.strip().splitlines()[-1]}")
    assert proc.returncode == 0, err
    got = json.loads(out)
    assert got["rounds"] >= 1 and got["round_ms"] > 0
    assert got["copied_back"] and got["mapped"] == [0, 0]
    # While it ran: its cap and share, and the device memory it holds: the two
    # device arrays of 16 MiB; the pinned buffers (64 MiB) are host memory.
    assert seen is not None, "status never showed the program's memory"
    device = seen["devices"][0]
    assert (device["cap_bytes"], device["cores_pct"]) == (1 << 30, 50)
    assert device["used_bytes"] == 32 * MiB
    [process] = seen["processes"]
    assert process["comm"].startswith("python") and process["used_bytes"] == 32 * MiB

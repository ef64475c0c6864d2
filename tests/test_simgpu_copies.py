"""Copies take time on the simulated GPU, as on a GPU: on its copy engines
(host to device, device to host, and one within the device for copies and
memsets), beside its kernels, in their streams' order, so that events and
synchronisation wait for them; and they are not kernel time, so NVML's
utilisation leaves them out.  Through cuda-bindings and nvidia-ml-py, with
SIMGPU_COPY_GBPS=1 and SIMGPU_DEVICE_COPY_GBPS=10: 4 MiB take 4.194 ms over
the link and 0.419 ms within the device.  Where work is held behind one
kernel and released at one instant, event times are the simulation's own,
exact; elsewhere the bounds below are the simulation's lower bounds."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import TESTS, run, vgpulimit_cmd

CLIENTS = TESTS / "clients"
LINK_MS, DEVICE_MS = 4.194304, 0.4194304  # 4 MiB at 1 GB/s, at 10 GB/s


@pytest.fixture
def slow_copies(sim_env):
    return sim_env | {"SIMGPU_COPY_GBPS": "1", "SIMGPU_DEVICE_COPY_GBPS": "10"}


def test_copies_run_on_copy_engines_in_stream_order(slow_copies):
    got = json.loads(run([sys.executable, CLIENTS / "copies.py", "engines"], slow_copies).stdout)
    # Each direction has its engine: they overlap.  One direction: in turn.
    assert got["h2d_beside_d2h_ms"] == pytest.approx([LINK_MS, LINK_MS], abs=0.002)
    assert got["h2d_after_h2d_ms"] == pytest.approx([LINK_MS, 2 * LINK_MS], abs=0.002)
    # Between two 20 ms kernels on a stream, a copy's time is on the stream...
    assert got["kernel_copy_kernel_ms"] == pytest.approx(40 + LINK_MS, abs=0.002)
    # ... and beside a kernel on another stream, the two overlap.
    assert got["kernel_beside_copy_ms"] == pytest.approx([20, LINK_MS], abs=0.002)
    # Memsets and copies within the device take the third engine, in turn.
    assert got["memset_then_d2d_ms"] == pytest.approx(2 * DEVICE_MS, abs=0.002)
    # An asynchronous copy from pinned memory returns before it is done...
    assert got["query_busy"] == "CUDA_ERROR_NOT_READY" and got["query_idle"] == "CUDA_SUCCESS"
    # ... one to pageable memory, and a synchronous one, when it is done.
    assert got["async_to_pageable_s"] >= LINK_MS / 1000 and got["query_after_pageable"] == "CUDA_SUCCESS"
    assert got["sync_s"] >= LINK_MS / 1000
    assert got["captured_copy"] == "CUDA_ERROR_NOT_SUPPORTED"  # simgpu's graphs hold kernels only


def utilization(env, since_us: int) -> dict:
    return json.loads(run([sys.executable, CLIENTS / "nvml_utilization.py", since_us], env).stdout)


def test_a_copy_only_program_keeps_the_copy_engines_busy_and_the_sms_idle(slow_copies):
    since_us = int(time.time() * 1e6)
    loop = subprocess.Popen([sys.executable, CLIENTS / "copies.py", "loop", "3"], env=slow_copies,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    while loop.poll() is None:
        seen.append(utilization(slow_copies, since_us))
        time.sleep(0.2)
    out, err = loop.communicate(timeout=60)
    assert loop.returncode == 0, err
    got = json.loads(out)
    # The copies' time is on the timeline: each round (4 MiB each way, on
    # two engines at once) took the link's time, back to back.
    assert got["copies"] >= 4
    assert got["elapsed_ms"] >= got["copies"] / 2 * LINK_MS
    # And none of it was kernel time.
    assert len(seen) >= 2
    assert all(s["gpu"] == 0 and s["samples"] == [] for s in seen), seen


@pytest.mark.parametrize("variable", ["SIMGPU_COPY_GBPS", "SIMGPU_DEVICE_COPY_GBPS"])
def test_a_bad_bandwidth_is_refused_naming_the_variable(sim_env, variable):
    result = run([sys.executable, CLIENTS / "copies.py", "engines"], sim_env | {variable: "50GB/s"},
                 check=False)
    assert result.returncode != 0
    assert f"{variable}=50GB/s" in result.stderr and "GB/s" in result.stderr


def test_copies_between_capped_kernels_do_not_draw_from_the_compute_share(slow_copies):
    """1 ms kernels on one stream, each followed by a 1.05 ms copy: uncapped,
    the kernels take 49 % of the GPU's time, so a share of 50 % has nothing
    to hold back."""
    command = [sys.executable, CLIENTS / "copies.py", "between", "3"]

    def kernel_share(*flags: str) -> float:
        out = run(vgpulimit_cmd("run", "--simulate", *flags, "--", *command), slow_copies).stdout
        return json.loads(out)["kernel_share"]

    uncapped = kernel_share()
    assert 0.4 <= uncapped <= 0.5
    assert kernel_share("--cores", "50") >= 0.8 * uncapped

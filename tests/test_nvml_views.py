"""What monitoring tools inside a container see through the shim: pynvml,
nvitop's Python API and `nvitop -1` report the cap as the device's memory,
the container's usage as used, and only the container's processes; device
numbering follows the devices given to the container."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest
from conftest import GiB, MiB, run, vgpulimit_cmd
from containers import CLIENTS, container, joined, outsider
from helpers import status_json


def made_on_first_use(sim_env, region, shim_path, **limits: str) -> dict[str, str]:
    """A process with limit variables whose region the shim makes at `region`
    on first use, as HAMi's shared cache is (one named by VGPULIMIT_REGION
    must exist already)."""
    return dict(sim_env, LD_PRELOAD=str(shim_path), CUDA_DEVICE_MEMORY_SHARED_CACHE=str(region), **limits)


def view(env, *args):
    return json.loads(run([sys.executable, CLIENTS / "nvml_view.py", *args], env).stdout)


def pids(entries):
    return sorted(pid for pid, _ in entries)


def test_pynvml_sees_the_cap_usage_and_only_the_containers_processes(sim_env, tmp_path, shim_path):
    region = tmp_path / "c" / "region"
    with outsider(sim_env, tmp_path, 1 * GiB) as other, \
            container(sim_env, region, ["--memory", "2GiB"], [(512 * MiB, 1)]) as [holder]:
        inside = view(joined(sim_env, region, shim_path))
        outside = view(sim_env)
    [dev] = inside["devices"]
    assert dev["v1"] == {"total": 2 * GiB, "used": 512 * MiB, "free": 1536 * MiB}
    assert dev["v2"] == {"total": 2 * GiB, "reserved": 0, "used": 512 * MiB, "free": 1536 * MiB}
    mine = [[holder["pid"], 512 * MiB]]
    for variant in ("compute", "compute_v2", "compute_v3", "detail_compute"):
        assert dev[variant] == mine, variant
    assert dev["graphics"] == dev["mps"] == []
    # Without the shim the same GPU shows both tenants and the whole device.
    [whole] = outside["devices"]
    assert whole["v1"]["total"] == 16 * GiB
    assert whole["v1"]["used"] == 1536 * MiB
    assert pids(whole["compute_v3"]) == sorted([holder["pid"], other["pid"]])


def test_usage_above_a_lowered_cap_never_shows_wrapped_numbers(sim_env, tmp_path, shim_path):
    region = tmp_path / "c" / "region"
    with container(sim_env, region, ["--memory", "1GiB"], [(768 * MiB, 1)]) as [holder]:
        run(vgpulimit_cmd("set", "--memory", "512MiB", "--region", region), sim_env)
        [dev] = view(joined(sim_env, region, shim_path))["devices"]
    # used never exceeds total, free never wraps below zero, total = reserved + used + free.
    assert dev["v1"] == {"total": 512 * MiB, "used": 512 * MiB, "free": 0}
    assert dev["v2"] == {"total": 512 * MiB, "reserved": 0, "used": 512 * MiB, "free": 0}
    # The process list keeps the true figure: it is what the process holds.
    assert dev["compute_v3"] == [[holder["pid"], 768 * MiB]]


def test_nvitop_api_and_once_mode_show_the_cap(sim_env, tmp_path, shim_path):
    region = tmp_path / "c" / "region"
    api = ("import json, nvitop; d = nvitop.Device(0); print(json.dumps({'total': "
           "d.memory_total(), 'used': d.memory_used(), 'pids': sorted(d.processes())}))")
    with outsider(sim_env, tmp_path, 1 * GiB) as other, \
            container(sim_env, region, ["--memory", "2GiB"], [(512 * MiB, 1)]) as [holder]:
        env = joined(sim_env, region, shim_path)
        seen = json.loads(run([sys.executable, "-c", api], env).stdout)
        once = run([sys.executable, "-m", "nvitop", "-1"], dict(env, COLUMNS="120")).stdout
    assert seen == {"total": 2 * GiB, "used": 512 * MiB, "pids": [holder["pid"]]}
    assert "512.0MiB / 2048MiB" in once
    assert f" {holder['pid']} " in once
    assert f" {other['pid']} " not in once


def test_device_count_and_handles_follow_cuda_visible_devices(sim_env, tmp_path, shim_path):
    """The container is given the second of two GPUs: NVML shows one device,
    numbered 0 as CUDA numbers it, with that device's cap; the other GPU
    cannot be reached by UUID either."""
    sim = dict(sim_env, SIMGPU_DEVICES="2")
    uuids = [d["uuid"] for d in view(sim)["devices"]]
    region = tmp_path / "region"
    for visible in ("1", uuids[1][:12]):
        env = made_on_first_use(sim, region, shim_path, CUDA_VISIBLE_DEVICES=visible,
                     VGPULIMIT_MEMORY_0="1GiB", VGPULIMIT_MEMORY_1="3GiB")
        seen = view(env, "--uuid-lookup", *uuids)
        assert seen["count"] == 1, visible
        [dev] = seen["devices"]
        assert (dev["uuid"], dev["index"], dev["v1"]["total"]) == (uuids[1], 0, 1 * GiB)
        assert seen["by_uuid"] == {uuids[0]: "NVMLError_NotFound", uuids[1]: 0}
        region.unlink()
    # An entry CUDA would reject ends the list there.
    env = made_on_first_use(sim, region, shim_path, CUDA_VISIBLE_DEVICES="1,7,0")
    assert view(env)["count"] == 1


def test_once_cuda_is_initialised_nvml_follows_cudas_numbering(sim_env, tmp_path, shim_path):
    env = made_on_first_use(dict(sim_env, SIMGPU_DEVICES="3"), tmp_path / "region", shim_path,
                 VGPULIMIT_MEMORY="1GiB")
    seen = view(env, "--cuda-init")
    assert [d["uuid"] for d in seen["devices"]] == seen["cuda_uuids"]
    assert [d["index"] for d in seen["devices"]] == [0, 1, 2]


def test_without_vgpulimit_nvml_is_untouched(sim_env, tmp_path, shim_path):
    with outsider(sim_env, tmp_path, 1 * GiB):
        direct = view(sim_env)
        shimmed = view(dict(sim_env, LD_PRELOAD=str(shim_path)))
    for dev in direct["devices"] + shimmed["devices"]:
        dev.pop("process_utilization")  # samples carry timestamps
    assert shimmed == direct


@contextmanager
def launching(launch_client, env, seconds=30):
    """A process launching 1 ms kernels back to back; yields its pid once it runs."""
    proc = subprocess.Popen([str(launch_client), "kernel", "1000", str(seconds)], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().split()
        assert line[:1] == ["progress"], line
        yield int(line[1])
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_utilisation_counts_only_the_containers_kernels(sim_env, tmp_path, shim_path,
                                                        launch_client):
    """Both tenants keep the GPU busy: the driver's per-process samples name
    both, the container sees its own only, and its utilisation is its part."""
    env = made_on_first_use(sim_env, tmp_path / "region", shim_path, VGPULIMIT_MEMORY="2GiB")
    with launching(launch_client, env) as mine, launching(launch_client, sim_env) as other:
        # Until the driver's samples name both (a sample period or two):
        deadline = time.monotonic() + 30
        while True:
            [outside] = view(sim_env)["devices"]
            samples = outside["process_utilization"]   # an error's name until there are some
            both = isinstance(samples, list) and {s["pid"] for s in samples} == {mine, other}
            if both or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        [inside] = view(env)["devices"]
    assert {s["pid"] for s in outside["process_utilization"]} == {mine, other}
    assert {s["pid"] for s in inside["process_utilization"]} == {mine}
    assert 0 < inside["utilization"]["gpu"] <= 100
    # A context and no allocation: listed, as the driver lists it, with 0 bytes.
    assert inside["compute_v3"] == [[mine, 0]]
    assert pids(outside["compute_v3"]) == sorted([mine, other])


@pytest.mark.skipif(os.stat("/proc/self/ns/pid").st_ino != 0xEFFFFFFC,
                    reason="the tests run in a pid namespace of their own: host pids are not ours")
def test_slots_carry_the_host_pid(sim_env, tmp_path):
    region = tmp_path / "c" / "region"
    with container(sim_env, region, ["--memory", "2GiB"], [(64 * MiB, 1)]) as [holder]:
        status = status_json(sim_env, region, "--interval", "0")
    [proc] = status["processes"]
    assert proc["pid"] == proc["host_pid"] == holder["pid"]

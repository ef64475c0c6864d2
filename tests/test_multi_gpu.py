"""Every device of a multi-GPU container is capped and throttled, whatever
numbering CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER give it: a cuda-bindings
program with a context, allocations, peer access and kernels on each device
(tests/clients/multi_device.py) meets each device's own cap and share, and
the region (`vgpulimit status --json`), NVML in the container and CUDA agree
by UUID on which device is which.  Limits given by UUID reach the device of
that UUID whatever its ordinal.  Shares are measured as in
test_compute_share.py: broad bounds, nothing timed on the machine."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import GiB, run, vgpulimit_cmd
from containers import CLIENTS, joined
from helpers import status_json

# Four H100s, two PCIe (114 SMs: machine 0 and 3) and two SXM (132: 1 and 2):
# CUDA's default order (fastest first) is 1, 2, 0, 3; by bus id 0, 1, 2, 3.
MACHINE = {"SIMGPU_DEVICES": "4", "SIMGPU_SMS": "114,132,132,114", "SIMGPU_MEMORY": "4GiB"}
SECONDS = "1.5"


def machine_uuids(env) -> list[str]:
    """NVML's UUIDs, in the machine's order."""
    code = ("import json, pynvml; pynvml.nvmlInit(); print(json.dumps([pynvml.nvmlDeviceGetUUID("
            "pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]))")
    return json.loads(run([sys.executable, "-c", code], env).stdout)


@contextmanager
def job(env, region: Path, limits: list[str]):
    """multi_device.py in `vgpulimit run --simulate`; yields its report per
    ordinal while it holds its memory."""
    release = region.parent / "release"
    proc = subprocess.Popen(vgpulimit_cmd("run", "--simulate", *limits, "--region", str(region), "--",
                                          sys.executable, str(CLIENTS / "multi_device.py"), SECONDS,
                                          "--hold", str(release)),
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        reports = []
        for line in proc.stdout:
            if line.strip() == "ready":
                break
            reports.append(json.loads(line))
        assert reports, proc.stderr.read() if proc.poll() is not None else "no report"
        yield reports
    finally:
        release.touch()
        proc.wait(timeout=60)
    assert proc.returncode == 0, proc.stderr.read()


def nvml(env, region, shim_path, cuda_init: bool) -> list[dict]:
    args = ["--cuda-init"] if cuda_init else []
    seen = json.loads(run([sys.executable, CLIENTS / "nvml_view.py", *args],
                          joined(env, region, shim_path)).stdout)
    return seen["devices"]


def expect_share(share: float, pct: int | None) -> None:
    if pct is None:
        assert share > 0.8, share
    else:
        assert pct / 100 * 0.5 < share < pct / 100 * 1.3, (share, pct)


# Limits by index: ordinal 0 gets 1 GiB and 30 %, ordinal 1 2 GiB and 60 %, the rest none.
BY_INDEX = ["--memory-device", "0=1GiB", "--cores-device", "0=30",
            "--memory-device", "1=2GiB", "--cores-device", "1=60"]
CAPS = [(1 * GiB, 30), (2 * GiB, 60), (None, None), (None, None)]


@pytest.mark.parametrize("order, visible, machine", [
    (None, None, [1, 2, 0, 3]),              # unset, the default order: fastest first
    ("PCI_BUS_ID", "2,0", [2, 0]),
    ("PCI_BUS_ID", "uuids 3,1", [3, 1]),     # the UUID of machine 3, a prefix of machine 1's
    ("PCI_BUS_ID", "1", [1]),
])
def test_each_device_is_capped_and_throttled_and_the_views_agree(sim_env, tmp_path, shim_path, order,
                                                                   visible, machine):
    env = sim_env | MACHINE
    uuids = machine_uuids(env)
    if visible == "uuids 3,1":
        visible = f"{uuids[3]},{uuids[1][:13]}"
    env |= {k: v for k, v in (("CUDA_DEVICE_ORDER", order), ("CUDA_VISIBLE_DEVICES", visible)) if v}
    region = tmp_path / "c" / "region"
    region.parent.mkdir()
    with job(env, region, BY_INDEX) as reports:
        assert [r["uuid"] for r in reports] == [uuids[m] for m in machine]
        for r, (cap, pct) in zip(reports, CAPS):
            shown = cap if cap is not None else 4 * GiB
            assert (r["total"], r["total_mem"], r["allocated"]) == (shown, shown, shown), r
            expect_share(r["share"], pct)
        if len(reports) > 1:
            assert reports[0]["peer"] == [1, "CUDA_SUCCESS"]
        # The region names each device by the UUID CUDA gives its ordinal.
        devices = {d["index"]: d for d in status_json(env, region, "--interval", "0")["devices"]}
        for r, (cap, pct) in zip(reports, CAPS):
            d = devices[r["ordinal"]]
            assert (d["uuid"], d["cap_bytes"], d["cores_pct"], d["used_bytes"]) == (r["uuid"], cap, pct,
                                                                                r["allocated"])
        # NVML in the container: the same devices, in CUDA's order, each with its cap.
        views = [nvml(env, region, shim_path, cuda_init=True)]
        if order == "PCI_BUS_ID":   # before cuInit the shim maps indices in bus order (devices.c)
            views.append(nvml(env, region, shim_path, cuda_init=False))
        for view in views:
            assert [(d["uuid"], d["index"], d["v1"]["total"]) for d in view] == \
                [(r["uuid"], r["ordinal"], r["total"]) for r in reports]


def test_limits_by_uuid_reach_the_device_whatever_its_ordinal(sim_env, tmp_path, shim_path):
    """A device plugin knows UUIDs: machine 0's limits, given by its UUID as a
    flag and as a variable, land on ordinal 1 of CUDA_VISIBLE_DEVICES=2,0;
    machine 3's, which the container is not given, on nothing."""
    env = sim_env | MACHINE | {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2,0"}
    uuids = machine_uuids(env)
    env[f"VGPULIMIT_CORES_{uuids[0]}"] = "40"
    env[f"VGPULIMIT_MEMORY_{uuids[3]}"] = "512MiB"
    region = tmp_path / "c" / "region"
    region.parent.mkdir()
    limits = ["--memory", "3GiB", "--memory-device", f"{uuids[0].upper()}=1GiB"]
    with job(env, region, limits) as [first, second]:
        assert (first["uuid"], first["total"], first["allocated"]) == (uuids[2], 3 * GiB, 3 * GiB)
        assert (second["uuid"], second["total"], second["allocated"]) == (uuids[0], 1 * GiB, 1 * GiB)
        expect_share(first["share"], None)
        expect_share(second["share"], 40)
        devices = status_json(env, region, "--interval", "0")["devices"]
        assert [(d["index"], d["uuid"], d["cap_bytes"], d["cores_pct"]) for d in devices[:2]] == \
            [(0, uuids[2], 3 * GiB, None), (1, uuids[0], 1 * GiB, 40)]
        view = nvml(env, region, shim_path, cuda_init=False)
        assert [(d["uuid"], d["v1"]["total"]) for d in view] == [(uuids[2], 3 * GiB), (uuids[0], 1 * GiB)]


def test_limits_by_uuid_from_the_environment_alone(sim_env, tmp_path, shim_path):
    """No supervisor: the shim's own region carries the UUID's limit to the
    ordinal the driver gives that UUID."""
    env = sim_env | MACHINE | {"CUDA_VISIBLE_DEVICES": "3,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    uuids = machine_uuids(env)
    env |= {f"VGPULIMIT_MEMORY_{uuids[1]}": "2GiB", "VGPULIMIT_MEMORY": "1GiB",
            "LD_PRELOAD": str(shim_path)}
    out = run([sys.executable, CLIENTS / "multi_device.py", "0.2"], env).stdout.splitlines()
    first, second = (json.loads(line) for line in out[:2])
    assert (first["uuid"], first["total"], first["allocated"]) == (uuids[3], 1 * GiB, 1 * GiB)
    assert (second["uuid"], second["total"], second["allocated"]) == (uuids[1], 2 * GiB, 2 * GiB)


def test_a_bad_uuid_limit_is_one_line(sim_env, tmp_path):
    env = sim_env | {"VGPULIMIT_MEMORY_GPU-1234": "1GiB"}
    result = run(vgpulimit_cmd("run", "--simulate", "--", "true"), env, check=False)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert "VGPULIMIT_MEMORY_GPU-1234: \"GPU-1234\" is not a GPU or MIG device UUID" in line
    result = run(vgpulimit_cmd("run", "--simulate", "--memory-device", "GPU-12=1GiB", "--", "true"), sim_env,
                 check=False)
    assert result.returncode == 2
    expected = ("vgpulimit: error: --memory-device: 'GPU-12' is not a GPU or MIG device UUID (GPU- or MIG- "
                "and 32 hex digits, as nvidia-smi -L prints them)")
    assert result.stderr.splitlines() == [expected]


def test_a_process_that_numbers_devices_otherwise_is_warned(sim_env, shim_path):
    """The container's first process bound ordinal 0 to machine 1; a later one
    given CUDA_VISIBLE_DEVICES=0,1 calls machine 0 its device 0."""
    env = sim_env | MACHINE | {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "VGPULIMIT_MEMORY": "1GiB",
                               "LD_PRELOAD": str(shim_path)}
    uuids = machine_uuids(sim_env | MACHINE)
    first = run([sys.executable, CLIENTS / "multi_device.py", "0.1"], env | {"CUDA_VISIBLE_DEVICES": "1,0"})
    assert "numbers" not in first.stderr
    second = run([sys.executable, CLIENTS / "multi_device.py", "0.1"], env | {"CUDA_VISIBLE_DEVICES": "0,1"})
    warning = (f"device 0 is {uuids[0]} here but {uuids[1]} to other processes of the container "
               "(CUDA_VISIBLE_DEVICES or CUDA_DEVICE_ORDER differ)")
    assert warning in second.stderr

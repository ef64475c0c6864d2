"""simgpu in MIG mode (SIMGPU_MIG), as MIG-aware clients see it: pynvml
walking the MIG devices as nvitop and HAMi do, cuda-bindings enumerating
what CUDA_VISIBLE_DEVICES gives, `nvitop -1`, `gpustat --json` and the
suite's nvidia-smi client.  The profile tables are mig/profiles.json's, the
one copy the planner reads too (docs/mig-facts.md §1.2-1.5 for the behaviour)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import C_DIR, MiB, compile_c, have, run
from containers import CLIENTS, outsider

from vgpulimit.mig import profiles as mig_profiles

H100_LAYOUT = "3g.40gb,2g.20gb,1g.10gb"


def mig_env(sim_env, layout=H100_LAYOUT, profile="h100-80gb", **more) -> dict[str, str]:
    env = {k: v for k, v in sim_env.items() if k != "SIMGPU_MEMORY"}
    return env | {"SIMGPU_PROFILE": profile, "SIMGPU_MIG": layout} | more


def view(env, *args) -> dict:
    return json.loads(run([sys.executable, CLIENTS / "mig_view.py", *map(str, args)], env).stdout)


def test_a_layout_is_placed_in_the_first_legal_slots_in_order(sim_env):
    """3g.40gb takes slices 0-3 (GI 1), 2g.20gb 4-5 (GI 5), 1g.10gb 6 (GI 13);
    the MIG devices past them are holes NVML answers NOT_FOUND for."""
    [gpu] = view(mig_env(sim_env))["gpus"]
    assert gpu["mig_mode"] == [1, 1] and gpu["max_mig"] == 7
    assert [(m["name"], m["gi"], m["ci"], m["index"]) for m in gpu["mig"]] == [
        ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", 1, 0, 0),
        ("NVIDIA H100 80GB HBM3 MIG 2g.20gb", 5, 0, 1),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 13, 0, 2)]
    assert gpu["holes"] == [[i, "NotFound"] for i in range(3, 7)]
    h100 = mig_profiles.find("h100-80gb")
    for mig, name in zip(gpu["mig"], ["3g.40gb", "2g.20gb", "1g.10gb"]):
        profile = h100.profile(name)
        assert mig["memory"]["total"] == profile.memory_bytes
        assert (mig["sms"], mig["memory_mib"]) == (profile.sms, profile.memory_mib)
        assert mig["uuid"].startswith("MIG-") and mig["is_mig"] and mig["by_uuid_is_same"]
        assert mig["parent_uuid"] == gpu["uuid"]


def test_named_placements_come_first_and_uuids_follow_the_layout(sim_env, tmp_path):
    """1g.10gb@0 is made first, so 3g.40gb takes its other slot, 4-7 (GI 2).
    The same layout gives the same MIG UUIDs in another process and machine."""
    env = mig_env(sim_env, "3g.40gb,1g.10gb@0")
    [gpu] = view(env)["gpus"]
    assert [(m["name"].split()[-1], m["gi"]) for m in gpu["mig"]] == [("1g.10gb", 7), ("3g.40gb", 2)]
    again = view(env | {"SIMGPU_STATE": str(tmp_path / "other.state")})["gpus"][0]
    assert [m["uuid"] for m in again["mig"]] == [m["uuid"] for m in gpu["mig"]]


@pytest.mark.parametrize("layout, profile, said", [
    ("4g.40gb,3g.40gb,1g.10gb", "h100-80gb", "1g.10gb: needs 1 compute slices, 0 of 7 left"),
    ("3g.40gb@2", "h100-80gb", "3g.40gb@2: it may not start at 2 (its slots: 0-3, 4-7)"),
    ("1g.10gb@4,3g.40gb@4", "h100-80gb", "3g.40gb@4: slots 4-7 are not free (taken: 4 by 1g.10gb)"),
    ("1g.10gb@0,1g.10gb@4,3g.40gb", "h100-80gb",
     "3g.40gb: no free slot among its slots 0-3, 4-7 (taken: 0 by 1g.10gb, 4 by 1g.10gb)"),
    ("3g.20gb", "h100-80gb", "3g.20gb is not a MIG profile of the H100 80GB; expected one of 1g.10gb,"),
    ("1g.5gb", "l4", "the NVIDIA L4 has no MIG"),
    ("7g.80gb;7g.80gb", "h100-80gb", "2 layouts for 1 devices"),
])
def test_a_layout_that_cannot_be_placed_is_one_line_naming_profile_and_slots(sim_env, layout, profile,
                                                                              said):
    result = run([sys.executable, CLIENTS / "mig_view.py"], mig_env(sim_env, layout, profile), check=False)
    assert result.returncode != 0
    [line] = [line for line in result.stderr.splitlines() if line.startswith("simgpu:")]
    assert f"SIMGPU_MIG={layout}" in line and said in line
    assert "Traceback" not in result.stderr.split("mig_view:")[0]


def test_the_profile_tables_are_mig_profiles_json(sim_env, tmp_path):
    """Every board's GPU-instance profiles by NVML's enum, as the planner's
    data file gives them, with their placements; enums past the table's end
    are invalid, and those of profiles the board lacks not supported."""
    for model in mig_profiles.models():
        key = next(name for name in model.names if "-" in name and name.islower())
        [gpu] = view(mig_env(sim_env, "off", key, SIMGPU_STATE=str(tmp_path / key)))["gpus"]
        assert gpu["mig_mode"] == [0, 0] and gpu["max_mig"] == 0 and gpu["mig"] == []
        by_enum = {p.nvml_enum_value: p for p in model.profiles}
        for enum, info in gpu["profiles"].items():
            if int(enum) == 0x12:
                assert info == "InvalidArgument"
            elif int(enum) not in by_enum:
                assert info == "NotSupported"
            else:
                p = by_enum[int(enum)]
                assert info == {"id": p.id, "memory_mib": p.memory_mib, "sms": p.sms,
                                "copy_engines": p.copy_engines, "max_count": p.max_count,
                                "slices": p.compute_slices,
                                "placements": [[s, p.memory_slices] for s in p.placements],
                                "v2_name": "NotSupported"}  # the versioned call wants MIG on
    [gpu] = view(mig_env(sim_env))["gpus"]
    assert gpu["profiles"]["2"]["v2_name"] == "MIG 3g.40gb"
    [l4] = view(mig_env(sim_env, "off", "l4", SIMGPU_STATE=str(tmp_path / "l4")))["gpus"]
    assert l4["mig_mode"] == "NotSupported" and l4["max_mig"] == 0
    assert set(l4["profiles"].values()) == {"NotSupported", "InvalidArgument"}


def test_cuda_sees_one_mig_device_with_the_instances_memory_and_sms(sim_env):
    """Two MIG UUIDs in CUDA_VISIBLE_DEVICES: the process still sees one
    device, the first, with its instance's memory (cuDeviceTotalMem and
    cuMemGetInfo) and SMs; unset, CUDA shows the GPU without MIG and one MIG
    device."""
    env = mig_env(sim_env, f"{H100_LAYOUT};off", SIMGPU_DEVICES="2")
    gpus = view(env)["gpus"]
    two_g, three_g = gpus[0]["mig"][1], gpus[0]["mig"][0]
    [seen] = view(env | {"CUDA_VISIBLE_DEVICES": f"{two_g['uuid']},{three_g['uuid']}"})["cuda"]
    assert seen["name"].endswith("MIG 2g.20gb")
    assert seen["total"] == seen["mem_get_info_total"] == 20090 * MiB and seen["sms"] == 32
    assert seen["uuid"] == two_g["uuid"].removeprefix("MIG-").replace("-", "")
    everything = view(env)["cuda"]
    assert [d["name"] for d in everything] == ["NVIDIA H100 80GB HBM3 MIG 3g.40gb", "NVIDIA H100 80GB HBM3"]
    result = run([sys.executable, CLIENTS / "mig_view.py"], env | {"CUDA_VISIBLE_DEVICES": "MIG-0000"},
                 check=False)
    assert "CUDA_ERROR_NO_DEVICE" in result.stderr


def test_memory_and_processes_are_the_instances_and_utilisation_is_not_supported(sim_env):
    """A process holding 256 MiB on the 3g.40gb instance: that MIG device
    lists it with its GPU and compute instance ids, the others nothing; the
    parent answers for the whole board with MIG monitoring rights and
    NO_PERMISSION without them (a container's view), where the MIG devices
    still answer.  Utilisation is not supported on the parent or a MIG device."""
    env = mig_env(sim_env)
    with_rights = view(env, 256 * MiB)["gpus"][0]
    three_g, two_g, one_g = with_rights["mig"]
    [entry] = three_g["processes"]
    assert (entry["used"], entry["gi"], entry["ci"]) == (256 * MiB, 1, 0)
    assert three_g["memory"]["used"] == 256 * MiB and two_g["processes"] == one_g["processes"] == []
    assert with_rights["processes"] == [entry]
    assert with_rights["memory"] == {"total": 81559 * MiB, "used": 256 * MiB}  # the board's, as profiles.c
    assert with_rights["utilization"] == three_g["utilization"] == "NotSupported"
    assert three_g["process_utilization"] == "NotSupported"
    without = view(env | {"SIMGPU_MIG_MONITOR": "none"}, 256 * MiB)["gpus"][0]
    assert without["memory"] == without["processes"] == "NoPermission"
    assert without["mig"][0]["memory"]["used"] == 256 * MiB
    assert without["profiles"]["0"]["placements"] == "NoPermission"


def test_instances_run_at_once_and_contexts_in_one_time_slice(sim_env, launch_client):
    """Two processes launching 50 ms kernels for 0.4 s: on two instances
    they run at once (more GPU time done than wall time passed); on one
    instance they time-slice (no more than the wall time)."""
    env = mig_env(sim_env, "3g.40gb,3g.40gb")
    [gpu] = view(env)["gpus"]

    def together(uuids) -> tuple[float, float]:
        started = time.monotonic()
        procs = [subprocess.Popen([launch_client, "kernel", "50000", "0.4"], stdout=subprocess.PIPE,
                                  text=True, env=env | {"CUDA_VISIBLE_DEVICES": uuid}) for uuid in uuids]
        done = [int(p.communicate(timeout=60)[0].split("done ")[1].split()[1]) for p in procs]
        assert all(p.returncode == 0 for p in procs)
        return sum(done) * 0.05, time.monotonic() - started

    gpu_s, wall_s = together([m["uuid"] for m in gpu["mig"]])
    assert gpu_s > wall_s, (gpu_s, wall_s)
    gpu_s, wall_s = together([gpu["mig"][0]["uuid"]] * 2)
    assert gpu_s <= wall_s + 0.01, (gpu_s, wall_s)


@pytest.fixture(scope="module")
def smi_view(tmp_path_factory):
    return compile_c(tmp_path_factory.mktemp("smi") / "smi_view", [C_DIR / "smi_view.c"], "-ldl")


@pytest.fixture
def holder(sim_env, tmp_path):
    """A process holding 512 MiB on the 2g.20gb instance while a tool looks."""
    env = mig_env(sim_env)
    [gpu] = view(env)["gpus"]
    with outsider(env | {"CUDA_VISIBLE_DEVICES": gpu["mig"][1]["uuid"]}, tmp_path, 512 * MiB) as held:
        yield env, held["pid"]


def test_the_nvidia_smi_client_shows_the_mig_devices_table(holder, smi_view):
    env, pid = holder
    out = run([smi_view], env).stdout
    assert "MIG 0/0:  GI 1  CI 0  Memory-Usage 0MiB / 40448MiB  SM 60" in out
    assert "MIG 0/1:  GI 5  CI 0  Memory-Usage 512MiB / 20090MiB  SM 32" in out
    assert f"Process: {pid}  GI 5 CI 0  512 MiB" in out
    assert "GPU-Util N/A" in out


def test_nvitop_shows_each_mig_device_with_its_ids_and_memory(holder):
    env, pid = holder
    out = run([sys.executable, "-m", "nvitop", "-1"], env | {"COLUMNS": "120"}).stdout
    assert "3g.40gb @ GI/CI: 1/0" in out and "2g.20gb @ GI/CI: 5/0" in out
    assert "512.0MiB / 20090MiB" in out
    assert str(pid) in out


def test_gpustat_shows_the_parent_without_utilisation(holder):
    if not have("gpustat"):
        pytest.skip("gpustat is not installed (pip install '.[test]' installs it)")
    env, pid = holder
    [gpu] = json.loads(run([sys.executable, "-m", "gpustat", "--json"], env).stdout)["gpus"]
    assert gpu["utilization.gpu"] is None
    assert gpu["memory.used"] == 512 and [p["pid"] for p in gpu["processes"]] == [pid]

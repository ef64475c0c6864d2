"""simgpu's libnvidia-ml.so.1 through pynvml (nvidia-ml-py), as nvidia-smi,
nvitop or a scheduler reads it: the same devices as the driver shows, and the
memory and processes of every other process on the simulated GPU, which a
kill -9 takes away. Each test has a simulated GPU of its own."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import TESTS, GiB, run

CLIENTS = TESTS / "clients"
INSUFFICIENT_SIZE, NOT_FOUND, SUCCESS, FUNCTION_NOT_FOUND = 7, 6, 0, 13
H200_SAMPLE_BUFFER = 72  # what the H200's driver answered every size query with
H200_RESERVED = 644939776  # 615 MiB: what the idle H200's driver kept for itself
MiB = 1 << 20


def client(env, name: str) -> dict:
    return json.loads(run([sys.executable, CLIENTS / name], env, timeout=60).stdout)


@pytest.fixture
def holder(sim_env, tmp_path):
    """Another process, holding 1 GiB through cuda-bindings: its report and the process."""
    proc = subprocess.Popen([sys.executable, str(CLIENTS / "cuda_fill.py"), str(1 * GiB), "1",
                             "--hold", str(tmp_path / "never")],
                            env=sim_env, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line, f"cuda_fill.py exited {proc.wait(timeout=30)} before reporting"
        report = json.loads(line)
        assert report["allocs"] == ["CUDA_SUCCESS"]
        yield report, proc
    finally:
        proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()


def kill_9(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def nvml_uuid(hex_bytes: str) -> str:
    """cuDeviceGetUuid's 16 bytes as NVML writes them."""
    h = hex_bytes
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def test_nvml_shows_the_device_the_driver_shows(sim_env):
    seen = client(sim_env, "devices.py")
    nvml, cuda = seen["nvml"], seen["cuda"]
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", nvml["driver_version"])
    assert nvml["cuda_driver_version"] == cuda["driver_version"] == 13000
    assert len(nvml["devices"]) == len(cuda["devices"]) == 1
    device, cuda_device = nvml["devices"][0], cuda["devices"][0]
    assert device["name"] == cuda_device["name"] and device["name"].startswith("NVIDIA ")
    assert device["uuid"] == nvml_uuid(cuda_device["uuid"])
    assert device["index_by_uuid"] == 0
    assert device["total"] == cuda_device["total"] == 16 * GiB
    assert device["utilization"] == [0, 0]  # nothing has run on this GPU
    assert nvml["after_shutdown"] == "NVMLError_Uninitialized"


def test_memory_info_v1_and_v2_count_what_another_process_holds(sim_env, holder):
    _, proc = holder
    seen = client(sim_env, "nvml_memory.py")
    assert seen["v1"] == seen["v2"]
    assert seen["v1"]["total"] == 16 * GiB
    assert seen["v1"]["used"] == 1 * GiB
    assert seen["v1"]["free"] + seen["v1"]["used"] == seen["v1"]["total"]
    kill_9(proc)
    after = client(sim_env, "nvml_memory.py")
    assert after["v1"] == after["v2"] == {"total": 16 * GiB, "free": 16 * GiB, "used": 0}


def test_running_processes_list_another_process_with_its_bytes_until_killed(sim_env, holder):
    report, proc = holder
    pid = str(report["pid"])
    seen = client(sim_env, "nvml_processes.py")
    assert seen["compute"] == seen["compute_v2"] == {pid: 1 * GiB}  # not the reader: no context
    assert seen["gpu_instance_ids"] == [0xFFFFFFFF]  # not a MIG instance
    assert seen["graphics"] == []
    assert seen["used"] == 1 * GiB
    kill_9(proc)
    after = client(sim_env, "nvml_processes.py")
    assert after["compute"] == after["compute_v2"] == {}
    assert after["used"] == 0


def test_two_devices_with_distinct_uuids(sim_env):
    seen = client(sim_env | {"SIMGPU_DEVICES": "2", "SIMGPU_MEMORY": "3GiB"}, "devices.py")
    cuda, nvml = seen["cuda"]["devices"], seen["nvml"]["devices"]
    assert len(cuda) == len(nvml) == 2
    assert [d["total"] for d in cuda] == [d["total"] for d in nvml] == [3 * GiB] * 2
    assert cuda[0]["uuid"] != cuda[1]["uuid"]
    assert [d["uuid"] for d in nvml] == [nvml_uuid(d["uuid"]) for d in cuda]
    assert [d["index_by_uuid"] for d in nvml] == [0, 1]
    assert [d["minor"] for d in nvml] == [0, 1]   # /dev/nvidia0, /dev/nvidia1
    assert seen["cuda"]["device_past_the_end"] == "CUDA_ERROR_INVALID_DEVICE"


def test_up_to_32_devices_more_than_a_region_counts(sim_env):
    """Real machines show CUDA more than 16 GPUs; simgpu has up to 32, so the
    tests can show what the shim does past the region's 16."""
    seen = client(sim_env | {"SIMGPU_DEVICES": "32"}, "devices.py")
    cuda, nvml = seen["cuda"]["devices"], seen["nvml"]["devices"]
    assert len(cuda) == len(nvml) == 32
    assert len({d["uuid"] for d in cuda}) == 32
    assert [d["uuid"] for d in nvml] == [nvml_uuid(d["uuid"]) for d in cuda]
    assert [d["index_by_uuid"] for d in nvml] == [d["minor"] for d in nvml] == list(range(32))
    assert [d["total"] for d in cuda] == [d["total"] for d in nvml] == [16 * GiB] * 32


@pytest.mark.parametrize("variable, value", [("SIMGPU_MEMORY", "8GBx"), ("SIMGPU_DEVICES", "33"),
                                             ("SIMGPU_RESERVED", "615M B"), ("SIMGPU_RESERVED", "16GiB")])
def test_nvml_init_fails_cleanly_on_a_bad_configuration(sim_env, variable, value):
    code = ("import pynvml\ntry:\n    pynvml.nvmlInit()\n    print('initialised')\n"
            "except pynvml.NVMLError as e:\n    print(type(e).__name__)")
    result = run([sys.executable, "-c", code], sim_env | {variable: value}, timeout=60)
    assert result.stdout.strip() == "NVMLError_Unknown"
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and variable in lines[0] and value in lines[0], result.stderr


def size_query(env, since_us: int) -> dict:
    return json.loads(run([sys.executable, CLIENTS / "nvml_size_query.py", since_us], env, timeout=60).stdout)


def test_process_utilisation_size_query_answers_the_buffer_count_even_with_nothing_to_report(sim_env):
    """As the H200 answered: the size query gets INSUFFICIENT_SIZE and the
    driver's fixed count whatever the timestamp, and the call with that room
    NOT_FOUND, leaving the count as the caller gave it."""
    seen = size_query(sim_env, int(time.time() * 1e6))
    assert seen["null_0"] == seen["null_now"] == [INSUFFICIENT_SIZE, H200_SAMPLE_BUFFER, []]
    assert seen["small"] == [INSUFFICIENT_SIZE, H200_SAMPLE_BUFFER, []]
    assert seen["room"] == [NOT_FOUND, 1000, []]
    assert seen["exact"] == [NOT_FOUND, H200_SAMPLE_BUFFER, []]


def test_process_utilisation_gives_one_sample_per_busy_process(sim_env, launch_client):
    since_us = int(time.time() * 1e6)
    loop = subprocess.Popen([launch_client, "kernel", "1000", "30"], env=sim_env, stdout=subprocess.PIPE, text=True)
    try:
        def busy(seen):  # its first period may be partly idle: wait for a whole one
            return all(seen[a][0] == SUCCESS and all(s["sm"] >= 90 for s in seen[a][2]) for a in ("room", "exact"))

        deadline = time.monotonic() + 30
        seen = size_query(sim_env, since_us)
        while not busy(seen) and time.monotonic() < deadline:
            time.sleep(0.1)
            seen = size_query(sim_env, since_us)
        # The size query does not depend on the load.
        assert seen["null_0"] == seen["null_now"] == [INSUFFICIENT_SIZE, H200_SAMPLE_BUFFER, []]
        assert seen["small"][:2] == [INSUFFICIENT_SIZE, H200_SAMPLE_BUFFER]
        for answer in ("room", "exact"):
            rc, count, samples = seen[answer]
            assert rc == SUCCESS and count == 1, seen
            [sample] = samples
            assert sample["pid"] == loop.pid and sample["timestamp_us"] > since_us
            assert sample["sm"] >= 90  # kernels back to back: a whole period busy
    finally:
        loop.kill()
        loop.wait(timeout=30)
        loop.stdout.close()


def fill(env, block: int, count: int, *extra: str) -> dict:
    return json.loads(run([sys.executable, CLIENTS / "cuda_fill.py", str(block), str(count), *extra], env,
                          timeout=60).stdout)


def test_the_drivers_reserve_is_in_v1_used_and_apart_in_v2(sim_env, tmp_path):
    """As on the H200: idle, v1 `used` is the reserve and v2 has it as
    `reserved` with `used` 0; free is the same in both and never includes it."""
    env = sim_env | {"SIMGPU_RESERVED": str(H200_RESERVED)}
    idle = client(env, "nvml_memory_v2.py")
    free = 16 * GiB - H200_RESERVED
    assert idle["v1"] == {"total": 16 * GiB, "free": free, "used": H200_RESERVED}
    assert idle["v2"] == {"total": 16 * GiB, "reserved": H200_RESERVED, "free": free, "used": 0}
    with open(tmp_path / "holding", "w"):
        pass
    proc = subprocess.Popen([sys.executable, str(CLIENTS / "cuda_fill.py"), str(GiB), "1",
                             "--hold", str(tmp_path / "never")], env=env, stdout=subprocess.PIPE, text=True)
    try:
        report = json.loads(proc.stdout.readline())
        # cuMemGetInfo's free leaves the reserve out too.
        assert report["before"] == {"free": free, "total": 16 * GiB}
        assert report["after"] == {"free": free - GiB, "total": 16 * GiB}
        held = client(env, "nvml_memory_v2.py")
        assert held["v1"] == {"total": 16 * GiB, "free": free - GiB, "used": H200_RESERVED + GiB}
        assert held["v2"] == {"total": 16 * GiB, "reserved": H200_RESERVED, "free": free - GiB, "used": GiB}
    finally:
        proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()


def test_memory_v2_wants_its_versioned_size(sim_env):
    """A literal 2 or 0 got FUNCTION_NOT_FOUND from the H200's driver."""
    seen = client(sim_env, "nvml_memory_v2.py")
    assert seen["v2_version_2"] == seen["v2_version_0"] == FUNCTION_NOT_FOUND


def test_the_reserve_is_never_allocated(sim_env):
    report = fill(sim_env | {"SIMGPU_MEMORY": "1GiB", "SIMGPU_RESERVED": "615MiB"}, 100 * MiB, 5)
    assert report["before"]["free"] == 409 * MiB
    assert report["allocs"] == ["CUDA_SUCCESS"] * 4 + ["CUDA_ERROR_OUT_OF_MEMORY"]

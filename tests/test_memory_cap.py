"""The memory cap as a user meets it: real clients (cuda-bindings, pynvml, a C
program) reaching the simulated driver through the shim, on each of the three
paths by which clients find the driver."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import TESTS, GiB, MiB, base_env, run, vgpulimit_cmd

CLIENTS = TESTS / "clients"


def fill(sim_env, block, count, *limits, extra_env=None):
    env = dict(sim_env, **(extra_env or {}))
    cmd = vgpulimit_cmd("run", "--simulate", *limits, "--",
                        sys.executable, CLIENTS / "cuda_fill.py", str(block), str(count))
    result = run(cmd, env)
    return json.loads(result.stdout), result.stderr


@pytest.mark.parametrize("per_thread_stream", ["0", "1"])
def test_cuda_bindings_stops_at_the_cap(sim_env, per_thread_stream):
    report, stderr = fill(sim_env, 256 * MiB, 5, "--memory", "1GiB",
                          extra_env={"CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM": per_thread_stream})
    assert report["allocs"] == ["CUDA_SUCCESS"] * 4 + ["CUDA_ERROR_OUT_OF_MEMORY"]
    assert report["before"] == {"free": 1 * GiB, "total": 1 * GiB}
    assert report["after"] == {"free": 0, "total": 1 * GiB}
    assert report["total_mem"] == 1 * GiB
    assert (report["free"], report["realloc"]) == ("CUDA_SUCCESS", "CUDA_SUCCESS")
    # The one refusal is logged: which device, the cap, the usage.
    refusals = [line for line in stderr.splitlines() if "refused" in line]
    assert len(refusals) == 1
    assert "device 0" in refusals[0] and "cap 1 GiB" in refusals[0]
    assert "1 GiB in use" in refusals[0]


@pytest.mark.parametrize("mode", ["link", "procaddr", "procaddr-ptds", "dlsym"])
def test_c_client_stops_at_the_cap_on_every_lookup_path(sim_env, cbin, mode):
    result = run(vgpulimit_cmd("run", "--simulate", "--memory", "1GiB", "--",
                               cbin / "alloc_client", mode, str(256 * MiB), "5"), sim_env)
    lines = result.stdout.splitlines()
    assert lines[0] == f"meminfo {1 * GiB} {1 * GiB}"
    assert lines[1] == f"total {1 * GiB}"
    assert lines[2:7] == [f"alloc {i} 0" for i in range(4)] + ["alloc 4 2"]
    assert lines[7] == f"meminfo 0 {1 * GiB}"
    assert lines[8:] == ["free 0", "realloc 0"]


def test_without_limits_the_shim_changes_nothing(sim_env, cbin, shim_path):
    """No vgpulimit variable: every result equals the driver's, and the shim is silent."""
    cmd = [cbin / "alloc_client", "dlsym", str(4 * GiB), "5"]
    direct = run(cmd, sim_env)
    shimmed = run(cmd, dict(sim_env, LD_PRELOAD=str(shim_path)))
    assert shimmed.stdout == direct.stdout
    assert f"meminfo {16 * GiB} {16 * GiB}" in direct.stdout
    assert "alloc 4 2" in direct.stdout  # the simulated 16 GiB device itself ran out
    assert shimmed.stderr == direct.stderr == ""


def test_null_meminfo_pointers_are_the_drivers_business(sim_env, cbin, shim_path):
    direct = run([cbin / "meminfo_null"], sim_env)
    capped = run([cbin / "meminfo_null"],
                 dict(sim_env, LD_PRELOAD=str(shim_path), VGPULIMIT_MEMORY="1GiB"))
    assert [line.split()[:2] for line in capped.stdout.splitlines()] == \
           [line.split()[:2] for line in direct.stdout.splitlines()]
    for line in capped.stdout.splitlines():
        fields = line.split()
        if fields[1] == "0" and len(fields) == 3:  # the driver accepted it: what it wrote is capped
            assert int(fields[2]) <= 1 * GiB


def test_an_unparsable_limit_fails_closed_with_one_line(sim_env, cbin, shim_path):
    env = dict(sim_env, LD_PRELOAD=str(shim_path), VGPULIMIT_MEMORY="lots")
    result = run([cbin / "alloc_client", "dlsym", str(1 * MiB), "3"], env)
    assert result.returncode == 0  # the application runs on; only its device allocations stop
    assert [line for line in result.stdout.splitlines() if line.startswith("alloc")] == \
           ["alloc 0 2", "alloc 1 2", "alloc 2 2"]
    errors = result.stderr.splitlines()
    assert len(errors) == 1, result.stderr
    assert "VGPULIMIT_MEMORY: 'lots' is not a valid value" in errors[0]
    assert "4Gi" in errors[0] and "50%" in errors[0]  # the accepted forms


def test_a_cap_above_the_device_shows_the_device(sim_env):
    report, _ = fill(sim_env, 1 * GiB, 1, "--memory", "1TiB",
                     extra_env={"SIMGPU_MEMORY": "8GiB"})
    assert report["total_mem"] == 8 * GiB
    assert report["before"]["total"] == 8 * GiB


def test_a_share_of_the_device(sim_env):
    report, _ = fill(sim_env, 1 * GiB, 5, "--memory", "25%", extra_env={"SIMGPU_MEMORY": "16GiB"})
    assert report["before"]["total"] == 4 * GiB
    assert report["allocs"] == ["CUDA_SUCCESS"] * 4 + ["CUDA_ERROR_OUT_OF_MEMORY"]


def test_two_processes_share_one_cap(sim_env, tmp_path):
    """What two processes of one container hold together never passes the cap."""
    release = tmp_path / "release"
    script = (f"{sys.executable} {CLIENTS / 'cuda_fill.py'} {128 * MiB} 8 --hold {release} & "
              f"{sys.executable} {CLIENTS / 'cuda_fill.py'} {128 * MiB} 8 --hold {release} & "
              f"wait")
    proc = subprocess.Popen(list(map(str, vgpulimit_cmd("run", "--simulate", "--memory", "1GiB",
                                                        "--", "sh", "-c", script))),
                            env=sim_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reports = []
    deadline = time.monotonic() + 60
    while len(reports) < 2 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line:
            reports.append(json.loads(line))
    release.touch()
    proc.communicate(timeout=60)
    assert proc.returncode == 0
    granted = sum(r["allocs"].count("CUDA_SUCCESS") for r in reports)
    assert granted == 8  # 8 x 128 MiB = the cap, split between them however they raced
    refused = sum(r["allocs"].count("CUDA_ERROR_OUT_OF_MEMORY") for r in reports)
    assert refused == 8


def test_nvml_sees_the_capped_device(sim_env, tmp_path, shim_path):
    """pynvml, in a second process of the container, sees the cap as the device's
    memory and the container's usage as used."""
    release = tmp_path / "release"
    holder = subprocess.Popen(list(map(str, vgpulimit_cmd(
        "run", "--simulate", "--memory", "2GiB", "--region", tmp_path / "region", "--",
        sys.executable, CLIENTS / "cuda_fill.py", str(512 * MiB), "1", "--hold", release))),
        env=sim_env, stdout=subprocess.PIPE, text=True)
    try:
        assert json.loads(holder.stdout.readline())["allocs"] == ["CUDA_SUCCESS"]
        env = dict(sim_env, VGPULIMIT_REGION=str(tmp_path / "region"), VGPULIMIT_MEMORY="2GiB",
                   LD_PRELOAD=str(shim_path))
        seen = json.loads(run([sys.executable, CLIENTS / "nvml_memory.py"], env).stdout)
    finally:
        release.touch()
        holder.wait(timeout=60)
    for version in ("v1", "v2"):
        assert seen[version] == {"total": 2 * GiB, "free": 1536 * MiB, "used": 512 * MiB}


def test_rtld_next_lookups_behave_as_without_the_shim(cbin, shim_path):
    expected = run([cbin / "rtld_next_main"], base_env()).stdout
    assert expected.splitlines()[0] == "whoami 101"
    assert "libc.so" in expected.splitlines()[1]
    for extra in ({}, {"VGPULIMIT_MEMORY": "1GiB"}):
        env = base_env(LD_PRELOAD=str(shim_path), **extra)
        assert run([cbin / "rtld_next_main"], env, timeout=30).stdout == expected


def test_a_cap_changed_live_applies_to_the_next_allocation(sim_env, tmp_path):
    """`vgpulimit set` lowers and raises the cap of a running container; lowering
    below usage frees nothing and refuses new allocations until usage falls."""
    region = tmp_path / "region"
    steps = tmp_path / "steps"
    steps.mkdir()
    client = f"""
import json, os, sys, time
from cuda.bindings import driver as cu
def wait_for(name):
    while not os.path.exists(os.path.join({str(steps)!r}, name)):
        time.sleep(0.01)
def say(**what):
    print(json.dumps(what), flush=True)
cu.cuInit(0)
ctx = cu.cuDevicePrimaryCtxRetain(cu.cuDeviceGet(0)[1])[1]
cu.cuCtxSetCurrent(ctx)
held = [cu.cuMemAlloc({768 * MiB})[1]]
say(step="held", info=[int(x) for x in cu.cuMemGetInfo()[1:]])
wait_for("lowered")
err, _ = cu.cuMemAlloc({64 * MiB})
say(step="lowered", alloc=int(err), info=[int(x) for x in cu.cuMemGetInfo()[1:]])
cu.cuMemFree(held.pop())
err, ptr = cu.cuMemAlloc({256 * MiB})
say(step="freed", alloc=int(err))
wait_for("raised")
err, _ = cu.cuMemAlloc({1536 * MiB})
say(step="raised", alloc=int(err), info=[int(x) for x in cu.cuMemGetInfo()[1:]])
"""
    proc = subprocess.Popen(list(map(str, vgpulimit_cmd(
        "run", "--simulate", "--memory", "1GiB", "--region", region, "--",
        sys.executable, "-c", client))), env=sim_env, stdout=subprocess.PIPE, text=True)
    try:
        assert json.loads(proc.stdout.readline()) == {"step": "held", "info": [256 * MiB, 1 * GiB]}
        run(vgpulimit_cmd("set", "--memory", "512MiB", "--region", region), sim_env)
        (steps / "lowered").touch()
        lowered = json.loads(proc.stdout.readline())
        # 768 MiB in use under a 512 MiB cap: nothing more, and nothing wraps below zero.
        assert lowered == {"step": "lowered", "alloc": 2, "info": [0, 512 * MiB]}
        assert json.loads(proc.stdout.readline()) == {"step": "freed", "alloc": 0}
        run(vgpulimit_cmd("set", "--memory", "2GiB", "--region", region), sim_env)
        (steps / "raised").touch()
        raised = json.loads(proc.stdout.readline())
        assert raised == {"step": "raised", "alloc": 0, "info": [256 * MiB, 2 * GiB]}
    finally:
        for name in ("lowered", "raised"):
            (steps / name).touch()
        proc.wait(timeout=60)
    assert proc.returncode == 0


HAMI_CASES = {
    "all devices": {"CUDA_DEVICE_MEMORY_LIMIT": "1024m"},
    "device 0": {"CUDA_DEVICE_MEMORY_LIMIT_0": "1024m"},
    "bytes": {"CUDA_DEVICE_MEMORY_LIMIT": "1073741824"},
}


@pytest.mark.parametrize("hami", HAMI_CASES.values(), ids=HAMI_CASES.keys())
def test_hami_core_variables_work_unchanged(sim_env, cbin, shim_path, tmp_path, hami):
    """A container set up by HAMi's device plugin (its variables only, its shared
    cache path) gets the same cap as one set up with vgpulimit's variables."""
    client = [cbin / "alloc_client", "dlsym", str(256 * MiB), "5"]
    ours = run(client, dict(sim_env, LD_PRELOAD=str(shim_path), VGPULIMIT_MEMORY="1GiB"))
    theirs = run(client, dict(sim_env, LD_PRELOAD=str(shim_path),
                              CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp_path / "vgpu.cache"), **hami))
    assert theirs.stdout == ours.stdout
    assert "alloc 4 2" in theirs.stdout
    assert (tmp_path / "vgpu.cache").exists()  # HAMi's cache path carries our region


def test_hami_zero_means_no_limit_and_the_tighter_wins(sim_env, cbin, shim_path, tmp_path):
    client = [cbin / "alloc_client", "dlsym", str(256 * MiB), "5"]
    unlimited = run(client, sim_env).stdout
    zero = run(client, dict(sim_env, LD_PRELOAD=str(shim_path), CUDA_DEVICE_MEMORY_LIMIT="0",
                            CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp_path / "zero.cache")))
    assert zero.stdout == unlimited  # HAMi-core reads 0 as "no limit"; so do we, for its variable
    ours = run(client, dict(sim_env, LD_PRELOAD=str(shim_path), CUDA_DEVICE_MEMORY_LIMIT="0",
                            VGPULIMIT_MEMORY="512MiB"))
    assert "alloc 1 0\nalloc 2 2" in ours.stdout  # no limit of HAMi's beside ours: ours
    both = run(client, dict(sim_env, LD_PRELOAD=str(shim_path), CUDA_DEVICE_MEMORY_LIMIT="256m",
                            VGPULIMIT_MEMORY="512MiB"))
    assert "alloc 0 0\nalloc 1 2" in both.stdout  # HAMi's 256m, the tighter: ours may not loosen it


def test_eight_racing_processes_never_pass_the_cap(sim_env, cbin, shim_path, tmp_path):
    """8 processes x 200 rounds of random 1-128 MiB allocations against a 1 GiB
    cap, while a watcher samples the device's memory as the driver counts it:
    what they hold together never passes the cap, not for one sample."""
    stop = tmp_path / "stop"
    watcher = subprocess.Popen([sys.executable, str(TESTS / "clients" / "nvml_watch.py"), str(stop)],
                               env=sim_env, stdout=subprocess.PIPE, text=True)
    assert watcher.stdout.readline() == "watching\n"
    env = dict(sim_env, LD_PRELOAD=str(shim_path), VGPULIMIT_MEMORY="1GiB")
    go = tmp_path / "go"
    try:
        racers = [subprocess.Popen([str(cbin / "racer"), "200", str(seed), str(go)], env=env,
                                   stdout=subprocess.PIPE, text=True) for seed in range(8)]
        go.touch()
        outcomes = [r.communicate(timeout=120)[0].split() for r in racers]
    finally:
        stop.touch()
    highest, samples = map(int, watcher.communicate(timeout=60)[0].split())
    assert all(r.returncode == 0 for r in racers)
    assert samples > 10
    assert 0 < highest <= 1 * GiB
    refused = sum(int(o[3]) for o in outcomes)
    assert refused > 0  # they did reach the cap


def wait_for_lines(path, count, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text.count("\n") >= count:
            return text.splitlines()
        time.sleep(0.01)
    raise AssertionError(f"{path} did not get {count} lines: {text!r}")


@pytest.mark.parametrize("processes", [1, 2, 4])
def test_the_cap_bounds_what_the_host_sees(sim_env, tmp_path, processes):
    """Contexts cost device memory before anything is allocated (500 MiB each
    here, like an H100's): the shim counts that too, so what NVML on the host
    shows for the container's processes stays within the cap (+1 % + 64 MiB)."""
    env = dict(sim_env, SIMGPU_CONTEXT_OVERHEAD="500MiB")
    cap = 3 * GiB
    stop, start, release = tmp_path / "stop", tmp_path / "start", tmp_path / "release"
    watcher = subprocess.Popen([sys.executable, str(TESTS / "clients" / "nvml_watch.py"), str(stop)],
                               env=env, stdout=subprocess.PIPE, text=True)
    assert watcher.stdout.readline() == "watching\n"
    # Every process makes its context before any fills the cap (one made
    # after would be refused: the GPU, as the container sees it, is full).
    outs = [tmp_path / f"out{i}" for i in range(processes)]
    fills = [f"{sys.executable} {CLIENTS / 'cuda_fill.py'} {64 * MiB} 64 --hold {release} "
             f"--start {start} > {out}" for out in outs]
    container = subprocess.Popen(list(map(str, vgpulimit_cmd(
        "run", "--simulate", "--memory", "3GiB", "--", "sh", "-c",
        " & ".join(fills) + " & wait"))), env=env)
    lines_of = lambda n: [wait_for_lines(out, n) for out in outs]
    try:
        assert all("ready" in json.loads(lines[0]) for lines in lines_of(1))
        start.touch()
        reports = [json.loads(lines[1]) for lines in lines_of(2)]
    finally:  # whatever happened, nothing is left running
        for path in (start, stop):
            path.touch()
        highest, _ = map(int, watcher.communicate(timeout=60)[0].split())
        release.touch()
        container.wait(timeout=60)
    assert container.returncode == 0
    assert all(r["allocs"][-1] == "CUDA_ERROR_OUT_OF_MEMORY" for r in reports)
    granted = sum(r["allocs"].count("CUDA_SUCCESS") for r in reports) * 64 * MiB
    # The contexts took their share of the cap: the allocations got the rest.
    assert granted <= cap - processes * 500 * MiB
    assert cap - 64 * MiB * processes - 100 * MiB < highest <= cap + cap // 100 + 64 * MiB


def test_a_context_that_does_not_fit_is_refused(sim_env, tmp_path):
    """With the cap already full, making a context (which itself takes device
    memory) fails with CUDA_ERROR_OUT_OF_MEMORY, as on a full GPU."""
    env = dict(sim_env, SIMGPU_CONTEXT_OVERHEAD="500MiB")
    release = tmp_path / "release"
    fill = f"{sys.executable} {CLIENTS / 'cuda_fill.py'} {64 * MiB} 64 --hold {release}"
    late = f"{sys.executable} {CLIENTS / 'cuda_fill.py'} {64 * MiB} 1"
    container = subprocess.Popen(list(map(str, vgpulimit_cmd(
        "run", "--simulate", "--memory", "2GiB", "--", "sh", "-c",
        f"{fill} & read line; {late}; echo late=$?; touch {release}; wait"))),
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert json.loads(container.stdout.readline())["allocs"][-1] == "CUDA_ERROR_OUT_OF_MEMORY"
    out, err = container.communicate("go\n", timeout=60)
    assert "late=1" in out
    assert "cuda_fill: b'CUDA_ERROR_OUT_OF_MEMORY'" in err
    assert "cuDevicePrimaryCtxRetain on device 0 refused" in err

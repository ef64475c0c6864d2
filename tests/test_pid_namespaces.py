"""Tenants in pid namespaces of their own, each with its own /proc, on one GPU,
as the OCI hook starts containers: their processes have the same pids inside
(1, 2, ...). The NVIDIA driver is not pid-namespace aware and names every
process by its host pid; simgpu does the same, and the shim never takes
another namespace's process (its memory, its context) for one of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import GiB, MiB, run, vgpulimit_cmd
from containers import CLIENTS, OWN_PID_NAMESPACE, can_unshare_pid, fill_cmd
from helpers import status_json

from vgpulimit.limits import parse_memory
from vgpulimit.region import Region

OK, OOM = "CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY"
PID_MAX_LIMIT = 4194304  # the kernel's ceiling on pid_max: no pid is above it


def nspid(pid: int) -> list[int]:
    """The process's pid in each namespace from the host's down to its own."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return [int(p) for p in line.split()[1:]]
    raise AssertionError(f"no NSpid in /proc/{pid}/status")


def host_pid(ancestor: int, own_pid: int) -> int:
    """The host pid of the process under `ancestor` (itself included) whose pid
    in its own namespace is `own_pid`."""
    todo = [ancestor]
    while todo:
        pid = todo.pop()
        if nspid(pid)[-1] == own_pid:
            return pid
        todo += map(int, Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
    raise AssertionError(f"no process under {ancestor} is {own_pid} in its namespace")


@dataclass
class Tenant:
    report: dict        # what cuda_fill.py printed: its own pid, its allocations
    host_pid: int


@pytest.fixture
def tenants(tmp_path):
    """Starts cuda_fill.py clients that hold one block until the test ends: in
    a pid namespace of their own (`own_pid_namespace`) or not, in a container
    of `vgpulimit run --simulate LIMITS` (`limits`) or not."""
    if not can_unshare_pid():
        pytest.skip("cannot make a pid namespace here (needs unshare(1) and root)")
    release = tmp_path / "release"
    started: list[subprocess.Popen] = []

    def start(env, block, *, own_pid_namespace, limits=None) -> Tenant:
        cmd = fill_cmd(block, 1, release)
        if limits is not None:
            cmd = vgpulimit_cmd("run", "--simulate", *map(str, limits), "--", *cmd)
        if own_pid_namespace:
            cmd = [*OWN_PID_NAMESPACE, *cmd]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        started.append(proc)
        line = proc.stdout.readline()
        assert line, f"{cmd} exited {proc.wait(timeout=30)} before reporting"
        report = json.loads(line)
        return Tenant(report, host_pid(proc.pid, report["pid"]))

    yield start
    release.touch()
    for proc in started:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
        proc.stdout.close()


def processes(env, *, own_pid_namespace) -> dict[int, int]:
    """Device 0's compute processes as NVML lists them: pid -> bytes."""
    prefix = OWN_PID_NAMESPACE if own_pid_namespace else []
    seen = json.loads(run([*prefix, sys.executable, CLIENTS / "nvml_processes.py"], env).stdout)
    assert seen["compute"] == seen["compute_v2"]
    return {int(pid): used for pid, used in seen["compute"].items()}


def test_nvml_names_every_process_by_its_host_pid(sim_env, tenants):
    """Listed from the host, each tenant's process is there under its host pid,
    as the driver lists it; listed from a namespace with a /proc of its own,
    which cannot know those host pids, they are stand-ins above every pid,
    never a pid of a namespace (both tenants are pid 1 in their own)."""
    a = tenants(sim_env, 256 * MiB, own_pid_namespace=True)
    b = tenants(sim_env, 512 * MiB, own_pid_namespace=True)
    host = tenants(sim_env, 128 * MiB, own_pid_namespace=False)
    assert a.report["pid"] == b.report["pid"] == 1
    assert host.host_pid == host.report["pid"]

    assert processes(sim_env, own_pid_namespace=False) == {
        a.host_pid: 256 * MiB, b.host_pid: 512 * MiB, host.host_pid: 128 * MiB}

    inside = processes(sim_env, own_pid_namespace=True)
    # A process in the host's namespace knew its host pid: listed under it.
    assert inside.pop(host.host_pid) == 128 * MiB
    assert sorted(inside.values()) == [256 * MiB, 512 * MiB]
    assert all(pid > PID_MAX_LIMIT for pid in inside), inside
    # The same stand-in for the same process, whoever lists it.
    assert processes(sim_env, own_pid_namespace=True) == inside | {host.host_pid: 128 * MiB}


def sample_pids(env, *, own_pid_namespace, until) -> set[int]:
    """The pids of device 0's utilisation samples, once `until` holds of them."""
    prefix = OWN_PID_NAMESPACE if own_pid_namespace else []
    deadline = time.monotonic() + 60
    while True:
        seen = json.loads(run([*prefix, sys.executable, CLIENTS / "nvml_utilization.py", 0],
                              env).stdout)
        pids = {s["pid"] for s in seen["samples"]}
        if until(pids):
            return pids
        assert time.monotonic() < deadline, f"samples of {pids} only after 60 s"
        time.sleep(0.05)


def test_utilisation_samples_name_the_host_pid(sim_env, launch_client):
    """A process in a pid namespace of its own runs kernels: the driver's
    samples name it by its host pid; from another such namespace, by a
    stand-in above every pid (not 1, its pid in its own)."""
    if not can_unshare_pid():
        pytest.skip("cannot make a pid namespace here (needs unshare(1) and root)")
    proc = subprocess.Popen([*OWN_PID_NAMESPACE, launch_client, "kernel", "1000", "60"],
                            env=sim_env, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().split()
        assert line[:2] == ["progress", "1"], line
        launcher = host_pid(proc.pid, 1)
        assert sample_pids(sim_env, own_pid_namespace=False,
                           until=lambda pids: launcher in pids) == {launcher}
        [stand_in] = sample_pids(sim_env, own_pid_namespace=True, until=bool)
        assert stand_in > PID_MAX_LIMIT
    finally:
        proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()


def fill(env, region: Path, cap: str, count: int, *, own_pid_namespace) -> dict:
    """cuda_fill.py allocating `count` blocks of 256 MiB in a container capped at `cap`."""
    prefix = OWN_PID_NAMESPACE if own_pid_namespace else []
    cmd = [*prefix, *vgpulimit_cmd("run", "--simulate", "--memory", cap, "--region", region, "--",
                                   sys.executable, CLIENTS / "cuda_fill.py", 256 * MiB, count)]
    return json.loads(run(cmd, env, timeout=60).stdout)


@pytest.mark.parametrize("own_proc", [True, False], ids=["own /proc", "host namespace"])
def test_a_container_is_never_charged_another_namespaces_context(sim_env, tmp_path, tenants,
                                                                   own_proc):
    """Container A (pid namespace and /proc of its own) holds 1 GiB and a
    256 MiB context. Container B's process has the same pid in its own
    namespace as A's: B is charged none of A's memory, and its own context is
    charged wherever it runs: in the host's namespace it knows its host pid; in
    a namespace with its own /proc it finds itself in the driver's list by a
    probe allocation (its pid there is A's, which the driver never names)."""
    env = dict(sim_env, SIMGPU_CONTEXT_OVERHEAD="256MiB")
    regions = tmp_path / "regions"
    regions.mkdir()
    a = tenants(env, 1 * GiB, own_pid_namespace=True,
                limits=["--memory", "4GiB", "--region", regions / "a"])
    assert a.report["allocs"] == [OK]
    assert processes(env, own_pid_namespace=False)[a.host_pid] == 1 * GiB + 256 * MiB

    b = fill(env, regions / "b", "2GiB", 9, own_pid_namespace=own_proc)
    if own_proc:
        assert b["pid"] == a.report["pid"]  # the pid the driver's list does not name
    assert b["allocs"] == [OK] * 7 + [OOM] * 2
    # A context of its own fits a cap below what A holds.
    small = fill(env, regions / "small", "768MiB", 4, own_pid_namespace=own_proc)
    assert small["allocs"] == [OK] * 2 + [OOM] * 2


def test_status_from_the_node_shows_no_process_gone_from_a_container(sim_env, shim_path, tmp_path):
    """A program in a pid namespace of its own allocates and exits; no process
    of its container runs after it to take its slot back.  The node's view
    names neither it nor its bytes (a view never writes: it leaves them out)."""
    if not can_unshare_pid():
        pytest.skip("cannot make a pid namespace here (needs unshare(1) and root)")
    region = tmp_path / "region"
    Region.create(region, [parse_memory("1GiB")]).close()
    env = dict(sim_env, LD_PRELOAD=str(shim_path), VGPULIMIT_REGION=str(region))
    run([*OWN_PID_NAMESPACE, sys.executable, CLIENTS / "hold.py", "100"], env)
    with Region.open(region) as opened:   # the premise: its slot is still claimed
        assert sum(slot.state == 1 for slot in opened._cdata.slots) == 1
    data = status_json(env, region)
    assert data["processes"] == []
    assert data["devices"][0]["used_bytes"] == 0


def test_two_containers_of_one_pod_share_a_region_and_its_cap(sim_env, shim_path, tmp_path,
                                                                tenants):
    """Two containers of one pod, each in a pid namespace of its own, share one
    region (as HAMi's device plugin shares a pod's cache file): their processes
    have the same pids in their namespaces.  Neither takes the other's process
    for a dead one of its own: what A holds stays counted when B hits the cap."""
    region = tmp_path / "pod-region"
    a = tenants(sim_env, 768 * MiB, own_pid_namespace=True,
                limits=["--memory", "1GiB", "--region", region])
    assert a.report["allocs"] == [OK]
    # B's client is pid 2 in its namespace, under a shell, as A's is under `vgpulimit run`.
    env = dict(sim_env, LD_PRELOAD=str(shim_path), VGPULIMIT_REGION=str(region))
    client = f"{sys.executable} {CLIENTS / 'cuda_fill.py'} {256 * MiB} 2; exit $?"
    b = json.loads(run([*OWN_PID_NAMESPACE, "sh", "-c", client], env, timeout=60).stdout)
    assert b["pid"] == a.report["pid"]
    assert b["allocs"] == [OK, OOM]
    with Region.open(region) as shared:
        assert shared.snapshot().devices[0].used_bytes == 768 * MiB
    # A's process is killed: from B's namespace its death is seen all the same,
    # and what it held is B's to use.
    os.kill(a.host_pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{a.host_pid}").exists():  # its supervisor reaps it
        assert time.monotonic() < deadline, "A's process outlived SIGKILL by 30 s"
        time.sleep(0.01)
    client = f"{sys.executable} {CLIENTS / 'cuda_fill.py'} {256 * MiB} 5; exit $?"
    b = json.loads(run([*OWN_PID_NAMESPACE, "sh", "-c", client], env, timeout=60).stdout)
    assert b["allocs"] == [OK] * 4 + [OOM]


def test_a_process_joining_a_full_container_has_its_context_counted(sim_env, shim_path, tmp_path,
                                                                      tenants):
    """A container (pid namespace and /proc of its own) is at its 1 GiB cap: a
    256 MiB context and 768 MiB.  A further process there makes a context: it
    finds itself in the driver's list all the same (its probe is not refused
    by the full cap), so its context is counted, does not fit, and is undone,
    as on a full GPU."""
    env = dict(sim_env, SIMGPU_CONTEXT_OVERHEAD="256MiB")
    region = tmp_path / "region"
    a = tenants(env, 768 * MiB, own_pid_namespace=True,
                limits=["--memory", "1GiB", "--region", region])
    assert a.report["allocs"] == [OK]
    joined = dict(env, LD_PRELOAD=str(shim_path), VGPULIMIT_REGION=str(region))
    result = run([*OWN_PID_NAMESPACE, sys.executable, CLIENTS / "hold.py", "1"], joined, check=False)
    assert result.returncode == 1
    assert f"hold: cuDevicePrimaryCtxRetain: {OOM}" in result.stderr, result.stderr

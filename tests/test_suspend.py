"""`vgpulimit suspend` / `vgpulimit resume` of containers on the simulated GPU,
as a setter on the node runs them: every process of a container locked, then
checkpointed, all or nothing; its memory off the GPU and back at the same
addresses with its bytes intact; refusals in one line with nothing half done;
tenants killed at any moment; and what a tenant cannot do (docs/suspend.md)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import GiB, MiB, vgpulimit_cmd
from helpers import one_error_line, status_json, vgpulimit
from tenants import Tenant, ctl, nvml_memory

from vgpulimit.suspend_record import read_record

OK = "CUDA_SUCCESS"


class Containers:
    """Tenants in containers of the test's simulated GPU: the first of each
    under `vgpulimit run --simulate --region R`, the others joined to R."""

    def __init__(self, env, shim_path: Path, tmp_path: Path) -> None:
        self.env, self.shim, self.tmp = env, shim_path, tmp_path
        self.tenants: list[Tenant] = []

    def start(self, name: str, *flags: str, env: dict[str, str] | None = None) -> Tenant:
        region = self.tmp / name if "/" in name else self.tmp / f"{name}.region"
        if region.exists():
            tenant = Tenant(dict(self.env, **env or {}, LD_PRELOAD=str(self.shim), VGPULIMIT_REGION=str(region)))
        else:
            tenant = Tenant(dict(self.env, **env or {}), prefix=(*map(str, vgpulimit_cmd("run", "--simulate", "--region", region,
                                                                       *flags)), "--"))
        tenant.region = region
        self.tenants.append(tenant)
        return tenant

    def close(self) -> None:
        for t in self.tenants:
            t.close()


@pytest.fixture
def containers(sim_env, shim_path, tmp_path):
    made = Containers(sim_env, shim_path, tmp_path)
    yield made
    made.close()


def setter(env, action: str, region: Path, *flags: str) -> subprocess.CompletedProcess:
    return vgpulimit(action, "--simulate", "--region", region, *flags, env=env, timeout=120)


def states(env, *tenants: Tenant) -> list[str]:
    return [ctl(env, "state", t.pid)["state"] for t in tenants]


def test_two_containers_one_of_two_processes_suspended_and_resumed_by_hand(sim_env, containers):
    a1 = containers.start("a", "--memory", "8GiB")
    a2 = containers.start("a")
    b = containers.start("b", "--memory", "12GiB")
    for tenant, size in ((a1, 3 * GiB), (a2, GiB + 4 * MiB), (b, 2 * GiB)):
        assert tenant.ask(f"alloc {size}")["result"] == OK
    held_a = 4 * GiB + 4 * MiB
    assert nvml_memory(sim_env)["used"] == held_a + 2 * GiB

    done = setter(sim_env, "suspend", a1.region)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("suspended: 4100 MiB off the GPU")
    assert states(sim_env, a1, a2, b) == ["CU_PROCESS_STATE_CHECKPOINTED"] * 2 + ["CU_PROCESS_STATE_RUNNING"]
    # The node's free memory rose by exactly what the container held; both
    # of its processes are still listed, with nothing.
    seen = nvml_memory(sim_env)
    assert seen["used"] == 2 * GiB
    assert (seen["procs"][a1.pid], seen["procs"][a2.pid]) == (0, 0)
    # Its caps and records stay: the container still counts what comes back.
    assert status_json(sim_env, a1.region, "--interval", "0")["devices"][0]["used_bytes"] == held_a
    # Its CUDA calls wait; the other container runs on and may use the room.
    a1.send("info")
    assert b.ask(f"alloc {9 * GiB}")["result"] == OK
    assert not a1.answered_within(0.5)
    b.ask("free")

    done = setter(sim_env, "resume", a1.region)
    assert done.returncode == 0, done.stderr
    assert a1.answer() == {"free": 8 * GiB - held_a, "total": 8 * GiB}
    assert a1.ask("check")["intact"] and a2.ask("check")["intact"]
    assert nvml_memory(sim_env)["used"] == held_a

    # The other container too, and both back.
    b.ask(f"alloc {GiB}")
    for tenant in (a1, b):
        assert setter(sim_env, "suspend", tenant.region).returncode == 0
    assert nvml_memory(sim_env)["used"] == 0
    for tenant in (b, a1):
        assert setter(sim_env, "resume", tenant.region).returncode == 0
    assert nvml_memory(sim_env)["used"] == held_a + GiB
    assert all(t.ask("check")["intact"] for t in (a1, a2, b))


@pytest.mark.parametrize("command", ["managed 4096", "ipc"])
def test_a_process_with_managed_or_ipc_memory_refuses_the_whole_container(sim_env, containers, command):
    a1 = containers.start("a", "--memory", "8GiB")
    a2 = containers.start("a")
    a1.ask(f"alloc {GiB}")
    a2.ask(f"alloc {GiB}")
    assert a2.ask(command)["result"] == OK
    before = nvml_memory(sim_env)
    line = one_error_line(setter(sim_env, "suspend", a1.region))
    assert f"process {a2.pid} " in line and "managed (UVM) or IPC memory" in line
    # Nothing half done: the other process was checkpointed, then restored.
    assert states(sim_env, a1, a2) == ["CU_PROCESS_STATE_RUNNING"] * 2
    assert nvml_memory(sim_env) == before
    assert a1.ask("check")["intact"] and a2.ask("check")["intact"]
    assert "not suspended" in one_error_line(setter(sim_env, "resume", a1.region))


def test_a_process_whose_work_does_not_drain_in_time_refuses_the_suspend(sim_env, containers):
    a1 = containers.start("a", "--memory", "8GiB")
    a2 = containers.start("a")
    a1.ask(f"alloc {GiB}")
    assert a2.ask("launch 5000000")["result"] == OK   # 5 s of work in flight
    before = nvml_memory(sim_env)
    line = one_error_line(setter(sim_env, "suspend", a1.region, "--timeout", "300ms"))
    assert f"process {a2.pid} " in line and "within 300 ms" in line
    assert states(sim_env, a1, a2) == ["CU_PROCESS_STATE_RUNNING"] * 2
    assert a1.ask("check")["intact"]
    assert nvml_memory(sim_env) == before


def test_a_resume_without_room_leaves_the_container_suspended(sim_env, containers):
    a1 = containers.start("a", "--memory", "8GiB")
    a2 = containers.start("a")
    b = containers.start("b")
    a1.ask(f"alloc {2 * GiB}")
    a2.ask(f"alloc {2 * GiB}")
    assert setter(sim_env, "suspend", a1.region).returncode == 0
    assert b.ask(f"alloc {13 * GiB}")["result"] == OK   # 3 GiB left: one of the two fits
    line = one_error_line(setter(sim_env, "resume", a1.region))
    assert "the GPU has no room for it now" in line
    assert states(sim_env, a1, a2) == ["CU_PROCESS_STATE_CHECKPOINTED"] * 2
    assert nvml_memory(sim_env)["used"] == 13 * GiB
    b.ask("free")
    assert setter(sim_env, "resume", a1.region).returncode == 0
    assert a1.ask("check")["intact"] and a2.ask("check")["intact"]


def test_refusals_are_one_line(sim_env, containers, tmp_path):
    assert "region" in one_error_line(setter(sim_env, "suspend", tmp_path / "none.region"))
    a = containers.start("a", "--memory", "1GiB")
    assert "not suspended" in one_error_line(setter(sim_env, "resume", a.region))
    assert "--timeout" in one_error_line(setter(sim_env, "suspend", a.region, "--timeout", "soon"))
    # A driver without the checkpoint calls (before 570), or none at all.
    old = tmp_path / "old-driver"
    old.mkdir()
    (old / "libcuda.so.1").symlink_to(next(p for p in map(Path, ("/lib/x86_64-linux-gnu/libm.so.6",
                                                                  "/usr/lib/x86_64-linux-gnu/libm.so.6",
                                                                  "/lib64/libm.so.6")) if p.exists()))
    env = dict(sim_env, LD_LIBRARY_PATH=str(old))
    line = one_error_line(vgpulimit("suspend", "--region", a.region, env=env))
    assert "no checkpoint API" in line and "570" in line
    assert states(sim_env, a) == ["CU_PROCESS_STATE_RUNNING"]


def test_a_tenant_may_not_suspend_anyone(sim_env, containers, shim_path):
    victim = containers.start("a", "--memory", "4GiB")
    victim.ask(f"alloc {GiB}")
    env = dict(sim_env, LD_PRELOAD=str(shim_path), VGPULIMIT_MEMORY="1GiB")
    for op in ("lock", "checkpoint", "restore", "unlock"):
        assert ctl(env, op, victim.pid)["result"] == "CUDA_ERROR_NOT_PERMITTED", op
    assert ctl(env, "state", victim.pid) == {"state": "CU_PROCESS_STATE_RUNNING", "result": OK}


def test_a_tenant_cannot_have_a_neighbour_suspended_by_naming_it_in_its_region(sim_env, containers):
    """A region's slots are its tenant's to write: a slot naming another
    container's process would have a setter's suspend lock and checkpoint
    that process too.  Every process a suspend acts on must map the region."""
    from vgpulimit.region import Region

    neighbour = containers.start("neighbour", "--memory", "4GiB")
    liar = containers.start("liar", "--memory", "4GiB")
    for tenant in (neighbour, liar):
        assert tenant.ask(f"alloc {GiB}")["result"] == OK
    with Region.open(liar.region) as region:
        region.attach(neighbour.pid, neighbour.pid)
    line = one_error_line(setter(sim_env, "suspend", liar.region))
    assert f"names process {neighbour.pid}, which does not map it" in line
    assert states(sim_env, neighbour, liar) == ["CU_PROCESS_STATE_RUNNING"] * 2


@pytest.mark.parametrize("seed", range(4))
def test_a_tenant_killed_at_a_random_moment_leaves_figures_exact(sim_env, containers, seed):
    """One of two processes is killed while the container is being suspended,
    is suspended, or is being resumed; the survivor comes back intact, and the
    GPU, NVML and the container's own figures hold exactly what it holds."""
    rng = random.Random(seed)
    a1 = containers.start("a", "--memory", "10GiB")
    a2 = containers.start("a")
    a1.ask(f"alloc {4 * GiB}")
    a2.ask(f"alloc {4 * GiB}")
    victim, survivor = (a1, a2) if rng.random() < 0.5 else (a2, a1)
    phase = rng.choice(["suspending", "suspended", "resuming"])
    if phase != "suspending":
        assert setter(sim_env, "suspend", a1.region).returncode == 0
    action = "resume" if phase == "resuming" else "suspend"
    running = subprocess.Popen(vgpulimit_cmd(action, "--simulate", "--region", a1.region), env=sim_env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(rng.uniform(0.0, 0.3) if phase != "suspended" else 0)
    os.kill(victim.pid, signal.SIGKILL)
    victim.proc.wait(timeout=30)
    running.communicate(timeout=120)
    # Whatever happened, a resume brings the survivor back (or it was never suspended).
    resumed = setter(sim_env, "resume", a1.region)
    assert resumed.returncode == 0 or "not suspended" in resumed.stderr, resumed.stderr
    assert states(sim_env, survivor) == ["CU_PROCESS_STATE_RUNNING"]
    assert survivor.ask("check")["intact"]
    assert nvml_memory(sim_env) == {"used": 4 * GiB, "procs": {survivor.pid: 4 * GiB}}
    # The container's view leaves the dead one out, and its ledger gives the
    # dead one's bytes back before anything is refused: the cap's last 6 GiB fit.
    assert status_json(sim_env, a1.region, "--interval", "0")["devices"][0]["used_bytes"] == 4 * GiB
    assert survivor.ask(f"alloc {6 * GiB}")["result"] == OK
    assert survivor.ask("info") == {"free": 0, "total": 10 * GiB}


def test_a_suspended_containers_guarantee_and_memory_are_free_for_others(sim_env, containers):
    """16 GiB: a container guaranteed 8 GiB uses 2; a borrower (request
    2 GiB, cap 16 GiB) gets only the 8 GiB no one is owed.  Suspended, the
    first holds nothing and is owed nothing: the borrower gets all 16.  It
    comes back only once its memory fits again."""
    owner = containers.start("owner", "--memory", "8GiB")
    owner.ask(f"alloc {2 * GiB}")
    borrower = containers.start("borrower", "--memory", "16GiB", "--memory-request", "2GiB")
    results = [borrower.ask(f"alloc {GiB}")["result"] for _ in range(9)]
    assert results == [OK] * 8 + ["CUDA_ERROR_OUT_OF_MEMORY"]

    assert setter(sim_env, "suspend", owner.region).returncode == 0
    assert [borrower.ask(f"alloc {GiB}")["result"] for _ in range(9)] == [OK] * 8 + ["CUDA_ERROR_OUT_OF_MEMORY"]
    assert nvml_memory(sim_env)["used"] == 16 * GiB

    assert "no room" in one_error_line(setter(sim_env, "resume", owner.region))
    borrower.ask("free")
    assert setter(sim_env, "resume", owner.region).returncode == 0
    assert owner.ask("check")["intact"]
    # Owed its guarantee again: the borrower is back to what no one is owed.
    assert [borrower.ask(f"alloc {GiB}")["result"] for _ in range(9)] == [OK] * 8 + ["CUDA_ERROR_OUT_OF_MEMORY"]


def test_status_top_metrics_and_the_node_view_show_it_exactly(sim_env, containers, tmp_path):
    from test_node_view import gpu_series, serve_metrics

    a1 = containers.start("a", "--memory", "8GiB")
    a2 = containers.start("a")
    b = containers.start("b", "--memory", "8GiB")
    a1.ask(f"alloc {3 * GiB}")
    a2.ask(f"alloc {GiB}")
    b.ask(f"alloc {2 * GiB}")
    assert setter(sim_env, "suspend", a1.region).returncode == 0

    own = status_json(sim_env, a1.region, "--interval", "0")
    assert own["suspend"]["state"] == "suspended"
    assert (own["suspend"]["out_bytes"], own["suspend"]["suspends"], own["suspend"]["resumes"]) == (4 * GiB, 1, 0)
    assert own["suspend"]["last_suspend_ns"] > 0
    assert (own["devices"][0]["used_bytes"], own["devices"][0]["out_bytes"]) == (4 * GiB, 4 * GiB)
    text = vgpulimit("status", "--region", a1.region, "--interval", "0", env=sim_env).stdout
    assert "4 GiB off the GPU (suspended 1 time(s), resumed 0;" in text

    node = json.loads(vgpulimit("status", "--all", tmp_path, "--json", "--interval", "0", env=sim_env).stdout)
    [gpu] = node["gpus"]
    # NVML's figure and the containers' agree to the byte: nothing outside.
    assert (gpu["used_bytes"], gpu["regions_used_bytes"], gpu["outside_bytes"]) == (2 * GiB, 2 * GiB, 0)
    rows = {Path(c["region"]).name: c for c in gpu["containers"]}
    assert (rows["a.region"]["suspend_state"], rows["a.region"]["used_bytes"], rows["a.region"]["out_bytes"]) == \
           ("suspended", 0, 4 * GiB)
    assert (rows["b.region"]["suspend_state"], rows["b.region"]["used_bytes"]) == ("running", 2 * GiB)
    top = vgpulimit("top", "-1", "--all", tmp_path, env=dict(sim_env, COLUMNS="160")).stdout
    assert "a.region [suspended]" in top and "4 GiB off the GPU" in top
    [samples], _ = serve_metrics(sim_env, tmp_path)
    assert [labels for (n, labels), v in samples.items() if n == "vgpulimit_suspend_state" and v == 1] != []
    assert gpu_series(samples, "vgpulimit_memory_out_bytes") == [4 * GiB]
    assert gpu_series(samples, "vgpulimit_suspends_total") == [1]

    assert setter(sim_env, "resume", a1.region).returncode == 0
    own = status_json(sim_env, a1.region, "--interval", "0")["suspend"]
    assert (own["state"], own["out_bytes"], own["resumes"]) == ("running", 0, 1)
    assert own["suspended_ns"] > 0
    node = json.loads(vgpulimit("status", "--all", tmp_path, "--json", "--interval", "0", env=sim_env).stdout)
    assert (node["gpus"][0]["used_bytes"], node["gpus"][0]["outside_bytes"]) == (6 * GiB, 0)


def test_a_container_named_by_its_id_among_the_node_s_regions(sim_env, containers, tmp_path):
    """As the OCI hook keeps them: <node dir>/<container id>/region, who it is beside it."""
    from vgpulimit import identity

    node = tmp_path / "node"
    for cid in ("4f1d2a9c0b7e", "4f9e8d7c6b5a"):
        (node / cid).mkdir(parents=True)
        fd = os.open(node / cid, os.O_DIRECTORY)
        identity.write(fd, identity.Identity(container_id=cid))
        os.close(fd)
    a = containers.start("node/4f1d2a9c0b7e/region", "--memory", "4GiB")
    b = containers.start("node/4f9e8d7c6b5a/region", "--memory", "4GiB")
    a.ask(f"alloc {GiB}")
    b.ask(f"alloc {GiB}")
    assert "2 containers" in one_error_line(vgpulimit("suspend", "--simulate", "--container", "4f", "--all", node,
                                                      env=sim_env))
    assert "no container" in one_error_line(vgpulimit("suspend", "--simulate", "--container", "77", "--all", node,
                                                      env=sim_env))
    done = vgpulimit("suspend", "--simulate", "--container", "4f1d", "--all", node, env=sim_env)
    assert done.returncode == 0, done.stderr
    assert states(sim_env, a, b) == ["CU_PROCESS_STATE_CHECKPOINTED", "CU_PROCESS_STATE_RUNNING"]
    assert vgpulimit("resume", "--simulate", "--container", "4f1d2a9c0b7e", "--all", node,
                     env=sim_env).returncode == 0
    assert a.ask("check")["intact"]


def test_a_stopped_process_gives_the_suspend_up_at_its_timeout_with_all_left_running(sim_env, containers):
    """A process stopped (SIGSTOP) never answers the driver: the suspend is
    given up within --timeout in one line, every process RUNNING and the
    other one's calls not held; continued, the container suspends."""
    a1 = containers.start("a", "--memory", "8GiB")
    a2 = containers.start("a")
    a1.ask(f"alloc {GiB}")
    a2.ask(f"alloc {GiB}")
    before = nvml_memory(sim_env)
    os.kill(a2.pid, signal.SIGSTOP)
    try:
        line = one_error_line(setter(sim_env, "suspend", a1.region, "--timeout", "500ms"))
        assert f"process {a2.pid} " in line and "within 500 ms" in line and "stopped" in line
        assert states(sim_env, a1, a2) == ["CU_PROCESS_STATE_RUNNING"] * 2
        assert a1.ask("check")["intact"]
        assert nvml_memory(sim_env) == before
        assert status_json(sim_env, a1.region, "--interval", "0")["suspend"]["state"] == "running"
    finally:
        os.kill(a2.pid, signal.SIGCONT)
    assert setter(sim_env, "suspend", a1.region).returncode == 0
    assert nvml_memory(sim_env)["used"] == 0
    assert setter(sim_env, "resume", a1.region).returncode == 0
    assert a1.ask("check")["intact"] and a2.ask("check")["intact"]


def test_a_process_failed_in_its_restore_is_reported_and_the_others_come_back_once_it_ends(sim_env, containers):
    """The driver's FAILED: a restore whose copy back fails half way
    (SIMGPU_FAIL in the process's environment).  The resume says so in one
    line, naming the process and what to do; the container stays suspended
    (its other process checkpointed again) and `status` says the same; once
    the failed process is ended, a resume brings the other back intact."""
    a1 = containers.start("a", "--memory", "8GiB")
    a2 = containers.start("a", env={"SIMGPU_FAIL": "cuCheckpointProcessRestore"})
    a1.ask(f"alloc {GiB}")
    a2.ask(f"alloc {2 * GiB}")
    assert setter(sim_env, "suspend", a1.region).returncode == 0
    line = one_error_line(setter(sim_env, "resume", a1.region))
    assert f"process {a2.pid} " in line and "FAILED" in line and f"kill {a2.pid}" in line
    assert states(sim_env, a1, a2) == ["CU_PROCESS_STATE_CHECKPOINTED", "CU_PROCESS_STATE_FAILED"]
    # The failed one holds its memory again (charged, contents lost), the other none.
    assert nvml_memory(sim_env) == {"used": 2 * GiB, "procs": {a1.pid: 0, a2.pid: 2 * GiB}}
    own = status_json(sim_env, a1.region, "--interval", "0")
    assert (own["suspend"]["state"], own["suspend"]["failed"]) == ("suspended", [a2.pid])
    text = vgpulimit("status", "--region", a1.region, "--interval", "0", env=sim_env).stdout
    assert f"process {a2.pid} FAILED in the driver" in text and "end it" in text
    assert "FAILED" in one_error_line(setter(sim_env, "resume", a1.region))
    assert "FAILED" in one_error_line(setter(sim_env, "suspend", a1.region))

    a2.kill()
    assert setter(sim_env, "resume", a1.region).returncode == 0
    assert a1.ask("check")["intact"]
    assert nvml_memory(sim_env) == {"used": GiB, "procs": {a1.pid: GiB}}
    own = status_json(sim_env, a1.region, "--interval", "0")
    assert (own["suspend"]["state"], own["suspend"]["failed"], own["devices"][0]["used_bytes"]) == \
           ("running", [], GiB)


def _frees(region: Path) -> int:
    """The wake word of the beacon of the container of ``region`` on its
    device 0: what those who wait for memory sleep on."""
    from vgpulimit._paths import core
    from vgpulimit.region import Region

    ffi, _ = core()
    with Region.open(region) as r:
        beacon = Path(r.snapshot().board).parent / f"beacon-{r.board_key:016x}"
    at = ffi.offsetof("struct vgl_beacon", "device") + ffi.offsetof("struct vgl_beacon_device", "frees")
    return int.from_bytes(beacon.read_bytes()[at:at + 4], "little")


def test_a_suspend_wakes_the_waiters_of_other_containers_at_once(sim_env, containers):
    """B waits for memory A holds.  A's processes free nothing (they are
    locked, then checkpointed): the suspend itself wakes those who wait, on
    A's wake word as a free of A's would, and B is served long before its
    wait's end."""
    a = containers.start("a", "--memory", "12GiB")
    b = containers.start("b", "--memory", "8GiB", "--memory-wait", "60s")
    a.ask(f"alloc {10 * GiB}")
    assert b.ask(f"alloc {4 * GiB}")["result"] == OK
    b.send(f"alloc {4 * GiB}")   # 2 GiB free: it waits
    for _ in range(400):
        if status_json(sim_env, b.region, "--interval", "0")["devices"][0]["waiting"] == 1:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("B never waited")
    woken = _frees(a.region)
    assert setter(sim_env, "suspend", a.region).returncode == 0
    assert _frees(a.region) > woken
    assert b.answer()["result"] == OK
    shown = status_json(sim_env, b.region, "--interval", "0")["devices"][0]
    assert (shown["used_bytes"], shown["waiting"], shown["wait_timeouts"]) == (8 * GiB, 0, 0)
    assert nvml_memory(sim_env)["used"] == 8 * GiB


def test_a_container_named_as_the_node_view_shows_it(sim_env, containers, tmp_path):
    """From the node view: `status --all` names a container without a name
    by its region's path (`top --all` by its end); `--container` takes either."""
    for job in ("a", "b"):
        (tmp_path / "jobs" / job).mkdir(parents=True)
    a = containers.start("jobs/a/region", "--memory", "4GiB")
    b = containers.start("jobs/b/region", "--memory", "4GiB")
    a.ask(f"alloc {GiB}")
    b.ask(f"alloc {GiB}")
    node = json.loads(vgpulimit("status", "--all", tmp_path, "--json", "--interval", "0", env=sim_env).stdout)
    names = sorted(c["region"] for c in node["gpus"][0]["containers"])
    assert names == [str(a.region), str(b.region)]
    assert "2 containers" in one_error_line(vgpulimit("suspend", "--simulate", "--container", "region", "--all",
                                                      tmp_path, env=sim_env))
    done = vgpulimit("suspend", "--simulate", "--container", "a/region", "--all", tmp_path, env=sim_env)
    assert done.returncode == 0, done.stderr
    assert states(sim_env, a, b) == ["CU_PROCESS_STATE_CHECKPOINTED", "CU_PROCESS_STATE_RUNNING"]
    top = vgpulimit("top", "-1", "--all", tmp_path, env=dict(sim_env, COLUMNS="160")).stdout
    assert "a/region [suspended]" in top
    done = vgpulimit("resume", "--simulate", "--container", names[0], "--all", tmp_path, env=sim_env)
    assert done.returncode == 0, done.stderr
    assert a.ask("check")["intact"]


def _exact(sim_env, region: Path, survivor: Tenant) -> None:
    """The GPU, NVML and the container hold exactly what ``survivor`` holds
    (4 GiB), and the cap's last 6 GiB fit it."""
    assert states(sim_env, survivor) == ["CU_PROCESS_STATE_RUNNING"]
    assert survivor.ask("check")["intact"]
    assert nvml_memory(sim_env) == {"used": 4 * GiB, "procs": {survivor.pid: 4 * GiB}}
    assert status_json(sim_env, region, "--interval", "0")["devices"][0]["used_bytes"] == 4 * GiB
    assert survivor.ask(f"alloc {6 * GiB}")["result"] == OK
    assert survivor.ask("info") == {"free": 0, "total": 10 * GiB}


def test_a_tenant_killed_in_the_middle_of_its_restore_leaves_figures_exact(sim_env, containers):
    """Its memory is charged back and on its way (a slow host link: 2 GB/s)
    when it is killed; the resume brings the other back, and nothing of the
    dead one is counted anywhere."""
    slow = {"SIMGPU_COPY_GBPS": "2"}
    victim = containers.start("a", "--memory", "10GiB", env=slow)
    survivor = containers.start("a", env=slow)
    victim.ask(f"alloc {4 * GiB}")
    survivor.ask(f"alloc {4 * GiB}")
    assert setter(sim_env, "suspend", victim.region).returncode == 0
    resuming = subprocess.Popen(vgpulimit_cmd("resume", "--simulate", "--region", victim.region), env=sim_env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while nvml_memory(sim_env)["used"] == 0:   # until the first restore has charged its memory back
        assert resuming.poll() is None
    os.kill(victim.pid, signal.SIGKILL)
    victim.proc.wait(timeout=30)
    _, err = resuming.communicate(timeout=120)
    assert resuming.returncode == 0, err
    _exact(sim_env, victim.region, survivor)


def test_a_tenant_killed_while_stopped_with_a_lock_given_up_leaves_figures_exact(sim_env, containers):
    victim = containers.start("a", "--memory", "10GiB")
    survivor = containers.start("a")
    victim.ask(f"alloc {4 * GiB}")
    survivor.ask(f"alloc {4 * GiB}")
    os.kill(victim.pid, signal.SIGSTOP)
    assert "stopped" in one_error_line(setter(sim_env, "suspend", victim.region, "--timeout", "300ms"))
    os.kill(victim.pid, signal.SIGKILL)
    victim.proc.wait(timeout=30)
    assert setter(sim_env, "suspend", victim.region).returncode == 0
    assert nvml_memory(sim_env) == {"used": 0, "procs": {survivor.pid: 0}}
    assert setter(sim_env, "resume", victim.region).returncode == 0
    _exact(sim_env, victim.region, survivor)


def _killed_when(command: list[str], env, ready) -> None:
    """Runs a setter and SIGKILLs it once ``ready()``: the step it asked for
    is left under way in its target, as the driver carries it out there."""
    setter_proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ready():
        assert setter_proc.poll() is None, setter_proc.stderr.read()
        assert time.monotonic() < deadline, "the setter's step never started"
        time.sleep(0.005)
    time.sleep(0.3)   # its request is posted; the step takes seconds
    setter_proc.kill()
    setter_proc.communicate(timeout=30)


@pytest.mark.parametrize("killed", ["lock", "checkpoint", "restore"])
def test_a_setter_killed_in_the_middle_of_a_step_is_finished_by_the_next_resume(sim_env, containers, killed):
    """A setter (a person's `vgpulimit suspend`, the agent) killed while its
    target carries out its lock (work in flight), its checkpoint or its
    restore (a slow host link): the next resume waits for that step and
    brings the container back, and nothing stays locked."""
    slow = {"SIMGPU_COPY_GBPS": "2"}
    a = containers.start("a", "--memory", "10GiB", env=slow)
    assert a.ask(f"alloc {4 * GiB}")["result"] == OK
    if killed == "lock":
        assert a.ask("launch 3000000")["result"] == OK   # 3 s of work the lock waits for
    before = nvml_memory(sim_env)
    if killed == "restore":
        assert setter(sim_env, "suspend", a.region).returncode == 0
        _killed_when(vgpulimit_cmd("resume", "--simulate", "--region", str(a.region)), sim_env,
                     lambda: nvml_memory(sim_env)["used"] > 0)
    else:
        held = "CU_PROCESS_STATE_RUNNING" if killed == "lock" else "CU_PROCESS_STATE_LOCKED"
        _killed_when(vgpulimit_cmd("suspend", "--simulate", "--region", str(a.region)), sim_env,
                     lambda: read_record(a.region).state == "suspending" and states(sim_env, a) == [held])
    done = setter(sim_env, "resume", a.region)
    assert done.returncode == 0, done.stderr
    assert states(sim_env, a) == ["CU_PROCESS_STATE_RUNNING"]
    assert a.ask("check")["intact"]
    assert nvml_memory(sim_env) == before
    assert status_json(sim_env, a.region, "--interval", "0")["suspend"]["state"] == "running"

"""The node agent on the simulated GPU (docs/agent.md): it suspends by the
setters' rules (guarantees, priorities, idle limits), for a live waiter that
is owed memory or a container that asks to be resumed, and resumes when
memory is free again; nothing is suspended without it; killed at any moment
and restarted, it finishes what it was doing; a tenant's forged claims get
nothing.  Every wait below is for a state (bounded, never timed)."""

from __future__ import annotations

import fcntl
import json
import os
import random
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import GiB, vgpulimit_cmd
from helpers import status_json, vgpulimit
from tenants import ctl, nvml_memory
from test_suspend import Containers

OK = "CUDA_SUCCESS"
OOM = "CUDA_ERROR_OUT_OF_MEMORY"
CHECKPOINTED = "CU_PROCESS_STATE_CHECKPOINTED"
RUNNING = "CU_PROCESS_STATE_RUNNING"
BOUND_S = 120   # a bound on every wait for a state, never a figure that is asserted


def until(predicate, what: str, seen=None):
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {BOUND_S} s: {what}" + (f"; seen: {seen()}" if seen else ""))


class AgentProcess:
    def __init__(self, env, tmp_path: Path, *flags: str) -> None:
        self.env, self.tmp, self.flags = env, tmp_path, flags
        self.proc = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen([*vgpulimit_cmd("agent", "--simulate", "--regions", str(self.tmp),
                                                      "--interval", "0.05", *self.flags)],
                                     env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        until(lambda: self.state() is not None and self.state()["pid"] == self.proc.pid or self._died(),
              "the agent serves")

    def _died(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"the agent exited {self.proc.returncode}: {self.proc.stderr.read()}")
        return False

    def board_dir(self) -> Path:
        return Path(self.env["XDG_RUNTIME_DIR"]) / "vgpulimit"

    def state(self) -> dict | None:
        try:
            return json.loads((self.board_dir() / "agent.json").read_text())
        except (OSError, ValueError):
            return None

    def decisions(self) -> list[dict]:
        try:
            lines = (self.board_dir() / "agent.log").read_text().splitlines()
        except OSError:
            return []
        return [json.loads(line) for line in lines if line]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.proc.stdout.close()
        self.proc.stderr.close()


@pytest.fixture
def containers(sim_env, shim_path, tmp_path):
    made = Containers(sim_env, shim_path, tmp_path)
    yield made
    made.close()


@pytest.fixture
def agent(sim_env, tmp_path):
    made = []

    def start(*flags):
        made.append(AgentProcess(sim_env, tmp_path, *flags))
        return made[-1]
    yield start
    for a in made:
        a.stop()


def state_of(env, tenant) -> str:
    return ctl(env, "state", tenant.pid)["state"]


def borrower_and_owner(containers, wait="60s"):
    """16 GiB: a borrower (request 2 GiB) takes 12 GiB before the owner of a
    guarantee of 8 GiB starts; the owner's 8 GiB then waits for memory."""
    borrower = containers.start("borrower", "--memory", "16GiB", "--memory-request", "2GiB")
    assert [borrower.ask(f"alloc {4 * GiB}")["result"] for _ in range(3)] == [OK] * 3
    owner = containers.start("owner", "--memory", "8GiB", "--memory-wait", wait)
    return borrower, owner


def test_a_borrower_is_suspended_for_the_owner_of_a_guarantee_and_resumed_once_memory_is_free(
        sim_env, containers, agent):
    borrower, owner = borrower_and_owner(containers)
    a = agent()
    assert owner.ask(f"alloc {8 * GiB}")["result"] == OK
    assert state_of(sim_env, borrower) == CHECKPOINTED
    [decision] = [d for d in a.decisions() if d["action"] == "suspend"]
    assert decision["container"].endswith("borrower.region") and decision["for"].endswith("owner.region")
    assert "borrowing past its guarantee" in decision["why"] and decision["out_bytes"] == 12 * GiB
    # Not resumed while its memory is not free: 8 GiB are, it held 12.
    assert status_json(sim_env, borrower.region, "--interval", "0")["suspend"]["state"] == "suspended"
    owner.ask("free")
    until(lambda: state_of(sim_env, borrower) == RUNNING, "the borrower is resumed")
    assert borrower.ask("check")["intact"]
    assert [d["action"] for d in a.decisions()] == ["suspend", "resume"]


def test_without_an_agent_nothing_is_suspended_and_the_wait_ends_in_a_refusal(sim_env, containers):
    borrower, owner = borrower_and_owner(containers, wait="300ms")
    assert owner.ask(f"alloc {8 * GiB}")["result"] == OOM
    assert state_of(sim_env, borrower) == RUNNING
    text = vgpulimit("status", "--region", owner.region, "--interval", "0", env=sim_env).stdout
    assert "no node agent" in text


def test_a_lower_priority_is_suspended_for_a_higher_one_past_its_guarantee(sim_env, containers, agent):
    low = containers.start("low", "--memory", "12GiB", "--priority", "low")
    assert low.ask(f"alloc {12 * GiB}")["result"] == OK
    normal = containers.start("normal", "--memory", "2GiB", "--priority", "normal")
    assert normal.ask(f"alloc {GiB}")["result"] == OK
    high = containers.start("high", "--memory", "8GiB", "--memory-request", "1GiB", "--memory-wait", "60s",
                            "--priority", "high")
    agent()
    assert high.ask(f"alloc {GiB}")["result"] == OK
    assert high.ask(f"alloc {4 * GiB}")["result"] == OK
    assert [state_of(sim_env, t) for t in (low, normal)] == [CHECKPOINTED, RUNNING]


def test_a_waiter_of_the_same_priority_past_its_guarantee_gets_no_one_suspended(sim_env, containers, agent):
    holder = containers.start("holder", "--memory", "12GiB")
    assert holder.ask(f"alloc {12 * GiB}")["result"] == OK
    borrower = containers.start("borrower", "--memory", "8GiB", "--memory-request", "1GiB",
                                "--memory-wait", "500ms")
    a = agent()
    assert borrower.ask(f"alloc {5 * GiB}")["result"] == OOM
    assert state_of(sim_env, holder) == RUNNING
    assert [d for d in a.decisions() if d["action"] == "suspend"] == []


def test_idle_notebooks_are_suspended_for_a_waiter_and_each_is_resumed_when_it_calls_cuda(
        sim_env, containers, agent):
    """16 GiB: notebooks A (7 GiB, cap 8) and B (6 GiB, cap 8) idle past their limit;
    a job waits for 6 GiB: the fewest idle ones that make room, A, are suspended.
    A allocates again: its call asks, and room is made by suspending B, idle
    (A's 8 GiB are within its guarantee).  B then launches a kernel: A, idle
    again by then, makes room for it."""
    a = containers.start("a", "--memory", "8GiB", "--suspend-idle", "300ms")
    b = containers.start("b", "--memory", "8GiB", "--suspend-idle", "300ms")
    assert a.ask(f"alloc {7 * GiB}")["result"] == OK
    assert b.ask(f"alloc {6 * GiB}")["result"] == OK
    assert b.ask("launch 100")["result"] == OK   # its kernel loaded: its next launch is a launch alone
    job = containers.start("job", "--memory", "8GiB", "--memory-wait", "100s")
    log = agent().decisions
    assert job.ask(f"alloc {6 * GiB}")["result"] == OK
    assert [state_of(sim_env, t) for t in (a, b)] == [CHECKPOINTED, RUNNING]

    assert a.ask(f"alloc {GiB // 2}")["result"] == OK
    assert [state_of(sim_env, t) for t in (a, b)] == [RUNNING, CHECKPOINTED]
    assert a.ask("check")["intact"]
    assert b.ask("launch 100")["result"] == OK   # a launch asks as an allocation does
    assert [state_of(sim_env, t) for t in (a, b)] == [CHECKPOINTED, RUNNING]
    assert b.ask("check")["intact"]
    said = [(d["action"], Path(d["container"]).stem, d["for"] and Path(d["for"]).stem) for d in log()]
    assert said == [("suspend", "a", "job"), ("suspend", "b", "a"), ("resume", "a", None),
                    ("suspend", "a", "b"), ("resume", "b", None)]
    assert all("idle for" in d["why"] for d in log() if d["action"] == "suspend")


@pytest.mark.parametrize("call", ["async", "pool", "sync"])
def test_a_notebook_whose_next_call_is_an_ordered_allocation_or_a_synchronisation_is_resumed(
        sim_env, containers, agent, call):
    """As above: A (7 GiB) suspended for the job, B (6 GiB) idle.  A's next
    call is cuMemAllocAsync, cuMemAllocFromPoolAsync or cuCtxSynchronize:
    it asks as a launch does, B is suspended to make room, and A's call
    completes with its memory intact."""
    a = containers.start("a", "--memory", "8GiB", "--suspend-idle", "300ms")
    b = containers.start("b", "--memory", "8GiB", "--suspend-idle", "300ms")
    assert a.ask(f"alloc {7 * GiB}")["result"] == OK
    assert b.ask(f"alloc {6 * GiB}")["result"] == OK
    job = containers.start("job", "--memory", "8GiB", "--memory-wait", "100s")
    log = agent().decisions
    assert job.ask(f"alloc {6 * GiB}")["result"] == OK
    assert [state_of(sim_env, t) for t in (a, b)] == [CHECKPOINTED, RUNNING]

    a.send("sync" if call == "sync" else f"{call} {GiB // 2}")
    until(lambda: state_of(sim_env, a) == RUNNING, f"a's {call} asks and a is resumed", seen=log)
    assert a.answer()["result"] == OK
    assert [state_of(sim_env, t) for t in (a, b)] == [RUNNING, CHECKPOINTED]
    assert a.ask("check")["intact"]
    said = [(d["action"], Path(d["container"]).stem, d["for"] and Path(d["for"]).stem) for d in log()]
    assert said == [("suspend", "a", "job"), ("suspend", "b", "a"), ("resume", "a", None)]


@pytest.mark.parametrize("call", ["async", "sync"])
def test_without_an_agent_a_suspended_containers_call_asks_and_waits_until_resumed(sim_env, containers, call):
    """No agent: the call of a suspended container asks (its beacon's byte
    locked) and waits, answered only once a setter resumes it."""
    from vgpulimit.agent.watch import RESUME_BYTE, byte_held

    a = containers.start("a", "--memory", "8GiB", "--suspend-idle", "300ms")
    assert a.ask(f"alloc {GiB}")["result"] == OK
    assert vgpulimit("suspend", "--simulate", "--region", a.region, env=sim_env).returncode == 0
    beacon = _beacon(sim_env, a.region)

    def asking() -> bool:
        fd = os.open(beacon, os.O_RDONLY)
        try:
            return byte_held(fd, RESUME_BYTE)
        finally:
            os.close(fd)

    a.send("sync" if call == "sync" else f"{call} {GiB}")
    until(asking, f"a's {call} asks")
    assert state_of(sim_env, a) == CHECKPOINTED
    assert not a.answered_within(0)
    assert vgpulimit("resume", "--simulate", "--region", a.region, env=sim_env).returncode == 0
    assert a.answer()["result"] == OK
    assert a.ask("check")["intact"]
    assert not asking()


def test_a_container_suspended_by_hand_is_left_to_its_setter(sim_env, containers, agent):
    a = containers.start("a", "--memory", "8GiB", "--suspend-idle", "300ms")
    assert a.ask(f"alloc {GiB}")["result"] == OK
    assert vgpulimit("suspend", "--simulate", "--region", a.region, env=sim_env).returncode == 0
    agent()
    a.send(f"alloc {GiB}")
    assert not a.answered_within(1.0)
    assert state_of(sim_env, a) == CHECKPOINTED
    assert vgpulimit("resume", "--simulate", "--region", a.region, env=sim_env).returncode == 0
    assert a.answer()["result"] == OK


def test_suspend_idle_is_checked_and_needs_no_cap(sim_env, tmp_path):
    bad = vgpulimit("run", "--simulate", "--suspend-idle", "5", "--", "true", env=sim_env)
    assert bad.returncode == 2 and "--suspend-idle '5'" in bad.stderr and len(bad.stderr.splitlines()) == 1
    ok = vgpulimit("run", "--simulate", "--suspend-idle", "10m", "--region", tmp_path / "r", "--",
                   sys.executable, "-c", "pass", env=sim_env)
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("seed", range(1, 7))
def test_an_agent_killed_at_a_random_moment_and_restarted_finishes_what_it_was_doing(
        sim_env, containers, agent, seed):
    """Killed again and again while it suspends the borrower for the owner
    and resumes it after the owner frees: in the end the owner got its
    memory, the borrower runs with its bytes intact, and nothing is left
    suspended, locked or in the agent's journal."""
    rng = random.Random(seed)
    borrower, owner = borrower_and_owner(containers)
    a = agent()
    owner.send(f"alloc {8 * GiB}")
    for _ in range(4):
        time.sleep(rng.uniform(0, 0.4))
        a.kill()
        a.start()
    assert owner.answer()["result"] == OK
    owner.ask("free")
    for _ in range(3):
        time.sleep(rng.uniform(0, 0.4))
        a.kill()
        a.start()
    until(lambda: state_of(sim_env, borrower) == RUNNING and a.state()["suspended"] == {},
          "the borrower runs, and the agent holds nothing", lambda: (state_of(sim_env, borrower), a.state(),
                                                                     a.decisions()))
    assert borrower.ask("check")["intact"]
    assert status_json(sim_env, borrower.region, "--interval", "0")["suspend"]["state"] == "running"
    assert nvml_memory(sim_env)["used"] == 12 * GiB


def _beacon(sim_env, region: Path) -> Path:
    from vgpulimit import board
    from vgpulimit.agent.watch import beacon_name

    path = Path(sim_env["XDG_RUNTIME_DIR"]) / "vgpulimit" / "priority.board"
    return path.parent / beacon_name(board.find(str(path), str(region)).key)


def _lock_byte(path: Path, at: int) -> int:
    """A shared lock on byte `at` of the file, held by this (test) process's descriptor."""
    fd = os.open(path, os.O_RDONLY)
    fcntl.fcntl(fd, getattr(fcntl, "F_OFD_SETLK", 37), struct.pack("hh4xqqi4x", fcntl.F_RDLCK, 0, at, 1, 0))
    return fd


def test_a_tenants_forged_claims_get_no_one_suspended(sim_env, containers, agent):
    """A tenant beside an idle-limited holder and a borrower writes its own
    beacon: waiters on the GPU (without the lock a waiter holds, then with
    it but no waiting process), and asks to be resumed while it runs.  None
    of it suspends anyone."""
    from vgpulimit.agent.watch import RESUME_BYTE, ffi, waits_byte

    borrower = containers.start("borrower", "--memory", "16GiB", "--memory-request", "1GiB")
    assert borrower.ask(f"alloc {6 * GiB}")["result"] == OK
    idle = containers.start("idle", "--memory", "8GiB", "--suspend-idle", "100ms")
    assert idle.ask(f"alloc {6 * GiB}")["result"] == OK
    liar = containers.start("liar", "--memory", "8GiB", "--memory-wait", "60s", "--priority", "high")
    assert liar.ask(f"alloc {GiB}")["result"] == OK
    a = agent()
    beacon = _beacon(sim_env, liar.region)
    image = bytearray(beacon.read_bytes())
    entry = ffi.offsetof("struct vgl_beacon", "device")
    struct.pack_into("<QI I", image, entry + ffi.offsetof("struct vgl_beacon_device", "oldest_wait_ns"),
                     time.monotonic_ns() - 10**9, 0, 1)
    beacon.write_bytes(image)
    held = []
    try:
        time.sleep(0.5)   # looks, several times, at a claim without its lock
        held.append(_lock_byte(beacon, waits_byte(0)))
        time.sleep(0.5)   # with the lock, and no process of the container waiting
        held.append(_lock_byte(beacon, RESUME_BYTE))
        time.sleep(0.5)   # an ask to be resumed by a container that runs
        assert a.state()["pid"] == a.proc.pid and a.state()["error"] == ""
    finally:
        for fd in held:
            os.close(fd)
    assert [state_of(sim_env, t) for t in (borrower, idle, liar)] == [RUNNING] * 3
    assert [d for d in a.decisions() if d["action"] == "suspend"] == []


def test_several_gpus_each_by_its_own_rules(sim_env, shim_path, tmp_path, agent):
    """Two GPUs of 16 GiB: on each a borrower and an owner that waits; the
    borrower of each is suspended for the owner on its GPU, and a container
    within its guarantee on the second is not touched."""
    env = dict(sim_env, SIMGPU_DEVICES="2")
    gpu0 = Containers(env, shim_path, tmp_path)
    gpu1 = Containers(dict(env, CUDA_VISIBLE_DEVICES="1"), shim_path, tmp_path)
    try:
        b0, o0 = gpu0.start("b0", "--memory", "16GiB", "--memory-request", "1GiB"), None
        assert b0.ask(f"alloc {10 * GiB}")["result"] == OK
        keep = gpu1.start("keep", "--memory", "4GiB")
        assert keep.ask(f"alloc {4 * GiB}")["result"] == OK
        b1 = gpu1.start("b1", "--memory", "12GiB", "--memory-request", "1GiB")
        assert b1.ask(f"alloc {9 * GiB}")["result"] == OK
        o0 = gpu0.start("o0", "--memory", "10GiB", "--memory-wait", "100s")
        o1 = gpu1.start("o1", "--memory", "6GiB", "--memory-wait", "100s")
        made = AgentProcess(env, tmp_path)
        try:
            o0.send(f"alloc {10 * GiB}")
            o1.send(f"alloc {6 * GiB}")
            assert [o0.answer()["result"], o1.answer()["result"]] == [OK, OK]
            assert [state_of(env, t) for t in (b0, keep, b1)] == [CHECKPOINTED, RUNNING, CHECKPOINTED]
            fors = {Path(d["container"]).stem: Path(d["for"]).stem for d in made.decisions()
                    if d["action"] == "suspend"}
            assert fors == {"b0": "o0", "b1": "o1"}
        finally:
            made.stop()
    finally:
        gpu0.close()
        gpu1.close()


def test_who_was_suspended_for_whom_is_seen_in_status_top_and_metrics(sim_env, containers, agent, tmp_path):
    from test_node_view import gpu_series, serve_metrics

    borrower, owner = borrower_and_owner(containers)
    before = json.loads(vgpulimit("status", "--all", tmp_path, "--json", "--interval", "0", env=sim_env).stdout)
    assert [a["serving"] for a in before["agents"]] == [False]
    a = agent()
    assert owner.ask(f"alloc {8 * GiB}")["result"] == OK

    own = vgpulimit("status", "--region", borrower.region, "--interval", "0", env=sim_env).stdout
    assert "suspended by the node agent: borrowing past its guarantee, for owner.region" in own
    doc = status_json(sim_env, borrower.region, "--interval", "0")
    assert doc["agent"]["serving"] and doc["agent"]["suspended"]["for_name"] == str(owner.region)
    assert status_json(sim_env, owner.region, "--interval", "0")["agent"]["suspended"] is None

    node = vgpulimit("status", "--all", tmp_path, "--interval", "0", env=sim_env).stdout
    assert f"node agent (pid {a.proc.pid}): 1 suspend(s)" in node
    assert "suspend borrower.region for owner.region: borrowing past its guarantee" in node
    [agent_json] = json.loads(vgpulimit("status", "--all", tmp_path, "--json", "--interval", "0",
                                        env=sim_env).stdout)["agents"]
    assert (agent_json["serving"], agent_json["suspends"], list(agent_json["suspended"])) == \
           (True, 1, [str(borrower.region)])
    top = vgpulimit("top", "-1", "--all", tmp_path, env=dict(sim_env, COLUMNS="200")).stdout
    assert "suspended by the node agent: borrowing past its guarantee" in top and "node agent (pid" in top
    [samples], _ = serve_metrics(sim_env, tmp_path)
    assert gpu_series(samples, "vgpulimit_agent_up") == [1]
    assert gpu_series(samples, "vgpulimit_agent_suspends_total") == [1]
    assert [dict(labels)["for_region"] for (n, labels), v in samples.items() if n == "vgpulimit_agent_holds"] \
        == [str(owner.region)]

    a.stop()
    node = vgpulimit("status", "--all", tmp_path, "--interval", "0", env=sim_env).stdout
    assert "no node agent: nothing is suspended for others" in node
    [samples], _ = serve_metrics(sim_env, tmp_path)
    assert gpu_series(samples, "vgpulimit_agent_up") == [0]


def test_the_daemonset_runs_the_agent_on_the_hooks_board_and_install_unit_writes_a_service(tmp_path, sim_env):
    import yaml

    from vgpulimit.board import BOARD_NAME, NODE_BOARD_DIR
    from vgpulimit.cli import _build_parser
    from vgpulimit.oci import NODE_DIR

    docs = [d for d in yaml.safe_load_all((Path(__file__).parent.parent / "deploy" / "vgpulimit.yaml").read_text())
            if d]
    [daemonset] = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = daemonset["spec"]["template"]["spec"]
    [agent] = [c for c in pod["containers"] if c["name"] == "agent"]
    args = _build_parser().parse_args(agent["command"][3:])
    assert args.action == "agent" and args.board == f"{NODE_DIR}/{NODE_BOARD_DIR}/{BOARD_NAME}"
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    assert [volumes[m["name"]] for m in agent["volumeMounts"]] == [NODE_DIR] and pod["hostPID"]

    done = vgpulimit("agent", "--install-unit", tmp_path, "--regions", tmp_path, env=sim_env)
    assert done.returncode == 0, done.stderr
    unit = (tmp_path / "vgpulimit-agent.service").read_text()
    [start] = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    command = start.removeprefix("ExecStart=").split()
    assert command[1:3] == ["-m", "vgpulimit"] and "Restart=always" in unit
    args = _build_parser().parse_args(command[3:])
    assert args.board.endswith(f"vgpulimit/{BOARD_NAME}") and args.regions == [str(tmp_path)]


def test_a_suspended_tenant_killed_leaves_nothing_behind(sim_env, containers, agent):
    borrower, owner = borrower_and_owner(containers)
    a = agent()
    assert owner.ask(f"alloc {8 * GiB}")["result"] == OK
    assert state_of(sim_env, borrower) == CHECKPOINTED
    os.kill(borrower.pid, signal.SIGKILL)
    until(lambda: a.state()["suspended"] == {}, "the agent forgets the container that ended")
    assert [d["action"] for d in a.decisions()] == ["suspend", "forgot"]
    assert nvml_memory(sim_env)["used"] == 8 * GiB
    assert status_json(sim_env, borrower.region, "--interval", "0")["suspend"]["state"] == "running"
    # Its memory is the owner's to use, and a newcomer's: nothing is held for the dead.
    owner.ask("free")
    newcomer = containers.start("newcomer", "--memory", "16GiB")
    assert newcomer.ask(f"alloc {16 * GiB}")["result"] == OK


def test_the_rules_take_the_lowest_priority_first_and_the_fewest_within_it():
    """The model alone (rules.py), its check() on each outcome."""
    from vgpulimit.agent.rules import RANKS, Container, check, decide

    G = "gpu0"
    low = [Container(f"low{i}", RANKS["low"], {G: 0}, {G: 16 * GiB}, {G: n * GiB}) for i, n in enumerate((4, 4, 8))]
    normal = Container("normal", RANKS["normal"], {G: GiB}, {G: 16 * GiB}, {G: 6 * GiB})
    high = Container("high", RANKS["high"], {G: 10 * GiB}, {G: 16 * GiB}, {G: 0}, waits={G: 1})
    free, total = {G: 2 * GiB}, {G: 32 * GiB}
    cases = {
        # Owed 10 GiB, 2 free: the one low of 8 frees enough; no normal one is touched.
        (): ["low2"],
        # Owed 20 GiB, none free: the lows' 16 GiB are not enough, so all of them, and
        # then the next priority up (normal, 6 GiB).
        ("less free",): ["low0", "low1", "low2", "normal"],
    }
    for case, expected in cases.items():
        given_free = {G: 2 * GiB} if not case else {G: 0}
        world = [*low, normal, high] if not case else [*low, normal,
                                                         Container("high", RANKS["high"], {G: 20 * GiB}, {G: 32 * GiB},
                                                                   {G: 0}, waits={G: 1})]
        actions = decide(world, given_free, total)
        check(world, given_free, total, actions)
        assert sorted(a.name for a in actions if a.kind == "suspend") == expected
    # A claim that all its victims together cannot satisfy suspends no one.
    greedy = Container("high", RANKS["high"], {G: 32 * GiB}, {G: 32 * GiB}, {G: 0}, waits={G: 1})
    assert decide([*low, normal, greedy], {G: 0}, total) == []
    # Nothing for a waiter of the same priority past its guarantee.
    same = Container("same", RANKS["low"], {G: 0}, {G: 16 * GiB}, {G: GiB}, waits={G: 1})
    assert decide([*low, same], free, total) == []


def test_one_agent_serves_a_board_a_second_says_which_and_exits(sim_env, tmp_path, agent):
    a = agent()
    second = vgpulimit("agent", "--simulate", "--regions", tmp_path, env=sim_env)
    assert second.returncode != 0
    said = f"vgpulimit: error: agent: another agent serves the board {a.board_dir() / 'priority.board'}"
    assert second.stderr.strip().splitlines() == [f"{said} (pid {a.proc.pid})"]
    bad = vgpulimit("agent", "--interval", "0", env=sim_env)
    assert bad.returncode == 2 and "--interval" in bad.stderr and len(bad.stderr.splitlines()) == 1


def test_a_tenant_that_names_anothers_process_in_its_region_gets_no_one_else_suspended(
        sim_env, containers, agent):
    """A tenant writes a slot of its region naming a neighbour's process (its
    region is its own to write).  Suspended as it is idle, it would take the
    neighbour's process with it: the agent suspends no container whose region
    names a process that does not map it."""
    from vgpulimit.region import Region

    neighbour = containers.start("neighbour", "--memory", "8GiB")
    assert neighbour.ask(f"alloc {4 * GiB}")["result"] == OK
    liar = containers.start("liar", "--memory", "8GiB", "--suspend-idle", "100ms")
    assert liar.ask(f"alloc {6 * GiB}")["result"] == OK
    with Region.open(liar.region) as region:
        region.attach(neighbour.pid, neighbour.pid)
    job = containers.start("job", "--memory", "12GiB", "--memory-wait", "2s")
    a = agent()
    assert job.ask(f"alloc {12 * GiB}")["result"] == OOM
    assert [state_of(sim_env, t) for t in (neighbour, liar)] == [RUNNING, RUNNING]
    [refused] = {d["why"] for d in a.decisions() if d["action"] == "refused"}
    assert f"the region names process {neighbour.pid}, which does not map it" in refused

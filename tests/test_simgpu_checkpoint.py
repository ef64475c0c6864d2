"""simgpu's checkpoint API (cuda.h, "CUDA Checkpointing"), called by one
process on another through cuda-bindings: the states, calls that wait while
the target is locked, the device's memory released by a checkpoint and taken
back by a restore at the same addresses with the bytes intact, and the
refusals the driver documents."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import GiB, MiB
from tenants import CLIENTS, Tenant, ctl, nvml_memory

OK = "CUDA_SUCCESS"


@pytest.fixture
def tenants():
    started: list[Tenant] = []

    def start(env, **kw) -> Tenant:
        started.append(Tenant(env, **kw))
        return started[-1]

    yield start
    for t in started:
        t.close()


def state(env, pid) -> str:
    return ctl(env, "state", pid)["state"]


def test_suspend_and_resume_by_hand_with_the_bytes_intact(sim_env, tenants):
    t = tenants(sim_env)
    ptrs = [t.ask(f"alloc {size}")["ptr"] for size in (3 * GiB, 64 * MiB + 5)]
    held = 3 * GiB + 64 * MiB + 5
    assert nvml_memory(sim_env) == {"used": held, "procs": {t.pid: held}}
    assert state(sim_env, t.pid) == "CU_PROCESS_STATE_RUNNING"
    assert ctl(sim_env, "tid", t.pid)["result"] == OK

    assert ctl(sim_env, "lock", t.pid)["result"] == OK
    assert state(sim_env, t.pid) == "CU_PROCESS_STATE_LOCKED"
    assert ctl(sim_env, "checkpoint", t.pid)["result"] == OK
    assert state(sim_env, t.pid) == "CU_PROCESS_STATE_CHECKPOINTED"
    # Off the device: the GPU's free memory is back, NVML lists it with none.
    assert nvml_memory(sim_env) == {"used": 0, "procs": {t.pid: 0}}

    assert ctl(sim_env, "restore", t.pid)["result"] == OK
    assert state(sim_env, t.pid) == "CU_PROCESS_STATE_LOCKED"
    assert nvml_memory(sim_env) == {"used": held, "procs": {t.pid: held}}
    assert ctl(sim_env, "unlock", t.pid)["result"] == OK
    assert state(sim_env, t.pid) == "CU_PROCESS_STATE_RUNNING"
    assert t.ask("check") == {"intact": True, "ptrs": ptrs}


def test_a_locked_process_s_calls_wait_until_the_unlock(sim_env, tenants):
    t = tenants(sim_env)
    t.ask(f"alloc {GiB}")
    assert ctl(sim_env, "lock", t.pid)["result"] == OK
    t.send("info")
    assert not t.answered_within(1.0)  # blocked, not failed
    assert ctl(sim_env, "checkpoint", t.pid)["result"] == OK
    assert ctl(sim_env, "restore", t.pid)["result"] == OK
    assert not t.answered_within(0.2)
    assert ctl(sim_env, "unlock", t.pid)["result"] == OK
    assert t.answer() == {"free": 15 * GiB, "total": 16 * GiB}


def test_a_lock_waits_for_submitted_work_within_its_timeout(sim_env, tenants):
    t = tenants(sim_env)
    assert t.ask("launch 3000000")["result"] == OK   # 3 s of work in flight
    assert ctl(sim_env, "lock", t.pid, 200)["result"] == "CUDA_ERROR_NOT_READY"
    assert state(sim_env, t.pid) == "CU_PROCESS_STATE_RUNNING"
    assert t.ask("info")["total"] == 16 * GiB   # its calls were never held
    assert ctl(sim_env, "lock", t.pid)["result"] == OK   # no timeout: once the kernel is done
    assert ctl(sim_env, "unlock", t.pid)["result"] == OK


def test_each_call_wants_its_state(sim_env, tenants):
    t = tenants(sim_env)
    t.ask(f"alloc {MiB}")
    for op in ("checkpoint", "restore", "unlock"):
        assert ctl(sim_env, op, t.pid)["result"] == "CUDA_ERROR_ILLEGAL_STATE", op
    assert ctl(sim_env, "lock", t.pid)["result"] == OK
    for op in ("lock", "restore"):
        assert ctl(sim_env, op, t.pid)["result"] == "CUDA_ERROR_ILLEGAL_STATE", op
    assert ctl(sim_env, "checkpoint", t.pid)["result"] == OK
    for op in ("lock", "checkpoint", "unlock"):
        assert ctl(sim_env, op, t.pid)["result"] == "CUDA_ERROR_ILLEGAL_STATE", op
    assert state(sim_env, t.pid) == "CU_PROCESS_STATE_CHECKPOINTED"


def test_a_process_without_a_context_is_refused(sim_env):
    """llm-d's agent: the lock fails on a process without a context (the
    driver's code 3, which the runtime names cudaErrorInitializationError)."""
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        for op in ("lock", "state"):
            assert ctl(sim_env, op, bystander.pid)["result"] == "CUDA_ERROR_NOT_INITIALIZED"
    finally:
        bystander.kill()
        bystander.wait()


@pytest.mark.parametrize("command", ["managed 1048576", "ipc"])
def test_managed_and_ipc_memory_are_refused_and_the_process_runs_on(sim_env, tenants, command):
    t = tenants(sim_env)
    t.ask(f"alloc {GiB}")
    assert t.ask(command)["result"] == OK
    assert ctl(sim_env, "lock", t.pid)["result"] == OK
    assert ctl(sim_env, "checkpoint", t.pid)["result"] == "CUDA_ERROR_NOT_SUPPORTED"
    assert state(sim_env, t.pid) == "CU_PROCESS_STATE_LOCKED"
    assert nvml_memory(sim_env)["procs"][t.pid] >= GiB  # nothing was taken
    assert ctl(sim_env, "unlock", t.pid)["result"] == OK
    assert t.ask("check")["intact"]


def test_a_restore_without_room_fails_and_leaves_it_checkpointed(sim_env, tenants):
    t = tenants(sim_env)
    t.ask(f"alloc {4 * GiB}")
    assert [ctl(sim_env, op, t.pid)["result"] for op in ("lock", "checkpoint")] == [OK, OK]
    other = tenants(sim_env)
    assert other.ask(f"alloc {14 * GiB}")["result"] == OK  # the room it left is taken
    assert ctl(sim_env, "restore", t.pid)["result"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert state(sim_env, t.pid) == "CU_PROCESS_STATE_CHECKPOINTED"
    assert nvml_memory(sim_env)["used"] == 14 * GiB
    other.ask("free")
    assert [ctl(sim_env, op, t.pid)["result"] for op in ("restore", "unlock")] == [OK, OK]
    assert t.ask("check")["intact"]


@pytest.mark.parametrize("at", ["LOCKED", "CHECKPOINTED"])
def test_a_tenant_killed_while_locked_or_checkpointed_holds_nothing(sim_env, tenants, at):
    t = tenants(sim_env)
    t.ask(f"alloc {2 * GiB}")
    assert ctl(sim_env, "lock", t.pid)["result"] == OK
    if at == "CHECKPOINTED":
        assert ctl(sim_env, "checkpoint", t.pid)["result"] == OK
    os.kill(t.pid, signal.SIGKILL)
    t.proc.wait(timeout=30)
    assert nvml_memory(sim_env) == {"used": 0, "procs": {}}
    assert ctl(sim_env, "restore", t.pid)["result"] == "CUDA_ERROR_NOT_INITIALIZED"


RESERVED_SET = """
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuInit(0)
args = (ctypes.c_uint32 * 16)()
args[1] = 1  # CUcheckpointLockArgs.reserved0
print(cuda.cuCheckpointProcessLock(int(sys.argv[1]), args))
"""


def test_reserved_fields_must_be_zero(sim_env, tenants):
    t = tenants(sim_env)
    out = subprocess.run([sys.executable, "-c", RESERVED_SET, str(t.pid)], env=sim_env, capture_output=True, check=False,
                         text=True, timeout=60)
    assert out.stdout.strip() == "1", out.stderr  # CUDA_ERROR_INVALID_VALUE
    assert state(sim_env, t.pid) == "CU_PROCESS_STATE_RUNNING"


def test_a_lock_of_a_stopped_process_gives_up_at_its_timeout_and_leaves_it_running(sim_env, tenants):
    """A stopped target never takes the request up: timeoutMs bounds the
    whole call, the request is given up, and the next one works."""
    t = tenants(sim_env)
    t.ask(f"alloc {GiB}")
    os.kill(t.pid, signal.SIGSTOP)
    try:
        assert ctl(sim_env, "lock", t.pid, 300)["result"] == "CUDA_ERROR_NOT_READY"
        assert state(sim_env, t.pid) == "CU_PROCESS_STATE_RUNNING"
        assert ctl(sim_env, "unlock", t.pid)["result"] == "CUDA_ERROR_ILLEGAL_STATE"
    finally:
        os.kill(t.pid, signal.SIGCONT)
    assert t.ask("info")["total"] == 16 * GiB   # its calls were never held
    assert [ctl(sim_env, op, t.pid)["result"] for op in ("lock", "checkpoint", "restore", "unlock")] == [OK] * 4
    assert t.ask("check")["intact"]


def test_a_lock_given_up_while_the_target_was_stopped_half_way_is_undone(sim_env, tenants):
    """The target takes the lock up, is stopped while its work drains, and
    its caller gives up at the timeout; the work is done meanwhile.
    Continued, the target's thread finishes the lock it had begun, finds it
    given up, and undoes it: the process runs, as its caller was told."""
    t = tenants(sim_env)
    assert t.ask("launch 5000000")["result"] == OK   # 5 s of work in flight
    lock = subprocess.Popen([sys.executable, str(CLIENTS / "checkpoint_ctl.py"), "lock", str(t.pid), "6000"],
                            env=sim_env, stdout=subprocess.PIPE, text=True)
    try:
        while _answers_at_once(t):   # until the lock is under way: the target's calls wait
            assert lock.poll() is None
        os.kill(t.pid, signal.SIGSTOP)
        assert json.loads(lock.communicate(timeout=60)[0])["result"] == "CUDA_ERROR_NOT_READY"
    finally:
        os.kill(t.pid, signal.SIGCONT)
    assert t.answered_within(30)              # the call that waited on the lock goes on
    assert t.answer()["total"] == 16 * GiB
    assert state(sim_env, t.pid) == "CU_PROCESS_STATE_RUNNING"
    assert t.ask("info")["total"] == 16 * GiB
    assert [ctl(sim_env, op, t.pid)["result"] for op in ("lock", "unlock")] == [OK] * 2


def _answers_at_once(t) -> bool:
    """Asks `info`; True when it is answered within 50 ms (else it waits, answered later)."""
    t.send("info")
    if t.answered_within(0.05):
        t.answer()
        return True
    return False


def test_a_restore_that_fails_half_way_leaves_the_process_failed(sim_env, tenants):
    """FAILED ("an uncorrectable error during the checkpoint/restore
    process"): the copy back fails half way (SIMGPU_FAIL in the target's
    environment).  The memory is charged again, its contents are lost: no
    call can bring the process back, its calls wait, and its end gives the
    memory back."""
    t = tenants(dict(sim_env, SIMGPU_FAIL="cuCheckpointProcessRestore"))
    t.ask(f"alloc {2 * GiB}")
    assert [ctl(sim_env, op, t.pid)["result"] for op in ("lock", "checkpoint")] == [OK, OK]
    assert nvml_memory(sim_env)["used"] == 0
    assert ctl(sim_env, "restore", t.pid)["result"] == "CUDA_ERROR_UNKNOWN"
    assert state(sim_env, t.pid) == "CU_PROCESS_STATE_FAILED"
    assert nvml_memory(sim_env) == {"used": 2 * GiB, "procs": {t.pid: 2 * GiB}}
    for op in ("lock", "checkpoint", "restore", "unlock"):
        assert ctl(sim_env, op, t.pid)["result"] == "CUDA_ERROR_ILLEGAL_STATE", op
    t.send("info")
    assert not t.answered_within(0.5)
    t.kill()
    assert nvml_memory(sim_env) == {"used": 0, "procs": {}}


GPU_PAIRS = """
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuInit(0)
uuids = []
for i in range(2):
    dev, uuid = ctypes.c_int(), ctypes.create_string_buffer(16)
    cuda.cuDeviceGet(ctypes.byref(dev), i)
    cuda.cuDeviceGetUuid_v2(uuid, dev)
    uuids.append(uuid.raw)
class Args(ctypes.Structure):   # CUcheckpointRestoreArgs
    _fields_ = [("gpuPairs", ctypes.c_void_p), ("gpuPairsCount", ctypes.c_uint), ("reserved", ctypes.c_char * 44),
                ("reserved1", ctypes.c_uint64)]
pair = ctypes.create_string_buffer(uuids[0] + uuids[int(sys.argv[2])], 32)
args = Args(ctypes.cast(pair, ctypes.c_void_p), 1)
print(cuda.cuCheckpointProcessRestore(int(sys.argv[1]), ctypes.byref(args)))
"""


def test_gpu_pairs_onto_another_gpu_are_refused_onto_the_same_gpu_taken(sim_env, tenants):
    """simgpu restores a process onto the GPUs it left: a pair naming
    another GPU is CUDA_ERROR_NOT_SUPPORTED (one of the errors the restore
    documents), and the process stays CHECKPOINTED; a pair naming its own
    GPU restores it (docs/suspend.md)."""
    env = dict(sim_env, SIMGPU_DEVICES="2")
    t = tenants(env)
    t.ask(f"alloc {GiB}")
    assert [ctl(env, op, t.pid)["result"] for op in ("lock", "checkpoint")] == [OK, OK]

    def restore(onto: int) -> str:
        return subprocess.run([sys.executable, "-c", GPU_PAIRS, str(t.pid), str(onto)], env=env,
                              capture_output=True, check=False, text=True, timeout=60).stdout.strip()

    assert restore(1) == "801"   # CUDA_ERROR_NOT_SUPPORTED
    assert state(env, t.pid) == "CU_PROCESS_STATE_CHECKPOINTED"
    assert restore(0) == "0"
    assert ctl(env, "unlock", t.pid)["result"] == OK
    assert t.ask("check")["intact"]

"""simgpu's device memory across processes, as cuda-bindings clients see it:
lazily committed, shared by every process on the state file, never handed out
twice, and given back by processes that exit or are killed -9 (even inside the
driver, or in another pid namespace). Each test has a simulated GPU of its own."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from conftest import TESTS, GiB, MiB, run
from containers import OWN_PID_NAMESPACE, can_unshare_pid

CLIENTS = TESTS / "clients"
OOM, OK = "CUDA_ERROR_OUT_OF_MEMORY", "CUDA_SUCCESS"


@pytest.fixture
def holders():
    """Starts cuda_fill.py clients that keep running; kills those left at the end."""
    started: list[subprocess.Popen] = []

    def start(env, *args, prefix=()):
        proc = subprocess.Popen([*prefix, sys.executable, str(CLIENTS / "cuda_fill.py"),
                                 *map(str, args)], env=env, stdout=subprocess.PIPE, text=True)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait(timeout=30)
        proc.stdout.close()


def line_of(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    assert line, f"client {proc.args} exited {proc.wait(timeout=30)} before reporting"
    return json.loads(line)


def fill(env, block, count) -> dict:
    return json.loads(run([sys.executable, CLIENTS / "cuda_fill.py", block, count], env,
                          timeout=60).stdout)


def test_memory_is_committed_lazily(sim_env):
    """10 GiB allocated and written at both ends costs a few MiB of RAM, not 10 GiB."""
    report = json.loads(run([sys.executable, CLIENTS / "rss_alloc.py", 10 * GiB], sim_env,
                            timeout=60).stdout)
    assert report["used"] >= 10 * GiB
    assert report["tail"] == "09" * 16
    assert report["rss_after"] - report["rss_before"] < 64 * MiB


def test_out_of_memory_across_processes_and_memory_back_after_kill_9(sim_env, holders, tmp_path):
    env = sim_env | {"SIMGPU_MEMORY": "1GiB"}
    holder = holders(env, 256 * MiB, 3, "--hold", tmp_path / "never")
    assert line_of(holder)["allocs"] == [OK] * 3

    other = fill(env, 256 * MiB, 2)
    assert other["total_mem"] == 1 * GiB
    assert other["before"] == {"free": 256 * MiB, "total": 1 * GiB}
    assert other["allocs"] == [OK, OOM]
    assert (other["free"], other["realloc"]) == (OK, OK)

    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    after = fill(env, 256 * MiB, 4)
    assert after["before"]["free"] == 1 * GiB
    assert after["allocs"] == [OK] * 4


def test_racing_processes_never_get_more_than_the_device_has(sim_env, holders, tmp_path):
    env = sim_env | {"SIMGPU_MEMORY": "1GiB"}
    block = 256 << 10  # 4096 pieces of 256 KiB: long enough for the four to interleave
    racers = [holders(env, block, GiB // block, "--start", tmp_path / "go",
                      "--hold", tmp_path / "done") for _ in range(4)]
    for racer in racers:
        assert "ready" in line_of(racer)
    (tmp_path / "go").touch()
    reports = [line_of(racer) for racer in racers]
    assert sum(r["allocs"].count(OK) for r in reports) == GiB // block
    assert all(set(r["allocs"]) <= {OK, OOM} for r in reports)
    (tmp_path / "done").touch()
    assert [racer.wait(timeout=30) for racer in racers] == [0] * 4
    # They exited normally: their memory is back at once.
    assert fill(env, block, 0)["before"]["free"] == 1 * GiB


# The process-shared robust mutex at offset 128 of the state file (pinned by a
# _Static_assert in simgpu/state.c): taken, then the holder is killed.
DIE_HOLDING_THE_LOCK = """
import ctypes, mmap, os, signal, sys
with open(sys.argv[1], "r+b") as f:
    m = mmap.mmap(f.fileno(), 0)
lock = ctypes.addressof(ctypes.c_char.from_buffer(m, 128))
assert ctypes.CDLL(None).pthread_mutex_lock(ctypes.c_void_p(lock)) == 0
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_process_killed_inside_the_driver_blocks_no_one(sim_env):
    assert fill(sim_env, 1 * GiB, 1)["allocs"] == [OK]  # makes the state file
    died = run([sys.executable, "-c", DIE_HOLDING_THE_LOCK, sim_env["SIMGPU_STATE"]], sim_env,
               check=False)
    assert died.returncode == -signal.SIGKILL, died.stderr
    assert fill(sim_env, 1 * GiB, 1)["allocs"] == [OK]  # would hang if the lock were not robust


def test_a_killed_process_of_another_pid_namespace_is_reaped(sim_env, holders, tmp_path):
    """Its pid means nothing here: it is kept while it lives, and its memory
    comes back after SIGKILL (through the lock it holds on its entry)."""
    if not can_unshare_pid():
        pytest.skip("unshare --pid is not permitted here")
    holder = holders(sim_env, 16 * GiB, 1, "--hold", tmp_path / "never",
                     prefix=OWN_PID_NAMESPACE)
    assert line_of(holder)["allocs"] == [OK]
    assert fill(sim_env, 1, 0)["before"]["free"] == 0
    holder.kill()  # unshare dies; --kill-child sends its child SIGKILL
    holder.wait(timeout=30)
    deadline = time.monotonic() + 60
    while (free := fill(sim_env, 1, 0)["before"]["free"]) != 16 * GiB:
        assert time.monotonic() < deadline, f"still {free} bytes free after 60 s"
        time.sleep(0.05)

"""Threads of one process that allocate and free at once are counted exactly:
whatever the interleaving, each charge comes back once, for the allocation
that was freed, so the region says what the process holds, to the byte, and
the cap grants all of itself afterwards."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import C_DIR, TESTS, MiB, compile_c, run, vgpulimit_cmd
from helpers import status_json

FAMILIES = ["pointer", "pitch", "managed", "array", "mipmap", "vmm", "pool", "graph"]
CAP = 1024 * MiB
BLOCK_MIB = 8


@pytest.fixture(scope="module")
def churn(cbin):
    return compile_c(cbin / "thread_churn", [C_DIR / "thread_churn.c"], f"-L{cbin}", "-lcuda",
                     "-lpthread")


def used_bytes(env, region) -> int:
    [device] = status_json(env, region, "--interval", "0")["devices"]
    return device["used_bytes"]


def held_then_freed(cmd, env, region, first: str, view_env) -> tuple[str, int, int]:
    """Runs a client that prints a line starting with `first` once it holds
    its memory, and "freed" once it gave it back, each time waiting for a
    line on stdin: returns that first line, and what the region at `region`
    counted at each point (read by `status` in `view_env`)."""
    region.parent.mkdir()
    proc = subprocess.Popen(list(map(str, cmd)), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith(first), (line, proc.stderr.read() if proc.poll() is not None else "")
        held = used_bytes(view_env, region)
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "freed\n"
        after = used_bytes(view_env, region)
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return line, held, after


def churned(sim_env, tmp_path, churn, family, threads, rounds):
    """Runs the churn in a container capped at CAP; returns what it filled,
    and what the region said while it held that and once it freed it."""
    region = tmp_path / "c" / "region"
    line, held, after = held_then_freed(
        vgpulimit_cmd("run", "--simulate", "--memory", str(CAP), "--region", region, "--",
                      churn, family, str(threads), str(rounds), str(BLOCK_MIB)), sim_env, region, "filled ", sim_env)
    return int(line.split()[1]), held, after


@pytest.mark.parametrize("threads", [2, 8, 64])
@pytest.mark.parametrize("family", FAMILIES)
def test_threads_churning_leave_the_ledger_exact(sim_env, tmp_path, churn, family, threads):
    rounds = max(4000 // threads, 40)
    filled, held, after = churned(sim_env, tmp_path, churn, family, threads, rounds)
    # The whole cap is there to take once the threads are done with it ...
    assert filled == CAP
    # ... and the region counts what is held, to the byte, then nothing.
    assert (held, after) == (CAP, 0)


def test_a_python_program_of_64_threads_keeps_its_whole_cap_round_after_round(sim_env):
    """Threads that allocate and free at once, then fill the cap together and
    free it again, three times: no allocation under the cap is refused, each
    round gets all of it, and cuMemGetInfo says it is all taken."""
    result = run(vgpulimit_cmd("run", "--simulate", "--memory", str(CAP), "--",
                               sys.executable, TESTS / "clients" / "thread_fill.py", "64", "3",
                               str(16 * MiB)), sim_env)
    report = json.loads(result.stdout)
    assert report == {"filled": [CAP] * 3, "free_at_full": [0] * 3, "refused": [0] * 3}


@pytest.fixture(scope="module")
def reuse(cbin, simgpu_dir, tmp_path_factory):
    """reuse_race, linked to reuse_driver as libcuda.so.1 in front of the
    simulated driver; returns the program and its LD_LIBRARY_PATH."""
    out = tmp_path_factory.mktemp("reuse")
    stub = compile_c(out / "libsimgpu-real.so", [C_DIR / "reuse_driver.c"], "-DSTUB", "-shared",
                     "-fPIC", "-Wl,-soname,libsimgpu-real.so")
    compile_c(out / "libcuda.so.1", [C_DIR / "reuse_driver.c"], "-shared", "-fPIC",
              "-Wl,-soname,libcuda.so.1", "-Wl,--no-as-needed", f"-L{out}", "-l:libsimgpu-real.so",
              "-ldl", "-lpthread")
    stub.unlink()
    stub.symlink_to(simgpu_dir / "libcuda.so.1")
    program = compile_c(out / "reuse_race", [C_DIR / "reuse_race.c"], "-ldl", "-lpthread")
    return program, f"{out}:{simgpu_dir}"


@pytest.mark.parametrize("family", ["pointer", "array", "mipmap", "pool", "vmm"])
def test_a_handle_freed_and_handed_at_once_to_another_thread_is_charged_once(sim_env, tmp_path, reuse,
                                                                            family):
    """The driver gives the handle being freed to another thread's allocation
    before the free returns (as a real driver may): the new owner is charged
    for it, the old charge is returned, and once it too is freed nothing is
    left counted."""
    program, library_path = reuse
    region = tmp_path / "c" / "region"
    line, held, after = held_then_freed(
        vgpulimit_cmd("run", "--memory", str(CAP), "--region", region, "--", program, family),
        dict(sim_env, LD_LIBRARY_PATH=library_path), region, "held ", sim_env)
    # VMM calls are one step with their bookkeeping: the driver gets no chance
    # to hand the handle over, and the second thread gets another.
    assert line == ("held another handle\n" if family == "vmm" else "held the same handle\n")
    assert held >= 16 * MiB and after == 0

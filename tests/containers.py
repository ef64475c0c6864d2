"""Containers for the view tests: `vgpulimit run --simulate` with cuda-bindings
clients that allocate and hold, and a way for another process to join one
(the variables `vgpulimit run` gives its command)."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from conftest import TESTS, vgpulimit_cmd

CLIENTS = TESTS / "clients"
# A command's prefix that runs it as PID 1 of a pid namespace with a /proc of
# its own, as a container runtime does; killing unshare kills the namespace.
OWN_PID_NAMESPACE = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]


def can_unshare_pid() -> bool:
    try:
        return subprocess.run([*OWN_PID_NAMESPACE, "true"], capture_output=True, timeout=30,
                              check=False).returncode == 0
    except FileNotFoundError:
        return False


def fill_cmd(block: int, count: int, release: Path, device: int = 0) -> list[str]:
    return [sys.executable, str(CLIENTS / "cuda_fill.py"), str(block), str(count), "--hold",
            str(release), "--device", str(device)]


@contextmanager
def container(sim_env, region: Path, limits: list[str], clients: list[tuple[int, ...]]):
    """Runs one cuda_fill client per (block, count[, device]) in one container
    with its region at `region`; yields their reports once all have
    allocated, and lets them go at the end."""
    region.parent.mkdir(parents=True, exist_ok=True)
    release = region.parent / "release"
    script = " & ".join(" ".join(fill_cmd(*client[:2], release, *client[2:])) for client in clients)
    proc = subprocess.Popen(
        list(map(str, vgpulimit_cmd("run", "--simulate", *limits, "--region", region, "--",
                                    "sh", "-c", f"{script} & wait"))),
        env=sim_env, stdout=subprocess.PIPE, text=True)
    try:
        reports = [json.loads(proc.stdout.readline()) for _ in clients]
        yield reports
    finally:
        release.touch()
        proc.wait(timeout=60)


@contextmanager
def outsider(sim_env, tmp_path: Path, block: int, device: int = 0):
    """A cuda_fill client on the same simulated GPU, in no container."""
    release = tmp_path / "outsider.release"
    proc = subprocess.Popen(fill_cmd(block, 1, release, device), env=sim_env,
                            stdout=subprocess.PIPE, text=True)
    try:
        yield json.loads(proc.stdout.readline())
    finally:
        release.touch()
        proc.wait(timeout=60)


def joined(sim_env, region: Path, shim_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a further process of the container at `region`."""
    return dict(sim_env, LD_PRELOAD=str(shim_path), VGPULIMIT_REGION=str(region), **extra)

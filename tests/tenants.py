"""Tenants for the checkpoint tests: ctypes processes driven one command
at a time (clients/checkpoint_tenant.py), and the driver's checkpoint API called
on them from another process (clients/checkpoint_ctl.py), as a setter calls it."""

from __future__ import annotations

import json
import select
import subprocess
import sys

from conftest import TESTS, run

CLIENTS = TESTS / "clients"


class Tenant:
    def __init__(self, env: dict[str, str], prefix: tuple[str, ...] = ()):
        self.proc = subprocess.Popen([*prefix, sys.executable, str(CLIENTS / "checkpoint_tenant.py")],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pid = self.answer()["ready"]

    def send(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def answered_within(self, seconds: float) -> bool:
        """Whether an answer is waiting (without reading it)."""
        return bool(select.select([self.proc.stdout], [], [], seconds)[0])

    def answer(self) -> dict:
        line = self.proc.stdout.readline()
        assert line, f"tenant exited {self.proc.wait(timeout=30)} before answering"
        return json.loads(line)

    def ask(self, command: str) -> dict:
        self.send(command)
        return self.answer()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        self.proc.stdin.close()
        self.proc.stdout.close()


def ctl(env: dict[str, str], op: str, pid: int, *args) -> dict:
    """The checkpoint API called on `pid` from a process of its own."""
    return json.loads(run([sys.executable, CLIENTS / "checkpoint_ctl.py", op, pid, *args], env,
                          timeout=120).stdout)


def nvml_memory(env: dict[str, str]) -> dict:
    """Device 0 as NVML on the host sees it: used bytes, and each process's."""
    code = ("import json, pynvml as n; n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(0); "
            "print(json.dumps({'used': n.nvmlDeviceGetMemoryInfo(h).used, 'procs': "
            "{p.pid: p.usedGpuMemory for p in n.nvmlDeviceGetComputeRunningProcesses(h)}}))")
    report = json.loads(run([sys.executable, "-c", code], env).stdout)
    report["procs"] = {int(k): v for k, v in report["procs"].items()}
    return report

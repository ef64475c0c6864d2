"""What every row runs with: the mode, a work directory, the clean
environment, the C client, and processes under the row's budget."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from real_gpu_rows.driver_view import DriverView
from vgpulimit import _paths

HERE = Path(__file__).resolve().parent.parent   # benchmarks/
ROOT = HERE.parent
CLIENTS = ROOT / "tests" / "clients"
PTX = HERE / "spin_timer.ptx"
CLIENT_SOURCE = HERE / "real_gpu_client.c"


class OutOfTime(Exception):
    """The row's time budget ran out."""


class Bench:
    """What every row uses: the mode, a work directory, the clean environment
    (no shim, no limit variables; on the simulated GPU, its driver first on the
    library path and a machine of its own), the C client, and processes run
    with timeouts that are clamped to the row's budget and kill the whole
    process group when they run out."""

    def __init__(self, simulate: bool, quick: bool, work: Path) -> None:
        self.simulate, self.quick, self.work = simulate, quick, work
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("VGPULIMIT_", "SIMGPU_", "CUDA_DEVICE_"))
                    and k not in ("LD_PRELOAD",)}
        runtime = work / "run"
        runtime.mkdir(mode=0o700, exist_ok=True)
        self.env["XDG_RUNTIME_DIR"] = str(runtime)
        self.env["PYTHONUNBUFFERED"] = "1"
        if simulate:
            self.env["LD_LIBRARY_PATH"] = os.pathsep.join(
                [str(_paths.simgpu_dir()), *filter(None, [os.environ.get("LD_LIBRARY_PATH")])])
            self.env["SIMGPU_STATE"] = str(work / "simgpu.state")
            self.env["SIMGPU_RESERVED"] = "615MiB"      # an idle H200's driver kept that much
            # This process reads the same simulated machine with NVML (DriverView).
            for name in ("SIMGPU_STATE", "SIMGPU_RESERVED"):
                os.environ[name] = self.env[name]
        self.client_error = ""
        self.client = self._build_client()
        self.deadline = float("inf")
        self.procs: list[Proc] = []
        self.versions: dict[str, str] = {}
        self.driver = DriverView(simulate)

    def _build_client(self) -> Path | None:
        """real_gpu_client.c, built with the first C compiler found; None (and
        the reason in client_error) where there is none or it fails: its rows
        are then errors, the others run."""
        client = self.work / "real_gpu_client"
        compilers = [c for c in dict.fromkeys([os.environ.get("CC"), "cc", "gcc", "clang"])
                     if c and shutil.which(c)]
        if not compilers:
            self.client_error = "no C compiler (cc, gcc, clang) to build benchmarks/real_gpu_client.c"
            return None
        result = subprocess.run([compilers[0], "-std=c11", "-D_GNU_SOURCE", "-O2",
                                 f"-I{ROOT / 'base'}", "-o", str(client), str(CLIENT_SOURCE), "-ldl"],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            self.client_error = (f"{compilers[0]} could not build real_gpu_client.c: "
                                 f"{result.stderr.strip()[-300:]}")
            return None
        return client

    def c_client(self) -> str:
        if self.client is None:
            raise RuntimeError(self.client_error)
        return str(self.client)

    # commands
    def vgpulimit(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "vgpulimit", *args]

    def capped(self, flags: Sequence[str], command: Sequence[str]) -> list[str]:
        """`vgpulimit run [--simulate] FLAGS -- COMMAND`."""
        return self.vgpulimit("run", *(["--simulate"] if self.simulate else []), *flags, "--",
                              *map(str, command))

    def python(self, client: str, *args: object) -> list[str]:
        return [sys.executable, str(CLIENTS / client), *map(str, args)]

    def spin(self, *args: object) -> list[str]:
        return [self.c_client(), "spin", str(PTX), *map(str, args)]

    # time
    def left(self, want_s: float) -> float:
        """``want_s``, or what is left of the row's budget if less."""
        left = self.deadline - time.monotonic()
        if left <= 0.5:
            raise OutOfTime("the row's time budget ran out")
        return min(want_s, left)

    # processes
    def start(self, command: Sequence[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(command, env or self.env)
        self.procs.append(proc)
        return proc

    def finish(self, proc: Proc, want_s: float, what: str) -> tuple[str, str]:
        """Its output once it exits; killed (with its children) past the time."""
        limit = self.left(want_s)
        try:
            proc.popen.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise OutOfTime(f"{what} did not finish within {limit:.0f} s") from None
        return proc.output()

    def run(self, command: Sequence[str], want_s: float, what: str,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        proc = self.start(command, env)
        out, err = self.finish(proc, want_s, what)
        return subprocess.CompletedProcess(proc.popen.args, proc.returncode, out, err)

    def cleanup(self) -> None:
        for proc in self.procs:
            proc.kill()
        self.procs.clear()


class Proc:
    """A process in a session of its own (so that it is killed with its
    children), its stdin a pipe, its stdout and stderr read by threads: line
    by line with a deadline, or whole at the end."""

    def __init__(self, command: Sequence[str], env: dict[str, str]) -> None:
        self.popen = subprocess.Popen(list(map(str, command)), env=env, text=True, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self.queues: tuple[queue.Queue, queue.Queue] = (queue.Queue(), queue.Queue())
        self.seen: tuple[list[str], list[str]] = ([], [])
        self.threads = [threading.Thread(target=self._read, args=(i, stream), daemon=True)
                        for i, stream in enumerate((self.popen.stdout, self.popen.stderr))]
        for thread in self.threads:
            thread.start()

    def _read(self, which: int, stream) -> None:
        for line in stream:
            self.seen[which].append(line)
            self.queues[which].put(line)
        self.queues[which].put(None)

    def line(self, timeout_s: float, stderr: bool = False) -> str | None:
        """The next line of its stdout (or stderr); None at the end; OutOfTime past the time."""
        try:
            return self.queues[int(stderr)].get(timeout=timeout_s)
        except queue.Empty:
            raise OutOfTime(f"no output within {timeout_s:.0f} s") from None

    def send(self, text: str) -> None:
        """Writes ``text`` to its stdin and closes it."""
        try:
            self.popen.stdin.write(text)
            self.popen.stdin.close()
        except OSError:
            pass

    def write(self, text: str) -> None:
        """Writes ``text`` to its stdin and keeps it open (a client stepped line by line)."""
        try:
            self.popen.stdin.write(text)
            self.popen.stdin.flush()
        except OSError:
            pass

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def output(self) -> tuple[str, str]:
        for thread in self.threads:
            thread.join(5)
        return "".join(self.seen[0]), "".join(self.seen[1])

    def kill(self) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                pass
        try:
            self.popen.stdin.close()
        except OSError:
            pass


def failed(what: str, result: subprocess.CompletedProcess | tuple[int, str]) -> str:
    code, err = (result.returncode, result.stderr) if isinstance(result, subprocess.CompletedProcess) \
        else result
    lines = [line for line in (err or "").strip().splitlines() if line.strip()]
    return f"{what} exited {code}" + (f": {lines[-1][:200]}" if lines else "")

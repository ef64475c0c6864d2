"""Priority between tenants: a latency-sensitive service beside a saturating
batch job, on the simulated GPU (default) or on this machine's GPU (--real).

The service (benchmarks/real_gpu_client.c, mode service) takes requests at
a fixed rate, each three timer-bound kernels of 0.5, 1 and 2 ms
(spin_timer.ptx) launched one after another and waited for; its latency is
from the request's scheduled arrival to the end of its last kernel.  The
batch job is a launch loop of 1 ms kernels (mode spin) that keeps the GPU
busy.  Four ways, each started afresh:

  alone         the service by itself
  no priority   beside the batch job, as time-slicing leaves them
  priority      service --priority high, batch --priority low
  + borrowing   the same, the batch at --cores 50 --cores-policy borrow

For each: the service's p50 and p99 latency, and the batch job's share of
the GPU time the service left idle (the batch's completed kernels times
their length, over the window's length less the service's kernels' time).
The first second of the service's run is left out (its kernels' costs are
being learnt).  Goals: with priorities, the service's p99 <= 1.25 x its p99
alone + 2 ms, and the batch job >= 85 % of the idle time.
benchmarks/real_gpu.py runs the same four ways as its priority rows.

    python benchmarks/priority.py                 # simgpu, 10 s a way
    python benchmarks/priority.py --seconds 5     # shorter
    python benchmarks/priority.py --real          # on this machine's GPU
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PTX = HERE / "spin_timer.ptx"
CLIENT_SOURCE = HERE / "real_gpu_client.c"
CC = os.environ.get("CC", "cc")

RATE = 100                       # requests a second
SERVICE_KERNELS_US = (500, 1000, 2000)
BATCH_KERNEL_US = 1000
WARMUP_S = 1.0
P99_FACTOR, P99_SLACK_MS, IDLE_SHARE_PCT = 1.25, 2.0, 85.0

# (name, the service's flags, the batch job's flags; None: no batch job)
WAYS: tuple[tuple[str, list[str], list[str] | None], ...] = (
    ("alone", [], None),
    ("no priority", [], []),
    ("priority", ["--priority", "high"], ["--priority", "low"]),
    ("+ borrowing", ["--priority", "high"], ["--priority", "low", "--cores", "50", "--cores-policy", "borrow"]),
)


@dataclass
class Way:
    name: str
    requests: int
    p50_ms: float
    p99_ms: float
    idle_share_pct: float | None   # None: no batch job


def service_command(client: str, seconds: float) -> list[str]:
    return [client, "service", str(PTX), str(RATE), str(seconds), *map(str, SERVICE_KERNELS_US)]


def batch_command(client: str, seconds: float) -> list[str]:
    return [client, "spin", str(PTX), str(BATCH_KERNEL_US), str(seconds), "1", "1", "0"]


def requests(output: str) -> list[tuple[float, float]]:
    """(arrival s, latency ms) of each request."""
    return [(float(f[2]), float(f[3]) / 1000) for f in (line.split() for line in output.splitlines())
            if len(f) == 4 and f[0] == "request"]


def completed_at(output: str, t: float) -> float:
    """The batch's completed launches at time t, interpolated between its reports."""
    points = [(float(f[2]), int(f[3])) for f in (line.split() for line in output.splitlines())
              if len(f) == 4 and f[0] == "progress"]
    for (t0, n0), (t1, n1) in itertools.pairwise(points):
        if t0 <= t <= t1:
            return n0 + (n1 - n0) * (t - t0) / (t1 - t0) if t1 > t0 else n0
    raise RuntimeError(f"the batch job reported no progress around {t:.3f}")


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def measure(name: str, service_out: str, batch_out: str | None) -> Way:
    """One way's figures, from the service's and the batch job's output."""
    got = requests(service_out)
    if not got:
        raise RuntimeError(f"{name}: the service answered no request")
    start = got[0][0] + WARMUP_S
    inside = [(t, ms) for t, ms in got if t >= start] or got
    end = inside[-1][0] + inside[-1][1] / 1000
    latencies = [ms for _, ms in inside]
    share = None
    if batch_out is not None:
        service_busy = len(inside) * sum(SERVICE_KERNELS_US) * 1e-6
        batch_busy = (completed_at(batch_out, end) - completed_at(batch_out, start)) * BATCH_KERNEL_US * 1e-6
        share = 100 * batch_busy / ((end - start) - service_busy)
    return Way(name, len(inside), statistics.median(latencies), percentile(latencies, 99), share)


def p99_goal_ms(alone: Way) -> float:
    return P99_FACTOR * alone.p99_ms + P99_SLACK_MS


def meets_goals(alone: Way, prioritised: Way) -> bool:
    return (prioritised.p99_ms <= p99_goal_ms(alone) and prioritised.idle_share_pct is not None
            and prioritised.idle_share_pct >= IDLE_SHARE_PCT)


def run_ways(start: Callable[[list[str]], object], finish: Callable[[object], str],
             run_flags: Callable[[list[str], list[str]], list[str]], client: str, seconds: float,
             fresh: Callable[[int], None] = lambda index: None) -> list[Way]:
    """The four ways, one after another: `start` starts a command, `finish`
    waits for it and gives its stdout (raising if it failed), `run_flags`
    wraps a command in `vgpulimit run FLAGS`, `fresh` is called before each
    (a new simulated GPU)."""
    ways = []
    for index, (name, service_flags, batch_flags) in enumerate(WAYS):
        fresh(index)
        job = None
        if batch_flags is not None:
            job = start(run_flags(batch_flags, batch_command(client, seconds + 4)))
            time.sleep(1.0)
        service_out = finish(start(run_flags(service_flags, service_command(client, seconds))))
        ways.append(measure(name, service_out, finish(job) if job is not None else None))
    return ways


def table(ways: Sequence[Way], simulate: bool) -> str:
    alone = ways[0]
    lines = [(f"service: {RATE} requests/s of {'+'.join(str(k / 1000) for k in SERVICE_KERNELS_US)} ms kernels; "
              f"batch: {BATCH_KERNEL_US / 1000:g} ms kernels back to back"
              + ("; simgpu, 2 ms time slices" if simulate else "")),
             (f"goal with priorities: p99 <= {P99_FACTOR:g} x {alone.p99_ms:.2f} + {P99_SLACK_MS:g} = "
              f"{p99_goal_ms(alone):.2f} ms; batch >= {IDLE_SHARE_PCT:g} % of the idle time"),
             f"{'way':<14}{'requests':>9}{'p50 ms':>9}{'p99 ms':>9}{'batch share of idle':>22}"]
    for w in ways:
        share = "-" if w.idle_share_pct is None else f"{w.idle_share_pct:.1f} %"
        lines.append(f"{w.name:<14}{w.requests:>9}{w.p50_ms:>9.2f}{w.p99_ms:>9.2f}{share:>22}")
    return "\n".join(lines)


def build_client(out: Path) -> str:
    client = out / "real_gpu_client"
    subprocess.run([CC, "-std=c11", "-D_GNU_SOURCE", "-O2", f"-I{ROOT / 'base'}", "-o",
                    str(client), str(CLIENT_SOURCE), "-ldl"], check=True)
    return str(client)


class Background:
    """A process whose stdout is collected line by line."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True)
        self.reader.start()

    def finish(self) -> str:
        err = self.proc.stderr.read()
        self.proc.wait()
        self.reader.join(5)
        if self.proc.returncode != 0:
            raise RuntimeError(f"{self.proc.args} exited {self.proc.returncode}: {err}")
        return "".join(self.lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="the service's run, each way (default 10)")
    parser.add_argument("--real", action="store_true", help="on this machine's GPU, not the simulated one")
    args = parser.parse_args(argv)
    simulate = not args.real
    with tempfile.TemporaryDirectory(prefix="vgl-priority-") as tmp:
        workdir = Path(tmp)
        client = build_client(workdir)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("VGPULIMIT_", "SIMGPU_", "CUDA_DEVICE_")) and k != "LD_PRELOAD"}
        runtime = workdir / "run"
        runtime.mkdir(mode=0o700)
        env["XDG_RUNTIME_DIR"] = str(runtime)

        def fresh(index: int) -> None:
            if simulate:
                env["SIMGPU_STATE"] = str(workdir / f"simgpu-{index}.state")

        def run_flags(flags: list[str], command: list[str]) -> list[str]:
            return [sys.executable, "-m", "vgpulimit", "run", *(["--simulate"] if simulate else []), *flags,
                    "--", *command]

        ways = run_ways(lambda command: Background(command, env), Background.finish, run_flags, client,
                        args.seconds, fresh)
    print(table(ways, simulate))
    return 0


if __name__ == "__main__":
    sys.exit(main())

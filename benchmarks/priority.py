"""Priority between tenants on the simulated GPU: a latency-sensitive service
beside a saturating batch job.

The service (tests/c/service_client.c) takes requests at a fixed rate, each
a few kernels of 0.5-2 ms launched one after another and waited for; its
latency is from the request's scheduled arrival to the end of its last
kernel.  The batch job is a launch loop of 1 ms kernels (tests/c/
launch_client.c) that keeps the GPU busy.  Four ways, each on a fresh
simulated GPU with simgpu's 2 ms time slices:

  alone         the service by itself
  no priority   beside the batch job, as time-slicing leaves them
  priority      service --priority high, batch --priority low
  + borrowing   the same, the batch at --cores 50 --cores-policy borrow

For each: the service's p50 and p99 latency, and the batch job's share of
the GPU time the service left idle (the batch's completed kernels times
their length, over the window's length less the service's kernels' time).
The first second of the service's run is left out (its kernels' costs are
being learnt).

    python benchmarks/priority.py                 # 10 s a way
    python benchmarks/priority.py --seconds 5     # shorter
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CC = os.environ.get("CC", "cc")

RATE = 100                       # requests a second
SERVICE_KERNELS_US = (500, 1000, 2000)
BATCH_KERNEL_US = 1000
WARMUP_S = 1.0


def build(out: Path, name: str) -> Path:
    binary = out / name
    subprocess.run([CC, "-std=c11", "-D_GNU_SOURCE", "-O2", f"-I{ROOT / 'shim' / 'include'}", "-o",
                    str(binary), str(ROOT / "tests" / "c" / f"{name}.c"), "-ldl"], check=True)
    return binary


def environment(workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VGPULIMIT_", "SIMGPU_", "CUDA_DEVICE_"))
           and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    runtime = workdir / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env.update(SIMGPU_STATE=str(workdir / "simgpu.state"), XDG_RUNTIME_DIR=str(runtime))
    return env


def run_cmd(flags: list[str], command: list[str]) -> list[str]:
    return [sys.executable, "-m", "vgpulimit", "run", "--simulate", *flags, "--", *map(str, command)]


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
            raise SystemExit(f"{self.proc.args} exited {self.proc.returncode}: {err}")
        return "".join(self.lines)


def requests(output: str) -> list[tuple[float, float]]:
    """(arrival s, latency ms) of each request."""
    return [(float(f[2]), float(f[3]) / 1000) for f in (line.split() for line in output.splitlines())
            if len(f) == 4 and f[0] == "request"]


def completed_at(output: str, t: float) -> float:
    """The batch's completed launches at time t, interpolated between its reports."""
    points = [(float(f[2]), int(f[3])) for f in (line.split() for line in output.splitlines())
              if len(f) == 4 and f[0] == "progress"]
    for (t0, n0), (t1, n1) in zip(points, points[1:]):
        if t0 <= t <= t1:
            return n0 + (n1 - n0) * (t - t0) / (t1 - t0) if t1 > t0 else n0
    raise SystemExit(f"the batch job reported no progress around {t:.3f}")


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def one_way(name: str, service_flags: list[str] | None, batch_flags: list[str] | None, seconds: float,
            service: Path, batch: Path, workdir: Path) -> dict:
    where = workdir / name.replace(" ", "-").replace("+", "")
    where.mkdir()
    env = environment(where)
    job = None
    if batch_flags is not None:
        job = Background(run_cmd(batch_flags, [batch, "kernel", BATCH_KERNEL_US, seconds + 4]), env)
        time.sleep(1.0)
    out = Background(run_cmd(service_flags or [], [service, RATE, seconds, *SERVICE_KERNELS_US]), env).finish()
    batch_out = job.finish() if job else ""
    got = requests(out)
    start = got[0][0] + WARMUP_S
    inside = [(t, ms) for t, ms in got if t >= start]
    end = inside[-1][0] + inside[-1][1] / 1000
    latencies = [ms for _, ms in inside]
    row = {"way": name, "requests": len(inside), "p50_ms": statistics.median(latencies),
           "p99_ms": percentile(latencies, 99), "idle_share_pct": None}
    if job:
        service_busy = len(inside) * sum(SERVICE_KERNELS_US) * 1e-6
        batch_busy = (completed_at(batch_out, end) - completed_at(batch_out, start)) * BATCH_KERNEL_US * 1e-6
        row["idle_share_pct"] = 100 * batch_busy / ((end - start) - service_busy)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="the service's run, each way (default 10)")
    args = parser.parse_args(argv)
    ways = [
        ("alone", None, None),
        ("no priority", [], []),
        ("priority", ["--priority", "high"], ["--priority", "low"]),
        ("+ borrowing", ["--priority", "high"], ["--priority", "low", "--cores", "50", "--cores-policy", "borrow"]),
    ]
    with tempfile.TemporaryDirectory(prefix="vgl-priority-") as tmp:
        workdir = Path(tmp)
        service, batch = build(workdir, "service_client"), build(workdir, "launch_client")
        rows = [one_way(name, s, b, args.seconds, service, batch, workdir) for name, s, b in ways]
    alone_p99 = rows[0]["p99_ms"]
    print(f"service: {RATE} requests/s of {'+'.join(str(k / 1000) for k in SERVICE_KERNELS_US)} ms kernels; "
          f"batch: {BATCH_KERNEL_US / 1000:g} ms kernels back to back; simgpu, 2 ms time slices")
    print(f"goal with priorities: p99 <= 1.25 x {alone_p99:.2f} + 2 = {1.25 * alone_p99 + 2:.2f} ms; "
          "batch >= 85 % of the idle time")
    print(f"{'way':<14}{'requests':>9}{'p50 ms':>9}{'p99 ms':>9}{'batch share of idle':>22}")
    for r in rows:
        share = "-" if r["idle_share_pct"] is None else f"{r['idle_share_pct']:.1f} %"
        print(f"{r['way']:<14}{r['requests']:>9}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}{share:>22}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

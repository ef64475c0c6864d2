"""Suspend and resume on the simulated GPU: how long `vgpulimit suspend` and
`vgpulimit resume` take against the bytes a container holds, and what a
suspended neighbour costs the launch and allocation paths of a running one.

    python benchmarks/suspend.py [--sizes 1,4,16,64] [--quick]

For each size (GiB), one container (`vgpulimit run --simulate`, an H200
profile: 141 GiB, a 50 GB/s host link) allocates it and writes both ends;
the setter suspends and resumes it three times.  Printed per size: the
driver's part as the record says it (lock + checkpoint of every process, or
restore + unlock), the whole command (Python's start included), and the
copy's time over the host link for comparison.  simgpu's device memory is
host pages, so a 64 GiB container costs no RAM (memory.c); its checkpoint
takes the copy's time all the same.

Then bench_overhead.c (the loop of benchmarks/overhead.py) runs in a
container under the shim, interleaved: with no container suspended, and with
a neighbour suspended; the ratio is what a suspended neighbour costs a
launch and an allocation + free pair (the shim's paths read nothing of a
suspend).  Figures are ratios within this run, never absolute claims."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TENANT = ROOT / "tests" / "clients" / "checkpoint_tenant.py"
GiB = 1 << 30
LINK_BYTES_PER_S = 50e9   # simgpu's h200-141gb profile (simgpu/profiles.c)


def vgpulimit(*args: str) -> list[str]:
    return [sys.executable, "-m", "vgpulimit", *args]


class Tenant:
    """A container of one cuda-bindings process, driven a line at a time."""

    def __init__(self, env: dict[str, str], region: Path, *flags: str) -> None:
        self.region = region
        self.proc = subprocess.Popen([*vgpulimit("run", "--simulate", "--region", str(region), *flags, "--"),
                                      sys.executable, str(TENANT)], env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.answer()

    def answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the tenant in {self.region} ended")
        return json.loads(line)

    def ask(self, command: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.answer()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def setter(env: dict[str, str], action: str, region: Path) -> tuple[float, int]:
    """(seconds the command took, the driver's part in ns as its record says)."""
    start = time.perf_counter()
    subprocess.run(vgpulimit(action, "--simulate", "--region", str(region)), env=env, check=True,
                   capture_output=True, text=True)
    took = time.perf_counter() - start
    with open(f"{region}.suspend", "rb") as f:
        record = json.loads(f.read())
    return took, record["last_suspend_ns" if action == "suspend" else "last_resume_ns"]


def by_size(env: dict[str, str], work: Path, sizes: list[int], repeat: int) -> None:
    print(f"{'held':>8} {'suspend (driver)':>17} {'resume (driver)':>16} {'suspend (cmd)':>14} "
          f"{'resume (cmd)':>13} {'copy at 50 GB/s':>16}")
    for gib in sizes:
        tenant = Tenant(env, work / f"held-{gib}.region", "--memory", f"{gib + 1}GiB")
        if tenant.ask(f"alloc {gib * GiB}")["result"] != "CUDA_SUCCESS":
            raise SystemExit(f"cannot allocate {gib} GiB")
        runs = []
        for _ in range(repeat):
            suspended = setter(env, "suspend", tenant.region)
            resumed = setter(env, "resume", tenant.region)
            runs.append((suspended, resumed))
        if not tenant.ask("check")["intact"]:
            raise SystemExit(f"{gib} GiB: the bytes did not come back intact")
        tenant.close()
        best = min(runs, key=lambda r: r[0][1] + r[1][1])
        (s_cmd, s_drv), (r_cmd, r_drv) = best
        copy = gib * GiB / LINK_BYTES_PER_S
        print(f"{gib:>5} GiB {s_drv / 1e9:>15.3f} s {r_drv / 1e9:>14.3f} s {s_cmd:>12.3f} s {r_cmd:>11.3f} s "
              f"{copy:>14.3f} s", flush=True)


def hot_paths(env: dict[str, str], work: Path, launches: int, pairs: int, rounds: int) -> None:
    sys.path.insert(0, str(HERE))
    from overhead import build, measure

    bench, _ = build(work)
    neighbour = Tenant(env, work / "neighbour.region", "--memory", "2GiB")
    neighbour.ask(f"alloc {GiB}")
    region = work / "bench.region"
    subprocess.run(vgpulimit("run", "--simulate", "--region", str(region), "--memory", "8GiB", "--", "true"),
                   env=env, check=True)
    from vgpulimit import _paths

    inside = dict(env, LD_PRELOAD=str(_paths.libpath()), VGPULIMIT_REGION=str(region),
                  LD_LIBRARY_PATH=str(_paths.simgpu_dir()))
    seen: dict[str, dict[str, list[float]]] = {"running": {}, "suspended": {}}
    for _ in range(rounds):
        for state in ("running", "suspended"):
            if state == "suspended":
                setter(env, "suspend", neighbour.region)
            for name, value in measure(bench, inside, launches, pairs).items():
                seen[state].setdefault(name, []).append(value)
            if state == "suspended":
                setter(env, "resume", neighbour.region)
    neighbour.close()
    print(f"\n{'path':<12} {'no one suspended':>17} {'a neighbour suspended':>22} {'ratio':>6}")
    for name in seen["running"]:
        quiet, busy = min(seen["running"][name]), min(seen["suspended"][name])
        print(f"{name:<12} {quiet:>14.0f} ns {busy:>19.0f} ns {busy / quiet:>6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,16,64", help="GiB held, comma-separated (default 1,4,16,64)")
    parser.add_argument("--quick", action="store_true", help="1 and 4 GiB, one run each, short loops")
    args = parser.parse_args()
    sizes = [1, 4] if args.quick else [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="suspend-bench-") as tmp:
        work = Path(tmp)
        (work / "run").mkdir(mode=0o700)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VGPULIMIT_", "SIMGPU_"))}
        env.pop("LD_PRELOAD", None)
        env.update(SIMGPU_STATE=str(work / "simgpu.state"), SIMGPU_PROFILE="h200-141gb",
                   XDG_RUNTIME_DIR=str(work / "run"))
        print("suspend and resume by bytes held (simgpu, h200-141gb: a 50 GB/s host link)", file=sys.stderr)
        by_size(env, work, sizes, 1 if args.quick else 3)
        print("launch and alloc+free through the shim, beside a suspended container", file=sys.stderr)
        hot_paths(env, work, *((2000, 500, 2) if args.quick else (20000, 2000, 5)))


if __name__ == "__main__":
    main()

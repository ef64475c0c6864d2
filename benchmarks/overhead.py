"""What the shim adds to a kernel launch and to an allocation + free pair.

Builds bench_overhead.c and a do-nothing driver (null_driver.c, with an NVML
that only starts, null_nvml.c), then runs the same loop directly and under the
shim, interleaved, in one run, and prints the ns added per call.  Against the null driver the difference is the shim's own
cost; against simgpu it is what a user of the simulated GPU sees.

    python benchmarks/overhead.py [--launches N] [--pairs N] [--repeat N]

The defaults finish in about a minute on a 2-core machine (most of it on
simgpu, where a launch costs microseconds); each step is said on stderr.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vgpulimit import _paths

HERE = Path(__file__).resolve().parent
INCLUDE = HERE.parent / "base"
CC = os.environ.get("CC", "cc")


def build(out: Path) -> tuple[Path, Path]:
    null_dir = out / "null"
    null_dir.mkdir()
    subprocess.run([CC, "-std=c11", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-Wl,-Bsymbolic",
                    "-Wl,-soname,libcuda.so.1", f"-I{INCLUDE}", "-o", str(null_dir / "libcuda.so.1"),
                    str(HERE / "null_driver.c")], check=True)
    subprocess.run([CC, "-std=c11", "-O2", "-shared", "-fPIC", "-fvisibility=hidden",
                    "-Wl,-soname,libnvidia-ml.so.1", f"-I{INCLUDE}", "-o", str(null_dir / "libnvidia-ml.so.1"),
                    str(HERE / "null_nvml.c")], check=True)
    bench = out / "bench_overhead"
    subprocess.run([CC, "-std=c11", "-O2", f"-I{INCLUDE}", "-o", str(bench),
                    str(HERE / "bench_overhead.c"), "-ldl"], check=True)
    return bench, null_dir


def measure(bench: Path, env: dict[str, str], launches: int, pairs: int) -> dict[str, float]:
    out = subprocess.run([str(bench), str(launches), str(pairs)], env=env, capture_output=True,
                         text=True, check=True).stdout
    return {name: float(value) for name, value in (line.split() for line in out.splitlines())}


def contended(bench: Path, env: dict[str, str], processes: int, pairs: int) -> tuple[float, float]:
    """ns per alloc+free pair, all processes together: wall time over all
    pairs, and the CPU time the processes used (user + system) over them.
    On a machine shared with other work the wall time measures that work
    too; the CPU time much less so."""
    start = time.perf_counter()
    procs = [subprocess.Popen([str(bench), "0", str(pairs)], env=env, stdout=subprocess.DEVNULL)
             for _ in range(processes)]
    cpu = 0.0
    for proc in procs:
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit("bench_overhead failed")
        cpu += usage.ru_utime + usage.ru_stime
    # Each process runs 7 rounds of `pairs`.
    total = processes * pairs * 7
    return (time.perf_counter() - start) * 1e9 / total, cpu * 1e9 / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=200_000)
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--contend", type=int, default=8, metavar="N",
                        help="also run N processes allocating at once in one region (0: skip)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        bench, null_dir = build(tmp_path)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("VGPULIMIT_", "SIMGPU_"))}
        base.pop("LD_PRELOAD", None)
        shim = str(_paths.libpath())
        region = str(tmp_path / "region")
        drivers = {"null driver": str(null_dir), "simgpu": str(_paths.simgpu_dir())}
        setups = {
            "direct": {},
            "shim, no limit": {"LD_PRELOAD": shim},
            # A region the shim makes on first use (HAMi's variable; one named
            # by VGPULIMIT_REGION must exist already), removed after each run.
            "shim, 1 TiB cap": {"LD_PRELOAD": shim, "VGPULIMIT_MEMORY": "1TiB",
                                "CUDA_DEVICE_MEMORY_SHARED_CACHE": region},
        }
        # The null NVML lists no processes: each process's shim would say once
        # that it cannot find itself there.
        quiet = {"null driver": {"VGPULIMIT_LOG": "error"}, "simgpu": {}}
        best: dict[tuple[str, str], dict[str, float]] = {}
        for run in range(args.repeat):  # interleaved, so drift hits every setup alike
            for driver, libdir in drivers.items():
                for setup, extra in setups.items():
                    print(f"run {run + 1}/{args.repeat}: {driver}, {setup}", file=sys.stderr, flush=True)
                    env = dict(base, LD_LIBRARY_PATH=libdir,
                               SIMGPU_STATE=str(tmp_path / "simgpu.state"), **quiet[driver], **extra)
                    got = measure(bench, env, args.launches, args.pairs)
                    key = (driver, setup)
                    best[key] = {k: min(v, best.get(key, {}).get(k, v)) for k, v in got.items()}
                    if os.path.exists(region):
                        os.unlink(region)
        crowd: dict[str, float] = {}
        crowd_cpu: dict[str, float] = {}
        if args.contend:
            for setup in ("direct", "shim, 1 TiB cap"):
                print(f"{args.contend} processes at once: {setup}", file=sys.stderr, flush=True)
                env = dict(base, LD_LIBRARY_PATH=drivers["null driver"], **quiet["null driver"],
                           **setups[setup])
                runs = [contended(bench, env, args.contend, args.pairs // 4) for _ in range(args.repeat)]
                crowd[setup] = min(wall for wall, _ in runs)
                crowd_cpu[setup] = min(cpu for _, cpu in runs)
                if os.path.exists(region):
                    os.unlink(region)

    print(f"ns per call, best of {args.repeat} runs x 7 rounds "
          f"({args.launches} launches, {args.pairs} alloc+free pairs)")
    print(f"{'driver':<12} {'setup':<16} {'launch':>8} {'added':>7} {'alloc+free':>11} {'added':>8}")
    for driver in drivers:
        direct = best[(driver, "direct")]
        for setup in setups:
            got = best[(driver, setup)]
            print(f"{driver:<12} {setup:<16} {got['launch']:8.2f} "
                  f"{got['launch'] - direct['launch']:+7.2f} {got['alloc_free']:11.2f} "
                  f"{got['alloc_free'] - direct['alloc_free']:+8.2f}")
    if crowd:
        cores = os.cpu_count()
        print(f"\n{args.contend} processes allocating at once in one region, null driver, {cores} cores: "
              f"ns per alloc+free pair (wall time over all pairs of all processes)")
        print(f"direct {crowd['direct']:.1f}   shim with a cap {crowd['shim, 1 TiB cap']:.1f}   "
              f"added {crowd['shim, 1 TiB cap'] - crowd['direct']:+.1f}   "
              f"per pair per process {crowd['shim, 1 TiB cap'] * args.contend:.1f}")
        print(f"CPU time (user + system) over all pairs: direct {crowd_cpu['direct']:.1f}   "
              f"shim with a cap {crowd_cpu['shim, 1 TiB cap']:.1f}   "
              f"added {crowd_cpu['shim, 1 TiB cap'] - crowd_cpu['direct']:+.1f}")


if __name__ == "__main__":
    sys.exit(main())

"""How closely the compute share holds on the simulated GPU, and what it adds
to a launch.

Each cell runs containers under `vgpulimit run --simulate --cores PCT` on a
fresh simulated GPU: 1 or 4 processes per container, each a launch loop
(tests/c/launch_client.c) of kernels of one length.  The achieved share is the
simulated GPU time the container's kernels ran (completed launches times the
kernel's length) over a window after a settle time; every process reports its
completed launches every 100 ms; calls/launch is the driver calls the shim
added per launch, as simgpu counted them (SIMGPU_CALLS).  Then one process
on 1, 2 and 4 streams; two containers on one device (30+60, 10+90, 50+50 with
1 ms kernels, 30+60 with 20 ms kernels, longer than simgpu's time slice); a
borrowing container (--cores-policy borrow) alone, and after a hard-capped
neighbour starts.  Then the cells of launch-bound programs, graphs and short
kernels: a program launching 2 us kernels with 10 us of CPU work after each
(its GPU idle most of the time) at 50, 30 and 10 %, against the same program
uncapped (interleaved), with what the region charged it over its kernels' GPU
time and the share of its run its launches waited; a graph of 40 kernels of
1 us replayed back to back at 50 and 90 %; 20 us kernels back to back at 30 %;
and one container of a launch-bound process beside a GPU-bound one at 50 %.  Then on one MIG instance
(a 3g.40gb of an H100 in MIG mode, 1 ms kernels): 30 % and 60 % alone, the 30 + 60 pair, and the pair
beside an uncapped container flat out on the GPU's 2g.20gb instance.  Last, the cost a launch pays for
the shim with no cap and with cap 100, against the same loop without the shim, in one run (overhead.py's
loop).

    python benchmarks/compute_share.py            # the full table (~13 minutes)
    python benchmarks/compute_share.py --quick    # a subset, shorter windows
    python benchmarks/compute_share.py --skip accuracy streams pair borrow cost   # the new cells only
    python benchmarks/compute_share.py --only mig --window 5    # the MIG instance's cells
    python benchmarks/compute_share.py --torch    # on a real GPU: PyTorch matmuls at 30 %
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from vgpulimit import _paths

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CC = os.environ.get("CC", "cc")

TARGETS = (10, 25, 50, 75, 90)
KERNELS_US = (20, 1000, 20000)
PROCESSES = (1, 4)


def build_client(out: Path) -> Path:
    client = out / "launch_client"
    subprocess.run([CC, "-std=c11", "-D_GNU_SOURCE", "-O2", f"-I{ROOT / 'base'}", "-o",
                    str(client), str(ROOT / "tests" / "c" / "launch_client.c"), "-ldl"], check=True)
    return client


def base_environment(state: Path, runtime: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VGPULIMIT_", "SIMGPU_", "CUDA_DEVICE_"))
           and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    runtime.mkdir(exist_ok=True)
    env.update(SIMGPU_STATE=str(state), XDG_RUNTIME_DIR=str(runtime))
    return env


@dataclass
class Container:
    cores_pct: int
    processes: int
    kernel_us: int
    path: str = "kernel"            # launch_client's PATH: kernel, streams2, streams4, graph40
    policy: str | None = None       # --cores-policy
    cpu_us: int = 0                 # CPU work after each launch (launch-bound above the kernel's length)
    beside: tuple[tuple[str, int, int], ...] = ()  # more processes: (PATH, KERNEL_US, CPU_US)
    region: Path | None = None      # --region, to read its counters after
    visible: str | None = None      # CUDA_VISIBLE_DEVICES: a MIG device's UUID

    def command(self, client: Path, seconds: float) -> list[str]:
        loops = [(self.path, self.kernel_us, self.cpu_us)] * self.processes + list(self.beside)
        loop = " & ".join(f"{client} {path} {us} {seconds} {cpu}" for path, us, cpu in loops)
        cores = ["--cores", str(self.cores_pct)] if self.cores_pct < 100 else []
        policy = ["--cores-policy", self.policy] if self.policy else []
        region = ["--region", str(self.region)] if self.region else []
        visible = ["env", f"CUDA_VISIBLE_DEVICES={self.visible}"] if self.visible else []
        return [*visible, sys.executable, "-m", "vgpulimit", "run", "--simulate", *cores, *policy,
                *region, "--", "sh", "-c", f"{loop} & wait"]


def share_of(output: str, kernel_us: int, start: float, end: float) -> float:
    """The container's share (%) of [start, end] (CLOCK_MONOTONIC seconds),
    from its processes' progress lines: per process, the completed launches
    between the samples nearest the window's ends, times one launch's GPU time
    (its 'gpu' line, else `kernel_us`)."""
    samples: dict[str, list[tuple[float, int]]] = {}
    gpu_us: dict[str, int] = {}
    for line in output.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[0] == "progress":
            samples.setdefault(fields[1], []).append((float(fields[2]), int(fields[3])))
        elif len(fields) == 3 and fields[0] == "gpu":
            gpu_us[fields[1]] = int(fields[2])
    total = 0.0
    for pid, points in samples.items():
        first = min(points, key=lambda p: abs(p[0] - start))
        last = min(points, key=lambda p: abs(p[0] - end))
        if last[0] > first[0]:
            total += (last[1] - first[1]) * gpu_us.get(pid, kernel_us) * 1e-6 / (last[0] - first[0])
    return 100.0 * total


# Entry points that only the launch loop calls (the shim never does on its own).
CLIENT_ONLY = ("cuGetProcAddress_v2", "cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
               "cuModuleLoadData", "cuModuleGetFunction", "cuStreamCreate", "cuStreamSynchronize",
               "cuEventSynchronize", "cuStreamWaitEvent", "cuLaunchKernel", "cuGraphLaunch", "cuGraphCreate",
               "cuGraphAddKernelNode", "cuGraphInstantiateWithFlags")


def added_calls_per_launch(calls_file: Path) -> float:
    """Driver calls per launch beyond the loop's own, over a container's
    processes (simgpu's SIMGPU_CALLS count).  The loop's own: every call of an
    entry point the shim never calls (its setup, its look-ups, its launches,
    one cuEventSynchronize per batch and, with several streams, one
    cuStreamWaitEvent per other stream and batch), and of those the shim
    calls too, one cuEventRecord per batch (plus the first) and per join, and
    one cuEventCreate per stream and per batch event.  (With 20 ms kernels a
    process launches a few hundred times: its ~25 setup calls are not
    negligible there.)"""
    added = launches = 0
    for line in calls_file.read_text().splitlines():
        by_name = json.loads(line)["by_name"]
        waits = by_name.get("cuEventSynchronize", 0)
        joins = by_name.get("cuStreamWaitEvent", 0)
        streams = by_name.get("cuStreamCreate", 0)
        own = sum(by_name.get(name, 0) for name in CLIENT_ONLY) + (waits + 1 + joins) + (2 + streams - 1)
        added += sum(by_name.values()) - own
        launches += by_name.get("cuLaunchKernel", 0) + by_name.get("cuGraphLaunch", 0)
    return added / launches if launches else float("nan")


def run_containers(containers: list[Container], client: Path, settle: float, window: float,
                   workdir: Path, extra_env: dict[str, str] | None = None) -> list[tuple[float, float]]:
    """Runs the containers at once on one fresh simulated GPU; the share each
    achieved, and the driver calls it added per launch."""
    seconds = settle + window + 0.5
    # CLOCK_MONOTONIC, as the clients report it (time.monotonic is the same clock on Linux).
    start = time.monotonic() + settle + 0.3
    outputs = run_staggered([(c, 0.0, seconds) for c in containers], client, workdir, extra_env)
    return [(share_of(out, c.kernel_us, start, start + window), calls)
            for c, (out, calls) in zip(containers, outputs, strict=True)]


def run_staggered(plan: list[tuple[Container, float, float]], client: Path, workdir: Path,
                  extra_env: dict[str, str] | None = None) -> list[tuple[str, float]]:
    """Runs each container (after its delay, for its seconds) on one fresh
    simulated GPU; each one's output and the driver calls it added per launch."""
    state = workdir / f"simgpu-{time.monotonic_ns()}.state"
    env = dict(base_environment(state, workdir / "run"), **(extra_env or {}))
    calls = [workdir / f"calls-{time.monotonic_ns()}-{i}.jsonl" for i in range(len(plan))]
    procs = []
    began = time.monotonic()
    for (c, delay, seconds), f in sorted(zip(plan, calls, strict=True), key=lambda p: p[0][1]):
        time.sleep(max(0.0, began + delay - time.monotonic()))
        procs.append((c, f, seconds, subprocess.Popen(c.command(client, seconds),
                                                      env=dict(env, SIMGPU_CALLS=str(f)),
                                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                      text=True)))
    results = {}
    for c, f, seconds, proc in procs:
        out, err = proc.communicate(timeout=seconds + 60)
        if proc.returncode != 0:
            raise RuntimeError(f"{c} exited {proc.returncode}: {err.strip()}")
        results[f] = (out, added_calls_per_launch(f))
        f.unlink(missing_ok=True)
    state.unlink(missing_ok=True)
    return [results[f] for f in calls]


def accuracy(client: Path, targets, kernels, processes, settle: float, window: float,
             workdir: Path) -> None:
    print(f"Achieved compute share on simgpu, one container alone on the device "
          f"({window:g} s after a {settle:g} s settle)")
    print(f"{'target':>7} {'kernel':>8} {'procs':>5} {'achieved':>9} {'error':>7} {'calls/launch':>12}")
    worst = 0.0
    for target in targets:
        for kernel_us in kernels:
            for n in processes:
                [(share, calls)] = run_containers([Container(target, n, kernel_us)], client, settle,
                                                  window, workdir)
                worst = max(worst, abs(share - target))
                print(f"{target:>6}% {_kernel_text(kernel_us):>8} {n:>5} {share:>8.1f}% "
                      f"{share - target:>+7.1f} {calls:>12.2f}", flush=True)
    print(f"largest error: {worst:.1f} points\n")


def streams(client: Path, targets, settle: float, window: float, workdir: Path) -> None:
    # Kernels of one context one at a time, so that the kernels completed tell
    # the GPU time (with several at once they overlap, and the share is their
    # union).
    print("One process on several streams (1 ms kernels, launched on the streams in turn; "
          "SIMGPU_CONCURRENT_KERNELS=1)")
    print(f"{'target':>7} {'streams':>7} {'achieved':>9} {'error':>7} {'calls/launch':>12}")
    for target in targets:
        for n, path in ((1, "kernel"), (2, "streams2"), (4, "streams4")):
            [(share, calls)] = run_containers([Container(target, 1, 1000, path)], client, settle, window,
                                              workdir, {"SIMGPU_CONCURRENT_KERNELS": "1"})
            print(f"{target:>6}% {n:>7} {share:>8.1f}% {share - target:>+7.1f} {calls:>12.2f}", flush=True)
    print()


PAIRS = ((30, 60, 1000), (10, 90, 1000), (50, 50, 1000), (30, 60, 20000))


def two_containers(client: Path, settle: float, window: float, workdir: Path) -> None:
    print("Two containers on one device (one process each)")
    print(f"{'kernel':>8} {'cap':>5} {'achieved':>9} {'error':>7} {'calls/launch':>12}")
    for a, b, kernel_us in PAIRS:
        pair = [Container(a, 1, kernel_us), Container(b, 1, kernel_us)]
        results = run_containers(pair, client, settle, window, workdir)
        for c, (share, calls) in zip(pair, results, strict=True):
            print(f"{_kernel_text(kernel_us):>8} {c.cores_pct:>4}% {share:>8.1f}% {share - c.cores_pct:>+7.1f} "
                  f"{calls:>12.2f}", flush=True)
    print()


MIG = {"SIMGPU_PROFILE": "h100-80gb", "SIMGPU_MIG": "3g.40gb,2g.20gb"}


def mig_uuids(workdir: Path) -> list[str]:
    """The MIG devices' UUIDs of the simulated H100 in MIG mode, by NVML."""
    env = {**base_environment(workdir / "mig.state", workdir / "run"), **MIG,
           "LD_LIBRARY_PATH": str(_paths.simgpu_dir())}
    code = ("import pynvml as n; n.nvmlInit(); g = n.nvmlDeviceGetHandleByIndex(0); "
            "print(' '.join(n.nvmlDeviceGetUUID(n.nvmlDeviceGetMigDeviceHandleByIndex(g, i)) "
            "for i in range(2)))")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.split()


def mig_instance(client: Path, settle: float, window: float, workdir: Path) -> None:
    print("On one MIG instance (H100 3g.40gb, 1 ms kernels, one process each); 'beside': an uncapped "
          "container on the 2g.20gb")
    print(f"{'cell':>14} {'cap':>5} {'achieved':>9} {'error':>7}")
    three_g, two_g = mig_uuids(workdir)
    cells = [("alone", [30]), ("alone", [60]), ("pair", [30, 60]), ("pair, beside", [30, 60])]
    for name, caps in cells:
        containers = [Container(cap, 1, 1000, visible=three_g) for cap in caps]
        neighbour = [Container(100, 1, 1000, visible=two_g)] if "beside" in name else []
        results = run_containers(containers + neighbour, client, settle, window, workdir, MIG)
        for c, (share, _) in zip(containers, results, strict=False):
            print(f"{name:>14} {c.cores_pct:>4}% {share:>8.1f}% {share - c.cores_pct:>+7.1f}", flush=True)
        if neighbour:
            print(f"{'neighbour':>14} {'none':>5} {results[-1][0]:>8.1f}%", flush=True)
    print()


def borrowing(client: Path, workdir: Path) -> None:
    """A container at 30 % that borrows, alone for 3 s; then a hard-capped
    neighbour at 60 % runs for 4 s.  When the borrower is back: the first
    progress sample after the neighbour's start from which its share over the
    next 0.5 s is within 3 points of 30 %."""
    alone_s, together_s = 3.0, 4.0
    borrower = Container(30, 1, 1000, policy="borrow")
    neighbour = Container(60, 1, 1000)
    began = time.monotonic()
    [(out, calls), (other, other_calls)] = run_staggered(
        [(borrower, 0.0, alone_s + together_s), (neighbour, alone_s, together_s)], client, workdir)
    joined = min(float(line.split()[2]) for line in other.splitlines() if line.startswith("progress"))
    alone = share_of(out, 1000, began + 1.0, joined)
    samples = sorted(float(line.split()[2]) for line in out.splitlines() if line.startswith("progress"))
    back = next((t - joined for t in samples
                 if t >= joined and abs(share_of(out, 1000, t, t + 0.5) - borrower.cores_pct) <= 3), None)
    after = share_of(out, 1000, joined + 1.0, joined + together_s - 0.5)
    beside = share_of(other, 1000, joined + 1.0, joined + together_s - 0.5)
    print("A borrowing container (30 %, --cores-policy borrow) alone, then beside a hard-capped one (60 %)")
    print(f"{'':<28} {'achieved':>9} {'calls/launch':>12}")
    print(f"{'borrower alone':<28} {alone:>8.1f}% {calls:>12.2f}")
    print(f"{'borrower, neighbour running':<28} {after:>8.1f}%")
    print(f"{'neighbour (60 %, hard)':<28} {beside:>8.1f}% {other_calls:>12.2f}")
    print(f"borrower back within 3 points of 30 % {back:.1f} s after the neighbour's first report"
          if back is not None else "borrower never back within 3 points of 30 %")
    print()


def region_counters(region: Path) -> dict[str, int]:
    """busy_ns (the GPU time the region charged) and throttled_ns (the time
    launches waited) of device 0, as `vgpulimit status --json` shows them."""
    status = subprocess.run([sys.executable, "-m", "vgpulimit", "status", "--json", "--region", str(region)],
                            capture_output=True, text=True, check=True)
    [device] = [d for d in json.loads(status.stdout)["devices"] if d["index"] == 0]
    return {"busy_ns": device["busy_ns"], "throttled_ns": device["throttled_ns"]}


def launches_done(output: str) -> tuple[int, float]:
    """Launches and seconds from a process's 'done' line."""
    fields = next(line.split() for line in output.splitlines() if line.startswith("done "))
    return int(fields[2]), float(fields[3])


LAUNCH_BOUND = (50, 30, 10)


def launch_bound(client: Path, seconds: float, rounds: int, workdir: Path) -> None:
    """A process launching 2 us kernels with 10 us of CPU work after each,
    capped and uncapped in turn, `rounds` times, each alone on a fresh
    simulated GPU for `seconds`.  Its share is its kernels' GPU time (launches
    times 2 us) over its run; expected is the least of the cap and its share
    uncapped.  charged: what the region counted (busy_ns) over that GPU time;
    waited: throttled_ns over the run; rate: launches per second capped over
    uncapped (the median of the rounds' ratios: the uncapped run of each round
    is its reference)."""
    print(f"A launch-bound process: 2 us kernels, 10 us of CPU after each launch ({seconds:g} s runs, "
          f"{rounds} rounds, capped and uncapped in turn)")
    print(f"{'target':>7} {'achieved':>9} {'expected':>9} {'error':>7} {'charged':>8} {'waited':>7} "
          f"{'rate':>6} {'calls/launch':>12}")
    for target in LAUNCH_BOUND:
        cells = []
        for r in range(rounds):
            row = {}
            for cores in (100, target):
                region = workdir / f"region-{target}-{r}-{cores}"
                c = Container(cores, 1, 2, cpu_us=10, region=region)
                [(out, calls)] = run_staggered([(c, 0.0, seconds)], client, workdir)
                launched, took = launches_done(out)
                row[cores] = (launched, took, calls, region_counters(region))
                region.unlink(missing_ok=True)
            cells.append(row)
        shares = [row[target][0] * 2e-6 / row[target][1] * 100 for row in cells]
        free = [row[100][0] * 2e-6 / row[100][1] * 100 for row in cells]
        charged = [row[target][3]["busy_ns"] / (row[target][0] * 2000) for row in cells]
        waited = [row[target][3]["throttled_ns"] / (row[target][1] * 1e9) * 100 for row in cells]
        rates = sorted((row[target][0] / row[target][1]) / (row[100][0] / row[100][1]) for row in cells)
        share, expected = sum(shares) / rounds, min(target, sum(free) / rounds)
        calls = sum(row[target][2] for row in cells) / rounds
        print(f"{target:>6}% {share:>8.1f}% {expected:>8.1f}% {share - expected:>+7.1f} "
              f"{sum(charged) / rounds:>8.3f} {sum(waited) / rounds:>6.1f}% {rates[len(rates) // 2]:>6.3f} "
              f"{calls:>12.2f}", flush=True)
    print()


def short_work(client: Path, settle: float, window: float, workdir: Path) -> None:
    """Graphs of 40 kernels of 1 us, 20 us kernels, and a launch-bound process
    beside a GPU-bound one (1 ms kernels) in one container: the container's
    share of the GPU's time."""
    print("Graphs, short kernels, and a launch-bound process beside a GPU-bound one (one container)")
    print(f"{'target':>7} {'what':<44} {'achieved':>9} {'error':>7} {'calls/launch':>12}")
    cells = [(50, "graph of 40 kernels of 1 us, back to back", Container(50, 1, 1, "graph40")),
             (90, "graph of 40 kernels of 1 us, back to back", Container(90, 1, 1, "graph40")),
             (30, "20 us kernels back to back, 1 process", Container(30, 1, 20)),
             (30, "20 us kernels back to back, 4 processes", Container(30, 4, 20)),
             (50, "launch-bound (2 us + 10 us CPU) + 1 ms kernels",
              Container(50, 1, 2, cpu_us=10, beside=(("kernel", 1000, 0),)))]
    for target, what, c in cells:
        [(share, calls)] = run_containers([c], client, settle, window, workdir)
        print(f"{target:>6}% {what:<44} {share:>8.1f}% {share - target:>+7.1f} {calls:>12.2f}", flush=True)
    print()


def launch_cost(launches: int, repeat: int, workdir: Path) -> None:
    """ns per launch of overhead.py's loop, direct and under the shim, interleaved."""
    sys.path.insert(0, str(HERE))
    import overhead

    bench, null_dir = overhead.build(workdir)
    region = workdir / "cost-region"
    # HAMi's cache file, which the shim makes on first use (a VGPULIMIT_REGION
    # is made by `run`, the hook or CDI, never by the shim).
    shim = {"LD_PRELOAD": str(_paths.libpath()), "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(region)}
    setups = {
        "direct": {},
        "shim, no cap": shim,
        "shim, cap 100": dict(shim, VGPULIMIT_CORES="100"),
        # simgpu only (the null driver has no events to measure with): the
        # price of drawing from the budget and measuring launches.  Its
        # kernels have no length, but a measured launch is charged from its
        # return to the event after it (~0.2 us here): a loop of launches that
        # take no CPU time would exhaust the budget, so these rows run at the
        # driver's launch time (SIMGPU_LAUNCH_US=4), a tenth as many launches.
        "shim, cap 50": dict(shim, VGPULIMIT_CORES="50"),
    }
    drivers = {"null driver": null_dir, "simgpu": _paths.simgpu_dir()}
    best: dict[tuple[str, str], float] = {}
    rows = [(driver, setup) for driver in drivers for setup in setups if setup != "shim, cap 50"]
    rows += [("simgpu, 4 us", setup) for setup in ("direct", "shim, cap 50")]
    for _ in range(repeat):
        for driver, setup in rows:
            env = base_environment(workdir / "cost.state", workdir / "run")
            # The shim's cost, not the simulated launch's CPU time (but in the last rows).
            slow = driver == "simgpu, 4 us"
            env.update(LD_LIBRARY_PATH=str(drivers["simgpu" if slow else driver]),
                       SIMGPU_LAUNCH_US="4" if slow else "0", **setups[setup])
            ns = overhead.measure(bench, env, launches // 10 if slow else launches, 0)["launch"]
            best[(driver, setup)] = min(ns, best.get((driver, setup), ns))
            region.unlink(missing_ok=True)
    print(f"Cost per launch, ns: shim vs direct in one run, best of {repeat} runs x 7 rounds "
          f"of {launches} launches ({launches // 10} at simgpu's launch time of 4 us)")
    print(f"{'driver':<12} {'setup':<15} {'launch':>8} {'added':>7}")
    for (driver, setup), ns in best.items():
        print(f"{driver:<12} {setup:<15} {ns:8.2f} {ns - best[(driver, 'direct')]:+7.2f}")


def torch_share(seconds: float) -> None:
    """On a real GPU: a PyTorch matmul loop's throughput at --cores 30 over its
    throughput uncapped (tests/clients/torch_matmul.py)."""
    client = [sys.executable, str(ROOT / "tests" / "clients" / "torch_matmul.py"), str(seconds)]
    rates = {}
    for label, flags in (("uncapped", []), ("--cores 30", ["--cores", "30"])):
        result = subprocess.run([sys.executable, "-m", "vgpulimit", "run", *flags, "--", *client],
                                capture_output=True, text=True, check=False)
        if result.returncode == 77:
            raise SystemExit(f"compute_share.py --torch: {result.stdout.strip()}")
        if result.returncode != 0:
            raise SystemExit(f"compute_share.py --torch: {label} failed: {result.stderr.strip()}")
        rates[label] = json.loads(result.stdout.splitlines()[-1])["matmuls_per_s"]
    print(f"PyTorch 4096x4096 matmuls per second on a real GPU, {seconds:g} s each")
    for label, rate in rates.items():
        print(f"{label:<11} {rate:10.1f}")
    print(f"ratio {rates['--cores 30'] / rates['uncapped']:.3f} (target 0.30)")


CELLS = ("accuracy", "streams", "pair", "borrow", "launch-bound", "short", "mig", "cost")


def _kernel_text(us: int) -> str:
    return f"{us // 1000} ms" if us >= 1000 else f"{us} us"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="targets 25 and 75, 1 and 4 processes, 3 s after 1 s (~1 minute)")
    parser.add_argument("--settle", type=float, help="seconds before the window (default 2)")
    parser.add_argument("--window", type=float, help="seconds measured (default 10)")
    parser.add_argument("--targets", type=int, nargs="+", help="shares to try, percent")
    parser.add_argument("--kernels", type=int, nargs="+", help="kernel lengths to try, us")
    parser.add_argument("--processes", type=int, nargs="+", help="processes per container")
    parser.add_argument("--skip", nargs="+", default=[],
                        choices=["accuracy", "streams", "pair", "borrow", "launch-bound", "short", "cost"],
                        help="parts to leave out")
    parser.add_argument("--only", nargs="+", default=[],
                        help="run only these cells (the names --skip takes, and mig)")
    parser.add_argument("--torch", action="store_true",
                        help="instead: PyTorch matmuls at --cores 30 vs uncapped, on a real GPU")
    args = parser.parse_args()
    if args.torch:
        torch_share(10.0)
        return
    settle = args.settle if args.settle is not None else (1.0 if args.quick else 2.0)
    window = args.window if args.window is not None else (3.0 if args.quick else 10.0)
    targets = args.targets or ((25, 75) if args.quick else TARGETS)
    kernels = args.kernels or KERNELS_US
    processes = args.processes or PROCESSES
    if args.only:
        args.skip = [cell for cell in CELLS if cell not in args.only]
    _paths.libpath()
    _paths.simgpu_dir()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        client = build_client(workdir)
        if "accuracy" not in args.skip:
            accuracy(client, targets, kernels, processes, settle, window, workdir)
        if "streams" not in args.skip:
            streams(client, targets, settle, window, workdir)
        if "pair" not in args.skip:
            two_containers(client, settle, window, workdir)
        if "borrow" not in args.skip:
            borrowing(client, workdir)
        if "launch-bound" not in args.skip:
            launch_bound(client, 2.0 if args.quick else 4.0, 2 if args.quick else 3, workdir)
        if "short" not in args.skip:
            short_work(client, settle, window, workdir)
        if "mig" not in args.skip:
            mig_instance(client, settle, window, workdir)
        if "cost" not in args.skip:
            launch_cost(200_000 if args.quick else 2_000_000, 2 if args.quick else 3, workdir)


if __name__ == "__main__":
    sys.exit(main())

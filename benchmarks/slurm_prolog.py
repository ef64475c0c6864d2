"""What vgpulimit's Slurm hooks add to a job's start and end, on a real Slurm
(tests/slurm_cluster.py: munged, slurmctld and slurmd on this machine; root).

    python benchmarks/slurm_prolog.py [--runs N]

Prints the median time of vgpulimit's Prolog (scontrol, the region, the
identity), Epilog and TaskProlog run as slurmd runs them, for a job of 2 of
8 shards, and the median wall time of `srun --gres=shard:2 true` with the
hooks and on the same Slurm without them: a job's start pays the Prolog and
one TaskProlog per task, its end the Epilog (after srun returns, before the
node's resources are free).  A figure, never an assertion."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from slurm_cluster import cluster, slurm_unavailable


def _ms(seconds: list[float]) -> str:
    return f"{statistics.median(seconds) * 1000:6.1f} ms (min {min(seconds) * 1000:.1f})"


def _timed(args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(args, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def _srun_times(node, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        node.wait_idle()
        times.append(_timed(["srun", "--gres=shard:2", "true"], node.env))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    why = slurm_unavailable()
    if why:
        print(f"slurm_prolog: skipped: {why}")
        return 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPULIMIT_")}
    with cluster(env) as node:
        job = node.command("sbatch", "--parsable", "--gres=shard:2", "-o", "/dev/null",
                           "--wrap", "sleep 600").stdout.strip().split(";")[0]
        while not (node.node_dir / job / "region").exists():
            time.sleep(0.05)
        hook_env = {**node.env, "SLURM_JOB_ID": job, "SLURM_JOB_UID": "0", "SLURM_JOB_GID": "0",
                    "SLURM_JOB_USER": "root", "SLURMD_NODENAME": "localhost",
                    "SLURM_SHARDS_ON_NODE": "2"}
        prolog, epilog, task = [], [], []
        for _ in range(runs):
            prolog.append(_timed([str(node.scripts / "vgpulimit-prolog")], hook_env))
            task.append(_timed([str(node.scripts / "vgpulimit-task-prolog")], hook_env))
            epilog.append(_timed([str(node.scripts / "vgpulimit-epilog")], hook_env))
        node.command("scancel", job)
        with_hooks = _srun_times(node, runs)
    with cluster(env, hooks=False) as bare:
        without = _srun_times(bare, runs)
    print(f"Slurm hooks, job of 2/8 shards, {runs} runs, medians:")
    print(f"  Prolog (root, once per job and node)   {_ms(prolog)}")
    print(f"  TaskProlog (user, once per task)       {_ms(task)}")
    print(f"  Epilog (root, once per job and node)   {_ms(epilog)}")
    print(f"  srun --gres=shard:2 true, with hooks   {_ms(with_hooks)}")
    print(f"  srun --gres=shard:2 true, no hooks     {_ms(without)}")
    added = statistics.median(with_hooks) - statistics.median(without)
    print(f"  added to the job's start (srun wall)   {added * 1000:6.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The node agent on the simulated GPU (docs/agent.md): idle notebooks and a
training job that does not fit beside them.

    python benchmarks/agent.py [--idle 2s] [--wait 10s]

An H200 (simgpu's h200-141gb profile: 140.4 GiB, a 50 GB/s host link; its
contexts and the driver's reserve set to 0 here, so the arithmetic is the
scenario's).  Three notebooks (`vgpulimit run --memory 40GiB --suspend-idle
IDLE`, cap 41 GiB) each hold 40 GiB and go idle; then a training job (`--memory 100GiB
--memory-wait WAIT`) asks for 100 GiB.

- Without an agent: the job waits WAIT, then is refused.
- With `vgpulimit agent`: the fewest idle notebooks that make room are
  suspended; the job's allocation returns.  Printed: the job's time to memory
  against the bytes the agent moved off the GPU.
- Then each notebook, used again (an allocation) once the others are idle
  again, is resumed (another idle notebook is suspended to make room, by the
  same rules).  Printed: each use's time, from the call to its return.
- How many notebooks the GPU serves beside the job: with plain caps, those
  whose caps fit beside it; with the agent, all three, each on use.

Figures are this run's, on a simulated GPU whose copies take the link's
time; nothing here is a claim about a real GPU."""

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
sys.path.insert(0, str(HERE))
from suspend import Tenant, vgpulimit

GiB = 1 << 30
NOTEBOOK_GIB, JOB_GIB = 40, 100


def decisions(run_dir: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in (run_dir / "vgpulimit" / "agent.log").read_text().splitlines()]
    except OSError:
        return []


def settled(run_dir: Path) -> None:
    """Until the agent has written down what it did (its log follows its acts)."""
    for _ in range(600):
        try:
            state = json.loads((run_dir / "vgpulimit" / "agent.json").read_text())
        except (OSError, ValueError):
            state = None
        if state and all(e["state"] == "suspended" for e in state["suspended"].values()):
            return
        time.sleep(0.05)


def notebooks(env: dict[str, str], work: Path, idle: str, tag: str) -> list[Tenant]:
    made = []
    for name in "abc":
        t = Tenant(env, work / f"{tag}-notebook-{name}.region", "--memory", f"{NOTEBOOK_GIB + 1}GiB",
                   "--suspend-idle", idle)
        assert t.ask(f"alloc {NOTEBOOK_GIB * GiB}")["result"] == "CUDA_SUCCESS"
        made.append(t)
    return made


def without_agent(env: dict[str, str], work: Path, idle: str, wait: str) -> None:
    books = notebooks(env, work, idle, "plain")
    job = Tenant(env, work / "plain-job.region", "--memory", f"{JOB_GIB}GiB", "--memory-wait", wait)
    start = time.perf_counter()
    result = job.ask(f"alloc {JOB_GIB * GiB}")["result"]
    print(f"without an agent: the job's {JOB_GIB} GiB: {result} after {time.perf_counter() - start:.2f} s "
          f"(its wait {wait})")
    for t in [*books, job]:
        t.close()


def with_agent(env: dict[str, str], work: Path, idle_s: float, idle: str, wait: str) -> None:
    run_dir = Path(env["XDG_RUNTIME_DIR"])
    agent = subprocess.Popen(vgpulimit("agent", "--simulate", "--regions", str(work), "--interval", "0.05"),
                             env=env)
    try:
        books = notebooks(env, work, idle, "agent")
        time.sleep(idle_s + 0.5)   # every notebook idle past its limit
        job = Tenant(env, work / "agent-job.region", "--memory", f"{JOB_GIB}GiB", "--memory-wait", wait)
        start = time.perf_counter()
        result = job.ask(f"alloc {JOB_GIB * GiB}")["result"]
        took = time.perf_counter() - start
        settled(run_dir)
        moved = [d for d in decisions(run_dir) if d["action"] == "suspend"]
        out = sum(d["out_bytes"] for d in moved)
        print(f"with the agent: the job's {JOB_GIB} GiB: {result} after {took:.2f} s; {len(moved)} notebook(s) "
              f"suspended, {out / GiB:.0f} GiB moved off the GPU ({out / 1e9 / took:.1f} GB/s of the wait; "
              f"the suspends themselves: {sum(d['took_ns'] for d in moved) / 1e9:.2f} s)")
        print("each notebook used again (an allocation of 1 MiB), the others idle:")
        print(f"{'notebook':<10} {'was':<10} {'call returned':>14} {'data':>6}  agent's decisions")
        for t in books:
            time.sleep(idle_s + 0.5)
            seen = len(decisions(run_dir))
            was = json.loads(Path(f"{t.region}.suspend").read_text())["state"] \
                if Path(f"{t.region}.suspend").exists() else "running"
            start = time.perf_counter()
            assert t.ask(f"alloc {1 << 20}")["result"] == "CUDA_SUCCESS"
            took = time.perf_counter() - start
            intact = t.ask("check")["intact"]
            settled(run_dir)
            said = "; ".join(f"{d['action']} {Path(d['container']).stem}"
                             + (f" ({d['took_ns'] / 1e9:.2f} s)" if "took_ns" in d else "")
                             for d in decisions(run_dir)[seen:])
            print(f"{t.region.stem.split('-')[-1]:<10} {was:<10} {took:>12.2f} s {intact!s:>6}  {said or '-'}")
        plain = int((140.4 - JOB_GIB) // NOTEBOOK_GIB)
        print(f"notebooks of {NOTEBOOK_GIB} GiB served beside the job on one GPU: plain caps {plain}, "
              f"with the agent {len(books)} (one on the GPU at a time, each resumed on use)")
        for t in [*books, job]:
            t.close()
    finally:
        agent.terminate()
        agent.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", default="2s", help="the notebooks' --suspend-idle (default 2s)")
    parser.add_argument("--wait", default="10s", help="the job's --memory-wait (default 10s)")
    args = parser.parse_args()
    from vgpulimit.agent.rules import parse_idle

    idle_s = parse_idle(args.idle, "--idle") / 1000
    with tempfile.TemporaryDirectory(prefix="agent-bench-") as tmp:
        work = Path(tmp)
        (work / "run").mkdir(mode=0o700)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VGPULIMIT_", "SIMGPU_"))}
        env.pop("LD_PRELOAD", None)
        env.update(SIMGPU_STATE=str(work / "simgpu.state"), SIMGPU_PROFILE="h200-141gb",
                   SIMGPU_CONTEXT_OVERHEAD="0", SIMGPU_RESERVED="0", XDG_RUNTIME_DIR=str(work / "run"))
        print("simgpu h200-141gb (140.4 GiB, 50 GB/s host link); 3 notebooks of 40 GiB, idle limit "
              f"{args.idle}; a job of {JOB_GIB} GiB waiting up to {args.wait}")
        without_agent(env, work, args.idle, args.wait)
        with_agent(env, work, idle_s, args.idle, args.wait)


if __name__ == "__main__":
    main()

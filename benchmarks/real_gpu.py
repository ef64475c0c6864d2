"""The real-GPU acceptance run: every figure that matters, in one command, as
one table anyone can compare with the last one.

    python benchmarks/real_gpu.py [--out DIR]              # on a GPU: <= 8 minutes on an H100/H200
    python benchmarks/real_gpu.py --simulate [--quick]     # on the simulated GPU (CI: --quick, < 60 s)
    python benchmarks/real_gpu.py --only share node        # some groups (or rows: programs.launch)

Writes DIR/real_gpu.md (the table, also printed) and DIR/real_gpu.json (every
figure each row was judged on).  Groups, each measured side by side in this
run -- without vgpulimit, then under it:

- memory: a 4 GiB cap met by the driver API (C), PyTorch's three allocators,
  CuPy and JAX: each allocates 256 MiB blocks until refused, frees half and
  allocates again; what it saw (mem_get_info), the error it got, and what the
  driver lists for it, read here with NVML and no shim;
- tools: nvidia-smi (default view, --query-gpu, -q), nvitop -1, gpustat --json
  and `vgpulimit verify`, inside the cap: each exits 0 and shows the cap;
- share: timer-bound spin kernels (spin_timer.ptx: they spin on %globaltimer,
  so their length holds whatever the clocks) of 20 us, 1 ms and 20 ms, on
  one block, one block per SM, or filling the GPU on two streams, at shares
  10-90 %, and two containers at 30 + 60 %: the share is kernels completed
  times a kernel's length (as events time it, uncapped) over the wall time;
- granularity: the share in steps of 5 %: 1 ms kernels at 5, 50 and 95 %, one
  process and four (quick: one); with `--only granularity --budget 1200`,
  the whole grid of 5-95 % x kernels of 20 us, 1 ms and 20 ms x one process
  and four (about 14 minutes on a GPU), each within the share's tolerance;
- priority: a service at 100 requests/s of 0.5, 1 and 2 ms kernels alone,
  beside a batch job of 1 ms kernels with no priorities, with the service
  high and the batch low, and with the batch borrowing at 50 %
  (benchmarks/priority.py): p50 and p99 latency, and the batch job's share of
  the GPU time the service left idle;
- programs: PyTorch bf16 matmuls at 30 % alone and as 30 + 60 % tenants,
  torch.compile at 30 %, 40 small ops eager (launch-bound) and as a CUDA
  graph at 50 and 90 %: each as a share of its own uncapped throughput (a
  duty-cycled GPU runs faster per second of its time: reported, not judged);
- costs: an empty cuLaunchKernel and cuMemAlloc + cuMemFree of 1 MiB from C,
  without the shim, under `vgpulimit run` with no limits, and with a cap and
  a share of 100, rounds interleaved: medians and spread;
- node: two capped containers at once; `status --all` against what the driver
  lists (NVML, and nvidia-smi where there is one), and `metrics --all` scraped
  once;
- sharing: frameworks that share device memory between processes or give it
  back and take it again, under the 4 GiB cap (tests/clients/framework_share.py):
  torch.multiprocessing sending a CUDA tensor to a child (CUDA IPC, and with
  expandable_segments:True, VMM handles as file descriptors), torch.distributed
  with NCCL at world size 1 (init, all_reduce, destroy), CuPy's IPC memory
  handles, and a VMM sleep/wake loop of 20 rounds as vLLM's sleep mode does it:
  at each step, each process's figure in the region against the driver's list.
- mig: on one MIG instance, named by its MIG-<uuid>, a 4 GiB cap met from C,
  1 ms kernels at 30 % of the instance, and nvidia-smi, nvitop and gpustat in
  the capped container.  Only where a GPU is in MIG mode with instances
  already (the run never changes MIG); skipped with the reason elsewhere.  On
  the simulated GPU, on a simulated H100 in MIG mode of their own.
- suspend: a container holding 1, 4 and 16 GiB (--quick: 1) suspended and
  resumed through the driver's checkpoint API (driver 570 or later), timed,
  its bytes checked after, NVML showing none of its memory while it is out;
  skipped with the reason where the driver lacks the calls.

Each row runs under a time budget; a row that fails, crashes or runs out of
time is a row of the table (FAIL / ERROR), never the end of the run.  On the
simulated GPU, rows that need the real CUDA runtime (PyTorch, CuPy, JAX) are
skipped with the reason.  The pytest tests marked `gpu` (tests/test_real_gpu.py)
run the same rows and assert their pass lines.

This file is the run: the plan, each row under its budget, the table and the
command line; each group's rows are a module of real_gpu_rows/.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from real_gpu_rows.bench import ROOT, Bench, OutOfTime
from real_gpu_rows.costs import costs_spec
from real_gpu_rows.memory import MEMORY_CLIENTS, memory_spec
from real_gpu_rows.mig import mig_specs
from real_gpu_rows.node import node_spec
from real_gpu_rows.priority import priority_spec
from real_gpu_rows.programs import compile_spec, launch_spec, matmul_spec
from real_gpu_rows.rows import Row, Skip, Spec
from real_gpu_rows.share import (
    granularity_plan,
    granularity_spec,
    pair_spec,
    share_plan,
    share_spec,
)
from real_gpu_rows.sharing import SHARING_WAYS, sharing_spec
from real_gpu_rows.suspend import suspend_specs
from real_gpu_rows.tools import tool_commands, tool_spec, verify_spec

from vgpulimit import __version__

RUN_BUDGET_S = 480.0                   # the whole run on a GPU: 8 minutes

GROUPS = ("memory", "tools", "share", "granularity", "priority", "programs", "costs", "node", "sharing", "mig",
          "suspend")
GROUP_TITLES = {"memory": "memory cap (4 GiB)", "tools": "tools inside the cap", "share": "compute share",
                "granularity": "share steps of 5 %",
                "priority": "priority between tenants", "programs": "real programs", "costs": "costs from C",
                "node": "node view", "sharing": "memory shared between processes, sleep and wake (4 GiB)",
                "mig": "on one MIG instance", "suspend": "suspend and resume (driver >= 570)"}
# Cheap and decisive first; the rows with a pass line before those only
# reported; torch.compile's cold compile last.  A group, or one row of it
# (its id) ahead of the rest of its group.
RUN_ORDER = ("tools", "memory", "share", "granularity", "priority", "programs.launch", "node", "sharing", "mig",
             "suspend", "costs", "programs")

NEEDS_RUNTIME = ("needs the real CUDA runtime ({what}), which stops on the simulated driver "
                 "(libcudart asks the driver for NVIDIA's private export tables)")


@dataclass
class Report:
    mode: str
    started: str
    machine: dict
    rows: list[Row]
    wall_s: float = 0.0

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for row in self.rows:
            out[row.verdict] = out.get(row.verdict, 0) + 1
        return out

    def group(self, name: str) -> list[Row]:
        return [r for r in self.rows if r.group == name]


# --- the run ------------------------------------------------------------------------------------

def plan(quick: bool, only: Sequence[str] | None = None) -> list[Spec]:
    cells, pairs = share_plan(quick)
    specs = [memory_spec(*c) for c in MEMORY_CLIENTS]
    specs += [tool_spec(name) for name in tool_commands()] + [verify_spec()]
    specs += [share_spec(k, s) for k, s in cells] + [pair_spec(k) for k in pairs]
    full = any(o == "granularity" or o.startswith("granularity.") for o in only or ())
    specs += [granularity_spec(*cell) for cell in granularity_plan(quick, full)]
    specs += [priority_spec()]
    specs += [matmul_spec(), compile_spec(), launch_spec()]
    specs += [costs_spec(), node_spec()]
    specs += [sharing_spec(*way) for way in SHARING_WAYS]
    specs += mig_specs()
    specs += suspend_specs(quick)
    return specs


def selected(spec: Spec, only: Sequence[str] | None) -> bool:
    return not only or any(spec.id == o or spec.id.startswith(o + ".") for o in only)


def runtime_skip(bench: Bench, spec: Spec) -> str | None:
    names = {"torch": "PyTorch", "cupy": "CuPy", "jax": "JAX"}
    for module in spec.needs:
        if bench.simulate:
            return NEEDS_RUNTIME.format(what=names.get(module, module))
        if importlib.util.find_spec(module) is None:
            return f"{names.get(module, module)} is not installed here"
    return None


def run_rank(spec: Spec) -> int:
    return next(i for i, o in enumerate(RUN_ORDER) if selected(spec, (o,)))


def run_spec(bench: Bench, spec: Spec, run_deadline: float) -> list[Row]:
    group = spec.id.split(".")[0]
    reason = runtime_skip(bench, spec)
    if reason:
        return [Row(group, spec.title, verdict="SKIP", note=reason)]
    left = run_deadline - time.monotonic()
    if left < 5:
        return [Row(group, spec.title, verdict="SKIP", note="out of time: the run's budget was spent")]
    began = time.monotonic()
    bench.deadline = began + min(spec.budget_s, left)
    try:
        rows = spec.fn(bench)
    except Skip as exc:
        rows = [Row(group, spec.title, verdict="SKIP", note=str(exc))]
    except OutOfTime as exc:
        # Cut short by the run's budget (its deadline reached, and the row was
        # given less than its own), not by a wait of the row's that ran out.
        if left < spec.budget_s and time.monotonic() >= bench.deadline - 1:
            rows = [Row(group, spec.title, verdict="SKIP",
                        note=f"out of time: the run's budget was spent ({left:.0f} s left for a row of "
                             f"{spec.budget_s:.0f} s; {exc})")]
        else:
            rows = [Row(group, spec.title, verdict="ERROR", note=f"timed out: {exc}")]
    except Exception as exc:  # noqa: BLE001 -- a broken row is a row of the table, never the end of the run
        rows = [Row(group, spec.title, verdict="ERROR", note=f"{type(exc).__name__}: {exc}"[:400])]
    finally:
        bench.cleanup()
    rows[0].seconds = time.monotonic() - began
    return rows


def machine_facts(bench: Bench) -> dict:
    facts = dict(bench.driver.machine())
    facts["host"] = platform.node()
    facts["python"] = platform.python_version()
    facts["vgpulimit"] = __version__
    facts["commit"] = None
    try:
        facts["commit"] = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                                         capture_output=True, text=True, timeout=10,
                                         check=True).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    bundle = ROOT / ".whl" / "SOURCE"      # on a lent machine (no .git): what real_gpu_bundle.py built
    if facts["commit"] is None and bundle.is_file():
        facts["commit"] = f"bundle of {bundle.read_text().strip()}"
    return facts


def run(simulate: bool = False, quick: bool = False, only: Sequence[str] | None = None,
        budget_s: float | None = None, log: Callable[[str], None] | None = None) -> Report:
    """Runs the selected rows; the report (nothing written)."""
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    began = time.monotonic()
    budget = budget_s if budget_s is not None else RUN_BUDGET_S
    with tempfile.TemporaryDirectory(prefix="real_gpu-") as tmp:
        bench = Bench(simulate, quick, Path(tmp))
        specs = [s for s in plan(quick, only) if selected(s, only)]
        rows: list[Row] = []
        for spec in sorted(specs, key=run_rank):
            got = run_spec(bench, spec, began + budget)
            rows += got
            if log:
                for row in got:
                    log(f"[{time.monotonic() - began:5.0f} s] {row.verdict:<5} {row.group}: {row.name}"
                        + (f" -- {row.note}" if row.note else ""))
        machine = machine_facts(bench)
        machine["versions"] = dict(bench.versions)
    rank = {g: i for i, g in enumerate(GROUPS)}
    rows.sort(key=lambda r: rank[r.group])          # stable: a group's rows keep their order
    return Report("simulate" if simulate else "real", started, machine, rows, time.monotonic() - began)


# --- the table ----------------------------------------------------------------------------------

def _cell(text: str) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")


def markdown(report: Report) -> str:
    m = report.machine
    gpu = m.get("gpu") or m.get("nvml", "no NVML")
    versions = ", ".join(f"{k} {v}" for k, v in sorted((m.get("versions") or {}).items()))
    head = [f"### vgpulimit on {gpu} ({report.mode})", "",
            f"{report.started}; driver {m.get('driver', '?')}, CUDA {m.get('cuda_driver', '?')}; "
            f"vgpulimit {m.get('vgpulimit')} (commit {m.get('commit') or 'unknown'}); Python {m.get('python')}"
            + (f"; {versions}" if versions else "") + f"; {report.wall_s:.0f} s in all.", "",
            "| group | row | without vgpulimit | under vgpulimit | pass line | result | s |",
            "|---|---|---|---|---|---|---|"]
    lines = []
    for row in report.rows:
        result = row.verdict + (f": {row.note}" if row.note else "")
        seconds = "" if row.seconds is None else f"{row.seconds:.0f}"
        lines.append(f"| {GROUP_TITLES[row.group]} | {_cell(row.name)} | {_cell(row.uncapped)} | "
                     f"{_cell(row.capped)} | {_cell(row.expect) or ('reported' if row.verdict == 'INFO' else '')} | {_cell(result)} | {seconds} |")
    counts = report.counts()
    summary = ", ".join(f"{counts[v]} {v.lower()}" for v in ("PASS", "FAIL", "ERROR", "INFO", "SKIP")
                        if counts.get(v))
    return "\n".join(head + lines + ["", f"{len(report.rows)} rows: {summary}.", ""])


def as_json(report: Report) -> dict:
    return {"version": 1, "mode": report.mode, "started": report.started, "wall_s": report.wall_s,
            "machine": report.machine, "counts": report.counts(), "rows": [asdict(r) for r in report.rows]}


def write(report: Report, out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / "real_gpu.md", out / "real_gpu.json"
    md.write_text(markdown(report))
    js.write_text(json.dumps(as_json(report), indent=1, default=str) + "\n")
    return md, js


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulate", action="store_true", help="on the simulated GPU that ships with vgpulimit")
    parser.add_argument("--quick", action="store_true", help="fewer share cells, shorter windows (CI)")
    parser.add_argument("--only", nargs="+", metavar="ROW",
                        help=f"groups ({', '.join(GROUPS)}) or rows (e.g. programs.launch, share.pair)")
    parser.add_argument("--out", type=Path, default=Path("."), help="where real_gpu.md and .json go (default .)")
    parser.add_argument("--budget", type=float, metavar="S",
                        help=f"seconds for the whole run; rows past it are skipped (default {RUN_BUDGET_S:g})")
    parser.add_argument("--check", action="store_true", help="exit 1 when a row failed or broke")
    parser.add_argument("--list", action="store_true", help="print the rows' ids and exit")
    args = parser.parse_args(argv)
    if args.list:
        for spec in plan(args.quick, args.only):
            print(f"{spec.id:<34} {spec.budget_s:4.0f} s  {spec.title}")
        return 0
    report = run(args.simulate, args.quick, args.only, args.budget,
                 log=lambda line: print(line, file=sys.stderr, flush=True))
    md, js = write(report, args.out)
    print(markdown(report))
    print(f"written: {md} {js}", file=sys.stderr)
    counts = report.counts()
    return 1 if args.check and (counts.get("FAIL") or counts.get("ERROR")) else 0


if __name__ == "__main__":
    sys.exit(main())

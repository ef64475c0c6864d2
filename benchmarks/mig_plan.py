"""`vgpulimit mig plan`, measured: requests served per GPU for a few mixes
on an H100 80GB, and how long big inputs take.

Three ways to serve each mix, side by side:
- HAMi: whole instances as HAMi chooses them, the smallest profile whose
  memory holds the request (its compute share ignored, as HAMi ignores
  gpucores in MIG mode), packed first-fit;
- whole instances, best layout: every request on an instance of its own, the
  planner choosing the profiles and the layouts;
- shared: the plan, requests sharing instances under vgpulimit caps.

Then 1000 requests over at most 100 GPUs, several random mixes, timed, and
the exact search's time on 10 requests.  Prints a Markdown table and the
figures on stdout, progress on stderr; about a minute at most.

    python3 benchmarks/mig_plan.py [--seeds N]
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from vgpulimit.mig import plan as mig_plan
from vgpulimit.mig import profiles as mig_profiles
from vgpulimit.mig.plan import Request

GiB = 1 << 30

MIXES = [
    ("fourteen 4 GiB notebooks", ["4GiB,count=14"]),
    ("3 × 20 GiB + 6 × 5 GiB", ["20GiB,count=3", "5GiB,count=6"]),
    ("seven 10 GiB services", ["10GiB,count=7"]),
    ("2 × 30 GiB at 40 % + 12 × 2 GiB at 5 %", ["30GiB,cores=40,count=2", "2GiB,cores=5,count=12"]),
    ("one 30 GiB isolated + 6 × 6 GiB", ["30GiB,isolated", "6GiB,count=6"]),
]


def requests_of(specs: list[str]) -> list[Request]:
    out: list[Request] = []
    for i, spec in enumerate(specs):
        out.extend(mig_plan.parse_request(spec, "mix", f"r{i + 1}"))
    return out


def per_gpu(count: int, gpus: int) -> str:
    return f"{count / gpus:.1f} ({gpus} GPU{'s' if gpus != 1 else ''})"


def table(model) -> list[str]:
    header = ("| mix (H100 80GB) | requests | HAMi: smallest profile ≥ request | whole instances, "
              "best layout | shared instances (vgpulimit) |")
    rows = [header, "|---|---|---|---|---|"]
    for name, specs in MIXES:
        print(f"mix: {name}", file=sys.stderr)
        requests = requests_of(specs)
        hami = mig_plan.whole_instances_hami(requests, model)
        whole = mig_plan.plan(mig_plan.as_isolated(requests), model)
        shared = mig_plan.plan(requests, model)
        mark = {True: "", False: " *"}
        rows.append(f"| {name} | {len(requests)} | {per_gpu(len(requests), hami)} | "
                    f"{per_gpu(len(requests), len(whole.gpus))}{mark[whole.exact]} | "
                    f"{per_gpu(len(requests), len(shared.gpus))}{mark[shared.exact]} |")
    rows.append("")
    rows.append("Requests served per GPU (GPUs used).  * first-fit decreasing (more than "
                f"{mig_plan.EXACT_MOST} requests); otherwise the fewest, by exhaustive search.")
    return rows


def random_requests(rng: random.Random, n: int) -> list[Request]:
    sizes = [1, 2, 2, 3, 4, 4, 5, 6, 8, 10, 16]
    return [Request(f"r{i}", rng.choice(sizes) * GiB,
                    rng.choice([None, None, 5, 10, 20]), rng.random() < 0.1) for i in range(n)]


def big(model, seeds: int) -> list[str]:
    lines = []
    worst = 0.0
    for seed in range(seeds):
        print(f"1000 requests, mix {seed + 1}/{seeds}", file=sys.stderr)
        requests = random_requests(random.Random(seed), 1000)
        start = time.perf_counter()
        plan = mig_plan.plan(requests, model, gpus_most=100)
        took = time.perf_counter() - start
        worst = max(worst, took)
        memory = sum(r.memory_bytes for r in requests) / model.largest.memory_bytes
        cores = sum(r.cores_pct or 0 for r in requests) / 100
        lines.append(f"mix {seed}: {len(plan.gpus)} GPUs (their memory alone needs {memory:.1f}, "
                     f"their compute shares {cores:.1f}), {took * 1000:.0f} ms")
    lines.append(f"1000 requests over at most 100 GPUs: slowest {worst * 1000:.0f} ms of {seeds} mixes")
    worst = 0.0
    for seed in range(seeds):
        print(f"10 requests, exact, mix {seed + 1}/{seeds}", file=sys.stderr)
        requests = random_requests(random.Random(1000 + seed), mig_plan.EXACT_MOST)
        start = time.perf_counter()
        mig_plan.plan(requests, model)
        worst = max(worst, time.perf_counter() - start)
    lines.append(f"{mig_plan.EXACT_MOST} requests, exhaustive search: slowest {worst * 1000:.0f} ms "
                 f"of {seeds} mixes")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10, help="random mixes of each size (default 10)")
    args = parser.parse_args()
    model = mig_profiles.find("H100 80GB")
    print("\n".join(table(model)))
    print()
    print("\n".join(big(model, args.seeds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

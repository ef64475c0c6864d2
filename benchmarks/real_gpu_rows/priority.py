"""Priority between tenants: benchmarks/priority.py's four ways, as rows."""

from __future__ import annotations

from real_gpu_rows.bench import Bench, Proc, failed
from real_gpu_rows.rows import Row, Spec, verdict


def priority_spec() -> Spec:
    """benchmarks/priority.py's four ways, as rows: the service's latency
    alone and beside a batch job, and with priorities, judged by the goals."""
    import priority as service_bench  # benchmarks/priority.py (absolute: not this module)

    seconds = 8.0

    def fn(bench: Bench) -> list[Row]:
        length = 2.0 if bench.quick else seconds
        env = dict(bench.env)

        def fresh(index: int) -> None:
            if bench.simulate:   # a simulated GPU of each way's own
                env["SIMGPU_STATE"] = str(bench.work / f"priority-{index}.state")

        def finish(proc: Proc) -> str:
            out, err = bench.finish(proc, length + 60, "a priority container")
            if proc.returncode != 0:
                raise RuntimeError(failed("a priority container", (proc.returncode, err)))
            return out

        ways = service_bench.run_ways(lambda command: bench.start(command, env), finish, bench.capped,
                                      bench.c_client(), length, fresh)
        alone, plain, high, borrowing = ways

        def latency(w) -> str:
            return f"p50 {w.p50_ms:.2f} ms, p99 {w.p99_ms:.2f} ms"

        def share(w) -> str:
            return f"; the batch {w.idle_share_pct:.0f} % of the idle time"

        data = {w.name: {"p50_ms": w.p50_ms, "p99_ms": w.p99_ms, "idle_share_pct": w.idle_share_pct}
                for w in ways}
        goal = (f"p99 <= {service_bench.p99_goal_ms(alone):.2f} ms, the batch >= "
                f"{service_bench.IDLE_SHARE_PCT:g} % of the idle time")
        return [Row("priority", "service alone", uncapped=latency(alone), data=data),
                Row("priority", "service beside a batch job, no priorities", uncapped=latency(plain) + share(plain)),
                Row("priority", "service high, batch job low", uncapped=latency(plain) + " (no priorities)",
                    capped=latency(high) + share(high), expect=goal,
                    verdict=verdict(service_bench.meets_goals(alone, high))),
                Row("priority", "service high, batch job low borrowing at 50 %",
                    capped=latency(borrowing) + share(borrowing))]
    return Spec("priority.service", "service beside a batch job", 4 * (seconds + 8) + 60, fn)

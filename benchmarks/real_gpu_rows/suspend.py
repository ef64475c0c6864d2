"""Suspend and resume (docs/suspend.md): a container of one ctypes process
(tests/clients/checkpoint_tenant.py) holding 1, 4 and 16 GiB (--quick: 1 GiB) is suspended and resumed
by `vgpulimit suspend` / `vgpulimit resume` through the driver's checkpoint
API; timed (lock + checkpoint, restore + unlock, as the record says), and the
bytes it wrote checked after.  A figure no one publishes per GiB.  Where the
driver lacks the calls (before 570) the rows are skipped with the reason."""

from __future__ import annotations

import json

from real_gpu_rows.bench import Bench, failed
from real_gpu_rows.rows import GiB, Row, Skip, Spec, verdict

SIZES_GIB = (1, 4, 16)


def suspend_specs(quick: bool) -> list[Spec]:
    return [Spec(f"suspend.{gib}gib", f"suspend and resume, {gib} GiB held", 60 + 6 * gib,
                 lambda bench, gib=gib: [suspend_row(bench, gib)]) for gib in (SIZES_GIB[:1] if quick else SIZES_GIB)]


def _usable(bench: Bench) -> None:
    """Skip where the driver lacks the calls."""
    from vgpulimit.suspend import Driver, SuspendError

    try:
        Driver(bench.simulate)
    except SuspendError as exc:
        raise Skip(str(exc)) from None


def suspend_row(bench: Bench, gib: int) -> Row:
    from vgpulimit.suspend_record import read_record

    _usable(bench)
    name = f"suspend and resume, {gib} GiB held"
    expect = "bytes intact; none of it on the GPU while suspended, all of it back after"
    region = bench.work / f"suspend-{gib}.region"
    tenant = bench.start(bench.capped(["--memory", f"{gib + 1}GiB", "--region", str(region)],
                                      bench.python("checkpoint_tenant.py")))
    pid = json.loads(tenant.line(bench.left(60)) or "{}").get("ready")
    tenant.write(f"alloc {gib * GiB}\n")
    got = json.loads(tenant.line(bench.left(120)) or "{}")
    if pid is None or got.get("result") != "CUDA_SUCCESS":
        return Row("suspend", name, expect=expect, verdict="FAIL", note=f"the tenant could not hold {gib} GiB: {got}")
    sim = ["--simulate"] if bench.simulate else []
    held = bench.driver.process_bytes().get(pid)
    done = bench.run(bench.vgpulimit("suspend", *sim, "--region", str(region)), 30 + 3 * gib, "vgpulimit suspend")
    if done.returncode != 0:
        return Row("suspend", name, expect=expect, verdict="FAIL", note=failed("vgpulimit suspend", done))
    during = bench.driver.process_bytes().get(pid, 0)
    done = bench.run(bench.vgpulimit("resume", *sim, "--region", str(region)), 30 + 3 * gib, "vgpulimit resume")
    if done.returncode != 0:
        return Row("suspend", name, expect=expect, verdict="FAIL", note=failed("vgpulimit resume", done))
    after = bench.driver.process_bytes().get(pid)
    tenant.write("check\n")
    intact = json.loads(tenant.line(bench.left(120)) or "{}").get("intact") is True
    record = read_record(str(region))
    out_s, in_s = record.last_suspend_ns / 1e9, record.last_resume_ns / 1e9
    rate = (f" ({gib * GiB / out_s / 1e9:.1f} / {gib * GiB / in_s / 1e9:.1f} GB/s)" if out_s and in_s else "")
    ok = intact and during == 0 and held is not None and after is not None and after >= gib * GiB
    return Row("suspend", name, capped=f"suspend {out_s:.2f} s, resume {in_s:.2f} s{rate}", expect=expect,
               verdict=verdict(ok), note="" if ok else f"intact {intact}, NVML {held} / {during} / {after} bytes",
               data={"held_bytes": gib * GiB, "suspend_ns": record.last_suspend_ns,
                     "resume_ns": record.last_resume_ns, "intact": intact, "nvml_before": held,
                     "nvml_during": during, "nvml_after": after})

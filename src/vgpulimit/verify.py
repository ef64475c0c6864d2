"""`vgpulimit verify`: checks, on the driver in front of it, that the limits hold.

Two places it runs:

* where limits are set up already (a container the hook or CDI prepared, a
  `vgpulimit run`, limit variables): it starts a CUDA process of its own
  (vgpulimit.verify_probe) in this environment, unchanged, and checks what
  that process sees against the configuration; ``--memory``/``--cores`` then
  say what the configuration should be;
* on a node with none: ``--memory``/``--cores`` make a fresh region, as
  `vgpulimit run` would, the probe runs in it, and the region goes after.

The probe records facts; this module judges them, one check per promise of
the README and docs/real-gpu.md, each pass, fail, skip (with why) or info.
Exit 0 only when no check fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from vgpulimit import environment, request
from vgpulimit._paths import simgpu_dir
from vgpulimit.child_env import prepend_path
from vgpulimit.limits import MemoryLimit, format_bytes, parse_cores, parse_memory
from vgpulimit.placement import CONTAINER_REGION, enclosing_region, runtime_base
from vgpulimit.region import RegionError, read_snapshot
from vgpulimit.verify_probe import SHIM_NAME, SPIN_MS

MISSING = "NVML has no "   # how the probe says that the library lacks a function (verify_probe.unanswered)

SCHEMA_VERSION = 1
PROBE_TIMEOUT_S = 600
# How far the achieved share may exceed the share before the check fails:
# the budget a process may run ahead by, and the noise of one short window.
SHARE_SLACK_PCT = 5.0
SHARE_SLACK_FRACTION = 0.15

# Runs a command in a fresh region as `vgpulimit run` does, and returns its exit
# code: the supervisor's run, handed in by the CLI, so that verify, which judges,
# never imports what spawns and reaps (tests/test_layers.py).
Runner = Callable[[request.RunOptions, Mapping[str, str]], int]


@dataclass(frozen=True)
class Check:
    name: str
    status: str       # pass | fail | skip | info
    message: str


@dataclass
class Report:
    mode: str                       # "here" (limits already set up) or "fresh-region"
    device: int
    checks: list[Check] = field(default_factory=list)
    facts: dict = field(default_factory=dict)       # what the probe saw, with the shim
    baseline: dict = field(default_factory=dict)    # what a probe without the shim saw

    @property
    def ok(self) -> bool:
        return not any(c.status == "fail" for c in self.checks)

    def add(self, name: str, status: str, message: str) -> None:
        self.checks.append(Check(name, status, message))

    def document(self) -> dict:
        return {"version": SCHEMA_VERSION, "ok": self.ok, "mode": self.mode,
                "device": self.device, "checks": [asdict(c) for c in self.checks],
                "facts": self.facts, "baseline": self.baseline}


@dataclass(frozen=True)
class Options:
    memory: str | None = None
    cores: str | None = None
    device: int = 0
    simulate: bool = False
    quick: bool = False
    no_alloc: bool = False    # the views only: for readiness probes beside a workload


@dataclass(frozen=True)
class Configuration:
    """What this environment says the limits are, and where each came from."""

    region: str | None
    region_origin: str | None
    env: environment.Environment
    shim_in_system_preload: bool

    @property
    def present(self) -> bool:
        return self.region is not None or self.env.asks or self.shim_in_system_preload


def read_configuration(environ: Mapping[str, str]) -> Configuration:
    env = environment.read(environ)
    region = enclosing_region(environ)
    if region is None:
        origin = None
    elif region == CONTAINER_REGION:
        origin = (f"region {region}, set up by the container's runtime (the OCI hook or CDI: "
                  "from an annotation or the container's variables)")
    else:
        origin = f"region {region}, named by {env.region_source}"
    try:
        system = Path("/etc/ld.so.preload").read_text()
    except OSError:
        system = ""
    in_system = any(os.path.basename(e) == SHIM_NAME for e in system.replace(":", " ").split())
    return Configuration(region, origin, env, in_system)


# -- running the probe ---------------------------------------------------------------------


def _probe_command(report: Path, options: Options, *extra: str) -> list[str]:
    cmd = [sys.executable, "-m", "vgpulimit.verify_probe", "--report", str(report),
           "--device", str(options.device), *extra]
    return cmd + (["--quick"] if options.quick else []) + \
        (["--no-alloc"] if options.no_alloc and not extra else [])


def _simulated(environ: Mapping[str, str], simulate: bool) -> dict[str, str]:
    """``environ``, with the simulated driver first on the library path; its
    kernels then last as long as the spin kernel does on a GPU (simgpu runs
    every kernel it cannot time by name for SIMGPU_KERNEL_US)."""
    env = dict(environ)
    if simulate:
        env["LD_LIBRARY_PATH"] = prepend_path(env.get("LD_LIBRARY_PATH"), str(simgpu_dir()))
        env.setdefault("SIMGPU_KERNEL_US", str(int(SPIN_MS * 1000)))
    return env


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _read_facts(report: Path, code: int | None, stderr: str = "",
                killed_by: int | None = None, what: str = "the probe") -> dict:
    """The probe's report.  Where the probe did not finish -- killed by a
    signal, timed out (``code`` None), or exited with its report still at a
    step -- what it found until then, with an ``error`` that says how it
    ended and the last check it reached."""
    try:
        facts = json.loads(report.read_text())
    except (OSError, ValueError):
        facts = {}
    if not isinstance(facts, dict):
        facts = {}
    reached = facts.get("reached")
    where = (f"; the last check it reached: {reached}" if reached
             else "; it had reported nothing yet")
    if killed_by is not None:
        name = _signal_name(killed_by)
        facts["crashed"] = {"signal": name, "reached": reached}
        facts["error"] = f"{what} crashed: killed by {name} (signal {killed_by}){where}"
    elif code is None:
        facts["error"] = f"{what} did not finish in {PROBE_TIMEOUT_S} s{where}"
    elif reached is not None or not facts:
        tail = stderr.strip().splitlines()[-1:]
        facts["error"] = f"{what} exited {code}" + (f" ({tail[0]})" if tail else "") + where
    return facts


def _run_probe(cmd: list[str], env: Mapping[str, str], report: Path,
               what: str = "the probe") -> dict:
    try:
        result = subprocess.run(cmd, env=dict(env), capture_output=True, text=True,
                                timeout=PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return _read_facts(report, None, what=what)
    code = result.returncode
    return _read_facts(report, code, result.stderr, -code if code < 0 else None, what)


def _without_shim(environ: Mapping[str, str]) -> dict[str, str]:
    env = dict(environ)
    rest = [e for e in env.get("LD_PRELOAD", "").replace(":", " ").split()
            if os.path.basename(e) != SHIM_NAME]
    env["LD_PRELOAD"] = " ".join(rest)
    if not rest:
        del env["LD_PRELOAD"]
    return env


def verify(options: Options, run: Runner, environ: Mapping[str, str] | None = None) -> Report:
    environ = dict(os.environ if environ is None else environ)
    asked_memory = parse_memory(options.memory, "--memory") if options.memory else None
    asked_cores = parse_cores(options.cores, "--cores") if options.cores else None
    config = read_configuration(environ)
    if not config.present and asked_memory is None and asked_cores is None:
        report = Report("here", options.device)
        report.add("limits", "fail", "no limits are set up here (no region, no limit variable, "
                   "no shim in /etc/ld.so.preload); give --memory SIZE and/or --cores PCT to "
                   "check a fresh region")
        return report
    env = _simulated(environ, options.simulate)
    with tempfile.TemporaryDirectory(prefix="verify-", dir=runtime_base()) as work:
        workdir = Path(work)
        if config.present:
            report = Report("here", options.device)
            before = _region_usage(config.region, options.device)
            report.facts = _run_probe(_probe_command(workdir / "probe.json", options), env,
                                      workdir / "probe.json")
            region_path, origin = config.region, config.region_origin
        else:
            report = Report("fresh-region", options.device)
            region_path = str(workdir / "region")
            origin = f"a fresh region {region_path}, from the flags given (removed after)"
            before = 0
            report.facts = _run_fresh(options, run, env, workdir, region_path)
        after = _region_usage(region_path, options.device)
        # Asked by a process of its own: this one loads no driver library.
        nvml_after = _run_probe(_probe_command(workdir / "nvml.json", options,
                                               "--nvml-processes"), env, workdir / "nvml.json",
                                "the probe of NVML's process list")
        if options.no_alloc:
            report.baseline = {"error": "not measured (--no-alloc)"}
        elif config.shim_in_system_preload:
            report.baseline = {"error": "not measured: the shim is in /etc/ld.so.preload, so no "
                                        "process here runs without it"}
        else:
            room = report.facts.get("cuda", {}).get("mem_get_info", {}).get("free", 0)
            report.baseline = _run_probe(
                _probe_command(workdir / "baseline.json", options, "--costs-only",
                               "--alloc-room", str(room)),
                _without_shim(env), workdir / "baseline.json", "the probe without the shim")
        judge(report, config, origin, asked_memory, asked_cores)
        _judge_cleanup(report, region_path, before, after, nvml_after)
    return report


def _run_fresh(options: Options, run: Runner, env: Mapping[str, str], workdir: Path,
               region_path: str) -> dict:
    """The probe in a fresh region made as `vgpulimit run` makes one."""
    limits = request.resolve_limits(options.memory, [], env, options.cores)
    report = workdir / "probe.json"
    asked = request.RunOptions(command=_probe_command(report, options), limits=limits,
                               simulate=False, region_path=region_path)
    code = run(asked, env)
    # `run` exits 128+N for a command killed by signal N, as a shell does.
    return _read_facts(report, code, killed_by=code - 128 if code > 128 else None)


def _region_usage(path: str | None, device: int) -> int | None:
    if path is None:
        return None
    try:
        return read_snapshot(path, all_devices=True).devices[device].used_bytes
    except (RegionError, IndexError):
        return None


# -- judging -------------------------------------------------------------------------------


def _size(n: int | None) -> str:
    return "unknown" if n is None else format_bytes(n) if n else "0 B"


def judge(report: Report, config: Configuration, origin: str | None,
          asked_memory: MemoryLimit | None, asked_cores: int | None) -> None:
    facts, device = report.facts, report.device
    shim = facts.get("shim", {})
    region = facts.get("region") or {}
    setting = config.env.memory.get(device)
    cores_setting = config.env.cores.get(device)

    if shim.get("loaded"):
        via = " and ".join(shim.get("via") or []) or "neither LD_PRELOAD nor /etc/ld.so.preload"
        report.add("shim", "pass", f"loaded from {shim.get('path')} (via {via})")
    elif not shim:
        report.add("shim", "skip", "not known: the probe stopped before it looked")
    else:
        why = origin or "limit variables in the environment"
        report.add("shim", "fail", f"limits are configured ({why}) but the shim is not loaded in "
                   "this process: it is in neither LD_PRELOAD nor /etc/ld.so.preload")

    no_context = facts.get("no_context") or {}
    context_too_big = shim.get("loaded") and no_context.get("result") == "CUDA_ERROR_OUT_OF_MEMORY"
    if context_too_big:
        # The shim refuses a context whose own memory does not fit: the cap is
        # there, and too small for anything to run under it.
        cap_text = _size(facts.get("cap_bytes")) if facts.get("cap_bytes") is not None else "the cap"
        report.add("context", "fail", f"the CUDA context's own memory does not fit under the cap of "
                   f"{cap_text} ({no_context['call']} was refused with CUDA_ERROR_OUT_OF_MEMORY): "
                   "a context costs the driver device memory before anything is allocated; give a "
                   "cap above that (hundreds of MiB on most GPUs)")
    elif "error" in facts:
        report.add("probe", "fail", facts["error"])
    if region.get("error"):
        report.add("region", "fail", region["error"])

    # The cap the configuration holds, and where it came from.
    total = region.get("total_bytes") or None
    cap = facts.get("cap_bytes")
    if region:
        cores_pct = region.get("cores_pct") or 0
        where = origin or region.get("path")
        if shim.get("loaded") and region.get("pids") is not None and \
                not set(facts.get("pids", [])) & set(region["pids"]):
            report.add("region", "fail", f"the shim is loaded but this process is not attached "
                       f"to {region.get('path')}: its allocations count somewhere else")
    else:
        cores_pct = cores_setting.value if cores_setting else 0
        where = "the environment"
    memory_text = (f"memory {_size(cap)}" if cap is not None else
                   "memory: no cap" if not setting else f"memory {setting.value.describe()}")
    sources = [f"{s.source}={s.text}" for s in (setting, cores_setting) if s]
    report.add("limits", "info", f"device {device}: {memory_text}, compute "
               f"{f'{cores_pct}%' if cores_pct else 'no share'}; from {where}"
               + (f" (variables: {', '.join(sources)})" if sources else ""))
    # The limit as written, before the shim clamps it to the device: a cap
    # that the device is too small for is a failure of its own, below.
    written = (_unclamped(region.get("limit_bytes", 0), region.get("limit_ppm", 0), total)
               if region else cap)
    if asked_memory is not None:
        asked = _unclamped(asked_memory.bytes, asked_memory.ppm, total)
        if asked is not None and asked != written:
            report.add("limits", "fail", f"the memory cap here is {_size(written)}, not the "
                       f"{asked_memory.describe()} asked with --memory")
    if asked_cores is not None and asked_cores != cores_pct:
        report.add("limits", "fail", f"the compute share here is "
                   f"{f'{cores_pct}%' if cores_pct else 'none'}, not the {asked_cores}% asked "
                   "with --cores")

    cuda = facts.get("cuda")
    on_mig = bool((facts.get("nvml") or facts.get("nvml_before") or {}).get("mig"))
    if cuda:
        uuid = cuda.get("uuid")
        if on_mig and uuid:
            uuid = "MIG-" + uuid[4:]   # CUDA's 16 bytes do not say which; NVML did
        report.add("driver", "info", f"{cuda.get('name')} ({uuid}), CUDA driver "
                   f"{cuda.get('driver_version')}, {cuda.get('libcuda')}"
                   + ("; a MIG instance: the limits are shares of the instance, and NVML has "
                      "no utilisation there" if on_mig else ""))
    if written is not None and total is not None and total < written:
        report.add("device", "fail", f"device {device} has {_size(total)}, less than its cap of "
                   f"{_size(written)}: the cap cannot be given")
    if cuda and cap is not None:
        _judge_views(report, cuda, facts.get("nvml") or facts.get("nvml_before") or {}, cap)
    _judge_nvml_processes(report, facts)
    if "meminfo_after" in facts:   # --no-alloc: the views only
        before = (cuda or {}).get("mem_get_info", {}).get("free")
        after = facts["meminfo_after"]["free"]
        report.add("allocated nothing", "pass" if before is None or after >= before else "fail",
                   f"cuMemGetInfo shows {_size(after)} free at the end, {_size(before)} after the "
                   "context was made")
        report.add("past the cap", "skip", "not tried (--no-alloc)")
        report.add("compute share", "skip",
                   "not measured (--no-alloc)" if cores_pct else "no compute share set")
    else:
        if context_too_big:
            report.add("past the cap", "skip", "not tried: no context to allocate in")
            report.add("compute share", "skip", "not measured: no context to launch in"
                       if cores_pct else "no compute share set")
        else:
            _judge_fill(report, facts.get("fill"), cap, shim.get("loaded"))
            _judge_share(report, facts, cores_pct)
    _judge_costs(report, facts.get("costs"), report.baseline)


def _unclamped(limit_bytes: int, ppm: int, total: int | None) -> int | None:
    if limit_bytes:
        return limit_bytes
    if ppm and total:
        return total * ppm // 1_000_000
    return None


def _judge_views(report: Report, cuda: dict, nvml: dict, cap: int) -> None:
    info = cuda.get("mem_get_info", {})
    shown = [("cuMemGetInfo", info.get("total"), info.get("free")),
             ("cuDeviceTotalMem", cuda.get("device_total_mem"), None)]
    if nvml.get("available"):
        for name, key in (("nvmlDeviceGetMemoryInfo", "memory_v1"),
                          ("nvmlDeviceGetMemoryInfo_v2", "memory_v2")):
            value = nvml.get(key)
            if value is None:   # the probe stopped before it asked
                continue
            if isinstance(value, dict):
                shown.append((name, value["total"], value["free"]))
            elif value.startswith(MISSING):   # not supported here, as nvidia-ml-py reads it
                report.add(name, "skip", value)
            else:
                report.add(name, "fail", value)
    else:
        report.add("nvml", "skip", nvml.get("error", "NVML not reached"))
    for name, total, free in shown:
        if total == cap and (free is None or free <= cap):
            report.add(name, "pass", f"total {_size(total)} = the cap"
                       + (f", free {_size(free)}" if free is not None else ""))
        else:
            report.add(name, "fail", f"{name} shows total {_size(total)}"
                       + (f" and free {_size(free)}" if free is not None else "")
                       + f", not the cap of {_size(cap)}")


def _judge_nvml_processes(report: Report, facts: dict) -> None:
    nvml = facts.get("nvml") or {}
    if not nvml.get("available"):
        return
    listed = nvml.get("processes")
    if listed is None:   # the probe stopped before it asked
        return
    if isinstance(listed, str):
        report.add("nvml processes", "skip" if listed.startswith(MISSING) else "fail", listed)
        return
    mine = [p for p in listed if p["pid"] in facts.get("pids", [])]
    if mine:
        report.add("nvml processes", "pass", f"lists this process (pid {mine[0]['pid']}, "
                   f"{_size(mine[0]['used_bytes'])}) among {len(listed)}")
    else:
        report.add("nvml processes", "fail", f"nvmlDeviceGetComputeRunningProcesses_v3 does not "
                   f"list this process (pids {facts.get('pids')}) among {len(listed)}")
    util = nvml.get("utilization_pct")
    if nvml.get("mig"):
        report.add("nvml utilization", "info", "not supported on a MIG instance (nvml.h): the "
                   "compute share is timed with CUDA events")
        return
    report.add("nvml utilization", "info", f"{util}% busy when last sampled" if util is not None
               else "nvmlDeviceGetUtilizationRates gave no sample")


def _judge_fill(report: Report, fill: dict | None, cap: int | None, shim_loaded: bool) -> None:
    name = "past the cap"
    if cap is None:
        report.add(name, "skip", "no memory cap to allocate past")
        return
    if not shim_loaded:
        report.add(name, "skip", "not tried: without the shim an allocation past the cap would "
                   "take memory from the device's other tenants")
        return
    if fill is None:
        report.add(name, "fail", "not tried: the probe stopped before it")
        return
    chunk, filled = fill["chunk_bytes"], fill["filled_bytes"]
    if "refused_early" in fill:
        report.add(name, "fail", f"an allocation was refused ({fill['refused_early']}) after "
                   f"{_size(filled)} of the {_size(fill['free_before'])} free under the cap: "
                   "the device has less free memory than the cap says")
    elif fill.get("past_cap") == "CUDA_SUCCESS":
        report.add(name, "fail", f"an allocation past the cap succeeded: {_size(filled)} held, "
                   f"{_size(chunk)} more granted over a cap of {_size(cap)}")
    elif fill.get("past_cap") == "CUDA_ERROR_OUT_OF_MEMORY":
        report.add(name, "pass", f"filled {_size(filled)} in {_size(chunk)} blocks; one more was "
                   "refused with CUDA_ERROR_OUT_OF_MEMORY; all freed")
    else:
        report.add(name, "fail", f"one block past the cap was refused with "
                   f"{fill.get('past_cap')}, not CUDA_ERROR_OUT_OF_MEMORY")
    back = fill.get("meminfo_after", {}).get("free")
    if back is not None and back < fill["free_before"]:
        report.add("freed", "fail", f"cuMemGetInfo shows {_size(back)} free after freeing "
                   f"everything, {_size(fill['free_before'])} before")


def _judge_share(report: Report, facts: dict, cores_pct: int) -> None:
    name = "compute share"
    share = facts.get("share")
    if not cores_pct:
        report.add(name, "skip", "no compute share set")
        return
    if share is None:
        report.add(name, "skip", "not measured (--quick)" if "error" not in facts
                   else "not measured: the probe stopped before it")
        return
    if "error" in share:
        report.add(name, "fail", share["error"])
        return
    achieved = share["achieved_pct"]
    limit = cores_pct + max(SHARE_SLACK_PCT, cores_pct * SHARE_SLACK_FRACTION)
    detail = (f"achieved {achieved:.1f}% of the GPU's time against a share of {cores_pct}% "
              f"({share['kernels']} kernels of {share['kernel_ms']:.3f} ms, timed by events, "
              f"in {share['window_s']:.1f} s)")
    if achieved <= limit:
        report.add(name, "pass", detail)
    else:
        report.add(name, "fail", detail + f": more than {limit:.0f}%")


def _judge_costs(report: Report, with_shim: dict | None, baseline: dict) -> None:
    if not with_shim:
        return
    without = baseline.get("costs") or {}
    parts = []
    for key, what in (("launch_ns", "launch"), ("alloc_ns", "allocation"), ("free_ns", "free")):
        if key not in with_shim:
            continue
        text = f"{what} {with_shim[key] / 1000:.1f} µs"
        if without.get(key):
            text += f" vs {without[key] / 1000:.1f} µs without the shim " \
                    f"(×{with_shim[key] / without[key]:.2f})"
        parts.append(text)
    if not without:
        parts.append(f"without the shim: {baseline.get('error', 'not measured')}")
    report.add("added cost", "info", "; ".join(parts) + " (from Python, one call timed at a time)")


def _judge_cleanup(report: Report, region: str | None, before: int | None, after: int | None,
                   nvml_after: dict) -> None:
    """Nothing the probe held outlives it: its region's usage is back where
    it was, and NVML no longer lists it."""
    pids = report.facts.get("pids", [])
    if before is not None and after is not None:
        if after <= before:
            report.add("left behind", "pass", f"the region's usage is back to {_size(after)}")
        else:
            report.add("left behind", "fail", f"the region {region} holds {_size(after)} after "
                       f"the probe exited, {_size(before)} before")
    if "crashed" in nvml_after:
        report.add("left behind", "fail", nvml_after["error"])
    gone = [p["pid"] for p in nvml_after.get("processes", [])]
    stayed = sorted(set(gone) & set(pids))
    if stayed:
        report.add("left behind", "fail", f"NVML still lists the probe (pid {stayed[0]}) "
                   "after it exited")


# -- output --------------------------------------------------------------------------------


def render_text(report: Report) -> str:
    lines = [f"{c.status.upper():<4} {c.name}: {c.message}" for c in report.checks]
    failed = sum(c.status == "fail" for c in report.checks)
    lines.append(f"vgpulimit verify: {'all checks passed' if not failed else f'{failed} failed'}"
                 f" ({'limits set up here' if report.mode == 'here' else 'a fresh region'}, "
                 f"device {report.device})")
    return "\n".join(lines) + "\n"


def render_json(report: Report) -> str:
    return json.dumps(report.document(), indent=2) + "\n"


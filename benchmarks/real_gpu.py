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
  once.

Each row runs under a time budget; a row that fails, crashes or runs out of
time is a row of the table (FAIL / ERROR), never the end of the run.  On the
simulated GPU, rows that need the real CUDA runtime (PyTorch, CuPy, JAX) are
skipped with the reason.  The pytest tests marked `gpu` (tests/test_real_gpu.py)
run the same rows and assert their pass lines.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import importlib.util
import json
import os
import platform
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from vgpulimit import __version__, _paths

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CLIENTS = ROOT / "tests" / "clients"
PTX = HERE / "spin_timer.ptx"
CLIENT_SOURCE = HERE / "real_gpu_client.c"

MiB, GiB = 1 << 20, 1 << 30
CAP_BYTES = 4 * GiB
CAP_FLAG = "4GiB"
BLOCK_MIB = 256
DRIVER_SLACK_BYTES = 16 * MiB          # what the driver may list beyond the cap: 1 % + this
SHARE_TOLERANCE_PP = 2.0
LAUNCH_BOUND_KEPT = 0.95               # eager PyTorch (GPU ~11 % busy) under a share of 50 or 90
NODE_TOLERANCE_BYTES = 16 * MiB
RUN_BUDGET_S = 480.0                   # the whole run on a GPU: 8 minutes

GROUPS = ("memory", "tools", "share", "priority", "programs", "costs", "node")
GROUP_TITLES = {"memory": "memory cap (4 GiB)", "tools": "tools inside the cap", "share": "compute share",
                "priority": "priority between tenants", "programs": "real programs", "costs": "costs from C",
                "node": "node view"}
# Cheap and decisive first; torch.compile's cold compile last.
RUN_ORDER = ("tools", "memory", "share", "priority", "costs", "node", "programs")

NEEDS_RUNTIME = ("needs the real CUDA runtime ({what}), which stops on the simulated driver "
                 "(libcudart asks the driver for NVIDIA's private export tables)")


class Skip(Exception):
    """The row cannot run here; the message says why."""


class OutOfTime(Exception):
    """The row's time budget ran out."""


@dataclass
class Row:
    group: str
    name: str
    uncapped: str = ""
    capped: str = ""
    expect: str = ""            # the pass line; "" for a figure reported only
    verdict: str = "INFO"       # PASS, FAIL, INFO (reported), SKIP, ERROR
    note: str = ""
    seconds: float | None = None
    data: dict = field(default_factory=dict)


@dataclass
class Spec:
    """A unit of work with its own budget; it gives one row or several."""
    id: str                     # "group.name", what --only selects
    title: str                  # the row's name when the spec fails as a whole
    budget_s: float
    fn: Callable[[Bench], list[Row]]
    needs: tuple[str, ...] = ()  # Python modules of the real CUDA runtime's world


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


# --- the processes ------------------------------------------------------------------------------

class Bench:
    """What every row uses: the mode, a work directory, the clean environment
    (no shim, no limit variables; on the simulated GPU, its driver first on the
    library path and a machine of its own), the C client, and processes run
    with timeouts that are clamped to the row's budget and kill the whole
    process group when they run out."""

    def __init__(self, simulate: bool, quick: bool, work: Path) -> None:
        self.simulate, self.quick, self.work = simulate, quick, work
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("VGPULIMIT_", "SIMGPU_", "CUDA_DEVICE_"))
                    and k not in ("LD_PRELOAD",)}
        runtime = work / "run"
        runtime.mkdir(mode=0o700, exist_ok=True)
        self.env["XDG_RUNTIME_DIR"] = str(runtime)
        self.env["PYTHONUNBUFFERED"] = "1"
        if simulate:
            self.env["LD_LIBRARY_PATH"] = os.pathsep.join(
                [str(_paths.simgpu_dir()), *filter(None, [os.environ.get("LD_LIBRARY_PATH")])])
            self.env["SIMGPU_STATE"] = str(work / "simgpu.state")
            self.env["SIMGPU_RESERVED"] = "615MiB"      # an idle H200's driver kept that much
            # This process reads the same simulated machine with NVML (DriverView).
            for name in ("SIMGPU_STATE", "SIMGPU_RESERVED"):
                os.environ[name] = self.env[name]
        self.client_error = ""
        self.client = self._build_client()
        self.deadline = float("inf")
        self.procs: list[Proc] = []
        self.versions: dict[str, str] = {}
        self.driver = DriverView(simulate)

    def _build_client(self) -> Path | None:
        """real_gpu_client.c, built with the first C compiler found; None (and
        the reason in client_error) where there is none or it fails: its rows
        are then errors, the others run."""
        client = self.work / "real_gpu_client"
        compilers = [c for c in dict.fromkeys([os.environ.get("CC"), "cc", "gcc", "clang"])
                     if c and shutil.which(c)]
        if not compilers:
            self.client_error = "no C compiler (cc, gcc, clang) to build benchmarks/real_gpu_client.c"
            return None
        result = subprocess.run([compilers[0], "-std=c11", "-D_GNU_SOURCE", "-O2",
                                 f"-I{ROOT / 'shim' / 'include'}", "-o", str(client), str(CLIENT_SOURCE), "-ldl"],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            self.client_error = (f"{compilers[0]} could not build real_gpu_client.c: "
                                 f"{result.stderr.strip()[-300:]}")
            return None
        return client

    def c_client(self) -> str:
        if self.client is None:
            raise RuntimeError(self.client_error)
        return str(self.client)

    # commands
    def vgpulimit(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "vgpulimit", *args]

    def capped(self, flags: Sequence[str], command: Sequence[str]) -> list[str]:
        """`vgpulimit run [--simulate] FLAGS -- COMMAND`."""
        return self.vgpulimit("run", *(["--simulate"] if self.simulate else []), *flags, "--",
                              *map(str, command))

    def python(self, client: str, *args: object) -> list[str]:
        return [sys.executable, str(CLIENTS / client), *map(str, args)]

    def spin(self, *args: object) -> list[str]:
        return [self.c_client(), "spin", str(PTX), *map(str, args)]

    # time
    def left(self, want_s: float) -> float:
        """``want_s``, or what is left of the row's budget if less."""
        left = self.deadline - time.monotonic()
        if left <= 0.5:
            raise OutOfTime("the row's time budget ran out")
        return min(want_s, left)

    # processes
    def start(self, command: Sequence[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(command, env or self.env)
        self.procs.append(proc)
        return proc

    def finish(self, proc: Proc, want_s: float, what: str) -> tuple[str, str]:
        """Its output once it exits; killed (with its children) past the time."""
        limit = self.left(want_s)
        try:
            proc.popen.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise OutOfTime(f"{what} did not finish within {limit:.0f} s") from None
        return proc.output()

    def run(self, command: Sequence[str], want_s: float, what: str,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        proc = self.start(command, env)
        out, err = self.finish(proc, want_s, what)
        return subprocess.CompletedProcess(proc.popen.args, proc.returncode, out, err)

    def cleanup(self) -> None:
        for proc in self.procs:
            proc.kill()
        self.procs.clear()


class Proc:
    """A process in a session of its own (so that it is killed with its
    children), its stdin a pipe, its stdout and stderr read by threads: line
    by line with a deadline, or whole at the end."""

    def __init__(self, command: Sequence[str], env: dict[str, str]) -> None:
        self.popen = subprocess.Popen(list(map(str, command)), env=env, text=True, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self.queues: tuple[queue.Queue, queue.Queue] = (queue.Queue(), queue.Queue())
        self.seen: tuple[list[str], list[str]] = ([], [])
        self.threads = [threading.Thread(target=self._read, args=(i, stream), daemon=True)
                        for i, stream in enumerate((self.popen.stdout, self.popen.stderr))]
        for thread in self.threads:
            thread.start()

    def _read(self, which: int, stream) -> None:
        for line in stream:
            self.seen[which].append(line)
            self.queues[which].put(line)
        self.queues[which].put(None)

    def line(self, timeout_s: float, stderr: bool = False) -> str | None:
        """The next line of its stdout (or stderr); None at the end; OutOfTime past the time."""
        try:
            return self.queues[int(stderr)].get(timeout=timeout_s)
        except queue.Empty:
            raise OutOfTime(f"no output within {timeout_s:.0f} s") from None

    def send(self, text: str) -> None:
        """Writes ``text`` to its stdin and closes it."""
        try:
            self.popen.stdin.write(text)
            self.popen.stdin.close()
        except OSError:
            pass

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def output(self) -> tuple[str, str]:
        for thread in self.threads:
            thread.join(5)
        return "".join(self.seen[0]), "".join(self.seen[1])

    def kill(self) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                pass
        try:
            self.popen.stdin.close()
        except OSError:
            pass


def failed(what: str, result: subprocess.CompletedProcess | tuple[int, str]) -> str:
    code, err = (result.returncode, result.stderr) if isinstance(result, subprocess.CompletedProcess) \
        else result
    lines = [line for line in (err or "").strip().splitlines() if line.strip()]
    return f"{what} exited {code}" + (f": {lines[-1][:200]}" if lines else "")


# --- the driver, as the node sees it ------------------------------------------------------------

class DriverView:
    """NVML in this process, which has no shim: what the driver lists, what a
    capped process cannot touch.  On the simulated GPU, its NVML (loaded by
    path first, so that nvidia-ml-py's dlopen by soname finds it)."""

    def __init__(self, simulate: bool) -> None:
        self.nvml = None
        self.error = ""
        try:
            if simulate:
                ctypes.CDLL(str(_paths.simgpu_dir() / "libnvidia-ml.so.1"), mode=ctypes.RTLD_GLOBAL)
            import pynvml
        except (ImportError, OSError) as exc:
            self.error = f"NVML cannot be read here: {exc}"
            return
        try:
            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.nvml = pynvml
        except pynvml.NVMLError as exc:     # no driver: the rows that need it say so
            self.error = f"NVML cannot be read here: {exc}"

    def _call(self, fn: str, *args, default=None):
        if self.nvml is None:
            return default
        try:
            return getattr(self.nvml, fn)(*args)
        except (self.nvml.NVMLError, AttributeError, TypeError):
            return default

    def machine(self) -> dict:
        if self.nvml is None:
            return {"nvml": self.error}
        name = self._call("nvmlDeviceGetName", self.handle, default="?")
        memory = self._call("nvmlDeviceGetMemoryInfo", self.handle)
        cuda = self._call("nvmlSystemGetCudaDriverVersion_v2", default=None)
        return {"gpu": name if isinstance(name, str) else name.decode(),
                "memory_bytes": memory.total if memory else None,
                "driver": self._call("nvmlSystemGetDriverVersion", default="?"),
                "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None}

    def process_bytes(self) -> dict[int, int]:
        """Host pid -> bytes, as the driver lists compute processes."""
        procs = self._call("nvmlDeviceGetComputeRunningProcesses", self.handle, default=[]) or []
        return {p.pid: p.usedGpuMemory for p in procs if p.usedGpuMemory is not None}

    def memory(self) -> dict:
        """v1's used (the driver's reserve in it), v2's used and reserved."""
        out: dict = {}
        v1 = self._call("nvmlDeviceGetMemoryInfo", self.handle)
        if v1 is not None:
            out.update(total_bytes=v1.total, v1_used_bytes=v1.used)
        version = getattr(self.nvml, "nvmlMemory_v2", None)
        v2 = self._call("nvmlDeviceGetMemoryInfo", self.handle, version) if version else None
        if v2 is not None:
            out.update(used_bytes=v2.used, reserved_bytes=v2.reserved)
        return out

    def power(self) -> tuple[float, int] | None:
        """(watts, SM clock MHz) now; None where NVML does not say."""
        mw = self._call("nvmlDeviceGetPowerUsage", self.handle)
        clock = self._call("nvmlDeviceGetClockInfo", self.handle, getattr(self.nvml, "NVML_CLOCK_SM", 1))
        return (mw / 1000, clock) if mw is not None and clock is not None else None


class PowerSampler:
    """Power and SM clock every 0.25 s while a program runs; the medians of
    the last `seconds` before stop() (the program's measured phase)."""

    def __init__(self, driver: DriverView) -> None:
        self.driver, self.samples = driver, []
        self.running = True
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while self.running:
            got = self.driver.power()
            if got is not None:
                self.samples.append((time.monotonic(), *got))
            time.sleep(0.25)

    def stop(self, seconds: float) -> dict:
        self.running = False
        self.thread.join(2)
        end = time.monotonic()
        recent = [s for s in self.samples if s[0] >= end - seconds] or self.samples
        if not recent:
            return {}
        return {"watts": statistics.median(s[1] for s in recent),
                "sm_mhz": statistics.median(s[2] for s in recent)}


# --- formatting ---------------------------------------------------------------------------------

def size(nbytes: float | None) -> str:
    if nbytes is None:
        return "n/a"
    if abs(nbytes) >= GiB:
        return f"{nbytes / GiB:.2f} GiB"
    return f"{nbytes / MiB:.0f} MiB"


def pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} %"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def oom(error: str) -> bool:
    return any(word in error for word in ("OUT_OF_MEMORY", "OutOfMemory", "RESOURCE_EXHAUSTED",
                                          "out of memory"))


# --- 1. memory ----------------------------------------------------------------------------------

MEMORY_CLIENTS = (
    # id, row, framework (None: the C client), PYTORCH_CUDA_ALLOC_CONF
    ("c", "driver API from C (cuMemAlloc)", None, None),
    ("torch", "PyTorch, caching allocator", "torch", None),
    ("torch-expandable", "PyTorch, expandable_segments:True", "torch", "expandable_segments:True"),
    ("torch-async", "PyTorch, backend:cudaMallocAsync", "torch", "backend:cudaMallocAsync"),
    ("cupy", "CuPy", "cupy", None),
    ("jax", "JAX (preallocates)", "jax", None),
)


def fill_once(bench: Bench, command: list[str], env: dict[str, str], what: str) -> dict:
    """Runs a fill client until it reports, asks the driver what it lists for
    it while it holds its memory, then lets it go."""
    proc = bench.start(command, env)
    report = None
    while report is None:       # its JSON line, after whatever a framework prints first
        line = proc.line(bench.left(150))
        if line is None:
            break
        try:
            report = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(report, dict) or "pid" not in report:
            report = None
    if report is not None:
        report["driver_lists_bytes"] = bench.driver.process_bytes().get(report["pid"])
        report["driver_listed"] = bench.driver.nvml is not None
    proc.send("\n")
    out, err = bench.finish(proc, 60, what)
    if proc.returncode == 77:
        raise Skip(out.strip() or "the client cannot run here")
    if report is None:
        raise RuntimeError(failed(what, (proc.returncode, err or out)))
    return report


def memory_spec(client_id: str, name: str, framework: str | None, conf: str | None) -> Spec:
    def fn(bench: Bench) -> list[Row]:
        env = dict(bench.env)
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        seen = {}
        for setup, limit in (("uncapped", CAP_BYTES + GiB), ("capped", 4 * CAP_BYTES)):
            command = ([bench.c_client(), "fill", str(BLOCK_MIB), str(limit // MiB)] if framework is None
                       else bench.python("framework_fill.py", framework, BLOCK_MIB, limit // MiB))
            if setup == "capped":
                command = bench.capped(["--memory", CAP_FLAG], command)
            seen[setup] = fill_once(bench, command, env, f"{name} ({setup})")
        extra = seen["capped"].get("extra") or {}
        if framework and extra.get("version"):
            bench.versions[framework] = extra["version"]
        return [judge_memory(name, seen["uncapped"], seen["capped"], framework)]
    needs = (framework,) if framework else ()
    return Spec(f"memory.{client_id}", name, 200, fn, needs)


def judge_memory(name: str, free: dict, capped: dict, framework: str | None) -> Row:
    total = capped.get("total_bytes")
    if framework == "jax":      # JAX has no mem_get_info of its own: the driver's, in the process
        total = (capped.get("driver_meminfo") or [None, None])[1]
    listed = capped.get("driver_lists_bytes")
    held_at_refusal = capped["blocks"] * capped["block_bytes"]
    checks = {
        "sees the cap as the total": total == CAP_BYTES,
        "refused with an out-of-memory error": oom(capped["error"]),
        "held no more than the cap": held_at_refusal <= CAP_BYTES,
        "allocates again after freeing half": capped["again"] >= 1,
        "the driver lists no more than the cap + 1 % + 16 MiB":
            listed is not None and listed <= CAP_BYTES * 1.01 + DRIVER_SLACK_BYTES,
    }
    missing = [what for what, ok in checks.items() if not ok]
    extra = capped.get("extra") or {}
    prealloc = extra.get("preallocated_bytes")
    return Row("memory", name,
               uncapped=fill_text(free, framework),
               capped=fill_text(capped, framework) + (f"; preallocated {size(prealloc)}" if prealloc else ""),
               expect="total = cap; refused with its OOM error; allocates again after freeing half; "
                      "driver lists <= cap + 1 % + 16 MiB",
               verdict=verdict(not missing),
               note="" if not missing else "not: " + "; ".join(missing)
               + ("" if listed is not None or not capped.get("driver_listed") else
                  " (the driver did not list the process)"),
               data={"uncapped": free, "capped": capped, "checks": checks})


def fill_text(report: dict, framework: str | None) -> str:
    total = report.get("total_bytes")
    if framework == "jax":
        total = (report.get("driver_meminfo") or [None, None])[1]
    got = report["blocks"]
    error = report["error"]
    stop = "no refusal" if error == "none" else f"then {error[:70]}"
    return (f"sees {size(total)}; {got} x {BLOCK_MIB} MiB, {stop}; after freeing {report['freed']}: "
            f"{report['again']} more; driver lists {size(report.get('driver_lists_bytes'))}")


# --- 2. tools -----------------------------------------------------------------------------------

TOOL_IDS = {"nvidia-smi": "smi", "nvidia-smi --query-gpu": "smi-query", "nvidia-smi -q": "smi-q",
            "nvitop -1": "nvitop", "gpustat --json": "gpustat"}


def tool_commands() -> dict[str, tuple[list[str], str]]:
    """name -> (command, the module it needs or the executable it is)."""
    return {
        "nvidia-smi": (["nvidia-smi"], "nvidia-smi"),
        "nvidia-smi --query-gpu": (["nvidia-smi", "--query-gpu=memory.total,memory.used",
                                    "--format=csv,noheader,nounits"], "nvidia-smi"),
        "nvidia-smi -q": (["nvidia-smi", "-q", "-d", "MEMORY,UTILIZATION,PIDS"], "nvidia-smi"),
        "nvitop -1": ([sys.executable, "-m", "nvitop", "-1"], "nvitop"),
        "gpustat --json": ([sys.executable, "-m", "gpustat", "--json"], "gpustat"),
    }


def shown_total_mib(name: str, output: str) -> str | None:
    """The memory total a tool printed, as text; None where it cannot be read."""
    try:
        if name == "gpustat --json":
            return str(json.loads(output)["gpus"][0]["memory.total"])
        if name == "nvidia-smi --query-gpu":
            return output.split(",")[0].strip()
    except (ValueError, KeyError, IndexError):
        return None
    return None


def shows_cap(name: str, output: str) -> bool:
    cap_mib = str(CAP_BYTES // MiB)
    if name in ("gpustat --json", "nvidia-smi --query-gpu"):
        return shown_total_mib(name, output) == cap_mib
    return cap_mib in output


def tool_spec(name: str) -> Spec:
    def fn(bench: Bench) -> list[Row]:
        command, needs = tool_commands()[name]
        if needs == "nvidia-smi" and shutil.which("nvidia-smi") is None:
            raise Skip("no nvidia-smi here (the NVIDIA driver's tool; the simulated GPU has none)"
                       if bench.simulate else "no nvidia-smi on the PATH")
        if needs != "nvidia-smi" and importlib.util.find_spec(needs) is None:
            raise Skip(f"{needs} is not installed (pip install '.[test]'; on a lent machine, carry its wheel)")
        env = dict(bench.env, COLUMNS="160")
        free = bench.run(command, 60, name, env)
        capped = bench.run(bench.capped(["--memory", CAP_FLAG], command), 60, f"{name} (capped)", env)
        ok = capped.returncode == 0 and shows_cap(name, capped.stdout)
        note = ""
        if capped.returncode != 0:
            note = failed(name, capped)
        elif not ok:
            note = f"its output does not show {CAP_BYTES // MiB} MiB"
        return [Row("tools", name, uncapped=tool_text(name, free), capped=tool_text(name, capped),
                    expect=f"exit 0, shows {CAP_BYTES // MiB} MiB", verdict=verdict(ok), note=note,
                    data={"uncapped": {"rc": free.returncode, "stdout": free.stdout[-4000:],
                                       "stderr": free.stderr[-2000:]},
                          "capped": {"rc": capped.returncode, "stdout": capped.stdout[-4000:],
                                     "stderr": capped.stderr[-2000:]}})]
    return Spec(f"tools.{TOOL_IDS[name]}", name, 150, fn)


def tool_text(name: str, result: subprocess.CompletedProcess) -> str:
    total = shown_total_mib(name, result.stdout)
    shown = f", total {total} MiB" if total else (", shows 4096" if shows_cap(name, result.stdout) else "")
    return f"exit {result.returncode}{shown}"


def verify_spec() -> Spec:
    def fn(bench: Bench) -> list[Row]:
        flags = ["--simulate"] if bench.simulate else []
        result = bench.run(bench.vgpulimit("verify", *flags, "--memory", CAP_FLAG, "--cores", "30", "--json"),
                           90, "vgpulimit verify")
        try:
            document = json.loads(result.stdout)
        except json.JSONDecodeError:
            return [Row("tools", "vgpulimit verify", expect="exit 0", verdict="FAIL",
                        note=failed("vgpulimit verify", result))]
        facts = document.get("facts", {})
        checks = document.get("checks", [])
        failing = [f"{c['name']}: {c['message']}" for c in checks if c.get("status") == "fail"]
        past = (facts.get("fill") or {}).get("past_cap")
        libcuda = (facts.get("cuda") or {}).get("libcuda") or ""
        ok = (result.returncode == 0 and past == "CUDA_ERROR_OUT_OF_MEMORY"
              and (bench.simulate or "simgpu" not in libcuda))
        share = (facts.get("share") or {}).get("achieved_pct")
        passed = sum(c.get("status") == "pass" for c in checks)
        return [Row("tools", "vgpulimit verify --memory 4GiB --cores 30",
                    uncapped="(nothing to check without limits)",
                    capped=f"exit {result.returncode}; {passed} of {len(checks)} checks pass; past the cap: "
                           f"{past}; share {pct(share)} at 30",
                    expect="exit 0; past the cap CUDA_ERROR_OUT_OF_MEMORY; the real libcuda",
                    verdict=verdict(ok), note="; ".join(failing)[:300],
                    data={"rc": result.returncode, "document": document})]
    return Spec("tools.verify", "vgpulimit verify", 120, fn)


# --- 3. compute share ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Kernels:
    us: int                 # a kernel's length: 20, 1000 or 20000 (spin_timer.ptx's kernels)
    geometry: str           # "1": one block; "sm": one block per SM; "full": every SM full
    streams: int

    def text(self) -> str:
        length = f"{self.us // 1000} ms" if self.us >= 1000 else f"{self.us} us"
        shape = {"1": "1 block", "sm": "1 block per SM", "full": "full GPU"}[self.geometry]
        return f"{length}, {shape}, {self.streams} stream{'s' if self.streams > 1 else ''}"


def share_plan(quick: bool) -> tuple[list[tuple[Kernels, tuple[int, ...]]], list[Kernels]]:
    """The cells: kernels with the shares tried on them, and the kernels the
    30 + 60 pair runs."""
    if quick:
        return [(Kernels(1000, "1", 1), (30,)), (Kernels(1000, "full", 2), (30,))], [Kernels(1000, "1", 1)]
    return ([(Kernels(1000, "1", 1), (10, 30, 60, 90)),
             (Kernels(20, "1", 1), (30, 90)),
             (Kernels(20000, "1", 1), (30,)),
             (Kernels(1000, "sm", 1), (30,)),
             (Kernels(20, "sm", 1), (30,)),
             (Kernels(20000, "sm", 1), (30,)),
             (Kernels(1000, "full", 2), (30,)),
             (Kernels(20, "full", 2), (30,))],
            [Kernels(1000, "1", 1), Kernels(20000, "1", 1)])


def share_timing(bench: Bench, kernels: Kernels) -> tuple[float, float]:
    """(settle, window) seconds: 20 ms kernels need a longer window to count."""
    if bench.quick:
        return 0.5, 1.5
    return (1.0, 4.0) if kernels.us >= 20000 else (1.0, 2.5)


def spin_env(bench: Bench, kernels: Kernels) -> dict[str, str]:
    """On the simulated GPU, kernels of two streams one at a time, as 'full'
    kernels run on a GPU (simgpu does not model occupancy)."""
    if bench.simulate and kernels.streams > 1:
        return dict(bench.env, SIMGPU_CONCURRENT_KERNELS="1")
    return bench.env


def progress(output: str) -> dict[str, list[tuple[float, int]]]:
    samples: dict[str, list[tuple[float, int]]] = {}
    for line in output.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[0] == "progress":
            samples.setdefault(fields[1], []).append((float(fields[2]), int(fields[3])))
    return samples


def kernels_share(output: str, kernel_ns: float, settle_s: float) -> float | None:
    """The share (%) of the GPU's time: kernels completed x their length over
    the wall time, from the first progress report `settle_s` after the start to
    the last.  Several processes: the sum."""
    total, counted = 0.0, False
    for points in progress(output).values():
        start = points[0][0] + settle_s
        inside = [p for p in points if p[0] >= start]
        if len(inside) >= 2 and inside[-1][0] > inside[0][0]:
            (t0, n0), (t1, n1) = inside[0], inside[-1]
            total += (n1 - n0) * kernel_ns * 1e-9 / (t1 - t0)
            counted = True
    return 100 * total if counted else None


def spin_once(bench: Bench, kernels: Kernels, cores: int | None, calibrate: bool) -> tuple[str, float]:
    settle, window = share_timing(bench, kernels)
    command = bench.spin(kernels.us, settle + window, kernels.geometry, kernels.streams, int(calibrate))
    if cores is not None:
        command = bench.capped(["--cores", str(cores)], command)
    began = time.monotonic()
    result = bench.run(command, settle + window + 60, f"spin {kernels.text()}", spin_env(bench, kernels))
    if result.returncode != 0:
        raise RuntimeError(failed(f"the spin client ({kernels.text()}, cores {cores})", result))
    return result.stdout, time.monotonic() - began


def kernel_ns_of(output: str, kernels: Kernels) -> float:
    for line in output.splitlines():
        if line.startswith("kernel_ns "):
            return float(line.split()[1])
    return kernels.us * 1000.0


def share_spec(kernels: Kernels, shares: tuple[int, ...]) -> Spec:
    def fn(bench: Bench) -> list[Row]:
        settle, _ = share_timing(bench, kernels)
        free_out, _ = spin_once(bench, kernels, None, calibrate=True)
        kernel_ns = kernel_ns_of(free_out, kernels)
        free = kernels_share(free_out, kernel_ns, settle)
        rows = []
        for cores in shares:
            out, _ = spin_once(bench, kernels, cores, calibrate=False)
            got = kernels_share(out, kernel_ns, settle)
            nominal = kernels_share(out, kernels.us * 1000.0, settle)
            ok = got is not None and abs(got - cores) <= SHARE_TOLERANCE_PP
            rows.append(Row("share", f"{kernels.text()} at {cores} %",
                            uncapped=f"{pct(free)} (a kernel {kernel_ns / 1e3:.1f} us by events)",
                            capped=f"{pct(got)} (by its nominal length {pct(nominal)})",
                            expect=f"{cores} +- {SHARE_TOLERANCE_PP:g} pp", verdict=verdict(ok),
                            data={"kernel_ns": kernel_ns, "uncapped_pct": free, "capped_pct": got,
                                  "nominal_pct": nominal, "cores": cores}))
        return rows
    settle, window = (1.0, 4.0) if kernels.us >= 20000 else (1.0, 2.5)
    budget = (1 + len(shares)) * (settle + window + 8) + 30
    return Spec(f"share.{kernels.us}us.{kernels.geometry}.{kernels.streams}", f"{kernels.text()}", budget, fn)


def pair_spec(kernels: Kernels) -> Spec:
    def fn(bench: Bench) -> list[Row]:
        settle, window = share_timing(bench, kernels)
        free_out, _ = spin_once(bench, kernels, None, calibrate=True)
        kernel_ns = kernel_ns_of(free_out, kernels)
        command = bench.spin(kernels.us, settle + window, kernels.geometry, kernels.streams, 0)
        procs = [bench.start(bench.capped(["--cores", str(c)], command), spin_env(bench, kernels))
                 for c in (30, 60)]
        got = []
        for cores, proc in zip((30, 60), procs, strict=True):
            out, err = bench.finish(proc, settle + window + 60, f"the {cores} % container")
            if proc.returncode != 0:
                raise RuntimeError(failed(f"the {cores} % container", (proc.returncode, err)))
            got.append(kernels_share(out, kernel_ns, settle))
        ok = all(g is not None and abs(g - c) <= SHARE_TOLERANCE_PP for g, c in zip(got, (30, 60), strict=True))
        return [Row("share", f"{kernels.text()}: two containers at 30 % + 60 %",
                    uncapped=f"{pct(kernels_share(free_out, kernel_ns, settle))} alone",
                    capped=f"{pct(got[0])} + {pct(got[1])}",
                    expect=f"each +- {SHARE_TOLERANCE_PP:g} pp", verdict=verdict(ok),
                    data={"kernel_ns": kernel_ns, "shares_pct": got})]
    return Spec(f"share.pair.{kernels.us}us", f"{kernels.text()}: 30 % + 60 %", 60, fn)


def priority_spec() -> Spec:
    """benchmarks/priority.py's four ways, as rows: the service's latency
    alone and beside a batch job, and with priorities, judged by the goals."""
    import priority as service_bench  # benchmarks/priority.py, beside this file

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


# --- 4. real programs ---------------------------------------------------------------------------

def program_once(bench: Bench, mode: str, seconds: float, cores: int | None,
                 budget_s: float) -> dict:
    """A torch_programs.py run, uncapped or at `cores`; its JSON, with the
    power and SM clock of its measured phase where NVML gives them."""
    command = bench.python("torch_programs.py", mode, seconds)
    if cores is not None:
        command = bench.capped(["--cores", str(cores)], command)
    sampler = PowerSampler(bench.driver)
    try:
        result = bench.run(command, budget_s, f"torch_programs.py {mode} (cores {cores})")
    finally:
        power = sampler.stop(seconds)
    if result.returncode == 77:
        raise Skip(result.stdout.strip())
    if result.returncode != 0:
        raise RuntimeError(failed(f"torch_programs.py {mode} (cores {cores})", result))
    report = json.loads(result.stdout.strip().splitlines()[-1])
    bench.versions["torch"] = report.get("torch", "?")
    return dict(report, **power)


def power_text(run: dict) -> str:
    return f", {run['watts']:.0f} W, SM {run['sm_mhz']:.0f} MHz" if "watts" in run else ""


def matmul_spec() -> Spec:
    def fn(bench: Bench) -> list[Row]:
        seconds = 4.0
        first = program_once(bench, "matmul", seconds, None, 90)
        alone = program_once(bench, "matmul", seconds, 30, 90)
        command = bench.python("torch_programs.py", "matmul", seconds)
        pair = []
        procs = [(c, bench.start(bench.capped(["--cores", str(c)], command))) for c in (30, 60)]
        for cores, proc in procs:
            out, err = bench.finish(proc, 90, f"the {cores} % matmul tenant")
            if proc.returncode != 0:
                raise RuntimeError(failed(f"the {cores} % matmul tenant", (proc.returncode, err)))
            pair.append(json.loads(out.strip().splitlines()[-1]))
        last = program_once(bench, "matmul", seconds, None, 90)
        base = statistics.mean([first["tflops"], last["tflops"]])
        ratio = alone["tflops"] / base
        rows = [Row("programs", "bf16 matmul 8192^3 at 30 % alone",
                    uncapped=f"{base:.0f} TFLOP/s{power_text(first)}",
                    capped=f"{ratio:.3f} of uncapped = {ratio / 0.30:.2f}x per second of its 30 % "
                           f"({base * ratio / 0.30:.0f} TFLOP/s while it runs){power_text(alone)}",
                    expect="reported (a duty-cycled GPU runs faster)",
                    data={"uncapped": [first, last], "capped": alone, "ratio": ratio})]
        ratios = [p["tflops"] / base for p in pair]
        rows.append(Row("programs", "bf16 matmul, tenants at 30 % + 60 % at once",
                        uncapped=f"{base:.0f} TFLOP/s alone",
                        capped=f"{ratios[0]:.3f} + {ratios[1]:.3f} of uncapped",
                        expect="reported", data={"pair": pair, "ratios": ratios}))
        return rows
    return Spec("programs.matmul", "bf16 matmul", 150, fn, ("torch",))


def compile_spec() -> Spec:
    def fn(bench: Bench) -> list[Row]:
        seconds = 3.0
        free = program_once(bench, "compile", seconds, None, 150)   # the cold compile
        capped = program_once(bench, "compile", seconds, 30, 90)
        ratio = capped["calls_per_s"] / free["calls_per_s"]
        return [Row("programs", "torch.compile (Triton kernels) at 30 %",
                    uncapped=f"{free['calls_per_s']:.0f} calls/s (compiled in {free['compile_s']:.0f} s)",
                    capped=f"{ratio:.3f} of uncapped",
                    expect="reported (throttled: well under 1)", data={"uncapped": free, "capped": capped})]
    return Spec("programs.compile", "torch.compile", 200, fn, ("torch",))


def launch_spec() -> Spec:
    """Launch-bound eager PyTorch and the same ops as a CUDA graph (issue 24's
    cells on a real GPU; benchmarks/compute_share.py runs them on simgpu)."""
    def fn(bench: Bench) -> list[Row]:
        seconds = 2.5
        runs = {}
        first = program_once(bench, "launch", seconds, None, 60)
        for cores in (50, 90):
            runs[cores] = program_once(bench, "launch", seconds, cores, 60)
        last = program_once(bench, "launch", seconds, None, 60)
        rows = []
        for kind, key in (("eager", "eager_kernels_per_s"), ("graph", "graph_kernels_per_s")):
            base = statistics.mean([first[key], last[key]])
            for cores in (50, 90):
                ratio = runs[cores][key] / base
                if kind == "eager":
                    ok = ratio >= LAUNCH_BOUND_KEPT
                    expect = f">= {LAUNCH_BOUND_KEPT:.2f} of uncapped (it keeps the GPU ~11 % busy)"
                else:
                    ok = abs(ratio * 100 - cores) <= SHARE_TOLERANCE_PP
                    expect = f"{cores / 100:.2f} +- 0.02 of uncapped (GPU-bound)"
                name = ("40 small ops, eager (launch-bound)" if kind == "eager"
                        else "the same 40 ops as a CUDA graph") + f" at {cores} %"
                rows.append(Row("programs", name,
                                uncapped=f"{base / 1e3:.0f}k kernels/s",
                                capped=f"{ratio:.3f} of uncapped ({runs[cores][key] / 1e3:.0f}k/s)",
                                expect=expect, verdict=verdict(ok),
                                data={"uncapped": [first[key], last[key]], "capped": runs[cores][key],
                                      "ratio": ratio, "cores": cores}))
        return rows
    return Spec("programs.launch", "launch-bound eager and CUDA graph", 150, fn, ("torch",))


# --- 5. costs -----------------------------------------------------------------------------------

def costs_spec() -> Spec:
    def fn(bench: Bench) -> list[Row]:
        launches, pairs = (20_000, 500) if bench.simulate else (100_000, 2_000)
        rounds = 3 if bench.quick else 5
        command = [bench.c_client(), "cost", str(PTX), str(launches), str(pairs)]
        variants = {"without the shim": command,
                    "shim, no limits": bench.capped([], command),
                    "cap + share 100": bench.capped(["--memory", CAP_FLAG, "--cores", "100"], command)}
        got: dict[str, dict[str, list[float]]] = {v: {"launch": [], "alloc_free": []} for v in variants}
        names = list(variants)
        for r in range(rounds):             # interleaved, the order turned each round
            for name in names[r % 3:] + names[:r % 3]:
                result = bench.run(variants[name], 60, f"the cost client ({name})")
                if result.returncode != 0:
                    raise RuntimeError(failed(f"the cost client ({name})", result))
                for line in result.stdout.splitlines():
                    key, value = line.split()
                    got[name][key].append(float(value))
        rows = []
        for key, title in (("launch", "empty cuLaunchKernel"), ("alloc_free", "cuMemAlloc + cuMemFree, 1 MiB")):
            base = statistics.median(got["without the shim"][key])
            rows.append(Row("costs", f"{title} ({rounds} rounds, medians)",
                            uncapped=f"without the shim {cost_text(got['without the shim'][key], None)}",
                            capped=f"shim, no limits {cost_text(got['shim, no limits'][key], base)}; "
                                   f"cap + share 100 {cost_text(got['cap + share 100'][key], base)}",
                            expect="reported (the H200 showed +-15 % run to run)",
                            data={v: got[v][key] for v in variants}))
        return rows
    return Spec("costs.c", "costs from C", 120, fn)


def cost_text(values: list[float], base_ns: float | None) -> str:
    """'4.52 us (4.41-4.70), +2 %': the median, the range of the rounds, the median's change from the base."""
    def shown(ns: float) -> str:
        return f"{ns / 1e3:.2f}" if ns >= 1000 else f"{ns / 1e3:.3f}"
    median = statistics.median(values)
    change = f", {(median - base_ns) / base_ns * 100:+.0f} %" if base_ns else ""
    return f"{shown(median)} us ({shown(min(values))}-{shown(max(values))}){change}"


# --- 6. the node view ---------------------------------------------------------------------------

NODE_TENANTS = (("a", "6GiB", 1024), ("b", "10GiB", 2048))   # region, cap, MiB held


def scrape_metrics(bench: Bench, directory: Path) -> str:
    proc = bench.start(bench.vgpulimit("metrics", "--all", str(directory), "--listen", "127.0.0.1:0"))
    try:
        deadline = time.monotonic() + bench.left(30)
        url = None
        while url is None and time.monotonic() < deadline:
            line = proc.line(max(0.1, deadline - time.monotonic()), stderr=True)
            if not line:
                break
            if "serving metrics on " in line:
                url = line.split("serving metrics on ")[1].strip()
        if url is None:
            raise RuntimeError("vgpulimit metrics did not say where it serves")
        with urllib.request.urlopen(url, timeout=bench.left(20)) as response:
            return response.read().decode()
    finally:
        proc.kill()


def metric_values(text: str, name: str) -> list[tuple[str, float]]:
    out = []
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            labels, _, value = line.rpartition(" ")
            out.append((labels, float(value)))
    return out


def node_spec() -> Spec:
    def fn(bench: Bench) -> list[Row]:
        directory = bench.work / "node"
        shutil.rmtree(directory, ignore_errors=True)
        holders = {}
        for tenant, cap, held_mib in NODE_TENANTS:
            (directory / tenant).mkdir(parents=True)
            command = bench.capped(["--memory", cap, "--region", str(directory / tenant / "region")],
                                   [bench.c_client(), "fill", str(BLOCK_MIB), str(held_mib)])
            holders[tenant] = bench.start(command)
        pids = {}
        for tenant, proc in holders.items():
            line = proc.line(bench.left(60))
            if line is None:
                _, err = bench.finish(proc, 10, f"container {tenant}")
                raise RuntimeError(failed(f"container {tenant}", (proc.returncode, err)))
            pids[tenant] = json.loads(line)["pid"]
        try:
            status = bench.run(bench.vgpulimit("status", "--all", str(directory), "--json", "--interval", "0"),
                               30, "vgpulimit status --all")
            text = bench.run(bench.vgpulimit("status", "--all", str(directory), "--interval", "0"),
                             30, "vgpulimit status --all")
            listed = bench.driver.process_bytes()
            memory = bench.driver.memory()
            smi = None
            if shutil.which("nvidia-smi"):
                smi = bench.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                 "--format=csv,noheader,nounits"], 30, "nvidia-smi").stdout
            metrics = scrape_metrics(bench, directory)
        finally:
            for proc in holders.values():
                proc.send("\n")
        if status.returncode != 0:
            raise RuntimeError(failed("vgpulimit status --all", status))
        return judge_node(json.loads(status.stdout), text.stdout, pids, listed, memory, smi, metrics)
    return Spec("node.view", "node view", 90, fn)


def judge_node(status: dict, text: str, pids: dict[str, int], listed: dict[int, int], memory: dict,
               smi: str | None, metrics: str) -> list[Row]:
    per_process = {p["host_pid"]: p["used_bytes"] for region in status.get("regions", [])
                   for p in region.get("processes", []) if p.get("host_pid")}
    smi_bytes = {}
    for line in (smi or "").splitlines():
        try:
            pid, mib = line.split(",")
            smi_bytes[int(pid)] = int(mib.strip()) * MiB
        except ValueError:
            continue
    rows = []
    driver = {t: listed.get(pid) for t, pid in pids.items()}
    shown = {t: per_process.get(pid) for t, pid in pids.items()}
    ok = all(driver[t] is not None and shown[t] is not None
             and abs(driver[t] - shown[t]) <= NODE_TOLERANCE_BYTES for t in pids)
    source = "nvidia-smi" if smi else "NVML"
    outside = {t: smi_bytes.get(pid, listed.get(pid)) for t, pid in pids.items()}
    rows.append(Row("node", "per-process memory, two capped containers",
                    uncapped=f"{source}: " + ", ".join(f"{t} {size(outside[t])}" for t in pids),
                    capped="status --all: " + ", ".join(f"{t} {size(shown[t])}" for t in pids),
                    expect=f"each within {NODE_TOLERANCE_BYTES // MiB} MiB of the driver's list",
                    verdict=verdict(ok), data={"driver": driver, "status": shown, "nvidia_smi": smi_bytes,
                                               "pids": pids}))
    [gpu] = status.get("gpus") or [None]
    if gpu is None:
        rows.append(Row("node", "GPU used and the driver's reserve", verdict="FAIL",
                        note=f"status --all shows no GPU: {status.get('gpus_error')}"))
    else:
        want = (memory.get("used_bytes"), memory.get("reserved_bytes"))
        got = (gpu.get("used_bytes"), gpu.get("reserved_bytes"))
        ok = all(w is not None and g is not None and abs(w - g) <= NODE_TOLERANCE_BYTES
                 for w, g in zip(want, got, strict=True))
        rows.append(Row("node", "GPU used and the driver's reserve",
                        uncapped=f"NVML v2: used {size(want[0])}, reserved {size(want[1])} "
                                 f"(v1 used {size(memory.get('v1_used_bytes'))})",
                        capped=f"status --all: used {size(got[0])}, reserved {size(got[1])}, "
                               f"outside any cap {size(gpu.get('outside_bytes'))}",
                        expect=f"used and reserved within {NODE_TOLERANCE_BYTES // MiB} MiB of NVML v2",
                        verdict=verdict(ok), data={"nvml": memory, "gpu": gpu, "text": text}))
    used = metric_values(metrics, "vgpulimit_memory_used_bytes")
    gpu_used = metric_values(metrics, "vgpulimit_gpu_memory_used_bytes")
    reserved = metric_values(metrics, "vgpulimit_gpu_memory_reserved_bytes")
    regions = {r["region"]: sum(d["used_bytes"] or 0 for d in r.get("devices", []))
               for r in status.get("regions", [])}
    matched = all(any(f'region="{path}"' in labels and abs(value - nbytes) <= NODE_TOLERANCE_BYTES
                      for labels, value in used) for path, nbytes in regions.items())
    ok = matched and len(regions) == len(pids) and bool(gpu_used) and bool(reserved)
    rows.append(Row("node", "metrics --all, scraped once",
                    uncapped=f"{len(metrics.splitlines())} lines",
                    capped=f"{len(used)} container series, GPU used {size(gpu_used[0][1]) if gpu_used else 'absent'}, "
                           f"reserved {size(reserved[0][1]) if reserved else 'absent'}",
                    expect="both containers' memory as status shows it; the GPU's used and reserve",
                    verdict=verdict(ok), data={"metrics": metrics[-6000:]}))
    return rows


# --- the run ------------------------------------------------------------------------------------

def plan(quick: bool) -> list[Spec]:
    cells, pairs = share_plan(quick)
    specs = [memory_spec(*c) for c in MEMORY_CLIENTS]
    specs += [tool_spec(name) for name in tool_commands()] + [verify_spec()]
    specs += [share_spec(k, s) for k, s in cells] + [pair_spec(k) for k in pairs]
    specs += [priority_spec()]
    specs += [matmul_spec(), compile_spec(), launch_spec()]
    specs += [costs_spec(), node_spec()]
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
        specs = [s for s in plan(quick) if selected(s, only)]
        order = {g: i for i, g in enumerate(RUN_ORDER)}
        rows: list[Row] = []
        for spec in sorted(specs, key=lambda s: order[s.id.split(".")[0]]):
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
        for spec in plan(args.quick):
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

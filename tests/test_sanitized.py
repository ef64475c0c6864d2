"""The shim and the simulated driver built with AddressSanitizer and UBSan
(meson's b_sanitize), driven by the C clients: every look-up path, a cap, no
limit, a bad limit, NULL arguments, pinned host memory and copies, and RTLD_NEXT
interposers, with no report from either sanitizer."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import C_DIR, ROOT, MiB, base_env, compile_c, run
from helpers import sanitized_build

from vgpulimit.limits import parse_memory
from vgpulimit.region import Region

pytestmark = pytest.mark.skipif(
    shutil.which("meson") is None or shutil.which("ninja") is None,
    reason="meson and ninja are needed to build the sanitized tree (pip install meson ninja)")

SANITIZERS_SAID = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")


@pytest.fixture(scope="module")
def sanitized(tmp_path_factory) -> dict[str, Path]:
    build = tmp_path_factory.mktemp("asan-build")
    bin_dir = sanitized_build(build, "address,undefined")
    compile_c(bin_dir / "alloc_client", [C_DIR / "alloc_client.c"], f"-L{bin_dir}", "-lcuda", "-ldl")
    compile_c(bin_dir / "meminfo_null", [C_DIR / "meminfo_null.c"], f"-L{bin_dir}", "-lcuda")
    compile_c(bin_dir / "host_memory_test", [C_DIR / "host_memory_test.c"], f"-L{bin_dir}", "-lcuda")
    compile_c(bin_dir / "thread_churn", [C_DIR / "thread_churn.c"], f"-L{bin_dir}", "-lcuda", "-lpthread")
    compile_c(bin_dir / "librtld_next_base.so", [C_DIR / "rtld_next_base.c"], "-shared", "-fPIC")
    compile_c(bin_dir / "librtld_next_wrap.so", [C_DIR / "rtld_next_wrap.c"], "-shared", "-fPIC", "-ldl")
    compile_c(bin_dir / "rtld_next_main", [C_DIR / "rtld_next_main.c"], "-Wl,--no-as-needed",
              f"-L{bin_dir}", "-lrtld_next_wrap", "-lrtld_next_base", "-ldl",
              f"-Wl,-rpath,{bin_dir}")
    compile_c(bin_dir / "nvml_client", [C_DIR / "nvml_client.c"], "-ldl")
    compile_c(bin_dir / "nvml_answers", [C_DIR / "nvml_answers.c"], "-ldl")
    compile_c(bin_dir / "launch_client", [C_DIR / "launch_client.c"], "-ldl")
    compile_c(bin_dir / "share_client", [C_DIR / "share_client.c"], f"-L{bin_dir}", "-lcuda")
    compile_c(bin_dir / "smi_view", [C_DIR / "smi_view.c"], "-ldl")
    runtimes = [subprocess.run(["cc", f"-print-file-name={name}"], capture_output=True,
                               text=True, check=True).stdout.strip()
                for name in ("libasan.so", "libubsan.so")]
    return {"build": build, "bin": bin_dir, "preload": " ".join(runtimes)}


def sanitized_env(sanitized, tmp_path, shim=True, **env):
    # The sanitizer runtimes must be loaded first, before the shim.
    preload = sanitized["preload"]
    if shim:
        preload += f" {sanitized['build'] / 'shim' / 'libvgpulimit.so'}"
    return base_env(
        LD_PRELOAD=preload, LD_LIBRARY_PATH=str(sanitized["build"] / "simgpu"),
        SIMGPU_STATE=str(tmp_path / "simgpu.state"), SIMGPU_CONTEXT_OVERHEAD="0",
        ASAN_OPTIONS="detect_leaks=0", UBSAN_OPTIONS="print_stacktrace=1", **env)


def sanitized_run(sanitized, tmp_path, cmd, shim=True, **env):
    environment = sanitized_env(sanitized, tmp_path, shim, **env)
    result = run(cmd, environment, check=False)
    said = [line for line in result.stderr.splitlines() if line.startswith(SANITIZERS_SAID)]
    assert not said, result.stderr
    assert result.returncode == 0, result.stderr
    return result


@pytest.mark.parametrize("mode", ["link", "procaddr", "procaddr-ptds", "dlsym"])
def test_a_cap_on_every_path(sanitized, tmp_path, mode):
    result = sanitized_run(sanitized, tmp_path,
                           [sanitized["bin"] / "alloc_client", mode, str(256 * MiB), "5"],
                           VGPULIMIT_MEMORY="1GiB", CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp_path / "region"))
    assert "alloc 3 0\nalloc 4 2\n" in result.stdout
    assert "realloc 0" in result.stdout


def test_memory_shared_between_two_processes_under_a_cap(sanitized, tmp_path):
    """tests/test_framework_paths.py's paths, in two capped processes: legacy
    IPC, an exported VMM handle, pool IPC (the importer's pool destroyed
    before its import is freed), an interprocess event, sleep and wake with a
    double release, and host cuMem."""
    env = sanitized_env(sanitized, tmp_path, VGPULIMIT_MEMORY="1GiB",
                        CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp_path / "region"))
    procs = [subprocess.Popen([str(sanitized["bin"] / "share_client")], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]

    def ask(proc, line):
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        return proc.stdout.readline().strip()

    a, b = procs
    assert a.stdout.readline().strip() == b.stdout.readline().strip() == "ready"
    socket = tmp_path / "fd.sock"
    script = [(a, "alloc 64"), (a, "write 1"), (a, "ipc_get"), (b, "ipc_open {}"), (b, "read"), (a, "free"),
              (b, "ipc_close"), (a, "segment 8"), (a, "export"), (b, f"listen {socket}"), (a, f"send {socket}"),
              (b, "recv"), (b, "import"), (a, "sleep"), (a, "release"), (a, "wake"), (b, "sleep"),
              (a, "close_fd"), (b, "close_fd"), (a, "pool 4"), (a, "pool_export"), (b, f"listen {socket}2"),
              (a, f"send {socket}2"), (b, "recv"), (b, "pool_import"), (a, "pool_ptr"), (b, "pool_open {}"),
              (b, "pool_destroy"), (b, "free_opened"), (a, "event"), (b, "event_open {}"), (a, "record"), (b, "wait_event"),
              (a, "event_destroy"), (a, "host 4"), (a, "info")]
    answers, last = [], ""
    for proc, line in script:
        answers.append(ask(proc, line.format(last.split()[-1] if last else "")))
        last = answers[-1]
    outputs = [proc.communicate(timeout=60) for proc in procs]
    for _, err in outputs:
        said = [line for line in err.splitlines() if line.startswith(SANITIZERS_SAID)]
        assert not said, err
    assert [answer.split()[0] for answer in answers] == ["ok"] * 14 + ["err"] + ["ok"] * 21, answers


def test_pinned_host_memory_and_copies_under_a_cap(sanitized, tmp_path):
    result = sanitized_run(sanitized, tmp_path, [sanitized["bin"] / "host_memory_test"],
                           VGPULIMIT_MEMORY="1GiB", CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp_path / "region"))
    assert result.stdout.endswith(" passed, 0 failed\n")


@pytest.mark.parametrize("family", ["pointer", "array", "vmm", "pool"])
def test_threads_allocating_and_freeing_at_once(sanitized, tmp_path, family):
    result = subprocess.run([str(sanitized["bin"] / "thread_churn"), family, "8", "50", "8"],
                            input="\n\n", capture_output=True, text=True, timeout=300, check=False,
                            env=base_env(LD_PRELOAD=f"{sanitized['preload']} "
                                         f"{sanitized['build'] / 'shim' / 'libvgpulimit.so'}",
                                         LD_LIBRARY_PATH=str(sanitized["build"] / "simgpu"),
                                         SIMGPU_STATE=str(tmp_path / "simgpu.state"), SIMGPU_MEMORY="16GiB",
                                         SIMGPU_CONTEXT_OVERHEAD="0", SIMGPU_RESERVED="0",
                                         VGPULIMIT_MEMORY="1GiB",
                                         CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp_path / "region"),
                                         ASAN_OPTIONS="detect_leaks=0"))
    said = [line for line in result.stderr.splitlines() if line.startswith(SANITIZERS_SAID)]
    assert not said and result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == f"filled {1 << 30}\nfreed\n"


def test_a_debug_build_takes_timing_overrides_and_says_which_it_cannot(sanitized, tmp_path):
    """A debug build's timing table (shim/src/timings.def) is tunable by
    VGPULIMIT_TIMING_<NAME>: a whole number is taken silently, anything else
    is one line and the default kept."""
    result = sanitized_run(sanitized, tmp_path, [sanitized["bin"] / "meminfo_null"],
                           VGPULIMIT_MEMORY="1GiB", CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp_path / "region"),
                           VGPULIMIT_TIMING_PRIORITY_FLOOR_NS="20000000", VGPULIMIT_TIMING_RESUME_NS="2ms",
                           VGPULIMIT_TIMING_NO_SUCH_NS="1")
    assert "VGPULIMIT_TIMING_RESUME_NS=2ms: not a whole number of its unit; 20000000 kept" in result.stderr
    assert "VGPULIMIT_TIMING_NO_SUCH_NS=1 names no timing" in result.stderr
    assert "PRIORITY_FLOOR" not in result.stderr


def test_no_limit_bad_limit_and_null_arguments(sanitized, tmp_path):
    client = sanitized["bin"] / "alloc_client"
    assert "alloc 1 0" in sanitized_run(sanitized, tmp_path, [client, "dlsym", str(MiB), "2"]).stdout
    bad = sanitized_run(sanitized, tmp_path, [client, "link", str(MiB), "2"], VGPULIMIT_MEMORY="8GBs")
    assert "alloc 1 2" in bad.stdout and "VGPULIMIT_MEMORY" in bad.stderr
    sanitized_run(sanitized, tmp_path, [sanitized["bin"] / "meminfo_null"],
                  VGPULIMIT_MEMORY="1GiB", CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp_path / "region"))


def test_rtld_next(sanitized, tmp_path):
    # The sanitizer's own malloc comes first here, so compare with a run
    # that has the sanitizer runtimes and no shim.
    program = [sanitized["bin"] / "rtld_next_main"]
    expected = sanitized_run(sanitized, tmp_path, program, shim=False).stdout
    result = sanitized_run(sanitized, tmp_path, program, VGPULIMIT_MEMORY="1GiB",
                           CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp_path / "region"))
    assert result.stdout == expected
    assert result.stdout.startswith("whoami 101\n")


def test_nvml_views(sanitized, tmp_path):
    """Every NVML hook, on two devices of which the container is given the
    second, with one of its processes holding memory there."""
    region_path = tmp_path / "region"
    with Region.create(region_path, {0: parse_memory("1GiB")}) as region:
        slot = region.attach(os.getpid(), os.getpid())
        assert region.reserve(slot, 0, 256 * MiB)
        result = sanitized_run(sanitized, tmp_path, [sanitized["bin"] / "nvml_client"],
                               SIMGPU_DEVICES="2", CUDA_VISIBLE_DEVICES="1",
                               VGPULIMIT_REGION=str(region_path))
    lines = result.stdout.splitlines()
    assert "count 0 1" in lines
    assert f"memory 0 {1024 * MiB} {256 * MiB} {768 * MiB}" in lines
    assert f"procs 0 nvmlDeviceGetComputeRunningProcesses_v3 0 1 {os.getpid()}:{256 * MiB}" in lines


@pytest.mark.parametrize("path", ["kernel", "ptsz", "ex", "cooperative", "graph", "capture"])
def test_launches_drawing_from_a_compute_share(sanitized, tmp_path, path):
    """Every launch path through the throttle and simgpu's timeline: 1 ms
    kernels at 50 % for half a second."""
    result = sanitized_run(sanitized, tmp_path, [sanitized["bin"] / "launch_client", path, "1000", "0.5"],
                           VGPULIMIT_CORES="50", CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp_path / "region"))
    launched = int(result.stdout.split("done ")[1].split()[1])
    assert 0 < launched < 450  # uncapped, about 500 would run


def nvml_hooks() -> list[str]:
    """The NVML functions the shim hooks: its one table's NVML_HOOK rows."""
    table = (ROOT / "shim" / "src" / "hooks.def").read_text()
    return re.findall(r"^NVML_HOOK\((\w+),", table, re.MULTILINE)


# What NVML's documentation lets each of these functions answer, by code.
NVML_CODES = {"SUCCESS": 0, "UNINITIALIZED": 1, "INVALID_ARGUMENT": 2, "NOT_SUPPORTED": 3,
              "NO_PERMISSION": 4, "NOT_FOUND": 6, "INSUFFICIENT_SIZE": 7, "FUNCTION_NOT_FOUND": 13,
              "UNKNOWN": 999}
# Each error alone; the size protocol's answers in the orders a driver gives
# them (a count, then NOT_FOUND or a shorter list), and a count that never fits.
NVML_ANSWERS = ["NOT_FOUND", "NOT_SUPPORTED", "NO_PERMISSION", "UNINITIALIZED", "FUNCTION_NOT_FOUND",
                "INSUFFICIENT_SIZE=72;NOT_FOUND", "INSUFFICIENT_SIZE=3;real", "INSUFFICIENT_SIZE=100000"]


def answered(stdout: str) -> dict[str, list[int]]:
    """nvml_answers' lines: function -> the codes it got (one, or the size
    query's and the call's)."""
    seen = {}
    for line in stdout.splitlines():
        name, *codes = line.split()
        if name.startswith("nvml"):
            seen[name] = [int(c) for c in codes[:2]]
    return seen


@pytest.mark.parametrize("answer", NVML_ANSWERS)
def test_every_nvml_hook_through_every_answer(sanitized, tmp_path, answer):
    """Each hooked NVML function in turn answers `answer` (simgpu's
    SIMGPU_NVML_ANSWER), in a capped container one of whose processes holds
    memory: the client calling every hook with exact-size buffers runs to its
    end with no sanitizer report, and every call answers a code NVML
    documents; a plain error is passed on as the driver's, never turned into
    invented figures."""
    region_path = tmp_path / "region"
    with Region.create(region_path, {0: parse_memory("1GiB")}) as region:
        slot = region.attach(os.getpid(), os.getpid())
        assert region.reserve(slot, 0, 256 * MiB)
        for hook in nvml_hooks():
            result = sanitized_run(sanitized, tmp_path, [sanitized["bin"] / "nvml_answers", "init"],
                                   VGPULIMIT_REGION=str(region_path),
                                   SIMGPU_NVML_ANSWER=f"{hook}:{answer}")
            seen = answered(result.stdout)
            assert set(seen) == set(nvml_hooks()), f"{hook}: {result.stdout}"
            for name, codes in seen.items():
                assert set(codes) <= set(NVML_CODES.values()), f"{hook}:{answer}: {name} {codes}"
            if answer in NVML_CODES:
                assert seen[hook][0] == NVML_CODES[answer], f"{hook}:{answer}: {seen[hook]}"


def test_every_nvml_hook_before_nvml_is_initialised(sanitized, tmp_path):
    """A process with no CUDA that never initialises NVML calls every hook:
    none crashes, each answers UNINITIALIZED or another documented code."""
    region_path = tmp_path / "region"
    Region.create(region_path, {0: parse_memory("1GiB")}).close()
    result = sanitized_run(sanitized, tmp_path, [sanitized["bin"] / "nvml_answers", "uninit"],
                           VGPULIMIT_REGION=str(region_path))
    seen = answered(result.stdout)
    assert set(seen) == set(nvml_hooks())
    assert all(set(codes) <= set(NVML_CODES.values()) for codes in seen.values()), seen
    assert seen["nvmlDeviceGetCount_v2"] == [NVML_CODES["UNINITIALIZED"]]
@pytest.mark.parametrize("path, kernel_us, cpu_us", [("kernel", "2", "10"), ("streams2", "2", "10"),
                                                     ("graph40", "1", "0")])
def test_short_and_launch_bound_work_under_a_compute_share(sanitized, tmp_path, path, kernel_us, cpu_us):
    """Launches timed alone on an idle stream (2 us kernels with 10 us of CPU
    work after each), on two streams, and graphs of 40 kernels, at 10 %."""
    result = sanitized_run(sanitized, tmp_path,
                           [sanitized["bin"] / "launch_client", path, kernel_us, "0.5", cpu_us],
                           VGPULIMIT_CORES="10", VGPULIMIT_REGION=str(tmp_path / "region"))
    assert int(result.stdout.split("done ")[1].split()[1]) > 0


def test_priorities_between_two_containers(sanitized, tmp_path):
    """A low container's launch loop beside a high one's, each with a row in
    one board: the high one writes its beacon at every launch, the low one
    reads it and waits."""
    from vgpulimit import board

    regions = {}
    for name, priority in (("low", "low"), ("high", "high")):
        path = tmp_path / f"{name}.region"
        with Region.create(path, [None] * 16, [0] * 16) as region:
            row = board.join(str(tmp_path / "priority.board"), priority, str(path))
            region.set_priority(priority, str(tmp_path / "priority.board"), row.row, row.key)
        regions[name] = path
    client = sanitized["bin"] / "launch_client"
    low_env = base_env(
        LD_PRELOAD=f"{sanitized['preload']} {sanitized['build'] / 'shim' / 'libvgpulimit.so'}",
        LD_LIBRARY_PATH=str(sanitized["build"] / "simgpu"), SIMGPU_STATE=str(tmp_path / "simgpu.state"),
        SIMGPU_CONTEXT_OVERHEAD="0", ASAN_OPTIONS="detect_leaks=0", UBSAN_OPTIONS="print_stacktrace=1",
        VGPULIMIT_REGION=str(regions["low"]))
    low = subprocess.Popen([client, "kernel", "1000", "2"], env=low_env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        sanitized_run(sanitized, tmp_path, [client, "kernel", "1000", "1"], VGPULIMIT_REGION=str(regions["high"]))
    finally:
        _, err = low.communicate(timeout=60)
    assert not [line for line in err.splitlines() if line.startswith(SANITIZERS_SAID)], err
    assert low.returncode == 0, err
    with Region.open(regions["low"]) as region:
        assert region.snapshot(all_devices=True).devices[0].yielded_ns > 0


def test_a_gpu_in_mig_mode_through_nvml_and_the_driver(sanitized, tmp_path):
    """simgpu's MIG paths: the layout, a process on the first MIG device and
    nvidia-smi's MIG table with the process in it."""
    mig = {"SIMGPU_PROFILE": "h100-80gb", "SIMGPU_MIG": "1g.10gb@6,3g.40gb,2g.20gb",
           "SIMGPU_KERNEL_US": "1000"}
    sanitized_run(sanitized, tmp_path, [sanitized["bin"] / "launch_client", "kernel", "1000", "0.1"],
                  shim=False, **mig)
    out = sanitized_run(sanitized, tmp_path, [sanitized["bin"] / "smi_view"], shim=False, **mig).stdout
    assert "MIG 0/1:  GI 1  CI 0  Memory-Usage 0MiB / 40448MiB  SM 60" in out


def elastic_region(tmp_path: Path, name: str, cap: str, request: str, wait: str | None = None) -> Path:
    """A region with a row for elastic memory in the board beside it, as `vgpulimit run` makes them."""
    from vgpulimit import board
    from vgpulimit.limits import parse_wait
    from vgpulimit.request import Limits, Setting

    limits = Limits(memory={0: Setting(cap, "--memory", parse_memory(cap))},
                    request={0: Setting(request, "--memory-request", parse_memory(request))},
                    memory_wait=None if wait is None else Setting(wait, "--memory-wait", parse_wait(wait)))
    path, board_path = tmp_path / f"{name}.region", str(tmp_path / "priority.board")
    with Region.create(path, limits.memory_per_device(), [0] * 16, request=limits.request_per_device(),
                       memory_wait_ns=limits.memory_wait_ns()) as region:
        row = board.join(board_path, None, str(path))
        board.set_memory(board_path, str(path), limits)
        region.set_board_row(board_path, row.row, row.key)
    return path


def test_borrowing_and_waiting_between_two_containers(sanitized, tmp_path):
    """A holder borrows half of the GPU; a second container's allocation
    within its request waits for the full GPU and gets the memory the holder
    frees; its next one, past its request, waits and times out."""
    bin_dir = sanitized["bin"]
    client = compile_c(bin_dir / "elastic_client", [C_DIR / "elastic_client.c"], f"-L{bin_dir}", "-lcuda")
    holder_region = elastic_region(tmp_path, "holder", "16GiB", "8GiB")
    waiter_region = elastic_region(tmp_path, "waiter", "2GiB", "1GiB", "1s")
    env = base_env(LD_PRELOAD=f"{sanitized['preload']} {sanitized['build'] / 'shim' / 'libvgpulimit.so'}",
                   LD_LIBRARY_PATH=str(sanitized["build"] / "simgpu"), SIMGPU_STATE=str(tmp_path / "simgpu.state"),
                   SIMGPU_MEMORY="16GiB", SIMGPU_CONTEXT_OVERHEAD="0", SIMGPU_RESERVED="0",
                   ASAN_OPTIONS="detect_leaks=0", UBSAN_OPTIONS="print_stacktrace=1")
    procs = {}
    for name, region in (("holder", holder_region), ("waiter", waiter_region)):
        procs[name] = subprocess.Popen([client], env=dict(env, VGPULIMIT_REGION=str(region)), stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert procs[name].stdout.readline() == "ready\n"

        def ask(line, proc=procs[name]):
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            return proc.stdout.readline().split()

        procs[name].ask = ask
        if name == "holder":
            assert [ask(f"alloc {1 << 30}")[2] for _ in range(16)] == ["0"] * 16
    holder, waiter = procs["holder"], procs["waiter"]
    waiter.stdin.write(f"alloc {1 << 30}\n")
    waiter.stdin.flush()
    for _ in range(20000):
        with Region.open(waiter_region) as region:
            if region.snapshot().devices[0].waiting:
                break
    assert holder.ask("free 15")[:3] == ["free", "15", "0"]
    assert waiter.stdout.readline().split()[1:3] == ["0", "0"]
    assert waiter.ask(f"alloc {1 << 30}")[1:3] == ["-1", "2"]
    for proc in procs.values():
        _, err = proc.communicate("exit\n", timeout=60)
        assert not [line for line in err.splitlines() if line.startswith(SANITIZERS_SAID)], err
        assert proc.returncode == 0, err
    with Region.open(waiter_region) as region:
        dev = region.snapshot().devices[0]
    assert (dev.wait_timeouts, dev.borrow_refusals, dev.waiting) == (1, 1, 0)

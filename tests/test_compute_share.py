"""The compute share: `vgpulimit run --cores N` holds a container to N % of the
GPU's time, on every launch path, with one budget for all its processes, and
`vgpulimit set --cores` changes it while it runs.  The share is what the
simulated GPU ran: each process of tests/c/launch_client.c reports how many of
its kernels (of known length) have completed.  Bounds are broad (the benchmark,
benchmarks/compute_share.py, measures accuracy); nothing here times the machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from conftest import C_DIR, SHIM_SRC, TESTS, base_env, compile_c, run, vgpulimit_cmd
from helpers import status_json

CLIENTS = TESTS / "clients"
KERNEL_US = 1000


class Container:
    """`vgpulimit run --simulate --cores PCT -- CMD` in the background, its
    output collected line by line."""

    def __init__(self, env, cores: int | None, command: list[str], region: Path | None = None,
                 policy: str | None = None, flags: Sequence[str] = ()):
        flags = [*flags, *(["--cores", str(cores)] if cores is not None else [])]
        flags += ["--cores-policy", policy] if policy is not None else []
        flags += ["--region", str(region)] if region is not None else []
        self.proc = subprocess.Popen(vgpulimit_cmd("run", "--simulate", *flags, "--", *map(str, command)),
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def pids(self) -> list[int]:
        return sorted({int(line.split()[1]) for line in list(self.lines) if line.startswith("progress ")})

    def finish(self, timeout: float = 60) -> str:
        try:
            err = self.proc.stderr.read()
            self.proc.wait(timeout)
        finally:
            self.proc.kill()
        self._reader.join(5)
        assert self.proc.returncode == 0, f"exit {self.proc.returncode}: {err}"
        return "".join(self.lines)


def loops(client: Path, processes: int, path: str = "kernel", seconds: float = 4.2,
          kernel_us: int = KERNEL_US, queue_us: int | None = None) -> list[str]:
    """A shell command running `processes` launch loops at once (each with
    `queue_us` of kernels in flight per batch, launch_client's QUEUE_US)."""
    loop = f"{client} {path} {kernel_us} {seconds}" + (f" 0 {queue_us}" if queue_us else "")
    return ["sh", "-c", " & ".join([loop] * processes) + " & wait"]


def progress(output: str) -> dict[int, list[tuple[float, int]]]:
    samples: dict[int, list[tuple[float, int]]] = {}
    for line in output.splitlines():
        fields = line.split()
        if len(fields) == 4 and fields[0] == "progress":
            samples.setdefault(int(fields[1]), []).append((float(fields[2]), int(fields[3])))
    return samples


def share(output: str, start: float, end: float, kernel_us: int = KERNEL_US) -> float:
    """The container's share (%) of the GPU between two CLOCK_MONOTONIC times."""
    total = 0.0
    for points in progress(output).values():
        inside = [p for p in points if start <= p[0] <= end]
        if len(inside) >= 2:
            (t0, n0), (t1, n1) = inside[0], inside[-1]
            total += (n1 - n0) * kernel_us * 1e-6 / (t1 - t0)
    return 100 * total


@pytest.mark.slow
def test_a_quarter_share_holds_over_three_seconds(sim_env, launch_client):
    started = time.monotonic()
    output = Container(sim_env, 25, loops(launch_client, 1)).finish()
    assert 15 <= share(output, started + 1, started + 4) <= 35


@pytest.mark.slow
def test_four_processes_draw_from_one_budget(sim_env, launch_client):
    started = time.monotonic()
    output = Container(sim_env, 25, loops(launch_client, 4)).finish()
    assert len(progress(output)) == 4
    assert 15 <= share(output, started + 1, started + 4) <= 35


@pytest.mark.slow
def test_a_nested_run_draws_from_the_outer_share(sim_env, launch_client):
    """The nested run asks for 80 %; its launches draw from the outer 25 % too."""
    started = time.monotonic()
    nested = [*vgpulimit_cmd("run", "--simulate", "--cores", "80", "--"), *loops(launch_client, 2)]
    output = Container(sim_env, 25, nested).finish()
    assert len(progress(output)) == 2
    assert 15 <= share(output, started + 1, started + 4) <= 35


@pytest.mark.slow
def test_every_launch_path_is_throttled(tmp_path, sim_env, launch_client):
    """Each path on a simulated GPU of its own, all at once; uncapped, each
    loop would keep its GPU busy all the time."""
    shares = {}
    for path in ["ptsz", "ex", "cooperative", "graph", "capture"]:
        started = time.monotonic()
        env = dict(sim_env, SIMGPU_STATE=str(tmp_path / f"{path}.state"))
        output = Container(env, 25, loops(launch_client, 1, path, seconds=3.2)).finish()
        shares[path] = share(output, started + 1, started + 3.2)
    assert all(15 <= s <= 35 for s in shares.values()), shares


@pytest.mark.slow
def test_two_streams_hold_the_share(sim_env, launch_client):
    """One process launching on two streams at 50 %: the share is the time
    either stream's kernels held the GPU, counted once (kernels one at a time
    here, so that the kernels completed tell the GPU time).  Each stream's
    kernels also wait behind the other's, which is not charged."""
    started = time.monotonic()
    env = dict(sim_env, SIMGPU_CONCURRENT_KERNELS="1")
    output = Container(env, 50, loops(launch_client, 1, "streams2")).finish()
    assert 40 <= share(output, started + 1, started + 4) <= 60


@pytest.mark.slow
def test_two_containers_each_get_their_share(tmp_path, sim_env, launch_client):
    """Containers at 30 % and 60 % on one device, time-sliced: each run's span
    holds the other's slices, and neither is charged for them."""
    started = time.monotonic()
    pair = [Container(sim_env, cores, loops(launch_client, 1)) for cores in (30, 60)]
    shares = [share(c.finish(), started + 1, started + 4) for c in pair]
    assert 20 <= shares[0] <= 40 and 50 <= shares[1] <= 70, shares


def driver_calls(calls_file: Path) -> dict[str, int]:
    """The calls one process made to simgpu (SIMGPU_CALLS), by entry point."""
    [line] = calls_file.read_text().splitlines()
    return json.loads(line)["by_name"]


def test_without_a_share_a_launch_adds_no_driver_call(tmp_path, sim_env, launch_client):
    """simgpu counts each process's calls: under the shim with no share, the
    loop's thousands of launches cost nothing but the launches themselves (and
    the loop's own event per batch), plus a few calls to set up."""
    calls_file = tmp_path / "calls.jsonl"
    got = run(vgpulimit_cmd("run", "--simulate", "--", launch_client, "kernel", "0", "0.5"),
              dict(sim_env, SIMGPU_CALLS=str(calls_file))).stdout
    launched = int(got.split("done ")[1].split()[1])
    calls = driver_calls(calls_file)
    assert calls["cuLaunchKernel"] == launched >= 1000
    loops_own = {"cuLaunchKernel", "cuEventRecord", "cuEventSynchronize"}
    assert sum(n for name, n in calls.items() if name not in loops_own) < 50, calls
    assert calls["cuEventRecord"] <= launched // 256 + 1, calls


def wait_for(condition, what: str, deadline_s: float = 20) -> None:
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {deadline_s} s"
        time.sleep(0.05)


@pytest.mark.parametrize("failing", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_launch_whose_capture_state_cannot_be_read_is_charged(tmp_path, sim_env, launch_client, failing):
    """Launches into a stream being captured run nothing and are not charged
    (the graph is, when launched); where the driver fails every
    cuStreamIsCapturing (SIMGPU_FAIL) they are charged as ordinary ones,
    never waved through: 25 % of the GPU for 1000 launches of 1 ms, the
    container's launches wait."""
    region = tmp_path / "region"
    env = dict(sim_env, SIMGPU_FAIL="cuStreamIsCapturing") if failing else sim_env
    output = Container(env, 25, [launch_client, "captured", KERNEL_US, 8], region=region).finish()
    assert " 1000 " in output.split("done ")[1], output
    [device] = [d for d in status_json(sim_env, region)["devices"] if d["index"] == 0]
    if failing:
        assert device["busy_ns"] >= 900 * KERNEL_US * 1000 and device["throttled_ns"] > 0, device
    else:
        assert device["busy_ns"] == 0 and device["throttled_ns"] == 0, device


@pytest.mark.slow
def test_killing_one_of_four_processes_does_not_stall_the_others(sim_env, launch_client):
    started = time.monotonic()
    container = Container(sim_env, 50, loops(launch_client, 4, seconds=4.5))
    wait_for(lambda: len([p for p in progress("".join(container.lines)).values() if p[-1][1] > 0]) == 4,
             "completed launches from all four processes")
    victim = container.pids()[0]
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    output = container.finish()
    survivors = {pid: points for pid, points in progress(output).items() if pid != victim}
    assert len(survivors) == 3
    for points in survivors.values():
        after = [n for t, n in points if t > killed_at + 0.5]
        assert after and after[-1] > after[0], "a survivor stopped launching"
    assert 30 <= share(output, killed_at + 0.5, started + 4.5) <= 70


@pytest.mark.slow
def test_a_live_change_takes_effect_within_a_second(tmp_path, sim_env, launch_client):
    region = tmp_path / "region"
    started = time.monotonic()
    container = Container(sim_env, 25, loops(launch_client, 2, seconds=5.5), region=region)
    wait_for(lambda: any(t >= started + 2.5 for points in progress("".join(container.lines)).values()
                         for t, _ in points), "progress reported 2.5 s after the start")
    run(vgpulimit_cmd("set", "--cores", "75", "--region", region), sim_env)
    changed_at = time.monotonic()
    status = status_json(sim_env, region)
    output = container.finish()
    assert 15 <= share(output, started + 1, started + 2.5) <= 35
    assert 60 <= share(output, changed_at + 1, started + 5.5) <= 90
    [device] = [d for d in status["devices"] if d["index"] == 0]
    assert device["cores_pct"] == 75
    assert device["busy_ns"] > 0 and device["throttled_ns"] > 0


@pytest.mark.slow
def test_status_shows_the_cap_and_the_measured_share(tmp_path, sim_env, launch_client):
    region = tmp_path / "region"
    container = Container(sim_env, 40, loops(launch_client, 1, seconds=3.5), region=region)

    def busy() -> bool:
        status = run(vgpulimit_cmd("status", "--json", "--region", region), sim_env, check=False)
        return status.returncode == 0 and any(d["busy_ns"] > 0 for d in json.loads(status.stdout)["devices"])

    wait_for(busy, "GPU time measured in the region")
    status = run(vgpulimit_cmd("status", "--json", "--interval", "1", "--region", region), sim_env)
    text = run(vgpulimit_cmd("status", "--region", region), sim_env).stdout
    container.finish()
    [device] = [d for d in json.loads(status.stdout)["devices"] if d["index"] == 0]
    assert device["cores_pct"] == 40
    assert 25 <= device["compute_share_pct"] <= 55
    assert "40%" in text


def test_a_release_build_keeps_its_timings_whatever_the_environment_says(sim_env):
    """The share's constants are its strength: a tenant's VGPULIMIT_TIMING_*
    variables change nothing in the installed (release) shim, which says so."""
    result = run(vgpulimit_cmd("run", "--simulate", "--cores", "30", "--", "true"),
                 dict(sim_env, VGPULIMIT_TIMING_BUDGET_WINDOW_NS="100000000000"))
    assert ("VGPULIMIT_TIMING_BUDGET_WINDOW_NS ignored: this build's timings are fixed (build with "
            "-Dtunable_timings=true to change them)") in result.stderr


def test_a_bad_cores_flag_names_itself_and_the_accepted_forms(sim_env):
    result = run(vgpulimit_cmd("run", "--simulate", "--cores", "150", "--", "true"), sim_env, check=False)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert "--cores" in line and "150" in line and "30%" in line
    result = run(vgpulimit_cmd("set", "--cores-device", "x=50", "--region", "/nonexistent"), sim_env,
                 check=False)
    assert result.returncode == 2 and "--cores-device" in result.stderr


@pytest.mark.slow
def test_a_numba_kernel_loop_is_throttled(tmp_path, sim_env):
    """A real compiler and runtime (numba-cuda) under `vgpulimit run --cores 25`:
    its loop of 1 ms kernels takes about four times as long as uncapped."""
    env = dict(sim_env, SIMGPU_KERNEL_US=str(KERNEL_US), NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS="0")
    command = [sys.executable, CLIENTS / "numba_loop.py", "300"]
    uncapped = run(vgpulimit_cmd("run", "--simulate", "--", *command), env, check=False, timeout=300)
    if uncapped.returncode == 77:
        pytest.skip(uncapped.stdout.strip())
    assert uncapped.returncode == 0, uncapped.stderr
    capped = run(vgpulimit_cmd("run", "--simulate", "--cores", "25", "--", *command), env, timeout=300)
    free_s = json.loads(uncapped.stdout.splitlines()[-1])["seconds"]
    capped_s = json.loads(capped.stdout.splitlines()[-1])["seconds"]
    assert free_s >= 0.3  # 300 kernels of 1 ms ran on the simulated GPU
    assert capped_s >= 2 * free_s, (free_s, capped_s)


@pytest.mark.slow
def test_two_containers_of_long_kernels_each_get_their_share(tmp_path, sim_env, launch_client):
    """As above with 20 ms kernels, ten times simgpu's time slice: each kernel
    is preempted while the other container has work, and resumes later."""
    started = time.monotonic()
    pair = [Container(sim_env, cores, loops(launch_client, 1, seconds=5, kernel_us=20000)) for cores in (30, 60)]
    shares = [share(c.finish(), started + 1.5, started + 5, kernel_us=20000) for c in pair]
    assert 20 <= shares[0] <= 40 and 50 <= shares[1] <= 70, shares


@pytest.mark.slow
def test_four_processes_of_long_kernels_start_without_a_debt(sim_env, launch_client):
    """Four processes of 20 ms kernels at 10 %, started together: each one's
    first kernels, not measured yet, wait behind the others' time slices, and
    that wait is not charged, so over the whole run, its start included, the
    container gets its share (it once got under half of it).  (Its first
    kernels, of unknown cost, run ahead of the share and are paid for in the
    seconds after: a window after the start would see that repayment.)"""
    output = Container(sim_env, 10, loops(launch_client, 4, seconds=6, kernel_us=20000)).finish()
    done = [line.split() for line in output.splitlines() if line.startswith("done ")]
    assert len(done) == 4
    ran_s = sum(int(fields[2]) for fields in done) * 20000e-6
    assert 7 <= 100 * ran_s / max(float(fields[3]) for fields in done) <= 13, done


def launch_bound(tmp_path, sim_env, launch_client, path: str) -> tuple[dict, int]:
    """A program launching 2 us kernels with 10 us of CPU work after each (its
    GPU idle most of the time: simgpu's launch takes 4 us of CPU) under
    --cores 50, on `path` (one stream, or two in turn): the region's figures
    for its device, and its kernels' time (completed launches times 2 us, as
    simgpu ran them)."""
    region = tmp_path / "region"
    output = Container(sim_env, 50, [launch_client, path, 2, 2, 10], region=region).finish()
    launched = int(output.split("done ")[1].split()[1])
    assert launched >= 1000
    [device] = [d for d in status_json(sim_env, region)["devices"] if d["index"] == 0]
    return device, launched * 2000


@pytest.mark.slow
@pytest.mark.parametrize("path", ["kernel", "streams2"])
def test_a_launch_bound_program_is_not_charged_the_idle_gaps_nor_throttled(tmp_path, sim_env, launch_client,
                                                                           path):
    """An event pair around a launch spans the GPU's idle time while the
    launch was made, and on two streams runs of launches span it between them
    (it was charged four times its kernels' time and throttled): what the
    region charges is at most a quarter over its kernels' time, and no launch
    waits for budget."""
    device, kernels_ns = launch_bound(tmp_path, sim_env, launch_client, path)
    assert device["busy_ns"] <= 1.25 * kernels_ns, (device, kernels_ns)
    assert device["throttled_ns"] == 0, device


@pytest.mark.slow
@pytest.mark.parametrize("path", ["kernel", "streams2"])
def test_a_launch_bound_program_is_charged_most_of_its_kernels(tmp_path, sim_env, launch_client, path):
    """At least nine tenths of its kernels' time, on one stream and on two,
    on a busy machine too.  A thread descheduled in a launch, after the
    driver queued the kernel, made the kernel look short from the launch's
    return: such a program was charged 0.72-0.75 of its kernels' time on one
    stream and 0.3-0.47 on two in some runs on a busy 2-core machine (a group
    of one launch timed alone taught its cost past the median of three)."""
    device, kernels_ns = launch_bound(tmp_path, sim_env, launch_client, path)
    assert 0.9 * kernels_ns <= device["busy_ns"], (device, kernels_ns)


def test_the_cost_model_alone_under_sanitizers(tmp_path):
    binary = compile_c(tmp_path / "cost_model_test", [C_DIR / "cost_model_test.c", SHIM_SRC / "cost_model.c"],
                       "-fsanitize=address,undefined", "-fno-sanitize-recover=all")
    result = run([binary], base_env(), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.endswith(" passed, 0 failed\n")


def test_the_measurement_alone_with_a_fake_gpu_under_sanitizers(tmp_path):
    """busy_time.c's runs and harvests, driven through a fake event source
    (tests/c/busy_time_test.c), with the cost model and the log it uses."""
    binary = compile_c(tmp_path / "busy_time_test", [C_DIR / "busy_time_test.c", SHIM_SRC / "busy_time.c",
                                                     SHIM_SRC / "cost_model.c", SHIM_SRC / "log.c"],
                       "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-lpthread")
    result = run([binary], base_env(), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.endswith(" passed, 0 failed\n")


def test_the_budget_alone_under_sanitizers(tmp_path):
    binary = compile_c(tmp_path / "throttle_test", [C_DIR / "throttle_test.c", SHIM_SRC / "throttle.c"],
                       "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-lpthread")
    result = run([binary], base_env(), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.endswith(" passed, 0 failed\n")


@pytest.mark.parametrize("switch", ["push", "set"])
def test_launches_are_charged_to_the_device_of_the_context_current_then(tmp_path, sim_env, switch):
    """One thread switches between two devices' contexts (push/pop, or set):
    each round runs three 1 ms kernels on device 1 and one on device 0, so
    device 1's measured GPU time is about three times device 0's."""
    client = compile_c(tmp_path / "context_switch", [C_DIR / "context_switch.c"], "-ldl")
    region = tmp_path / "region"
    env = dict(sim_env, SIMGPU_DEVICES="2")
    run(vgpulimit_cmd("run", "--simulate", "--cores", "90", "--region", region, "--", client, switch, "300"),
        env)
    status = status_json(env, region)
    busy = {d["index"]: d["busy_ns"] for d in status["devices"]}
    assert busy[0] > 0 and busy[1] > 0, busy
    assert 2 <= busy[1] / busy[0] <= 4.5, busy


@pytest.mark.slow
def test_a_borrowing_container_runs_past_its_share_until_a_neighbour_wants_its_own(tmp_path, sim_env,
                                                                                   launch_client):
    """--cores-policy borrow: alone on the device the container runs well past
    its 30 %; once a hard-capped neighbour at 60 % launches, it is back near
    its share and the neighbour near its own."""
    started = time.monotonic()
    borrower = Container(sim_env, 30, loops(launch_client, 1, seconds=6.5), policy="borrow")
    wait_for(lambda: any(t >= started + 2.5 for points in progress("".join(borrower.lines)).values()
                         for t, _ in points), "progress reported 2.5 s after the start")
    neighbour_at = time.monotonic()
    neighbour = Container(sim_env, 60, loops(launch_client, 1, seconds=3.5))
    alone = share("".join(borrower.lines), started + 1, neighbour_at)
    output, other = borrower.finish(), neighbour.finish()
    assert alone >= 60
    assert 15 <= share(output, neighbour_at + 1.5, neighbour_at + 3.5) <= 45
    assert share(other, neighbour_at + 1.5, neighbour_at + 3.5) >= 45


@pytest.mark.slow
@pytest.mark.parametrize("variable, value", [("VGPULIMIT_CORES_POLICY", "none"),
                                             ("GPU_CORE_UTILIZATION_POLICY", "DISABLE")])
def test_policy_none_lifts_the_share(tmp_path, sim_env, launch_client, variable, value):
    """No launch waits for budget, and the loop runs well past its 20 %
    (about 95 % here; less where a busy CPU starves the loop)."""
    region = tmp_path / "region"
    container = Container(dict(sim_env, **{variable: value}), 20, loops(launch_client, 1, seconds=2.5),
                          region=region)
    output = container.finish()
    start = min(t for points in progress(output).values() for t, _ in points)
    [device] = [d for d in status_json(sim_env, region)["devices"] if d["index"] == 0]
    assert device["throttled_ns"] == 0, device
    assert share(output, start + 0.5, start + 2.4) >= 40


def test_a_bad_cores_policy_names_itself_and_the_accepted_forms(sim_env):
    result = run(vgpulimit_cmd("run", "--simulate", "--cores-policy", "lend", "--", "true"), sim_env, check=False)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert "--cores-policy" in line and "lend" in line and "borrow" in line
    result = run(vgpulimit_cmd("run", "--simulate", "--", "true"), dict(sim_env, VGPULIMIT_CORES_POLICY="lend"),
                 check=False)
    assert result.returncode != 0
    [line] = result.stderr.strip().splitlines()
    assert "VGPULIMIT_CORES_POLICY" in line and "lend" in line and "borrow" in line


def test_the_policy_shows_in_status_and_set_changes_it(tmp_path, sim_env, launch_client):
    region = tmp_path / "region"
    run(vgpulimit_cmd("run", "--simulate", "--cores", "30", "--cores-policy", "borrow", "--region", region,
                      "--", launch_client, "kernel", "1000", "0.3"), sim_env)
    shown = run(vgpulimit_cmd("status", "--json", "--region", region), sim_env).stdout
    [device] = [d for d in json.loads(shown)["devices"] if d["index"] == 0]
    assert (device["cores_pct"], device["cores_policy"]) == (30, "borrow")
    assert "30% borrow" in run(vgpulimit_cmd("status", "--region", region), sim_env).stdout
    run(vgpulimit_cmd("set", "--cores-policy", "FORCE", "--region", region), sim_env)
    [device] = [d for d in status_json(sim_env, region)["devices"] if d["index"] == 0]
    assert device["cores_policy"] == "hard"


# Calls only the launch loop makes (its setting up), never the shim.
LOOPS_SETUP = ("cuGetProcAddress_v2", "cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
               "cuModuleLoadData", "cuModuleGetFunction", "cuStreamCreate", "cuStreamSynchronize")


@pytest.mark.parametrize("kernel_us, seconds, cpu_us, least, per_launch",
                         [pytest.param(1000, "2", 0, 500, 0.25, marks=pytest.mark.slow), (2, "1", 10, 2000, 0.25),
                          pytest.param(20000, "6", 0, 150, 4, marks=pytest.mark.slow)])
def test_a_capped_launch_seldom_asks_the_driver_anything(tmp_path, sim_env, launch_client, kernel_us, seconds,
                                                         cpu_us, least, per_launch):
    """At 90 % the shim measures samples of launches, not every launch, and
    asks for the current context only now and then (the thread's is kept
    until a context call changes it): under a quarter of an added driver call
    per launch, with 1 ms kernels and in a launch-bound program (2 us kernels,
    10 us of CPU work after each), the shim's setting up included (the loop's
    own is not: the calls it alone makes, one event recorded and one waited
    for per batch, its two events).  A kernel of 5 ms or more is measured at
    every launch, a few calls (microseconds) against its milliseconds: at
    most four a launch with 20 ms kernels.  (Enough launches that the setting
    up weighs little: the launch-bound loop makes over 60000 in its second
    here, 9216 once on a busy CPU.)"""
    calls_file = tmp_path / "calls.jsonl"
    got = run(vgpulimit_cmd("run", "--simulate", "--cores", "90", "--", launch_client, "kernel", str(kernel_us),
                            seconds, str(cpu_us)), dict(sim_env, SIMGPU_CALLS=str(calls_file))).stdout
    launched = int(got.split("done ")[1].split()[1])
    calls = driver_calls(calls_file)
    assert calls["cuLaunchKernel"] == launched >= least
    assert calls.get("cuCtxGetCurrent", 0) <= launched // 32 + 5, calls
    loops_own = launched + 2 * calls["cuEventSynchronize"] + sum(calls.get(name, 0) for name in LOOPS_SETUP) + 2
    assert sum(calls.values()) - loops_own < launched * per_launch, calls

"""simgpu keeps time: kernels last as long as their names say (or
SIMGPU_KERNEL_US), launches return at once and run in order on a timeline
that every process on the machine shares, streams, events, graphs and
synchronisation follow it, the launch queue is bounded, and NVML measures
utilisation from it.  Through cuda-bindings and nvidia-ml-py, in child
processes on the test's own simulated GPU.  The lower bounds below are the
simulation's (a kernel of 20 ms cannot end sooner); upper bounds are broad."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import TESTS, run

CLIENTS = TESTS / "clients"


def test_streams_events_graphs_and_the_launch_queue_follow_the_timeline(sim_env):
    report = json.loads(run([sys.executable, CLIENTS / "timeline.py"],
                            dict(sim_env, SIMGPU_KERNEL_US="500"), timeout=60).stdout)
    # A 200 ms kernel: the launch returns at once, the stream is busy until it ends.
    assert report["launch_s"] < 0.1
    assert report["query_busy"] == "CUDA_ERROR_NOT_READY"
    assert report["launch_s"] + report["sync_s"] >= 0.199
    assert report["query_idle"] == "CUDA_SUCCESS"
    # Events time the kernels between them, and are not ready before them.
    assert report["event_query_busy"] == report["elapsed_not_ready"] == "CUDA_ERROR_NOT_READY"
    assert report["event_query_done"] == "CUDA_SUCCESS"
    assert 39.9 <= report["elapsed_ms"] < 100
    assert 4.99 <= report["default_kernels_ms"] < 50  # 10 x SIMGPU_KERNEL_US=500
    assert report["ctx_sync_s"] >= 0.05  # 3 x 20 ms on the legacy stream
    # Capture records kernels instead of running them; graphs run them all.
    assert report["capturing"] == "CU_STREAM_CAPTURE_STATUS_ACTIVE"
    assert report["sync_while_capturing"] == "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
    assert 59.9 <= report["captured_graph_ms"] < 120
    assert 39.9 <= report["built_graph_ms"] < 100
    # numba-cuda's way in: a library, its kernel, cuLaunchKernelEx.
    assert report["num_regs"] > 0 and report["kernel_max_threads"] == 1024
    assert 19.9 <= report["launch_ex_ms"] < 60
    # 1200 launches of 1 ms with room for 1024 pending: at least 176 waited
    # for one to end.
    assert report["queue_1000_s"] + report["queue_1200_more_s"] >= 0.175


def test_processes_share_one_timeline(sim_env, launch_client):
    """Two processes, each with 0.5 s of kernels to run: together they need a second."""
    started = time.monotonic()
    procs = [subprocess.Popen([launch_client, "kernel", "50000", "0.4"], env=sim_env,
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    done = [int(p.communicate(timeout=60)[0].split("done ")[1].split()[1]) for p in procs]
    elapsed = time.monotonic() - started
    assert all(p.returncode == 0 for p in procs)
    assert elapsed >= sum(done) * 0.05 - 0.01, (done, elapsed)


def test_nvml_measures_utilisation_from_the_timeline(sim_env, launch_client):
    """The loop's kernels of 200 ms, two queued at a time, keep the GPU busy
    whatever a busy CPU does to the loop (with kernels of 1 ms, 2 ms queued,
    its best 100 ms period was 18 % idle there): NVML is judged on the GPU's own
    time, the device busy over the last second and the loop's latest 100 ms
    period, then nothing after a second of nothing."""
    since_us = int(time.time() * 1e6)
    loop = subprocess.Popen([launch_client, "kernel", "200000", "2.5"], env=sim_env,
                            stdout=subprocess.PIPE, text=True)
    busy = poll(lambda: utilization(sim_env, since_us), lambda seen: seen["gpu"] >= 90)
    loop.communicate(timeout=60)
    assert busy["gpu"] >= 90
    [pid] = {s["pid"] for s in busy["samples"]}
    assert pid == loop.pid
    assert all(s["timestamp_us"] > since_us for s in busy["samples"])
    assert max(s["sm"] for s in busy["samples"]) >= 99
    # Once a whole second has passed with nothing running:
    idle = poll(lambda: utilization(sim_env, int(time.time() * 1e6) - 1_000_000),
                lambda seen: seen["gpu"] == 0 and seen["samples"] == [])
    assert idle["gpu"] == 0 and idle["samples"] == []


def utilization(env, since_us: int) -> dict:
    return json.loads(run([sys.executable, CLIENTS / "nvml_utilization.py", since_us], env).stdout)


def poll(sample, done, timeout_s: float = 30):
    """Samples until `done` holds of one (that one), or the last at the deadline."""
    deadline = time.monotonic() + timeout_s
    seen = sample()
    while not done(seen) and time.monotonic() < deadline:
        time.sleep(0.1)
        seen = sample()
    return seen


def test_a_bad_kernel_length_is_refused_naming_the_variable(sim_env):
    result = run([sys.executable, CLIENTS / "timeline.py"], dict(sim_env, SIMGPU_KERNEL_US="5ms"),
                 check=False)
    assert result.returncode != 0
    assert "SIMGPU_KERNEL_US=5ms" in result.stderr and "microseconds" in result.stderr


def gpu_time(sim_env, **variables) -> dict:
    env = dict(sim_env, **{f"SIMGPU_{k.upper()}": str(v) for k, v in variables.items()})
    return json.loads(run([sys.executable, CLIENTS / "gpu_time.py"], env, timeout=60).stdout)


def test_an_event_completes_with_its_streams_earlier_work_only(sim_env):
    """An event recorded on an idle stream completes at once, while a 20 ms
    kernel fills the device from another stream; one after the kernel waits."""
    report = gpu_time(sim_env)
    assert report["idle_stream_event_query"] == "CUDA_SUCCESS"
    assert report["idle_stream_event_ms"] < 10
    assert report["busy_stream_event_ms"] >= 19.9


@pytest.mark.parametrize("concurrent", [1, 2])
def test_kernels_of_two_streams_overlap_up_to_the_configured_number(sim_env, concurrent):
    """Two 20 ms kernels on two streams of one context: 40 ms one at a time,
    20 ms when two may run at once."""
    took = gpu_time(sim_env, concurrent_kernels=concurrent)["two_streams_ms"]
    if concurrent == 1:
        assert took >= 39.9
    else:
        assert 19.9 <= took < 39.9


def test_contexts_time_slice_and_a_long_kernel_is_preempted(sim_env):
    """Two contexts with a 20 ms kernel each.  With 2 ms slices both kernels
    are preempted and each span holds the other's slices (both near 40 ms);
    with 50 ms slices each runs through (20 ms): the second context's start
    event, too, waits for its slice."""
    sliced = gpu_time(sim_env, timeslice_us=2000)["contexts_ms"]
    assert sliced[0] >= 30 and sliced[1] >= 30
    whole = gpu_time(sim_env, timeslice_us=50000)["contexts_ms"]
    assert 19.9 <= whole[0] and whole[1] < 30


def test_a_launch_bound_program_leaves_the_gpu_idle_between_kernels(sim_env):
    """A launch takes the CPU SIMGPU_LAUNCH_US before its kernel is queued, so
    a program slower than its kernels leaves the GPU idle between them, and
    events see that: an event pair around one launch on an idle stream spans
    the launch's CPU time too; ten 20 us kernels with 1 ms of CPU work after
    each span the work; queued behind a kernel they run back to back.  An
    event on an idle stream completes at once, whatever another stream runs."""
    report = json.loads(run([sys.executable, CLIENTS / "launch_bound.py"],
                            dict(sim_env, SIMGPU_LAUNCH_US="300"), timeout=60).stdout)
    assert report["launch_s"] >= 300e-6
    assert report["start_query"] == "CUDA_SUCCESS"
    assert report["one_launch_ms"] >= 0.3 + 0.02
    assert report["paced_ms"] >= 9 * 1.0
    assert 0.2 <= report["queued_ms"] < 1.0  # 10 x 20 us, not 10 x the launch's 300 us
    assert report["idle_query"] == "CUDA_SUCCESS"


def test_a_bad_launch_time_names_the_variable(sim_env):
    result = run([sys.executable, CLIENTS / "launch_bound.py"], dict(sim_env, SIMGPU_LAUNCH_US="4us"),
                 check=False, timeout=60)
    assert result.returncode != 0
    assert "SIMGPU_LAUNCH_US=4us" in result.stderr

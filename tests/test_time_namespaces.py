"""Time namespaces (Linux 5.6; `unshare --time`, an OCI runtime's timeOffsets):
a container's process may read CLOCK_MONOTONIC and CLOCK_BOOTTIME shifted by
its namespace's offsets, and its /proc shows start times shifted by the
boottime one.  It is still its container's: every view lists it with its
memory, and what its clock says stalls no other process.  The GPU has one
clock whatever a process's namespace, and simgpu keeps it so."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import BASE, C_DIR, MiB, compile_c, run, vgpulimit_cmd
from containers import CLIENTS, fill_cmd, joined
from test_compute_share import KERNEL_US, Container, progress
from test_views import scrape

# Far more than the machine has been up, so that no start time of the
# namespace's processes is one the host could also read.
BOOTTIME_OFFSET_S = 100000


def own_clock(monotonic_s: int = 0, boottime_s: int = 0) -> list[str]:
    """A command's prefix that runs it in a time namespace of its own."""
    return ["unshare", "--time", "--fork", "--monotonic", str(monotonic_s), "--boottime", str(boottime_s)]


def can_unshare_time() -> bool:
    try:
        return subprocess.run([*own_clock(1, 1), "true"], capture_output=True, timeout=30,
                              check=False).returncode == 0
    except FileNotFoundError:
        return False


pytestmark = pytest.mark.skipif(not can_unshare_time(),
                                reason="cannot make a time namespace here (needs unshare(1) with "
                                       "--time, Linux 5.6 and root)")


@pytest.fixture(scope="module")
def launch_client(tmp_path_factory) -> Path:
    return compile_c(tmp_path_factory.mktemp("launch") / "launch_client", [C_DIR / "launch_client.c"], "-ldl")


@pytest.mark.parametrize("monotonic_s, boottime_s", [(0, 0), (1000, BOOTTIME_OFFSET_S), (-5, -5)])
def test_a_process_reads_the_nodes_clock_and_its_host_start_time_in_any_namespace(tmp_path, monotonic_s,
                                                                                 boottime_s):
    """base/clock.c and identity.c under AddressSanitizer and UBSan, in a
    time namespace: the node's clock is the host's CLOCK_MONOTONIC, and the
    start time a process records for itself is the one the host reads."""
    probe = compile_c(tmp_path / "clock_probe", [C_DIR / "clock_probe.c", BASE / "clock.c", BASE / "identity.c"],
                      "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-lpthread")
    before = time.monotonic_ns()
    proc = subprocess.Popen([*own_clock(monotonic_s, boottime_s), probe], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        said = json.loads(proc.stdout.readline() or "{}")
        after = time.monotonic_ns()
        stat = Path(f"/proc/{said.get('pid', 0)}/stat").read_bytes()
    finally:
        proc.stdin.close()
        err = proc.stderr.read()
        proc.wait(timeout=30)
    assert proc.returncode == 0 and not err, err
    assert (said["monotonic_offset_ns"], said["boottime_offset_ns"]) == (monotonic_s * 10**9, boottime_s * 10**9)
    assert before <= said["node_ns"] <= after
    assert abs(said["own_ns"] - said["node_ns"] - monotonic_s * 10**9) < 10**9
    assert said["start_ticks"] == int(stat[stat.rfind(b")") + 2:].split()[19]) and said["running"] == 1


def container_of_two(sim_env, region: Path, release: Path, host_mib: int, shifted_mib: int,
                     limits: list[str]) -> subprocess.Popen:
    """`vgpulimit run` of two cuda_fill clients that hold one block each: one
    on the host's clock, one with its boottime shifted."""
    host = " ".join(fill_cmd(host_mib * MiB, 1, release))
    shifted = " ".join([*own_clock(boottime_s=BOOTTIME_OFFSET_S), *fill_cmd(shifted_mib * MiB, 1, release)])
    return subprocess.Popen(
        list(map(str, vgpulimit_cmd("run", "--simulate", *limits, "--region", region, "--",
                                    "sh", "-c", f"{host} & {shifted} & wait"))),
        env=sim_env, stdout=subprocess.PIPE, text=True)


def test_a_process_with_its_own_boottime_is_its_containers_in_every_view(sim_env, shim_path, tmp_path):
    """100 MiB on the host's clock and 832 MiB with a boottime offset, in one
    container of 1 GiB: `status` (from the node and from inside a time
    namespace), `status --all`, `top`, `metrics` and NVML through the shim
    each show both processes and 932 MiB, and nothing outside any cap; and
    the cap counts both for a third process, whichever clock it reads."""
    node = tmp_path / "node"
    region = node / "c" / "region"
    region.parent.mkdir(parents=True)
    release = tmp_path / "release"
    proc = container_of_two(sim_env, region, release, 100, 832, ["--memory", "1GiB"])
    try:
        reports = [json.loads(proc.stdout.readline()) for _ in range(2)]
        assert all(r["allocs"] == ["CUDA_SUCCESS"] for r in reports), reports
        held = {r["pid"]: (r["before"]["free"] - r["after"]["free"]) for r in reports}
        assert sorted(held.values()) == [100 * MiB, 832 * MiB]

        def listed(data):
            return {p["pid"]: p["used_bytes"] for p in data["processes"]}

        for prefix in ([], own_clock(boottime_s=BOOTTIME_OFFSET_S)):
            data = json.loads(run([*prefix, *vgpulimit_cmd("status", "--json", "--interval", "0",
                                                           "--region", region)], sim_env).stdout)
            assert data["devices"][0]["used_bytes"] == 932 * MiB, prefix
            assert listed(data) == held, prefix

        node_view = json.loads(run(vgpulimit_cmd("status", "--json", "--interval", "0", "--all", node),
                                   sim_env).stdout)
        [one] = node_view["regions"]
        assert one["devices"][0]["used_bytes"] == 932 * MiB and listed(one) == held
        [gpu] = node_view["gpus"]
        assert (gpu["regions_used_bytes"], gpu["outside_bytes"], gpu["outside_processes"]) == \
            (932 * MiB, 0, []), gpu
        text = run(vgpulimit_cmd("status", "--interval", "0", "--all", node), sim_env).stdout
        assert "outside any cap 0 B" in text, text

        frame = run(vgpulimit_cmd("top", "-1", "--region", region, "--interval", "0.1"),
                    dict(sim_env, COLUMNS="120")).stdout
        assert "932 MiB / 1 GiB" in frame and all(str(pid) in frame for pid in held), frame

        server = subprocess.Popen(
            list(map(str, vgpulimit_cmd("metrics", "--listen", "127.0.0.1:0", "--all", node))),
            env=sim_env, stderr=subprocess.PIPE, text=True)
        try:
            samples = scrape(server.stderr.readline().split()[-1])
        finally:
            server.terminate()
            server.wait(timeout=30)
        per_process = {int(dict(labels)["pid"]): value for (name, labels), value in samples.items()
                       if name == "vgpulimit_process_memory_used_bytes"}
        assert per_process == held

        seen = json.loads(run([sys.executable, CLIENTS / "nvml_processes.py"],
                              joined(sim_env, region, shim_path)).stdout)
        assert {int(pid): used for pid, used in seen["compute"].items()} == held

        # No process is taken for dead, and its bytes for free, by one reading another clock.
        for prefix in ([], own_clock(boottime_s=2 * BOOTTIME_OFFSET_S)):
            third = json.loads(run([*prefix, sys.executable, CLIENTS / "cuda_fill.py", 200 * MiB, 1],
                                   joined(sim_env, region, shim_path)).stdout)
            assert third["allocs"] == ["CUDA_ERROR_OUT_OF_MEMORY"], prefix
    finally:
        release.touch()
        proc.wait(timeout=60)


def counts_in_window(output: str, offsets: dict[int, float], start: float, end: float) -> dict[int, int]:
    """Launches each process completed between two times of the test's clock,
    its progress read on its own clock (`offsets`: pid -> what its clock is
    ahead by; 0 if not listed)."""
    counts = {}
    for pid, points in progress(output).items():
        shift = offsets.get(pid, 0)
        inside = [n for t, n in points if start <= t - shift <= end]
        counts[pid] = inside[-1] - inside[0] if len(inside) >= 2 else 0
    return counts


def finish(loop: subprocess.Popen, timeout_s: float = 30) -> str:
    """A launch loop's output once it ends, or what it printed until it was
    held past `timeout_s` (a loop waiting for a clock 1000 s ahead)."""
    try:
        return loop.communicate(timeout=timeout_s)[0]
    except subprocess.TimeoutExpired:
        loop.kill()
        return loop.communicate()[0]


@pytest.mark.parametrize("ahead_s", [10, 1000])
def test_a_process_whose_clock_runs_ahead_stalls_no_other_in_its_container(sim_env, launch_client, ahead_s):
    """Two launch loops in one `--cores 30` container, one with its monotonic
    clock `ahead_s` ahead: over three seconds each completes a fair part of
    the container's share, and the container holds it."""
    loop = [str(launch_client), "kernel", str(KERNEL_US), "4.2"]
    shifted = [*own_clock(monotonic_s=ahead_s), *loop]
    started = time.monotonic()
    output = Container(sim_env, 30, ["sh", "-c", f"{' '.join(loop)} & {' '.join(shifted)} & wait"]).finish()
    first_seen = {pid: points[0][0] for pid, points in progress(output).items()}
    assert len(first_seen) == 2, output
    offsets = {pid: ahead_s for pid, t in first_seen.items() if t > started + ahead_s / 2}
    assert len(offsets) == 1, first_seen
    counts = counts_in_window(output, offsets, started + 1, started + 4)
    window_launches = 3.0 * 1e6 / KERNEL_US
    shares = {"ahead" if pid in offsets else "host": 100 * n / window_launches for pid, n in counts.items()}
    assert 20 <= sum(shares.values()) <= 40, shares
    # Each gets at least a third of what it would beside the other (half the share).
    assert all(s >= 5 for s in shares.values()), shares


def test_simgpu_keeps_one_clock_for_processes_in_time_namespaces(sim_env, launch_client):
    """With no shim, two launch loops on one simulated GPU, one with its
    clock 1000 s ahead: the GPU time-slices them as a GPU would, each completes
    kernels throughout (on its own clock, the loop on the host's would wait
    1000 s behind the other's)."""
    import time

    loop = [str(launch_client), "kernel", str(KERNEL_US), "3.2"]
    started = time.monotonic()
    procs = [subprocess.Popen(cmd, env=sim_env, stdout=subprocess.PIPE, text=True)
             for cmd in (loop, [*own_clock(monotonic_s=1000), *loop])]
    outputs = [finish(p) for p in procs]
    ahead = progress(outputs[1])
    counts = {"host": sum(counts_in_window(outputs[0], {}, started + 1, started + 3).values()),
              "ahead": sum(counts_in_window(outputs[1], dict.fromkeys(ahead, 1000), started + 1,
                                            started + 3).values())}
    window_launches = 2.0 * 1e6 / KERNEL_US
    shares = {who: 100 * n / window_launches for who, n in counts.items()}
    # Alone, each would keep the GPU busy: beside the other, about half each.
    assert all(s >= 25 for s in shares.values()), shares


def test_an_nvml_reader_on_another_clock_sees_the_gpu_as_it_is(sim_env, launch_client):
    """A launch loop keeps the simulated GPU busy; an NVML client whose clock
    is 1000 s ahead reads the utilisation and the loop's samples as one on
    the host's clock would, and the loop goes on as before."""
    loop = subprocess.Popen([launch_client, "kernel", str(KERNEL_US), "3.2"], env=sim_env,
                            stdout=subprocess.PIPE, text=True)
    try:
        first = loop.stdout.readline()
        assert first.startswith("progress"), first
        time.sleep(1)
        since_us = time.time_ns() // 1000 - 1000000
        read_at = time.monotonic()
        seen = json.loads(run([*own_clock(monotonic_s=1000), sys.executable, CLIENTS / "nvml_utilization.py",
                               since_us], sim_env).stdout)
    finally:
        output = finish(loop)
    assert seen["gpu"] >= 50 and loop.pid in {s["pid"] for s in seen["samples"]}, seen
    [after] = counts_in_window(output, {}, read_at, read_at + 1).values()
    assert 100 * after / (1e6 / KERNEL_US) >= 50, after

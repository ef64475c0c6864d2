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

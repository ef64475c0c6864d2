"""The node as its operator sees it (issue 13): every simulated GPU as NVML
counts it, the containers on each joined with the driver's figures, memory
outside any cap, caps committed against the GPU's memory, and the host's
figures of each process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pexpect
import pytest
from conftest import GiB, MiB, run, vgpulimit_cmd
from containers import container, outsider
from test_views import scrape


def ended(pid: int) -> bool:
    """Whether the kernel has ended `pid` (gone, or a zombie not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


def node_json(env, node) -> dict:
    return json.loads(run(vgpulimit_cmd("status", "--all", node, "--json", "--interval", "0"),
                          env).stdout)


def adds_up(gpu) -> None:
    """What the regions hold and what is outside any cap make what the driver counts."""
    regions = sum(c["used_bytes"] for c in gpu["containers"])
    assert regions == gpu["regions_used_bytes"]
    assert regions + gpu["outside_bytes"] == gpu["used_bytes"]
    outside = sum(p["used_bytes"] for p in gpu["outside_processes"])
    assert outside + gpu["outside_other_bytes"] == gpu["outside_bytes"]


def test_one_gpu_two_regions_and_a_process_outside_add_up(sim_env, tmp_path):
    node = tmp_path / "node"
    with outsider(sim_env, tmp_path, 1 * GiB) as other, \
            container(sim_env, node / "a" / "region", ["--memory", "8GiB"], [(256 * MiB, 2)]), \
            container(sim_env, node / "b" / "region", ["--memory", "4GiB"], [(512 * MiB, 1)]):
        data = node_json(sim_env, node)
        text = run(vgpulimit_cmd("status", "--all", node, "--interval", "0"), sim_env).stdout
    [gpu] = data["gpus"]
    assert gpu["name"] and gpu["uuid"].startswith("GPU-") and gpu["bus_id"]
    assert gpu["total_bytes"] == 16 * GiB
    assert gpu["used_bytes"] == 2 * GiB
    used = {c["region"]: (c["cap_bytes"], c["used_bytes"]) for c in gpu["containers"]}
    assert used == {str(node / "a" / "region"): (8 * GiB, 512 * MiB),
                    str(node / "b" / "region"): (4 * GiB, 512 * MiB)}
    adds_up(gpu)
    [outside] = gpu["outside_processes"]
    assert (outside["pid"], outside["used_bytes"], outside["gone"]) == (other["pid"], GiB, False)
    assert "cuda_fill.py" in outside["host"]["command"]
    assert gpu["outside_other_bytes"] == 0
    assert (gpu["committed_bytes"], gpu["commit_ratio"], gpu["overcommitted"]) == \
           (12 * GiB, 0.75, False)
    assert "committed 12 GiB of 16 GiB (0.75x)" in text
    assert "outside any cap 1 GiB: 1 GiB in 1 process, 0 B other" in text
    gpus_part = text.split("\nregion ")[0]
    assert max(len(line) for line in gpus_part.splitlines()) <= 80


def test_two_gpus_three_regions_over_commit_one(sim_env, tmp_path):
    env = dict(sim_env, SIMGPU_DEVICES="2")
    node = tmp_path / "node"
    with outsider(env, tmp_path, 512 * MiB, device=1) as other, \
            container(env, node / "a" / "region", ["--memory-device", "0=8GiB"],
                      [(256 * MiB, 1, 0)]), \
            container(env, node / "b" / "region", ["--memory-device", "0=10GiB"],
                      [(512 * MiB, 1, 0)]), \
            container(env, node / "c" / "region", ["--memory-device", "1=4GiB"],
                      [(128 * MiB, 1, 1)]):
        data = node_json(env, node)
        text = run(vgpulimit_cmd("status", "--all", node, "--interval", "0"), env).stdout
    gpu0, gpu1 = data["gpus"]
    assert gpu0["uuid"] != gpu1["uuid"] and gpu0["bus_id"] != gpu1["bus_id"]
    for gpu in (gpu0, gpu1):
        adds_up(gpu)
    capped0 = {c["region"]: c["cap_bytes"] for c in gpu0["containers"] if c["cap_bytes"]}
    assert capped0 == {str(node / "a" / "region"): 8 * GiB, str(node / "b" / "region"): 10 * GiB}
    assert (gpu0["committed_bytes"], gpu0["commit_ratio"], gpu0["overcommitted"]) == \
           (18 * GiB, 1.125, True)
    assert (gpu0["used_bytes"], gpu0["outside_bytes"]) == (768 * MiB, 0)
    capped1 = {c["region"]: c["cap_bytes"] for c in gpu1["containers"] if c["cap_bytes"]}
    assert capped1 == {str(node / "c" / "region"): 4 * GiB}
    assert (gpu1["committed_bytes"], gpu1["overcommitted"]) == (4 * GiB, False)
    assert gpu1["used_bytes"] == 640 * MiB
    assert [(p["pid"], p["used_bytes"]) for p in gpu1["outside_processes"]] == \
           [(other["pid"], 512 * MiB)]
    assert "committed 18 GiB of 16 GiB (1.12x, OVER-COMMITTED)" in text
    assert "committed 4 GiB of 16 GiB (0.25x)" in text


def test_metrics_of_the_node(sim_env, tmp_path):
    env = dict(sim_env, SIMGPU_DEVICES="2")
    node = tmp_path / "node"
    with outsider(env, tmp_path, 1 * GiB) as other, \
            container(env, node / "a" / "region", ["--memory-device", "0=12GiB"],
                      [(256 * MiB, 1)]), \
            container(env, node / "b" / "region", ["--memory-device", "0=8GiB"],
                      [(256 * MiB, 1)]):
        uuids = [g["uuid"] for g in node_json(env, node)["gpus"]]
        server = subprocess.Popen(
            list(map(str, vgpulimit_cmd("metrics", "--listen", "127.0.0.1:0", "--all", node))),
            env=env, stderr=subprocess.PIPE, text=True)
        try:
            url = server.stderr.readline().split()[-1]
            samples = scrape(url)
        finally:
            server.terminate()
            server.wait(timeout=30)

    def gpu(name, index):
        [value] = [v for (n, labels), v in samples.items()
                   if n == name and dict(labels)["UUID"] == uuids[index]]
        return value

    assert gpu("vgpulimit_gpu_memory_total_bytes", 0) == 16 * GiB
    assert gpu("vgpulimit_gpu_memory_used_bytes", 0) == 1536 * MiB
    assert gpu("vgpulimit_gpu_memory_committed_bytes", 0) == 20 * GiB
    assert gpu("vgpulimit_gpu_memory_committed_ratio", 0) == 1.25
    assert gpu("vgpulimit_gpu_memory_unaccounted_bytes", 0) == 1 * GiB
    assert gpu("vgpulimit_gpu_memory_committed_bytes", 1) == 0
    [(labels, value)] = [(dict(labels), v) for (n, labels), v in samples.items()
                         if n == "vgpulimit_gpu_process_unaccounted_bytes"]
    assert (labels["host_pid"], labels["gpu"], value) == (str(other["pid"]), "0", GiB)
    assert "cuda_fill.py" in labels["command"]
    # Regions without an identity (not set up by the hook) carry empty names.
    region_used = {dict(labels)["region"]: (dict(labels)["pod"], v)
                   for (n, labels), v in samples.items() if n == "vgpulimit_memory_used_bytes"}
    assert region_used == {str(node / "a" / "region"): ("", 256 * MiB),
                           str(node / "b" / "region"): ("", 256 * MiB)}


def test_a_vanished_process_is_never_listed_with_memory(sim_env, tmp_path):
    node = tmp_path / "node"
    with outsider(sim_env, tmp_path, 1 * GiB) as other, \
            container(sim_env, node / "a" / "region", ["--memory", "8GiB"],
                      [(256 * MiB, 1), (128 * MiB, 1)]) as reports:
        victim = reports[0]["pid"]
        for pid in (victim, other["pid"]):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while not all(ended(pid) for pid in (victim, other["pid"])):
            assert time.monotonic() < deadline, "a process killed with SIGKILL still runs"
            time.sleep(0.02)
        data = node_json(sim_env, node)
        text = run(vgpulimit_cmd("status", "--all", node, "--interval", "0"), sim_env).stdout
    listed = [p for r in data["regions"] for p in r["processes"]]
    listed += [p for g in data["gpus"] for p in g["outside_processes"]]
    for proc in listed:
        if proc["pid"] in (victim, other["pid"]) or proc.get("host_pid") == victim:
            assert proc["gone"] and proc["used_bytes"] is None
    [region] = data["regions"]
    held = sum(p["used_bytes"] for p in region["processes"] if not p["gone"])
    assert region["devices"][0]["used_bytes"] == held
    assert held in (128 * MiB, 256 * MiB)   # the other one's
    for line in text.splitlines():
        if f" {victim} " in f" {line} " or f" {other['pid']} " in f" {line} ":
            assert "gone" in line and "MiB" not in line and "GiB" not in line, line


def test_a_process_that_exited_is_gone(tmp_path):
    from vgpulimit.processes import ProcessWatcher

    watcher = ProcessWatcher()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # Until the child has exec'd, its command line is still its parent's.
        deadline = time.monotonic() + 20
        while "time.sleep(60)" not in Path(f"/proc/{proc.pid}/cmdline").read_text():
            assert time.monotonic() < deadline, "the child never started its program"
            time.sleep(0.01)
        alive = watcher.details(proc.pid)
        assert not alive.gone and "time.sleep(60)" in alive.command and alive.rss_bytes > 0
        # Its slot recorded another start time: the pid is another process's now.
        assert watcher.details(proc.pid, start_ticks=1).gone
    finally:
        proc.kill()
        proc.wait()
    assert watcher.details(proc.pid).gone


def test_without_a_driver_the_node_view_is_one_line(sim_env, tmp_path):
    env = {k: v for k, v in sim_env.items() if k != "LD_LIBRARY_PATH"}
    (tmp_path / "node").mkdir()
    result = run(vgpulimit_cmd("status", "--all", tmp_path / "node", "--interval", "0"), env)
    assert result.stdout.startswith("no physical view: NVML")
    assert result.stdout.count("\n") == 3   # that line, a blank one, "no regions found"


@pytest.mark.parametrize("size", [(30, 80)])
def test_top_shows_gpus_containers_and_processes_at_80_columns(sim_env, tmp_path, size):
    env = dict(sim_env, SIMGPU_DEVICES="2")
    node = tmp_path / "node"
    with outsider(env, tmp_path, 1 * GiB) as other, \
            container(env, node / "a" / "region", ["--memory-device", "0=12GiB"],
                      [(256 * MiB, 1)]) as [holder], \
            container(env, node / "b" / "region", ["--memory-device", "0=8GiB"],
                      [(512 * MiB, 1)]):
        top = pexpect.spawn(sys.executable, ["-m", "vgpulimit", "top", "--all", str(node)],
                            env=dict(env, TERM="xterm"), dimensions=size,
                            encoding="utf-8", timeout=30)
        try:
            top.expect_exact("OVER-COMMITTED")
            top.expect_exact(str(holder["pid"]))
            top.send("s")
            top.expect_exact("order (by cpu)")
            top.send("1")
            top.expect_exact("showing GPU 1")
            top.expect_exact("committed 0 B of 16 GiB")
            top.send("q")
            top.expect(pexpect.EOF)
        finally:
            top.close(force=True)
        once = run(vgpulimit_cmd("top", "-1", "--all", node), dict(env, COLUMNS="80")).stdout
    assert top.exitstatus == 0
    lines = once.splitlines()
    assert max(len(line) for line in lines) <= 80
    gpu0 = next(i for i, line in enumerate(lines) if line.startswith("GPU 0"))
    gpu1 = next(i for i, line in enumerate(lines) if line.startswith("GPU 1"))
    block0 = "\n".join(lines[gpu0:gpu1])
    assert "20 GiB of 16 GiB" in block0 and "OVER-COMMITTED" in block0
    assert str(holder["pid"]) in block0 and str(other["pid"]) in block0


def serve_metrics(env, node, scrapes: int = 1) -> tuple[list[dict], str]:
    """`vgpulimit metrics --all` scraped ``scrapes`` times: each scrape's
    samples, and what the server logged."""
    server = subprocess.Popen(
        list(map(str, vgpulimit_cmd("metrics", "--listen", "127.0.0.1:0", "--all", node))),
        env=env, stderr=subprocess.PIPE, text=True)
    try:
        first = server.stderr.readline()
        url = first.split()[-1]
        samples = [scrape(url) for _ in range(scrapes)]
    finally:
        server.terminate()
        _, rest = server.communicate(timeout=30)
    return samples, first + rest


def gpu_series(samples: dict, name: str) -> list[float]:
    return [v for (n, _labels), v in samples.items() if n == name]


# -- issue 23: what the driver means, and a driver that lacks a function ----------------------------


def test_the_drivers_reserve_is_shown_as_such_never_as_use(sim_env, tmp_path):
    """On an H200, NVML v1's used held 615 MiB the driver keeps for itself,
    and the node view showed it as memory used outside any cap.  NVML v2
    reports it apart (reserved): used is what processes hold."""
    env = dict(sim_env, SIMGPU_RESERVED="615MiB")
    node = tmp_path / "node"
    with container(env, node / "a" / "region", ["--memory", "4GiB"], [(256 * MiB, 1)]), \
            container(env, node / "b" / "region", ["--memory", "4GiB"], [(512 * MiB, 1)]):
        data = node_json(env, node)
        text = run(vgpulimit_cmd("status", "--all", node, "--interval", "0"), env).stdout
        [samples], _ = serve_metrics(env, node)
        once = run(vgpulimit_cmd("top", "-1", "--all", node), dict(env, COLUMNS="80")).stdout
    [gpu] = data["gpus"]
    assert (gpu["used_bytes"], gpu["reserved_bytes"], gpu["used_includes_reserved"]) == \
           (768 * MiB, 615 * MiB, False)
    assert (gpu["outside_bytes"], gpu["outside_other_bytes"]) == (0, 0)
    adds_up(gpu)
    assert data["nvml_unavailable"] == []
    assert "used 768 MiB of 16 GiB as the driver counts it: 768 MiB in 2 containers" in text
    assert "reserved by the driver 615 MiB, not counted as used" in text
    assert "outside any cap 0 B: 0 B in 0 processes, 0 B other" in text
    assert gpu_series(samples, "vgpulimit_gpu_memory_used_bytes") == [768 * MiB]
    assert gpu_series(samples, "vgpulimit_gpu_memory_reserved_bytes") == [615 * MiB]
    assert gpu_series(samples, "vgpulimit_gpu_memory_unaccounted_bytes") == [0]
    assert "reserved by the driver 615 MiB, not counted as used" in once
    assert "outside any cap 0 B: 0 B in 0 processes, 0 B other" in once


def test_without_nvml_v2_used_is_said_to_hold_the_reserve(sim_env, tmp_path):
    """A driver whose NVML has no v2 memory figures: v1's used is shown, and
    the view says that the driver's reserve is in it, once."""
    env = dict(sim_env, SIMGPU_RESERVED="615MiB")
    node = tmp_path / "node"
    view_env = dict(env, SIMGPU_NVML_ANSWER="nvmlDeviceGetMemoryInfo_v2:FUNCTION_NOT_FOUND")
    with container(env, node / "a" / "region", ["--memory", "4GiB"], [(256 * MiB, 1)]):
        data = node_json(view_env, node)
        result = run(vgpulimit_cmd("status", "--all", node, "--interval", "0"), view_env)
        [samples], log = serve_metrics(view_env, node)
    [gpu] = data["gpus"]
    assert (gpu["used_bytes"], gpu["reserved_bytes"], gpu["used_includes_reserved"]) == \
           ((256 + 615) * MiB, None, True)
    assert gpu["outside_other_bytes"] == 615 * MiB
    adds_up(gpu)
    assert [u["function"] for u in data["nvml_unavailable"]] == ["nvmlDeviceGetMemoryInfo_v2"]
    text = result.stdout
    assert "reserved by the driver: not known apart, counted in used" in text
    assert "615 MiB other, the reserve in it" in text
    assert max(len(line) for line in text.split("\nregion ")[0].splitlines()) <= 80
    assert [line for line in text.splitlines() if "nvmlDeviceGetMemoryInfo_v2" in line] == \
           ["NVML has no nvmlDeviceGetMemoryInfo_v2: used is v1's, with the driver's reserve"]
    assert result.stderr == ""
    assert gpu_series(samples, "vgpulimit_gpu_memory_used_bytes") == [(256 + 615) * MiB]
    assert gpu_series(samples, "vgpulimit_gpu_memory_reserved_bytes") == []
    assert log.count("nvmlDeviceGetMemoryInfo_v2") == 1


@pytest.mark.parametrize("answer, says, shown", [
    # pynvml's unversioned wrapper raises NVMLLibraryMismatchError for this one.
    ("nvmlDeviceGetGraphicsRunningProcesses_v3:FUNCTION_NOT_FOUND",
     "NVML has no nvmlDeviceGetGraphicsRunningProcesses_v3: graphics processes n/a",
     "outside any cap 1 GiB: 1 GiB in 1 process, 0 B other"),
    ("nvmlDeviceGetComputeRunningProcesses_v3:FUNCTION_NOT_FOUND",
     "NVML has no nvmlDeviceGetComputeRunningProcesses_v3: processes n/a",
     "outside any cap 1 GiB: processes n/a"),
    ("nvmlDeviceGetComputeRunningProcesses_v3:NO_PERMISSION",
     "NVML nvmlDeviceGetComputeRunningProcesses_v3: Insufficient Permissions: processes n/a",
     "outside any cap 1 GiB: processes n/a"),
    ("nvmlDeviceGetUtilizationRates:NOT_SUPPORTED",
     "NVML nvmlDeviceGetUtilizationRates: Not Supported: utilisation n/a",
     "utilisation n/a"),
])
def test_a_function_nvml_does_not_answer_is_one_line(sim_env, tmp_path, answer, says, shown):
    """On a driver that lacks a function (or does not support it, or does not
    permit it), status --all, top and metrics show the figure as unavailable
    and name the function once -- on a node of two GPUs too -- never a
    traceback."""
    env = dict(sim_env, SIMGPU_DEVICES="2")
    view_env = dict(env, SIMGPU_NVML_ANSWER=answer)
    function = answer.split(":")[0]
    node = tmp_path / "node"
    with outsider(env, tmp_path, 1 * GiB), \
            container(env, node / "a" / "region", ["--memory", "4GiB"], [(256 * MiB, 1)]):
        result = run(vgpulimit_cmd("status", "--all", node, "--interval", "0"), view_env)
        data = node_json(view_env, node)
        once = run(vgpulimit_cmd("top", "-1", "--all", node), dict(view_env, COLUMNS="100"))
        scrapes, log = serve_metrics(view_env, node, scrapes=2)
    for shown_by in (result, once):
        assert "Traceback" not in shown_by.stderr, shown_by.stderr
        assert [line.strip() for line in shown_by.stdout.splitlines() if function in line] == \
               [says]
    gpu0 = result.stdout.split("GPU 1:")[0]
    assert shown in gpu0
    assert "committed 4 GiB of 16 GiB (0.25x)" in gpu0
    assert len(data["gpus"]) == 2
    [missing] = data["nvml_unavailable"]
    assert missing["function"] == function
    assert "Traceback" not in log
    assert [line for line in log.splitlines() if function in line] == \
           [f"vgpulimit metrics: {says}"]
    for samples in scrapes:
        assert len(gpu_series(samples, "vgpulimit_gpu_memory_total_bytes")) == 2
        # A cap on every device: committed on each GPU the container may use.
        assert gpu_series(samples, "vgpulimit_gpu_memory_committed_bytes") == [4 * GiB] * 2

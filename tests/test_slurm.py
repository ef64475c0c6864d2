"""Slurm GRES shards as limits, end to end on real daemons (slurm_cluster.py):
jobs submitted with srun and sbatch to slurmctld, run by slurmd through
vgpulimit's Prolog, TaskProlog and Epilog, on the simulated GPU of 16 GiB,
each job a cuda-bindings client.  The parsers are tested alone first, with no
Slurm."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT, base_env
from slurm_cluster import MPS, SHARDS, cluster, slurm_unavailable

from vgpulimit import _paths
from vgpulimit.errors import UsageError
from vgpulimit.limits import MemoryLimit
from vgpulimit.slurm import gres, hooks, mapping

GiB = 1 << 30
FILL = str(ROOT / "tests" / "clients" / "cuda_fill.py")


# -- the parsers, alone --------------------------------------------------------------------------


@pytest.mark.parametrize("text,shards,gpus,indices", [
    ("shard:2(IDX:0)", 2, 0, "0"),
    ("shard:tesla:6(IDX:1)", 6, 0, "1"),
    ("gpu:1(IDX:0)", 0, 1, ""),
    ("gpu:a100:2(IDX:0-1),shard:3(IDX:0,2)", 3, 2, "0,2"),
    ("shard(CNT:6)", 6, 0, ""),   # a node with mps too
    ("(null)", 0, 0, ""),
    ("", 0, 0, ""),
])
def test_a_gres_string_is_read_as_slurm_writes_it(text, shards, gpus, indices):
    assert gres.parse_gres(text) == gres.Gres(shards=shards, gpus=gpus, indices=indices)


@pytest.mark.parametrize("text", ["shard", "shard:two", "shard:2(IDX:0", "shard:2,", ":2"])
def test_a_malformed_gres_string_is_an_error_naming_it(text):
    with pytest.raises(gres.SlurmError, match="cannot read"):
        gres.parse_gres(text)


def test_mps_gres_are_read_as_shards_where_the_site_says_so():
    mps_node = gres.parse_gres("gpu:2,mps:200")
    assert mps_node.mps == 200 and mps_node.shards == 0
    assert gres.shards_per_gpu(mps_node.as_shards()) == 100
    assert gres.parse_gres("mps:25(IDX:1)").as_shards() == gres.Gres(shards=25, indices="1")


def test_the_job_gres_is_that_of_this_node():
    text = ("   JOB_GRES=shard:5\n"
            "     Nodes=gpu[01-02] CPU_IDs=0 Mem=0 GRES=shard:2(IDX:0)\n"
            "     Nodes=gpu03 CPU_IDs=0 Mem=0 GRES=shard:3(IDX:1)\n")
    assert gres.job_gres_on(text, "gpu02").shards == 2
    assert gres.job_gres_on(text, "gpu03").shards == 3
    assert gres.job_gres_on(text, "gpu04").shards == 0
    assert gres.expand_hostlist("n[8-10],x") == ["n8", "n9", "n10", "x"]


def test_shards_map_to_a_share_or_to_fixed_units():
    memory, cores = mapping.parse_mapping("fraction", "fraction").limits(2, 8)
    assert memory == MemoryLimit(bytes=0, ppm=250_000) and cores == 25
    memory, cores = mapping.parse_mapping("1GiB", "10").limits(3, 8)
    assert memory == MemoryLimit(bytes=3 * GiB, ppm=0) and cores == 30
    assert mapping.parse_mapping("fraction", "none").limits(2, 8)[1] == 0
    assert mapping.parse_mapping("fraction", "fraction").limits(8, 8)[1] == 0   # the whole GPU's time
    for memory_text, cores_text in (("12parsecs", "fraction"), ("50%", "fraction"),
                                    ("fraction", "half"), ("fraction", "0")):
        with pytest.raises(UsageError, match="unknown shard mapping"):
            mapping.parse_mapping(memory_text, cores_text)


@pytest.mark.parametrize("text,job", [
    # cgroup v1, proctrack/cgroup (slurm 22.05's cgroup/v1): the freezer, cpuset, memory... lines
    ("12:freezer:/slurm/uid_1000/job_42/step_0\n3:cpuset:/slurm/uid_1000/job_42/step_0/task_0\n0::/\n", "42"),
    # cgroup v2 (cgroup/v2): slurmd's own scope, each job below it
    ("0::/system.slice/slurmstepd.scope/job_7/step_batch/user/task_0\n", "7"),
    ("0::/slurm_gpu01/uid_0/job_9/step_extern\n", "9"),   # v1 with a NodeName of several slurmd
    ("0::/user.slice/job_5/step_0\n", None),               # not below Slurm's
    ("0::/system.slice/slurmstepd.scope/job_/step_0\n", None),
    ("0::/system.slice/slurmstepd.scope/job_5x\n", None),
    ("4:memory:/slurm/uid_0/job_1/step_0\n0::/system.slice/slurmstepd.scope/job_2/step_0\n", None),  # two
    ("", None), ("garbage", None), ("0::/slurm", None),
])
def test_the_slurm_job_of_a_process_is_read_from_its_cgroups(text, job):
    assert _paths.slurm_job(text) == job


# -- on a real Slurm -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slurm_node(tmp_path_factory, simgpu_dir):
    why = slurm_unavailable()
    if why:
        pytest.skip(why)
    state = tmp_path_factory.mktemp("simgpu")
    job_env = base_env(LD_LIBRARY_PATH=str(simgpu_dir), SIMGPU_STATE=str(state / "simgpu.state"),
                       SIMGPU_MEMORY="16GiB", SIMGPU_CONTEXT_OVERHEAD="0", SIMGPU_RESERVED="0")
    with cluster(job_env) as node:
        yield node


@pytest.fixture
def node(slurm_node, tmp_path):
    """The cluster, with no job of an earlier test on it, and none left after."""
    slurm_node.wait_idle()
    yield slurm_node
    slurm_node.command("scancel", "--full", "-u", "root", check=False)
    slurm_node.wait_idle()
    assert not list(slurm_node.node_dir.glob("*")), "a job's directory was left behind"


def srun(node, *args: str, hold: Path | None = None, block: int = GiB, count: int = 16,
         tasks: int = 1) -> subprocess.Popen:
    fill = [sys.executable, FILL, str(block), str(count)] + (["--hold", str(hold)] if hold else [])
    return subprocess.Popen(["srun", "-n", str(tasks), *args, *fill], env=node.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def reports(process: subprocess.Popen, lines: int, timeout: float = 60) -> list[dict]:
    """The first ``lines`` JSON lines the job's tasks print."""
    found = []
    deadline = time.monotonic() + timeout
    while len(found) < lines:
        assert time.monotonic() < deadline, "the job's tasks did not report in time"
        line = process.stdout.readline()
        if not line:
            raise AssertionError(f"the job ended: {process.wait()} {process.stderr.read()}")
        if line.startswith("{"):
            found.append(json.loads(line))
    return found


def successes(report: dict) -> int:
    return report["allocs"].count("CUDA_SUCCESS")


def status_all(node) -> dict:
    done = subprocess.run([sys.executable, "-m", "vgpulimit", "status", "--json", "--all",
                           str(node.node_dir), "--interval", "0"], env=node.env,
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def metric_lines(node, name: str) -> list[str]:
    server = subprocess.Popen([sys.executable, "-m", "vgpulimit", "metrics", "--listen", "127.0.0.1:0",
                               "--all", str(node.node_dir)], env=node.env, stderr=subprocess.PIPE,
                              text=True)
    try:
        line = server.stderr.readline()
        assert "serving metrics on http://" in line, line
        with urllib.request.urlopen(line.split()[-1], timeout=30) as answer:
            text = answer.read().decode()
        return [m for m in text.splitlines() if m.startswith(name + "{")]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_jobs_of_2_and_6_shards_run_at_once_each_capped_at_its_share(node, tmp_path):
    hold = tmp_path / "hold"
    small = srun(node, "--gres=shard:2", hold=hold)
    large = srun(node, "--gres=shard:6", hold=hold)
    try:
        [small_report] = reports(small, 1)
        [large_report] = reports(large, 1)
        # Both hold their memory now: their caps hold together, on one GPU.
        assert small_report["total_mem"] == 16 * GiB * 2 // SHARDS
        assert large_report["total_mem"] == 16 * GiB * 6 // SHARDS
        assert successes(small_report) == 4 and successes(large_report) == 12
        assert small_report["allocs"][4:] == ["CUDA_ERROR_OUT_OF_MEMORY"] * 12
        assert large_report["allocs"][12:] == ["CUDA_ERROR_OUT_OF_MEMORY"] * 4
        shown = {r["identity"]["hpc_job"]: r for r in status_all(node)["regions"]}
        assert sorted(r["identity"]["shards"] for r in shown.values()) == ["2/8", "6/8"]
        assert {r["identity"]["user"] for r in shown.values()} == {"root"}
        assert sorted(r["devices"][0]["used_bytes"] for r in shown.values()) == [4 * GiB, 12 * GiB]
        limits = metric_lines(node, "vgpulimit_memory_limit_bytes")
        for job in shown:
            assert any(f'hpc_job="{job}"' in m for m in limits), limits
    finally:
        hold.touch()
    assert small.wait(timeout=60) == 0 and large.wait(timeout=60) == 0


def progress(output: str) -> list[tuple[float, int]]:
    """tests/c/launch_client.c's "progress PID T N" lines: CLOCK_MONOTONIC
    seconds, kernels of known length completed."""
    return [(float(f[2]), int(f[3])) for f in map(str.split, output.splitlines())
            if len(f) == 4 and f[0] == "progress"]


def share_between(points: list[tuple[float, int]], start: float, end: float, kernel_us: int) -> float:
    """The share (%) of the GPU's time a loop's kernels ran between two times."""
    (t0, n0), *_, (t1, n1) = [p for p in points if start <= p[0] <= end]
    return 100 * (n1 - n0) * kernel_us * 1e-6 / (t1 - t0)


@pytest.mark.slow
def test_jobs_of_2_and_6_shards_at_once_each_get_their_share_of_the_gpu_time(node, launch_client):
    """Their launch loops of 1 ms kernels run at once for 6 s on one GPU:
    25 % and 75 % of its time, over the span both ran (the first second of
    each left out, while its budget fills): neither above its share by more
    than 2 pp, and three times as much GPU time as the other, within a tenth
    (a busy CPU that starves a loop takes from its share, not from its cap)."""
    jobs = [subprocess.Popen(["srun", f"--gres=shard:{n}", str(launch_client), "kernel", "1000", "6"],
                             env=node.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for n in (2, 6)]
    outputs = [job.communicate(timeout=120) for job in jobs]
    assert [job.returncode for job in jobs] == [0, 0], outputs
    loops = [progress(out) for out, _ in outputs]
    start = max(points[0][0] for points in loops) + 1
    end = min(points[-1][0] for points in loops)
    assert end - start >= 3, f"the two jobs' loops ran together {end - start:.1f} s only"
    shares = [share_between(points, start, end, kernel_us=1000) for points in loops]
    assert shares[0] <= 27 and shares[1] <= 77, shares
    assert 2.7 <= shares[1] / shares[0] <= 3.3, shares


def test_the_tasks_of_one_job_share_one_cap(node, tmp_path):
    hold = tmp_path / "hold"
    job = srun(node, "--gres=shard:2", hold=hold, block=512 << 20, count=4, tasks=4)
    try:
        found = reports(job, 4)
        # 4 GiB for the job, however many processes: 8 blocks of 512 MiB in all.
        assert sum(map(successes, found)) == 8
        assert len({r["pid"] for r in found}) == 4
        [region] = status_all(node)["regions"]
        assert region["devices"][0]["used_bytes"] == 4 * GiB
    finally:
        hold.touch()
    assert job.wait(timeout=60) == 0


def test_a_whole_gpu_job_is_left_alone(node):
    job = srun(node, "--gres=gpu:1", count=17)
    [report] = reports(job, 1)
    assert report["total_mem"] == 16 * GiB and successes(report) == 16
    assert job.wait(timeout=60) == 0
    probe = node.command("srun", "--gres=gpu:1", "sh", "-c", 'echo "[$LD_PRELOAD][$VGPULIMIT_REGION]"')
    assert probe.stdout.strip() == "[][]"


def test_a_job_killed_by_scancel_leaves_no_region(node):
    submitted = node.command("sbatch", "--parsable", "--gres=shard:3", "-o", "/dev/null", "--wrap",
                             f"srun {sys.executable} -c 'import time; time.sleep(600)'")
    job_id = submitted.stdout.strip().split(";")[0]
    region = node.node_dir / job_id / "region"
    deadline = time.monotonic() + 30
    while not region.exists():
        assert time.monotonic() < deadline, "the Prolog made no region"
        time.sleep(0.05)
    node.command("scancel", job_id)
    node.wait_idle()
    assert not (node.node_dir / job_id).exists()
    assert status_all(node)["regions"] == []


_NO_BOARD = """
import json, os
from vgpulimit.region import read_snapshot
region = os.environ["VGPULIMIT_REGION"]
snap = read_snapshot(region)
node = os.path.dirname(os.path.dirname(region))
shared = [name for _, _, names in os.walk(node) for name in names
          if name.endswith(".board") or name.startswith("beacon-")]
print(json.dumps({"board": snap.board, "priority": snap.priority, "shared": shared}))
"""


def test_a_job_has_no_guarantee_or_priority_that_another_job_could_write(node):
    """Issue 39: a memory guarantee or a priority lives on a node's board,
    beside beacons.  A job takes part in neither: its region names no board,
    and its node directory holds no board and no beacon, so there is no row
    of a job for another to write, nor one of another's for it."""
    probe = node.command("srun", "--gres=shard:2", sys.executable, "-c", _NO_BOARD)
    assert json.loads(probe.stdout.splitlines()[-1]) == {"board": None, "priority": None, "shared": []}


def test_the_job_log_is_found_in_scontrol_show_job():
    shown = ("JobId=7 JobName=wrap\n   UserId=alice(1000) GroupId=users(100) MCS_label=N/A\n"
             "   StdErr=/home/alice/slurm-7.err\n   StdIn=/dev/null\n   StdOut=/home/alice/slurm-7.out\n")
    assert hooks.job_log(shown) == hooks.JobLog("/home/alice/slurm-7.err", 1000, 100)
    assert hooks.job_log(shown.replace("StdErr=/home/alice/slurm-7.err", "")).path.endswith(".out")
    # srun alone: no file; its output went to the srun.
    assert hooks.job_log("JobId=8 JobName=sleep\n   UserId=root(0) GroupId=root(0)\n") is None


def test_a_process_left_holding_gpu_memory_is_named_in_the_job_log(node, tmp_path):
    """A batch job that leaves a process of its own behind, out of the job's
    process tree (setsid -f: proctrack/linuxproc loses it), holding 1 GiB in
    the job's region: the Epilog names it in the job's output file."""
    hold, report, log = tmp_path / "hold", tmp_path / "report", tmp_path / "job.log"
    script = (f"setsid -f {sys.executable} {FILL} {GiB} 1 --hold {hold} >{report} 2>&1 </dev/null\n"
              f"until grep -q '^{{' {report}; do sleep 0.05; done\n")
    pid = None
    try:
        job_id = node.command("sbatch", "--parsable", "--gres=shard:2", "-o", str(log), "--wrap",
                              script).stdout.strip().split(";")[0]
        deadline = time.monotonic() + 60
        while not (report.exists() and report.read_text().startswith("{")):
            assert time.monotonic() < deadline, "the job's process did not report"
            time.sleep(0.05)
        pid = json.loads(report.read_text().splitlines()[0])["pid"]
        node.wait_idle()
        said = [m for m in log.read_text().splitlines() if m.startswith("vgpulimit:")]
        assert said == [(f"vgpulimit: warning: Slurm job {job_id} has ended, but processes still held "
                         f"GPU memory in its region (pids {pid}): the GPU's memory is not free until "
                         "they exit")], log.read_text()
    finally:
        hold.touch()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_an_unknown_mapping_refuses_the_job_in_one_line_and_the_node_stays_up(node):
    prolog = node.scripts / "vgpulimit-prolog"
    good = prolog.read_text()
    prolog.write_text(good.replace("--shard-memory fraction", "--shard-memory 12parsecs"))
    try:
        done = node.command("srun", "--gres=shard:2", "echo", "ran uncapped", check=False)
    finally:
        prolog.write_text(good)
    assert done.returncode != 0 and "ran uncapped" not in done.stdout
    [line] = [m for m in done.stderr.splitlines() if m.startswith("vgpulimit:")]
    assert re.match(r"vgpulimit: error: Slurm job \d+ refused: unknown shard mapping: "
                    r"--shard-memory: '12parsecs' is not a valid value", line), line
    node.wait_idle()   # not drained: the next job runs
    assert node.command("srun", "--gres=shard:2", "true").returncode == 0


def test_a_job_with_shards_and_no_region_is_refused_not_run_uncapped(node):
    prolog = node.scripts / "vgpulimit-prolog"
    good = prolog.read_text()
    prolog.write_text("#!/bin/sh\nexit 0\n")   # a Prolog that made nothing
    try:
        done = node.command("srun", "--gres=shard:2", "echo", "ran uncapped", check=False)
    finally:
        prolog.write_text(good)
    assert done.returncode != 0 and "ran uncapped" not in done.stdout
    assert "no region" in done.stderr and "refused rather than run uncapped" in done.stderr


def test_install_writes_the_scripts_and_names_what_slurm_conf_lacks(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("GresTypes=gpu\nProlog=/etc/slurm/other\n")
    done = subprocess.run([sys.executable, "-m", "vgpulimit", "slurm", "install", "--dir",
                           str(tmp_path / "etc"), "--slurm-conf", str(conf), "--shard-memory", "1GiB"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert f"Prolog={tmp_path}/etc/vgpulimit-prolog" in done.stdout
    assert "(it has Prolog=/etc/slurm/other)" in done.stdout
    assert "MISSING" in done.stdout and "GresTypes has shard" in done.stdout
    assert "--shard-memory 1GiB" in (tmp_path / "etc" / "vgpulimit-prolog").read_text()
    bad = subprocess.run([sys.executable, "-m", "vgpulimit", "slurm", "install", "--print-only",
                          "--shard-cores", "lots"], capture_output=True, text=True,
                         check=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown shard mapping" in bad.stderr


def test_a_job_that_sheds_its_region_runs_uncapped_and_is_told_so(node):
    """What the threat model says a job can shed: the environment is its own."""
    fill = f"{sys.executable} {FILL} {GiB} 5"
    shed = node.command("srun", "--gres=shard:2", "sh", "-c", f"env -u VGPULIMIT_REGION {fill}")
    [report] = [json.loads(m) for m in shed.stdout.splitlines() if m.startswith("{")]
    assert report["total_mem"] == 16 * GiB and successes(report) == 5
    assert "VGPULIMIT_REGION is not set, though VGPULIMIT_SETTER=slurm" in shed.stderr
    no_shim = node.command("srun", "--gres=shard:2", "sh", "-c", f"env -u LD_PRELOAD {fill}")
    [report] = [json.loads(m) for m in no_shim.stdout.splitlines() if m.startswith("{")]
    assert report["total_mem"] == 16 * GiB and successes(report) == 5


# -- a job's region found by its cgroup, without Slurm --------------------------------------------


def cgroup2_mount() -> Path | None:
    """Where cgroup v2 is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified
    on a host of both), or None."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


@pytest.fixture
def job_cgroup(sim_env):
    """A cgroup as Slurm's cgroup/v2 makes one for a job's step
    (.../slurmstepd.scope/job_<id>/step_0), and the region the Prolog would
    have made for the job's 2 of 8 shards at the shim's place for it."""
    from vgpulimit.region import MAX_DEVICES, Region

    if os.geteuid() != 0:
        pytest.skip("making a cgroup and the Prolog's directory needs root")
    mount = cgroup2_mount()
    if mount is None or not os.access(mount, os.W_OK):
        pytest.skip("no writable cgroup v2 hierarchy here")
    job_id = str(random.randrange(10**8, 10**9))   # no real job's
    top = mount / f"vgpulimit-test-{os.getpid()}-{job_id}"
    step = top / "slurmstepd.scope" / f"job_{job_id}" / "step_0"
    entry = Path(hooks.NODE_DIR) / job_id
    try:
        step.mkdir(parents=True)
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup in {mount}: {exc.strerror}")
    try:
        entry.mkdir(parents=True)
        with Region.create(entry / "region", [MemoryLimit(bytes=0, ppm=250_000)] * MAX_DEVICES,
                           [25] * MAX_DEVICES, group_shared=True):
            pass
        yield step, entry
    finally:
        shutil.rmtree(entry, ignore_errors=True)
        for cgroup in (step, step.parent, step.parent.parent, top):
            with contextlib.suppress(OSError):
                cgroup.rmdir()


def fill_in(cgroup: Path | None, env: dict[str, str], count: int = 5) -> tuple[dict, str]:
    """cuda_fill.py run in ``cgroup`` (moved there before it starts)."""
    enter = f'echo $$ > "{cgroup}/cgroup.procs" && ' if cgroup else ""
    done = subprocess.run(["sh", "-c", f'{enter}exec "$@"', "sh", sys.executable, FILL, str(GiB), str(count)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    [report] = [json.loads(m) for m in done.stdout.splitlines() if m.startswith("{")]
    return report, done.stderr


def test_a_job_process_that_sheds_its_region_keeps_its_job_cap_by_its_cgroup(job_cgroup, sim_env, shim_path):
    """As a Slurm job's task whose VGPULIMIT_REGION was unset or pointed at a
    region it made (the shim still preloaded): its cgroup, which it cannot
    change, names its job, and the job's region applies, whatever limit
    variables it sets."""
    from vgpulimit.region import MAX_DEVICES, Region

    step, entry = job_cgroup
    shed = dict(sim_env, LD_PRELOAD=str(shim_path), VGPULIMIT_SETTER="slurm")
    report, err = fill_in(step, shed)
    assert report["total_mem"] == 4 * GiB and successes(report) == 4, report
    assert f"runs under its Slurm job's region {entry}/region, found by the job's cgroup" in err
    loosened = dict(shed, VGPULIMIT_MEMORY="100%", CUDA_DEVICE_MEMORY_LIMIT="16g", CUDA_DISABLE_CONTROL="true",
                    CUDA_DEVICE_MEMORY_SHARED_CACHE=str(entry.parent / "own.cache"))
    report, _ = fill_in(step, loosened)
    assert report["total_mem"] == 4 * GiB and successes(report) == 4, report
    # A region of its own making, however loose, is not the job's: ignored, said so.
    own = entry.parent / f"own-{entry.name}"
    with Region.create(own, [MemoryLimit(bytes=0, ppm=1_000_000)] * MAX_DEVICES, [100] * MAX_DEVICES):
        report, err = fill_in(step, dict(shed, VGPULIMIT_REGION=str(own)))
    own.unlink()
    assert report["total_mem"] == 4 * GiB and successes(report) == 4, report
    assert f'VGPULIMIT_REGION="{own}" ignored: this process runs under its Slurm job\'s region' in err
    # Out of the job's cgroup, or once its region is gone, it is as before: no region, no cap.
    report, _ = fill_in(None, shed)
    assert report["total_mem"] == 16 * GiB and successes(report) == 5, report
    shutil.rmtree(entry)
    report, _ = fill_in(step, shed)
    assert report["total_mem"] == 16 * GiB and successes(report) == 5, report


# -- MPS GRES capped as shards, on a real Slurm of its own -----------------------------------------


@pytest.fixture(scope="module")
def mps_node(tmp_path_factory, simgpu_dir):
    """A Slurm whose GPU is shards and MPS GRES (Gres=gpu:1,shard:8,mps:100:
    slurm 22.05.8 takes both on one node), installed with --mps."""
    why = slurm_unavailable()
    if why:
        pytest.skip(why)
    state = tmp_path_factory.mktemp("simgpu-mps")
    job_env = base_env(LD_LIBRARY_PATH=str(simgpu_dir), SIMGPU_STATE=str(state / "simgpu.state"),
                       SIMGPU_MEMORY="16GiB", SIMGPU_CONTEXT_OVERHEAD="0", SIMGPU_RESERVED="0")
    with cluster(job_env, mps=True) as node:
        yield node


def test_an_mps_job_is_capped_at_its_percent_where_the_site_says_so(mps_node, tmp_path):
    """--gres=mps:25 of a GPU of mps:100: 25 % of its memory (4 of 16 GiB) and
    of its time, as 2 of 8 shards; a shard job on the same node is capped as
    before; the whole GPU's job (gpu:1) is left alone."""
    hold = tmp_path / "hold"
    job = srun(mps_node, "--gres=mps:25", hold=hold, count=5)
    try:
        [report] = reports(job, 1)
        assert report["total_mem"] == 16 * GiB * 25 // MPS and successes(report) == 4, report
        [region] = status_all(mps_node)["regions"]
        assert region["identity"]["shards"] == "25/100"
        assert region["devices"][0]["cores_pct"] == 25
    finally:
        hold.touch()
    assert job.wait(timeout=60) == 0
    mps_node.wait_idle()
    [report] = reports(srun(mps_node, "--gres=shard:6", count=13), 1)
    assert report["total_mem"] == 12 * GiB and successes(report) == 12, report
    mps_node.wait_idle()
    whole = srun(mps_node, "--gres=gpu:1", count=17)
    [report] = reports(whole, 1)
    assert report["total_mem"] == 16 * GiB and successes(report) == 16
    assert whole.wait(timeout=60) == 0

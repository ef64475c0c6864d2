"""The cap holds in ordinary use: programs run one after another, limits
from HAMi's variables or from the environment alone, a nested run, a path
that does not exist.  Each test is a case of issue 9 that failed before."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import GiB, MiB, run, vgpulimit_cmd

from vgpulimit.limits import parse_memory
from vgpulimit.region import Region

CLIENTS = Path(__file__).resolve().parent / "clients"
HOLD = [sys.executable, str(CLIENTS / "hold.py")]


@pytest.fixture
def costly_env(sim_env):
    """A simulated GPU whose contexts cost 300 MiB each, as real ones cost."""
    return dict(sim_env, SIMGPU_CONTEXT_OVERHEAD="300MiB")


def test_a_run_of_programs_under_a_supervisor_all_fit(costly_env):
    # Each program alone takes 400 MiB of a 1 GiB cap; the dead must give theirs back.
    loop = " && ".join(f"{' '.join(HOLD)} 100 && echo ok{i}" for i in range(6))
    result = run(vgpulimit_cmd("run", "--simulate", "--memory", "1GiB", "--", "sh", "-c", loop),
                 costly_env)
    assert result.stdout.split() == [f"ok{i}" for i in range(6)], result.stderr


def test_a_run_of_programs_without_a_supervisor_all_fit(costly_env, shim_path, tmp_path):
    region = tmp_path / "region"
    env = dict(costly_env, LD_PRELOAD=str(shim_path), CUDA_DEVICE_MEMORY_SHARED_CACHE=str(region),
               VGPULIMIT_MEMORY="1GiB")
    for _ in range(6):
        run([*HOLD, "100"], env)
    with Region.open(region) as opened:
        snapshot = opened.snapshot()
    # The last program's 400 MiB may still be listed until the next one starts; no more.
    assert snapshot.devices[0].used_bytes <= 400 * MiB
    assert len(snapshot.processes) <= 1


def test_a_new_limit_in_the_environment_alone_is_the_one_that_holds(sim_env, shim_path):
    env = dict(sim_env, LD_PRELOAD=str(shim_path))
    run([*HOLD, "3000"], dict(env, VGPULIMIT_MEMORY="8GiB"))
    # The earlier program's region, made for 8 GiB, is not this one's.
    refused = run([*HOLD, "3000"], dict(env, VGPULIMIT_MEMORY="1GiB"), check=False)
    assert refused.returncode == 1
    assert "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY" in refused.stderr
    assert "region" not in refused.stderr.split("refused")[0]  # no stale-region warning
    run([*HOLD, "900"], dict(env, VGPULIMIT_MEMORY="1GiB"))


@pytest.mark.parametrize("runtime", ["exists", "missing"])
def test_the_shim_and_run_pick_the_same_runtime_directory(sim_env, shim_path, tmp_path, runtime):
    """Limits in the environment alone: the shim keeps its region in the first
    runtime directory it may make (paths.h), the one `vgpulimit run` picks; an
    XDG_RUNTIME_DIR that does not exist is passed over by both."""
    from vgpulimit._paths import runtime_dirs

    xdg, tmp = tmp_path / "xdg", tmp_path / "tmp"
    tmp.mkdir()
    if runtime == "exists":
        xdg.mkdir(mode=0o700)
    # A limit of its own: a region no other test or run has made.
    env = dict(sim_env, LD_PRELOAD=str(shim_path), VGPULIMIT_MEMORY=f"{GiB + os.getpid()}",
               XDG_RUNTIME_DIR=str(xdg), TMPDIR=str(tmp))
    expected = [d for d in runtime_dirs(env) if d != xdg / "vgpulimit" or runtime == "exists"]
    expected = expected[0] if os.access(expected[0].parent, os.W_OK) else expected[1]
    before = set(expected.glob("env-v*.region"))
    run([*HOLD, "100"], env)
    made = set(expected.glob("env-v*.region")) - before
    try:
        assert len(made) == 1, f"no new region in {expected}"
        ask = "from vgpulimit.placement import runtime_base; print(runtime_base())"
        picked = run([sys.executable, "-c", ask], env).stdout.strip()
        assert Path(picked) == expected
    finally:
        for path in made:
            path.unlink()


def test_a_region_of_the_environment_left_behind_takes_the_next_limits(sim_env, shim_path,
                                                                        tmp_path):
    # A device plugin names the path (HAMi's cache file) and the limit; the pod
    # comes back with another limit, the file is still there.
    path = tmp_path / "vgpu.cache"
    env = dict(sim_env, LD_PRELOAD=str(shim_path), CUDA_DEVICE_MEMORY_SHARED_CACHE=str(path))
    run([*HOLD, "100"], dict(env, CUDA_DEVICE_MEMORY_LIMIT="8192m"))
    refused = run([*HOLD, "3000"], dict(env, CUDA_DEVICE_MEMORY_LIMIT="1024m"), check=False)
    assert refused.returncode == 1, refused.stderr
    with Region.open(path) as region:
        assert region.snapshot().devices[0].cap_bytes == GiB


def test_a_region_set_up_by_a_supervisor_is_not_re_made_by_the_environment(sim_env, shim_path,
                                                                            tmp_path):
    # `vgpulimit run` made it: no process's variables may loosen it, held or not.
    path = tmp_path / "region"
    inner = f"VGPULIMIT_MEMORY=8GiB {' '.join(HOLD)} 3000"
    result = run(vgpulimit_cmd("run", "--simulate", "--memory", "1GiB", "--region", str(path),
                               "--", "sh", "-c", inner), sim_env, check=False)
    assert result.returncode == 1
    assert "CUDA_ERROR_OUT_OF_MEMORY" in result.stderr
    assert "VGPULIMIT_MEMORY is not what the region" in result.stderr


def test_a_nested_run_cannot_loosen_the_outer_cap(sim_env):
    result = run(vgpulimit_cmd("run", "--simulate", "--memory", "1GiB", "--",
                               *vgpulimit_cmd("run", "--simulate", "--memory", "100%", "--"),
                               *HOLD, "2000"), sim_env, check=False)
    assert result.returncode == 1
    assert "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY" in result.stderr
    assert "--memory 100% is looser than the 1 GiB of the region" in result.stderr
    fits = run(vgpulimit_cmd("run", "--simulate", "--memory", "1GiB", "--",
                             *vgpulimit_cmd("run", "--simulate", "--"), *HOLD, "900"), sim_env)
    assert fits.returncode == 0


def test_a_nested_run_is_told_each_limit_looser_than_its_regions():
    """The comparison alone (request.looser), fed devices as a region holds
    them: a size over a size, a share over a size once the device's size is
    seen, the whole device over any size, a share over a share, a higher
    compute share.  A tighter limit, or one where the region holds none, is
    not said."""
    from vgpulimit.region import MAX_DEVICES, DeviceSnapshot
    from vgpulimit.request import looser, resolve_limits

    def held(index: int, memory: str | None = None, total_bytes: int = 0, cores_pct: int = 0):
        limit = parse_memory(memory, "held") if memory else None
        return DeviceSnapshot(index, limit, None, cores_pct, total_bytes, 0, 0)

    devices = [held(0, "1GiB"), held(1, "1GiB", total_bytes=80 * GiB), held(2, "1GiB"),
               held(3, "50%"), held(4, cores_pct=30), held(5, "2GiB", cores_pct=30)]
    devices += [held(i) for i in range(len(devices), MAX_DEVICES)]
    asked = resolve_limits(None, ["0=2GiB", "1=50%", "2=100%", "3=60%", "4=1GiB", "5=1GiB"], {},
                           cores_device=["4=60", "5=20", "0=20"])
    lines = looser(asked, devices, "/r")
    tail = " of the region /r this runs in, which holds too (a nested run can only tighten)"
    assert lines == [f"--memory-device 0 2GiB is looser than the 1 GiB{tail}",
                     f"--memory-device 1 50% is looser than the 1 GiB{tail}",
                     f"--memory-device 2 100% is looser than the 1 GiB{tail}",
                     f"--memory-device 3 60% is looser than the 50% of the device{tail}",
                     f"--cores-device 4 60 is looser than the 30%{tail}"]


def test_a_nested_run_tightens_the_outer_cap(sim_env):
    def nested(mib):
        return run(vgpulimit_cmd("run", "--simulate", "--memory", "1GiB", "--",
                                 *vgpulimit_cmd("run", "--simulate", "--memory", "512MiB", "--"),
                                 *HOLD, str(mib)), sim_env, check=False)
    assert nested(400).returncode == 0
    refused = nested(600)
    assert refused.returncode == 1
    assert "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY" in refused.stderr
    assert "cap 512 MiB" in refused.stderr and "looser" not in refused.stderr


def test_what_a_nested_run_uses_counts_in_the_outer_cap(sim_env, tmp_path):
    """The outer run's own program holds 600 MiB; a nested run capped at 800 MiB
    gets 424 MiB, what is left of the outer 1 GiB, not 800."""
    report, release = tmp_path / "held", tmp_path / "release"
    fill = " ".join([sys.executable, str(CLIENTS / "cuda_fill.py"), str(600 * MiB), "1",
                     "--hold", str(release)])
    inner = " ".join([*vgpulimit_cmd("run", "--simulate", "--memory", "800MiB", "--"), *HOLD])
    script = (f"{fill} > {report} & "
              f"while ! [ -s {report} ]; do sleep 0.05; done; "
              f"{inner} 500; echo refused=$?; {inner} 400; echo fits=$?; touch {release}; wait")
    result = run(vgpulimit_cmd("run", "--simulate", "--memory", "1GiB", "--", "sh", "-c", script),
                 sim_env)
    assert "refused=1" in result.stdout and "fits=0" in result.stdout, result.stderr
    assert "in use by the run this one is nested in" in result.stderr


def test_a_nested_run_names_its_region_and_still_counts_in_the_outer(sim_env, tmp_path):
    mine = tmp_path / "mine"
    result = run(vgpulimit_cmd("run", "--simulate", "--memory", "1GiB", "--",
                               *vgpulimit_cmd("run", "--simulate", "--region", str(mine), "--"),
                               *HOLD, "2000"), sim_env, check=False)
    assert result.returncode == 1
    assert "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY" in result.stderr


def test_the_shim_creates_no_directory_it_is_named(sim_env, shim_path, tmp_path):
    missing = tmp_path / "no" / "such" / "dir"
    env = dict(sim_env, LD_PRELOAD=str(shim_path), CUDA_DEVICE_MEMORY_SHARED_CACHE=str(missing / "region"),
               VGPULIMIT_MEMORY="1GiB")
    result = run([*HOLD, "10"], env, check=False)
    assert result.returncode == 1  # fail closed
    assert "its directory does not exist" in result.stderr
    assert result.stderr.count("its directory does not exist") == 1
    assert not (tmp_path / "no").exists()


@pytest.fixture
def runtime_region(tmp_path):
    """A region at /.vgpulimit/region as the hook mounts it, seen only inside a
    private mount namespace (`unshare --mount`): the host's / stays as it was
    but for an empty /.vgpulimit mount point, removed afterwards."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and util-linux unshare to mount over /.vgpulimit")
    # Root is not enough: an unprivileged container or a chroot may refuse one.
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, text=True,
                           check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here: {probe.stderr.strip()}")
    made = not os.path.exists("/.vgpulimit")
    if made:
        os.mkdir("/.vgpulimit", 0o755)
    (tmp_path / "ctr").mkdir()
    Region.create(tmp_path / "ctr" / "region", [parse_memory("1GiB")] * 16).close()
    yield tmp_path / "ctr"
    if made:
        os.rmdir("/.vgpulimit")


@pytest.mark.parametrize("variables", [
    {"VGPULIMIT_REGION": "{tmp}/mine", "VGPULIMIT_MEMORY": "8GiB"},
    {"CUDA_DEVICE_MEMORY_SHARED_CACHE": "{tmp}/x"},
    {"CUDA_DEVICE_MEMORY_LIMIT": "8g"},
    {"VGPULIMIT_MEMORY": "lots"},
])
def test_a_process_cannot_loosen_the_region_its_runtime_set_up(runtime_region, sim_env, shim_path,
                                                               variables, tmp_path):
    variables = {k: v.format(tmp=tmp_path) for k, v in variables.items()}
    env = dict(sim_env, LD_PRELOAD=str(shim_path), **variables)
    inside = f"mount --bind {runtime_region} /.vgpulimit && exec \"$@\""
    cmd = ["unshare", "--mount", "sh", "-c", inside, "sh"]
    refused = run([*cmd, *HOLD, "2000"], env, check=False)
    assert refused.returncode == 1
    assert "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY" in refused.stderr
    assert "ignored" in refused.stderr and "set up by its runtime" in refused.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "mine").exists()
    run([*cmd, *HOLD, "900"], env)  # the runtime's cap, 1 GiB, holds


def test_a_region_that_is_not_nested_in_the_runtimes_is_ignored(runtime_region, sim_env, shim_path,
                                                               tmp_path):
    mine = tmp_path / "mine"
    Region.create(mine).close()  # no cap, and nested in nothing
    env = dict(sim_env, LD_PRELOAD=str(shim_path), VGPULIMIT_REGION=str(mine))
    inside = f"mount --bind {runtime_region} /.vgpulimit && exec \"$@\""
    refused = run(["unshare", "--mount", "sh", "-c", inside, "sh", *HOLD, "2000"], env, check=False)
    assert refused.returncode == 1
    assert "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY" in refused.stderr
    assert f"VGPULIMIT_REGION=\"{mine}\" is ignored" in refused.stderr


def test_a_nested_run_in_a_container_of_the_hook_tightens_its_cap(runtime_region, sim_env):
    def nested(memory, mib):
        inside = f"mount --bind {runtime_region} /.vgpulimit && exec \"$@\""
        return run(["unshare", "--mount", "sh", "-c", inside, "sh",
                    *vgpulimit_cmd("run", "--simulate", "--memory", memory, "--"), *HOLD, str(mib)],
                   sim_env, check=False)
    refused = nested("512MiB", 600)
    assert refused.returncode == 1
    assert "cap 512 MiB" in refused.stderr and "ignored" not in refused.stderr
    loosened = nested("8GiB", 2000)
    assert loosened.returncode == 1
    assert "--memory 8GiB is looser than the 1 GiB of the region /.vgpulimit/region" in loosened.stderr
    assert "in use by the run this one is nested in" in loosened.stderr


# -- a process that edits its own environment (docs/threat-model.md) ----------------------------

FILL_2GIB = [sys.executable, str(CLIENTS / "cuda_fill.py"), str(2 * GiB), "1"]


@pytest.mark.parametrize("edit, says", [
    ([], "it runs with no limit"),
    (["VGPULIMIT_MEMORY=4GiB"], "it runs under its own limit variables only"),
    (["CUDA_DEVICE_MEMORY_SHARED_CACHE={region}"], "it runs in another region, under its limits"),
])
def test_a_process_that_drops_the_region_run_gave_it_is_told_so(sim_env, tmp_path, edit, says):
    """`env -u VGPULIMIT_REGION` sheds run's region, with the shim still
    preloaded: the one thing the shim can do is say so, once."""
    edit = [e.format(region=tmp_path / "other.region") for e in edit]
    result = run(vgpulimit_cmd("run", "--simulate", "--memory", "1GiB", "--", "env", "-u",
                               "VGPULIMIT_REGION", *edit, *FILL_2GIB), sim_env)
    [line] = result.stderr.splitlines()
    assert line.endswith("warning: VGPULIMIT_REGION is not set, though VGPULIMIT_SETTER=run says this "
                         f"process was given a region: {says}")


def test_a_process_with_the_shim_and_no_limits_says_nothing(sim_env, shim_path):
    """A node that preloads the shim everywhere: a process that was never
    given limits stays silent."""
    result = run(FILL_2GIB, dict(sim_env, LD_PRELOAD=str(shim_path)))
    assert result.stderr == ""
    assert '"allocs": ["CUDA_SUCCESS"]' in result.stdout

"""Faults and careless input (issue 26): what a tenant, a careless user or a
bad day does, and what they now see.  Each case fails closed and says so in
one line naming the variable, flag or file; no wait on a lock someone else
holds lasts past its bound; a full filesystem crashes nothing and leaves
nothing behind; nothing the user had is lost."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import TESTS, GiB, MiB, base_env, compile_c, run, vgpulimit_cmd
from helpers import one_error_line, vgpulimit

from vgpulimit.limits import parse_memory
from vgpulimit.region import Region, ffi

CLIENTS = TESTS / "clients"
HOLD = [sys.executable, str(CLIENTS / "hold.py")]
# The longest a lock is waited for (shim/src/internal.h, simgpu/state.c), and
# what a test allows a bounded wait on a loaded machine.
LOCK_WAIT_S = 2
BOUND_S = 30


def allocs(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("alloc")]


# -- 1. a region named by VGPULIMIT_REGION is never made by the shim ------------------------------


def test_a_region_removed_under_run_is_not_made_again_uncapped(sim_env):
    """A process removes its region and starts a program: the program does
    not get a fresh region with no cap (3 GiB under a 1 GiB cap): its CUDA
    fails closed, with one line naming the file and who makes it."""
    script = f'rm -f "$VGPULIMIT_REGION"; {" ".join(HOLD)} 3000'
    result = vgpulimit("run", "--simulate", "--memory", "1GiB", "--", "sh", "-c", script, env=sim_env)
    assert result.returncode == 1
    assert "hold: cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY" in result.stderr
    [line] = [ln for ln in result.stderr.splitlines() if "region file" in ln]
    assert "(VGPULIMIT_REGION): no such file" in line
    assert "made by `vgpulimit run`, the OCI hook or a CDI device, never by the shim" in line


@pytest.mark.parametrize("limit", [{}, {"VGPULIMIT_MEMORY": "8GiB"}])
def test_a_new_path_in_VGPULIMIT_REGION_gets_no_region(sim_env, tmp_path, limit):
    """Under `run`, a process that names another region (with a looser limit
    or none) gets no uncapped region of its own there."""
    elsewhere = tmp_path / "mine"
    script = f'VGPULIMIT_REGION={elsewhere} {" ".join(HOLD)} 3000'
    env = dict(sim_env, **limit)
    result = vgpulimit("run", "--simulate", "--memory", "1GiB", "--", "sh", "-c", script, env=env)
    assert result.returncode == 1
    assert "hold: cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY" in result.stderr
    assert f"region file {elsewhere} (VGPULIMIT_REGION): no such file" in result.stderr
    assert not elsewhere.exists()


def test_hamis_shared_cache_is_still_made_on_first_use(sim_env, shim_path, tmp_path):
    cache = tmp_path / "vgpu.cache"
    env = dict(sim_env, LD_PRELOAD=str(shim_path), CUDA_DEVICE_MEMORY_SHARED_CACHE=str(cache),
               CUDA_DEVICE_MEMORY_LIMIT="1024m")
    assert run([*HOLD, "3000"], env, check=False).returncode == 1   # the cap holds
    run([*HOLD, "900"], env)
    assert cache.exists()


# -- 2. a CDI spec that limits nothing is asked for by name ---------------------------------------


def test_cdi_generate_without_a_limit_is_refused():
    line = one_error_line(vgpulimit("cdi", "generate"), 2)
    assert "cdi generate: no limit given" in line
    assert "--memory none --cores none" in line


def test_cdi_generate_of_no_limit_asked_for_by_name():
    result = vgpulimit("cdi", "generate", "--memory", "none", "--cores", "none")
    assert result.returncode == 0, result.stderr
    [device] = json.loads(result.stdout)["devices"]
    assert device["name"] == "shim" and "env" not in device["containerEdits"]
    result = vgpulimit("cdi", "generate", "--memory", "none", "--cores", "30")
    assert json.loads(result.stdout)["devices"][0]["containerEdits"]["env"] == ["VGPULIMIT_CORES=30",
                                                                          "VGPULIMIT_CORES_POLICY=hard"]


def test_the_daemonsets_cdi_command_runs(tmp_path):
    yaml = pytest.importorskip("yaml", reason="PyYAML is a test dependency")
    manifest = Path(__file__).resolve().parent.parent / "deploy" / "vgpulimit.yaml"
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    [daemonset] = [d for d in docs if d["kind"] == "DaemonSet"]
    [cdi] = [c for c in daemonset["spec"]["template"]["spec"]["initContainers"]
             if c["name"] == "install-cdi"]
    args = cdi["command"][3:]
    args[args.index("--output") + 1] = str(tmp_path / "spec.json")
    result = vgpulimit(*args)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "spec.json").read_text())["devices"][0]["name"] == "shim"


# -- 3. a flag given twice --------------------------------------------------------------------------


@pytest.mark.parametrize("args, says", [
    (["run", "--memory", "1GiB", "--memory", "2GiB", "--", "true"],
     "--memory is given twice ('1GiB', then '2GiB'); give it once"),
    (["run", "--cores", "30", "--cores", "60", "--", "true"], "--cores is given twice"),
    (["set", "--memory", "1GiB", "--memory", "none"],
     "--memory is given twice ('1GiB', then 'none'); give it once"),
    (["status", "--region", "a", "--region", "b"], "--region is given twice"),
    (["cdi", "generate", "--memory", "1GiB", "--memory", "2GiB"], "--memory is given twice"),
])
def test_a_flag_given_twice_is_refused(tmp_path, args, says):
    region = tmp_path / "region"
    Region.create(region, {0: parse_memory("4GiB")}).close()
    env = dict(base_env(), VGPULIMIT_REGION=str(region))
    line = one_error_line(vgpulimit(*args, env=env, cwd=tmp_path), 2)
    assert says in line
    with Region.open(region) as opened:   # nothing changed
        assert opened.snapshot().devices[0].cap_bytes == 4 * GiB


def test_a_unit_without_a_count_of_units_is_refused(tmp_path):
    line = one_error_line(vgpulimit("run", "--unit", "128Mi", "--", "true"), 2)
    assert "--unit is the size of one --memory-units unit, and no --memory-units is given" in line


def test_units_still_make_a_cap(sim_env):
    result = vgpulimit("run", "--simulate", "--memory-units", "8", "--unit", "128Mi", "--",
                       *HOLD, "1100", env=sim_env)
    assert result.returncode == 1 and "CUDA_ERROR_OUT_OF_MEMORY" in result.stderr


# -- 4. too few file descriptors for NVML --------------------------------------------------------


@pytest.mark.parametrize("how", ["run", "preload"])
def test_too_few_descriptors_for_nvml_never_let_the_process_past_its_cap(sim_env, shim_path, cbin, how):
    """With NVML out of reach (`ulimit -n`: no descriptor left to load it), the
    context's cost (518 MiB here) cannot be read: a 1 GiB cap let the process
    hold 1542 MiB, the context uncounted.  Now contexts and allocations under
    the cap are refused, said in one line with the cause: what the driver
    holds for the process never passes the cap, at any descriptor limit."""
    env = dict(sim_env, SIMGPU_CONTEXT_OVERHEAD="518MiB")
    env.pop("VGPULIMIT_LOG", None)
    client = [str(cbin / "alloc_client"), "link", str(64 * MiB), "40"]
    if how == "run":
        cmd = [*map(str, vgpulimit_cmd("run", "--simulate", "--memory", "1GiB", "--", *client))]
    else:
        cmd, env = client, dict(env, LD_PRELOAD=str(shim_path), VGPULIMIT_MEMORY="1GiB")
    refused = []
    for limit in range(5, 12):   # from the fewest the client's own files leave room in
        result = subprocess.run(["sh", "-c", f'ulimit -n {limit} && exec "$@"', "sh", *cmd], env=env,
                                capture_output=True, text=True, timeout=60, check=False)
        context = 0 if "no context" in result.stderr else 518 * MiB
        granted = [line for line in allocs(result.stdout) if line.endswith(" 0")]
        held = context + 64 * MiB * len(granted)
        assert held <= GiB, (limit, held // MiB, result.stderr)
        lines = [ln for ln in result.stderr.splitlines() if "cannot be counted against the cap" in ln]
        if lines:
            refused.append(lines)
    assert refused, "NVML was never out of reach"
    for lines in refused:
        assert len(lines) == 1 and ": error: " in lines[0], lines
        assert "libnvidia-ml.so.1" in lines[0] or "nvmlInit" in lines[0]
        assert lines[0].endswith("so contexts and device memory under it are refused")


# -- 5. a runtime directory made by another user --------------------------------------------------


@contextmanager
def as_user_dir():
    """A world-readable directory outside pytest's (root's alone)."""
    with tempfile.TemporaryDirectory() as directory:
        os.chmod(directory, 0o755)
        yield Path(directory)


@pytest.mark.parametrize("mode", [0o755, 0o777])
def test_a_runtime_directory_another_user_made_is_not_used(sim_env, shim_path, cbin, mode):
    """The bare preload with no XDG_RUNTIME_DIR uses $TMPDIR/vgpulimit-<uid>;
    another user made it first.  Its region is not put there (0777: where its
    owner could swap it), nor is every allocation refused with a bare
    "permission denied" (0755): the line names the directory and its owner."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as two users")
    victim, attacker = 4242, 4343
    with as_user_dir() as top:
        client = top / "alloc_client"
        shutil.copy(cbin / "alloc_client", client)
        # The installed package may sit where the victim cannot read (a
        # Python under /root): the shim and the simulated driver go beside the client.
        shim = top / "libvgpulimit.so"
        shutil.copy(shim_path, shim)
        driver = top / "driver"
        shutil.copytree(sim_env["LD_LIBRARY_PATH"], driver)
        tmpdir = top / "tmp"
        tmpdir.mkdir(mode=0o1777)
        os.chmod(tmpdir, 0o1777)
        planted = tmpdir / f"vgpulimit-{victim}"
        planted.mkdir()
        os.chown(planted, attacker, attacker)
        os.chmod(planted, mode)
        state = top / "simgpu"
        state.mkdir()
        os.chown(state, victim, victim)
        env = dict(sim_env, LD_PRELOAD=str(shim), LD_LIBRARY_PATH=str(driver), VGPULIMIT_MEMORY="1GiB",
                   TMPDIR=str(tmpdir), SIMGPU_STATE=str(state / "state"))
        env.pop("XDG_RUNTIME_DIR")
        result = subprocess.run(["setpriv", f"--reuid={victim}", f"--regid={victim}", "--clear-groups",
                                 str(client), "link", str(256 * MiB), "2"],
                                env=env, capture_output=True, text=True, timeout=60, check=False)
        left = os.listdir(planted)
    if "/run/vgpulimit" in result.stderr:
        pytest.skip("this machine lets the user make /run/vgpulimit")
    assert result.returncode == 0, result.stderr
    assert allocs(result.stdout) == ["alloc 0 2", "alloc 1 2"]   # fail closed
    [line] = [ln for ln in result.stderr.splitlines() if "region file" in ln]
    assert f"its directory {planted} is " in line
    assert f"owner uid {attacker}" in line and f"this user's own (uid {victim})" in line
    assert left == []


def test_run_names_the_owner_of_a_runtime_directory_it_cannot_use(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to make a directory of another user's")
    from vgpulimit.placement import _private_dir

    planted = tmp_path / "vgpulimit-0"
    planted.mkdir()
    os.chown(planted, 4343, 4343)
    with pytest.raises(OSError) as raised:
        _private_dir(planted)
    assert "owned by another user (uid 4343, not 0)" in str(raised.value)


# -- 6, 7. the region lock: a word a tenant wrote, a holder that stopped -------------------------

LOCK_AT = ffi.offsetof("struct vgl_region", "lock")

# Takes the lock at OFFSET in FILE, says so, stops itself; once continued,
# lets it go and exits.  The word is glibc's own, as a process of the
# container writes it while it holds the lock.
HOLDER = """
import ctypes, mmap, os, signal, sys
path, offset = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_RDWR)
image = mmap.mmap(fd, 0)
lock = ctypes.byref((ctypes.c_char * len(image)).from_buffer(image), offset)
libc = ctypes.CDLL(None)
print(libc.pthread_mutex_lock(lock), os.getpid(), flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
libc.pthread_mutex_unlock(lock)
"""


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


@contextmanager
def stopped_holder(path: Path, offset: int, env=None):
    """A process stopped while it holds the lock at `offset` of `path`."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), str(offset)],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().split() == ["0", str(proc.pid)]
        deadline = time.monotonic() + BOUND_S
        while not stopped(proc.pid):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        yield proc
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.wait(timeout=60)


def write_lock_word(path: Path, word: int) -> None:
    with open(path, "r+b") as f:
        f.seek(LOCK_AT)
        f.write(word.to_bytes(4, "little"))


def timed(cmd, env, timeout=BOUND_S) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    result = run(cmd, env, timeout=timeout, check=False)
    return result, time.monotonic() - start


@pytest.fixture
def capped_region(tmp_path) -> Path:
    path = tmp_path / "region"
    Region.create(path, {0: parse_memory("1GiB")}).close()
    return path


def test_set_does_not_hang_on_a_stopped_holder_and_says_why(capped_region):
    with stopped_holder(capped_region, LOCK_AT) as holder:
        result, took = timed(vgpulimit_cmd("set", "--memory", "2GiB", "--region", capped_region),
                             base_env())
    line = one_error_line(result, 1)
    assert "its lock was held past its bound (a process stopped while holding it" in line
    assert took < LOCK_WAIT_S + 10
    result = run(vgpulimit_cmd("set", "--memory", "2GiB", "--region", capped_region), base_env())
    assert "memory 1 GiB → 2 GiB" in result.stdout   # once it let go
    assert holder.returncode == 0


def test_a_new_process_fails_closed_for_the_call_while_a_holder_is_stopped(
        capped_region, sim_env, shim_path, cbin):
    env = dict(sim_env, LD_PRELOAD=str(shim_path), VGPULIMIT_REGION=str(capped_region))
    client = [cbin / "alloc_client", "link", str(256 * MiB), "2"]
    with stopped_holder(capped_region, LOCK_AT) as holder:
        result, took = timed(client, env)
        assert result.returncode == 0, result.stderr
        assert allocs(result.stdout) == ["alloc 0 2", "alloc 1 2"]
        assert f"the region lock of {capped_region} was held for more than {LOCK_WAIT_S} s by thread " \
            f"{holder.pid} (a process stopped while holding it" in result.stderr
        assert took < 4 * LOCK_WAIT_S + 15
    # Let go, it works again.
    assert allocs(run(client, env).stdout) == ["alloc 0 0", "alloc 1 0"]


def test_a_process_waits_out_a_stopped_holder_once_not_at_every_call(
        capped_region, sim_env, shim_path, cbin):
    """A program that allocates in a loop while a holder is stopped: every
    allocation is refused, but only the first waits the bound; the later
    ones, seeing the same holder, give up at once.  Before, each waited the
    bound (twice: for a slot and to reclaim), 40 s and more for ten."""
    count = 10
    env = dict(sim_env, LD_PRELOAD=str(shim_path), VGPULIMIT_REGION=str(capped_region))
    client = [cbin / "alloc_client", "link", str(MiB), str(count)]
    with stopped_holder(capped_region, LOCK_AT):
        try:
            result = run(client, env, timeout=5 * LOCK_WAIT_S + 5, check=False)
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"{count} refused allocations took more than {e.timeout} s") from None
    assert allocs(result.stdout) == [f"alloc {i} 2" for i in range(count)], result
    assert f"the region lock of {capped_region} was held for more than {LOCK_WAIT_S} s" in result.stderr


def test_a_lock_word_a_tenant_wrote_stalls_nobody(capped_region, sim_env, shim_path, cbin):
    """A tenant writes the lock word to name pid 1 as the holder: `set` and
    a new process are refused after the bound with one line, not hung."""
    write_lock_word(capped_region, 1)
    result, took = timed(vgpulimit_cmd("set", "--memory", "2GiB", "--region", capped_region),
                         base_env())
    assert "its lock was held past its bound" in one_error_line(result, 1)
    assert took < LOCK_WAIT_S + 10
    env = dict(sim_env, LD_PRELOAD=str(shim_path), VGPULIMIT_REGION=str(capped_region))
    result, took = timed([cbin / "alloc_client", "link", str(256 * MiB), "1"], env)
    assert allocs(result.stdout) == ["alloc 0 2"]
    assert f"the region lock of {capped_region} was held for more than 2 s by thread 1 " in result.stderr


def test_a_lock_word_that_names_no_thread_is_repaired(capped_region):
    write_lock_word(capped_region, 0x3FFFFFFF)   # above any pid_max
    result = run(vgpulimit_cmd("set", "--memory", "2GiB", "--region", capped_region), base_env())
    assert "memory 1 GiB → 2 GiB" in result.stdout
    assert "named no possible thread" in result.stderr


RUN_AND_WRITE = f"""
import os, sys
with open(os.environ["VGPULIMIT_REGION"], "r+b") as f:
    f.seek({LOCK_AT})
    f.write((1).to_bytes(4, "little"))
print("written", os.getpid(), flush=True)
os.execvp("sleep", ["sleep", "300"])
"""


def test_the_supervisor_answers_sigterm_with_a_tenants_lock_word(tmp_path):
    proc = subprocess.Popen(vgpulimit_cmd("run", "--memory", "1GiB", "--region", str(tmp_path / "r"),
                                          "--", sys.executable, "-c", RUN_AND_WRITE),
                            env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sleeper = None
    try:
        said, sleeper = proc.stdout.readline().split()
        assert said == "written"
        time.sleep(1.5)   # the supervisor is in a reclaim by now
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=BOUND_S)
    finally:
        proc.kill()
        proc.wait()
        if sleeper is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(sleeper), signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr


def test_the_supervisor_answers_sigterm_with_a_stopped_holder(tmp_path, capped_region):
    script = f'{sys.executable} -c \'{HOLDER}\' "$VGPULIMIT_REGION" {LOCK_AT} & wait'
    proc = subprocess.Popen(vgpulimit_cmd("run", "--region", str(tmp_path / "r"), "--memory", "1GiB",
                                          "--", "sh", "-c", script),
                            env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    holder = None
    try:
        locked, holder = proc.stdout.readline().split()
        assert locked == "0"
        time.sleep(1.5)
        proc.send_signal(signal.SIGTERM)   # the shell passes it on; the holder is stopped
        proc.wait(timeout=BOUND_S)
    finally:
        if holder is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(holder), signal.SIGCONT)
                os.kill(int(holder), signal.SIGKILL)
        proc.kill()
        proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM


# -- 8. simgpu's state lock ---------------------------------------------------------------------------

SIM_LOCK_AT = 128   # simgpu/state.c: offsetof(struct sim_file, lock)


def test_a_process_stopped_in_the_simulated_driver_hangs_no_other(sim_env, cbin):
    client = [cbin / "alloc_client", "link", str(256 * MiB), "1"]
    run(client, sim_env)   # the state file exists
    state = Path(sim_env["SIMGPU_STATE"])
    with stopped_holder(state, SIM_LOCK_AT, env=sim_env) as holder:
        result, took = timed(client, sim_env)
        assert result.returncode != 0 or "alloc 0 0" not in result.stdout
        assert f"the state lock was held for more than {LOCK_WAIT_S} s by thread {holder.pid}" \
            in result.stderr
        assert took < 4 * LOCK_WAIT_S + 15
    assert "alloc 0 0" in run(client, sim_env).stdout


# -- 9, 10, 11. a full or small filesystem -----------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path):
    """A 64 KiB tmpfs (a region file takes more), or a skip saying why not."""
    mount = tmp_path / "small"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(mount)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip() or 'needs root'}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_run_region_on_a_full_filesystem_is_one_line(sim_env, small_fs):
    region = small_fs / "region"
    result = vgpulimit("run", "--region", str(region), "--memory", "1GiB", "--", "touch",
                       str(small_fs.parent / "started"), env=sim_env)
    line = one_error_line(result, 1)
    assert line == (f"vgpulimit: error: cannot create {region}: no space left on its filesystem for "
                    f"the region's {ffi.sizeof('struct vgl_region') // 1024} KiB (nothing was left behind)")
    assert os.listdir(small_fs) == []
    assert not (small_fs.parent / "started").exists()


def test_run_with_its_runtime_directory_on_a_full_filesystem_is_one_line(sim_env, small_fs):
    env = dict(sim_env, XDG_RUNTIME_DIR=str(small_fs))
    result = vgpulimit("run", "--memory", "1GiB", "--", "true", env=env)
    assert "no space left on its filesystem" in one_error_line(result, 1)
    assert os.listdir(small_fs / "vgpulimit") == []


def test_the_bare_preload_on_a_full_filesystem_runs_on_failing_closed(sim_env, shim_path, cbin, small_fs):
    """The shim's own region cannot be made: the application is not killed
    (SIGBUS), runs on with CUDA failing closed, one line names the path and
    the cause, nothing is left to fail the next run."""
    env = dict(sim_env, LD_PRELOAD=str(shim_path), VGPULIMIT_MEMORY="1GiB", XDG_RUNTIME_DIR=str(small_fs))
    for _ in range(2):
        result = run([cbin / "alloc_client", "link", str(256 * MiB), "2"], env, check=False)
        assert result.returncode == 0, result.stderr
        assert allocs(result.stdout) == ["alloc 0 2", "alloc 1 2"]
        [line] = [ln for ln in result.stderr.splitlines() if "region file" in ln]
        assert str(small_fs / "vgpulimit") in line and "No space left on device" in line
        assert os.listdir(small_fs / "vgpulimit") == []


def test_run_with_a_runtime_directory_out_of_inodes_is_one_line(sim_env, tmp_path):
    mount = tmp_path / "few"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,nr_inodes=2,mode=0700", "tmpfs",
                              str(mount)], capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip() or 'needs root'}")
    try:
        result = vgpulimit("run", "--memory", "1GiB", "--", "true",
                           env=dict(sim_env, XDG_RUNTIME_DIR=str(mount)))
        line = one_error_line(result, 1)
    finally:
        subprocess.run(["umount", str(mount)], check=False)
    assert f"cannot make a directory for the region in {mount / 'vgpulimit'}: No space left on device" \
        in line


# -- 12, 13. values that start with '-', and an empty path ----------------------------------------


@pytest.mark.parametrize("args, says", [
    (["run", "--memory", "-1GiB", "--", "true"],
     "--memory: '-1GiB' is negative (a limit is a size or a share above zero)"),
    (["run", "--cores", "-30", "--", "true"], "--cores: '-30' is negative"),
    (["set", "--memory", "-1GiB", "--region", "r"], "--memory: '-1GiB' is negative"),
    (["top", "--interval", "-5", "--region", "r"],
     "argument --interval: '-5' is not a number of seconds from 0.1 to 3600"),
    (["status", "--interval", "-1", "--region", "r"], "'-1' is not a number of seconds"),
    # top has a flag -1 of its own: a negative number after --interval is still its value
    (["top", "--interval", "-1", "--region", "r"], "'-1' is not a number of seconds"),
])
def test_a_value_that_starts_with_a_dash_is_judged_as_a_value(tmp_path, args, says):
    line = one_error_line(vgpulimit(*args, cwd=tmp_path), 2)
    assert says in line and "expected one argument" not in line


def test_a_missing_value_is_still_missing(tmp_path):
    line = one_error_line(vgpulimit("run", "--memory", "--cores", "30", "--", "true", cwd=tmp_path), 2)
    assert "argument --memory: expected one argument" in line


def test_a_commands_own_dashes_are_its_own(sim_env):
    result = vgpulimit("run", "--", sys.executable, "-c", "import sys; print(sys.argv[1:])",
                       "--memory", "-1GiB", env=sim_env)
    assert result.stdout == "['--memory', '-1GiB']\n", result.stderr


@pytest.mark.parametrize("args", [["run", "--region", "", "--", "true"],
                                  ["status", "--region", ""], ["set", "--region", "", "--memory", "1GiB"]])
def test_an_empty_region_path_is_said_to_be_empty(tmp_path, args):
    line = one_error_line(vgpulimit(*args, cwd=tmp_path), 2)
    assert "--region is empty" in line and str(tmp_path) not in line
    assert os.listdir(tmp_path) == []


# -- 14. the hook of hooks.d and the CDI device on one container ------------------------------------


@pytest.mark.parametrize("cdi_first", [False, True])
def test_a_hook_container_given_the_cdi_device_too_is_set_up_once(tmp_path, cdi_first):
    """podman with the hook in hooks.d runs a container that is also given the
    CDI device: the hook runs twice, with two node directories.  One sets the
    container up, the other sees it done; it starts capped, and its end takes
    all of it back."""
    from runc_bundle import hook_entry, make_bundle, runc_unavailable, tree
    from test_cdi import FILL, apply_edits, spec_of

    reason = runc_unavailable()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("cuda.bindings")
    by_cdi, by_hooks_d = tmp_path / "node-cdi", tmp_path / "node-hooks-d"
    [device] = spec_of("--memory", "1GiB", "--node-dir", str(by_cdi))["devices"]
    bundle = make_bundle(tmp_path, [*FILL, str(256 * MiB), "5", "--hold", "/tmp/release"])
    if cdi_first:
        apply_edits(bundle.config, device["containerEdits"])
    for stage in ("createRuntime", "poststop"):
        bundle.add_hook(stage, hook_entry(by_hooks_d))
    if not cdi_first:
        apply_edits(bundle.config, device["containerEdits"])
    bundle.settle()
    before = tree(bundle.rootfs, dir_times=False, skip=("tmp",))
    proc, container_id = bundle.start()
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        report = json.loads(line)
        assert report["allocs"] == ["CUDA_SUCCESS"] * 4 + ["CUDA_ERROR_OUT_OF_MEMORY"]
        regions = [d / container_id / "region" for d in (by_cdi, by_hooks_d)
                   if (d / container_id / "region").exists()]
        assert len(regions) == 1   # set up once
    finally:
        (bundle.rootfs / "tmp" / "release").touch()
        _, err = proc.communicate(timeout=60)
        bundle.cleanup()
    assert proc.returncode == 0, err
    assert tree(bundle.rootfs, dir_times=False, skip=("tmp",)) == before
    for node in (by_cdi, by_hooks_d):
        assert not node.exists() or os.listdir(node) == []


# -- 15. what a tenant controls reaches no terminal as control characters -------------------------

SPOOF = "\x1b]0;owned\x07\x1b[2J\nfake row\u202e"


def test_status_and_top_show_a_tenants_command_line_safely(sim_env, tmp_path):
    release = tmp_path / "release"
    region = tmp_path / "node" / "c" / "region"
    region.parent.mkdir(parents=True)
    script = tmp_path / "h.py"
    script.write_text(f"import sys, time, os\nfrom cuda.bindings import driver as cu\ncu.cuInit(0)\n"
                      f"ctx = cu.cuDevicePrimaryCtxRetain(cu.cuDeviceGet(0)[1])[1]\ncu.cuCtxSetCurrent(ctx)\n"
                      f"cu.cuMemAlloc(1 << 20)\nprint('held', flush=True)\n"
                      f"while not os.path.exists({str(release)!r}): time.sleep(0.05)\n")
    proc = subprocess.Popen(vgpulimit_cmd("run", "--simulate", "--memory", "1GiB", "--region", str(region),
                                          "--", sys.executable, str(script), SPOOF),
                            env=sim_env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "held\n"
        outputs = [run(vgpulimit_cmd("status", "--interval", "0", "--region", str(region)), sim_env).stdout,
                   run(vgpulimit_cmd("status", "--interval", "0", "--all", str(region.parent.parent)),
                       sim_env).stdout,
                   run(vgpulimit_cmd("top", "--once", "--region", str(region)),
                       dict(sim_env, COLUMNS="400")).stdout]
        data = json.loads(run(vgpulimit_cmd("status", "--json", "--interval", "0", "--region", str(region)),
                              sim_env).stdout)
    finally:
        release.touch()
        proc.wait(timeout=60)
    for out in outputs:
        assert not any(ord(c) < 32 and c != "\n" or 0x7F <= ord(c) < 0xA0 or c == "\u202e" for c in out)
        assert "fake row" not in out.splitlines()
    assert "h.py \\x1b]0;owned\\x07\\x1b[2J\\nfake row\\u202e" in outputs[2]   # shown, escaped
    assert any(SPOOF in p["host"]["command"] for p in data["processes"] if p.get("host"))


# -- exec: a new image holds no device memory ---------------------------------------------------------

EXEC_CHAIN = """
import os, sys
from cuda.bindings import driver as cu
n = int(sys.argv[1])
cu.cuInit(0)
ctx = cu.cuDevicePrimaryCtxRetain(cu.cuDeviceGet(0)[1])[1]
cu.cuCtxSetCurrent(ctx)
err, _ = cu.cuMemAlloc(700 << 20)
print(n, os.getpid(), cu.cuGetErrorName(err)[1].decode(), flush=True)
if n > 1:
    os.execv(sys.executable, [sys.executable, __file__, str(n - 1)])
"""


def test_each_image_of_an_exec_chain_gets_the_cap_anew(sim_env, tmp_path):
    """A process that holds 700 MiB of a 1 GiB cap and execs itself: as on the
    driver (its files are O_CLOEXEC), the new image holds nothing, and gets its
    own 700 MiB; the shim's slot of the old image goes with it."""
    program = tmp_path / "chain.py"
    program.write_text(EXEC_CHAIN)
    result = vgpulimit("run", "--simulate", "--memory", "1GiB", "--", sys.executable, str(program), "3",
                       env=sim_env)
    lines = [line.split() for line in result.stdout.splitlines()]
    assert [(n, said) for n, _, said in lines] == [("3", "CUDA_SUCCESS"), ("2", "CUDA_SUCCESS"),
                                                   ("1", "CUDA_SUCCESS")], result.stderr
    assert len({pid for _, pid, _ in lines}) == 1   # one process, three images


EXEC_THEN_LIST = """
import json, os, sys
from cuda.bindings import driver as cu
if sys.argv[1] == "first":
    cu.cuInit(0)
    ctx = cu.cuDevicePrimaryCtxRetain(cu.cuDeviceGet(0)[1])[1]
    cu.cuCtxSetCurrent(ctx)
    assert cu.cuMemAlloc(1 << 30)[0] == 0
    os.execv(sys.executable, [sys.executable, __file__, "second"])
import pynvml
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
print(json.dumps({"used": pynvml.nvmlDeviceGetMemoryInfo(handle).used,
                  "listed": [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]}))
"""


def test_simgpu_frees_what_an_image_held_when_it_execs(sim_env, tmp_path):
    """docs/facts.md §1, measured on an H200: a process holding a context and 1 GiB
    that execs is listed with nothing right after (same pid)."""
    pytest.importorskip("pynvml")
    program = tmp_path / "exec_then_list.py"
    program.write_text(EXEC_THEN_LIST)
    seen = json.loads(run([sys.executable, str(program), "first"], sim_env).stdout)
    assert seen == {"used": 0, "listed": []}


# -- LD_AUDIT: out of reach, and seen ----------------------------------------------------------------

AUDIT = r"""
#include <link.h>
#include <string.h>
unsigned int la_version(unsigned int version) { (void)version; return LAV_CURRENT; }
char *la_objsearch(const char *name, uintptr_t *cookie, unsigned int flag)
{
    (void)cookie;
    (void)flag;
    return strstr(name, "libvgpulimit.so") ? NULL : (char *)name;
}
"""


def test_status_all_shows_a_process_that_hid_the_shim_outside_any_cap(sim_env, tmp_path):
    """An audit library hides the shim from the loader (out of reach: code
    that defeats the shim from inside its own process, docs/threat-model.md's threat
    model); what that process holds shows on the node as outside any cap."""
    source = tmp_path / "audit.c"
    source.write_text(AUDIT)
    audit = compile_c(tmp_path / "audit.so", [source], "-shared", "-fPIC")
    region = tmp_path / "node" / "c" / "region"
    region.parent.mkdir(parents=True)
    release = tmp_path / "release"
    fill = [sys.executable, str(CLIENTS / "cuda_fill.py"), str(2 * GiB), "1", "--hold", str(release)]
    proc = subprocess.Popen(vgpulimit_cmd("run", "--simulate", "--memory", "1GiB", "--region", str(region),
                                          "--", "env", f"LD_AUDIT={audit}", *fill),
                            env=sim_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        report = json.loads(proc.stdout.readline())
        assert report["allocs"] == ["CUDA_SUCCESS"]   # past the cap: the shim is not there
        data = json.loads(run(vgpulimit_cmd("status", "--all", str(tmp_path / "node"), "--json",
                                            "--interval", "0"), sim_env).stdout)
        text = run(vgpulimit_cmd("status", "--all", str(tmp_path / "node"), "--interval", "0"),
                   sim_env).stdout
    finally:
        release.touch()
        proc.communicate(timeout=60)
    [gpu] = data["gpus"]
    [outside] = gpu["outside_processes"]
    assert (outside["pid"], outside["used_bytes"]) == (report["pid"], 2 * GiB)
    assert "outside any cap 2 GiB: 2 GiB in 1 process" in text

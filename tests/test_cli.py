"""`vgpulimit` as a user runs it: exit codes, messages, the child's world, JSON."""

import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import GiB, MiB, base_env, vgpulimit_cmd
from helpers import one_error_line, vgpulimit

from vgpulimit.limits import memory_forms, parse_memory
from vgpulimit.region import Region

VGPULIMIT = vgpulimit_cmd()
PY = sys.executable


@pytest.fixture(autouse=True)
def runtime_dir(tmp_path, monkeypatch):
    """Each test's runs keep their regions under a runtime directory of its own."""
    path = tmp_path / "xdg"
    path.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(path))
    return path


CHILD_REPORT = """
import json, os, sys
parent = os.getppid()
json.dump({
    "env": {k: v for k, v in os.environ.items()
            if k.startswith(("VGPULIMIT_", "LD_"))},
    "region_exists": os.path.exists(os.environ["VGPULIMIT_REGION"]),
    "memory": [d.limit and [d.limit.bytes, d.limit.ppm] for d in __import__("vgpulimit.region")
               .region.Region.open(os.environ["VGPULIMIT_REGION"]).snapshot(all_devices=True).devices],
    "cores": [d.cores_pct for d in __import__("vgpulimit.region").region.Region.open(
              os.environ["VGPULIMIT_REGION"]).snapshot(all_devices=True).devices],
    "region_dir_mode": oct(os.stat(os.path.dirname(os.environ["VGPULIMIT_REGION"])).st_mode
                           & 0o777),
    "parent_maps": open(f"/proc/{parent}/maps").read(),
    "parent_env": open(f"/proc/{parent}/environ", "rb").read().decode(errors="replace"),
}, sys.stdout)
"""


def run_report(*flags, env=None):
    result = vgpulimit("run", *flags, "--", PY, "-c", CHILD_REPORT, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def libpath():
    return vgpulimit("libpath").stdout.strip()


# -- libpath, simgpu-path ------------------------------------------------------------------------


def test_libpath_is_the_installed_shim():
    result = vgpulimit("libpath")
    assert result.returncode == 0
    path = Path(result.stdout.strip())
    assert path.is_absolute() and path.name == "libvgpulimit.so" and path.is_file()


def test_simgpu_path_holds_the_simulated_driver():
    result = vgpulimit("simgpu-path")
    assert result.returncode == 0
    path = Path(result.stdout.strip())
    assert path.is_absolute()
    assert (path / "libcuda.so.1").is_file() and (path / "libnvidia-ml.so.1").is_file()


# -- run: exit status ----------------------------------------------------------------------------


def test_run_exits_with_the_command_status():
    result = vgpulimit("run", "--", "sh", "-c", 'test -n "$VGPULIMIT_REGION" || exit 9; exit 3')
    assert result.returncode == 3


def test_run_without_double_dash():
    assert vgpulimit("run", "sh", "-c", "exit 4").returncode == 4


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT])
def test_run_reports_death_by_signal_as_128_plus_n(sig):
    result = vgpulimit("run", "--", "sh", "-c", f"kill -{sig.name[3:]} $$")
    assert result.returncode == 128 + sig


def test_run_stopped_and_continued_supervises_on(tmp_path):
    """Ctrl-Z and `fg` (SIGSTOP, SIGCONT) on `vgpulimit run`: the supervisor
    carries on, and exits with the command's status, not a traceback."""
    started, marker = tmp_path / "started", tmp_path / "go"
    proc = subprocess.Popen(vgpulimit_cmd("run", "--simulate", "--memory", "1GiB", "--", "sh", "-c", f"touch {started}; "
                                          f"while [ ! -e {marker} ]; do sleep 0.05; done; exit 5"),
                            env=base_env(), stderr=subprocess.PIPE, text=True)
    while not started.exists():
        time.sleep(0.05)
    time.sleep(0.3)   # the supervisor waits for signals by now
    for stopped_s in (0.3, 1.5):   # within its wait for signals, and past it
        proc.send_signal(signal.SIGSTOP)
        time.sleep(stopped_s)
        proc.send_signal(signal.SIGCONT)
    time.sleep(0.3)
    marker.touch()
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (5, "")


def test_command_not_found_is_127():
    line = one_error_line(vgpulimit("run", "--", "no-such-command-vgpulimit"), 127)
    assert line == "vgpulimit: error: no-such-command-vgpulimit: command not found"


def test_command_not_executable_is_126(tmp_path):
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    line = one_error_line(vgpulimit("run", "--", str(script)), 126)
    assert str(script) in line and "permission denied" in line


# -- run: bad input ------------------------------------------------------------------------------


def test_unparsable_memory_is_one_line_and_exit_2():
    line = one_error_line(vgpulimit("run", "--memory", "lots", "--", "true"), 2)
    assert line.startswith("vgpulimit: error: --memory: 'lots' is not a valid value")
    assert line.endswith(memory_forms())


def test_unparsable_memory_in_the_environment_names_the_variable():
    env = base_env(VGPULIMIT_MEMORY_2="8GBx")
    line = one_error_line(vgpulimit("run", "--", "true", env=env), 2)
    assert "VGPULIMIT_MEMORY_2: '8GBx'" in line


@pytest.mark.parametrize("item, expected", [
    ("16=1GiB", "--memory-device: device index '16' is not in 0-15"),
    ("1GiB", "--memory-device: '1GiB' is not I=SIZE"),
    ("0=lots", "--memory-device 0: 'lots' is not a valid value"),
])
def test_bad_memory_device(item, expected):
    line = one_error_line(vgpulimit("run", "--memory-device", item, "--", "true"), 2)
    assert expected in line


def test_memory_device_given_twice():
    result = vgpulimit("run", "--memory-device", "0=1GiB", "--memory-device", "0=2GiB",
                       "--", "true")
    assert "device 0 is given twice" in one_error_line(result, 2)


@pytest.mark.parametrize("args", [["run"], ["run", "--memory", "1GiB"], ["run", "--"]])
def test_no_command(args):
    assert "no command given" in one_error_line(vgpulimit(*args), 2)


def test_unknown_subcommand_is_one_line():
    assert "invalid choice" in one_error_line(vgpulimit("bogus"), 2)


def test_no_traceback_for_a_missing_value():
    assert "expected one argument" in one_error_line(vgpulimit("run", "--memory"), 2)


# -- run: the child's world ----------------------------------------------------------------------


def test_the_child_gets_the_region_alone_which_carries_the_limits():
    report = run_report("--memory", "1GiB", "--memory-device", "1=50%",
                        env=base_env(CUDA_DEVICE_MEMORY_LIMIT="2048m", VGPULIMIT_CORES="30"))
    env = report["env"]
    # One carrier: no limit variable reaches the child to be read another way
    # (VGPULIMIT_SETTER carries no limit: it says a region was given).
    assert set(env) == {"VGPULIMIT_REGION", "VGPULIMIT_SETTER", "LD_PRELOAD"}
    assert env["VGPULIMIT_SETTER"] == "run"
    assert env["LD_PRELOAD"] == libpath()
    assert report["memory"][0] == [GiB, 0] and report["memory"][2] == [GiB, 0]
    assert report["memory"][1] == [0, 500_000]
    assert report["cores"][:2] == [30, 30]
    assert report["region_exists"]
    assert report["region_dir_mode"] == "0o700"


def test_child_keeps_the_users_preloads_after_the_shim():
    report = run_report(env=base_env(LD_PRELOAD="libm.so.6"))
    assert report["env"]["LD_PRELOAD"] == f"{libpath()}:libm.so.6"


def test_simulate_puts_the_simulated_driver_first():
    simgpu = vgpulimit("simgpu-path").stdout.strip()
    report = run_report("--simulate", env=base_env(LD_LIBRARY_PATH="/opt/x"))
    assert report["env"]["LD_LIBRARY_PATH"] == f"{simgpu}:/opt/x"


def test_limits_come_from_the_environment_when_no_flag_is_given():
    report = run_report(env=base_env(VGPULIMIT_MEMORY="512MiB", VGPULIMIT_MEMORY_3="2GiB"))
    assert report["memory"][0] == [512 * MiB, 0]
    assert report["memory"][3] == [2 * GiB, 0]


@pytest.mark.parametrize("variable", ["CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT_0"])
def test_hami_variables_cap_a_run_as_they_cap_the_shim(variable):
    report = run_report(env=base_env(**{variable: "1024m", "CUDA_DEVICE_SM_LIMIT": "20"}))
    assert report["memory"][0] == [GiB, 0]
    assert report["cores"][0] == 20


def test_flag_wins_over_the_environment_and_says_so():
    result = vgpulimit("run", "--memory", "1GiB", "--cores", "40", "--", PY, "-c", CHILD_REPORT,
                       env=base_env(VGPULIMIT_MEMORY_0="8GiB", VGPULIMIT_CORES_0="90"))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["memory"][0] == [GiB, 0] and report["cores"][0] == 40
    assert "--memory 1GiB overrides VGPULIMIT_MEMORY_0=8GiB" in result.stderr
    assert "--cores 40 overrides VGPULIMIT_CORES_0=90" in result.stderr


def test_ours_and_hamis_variables_disagreeing_is_said():
    result = vgpulimit("run", "--", PY, "-c", CHILD_REPORT,
                       env=base_env(VGPULIMIT_MEMORY="1GiB", CUDA_DEVICE_MEMORY_LIMIT="2048m"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["memory"][0] == [GiB, 0]
    assert 'VGPULIMIT_MEMORY="1GiB" and CUDA_DEVICE_MEMORY_LIMIT="2048m" disagree' in result.stderr


@pytest.mark.parametrize("ours, theirs", [
    ({"VGPULIMIT_MEMORY": "100GiB"}, {"CUDA_DEVICE_MEMORY_LIMIT_0": "2048m"}),
    ({"VGPULIMIT_MEMORY_0": "100GiB"}, {"CUDA_DEVICE_MEMORY_LIMIT": "2048m"}),
    ({"VGPULIMIT_MEMORY": "0.9"}, {"GPU_PORTION": "0.125"}),
])
def test_our_variable_cannot_loosen_a_device_plugins(ours, theirs):
    """A device plugin's container (HAMi's, Volcano's, KAI's; no hook) gets
    its limits in the environment, beside the pod author's own variables:
    ours, set by the pod, only tightens what the plugin gave."""
    result = vgpulimit("run", "--", PY, "-c", CHILD_REPORT, env=base_env(**ours, **theirs))
    assert result.returncode == 0, result.stderr
    [(limit, share)] = [json.loads(result.stdout)["memory"][0]]
    assert (limit, share) in ((2 * GiB, 0), (0, 125000)), result.stdout
    [name] = theirs
    assert f"{name}=" in result.stderr and "applies, the tighter" in result.stderr


def test_a_size_against_a_plugins_share_is_refused_not_guessed():
    line = one_error_line(vgpulimit("run", "--", "true", env=base_env(VGPULIMIT_MEMORY="100GiB",
                                                                    GPU_PORTION="0.25")), 2)
    assert "VGPULIMIT_MEMORY" in line and "GPU_PORTION" in line and "size cannot be weighed" in line


def test_a_device_variable_with_no_ascii_index_is_one_line():
    line = one_error_line(vgpulimit("run", "--", "true", env=base_env(**{"VGPULIMIT_MEMORY_\u00b2": "1GiB"})), 2)
    assert "VGPULIMIT_MEMORY_\u00b2" in line and "ASCII digits" in line


def test_supervisor_is_not_hooked():
    report = run_report("--memory", "1GiB")
    assert "libvgpulimit" not in report["parent_maps"]
    assert "LD_PRELOAD" not in report["parent_env"]


def test_child_gets_a_clean_signal_mask():
    # grep reads its own: Python would ignore SIGPIPE itself, a shell reset its mask.
    result = vgpulimit("run", "--", "grep", "-E", "^Sig(Blk|Ign):", "/proc/self/status")
    assert result.returncode == 0, result.stderr
    masks = dict(line.split(":") for line in result.stdout.splitlines())
    assert int(masks["SigBlk"], 16) == 0
    assert not int(masks["SigIgn"], 16) & (1 << (signal.SIGPIPE - 1))


def test_region_is_removed_after_the_run(runtime_dir):
    result = vgpulimit("run", "--", "sh", "-c", 'echo "$VGPULIMIT_REGION"')
    path = Path(result.stdout.strip())
    assert path.name == "region" and path.parent.parent == runtime_dir / "vgpulimit"
    assert not path.exists() and not path.parent.exists()


def test_given_region_is_kept_and_not_reused(tmp_path):
    path = tmp_path / "region"
    assert vgpulimit("run", "--memory", "1GiB", "--region", str(path), "--", "true").returncode == 0
    with Region.open(path) as region:
        devices = region.snapshot().devices
    assert [d.limit for d in devices] == [parse_memory("1GiB")] * 16
    again = vgpulimit("run", "--region", str(path), "--", "true")
    assert "already exists" in one_error_line(again, 1)


# -- run: signals ---------------------------------------------------------------------------------

SIGNAL_COUNTER = """
import signal, sys, time
counts = {}
def count(sig, frame):
    counts[signal.Signals(sig).name] = counts.get(signal.Signals(sig).name, 0) + 1
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGWINCH, signal.SIGHUP):
    signal.signal(sig, count)
print("ready", flush=True)
time.sleep(1.5)
print(sorted(counts.items()), flush=True)
sys.exit(5)
"""


def start_counter():
    proc = subprocess.Popen([*VGPULIMIT, "run", "--", PY, "-c", SIGNAL_COUNTER],
                            stdout=subprocess.PIPE, text=True, env=base_env())
    assert proc.stdout.readline() == "ready\n"
    return proc


def test_signals_sent_to_the_supervisor_reach_the_child_once():
    proc = start_counter()
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP):
        proc.send_signal(sig)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 5
    assert out.strip() == str([("SIGHUP", 1), ("SIGINT", 1), ("SIGTERM", 1), ("SIGUSR1", 1)])


def test_terminal_signals_are_not_delivered_twice():
    # Ctrl-C and a resize go to the terminal's foreground process group, which
    # holds the supervisor and the child: the child must see each once.
    pid, fd = pty.fork()
    if pid == 0:
        os.execvpe(VGPULIMIT[0], [*VGPULIMIT, "run", "--", PY, "-c", SIGNAL_COUNTER], base_env())
    try:
        out = b""
        deadline = time.monotonic() + 20
        while b"ready" not in out and time.monotonic() < deadline:
            out += os.read(fd, 1024)
        os.write(fd, b"\x03")
        import fcntl
        import struct
        import termios
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
        while time.monotonic() < deadline:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    data = os.read(fd, 1024)
                except OSError:
                    break
                if not data:
                    break
                out += data
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 5
    assert str([("SIGINT", 1), ("SIGWINCH", 1)]) in out.decode()


def test_orphans_are_reaped_when_pid_1():
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-p", "-f", "--mount-proc", "true"],
                                         capture_output=True, check=False).returncode != 0:
        pytest.skip("cannot make a PID namespace here (needs unshare and root)")
    # The inner sh leaves a sleep behind that is reparented to PID 1, the supervisor.
    script = ('sh -c "sleep 0.2 &"; sleep 1; '
              'for f in /proc/[0-9]*/stat; do cat "$f"; echo; done 2>/dev/null')
    result = subprocess.run([unshare, "-p", "-f", "--mount-proc", *VGPULIMIT, "run", "--",
                             "sh", "-c", script], capture_output=True, text=True,
                            env=base_env(), timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    states = [line.rsplit(")", 1)[1].split()[0]
              for line in result.stdout.splitlines() if ")" in line]
    assert states and "Z" not in states


RECLAIM_CHILD = """
import json, mmap, os, subprocess, time
from vgpulimit.region import Region
region = Region.open(os.environ["VGPULIMIT_REGION"])
me = region.attach(os.getpid())                   # as the shim does on a first allocation
assert region.reserve(me, 0, 256 << 20)
gone = subprocess.Popen(["true"])
gone.wait()
ghost = region.attach(gone.pid)                   # a process that died holding memory
assert region.reserve(ghost, 0, 512 << 20)
grown = mmap.mmap(-1, 64 << 20)                   # a live process changes, and stays live
deadline = time.monotonic() + 30                  # the supervisor reclaims once a second
while region.snapshot().devices[0].used_bytes != 256 << 20 and time.monotonic() < deadline:
    time.sleep(0.05)
snap = region.snapshot()
print(json.dumps({"me": os.getpid(), "pids": [p.pid for p in snap.processes],
                  "used_bytes": snap.devices[0].used_bytes}))
"""


def test_supervisor_reclaims_dead_processes_and_keeps_live_ones():
    result = vgpulimit("run", "--memory", "1GiB", "--", PY, "-c", RECLAIM_CHILD)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["pids"] == [report["me"]]
    assert report["used_bytes"] == 256 * MiB


def test_fill_gpu_example_stops_at_the_cap(tmp_path):
    pytest.importorskip("cuda.bindings")
    example = Path(__file__).resolve().parent.parent / "examples" / "fill_gpu.py"
    env = base_env(SIMGPU_STATE=str(tmp_path / "simgpu.state"))
    result = vgpulimit("run", "--simulate", "--memory", "1GiB", "--", PY, str(example), env=env)
    assert result.returncode == 0, result.stderr
    # The simulated GPU is an H200 by default: its context holds 518 MiB of the
    # cap before anything is allocated.
    assert result.stdout.splitlines() == [
        "before: free 506 MiB of 1024 MiB",
        "(in use before any allocation: 518 MiB, the context and whatever else shares the cap)",
        "block 1: 256 MiB allocated, 256 MiB in all",
        "block 2: CUDA_ERROR_OUT_OF_MEMORY after 256 MiB",
        "after: free 250 MiB of 1024 MiB",
    ]


# -- status ---------------------------------------------------------------------------------------


@pytest.fixture
def busy_region(tmp_path):
    """A region with caps on devices 0 and 1 and one process holding 768 MiB on 0."""
    path = tmp_path / "region"
    limits = {0: parse_memory("1GiB"), 1: parse_memory("50%")}
    with Region.create(path, limits) as region:
        slot = region.attach(os.getpid())
        assert region.reserve(slot, 0, 768 * MiB, GiB)
        assert not region.reserve(slot, 0, 512 * MiB, GiB)   # over the cap: refused
        yield path


def test_status_json(busy_region):
    result = vgpulimit("status", "--json", "--region", str(busy_region))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["region"] == str(busy_region)
    dev0, dev1 = data["devices"]
    assert dev0["index"] == 0 and dev0["cap_bytes"] == GiB
    assert dev0["used_bytes"] == 768 * MiB and dev0["free_bytes"] == 256 * MiB
    assert dev0["oom_refusals"] == 1
    assert dev1["index"] == 1 and dev1["limit"]["ppm"] == 500_000
    assert dev1["cap_bytes"] is None     # a share of a device nobody has seen yet
    [proc] = data["processes"]
    assert proc["pid"] == os.getpid()
    assert proc["used_bytes"] == 768 * MiB
    assert proc["devices"] == [{"index": 0, "used_bytes": 768 * MiB}]


def test_status_text_fits_80_columns(busy_region):
    result = vgpulimit("status", "--region", str(busy_region))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines if not line.startswith("region "))
    dev0 = next(line for line in lines if line.startswith("0 "))
    # TOTAL is what the container may use (the cap), PHYSICAL the device's size (no process saw it).
    assert dev0.split() == ["0", "1", "GiB", "768", "MiB", "256", "MiB", "1", "GiB", "-", "1"]
    assert any(line.split()[:1] == [str(os.getpid())] and "768 MiB on 0" in line for line in lines)


def test_status_total_is_the_cap_and_physical_the_device(tmp_path):
    """nvidia-smi in a container reads Total as what it may use: status says
    the same, and gives the device's own size a column of its own."""
    path = tmp_path / "region"
    with Region.create(path, {0: parse_memory("1GiB"), 1: parse_memory("25%")}) as region:
        for index in (0, 1, 2):
            region._mapped.devices[index].total_bytes = 16 * GiB   # as the shim writes it once seen
        lines = vgpulimit("status", "--region", str(path), "--interval", "0").stdout.splitlines()
    assert lines[2].split() == ["DEVICE", "LIMIT", "USED", "FREE", "TOTAL", "PHYSICAL", "OOM", "REFUSED"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[3:6]}
    assert rows["0"] == ["1", "GiB", "0", "B", "1", "GiB", "1", "GiB", "16", "GiB", "0"]
    assert rows["1"] == ["4", "GiB", "(25%)", "0", "B", "4", "GiB", "4", "GiB", "16", "GiB", "0"]
    assert rows["2"] == ["none", "0", "B", "16", "GiB", "16", "GiB", "16", "GiB", "0"]


def test_status_of_a_running_command_from_the_environment():
    result = vgpulimit("run", "--memory", "1GiB", "--memory-device", "2=3GiB", "--",
                       *VGPULIMIT, "status", "--json")
    assert result.returncode == 0, result.stderr
    caps = {d["index"]: d["cap_bytes"] for d in json.loads(result.stdout)["devices"]}
    assert caps == {i: (3 * GiB if i == 2 else GiB) for i in range(16)}


def test_status_while_a_command_runs(tmp_path):
    path = tmp_path / "region"
    proc = subprocess.Popen([*VGPULIMIT, "run", "--memory", "2GiB", "--region", str(path), "--",
                             "sh", "-c", "echo ready; exec sleep 30"],
                            stdout=subprocess.PIPE, text=True, env=base_env())
    try:
        assert proc.stdout.readline() == "ready\n"
        result = vgpulimit("status", "--json", "--region", str(path))
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["devices"][0]["cap_bytes"] == 2 * GiB
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert proc.returncode == 128 + signal.SIGTERM


def test_status_without_a_region():
    line = one_error_line(vgpulimit("status"), 1)
    assert "--region" in line and "VGPULIMIT_REGION" in line


def test_status_of_a_missing_region(tmp_path):
    line = one_error_line(vgpulimit("status", "--region", str(tmp_path / "nope")), 1)
    assert line == f"vgpulimit: error: cannot open {tmp_path / 'nope'}: no such file"


def test_status_of_a_file_that_is_no_region(tmp_path):
    path = tmp_path / "junk"
    path.write_bytes(b"x" * 4096)
    line = one_error_line(vgpulimit("status", "--region", str(path)), 1)
    assert "not a vgpulimit region file" in line


def test_run_takes_a_cap_in_gpushare_units(tmp_path):
    report = run_report("--memory-units", "8", "--unit", "128Mi")
    assert report["memory"][0] == [GiB, 0]
    both = vgpulimit("run", "--memory", "1GiB", "--memory-units", "2", "--", "true")
    assert "not both" in one_error_line(both, 2)
    bad = vgpulimit("run", "--memory-units", "2", "--unit", "half", "--", "true")
    assert one_error_line(bad, 2).startswith("vgpulimit: error: --unit: 'half'")


# -- what a person reads: limit errors and `set` -----------------------------------------------


def test_a_unitless_number_above_one_asks_what_it_is():
    line = one_error_line(vgpulimit("run", "--memory", "1.5", "--", "true"), 2)
    assert line == "vgpulimit: error: --memory 1.5: 1.5 what? (a fraction is 0–1; sizes need a unit, e.g. 1.5GiB)"


def test_a_unitless_variable_above_one_asks_what_it_is_too():
    line = one_error_line(vgpulimit("run", "--", "true", env=base_env() | {"VGPULIMIT_MEMORY_1": "2.5"}), 2)
    assert line == "vgpulimit: error: VGPULIMIT_MEMORY_1=2.5: 2.5 what? (a fraction is 0-1; sizes need a unit, e.g. 2.5GiB)"
    # A fraction up to 1 is a fraction of the device, as ever.
    assert vgpulimit("run", "--", "true", env=base_env() | {"VGPULIMIT_MEMORY_1": "1.000"}).returncode == 0


@pytest.mark.parametrize("args, env", [
    (["run", "--memory", "lots", "--", "true"], {}),
    (["run", "--memory-device", "1=8 gigabytes of the best", "--", "true"], {}),
    (["run", "--cores", "250", "--", "true"], {}),
    (["run", "--", "true"], {"VGPULIMIT_MEMORY": "4 gigs"}),
    (["run", "--", "true"], {"CUDA_DEVICE_MEMORY_LIMIT_1": "lots"}),
    (["set", "--memory", "12XB", "--region", "/nonexistent"], {}),
])
def test_a_bad_limit_is_one_terminal_line_and_help_has_every_form(args, env):
    line = one_error_line(vgpulimit(*args, env=base_env() | env), 2)
    assert len(line) <= 160, line
    assert "accepted forms:" in line or "out of range" in line
    full = vgpulimit(args[0], "--help").stdout
    for form in ("1073741824", "4GiB", "3000m = 3000 MiB", "4*10^9", "50%", "0.5", "GPU-<uuid>"):
        assert form in " ".join(full.split()), form


def test_set_prints_what_it_changed(tmp_path):
    path = tmp_path / "region"
    with Region.create(path, {0: parse_memory("4GiB"), 1: parse_memory("50%")}, {0: 50}):
        pass
    result = vgpulimit("set", "--region", str(path), "--memory-device", "0=2GiB", "--cores", "30")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "device 0: memory 4 GiB → 2 GiB, cores 50% → 30%",
        "devices 1-15: cores no share → 30%",
    ]
    again = vgpulimit("set", "--region", str(path), "--memory-device", "0=2GiB")
    assert again.stdout == "nothing changed: the limits were already these\n"
    uuid = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"
    by_uuid = vgpulimit("set", "--region", str(path), "--memory-device", f"{uuid}=1GiB")
    assert by_uuid.stdout == f"{uuid} (no process has used it yet): memory 1 GiB\n"

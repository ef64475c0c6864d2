"""Bad input that once got a traceback, a wrong answer or a misleading line:
each now gets one line naming the flag, variable or file and what is
accepted, and a non-zero exit."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys

import pexpect
import pytest
from conftest import base_env, vgpulimit_cmd
from helpers import one_error_line, vgpulimit
from test_oci_hook import hook, plain_bundle, state_of

from vgpulimit.region import Region

# -- device indices and counts: ASCII digits only -------------------------------------------------

# '²' passes str.isdigit() and makes int() raise; int() reads '１' (fullwidth) as 1.
@pytest.mark.parametrize("args, says", [
    (["run", "--memory-device", "²=1GiB"], "--memory-device: device index '²' is not in 0-15"),
    (["run", "--memory-device", "１=1GiB"], "--memory-device: device index '１' is not in 0-15"),
    (["run", "--cores-device", "٣=30"], "--cores-device: device index '٣' is not in 0-15"),
    (["set", "--memory-device", "³=1GiB"], "--memory-device: device index '³' is not in 0-15"),
    (["set", "--cores-device", "³=30"], "--cores-device: device index '³' is not in 0-15"),
    (["run", "--memory-units", "２"], "--memory-units: '２' is not a whole number of units"),
    (["run", "--memory-units", "²"], "--memory-units: '²' is not a whole number of units"),
])
def test_a_digit_that_is_not_ascii_is_refused(tmp_path, args, says):
    flags = ["--region", str(tmp_path / "region")] + (["--", "true"] if args[0] == "run" else [])
    line = one_error_line(vgpulimit(*args, *flags), 2)
    assert says in line
    assert not (tmp_path / "region").exists()


def test_a_limit_variable_whose_index_is_not_ascii_is_refused_as_the_shim_refuses_it(tmp_path):
    """The one reader (as the shim and `run` read it): VGPULIMIT_MEMORY_² names
    no device, and a limit the user meant is never dropped silently."""
    bundle = plain_bundle(tmp_path, env={"VGPULIMIT_MEMORY_²": "1GiB"})
    line = one_error_line(hook(state_of(bundle, pid=os.getpid()), tmp_path / "node"))
    assert "VGPULIMIT_MEMORY_²" in line and "ASCII digits" in line


# -- device UUIDs: all zeros names no device; one device's limit given once ----------------------

ZERO_UUID = "00000000-0000-0000-0000-000000000000"


@pytest.mark.parametrize("kind", ["GPU", "MIG"])
@pytest.mark.parametrize("command", ["run", "set", "cdi generate"])
def test_the_all_zero_uuid_is_refused_alike_by_run_set_and_cdi(tmp_path, command, kind):
    """The form of a UUID but no device's: `set` said "Invalid argument", and
    `run` and `cdi generate` took it (and `run` capped nothing).  One rule
    for the three, saying why."""
    uuid = f"{kind}-{ZERO_UUID}"
    region = tmp_path / "region"
    if command == "set":
        Region.create(region).close()
    args = {"run": ["run", "--simulate", "--memory-device", f"{uuid}=1GiB", "--region", str(region), "--",
                    "true"],
            "set": ["set", "--memory-device", f"{uuid}=1GiB", "--region", str(region)],
            "cdi generate": ["cdi", "generate", "--device", uuid, "--memory", "1GiB"]}[command]
    line = one_error_line(vgpulimit(*args), 2)
    assert "is all zeros, which is no device's UUID" in line
    assert line.startswith(f"vgpulimit: error: {'--device' if command == 'cdi generate' else '--memory-device'}: "
                           f"'{kind}-00000000-")
    assert command == "set" or not region.exists()


@pytest.mark.parametrize("names, values", [
    (("VGPULIMIT_MEMORY_0", "VGPULIMIT_MEMORY_00"), ("1GiB", "2GiB")),
    (("VGPULIMIT_MEMORY_00", "VGPULIMIT_MEMORY_0"), ("1GiB", "2GiB")),
    (("CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_MEMORY_LIMIT_00"), ("1g", "2g")),
    (("CUDA_DEVICE_MEMORY_LIMIT_00", "CUDA_DEVICE_MEMORY_LIMIT_0"), ("1g", "2g")),
])
def test_two_names_of_one_devices_limit_are_a_limit_given_twice(sim_env, shim_path, cbin, names, values):
    """_0 and _00 name device 0 alike: the last in the environment won,
    silently (2 GiB one way, 1 GiB the other).  Refused as a repeated flag is,
    under `run` and under a bare preload, naming both variables."""
    given = dict(zip(names, values))
    says = f"{names[0]}={values[0]} and {names[1]}={values[1]} both give device 0's memory limit: a limit given twice"
    line = one_error_line(vgpulimit("run", "--simulate", "--", "true", env=sim_env | given), 2)
    assert says in line
    bare = subprocess.run([cbin / "alloc_client", "link", str(512 * 1024 * 1024), "1"], capture_output=True,
                          text=True, env=sim_env | given | {"LD_PRELOAD": str(shim_path)}, timeout=60, check=False)
    assert "alloc 0 2" in bare.stdout.splitlines()   # CUDA_ERROR_OUT_OF_MEMORY: nothing is let through
    [said] = [ln for ln in bare.stderr.splitlines() if says in ln]
    assert ": error: " in said


# -- the OCI hook: JSON nested deeper than Python recurses ----------------------------------------

DEEP = "[" * 100_000


def test_a_deeply_nested_state_is_one_line(tmp_path):
    line = one_error_line(hook(DEEP, tmp_path / "node"))
    assert "container state on stdin is JSON nested too deeply" in line


def test_a_deeply_nested_config_is_one_line(tmp_path):
    bundle = plain_bundle(tmp_path)
    (bundle / "config.json").write_text(DEEP)
    line = one_error_line(hook(state_of(bundle, pid=os.getpid()), tmp_path / "node"))
    assert f"{bundle / 'config.json'} is JSON nested too deeply" in line


def test_a_closed_stdin_is_one_line(tmp_path):
    result = subprocess.run(vgpulimit_cmd("oci-hook", "--node-dir", str(tmp_path / "node")),
                            capture_output=True, text=True, env=base_env(), timeout=60,
                            check=False, preexec_fn=lambda: os.close(0))
    assert "on stdin, as a runtime gives it; stdin is closed" in one_error_line(result, 1)


# -- files given by name --------------------------------------------------------------------------


def test_cdi_output_empty(tmp_path):
    line = one_error_line(vgpulimit("cdi", "generate", "--memory", "1GiB", "--output", "", cwd=tmp_path), 2)
    assert "--output is empty" in line and "no --output for stdout" in line
    assert os.listdir(tmp_path) == []


def test_cdi_output_a_directory_leaves_nothing_behind(tmp_path):
    target = tmp_path / "specs"
    target.mkdir()
    line = one_error_line(vgpulimit("cdi", "generate", "--memory", "1GiB", "--output", str(target)), 1)
    assert line == f"vgpulimit: error: --output {target}: a directory; give a file name"
    assert os.listdir(tmp_path) == ["specs"] and os.listdir(target) == []


def test_cdi_output_a_fifo_is_not_replaced(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    line = one_error_line(vgpulimit("cdi", "generate", "--memory", "1GiB", "--output", str(fifo)), 1)
    assert "not a regular file" in line
    assert stat.S_ISFIFO(fifo.lstat().st_mode) and os.listdir(tmp_path) == ["fifo"]


def test_install_hook_dir_empty_writes_nowhere(tmp_path):
    line = one_error_line(vgpulimit("install-hook", "--dir", "", cwd=tmp_path), 2)
    assert "install-hook: --dir is empty" in line
    assert os.listdir(tmp_path) == []


# install-hook writes --node-dir into the hooks.d file, where the hook later
# reads it from whatever directory the runtime runs it in: each limited
# container would then fail to start (podman: exit 126).
@pytest.mark.parametrize("command", [["oci-hook"], ["cdi", "generate"],
                                     ["install-hook", "--dir", "hooks.d"]])
@pytest.mark.parametrize("node_dir", ["", "containers", "./containers", "../containers",
                                      "~/containers"])
def test_a_node_dir_that_is_not_absolute_writes_nowhere(tmp_path, command, node_dir):
    line = one_error_line(vgpulimit(*command, "--node-dir", node_dir, cwd=tmp_path), 2)
    assert f"{command[0]}" in line and f"--node-dir {node_dir!r} is not an absolute path" in line
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("make, says", [
    (lambda path: path.symlink_to(path.parent / "nowhere"), "a dangling symbolic link is there"),
    (lambda path: path.mkdir(), "a directory (not a regular file) is there"),
    (lambda path: os.mkfifo(path), "a FIFO (not a regular file) is there"),
])
def test_run_region_that_is_no_file(tmp_path, make, says):
    path = tmp_path / "region"
    make(path)
    before = sorted(os.listdir(tmp_path))
    line = one_error_line(vgpulimit("run", "--region", str(path), "--", "true"), 1)
    assert line == f"vgpulimit: error: cannot create {path}: {says}; give a path where no " \
                   "file exists"
    assert sorted(os.listdir(tmp_path)) == before


def test_run_region_dev_null():
    line = one_error_line(vgpulimit("run", "--region", "/dev/null", "--", "true"), 1)
    assert "cannot create /dev/null: a character device (not a regular file)" in line
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


# -- view intervals -------------------------------------------------------------------------------


@pytest.mark.parametrize("args, says", [
    (["top", "--interval", "0"], "'0' is not a number of seconds from 0.1 to 3600"),
    (["top", "--interval", "0.01"], "'0.01' is not a number of seconds from 0.1 to 3600"),
    (["status", "--interval", "0.01"], "'0.01' is not a number of seconds from 0.1 to 3600, or 0"),
])
def test_an_interval_too_short_is_refused(tmp_path, args, says):
    line = one_error_line(vgpulimit(*args, "--region", str(tmp_path / "region")), 2)
    assert "argument --interval: " in line and says in line


def test_top_at_the_shortest_interval_quits_on_q(tmp_path):
    region = tmp_path / "region"
    Region.create(region).close()
    top = pexpect.spawn(sys.executable, ["-m", "vgpulimit", "top", "--interval", "0.1",
                                         "--region", str(region)],
                        env=dict(base_env(), TERM="xterm"), dimensions=(30, 80),
                        encoding="utf-8", timeout=30)
    try:
        top.expect_exact("every 0.1 s")
        top.send("q")
        top.expect(pexpect.EOF)
    finally:
        top.close(force=True)
    assert top.exitstatus == 0


# -- careless input: empty commands, over-long names ----------------------------------------------


# A shell's "$CMD" that was never set: no program has that name.
@pytest.mark.parametrize("command", [[""], ["", "true"], [" "], ["\t"], ["\n"]])
@pytest.mark.parametrize("dashes", [["--"], []])
def test_run_of_a_command_with_an_empty_name_is_one_line(tmp_path, command, dashes):
    region = tmp_path / "region"
    line = one_error_line(vgpulimit("run", "--memory", "1GiB", "--region", str(region), *dashes,
                                *command), 2)
    assert line == (f"vgpulimit: error: run: the command's name is {command[0]!r}; give a program "
                    "on PATH or a path to one (e.g. vgpulimit run -- python3 app.py)")
    assert not region.exists()


LONG = "a" * 5000


def short_line(result: subprocess.CompletedProcess, code: int, length: int) -> str:
    """One line that shows a long name cut, with the name's length."""
    line = one_error_line(result, code)
    assert not re.search(r"(.)\1{99}", line) and f"({length} characters)" in line, line
    return line


@pytest.mark.parametrize("args, says", [
    (["run", "--memory-device", f"GPU-{LONG}=1GiB", "--", "true"],
     "--memory-device: 'GPU-aaa"),
    (["run", "--memory-device", f"{LONG}=1GiB", "--", "true"], "--memory-device: device index 'aaa"),
    (["run", "--cores-device", f"{LONG}=30", "--", "true"], "--cores-device: device index 'aaa"),
    (["run", "--memory-device", LONG, "--", "true"], "--memory-device: 'aaa"),
    (["set", "--memory-device", f"{LONG}=1GiB", "--region", "/nonexistent"],
     "--memory-device: device index 'aaa"),
    (["set", "--cores-device", f"GPU-{LONG}=30", "--region", "/nonexistent"],
     "--cores-device: 'GPU-aaa"),
    (["verify", "--device", LONG], "argument --device: 'aaa"),
    (["status", "--query", LONG, "--region", "/nonexistent"], "--query: unknown field 'aaa"),
    (["cdi", "generate", "--memory", "1GiB", "--name", "/" * 5000], "--name: '///"),
])
def test_a_device_id_or_name_of_5000_characters_is_shown_cut(args, says):
    length = 5000 if "GPU-" not in " ".join(args) else 5004
    line = short_line(vgpulimit(*args), 2, length)
    assert says in line


@pytest.mark.parametrize("length", [256, 1024, 5000])
@pytest.mark.parametrize("status, pid", [("creating", os.getpid()), ("stopped", None)])
def test_a_container_id_longer_than_a_file_name_is_refused_in_one_short_line(tmp_path, length,
                                                                              status, pid):
    """Runc takes no id longer than a file name: the hook names a directory
    after it.  Before, ids of 256-1024 letters got "remove <dir> once the
    container is gone" for a directory that was never made, and longer ones
    were echoed whole."""
    bundle = plain_bundle(tmp_path, env={"VGPULIMIT_MEMORY": "1GiB"})
    state = state_of(bundle, status, pid, container_id="a" * length)
    line = short_line(hook(state, tmp_path / "node"), 1, length)
    assert "is not one a runtime gives (1 to 255 letters, digits" in line
    assert "remove" not in line
    assert not (tmp_path / "node").exists()


def test_a_container_id_of_odd_characters_is_shown_cut(tmp_path):
    bundle = plain_bundle(tmp_path, env={"VGPULIMIT_MEMORY": "1GiB"})
    state = state_of(bundle, "stopped", container_id="../" * 2000)
    line = short_line(hook(state, tmp_path / "node"), 1, 6000)
    assert "container id '../../" in line


def test_a_container_id_of_255_letters_is_one_a_runtime_gives(tmp_path):
    result = hook(state_of(plain_bundle(tmp_path), "stopped", container_id="a" * 255),
                  tmp_path / "node")
    assert (result.returncode, result.stderr) == (0, "")

"""What tenants name cannot take down a view: a directory, a process name
(comm) or a command line holds whatever bytes a tenant chose -- not UTF-8, a
newline, escape sequences, quotes and backslashes, 255 of them -- and every
view (`status`, `--all`, `--json`, `--query`, `top`, `metrics` and its log)
still answers, shows each escaped, and forges no row, line or label.

In KAI's layout the shim itself names the directory from POD_UID and
CONTAINER_NAME, which a tenant sets in its own environment: it takes only
names Kubernetes could have given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest
from conftest import TESTS, MiB, base_env, run, vgpulimit_cmd
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from vgpulimit import environment
from vgpulimit.region import MAGIC

# Each as a directory of KAI's layout (<pod UID>_<container>), a process's
# argv and its comm, and how a view that escapes shows it.
HOSTILE = {
    b"pod\xff\xfe_c\nFORGED": r"pod\xff\xfe_c\nFORGED",                 # not UTF-8; a newline
    b"\x1b[2J\x1b]0;owned\x07_ctl": r"\x1b[2J\x1b]0;owned\x07_ctl",    # terminal escapes
    b'q"uo\\te_{x="y"}\\': 'q"uo\\te_{x="y"}\\',                       # a label's quoting
    "\u202eevil_rtl".encode(): r"\u202eevil_rtl",                      # right-to-left override
    b"L" * 200 + b"_" + b"l" * 54: "L" * 200 + "_" + "l" * 54,          # NAME_MAX bytes
}
BROKEN = b"pod\xff_broken\nFORGED"   # a region file no view can read, under a hostile name
BROKEN_SHOWN = r"pod\xff_broken\nFORGED"
# How `status --json` writes each: bytes that are not UTF-8 as \xNN, the rest as it is.
IN_JSON = {name: os.fsdecode(name).replace("\udcff", "\\xff").replace("\udcfe", "\\xfe")
           for name in HOSTILE}

HOLDER = """
import ctypes, os, sys, time
ctypes.CDLL(None).prctl(15, os.fsencode(sys.argv[2])[:15], 0, 0, 0)   # PR_SET_NAME: its comm
from cuda.bindings import driver as cu
cu.cuInit(0)
ctx = cu.cuDevicePrimaryCtxRetain(cu.cuDeviceGet(0)[1])[1]
cu.cuCtxSetCurrent(ctx)
cu.cuMemAlloc(1 << 20)
print("held", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
"""


def forged(text: str) -> bool:
    """Whether ``text`` holds what a tenant's name could forge on a terminal
    or in a log: a control character other than a line's end, a format
    character, or a line that starts with what followed a newline in a name."""
    raw = any(ord(c) < 32 and c != "\n" or 0x7F <= ord(c) < 0xA0 or c == "\u202e" for c in text)
    return raw or any(line.startswith(("FORGED", "_broken")) for line in text.splitlines())


@pytest.fixture(scope="module")
def node(tmp_path_factory, simgpu_dir):
    """A node whose containers (KAI's layout) are named by HOSTILE, each with
    a process that holds 1 MiB and whose argv and comm are its name; one
    process of such a name outside any container; and one region file that
    cannot be read, under a hostile name too."""
    root = tmp_path_factory.mktemp("hostile")
    runtime = root / "run"
    runtime.mkdir(mode=0o700)
    env = base_env(SIMGPU_STATE=str(root / "simgpu.state"), SIMGPU_MEMORY="16GiB",
                   SIMGPU_CONTEXT_OVERHEAD="0", SIMGPU_RESERVED="0",
                   LD_LIBRARY_PATH=str(simgpu_dir), XDG_RUNTIME_DIR=str(runtime))
    node = os.fsencode(root / "vgpu")
    holder = root / "holder.py"
    holder.write_text(HOLDER)
    release = root / "release"
    procs = []
    try:
        for name in HOSTILE:
            region = os.path.join(node, b"containers", name, b"vgpulimit.cache")
            os.makedirs(os.path.dirname(region))
            procs.append(subprocess.Popen(
                [*map(os.fsencode, vgpulimit_cmd("run", "--simulate", "--memory", "1GiB", "--region")),
                 region, b"--", os.fsencode(sys.executable), os.fsencode(holder), os.fsencode(release), name],
                env=env, stdout=subprocess.PIPE, text=True))
        outside = next(iter(HOSTILE))
        # Short paths: a metric's command label keeps a command line's first 120 characters.
        procs.append(subprocess.Popen([sys.executable, holder.name, release.name, os.fsdecode(outside)],
                                      env=env, cwd=root, stdout=subprocess.PIPE, text=True))
        assert all(p.stdout.readline() == "held\n" for p in procs)
        broken = os.path.join(node, b"containers", BROKEN)
        os.makedirs(broken)
        with open(os.path.join(broken, b"vgpulimit.cache"), "wb") as f:
            f.write(MAGIC + b"garbled")
        yield env, os.fsdecode(node)
    finally:
        release.touch()
        for p in procs:
            p.wait(timeout=60)


def path_shown(node: str, name: str) -> str:
    return f"{node}/containers/{name}/vgpulimit.cache"


def test_status_shows_every_name_escaped_and_forges_no_row(node):
    env, root = node
    text = run(vgpulimit_cmd("status", "--interval", "0", "--all", root), env).stdout
    for shown in HOSTILE.values():
        assert f"region {path_shown(root, shown)}" in text
    assert f"region {path_shown(root, BROKEN_SHOWN)}: " in text   # unreadable, and said so
    assert not forged(text)
    one = os.fsencode(path_shown(root, os.fsdecode(next(iter(HOSTILE)))))
    single = subprocess.run([*map(os.fsencode, vgpulimit_cmd("status", "--interval", "0", "--region")), one],
                            env=env, capture_output=True, text=True, timeout=120, check=False)
    assert single.returncode == 0, single.stderr
    assert f"region {path_shown(root, HOSTILE[next(iter(HOSTILE))])}" in single.stdout
    assert not forged(single.stdout)


def strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


def test_status_json_is_text_any_program_decodes_with_each_name_in_it(node):
    env, root = node
    document = json.loads(run(vgpulimit_cmd("status", "--json", "--interval", "0", "--all", root), env).stdout)
    for text in strings(document):
        text.encode("utf-8")   # no lone surrogate: a strict decoder (Go's, jq's) takes it as it is
    regions = {r["region"] for r in document["regions"]}
    assert regions == {path_shown(root, name) for name in IN_JSON.values()}
    assert [e["region"] for e in document["errors"]] == [path_shown(root, r"pod\xff_broken" + "\nFORGED")]
    commands = [p["host"]["command"] for r in document["regions"] for p in r["processes"]]
    assert sorted(c.split(" ", 3)[3] for c in commands) == sorted(IN_JSON.values())


def test_status_query_writes_one_row_per_region_each_name_escaped(node):
    env, root = node
    text = run(vgpulimit_cmd("status", "--interval", "0", "--all", root, "--query", "region,memory.used"),
               env).stdout
    rows = text.splitlines()[1:]
    assert len(rows) == len(HOSTILE)
    assert any(row.startswith(path_shown(root, r"pod\xff\xfe_c\nFORGED")) for row in rows)
    assert not forged(text)


def test_top_shows_every_command_escaped(node):
    env, root = node
    text = run(vgpulimit_cmd("top", "--once", "--all", root), dict(env, COLUMNS="600")).stdout
    assert r"pod\xff\xfe_c\nFORGED" in text and r"\x1b[2J\x1b]0;owned\x07_ctl" in text
    assert not forged(text)


def test_metrics_serve_every_name_escaped_as_a_label_and_log_it_escaped(node):
    env, root = node
    server = subprocess.Popen(vgpulimit_cmd("metrics", "--listen", "127.0.0.1:0", "--all", root),
                              env=env, stderr=subprocess.PIPE, text=True, errors="surrogateescape")
    try:
        url = server.stderr.readline().split()[-1]
        with urllib.request.urlopen(url, timeout=60) as response:
            text = response.read().decode()
        request = urllib.request.Request(url, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        with urllib.request.urlopen(request, timeout=60) as response:
            openmetrics = response.read().decode()
    finally:
        server.terminate()
        _, log = server.communicate(timeout=30)
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    assert {s.labels["region"] for s in samples if s.name == "vgpulimit_memory_used_bytes"} == \
        {path_shown(root, shown) for shown in HOSTILE.values()}
    assert [s.labels["region"] for s in samples
            if s.name == "vgpulimit_region_readable" and s.value == 0] == [path_shown(root, BROKEN_SHOWN)]
    assert {(s.labels["pod_uid"], s.labels["container"]) for s in samples
            if s.name == "vgpulimit_memory_used_bytes"} >= {(r"pod\xff\xfe", r"c\nFORGED"),
                                                             ('q"uo\\te', '{x="y"}\\')}
    comms = {s.labels["command"] for s in samples if s.name == "vgpulimit_process_memory_used_bytes"}
    assert r"pod\xff\xfe_c\nFORGED" in comms   # its comm, as the shim found it
    outside = [s.labels["command"] for s in samples if s.name == "vgpulimit_gpu_process_unaccounted_bytes"]
    assert any(c.endswith(r"pod\xff\xfe_c\nFORGED") for c in outside), outside
    assert not any(forged(v) for s in samples for v in s.labels.values())
    assert len(list(openmetrics_families(openmetrics))) > 1
    assert path_shown(root, BROKEN_SHOWN) in log and not forged(log)


# -- the shim names no directory a tenant could choose ----------------------------------------


@pytest.mark.parametrize("name", HOSTILE)
@pytest.mark.parametrize("which", ["POD_UID", "CONTAINER_NAME"])
def test_kai_names_that_kubernetes_never_gives_make_no_directory(name, which):
    names = {"POD_UID": "123e4567-e89b-12d3-a456-426614174000", "CONTAINER_NAME": "main"}
    names[which] = os.fsdecode(name)
    env = environment.read({"CONTAINER_VGPU_MOUNT": "/usr/local/vgpu", "CUDA_DEVICE_MEMORY_LIMIT": "1g",
                            **names})
    assert env.region_path is None
    [line] = env.warnings
    assert "make no region path" in line and not forged(line) and "\udcff" not in line


def test_kai_names_as_kubernetes_gives_them_name_the_directory():
    env = environment.read({"CONTAINER_VGPU_MOUNT": "/usr/local/vgpu", "CUDA_DEVICE_MEMORY_LIMIT": "1g",
                            "POD_UID": "123e4567-e89b-12d3-a456-426614174000", "CONTAINER_NAME": "train.v2-0"})
    assert env.region_path == \
        "/usr/local/vgpu/containers/123e4567-e89b-12d3-a456-426614174000_train.v2-0/vgpulimit.cache"
    assert env.warnings == ()


def test_a_tenant_setting_kai_names_in_its_environment_makes_no_directory_and_keeps_its_cap(
        sim_env, shim_path, tmp_path):
    mount = tmp_path / "vgpu"
    mount.mkdir()
    env = dict(sim_env, LD_PRELOAD=str(shim_path), CONTAINER_VGPU_MOUNT=str(mount),
               CUDA_DEVICE_MEMORY_LIMIT="1g", POD_UID=os.fsdecode(b"pod\xff\xfe"),
               CONTAINER_NAME="c\nFORGED")
    result = subprocess.run([sys.executable, str(TESTS / "clients" / "cuda_fill.py"), str(MiB), "1"], env=env,
                            capture_output=True, text=True, errors="surrogateescape", timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["before"]["total"] == 1 << 30   # capped all the same, in a region of its own
    assert not (mount / "containers").exists() or os.listdir(mount / "containers") == []
    assert r'POD_UID="pod\xff\xfe" and CONTAINER_NAME="c\x0aFORGED"' in result.stderr
    assert not forged(result.stderr)

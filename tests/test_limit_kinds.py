"""The table of limit kinds (shim/src/limit_kinds.def) held to the code that
goes by it: every variable it names is read by the shim in a process (a bad
value fails closed, naming it) and by the Python side (environment.read,
resolve_limits); every flag is a flag of `run` and `set` (and `cdi
generate`), completed by the shell; every annotation is the OCI hook's; `cdi
generate` writes the variables, which read back; a supervised child loses
them all; the region and board fields it names exist.

A new row fails here until the kind is wired through (FIELDS below names
where it is read out); the files a new kind touches are listed at the top of
shim/src/limit_kinds.def."""

from __future__ import annotations

import subprocess

import pytest
from conftest import base_env, run, vgpulimit_cmd
from vgpulimit._core import ffi

from vgpulimit import cdi, environment, request
from vgpulimit.child_env import child_environment
from vgpulimit.kinds import KINDS
from vgpulimit.oci.request import requested

UUID = "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6"

# Where environment.read and request.Limits keep each kind: (per device or
# once, by UUID).  A kind that is not here is not read out yet.
FIELDS = {
    "memory": ("memory", "memory_by_uuid"),
    "memory_request": ("request", "request_by_uuid"),
    "memory_wait": ("memory_wait", None),
    "cores": ("cores", "cores_by_uuid"),
    "cores_policy": ("cores_policy", None),
    "priority": ("priority", None),
}


def _forms(kind) -> list[tuple[str, str]]:
    """Every variable of ``kind`` the shim reads, with a value of it:
    ours (per device, by UUID), HAMi's (per device), KAI's."""
    forms = [(kind.ours, kind.example)]
    if kind.per_device:
        forms.append((f"{kind.ours}_1", kind.example))
    if kind.by_uuid:
        forms.append((f"{kind.ours}_{UUID}", kind.example))
    if kind.hami:
        forms.append((kind.hami, kind.hami_example))
        if kind.per_device:
            forms.append((f"{kind.hami}_1", kind.hami_example))
    if kind.kai:
        forms.append((kind.kai, "0.5"))
    return forms


VARIABLES = [(kind, name, value) for kind in KINDS for name, value in _forms(kind)]
IDS = [name for _, name, _ in VARIABLES]


def _settings(holder, kind) -> list:
    """Every Setting of ``kind`` that ``holder`` (an Environment or Limits) keeps."""
    every, by_uuid = FIELDS[kind.name]
    found = getattr(holder, every)
    settings = list(found.values()) if isinstance(found, dict) else [found] if found else []
    return settings + (list(getattr(holder, by_uuid).values()) if by_uuid else [])


def test_every_kind_of_the_table_is_read_out():
    assert [k.name for k in KINDS if k.name not in FIELDS] == []
    assert len({k.ours for k in KINDS}) == len(KINDS)
    assert len({k.flag for k in KINDS}) == len(KINDS)
    assert len({k.annotation for k in KINDS}) == len(KINDS)


@pytest.mark.parametrize("kind, name, value", VARIABLES, ids=IDS)
def test_the_python_side_reads_every_variable_of_the_table(kind, name, value):
    read = environment.read({name: value})
    assert read.errors == ()
    assert name in [s.source for s in _settings(read, kind)]
    limits = request.resolve_limits(None, [], {name: value})
    assert name in [s.source for s in _settings(limits, kind)]


@pytest.mark.parametrize("kind, name, value", VARIABLES, ids=IDS)
def test_the_shim_reads_every_variable_of_the_table(kind, name, value, sim_env, shim_path, cbin):
    """A bad value of each, under a bare preload: the shim names the variable
    and lets nothing through, as it does for a variable it reads."""
    bare = subprocess.run([cbin / "alloc_client", "link", str(1 << 20), "1"], capture_output=True, text=True,
                          env=sim_env | {name: "bogus", "LD_PRELOAD": str(shim_path)}, timeout=60, check=False)
    assert "alloc 0 2" in bare.stdout.splitlines()   # CUDA_ERROR_OUT_OF_MEMORY: failed closed
    assert [line for line in bare.stderr.splitlines() if ": error: " in line and name in line]


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_every_flag_of_the_table_is_a_flag_of_run_set_and_cdi_generate(kind):
    for command in (["run"], ["set"], ["cdi", "generate"]):
        shown = run(vgpulimit_cmd(*command, "--help"), env=base_env()).stdout
        assert f"{kind.flag} " in shown
        if kind.per_device and command != ["cdi", "generate"]:
            assert f"{kind.device_flag} I=" in shown
    limits = request.resolve_limits(environ={}, **{kind.dest: kind.example})
    assert [s.source for s in _settings(limits, kind)] != []
    assert {s.source for s in _settings(limits, kind)} == {kind.flag}


def test_the_shell_completes_every_flag_of_the_table():
    script = run(vgpulimit_cmd("completion", "bash"), env=base_env()).stdout
    for kind in KINDS:
        assert kind.flag in script
        assert not kind.per_device or kind.device_flag in script


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_every_annotation_of_the_table_is_the_hooks(kind):
    config = {"process": {"env": ["VGPULIMIT_MEMORY=2GiB"]}, "annotations": {kind.annotation: kind.example}}
    limits = requested(config)
    assert f"annotation {kind.annotation}" in [s.source for s in _settings(limits, kind)]


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_cdi_generate_writes_the_tables_variable_and_it_reads_back(kind):
    given = {"cores": "30"} | {kind.dest: kind.example}
    env = dict(e.split("=", 1) for e in cdi.generate(**given)["devices"][0]["containerEdits"]["env"])
    assert env[kind.ours] == kind.example
    assert kind.ours in [s.source for s in _settings(environment.read(env), kind)]
    if kind.by_uuid:
        env = cdi.generate(device=UUID, **given)["devices"][0]["containerEdits"]["env"]
        assert f"{kind.ours}_{UUID}={kind.example}" in env


@pytest.mark.parametrize("kind, name, value", VARIABLES, ids=IDS)
def test_a_supervised_child_loses_every_variable_of_the_table(kind, name, value, tmp_path):
    env = child_environment({name: value, "HOME": "/root"}, str(tmp_path / "region"), simulate=False)
    assert name not in env
    assert env["HOME"] == "/root"


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_the_region_and_board_fields_of_the_table_exist(kind):
    for field in (kind.region_field, kind.board_field):
        if field:
            struct, member = field.split(".")
            assert member in dict(ffi.typeof(f"struct {struct}").fields)


@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_the_tables_examples_parse(kind):
    assert kind.parse(kind.example) is not None

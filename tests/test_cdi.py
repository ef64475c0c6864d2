"""`vgpulimit cdi generate`: the spec, checked against the CDI schema, and a
container started from its edits as a CDI-aware runtime applies them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import TESTS, GiB, MiB, base_env, vgpulimit_cmd
from runc_bundle import make_bundle, runc_unavailable, tree
from schemas import validate

from vgpulimit.cdi import KIND, minimum_version

FILL = [sys.executable, str(TESTS / "clients" / "cuda_fill.py")]


def generate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(vgpulimit_cmd("cdi", "generate", *args), capture_output=True, text=True,
                          env=base_env(), timeout=60, check=False)


def spec_of(*args: str) -> dict:
    result = generate(*args)
    assert result.returncode == 0, result.stderr
    spec = json.loads(result.stdout)
    validate("cdi/schema.json", spec)
    return spec


def test_the_spec_gives_the_limits_the_shim_and_the_hook(shim_path):
    spec = spec_of("--name", "small", "--memory", "1GiB", "--cores", "30")
    assert spec["kind"] == "vgpulimit.io/gpu"
    [device] = spec["devices"]
    assert device["name"] == "small"
    edits = device["containerEdits"]
    # The policy said although it is the default: a container's own variable cannot lift the share.
    assert edits["env"] == ["VGPULIMIT_MEMORY=1GiB", "VGPULIMIT_CORES=30", "VGPULIMIT_CORES_POLICY=hard"]
    [mount] = edits["mounts"]
    assert mount["hostPath"] == str(shim_path)
    assert mount["containerPath"] == "/.vgpulimit/libvgpulimit.so"
    assert "ro" in mount["options"]
    assert [h["hookName"] for h in edits["hooks"]] == ["createRuntime", "poststop"]
    for hook in edits["hooks"]:
        assert os.access(hook["path"], os.X_OK)
        assert hook["args"][-1] == "oci-hook"


def test_the_spec_can_ask_the_hook_to_admit():
    spec = spec_of("--memory", "4GiB", "--admit")
    hooks = spec["devices"][0]["containerEdits"]["hooks"]
    assert all(hook["args"][-2:] == ["oci-hook", "--admit"] for hook in hooks)
    result = generate("--memory", "4GiB", "--admit-uncapped")
    assert result.returncode == 2 and "--admit-uncapped goes with --admit" in result.stderr


@pytest.mark.parametrize("args, name", [
    (["--memory", "1GiB"], "1GiB"),
    (["--memory", "50%", "--cores", "30%"], "50pct-cores30"),
    (["--memory", "none", "--cores", "none"], "shim"),
])
def test_the_device_is_named_after_its_limits(args, name):
    [device] = spec_of(*args)["devices"]
    assert device["name"] == name


# Two specs in one directory that name the same device make the engine refuse
# it: podman says only "unresolvable CDI devices".  So every flag that changes
# the spec changes the default name.
@pytest.mark.parametrize("one, other", [
    (["--cores-policy", "borrow"], ["--cores-policy", "none"]),
    (["--cores-policy", "hard"], []),
    (["--priority", "high"], ["--priority", "low"]),
    (["--priority", "normal"], []),
    (["--admit"], []),
    (["--admit", "--admit-uncapped"], ["--admit"]),
    (["--node-dir", "/run/a"], ["--node-dir", "/run/b"]),
    (["--node-dir", "/run/vgpulimit/containers"], []),
])
def test_specs_that_differ_in_one_flag_name_different_devices(one, other):
    [first] = spec_of("--memory", "1GiB", *one)["devices"]
    [second] = spec_of("--memory", "1GiB", *other)["devices"]
    assert first["name"] != second["name"]
    assert first["name"].startswith("1GiB")


def test_the_default_names_of_all_flag_combinations_are_distinct():
    from itertools import product

    from vgpulimit.cdi import generate as generate_spec

    names = {}
    for policy, priority, admit, node_dir in product(
            (None, "hard", "borrow", "none"), (None, "high", "normal", "low"),
            ((False, False), (True, False), (True, True)), (None, "/run/a", "/run/b")):
        spec = generate_spec(None, "1GiB", "30", node_dir, policy, *admit, priority=priority)
        names.setdefault(spec["devices"][0]["name"], []).append((policy, priority, admit, node_dir))
    assert [same for same in names.values() if len(same) > 1] == []


def test_a_default_name_says_the_policy_and_the_priority():
    [device] = spec_of("--memory", "1GiB", "--cores", "30%", "--cores-policy", "BORROW",
                       "--priority", "low")["devices"]
    assert device["name"] == "1GiB-cores30-policy-borrow-priority-low"


# Engines refuse a cdiVersion newer than they know: podman 4.3.1 reads up to 0.5.0.
@pytest.mark.parametrize("args, version", [
    (["--memory", "1GiB"], "0.5.0"),                    # the name "1GiB" starts with a digit
    (["--name", "7b", "--cores", "30"], "0.5.0"),
    (["--name", "small", "--memory", "1GiB"], "0.4.0"),   # the shim's mount has a type
    (["--memory", "none", "--cores", "none"], "0.4.0"),  # "shim"
])
def test_the_spec_claims_the_lowest_version_its_content_needs(args, version):
    assert spec_of(*args)["cdiVersion"] == version


@pytest.mark.parametrize("name, mount, version", [
    ("gpu", {"hostPath": "/a", "containerPath": "/a"}, "0.3.0"),
    ("gpu", {"hostPath": "/a", "containerPath": "/a", "type": "bind"}, "0.4.0"),
    ("0gpu", {"hostPath": "/a", "containerPath": "/a"}, "0.5.0"),
    ("9gpu", {"hostPath": "/a", "containerPath": "/a", "type": "bind"}, "0.5.0"),
])
def test_minimum_version_as_the_cdi_library_reckons_it(name, mount, version):
    """container-device-interface, specs-go/version.go: requiresV040 (a mount's
    type), requiresV050 (a device name that does not start with a letter)."""
    spec = {"kind": KIND, "devices": [{"name": name, "containerEdits": {"mounts": [mount]}}]}
    assert minimum_version(spec) == version
    validate("cdi/schema.json", {"cdiVersion": version, **spec})


def test_without_limits_the_device_leaves_them_to_the_container():
    [device] = spec_of("--memory", "none", "--cores", "none")["devices"]
    assert "env" not in device["containerEdits"]


def test_output_file(tmp_path):
    output = tmp_path / "vgpulimit.json"
    result = generate("--memory", "2GiB", "--output", str(output))
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert json.loads(output.read_text()) == spec_of("--memory", "2GiB")


@pytest.mark.parametrize("args, expected", [
    (["--memory", "lots"], "--memory: 'lots' is not a valid value; accepted forms"),
    (["--cores", "0"], "--cores: '0' is out of range"),
    (["--name", "a b"], "--name: 'a b' is not a CDI device name"),
    (["--cores", "30", "--priority", "urgent"], "--priority: 'urgent' is not a valid value; accepted forms: high, normal, low"),
])
def test_bad_flags_are_one_line(args, expected):
    result = generate(*args)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("vgpulimit: error: ") and expected in line


def test_an_output_it_cannot_write(tmp_path):
    result = generate("--memory", "1GiB", "--output", str(tmp_path / "missing" / "spec.json"))
    assert result.returncode == 1
    [line] = result.stderr.splitlines()
    assert line == (f"vgpulimit: error: --output {tmp_path / 'missing' / 'spec.json'}: "
                    "No such file or directory")


def apply_edits(config: dict, edits: dict) -> None:
    """What a CDI-aware runtime does to a container's config.json with a device's
    containerEdits (container-device-interface, pkg/cdi/container-edits.go)."""
    process = config["process"]
    names = {e.split("=", 1)[0] for e in edits.get("env", [])}
    process["env"] = [e for e in process["env"] if e.split("=", 1)[0] not in names]
    process["env"] += edits.get("env", [])
    for mount in edits.get("mounts", []):
        config["mounts"].append({"destination": mount["containerPath"], "source": mount["hostPath"],
                                 "type": mount.get("type", "bind"),
                                 "options": mount.get("options", [])})
    for hook in edits.get("hooks", []):
        entry = {k: hook[k] for k in ("path", "args", "env", "timeout") if k in hook}
        config.setdefault("hooks", {}).setdefault(hook["hookName"], []).append(entry)


def test_a_container_started_from_the_spec_is_capped_as_with_the_hook(tmp_path):
    reason = runc_unavailable()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("cuda.bindings")
    node = tmp_path / "node"
    [device] = spec_of("--memory", "1GiB", "--node-dir", str(node))["devices"]
    bundle = make_bundle(tmp_path, [*FILL, str(256 * MiB), "5", "--hold", "/tmp/release"])
    apply_edits(bundle.config, device["containerEdits"])
    bundle.settle()
    # /tmp is the client's (the simulated GPU's state, the release file).
    before = tree(bundle.rootfs, dir_times=False, skip=("tmp",))
    proc, container_id = bundle.start()
    try:
        report = json.loads(proc.stdout.readline())
        assert report["allocs"] == ["CUDA_SUCCESS"] * 4 + ["CUDA_ERROR_OUT_OF_MEMORY"]
        assert report["before"] == {"free": GiB, "total": GiB}
        status = subprocess.run(vgpulimit_cmd("status", "--json", "--region",
                                              str(node / container_id / "region")),
                                capture_output=True, text=True, env=base_env(), check=False)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["devices"][0]["used_bytes"] == GiB
    finally:
        (bundle.rootfs / "tmp" / "release").touch()
        proc.communicate(timeout=60)
        bundle.cleanup()
    assert proc.returncode == 0
    assert tree(bundle.rootfs, dir_times=False, skip=("tmp",)) == before
    assert os.listdir(node) == []


def test_the_spec_carries_the_compute_policy():
    [device] = spec_of("--cores", "30", "--cores-policy", "borrow")["devices"]
    assert device["containerEdits"]["env"] == ["VGPULIMIT_CORES=30", "VGPULIMIT_CORES_POLICY=borrow"]


def test_the_spec_carries_the_priority():
    [device] = spec_of("--cores", "30", "--priority", "low")["devices"]
    assert device["containerEdits"]["env"] == ["VGPULIMIT_CORES=30", "VGPULIMIT_CORES_POLICY=hard",
                                               "VGPULIMIT_PRIORITY=low"]

"""`vgpulimit oci-hook` and `vgpulimit install-hook`: the hook as a runtime runs
it, on bad input and in real containers (runc)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TESTS, GiB, MiB, base_env, compile_c, vgpulimit_cmd
from helpers import one_error_line
from runc_bundle import CONFIG_SCHEMA, hook_entry, make_bundle, runc_unavailable, tree
from schemas import validate

REPO = TESTS.parent
FILL = [sys.executable, str(TESTS / "clients" / "cuda_fill.py")]
FOUR_THEN_OOM = ["CUDA_SUCCESS"] * 4 + ["CUDA_ERROR_OUT_OF_MEMORY"]
SHIM_IN_CONTAINER = "/.vgpulimit/libvgpulimit.so"
STATE_SCHEMA = "oci-runtime-spec/state-schema.json"


def hook(state: str | dict, node_dir: Path) -> subprocess.CompletedProcess:
    """The hook as a runtime runs it: the state on stdin."""
    text = state if isinstance(state, str) else json.dumps(state)
    return subprocess.run(vgpulimit_cmd("oci-hook", "--node-dir", str(node_dir)), input=text,
                          capture_output=True, text=True, env=base_env(), timeout=60, check=False)


def state_of(bundle: Path, status: str = "creating", pid: int | None = None,
             container_id: str = "c1") -> dict:
    state = {"ociVersion": "1.0.2", "id": container_id, "status": status,
             "bundle": str(bundle)}
    if pid is not None:
        state["pid"] = pid
    return state


def plain_bundle(base: Path, env: dict[str, str] | None = None,
                 annotations: dict[str, str] | None = None) -> Path:
    """A bundle as a runtime leaves it for the hook: config.json and a rootfs."""
    bundle = base / "bundle"
    (bundle / "rootfs" / "etc").mkdir(parents=True)
    config = {"ociVersion": "1.0.2", "root": {"path": "rootfs"},
              "process": {"cwd": "/", "args": ["true"], "user": {"uid": 0, "gid": 0},
                          "env": [f"{k}={v}" for k, v in (env or {}).items()]}}
    if annotations:
        config["annotations"] = annotations
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


def test_the_bundles_and_states_given_to_the_hook_here_validate(tmp_path):
    bundle = plain_bundle(tmp_path, {"VGPULIMIT_MEMORY": "1GiB"}, {"vgpulimit.io/cores": "30"})
    validate(CONFIG_SCHEMA, json.loads((bundle / "config.json").read_text()))
    for status, pid in (("creating", os.getpid()), ("stopped", None)):
        validate(STATE_SCHEMA, state_of(bundle, status, pid))


def test_the_bundles_given_to_runc_here_validate(tmp_path):
    reason = runc_unavailable()
    if reason:
        pytest.skip(reason)
    bundle = make_bundle(tmp_path, ["true"], {"VGPULIMIT_MEMORY": "1GiB"})
    bundle.add_hook("createRuntime", hook_entry(tmp_path / "node"))
    bundle.add_hook("poststop", hook_entry(tmp_path / "node"))
    validate(CONFIG_SCHEMA, bundle.config)


# -- the hook on its own ------------------------------------------------------------------------


def test_a_container_that_asks_for_nothing_is_left_alone(tmp_path):
    bundle = plain_bundle(tmp_path, env={"PATH": "/bin", "VGPULIMIT_LOG": "debug"})
    before = tree(bundle)
    result = hook(state_of(bundle, pid=os.getpid()), tmp_path / "node")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert tree(bundle) == before
    assert not (tmp_path / "node").exists()


@pytest.mark.parametrize("variable", ["VGPULIMIT_REGION", "CUDA_DEVICE_MEMORY_SHARED_CACHE"])
def test_a_container_whose_region_is_named_is_left_to_whoever_named_it(tmp_path, variable):
    # A device plugin mounts the shim and names the region (as HAMi's does).
    bundle = plain_bundle(tmp_path, env={"CUDA_DEVICE_MEMORY_LIMIT_0": "1024m",
                                         variable: "/usr/local/vgpu/x.cache"})
    before = tree(bundle)
    result = hook(state_of(bundle, pid=os.getpid()), tmp_path / "node")
    assert (result.returncode, result.stderr) == (0, "")
    assert tree(bundle) == before
    assert not (tmp_path / "node").exists()


def test_poststop_of_a_container_it_did_not_touch(tmp_path):
    result = hook(state_of(plain_bundle(tmp_path), "stopped"), tmp_path / "node")
    assert (result.returncode, result.stderr) == (0, "")


@pytest.mark.parametrize("case, expected", [
    ("not json", "the container state on stdin is not JSON"),
    ("array", "the container state on stdin is not a JSON object"),
    ("no bundle", "the container state on stdin has no string 'bundle'"),
    ("missing bundle", "bundle /nonexistent/bundle: no such directory"),
    ("no config", "no config.json"),
    ("bad id", "container id '../../etc' is not one a runtime gives"),
    ("bad status", "container status 'running': the hook runs at createRuntime or prestart"),
    ("bad memory", "process.env VGPULIMIT_MEMORY: '1.5 gigs' is not a valid value; accepted forms"),
    ("bad device memory", "process.env VGPULIMIT_MEMORY_1: '8GBx' is not a valid value"),
    ("bad hami", "process.env CUDA_DEVICE_MEMORY_LIMIT_0: 'lots' is not a valid value"),
    ("bad annotation", "annotation vgpulimit.io/memory: 'half' is not a valid value"),
    ("bad cores", "annotation vgpulimit.io/cores: '150' is out of range"),
    ("bad cores policy", "annotation vgpulimit.io/cores-policy: 'lend' is not a valid value; accepted forms"),
    ("bad policy variable", "process.env GPU_CORE_UTILIZATION_POLICY: 'SOMETIMES' is not a valid value"),
    # The variables may be the setter's (a CDI device's, a device plugin's), the
    # annotations the pod author's: they tighten, never loosen.
    ("looser annotation", ("annotation vgpulimit.io/memory 2GiB would loosen VGPULIMIT_MEMORY=1GiB, which the "
                           "container's device or environment sets: an annotation may only tighten it")),
    ("unlike annotation", "annotation vgpulimit.io/memory 50% cannot be weighed against VGPULIMIT_MEMORY=1GiB"),
    ("looser priority", "annotation vgpulimit.io/priority high would loosen CUDA_TASK_PRIORITY=1"),
    ("looser cores policy", "annotation vgpulimit.io/cores-policy none would loosen VGPULIMIT_CORES=50"),
    # Nor can the pod spec's variables loosen the device's, which they stand beside.
    ("looser variable", ("VGPULIMIT_MEMORY_0=100GiB would loosen VGPULIMIT_MEMORY=1GiB, which the container's "
                         "device or environment sets: a variable may only tighten it")),
    ("looser by uuid", "VGPULIMIT_MEMORY_GPU-d57d0b41-b7df-699d-95db-f99d9e1d6920=100 GiB would loosen"),
    ("region beside ours", ("process.env VGPULIMIT_REGION names a region of another injector, while "
                            "VGPULIMIT_MEMORY asks the hook for one: give the container one of the two")),
    ("no pid", "the container state has no pid"),
])
def test_bad_input_is_one_line_and_a_failure(tmp_path, case, expected):
    env = {"VGPULIMIT_MEMORY": "1GiB"}
    annotations = None
    if case == "bad memory":
        env = {"VGPULIMIT_MEMORY": "1.5 gigs"}
    elif case == "bad device memory":
        env = {"VGPULIMIT_MEMORY": "1GiB", "VGPULIMIT_MEMORY_1": "8GBx"}
    elif case == "bad hami":
        env = {"CUDA_DEVICE_MEMORY_LIMIT_0": "lots"}
    elif case == "bad annotation":
        annotations = {"vgpulimit.io/memory": "half"}
    elif case == "bad cores":
        annotations = {"vgpulimit.io/cores": "150"}
    elif case == "bad cores policy":
        annotations = {"vgpulimit.io/cores": "30", "vgpulimit.io/cores-policy": "lend"}
    elif case == "bad policy variable":
        env = {"CUDA_DEVICE_SM_LIMIT": "30", "GPU_CORE_UTILIZATION_POLICY": "SOMETIMES"}
    elif case == "looser annotation":
        annotations = {"vgpulimit.io/memory": "2GiB"}
    elif case == "unlike annotation":
        annotations = {"vgpulimit.io/memory": "50%"}
    elif case == "looser cores policy":
        env = {"VGPULIMIT_CORES": "50"}
        annotations = {"vgpulimit.io/cores-policy": "none"}
    elif case == "looser variable":
        env = {"VGPULIMIT_MEMORY": "1GiB", "VGPULIMIT_MEMORY_0": "100GiB"}
    elif case == "looser by uuid":
        env = {"VGPULIMIT_MEMORY": "1GiB", "VGPULIMIT_MEMORY_GPU-d57d0b41-b7df-699d-95db-f99d9e1d6920": "100GiB"}
    elif case == "region beside ours":
        env = {"VGPULIMIT_MEMORY": "1GiB", "VGPULIMIT_REGION": "/tmp/mine"}
    elif case == "looser priority":
        env = {"VGPULIMIT_MEMORY": "1GiB", "CUDA_TASK_PRIORITY": "1"}
        annotations = {"vgpulimit.io/priority": "high"}
    bundle = plain_bundle(tmp_path, env, annotations)
    state: str | dict = state_of(bundle, pid=None if case == "no pid" else os.getpid())
    if case == "not json":
        state = '{"ociVersion": "1.0.2", "id": '
    elif case == "array":
        state = "[]"
    elif case == "no bundle":
        del state["bundle"]
    elif case == "missing bundle":
        state["bundle"] = "/nonexistent/bundle"
    elif case == "no config":
        (bundle / "config.json").unlink()
    elif case == "bad id":
        state["id"] = "../../etc"
    elif case == "bad status":
        state["status"] = "running"
    before = tree(bundle)
    line = one_error_line(hook(state, tmp_path / "node"))
    assert expected in line
    assert tree(bundle) == before
    assert not (tmp_path / "node").exists()


@pytest.mark.parametrize("value", ["soon", "-5m", "31d", "10 parsecs"])
def test_a_bad_suspend_idle_annotation_is_one_line_naming_it(value):
    from vgpulimit.oci import HookError
    from vgpulimit.oci.install import _idle_ms

    with pytest.raises(HookError) as raised:
        _idle_ms({"annotations": {"vgpulimit.io/suspend-idle": value}})
    assert str(raised.value).startswith(f"annotation vgpulimit.io/suspend-idle {value!r}: ")
    assert "500ms, 30s, 10m, 4h" in str(raised.value) and "\n" not in str(raised.value)
    assert _idle_ms({"annotations": {"vgpulimit.io/suspend-idle": "10m"}}) == 600_000
    assert _idle_ms({}) == 0


def test_a_variable_of_ours_looser_than_hamis_gives_way():
    """Beside a device plugin's HAMi variable, ours (the pod author's, or a
    CDI device's) applies only where it is the tighter, as in the shim."""
    from vgpulimit.oci.request import requested

    limits = requested({"process": {"env": ["CUDA_DEVICE_SM_LIMIT=30", "VGPULIMIT_CORES=90"]}})
    assert {s.value for s in limits.cores.values()} == {30}
    limits = requested({"process": {"env": ["CUDA_DEVICE_SM_LIMIT=30", "VGPULIMIT_CORES=20"]}})
    assert {s.value for s in limits.cores.values()} == {20}


# -- hooks.d ------------------------------------------------------------------------------------


def test_install_hook_writes_a_hooks_d_file(tmp_path):
    directory = tmp_path / "hooks.d"
    result = subprocess.run(vgpulimit_cmd("install-hook", "--dir", str(directory)),
                            capture_output=True, text=True, env=base_env(), check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(directory / "vgpulimit.json")
    installed = json.loads((directory / "vgpulimit.json").read_text())
    shipped = json.loads((REPO / "hooks" / "vgpulimit.json").read_text())
    assert installed["version"] == shipped["version"] == "1.0.0"
    for key in ("when", "stages"):
        assert installed[key] == shipped[key]
    assert installed["stages"] == ["createRuntime", "poststop"]
    assert shipped["hook"]["args"][1:] == ["oci-hook"]
    # The installed file names this installation, and it runs.
    assert os.access(installed["hook"]["path"], os.X_OK)
    bundle = plain_bundle(tmp_path)
    command = installed["hook"]
    run = subprocess.run(command["args"], executable=command["path"], capture_output=True,
                         text=True, input=json.dumps(state_of(bundle, "stopped")), env={},
                         check=False)
    assert (run.returncode, run.stderr) == (0, "")


def test_install_hook_into_a_place_it_cannot_write(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = subprocess.run(vgpulimit_cmd("install-hook", "--dir", str(blocker / "hooks.d")),
                            capture_output=True, text=True, env=base_env(), check=False)
    assert "install-hook: cannot write" in one_error_line(result)


# -- in real containers -------------------------------------------------------------------------


@pytest.fixture
def bundles(tmp_path, runc):
    """Makes bundles under tmp_path; deletes their containers afterwards."""
    made = []

    def make(args, env=None, name="c", hooked=True):
        bundle = make_bundle(tmp_path / name, list(map(str, args)), env)
        if hooked:
            bundle.add_hook("createRuntime", hook_entry(tmp_path / "node"))
            bundle.add_hook("poststop", hook_entry(tmp_path / "node"))
        made.append(bundle)
        return bundle

    yield make
    for bundle in made:
        bundle.cleanup()


def fill(block: int, count: int, *extra: str) -> list[str]:
    return [*FILL, str(block), str(count), *extra]


def report_of(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def runtime_refused(result: subprocess.CompletedProcess, expected: str) -> None:
    """runc did not start the container, and shows the hook's one line."""
    assert result.returncode != 0
    assert "started" not in result.stdout
    assert result.stderr.count("vgpulimit: error: ") == 1, result.stderr
    assert expected in result.stderr.replace('\\"', '"'), result.stderr


def test_a_container_asking_with_its_environment_is_capped_and_seen_from_the_node(
        tmp_path, bundles):
    bundle = bundles(fill(256 * MiB, 5, "--hold", "/tmp/release"), {"VGPULIMIT_MEMORY": "1GiB"})
    bundle.settle()
    # /tmp is the client's (the simulated GPU's state, the release file).
    before = tree(bundle.rootfs, dir_times=False, skip=("tmp",))
    proc, container_id = bundle.start()
    try:
        report = json.loads(proc.stdout.readline())
        assert report["allocs"] == FOUR_THEN_OOM
        assert report["before"] == {"free": GiB, "total": GiB}
        node = subprocess.run(vgpulimit_cmd("status", "--all", str(tmp_path / "node"), "--json",
                                            "--interval", "0"),
                              capture_output=True, text=True, env=base_env(), check=False)
        assert node.returncode == 0, node.stderr
        [region] = json.loads(node.stdout)["regions"]
        assert region["region"] == str(tmp_path / "node" / container_id / "region")
        assert region["devices"][0]["cap_bytes"] == GiB
        assert region["devices"][0]["used_bytes"] == GiB
        assert [p["used_bytes"] for p in region["processes"]] == [GiB]
        preload = (bundle.rootfs / "etc" / "ld.so.preload").read_text()
        assert preload == SHIM_IN_CONTAINER + "\n"
    finally:
        (bundle.rootfs / "tmp" / "release").touch()
        proc.communicate(timeout=60)
    assert proc.returncode == 0
    # poststop took back all it made.
    assert tree(bundle.rootfs, dir_times=False, skip=("tmp",)) == before
    assert os.listdir(tmp_path / "node") == []


def test_a_container_that_asks_for_nothing_gets_nothing_written(tmp_path, bundles):
    bundle = bundles(["sh", "-c", "echo started; cat /etc/ld.so.preload 2>&1"])
    bundle.settle()
    before = tree(bundle.rootfs)
    result = bundle.run()
    assert result.returncode == 1, result.stderr     # cat: no such file
    assert result.stdout.startswith("started\n")
    assert tree(bundle.rootfs) == before
    assert not (tmp_path / "node").exists()


def test_a_container_of_another_user_shares_its_region_too(tmp_path, bundles):
    # Two processes of user 65534 (as the container's config says), one region:
    # the second starts once the first holds its 512 MiB.
    first, second = " ".join(fill(256 * MiB, 2, "--hold", "/tmp/go")), " ".join(fill(256 * MiB, 3))
    script = (f"{first} > /tmp/first & while [ ! -s /tmp/first ]; do sleep 0.01; done; "
              f"{second}; cat /tmp/first; touch /tmp/go; wait")
    bundle = bundles(["sh", "-c", script], {"VGPULIMIT_MEMORY": "1GiB"})
    bundle.config["process"]["user"] = {"uid": 65534, "gid": 65534}
    result = bundle.run()
    assert result.returncode == 0, result.stderr
    reports = sorted((json.loads(line) for line in result.stdout.splitlines()),
                     key=lambda r: len(r["allocs"]))
    assert [r["allocs"].count("CUDA_SUCCESS") for r in reports] == [2, 2]
    assert reports[1]["allocs"][-1] == "CUDA_ERROR_OUT_OF_MEMORY"


def test_an_annotation_beats_the_environment(bundles):
    bundle = bundles(fill(256 * MiB, 3), {"VGPULIMIT_MEMORY": "1GiB"})
    bundle.config["annotations"] = {"vgpulimit.io/memory": "512MiB"}
    report = report_of(bundle.run())
    assert report["total_mem"] == 512 * MiB
    assert report["allocs"] == ["CUDA_SUCCESS"] * 2 + ["CUDA_ERROR_OUT_OF_MEMORY"]


def test_an_annotation_alone_caps_the_container(bundles):
    # The process's environment has no variable of ours: the region carries the cap.
    bundle = bundles(fill(256 * MiB, 5))
    bundle.config["annotations"] = {"vgpulimit.io/memory": "1GiB"}
    report = report_of(bundle.run())
    assert report["allocs"] == FOUR_THEN_OOM
    assert report["before"] == {"free": GiB, "total": GiB}


def test_hami_variables_ask_as_ours_do(bundles):
    bundle = bundles(fill(256 * MiB, 5), {"CUDA_DEVICE_MEMORY_LIMIT_0": "1024m"})
    assert report_of(bundle.run())["allocs"] == FOUR_THEN_OOM


def test_a_limit_by_uuid_asks_and_caps_that_device(bundles):
    """A device plugin that knows the GPU's UUID, not the container's numbering."""
    simgpu_device_0 = "GPU-d57d0b41-b7df-699d-95db-f99d9e1d6920"   # fixed by simgpu/config.c
    bundle = bundles(fill(256 * MiB, 5), {f"VGPULIMIT_MEMORY_{simgpu_device_0}": "1GiB"})
    assert report_of(bundle.run())["allocs"] == FOUR_THEN_OOM


def libm_path() -> str:
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "/libm.so" in line:
                return line.split()[-1]
    pytest.skip("this interpreter has no libm mapped to use as an existing preload")


def test_the_hook_run_twice_leaves_one_line_and_keeps_the_existing_ones(tmp_path, bundles):
    bundle = bundles(["sh", "-c", "cat /etc/ld.so.preload"], {"VGPULIMIT_MEMORY": "1GiB"})
    # prestart (older runtimes) and createRuntime both listed, and one of them twice.
    bundle.add_hook("createRuntime", hook_entry(tmp_path / "node"))
    bundle.add_hook("prestart", hook_entry(tmp_path / "node"))
    existing = f"{libm_path()}\n"
    preload = bundle.rootfs / "etc" / "ld.so.preload"
    preload.write_text(existing)
    preload.chmod(0o640)
    result = bundle.run()
    assert result.returncode == 0, result.stderr
    assert result.stdout == existing + SHIM_IN_CONTAINER + "\n"
    assert preload.read_text() == existing
    assert stat.S_IMODE(preload.stat().st_mode) == 0o640
    assert not (bundle.rootfs / ".vgpulimit").exists()


def test_a_container_id_used_again_gets_its_own_limits_not_a_left_region(tmp_path, bundles):
    """A hook killed between making a container's region and writing its
    manifest leaves a region no poststop takes back.  The next container of
    that id (runc's ids are whoever starts it's to choose) starts with its
    own limits, not the looser ones left there."""
    from runc_bundle import RUNC

    node = tmp_path / "node"
    first = bundles(["true"], {"VGPULIMIT_MEMORY": "100GiB"}, name="first", hooked=False)
    first.add_hook("createRuntime", hook_entry(node))
    first.write()
    first.ids.append("reused")
    ran = subprocess.run([RUNC, "run", "--bundle", str(first.path), "reused"], capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL, check=False)
    assert ran.returncode == 0, ran.stderr
    subprocess.run([RUNC, "delete", "--force", "reused"], capture_output=True, check=True)
    (node / "reused" / "installed.json").unlink()
    assert (node / "reused" / "region").exists()

    second = bundles(fill(GiB, 2), {"VGPULIMIT_MEMORY": "1GiB"}, name="second")
    second.write()
    second.ids.append("reused")
    ran = subprocess.run([RUNC, "run", "--bundle", str(second.path), "reused"], capture_output=True, text=True,
                         timeout=60, stdin=subprocess.DEVNULL, check=False)
    report = report_of(ran)
    assert report["before"] == {"free": GiB, "total": GiB}
    assert report["allocs"] == ["CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert os.listdir(node) == []


def test_etc_linked_outside_the_rootfs_is_refused(tmp_path, bundles):
    outside = tmp_path / "host-etc"
    outside.mkdir()
    bundle = bundles(["sh", "-c", "echo started"], {"VGPULIMIT_MEMORY": "1GiB"})
    (bundle.rootfs / "etc").rmdir()
    (bundle.rootfs / "etc").symlink_to(outside)
    bundle.settle()
    before = tree(bundle.rootfs)
    result = bundle.run()
    runtime_refused(result, f"{bundle.rootfs}/etc in the container's rootfs is a symbolic link "
                            f"(to {outside}); the hook does not follow links in a rootfs")
    assert os.listdir(outside) == []
    assert tree(bundle.rootfs) == before


@pytest.mark.parametrize("case, expected", [
    ("not json", "the container state on stdin is not JSON"),
    ("missing bundle", "bundle /nonexistent: no such directory"),
    ("bad limit", "process.env VGPULIMIT_MEMORY: 'lots' is not a valid value"),
    ("bad annotation", "annotation vgpulimit.io/cores: '0' is out of range"),
])
def test_the_runtime_does_not_start_a_container_the_hook_fails(tmp_path, bundles, case, expected):
    bundle = bundles(["sh", "-c", "echo started"],
                     {"VGPULIMIT_MEMORY": "lots" if case == "bad limit" else "1GiB"},
                     hooked=case in ("bad limit", "bad annotation"))
    if case == "bad annotation":
        bundle.config["annotations"] = {"vgpulimit.io/cores": "0"}
    # What the runtime passes is replaced, to show what a broken one would get.
    stdin = {"not json": "echo '{\"id\": '",
             "missing bundle": """echo '{"ociVersion": "1.0.2", "id": "c", "status": "creating",
                                  "pid": 1, "bundle": "/nonexistent"}'"""}.get(case)
    if stdin is not None:
        entry = hook_entry(tmp_path / "node")
        command = " ".join(f"'{arg}'" for arg in entry["args"])
        bundle.add_hook("createRuntime", {"path": "/bin/sh",
                                          "args": ["sh", "-c", f"{stdin} | {command}"]})
    runtime_refused(bundle.run(), expected)
    assert not (bundle.rootfs / ".vgpulimit").exists()
    assert not (bundle.rootfs / "etc" / "ld.so.preload").exists()


def test_the_state_a_runtime_passes_validates(tmp_path, bundles):
    bundle = bundles(["true"], {"VGPULIMIT_MEMORY": "1GiB"})
    for stage in ("createRuntime", "poststop"):
        bundle.add_hook(stage, {"path": "/bin/sh",
                                "args": ["sh", "-c", f"cat > {tmp_path}/{stage}.json"]})
    result = bundle.run()
    assert result.returncode == 0, result.stderr
    for stage, status in (("createRuntime", "creating"), ("poststop", "stopped")):
        state = json.loads((tmp_path / f"{stage}.json").read_text())
        validate(STATE_SCHEMA, state)
        assert state["status"] == status and state["bundle"] == str(bundle.path)


ELF_MACHINES = {62: ("x86-64", "/lib/ld-linux-aarch64.so.1", 183, "arm64"),
                183: ("arm64", "/lib64/ld-linux-x86-64.so.2", 62, "x86-64")}


def test_a_rootfs_of_another_architecture_is_refused(tmp_path, runc, shim_path):
    machine = int.from_bytes(shim_path.read_bytes()[18:20], "little")
    if machine not in ELF_MACHINES:
        pytest.skip(f"no foreign loader known for ELF machine {machine}")
    ours, loader, theirs, their_name = ELF_MACHINES[machine]
    bundle = make_bundle(tmp_path, ["/bin/true"], {"VGPULIMIT_MEMORY": "1GiB"}, host_paths=[])
    for name in ("bin", "lib", "lib64", "sbin"):
        if (bundle.rootfs / name).is_symlink():
            (bundle.rootfs / name).unlink()
    fake = bundle.rootfs / loader.lstrip("/")
    fake.parent.mkdir(parents=True, exist_ok=True)
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    header[18:20] = theirs.to_bytes(2, "little")
    fake.write_bytes(bytes(header))
    bundle.add_hook("createRuntime", hook_entry(tmp_path / "node"))
    try:
        result = bundle.run()
    finally:
        bundle.cleanup()
    runtime_refused(result, f"its programs are {their_name}, and the shim is {ours} (glibc)")
    assert not (bundle.rootfs / ".vgpulimit").exists()


def stand_in_libc(path: Path, versions: list[str]) -> None:
    """A libc.so.6 that defines these symbol versions and nothing else of
    glibc: what the hook reads of a C library is the versions it defines, as
    the dynamic loader checks them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    script = path.parent / "versions.map"
    nodes, parent = [], ""
    for version in versions:
        nodes.append(f"{version} {{ {'' if parent else 'local: *;'} }} {parent};")
        parent = version
    script.write_text("\n".join(nodes) + "\n")
    source = path.parent / "stand_in.c"
    source.write_text("void vgl_stand_in(void);\nvoid vgl_stand_in(void) {}\n")
    compile_c(path, [source], "-shared", "-fPIC", "-nostdlib", "-Wl,-soname,libc.so.6",
              f"-Wl,--version-script={script}" if versions else "-Wl,--no-undefined")
    script.unlink()
    source.unlink()


@pytest.mark.parametrize("case", ["glibc 2.12", "musl", "musl with a glibc loader's name"])
def test_a_rootfs_whose_c_library_cannot_load_the_shim_is_refused(tmp_path, runc, shim_path,
                                                                   case):
    machine = int.from_bytes(shim_path.read_bytes()[18:20], "little")
    if machine not in ELF_MACHINES:
        pytest.skip(f"no loader known for ELF machine {machine}")
    ours = ELF_MACHINES[machine][0]
    loader = ELF_MACHINES[ELF_MACHINES[machine][2]][1]
    bundle = make_bundle(tmp_path, ["/bin/true"], {"VGPULIMIT_MEMORY": "1GiB"}, host_paths=[])
    for name in ("bin", "lib", "lib64", "sbin"):
        if (bundle.rootfs / name).is_symlink():
            (bundle.rootfs / name).unlink()
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    header[18:20] = machine.to_bytes(2, "little")
    # Alpine: musl's own loader, no glibc one.  gcompat adds a loader under
    # glibc's name (musl's, which skips /etc/ld.so.preload) and a libc.so.6
    # that defines no glibc version.
    if case == "musl":
        musl_loader = bundle.rootfs / "lib" / f"ld-musl-{'x86_64' if machine == 62 else 'aarch64'}.so.1"
        musl_loader.parent.mkdir()
        musl_loader.write_bytes(bytes(header))
        expected = f"it has no {loader}, and the shim is {ours} (glibc)"
    else:
        fake = bundle.rootfs / loader.lstrip("/")
        fake.parent.mkdir(parents=True, exist_ok=True)
        fake.write_bytes(bytes(header))
        if case == "glibc 2.12":   # CentOS 6's
            stand_in_libc(bundle.rootfs / "lib64" / "libc.so.6",
                          ["GLIBC_2.2.5", "GLIBC_2.3", "GLIBC_2.12"])
            expected = ("its C library (/lib64/libc.so.6) is glibc 2.12, and the shim needs "
                        "glibc 2.17 or later: its programs could not load it")
        else:
            stand_in_libc(bundle.rootfs / "lib" / "libc.so.6", [])
            expected = ("its C library (/lib/libc.so.6) is not glibc (it defines no GLIBC_ "
                        "version), and the shim needs glibc 2.17 or later")
    bundle.add_hook("createRuntime", hook_entry(tmp_path / "node"))
    try:
        result = bundle.run()
    finally:
        bundle.cleanup()
    runtime_refused(result, f"rootfs {bundle.rootfs}: {expected}")
    assert not (bundle.rootfs / ".vgpulimit").exists()
    assert not (bundle.rootfs / "etc" / "ld.so.preload").exists()

def test_a_read_only_rootfs_is_refused(tmp_path, bundles):
    bundle = bundles(["sh", "-c", "echo started"], {"VGPULIMIT_MEMORY": "1GiB"})
    bundle.settle()
    rootfs = str(bundle.rootfs)
    mount = subprocess.run(["mount", "--bind", "-o", "ro", rootfs, rootfs], capture_output=True,
                           text=True, check=False)
    if mount.returncode != 0:
        pytest.skip(f"cannot make a read-only bind mount here: {mount.stderr.strip()}")
    try:
        result = bundle.run()
    finally:
        subprocess.run(["umount", rootfs], check=True)
    runtime_refused(result, f"cannot install the shim into rootfs {rootfs}: Read-only file system")


def test_a_link_planted_while_the_container_ran_is_not_followed_at_poststop(tmp_path, bundles):
    # The container swaps its /etc for a link to a directory of the host's,
    # holding a preload file with our line: poststop must not rewrite it.  It
    # takes CAP_SYS_ADMIN to undo the hook's mount that pins /etc first.
    outside = tmp_path / "host-etc"
    outside.mkdir()
    (outside / "ld.so.preload").write_text(f"{SHIM_IN_CONTAINER}\n/keep/me.so\n")
    bundle = bundles(["sh", "-c", f"umount -l /etc && mv /etc /etc.moved && ln -s {outside} /etc"],
                     {"VGPULIMIT_MEMORY": "1GiB"})
    for kind in ("bounding", "effective", "permitted"):
        bundle.config["process"]["capabilities"][kind].append("CAP_SYS_ADMIN")
    result = bundle.run()
    assert (outside / "ld.so.preload").read_text() == f"{SHIM_IN_CONTAINER}\n/keep/me.so\n"
    assert f"{bundle.rootfs}/etc in the container's rootfs is a symbolic link" in result.stderr
    assert not (bundle.rootfs / ".vgpulimit").exists()
    assert os.listdir(tmp_path / "node") == []


def test_a_priority_annotation_gives_a_row_the_container_cannot_change(tmp_path, bundles):
    """vgpulimit.io/priority: the hook gives the container a row in the node's
    board and mounts the board read-only, the container's own beacon
    writable.  Root in the container cannot write the board, nor change its
    priority with `vgpulimit set`; its launches are written in its beacon;
    poststop frees the row."""
    from vgpulimit._core import ffi, lib

    script = ("(echo x >> /.vgpulimit/board/priority.board) 2>/dev/null && echo wrote-board || echo board-read-only; "
              "python -m vgpulimit set --priority low --region /.vgpulimit/region; echo set-exit $?; "
              "/tmp/launch_client kernel 100 0.3 > /dev/null && cat /.vgpulimit/board/beacon-* > /tmp/beacon")
    bundle = bundles(["sh", "-c", script])
    compile_c(bundle.rootfs / "tmp" / "launch_client", [TESTS / "c" / "launch_client.c"], "-ldl")
    bundle.config["annotations"] = {"vgpulimit.io/priority": "high"}
    result = bundle.run()
    assert result.returncode == 0, result.stderr
    assert "board-read-only" in result.stdout and "set-exit 0" not in result.stdout, result.stdout
    assert "not writable here" in result.stderr, result.stderr
    beacon = bytearray((bundle.rootfs / "tmp" / "beacon").read_bytes())
    assert lib.vgl_beacon_check(ffi.from_buffer(beacon), len(beacon)) == 0
    assert ffi.cast("struct vgl_beacon *", ffi.from_buffer(beacon)).device[0].launches > 0
    # Poststop freed its row, the last: the board went with it.
    assert os.listdir(tmp_path / "node" / ".priority") == []


def test_a_suspend_idle_annotation_is_written_in_the_containers_row(tmp_path, bundles):
    """vgpulimit.io/suspend-idle: the node agent's idle limit goes into the
    container's row of the node's board (docs/agent.md), which it cannot write."""
    from vgpulimit.agent.watch import read_board

    bundle = bundles(["sh", "-c", "cat /.vgpulimit/board/priority.board > /tmp/board"])
    bundle.config["annotations"] = {"vgpulimit.io/memory": "1GiB", "vgpulimit.io/suspend-idle": "10m"}
    result = bundle.run()
    assert result.returncode == 0, result.stderr
    [row] = read_board(str(bundle.rootfs / "tmp" / "board")).values()
    assert row.idle_limit_ms == 600_000


# Run inside a tenant: tries to write the node's board (every row: guarantees and
# priorities) and every beacon beside it; prints what each attempt met.
_ATTACK = """
import errno, glob, json, os
def attempt(path, at, length):
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as exc:
        return errno.errorcode[exc.errno]
    try:
        os.pwrite(fd, bytes(length), at)
        return "written"
    except OSError as exc:
        return errno.errorcode[exc.errno]
    finally:
        os.close(fd)
met = {"board": attempt("/.vgpulimit/board/priority.board", 24, 64 * 888)}
for beacon in glob.glob("/.vgpulimit/board/beacon-*"):
    met[os.path.basename(beacon)] = attempt(beacon, 16, 16 * 56)
print(json.dumps(met))
"""


def test_a_tenant_cannot_write_another_containers_guarantee_or_priority(tmp_path, bundles):
    """Issue 39: a container's memory guarantee lives on the node's board, as
    its priority does.  Beside a container of the hook guaranteed 4 GiB at
    priority high, root in another cannot write the board (any row's
    guarantee or priority) nor the other's beacon, nor raise its own request
    with `vgpulimit set`; the other's row is as its setter wrote it."""
    from vgpulimit._core import ffi, lib

    owner = bundles(["sh", "-c", "touch /tmp/started; while [ ! -e /tmp/release ]; do sleep 0.05; done"],
                    {"VGPULIMIT_MEMORY": "8GiB"}, name="owner")
    owner.config["annotations"] = {"vgpulimit.io/memory-request": "4GiB", "vgpulimit.io/priority": "high"}
    script = ("python /tmp/attack.py; python -m vgpulimit set --memory-request 8GiB --region /.vgpulimit/region; "
              "echo set-exit $?")
    tenant = bundles(["sh", "-c", script], {"VGPULIMIT_MEMORY": "8GiB"}, name="tenant")
    tenant.config["annotations"] = {"vgpulimit.io/memory-request": "1GiB"}
    (tenant.rootfs / "tmp" / "attack.py").write_text(_ATTACK)
    proc, _ = owner.start()
    try:
        deadline = time.monotonic() + 60
        while not (owner.rootfs / "tmp" / "started").exists():
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.05)
        result = tenant.run()
        assert result.returncode == 0, result.stderr
        met = json.loads(result.stdout.splitlines()[0])
        assert "set-exit 0" not in result.stdout, result.stdout
        assert result.stderr.splitlines()[-1] == (
            "vgpulimit: error: cannot write the memory guarantee in the priority board "
            "/.vgpulimit/board/priority.board: not writable here: priorities and memory guarantees are set by "
            "the node (vgpulimit run, the OCI hook), never from inside a container"), result.stderr
        board = bytearray((tmp_path / "node" / ".priority" / "priority.board").read_bytes())
        rows = [r for r in ffi.cast("struct vgl_board *", ffi.from_buffer(board)).row if r.key]
        [row] = rows   # the owner's; the tenant's went at its poststop
        name = ffi.new("char[]", lib.VGL_BEACON_NAME_LEN)
        lib.vgl_beacon_name(row.key, name)
        assert met["board"] in ("EROFS", "EACCES", "EPERM"), met
        assert met[ffi.string(name).decode()] in ("EROFS", "EACCES", "EPERM"), met
        assert (row.guarantee[0].bytes, row.priority) == (4 * GiB, lib.VGL_PRIORITY_HIGH)
    finally:
        (owner.rootfs / "tmp" / "release").touch()
        proc.wait(timeout=60)

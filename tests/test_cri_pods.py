"""Pod lifecycles through containerd's CRI, as kubelet drives them (tests/cri.py):
a container that dies holding memory and is restarted in its pod, a pod
deleted while a daemonised child of it holds memory, three containers of one
pod under three kinds of limit, and a bad variable failing the start.

The containers of each test share one simulated GPU (its state file on a host
directory mounted into each), as the containers of a node share its GPUs: what
a dead or killed process held is seen going back to the GPU, and a container
that is not capped is seen on it beside those that are.

The node is set up as deploy/vgpulimit.yaml's DaemonSet sets one up: its
init containers' commands, run against a private root (each volume's
hostPath under it), with a stand-in of the node image's /opt/vgpulimit/0.1.0;
containerd runs in a mount namespace where /opt/vgpulimit and
/run/vgpulimit/containers are that root's, and its "shim" device is the CDI
spec the DaemonSet wrote, unchanged."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import TESTS, GiB, MiB, base_env, vgpulimit_cmd
from cri import SUITES, Containerd, running, why_no_containerd

from vgpulimit import _paths
from vgpulimit.cdi import KIND

FILL = [sys.executable, str(TESTS / "clients" / "cuda_fill.py")]
EXITED = 2   # cri_api.v1.api_pb2.CONTAINER_EXITED
GPU_MEMORY = 16 * GiB
# The CDI devices of the module's containerd, as `vgpulimit cdi generate` makes them
# on the node; "shim" is the DaemonSet's own.
DEVICES = {"1gib": ["--memory", "1GiB"], "share": ["--memory", "25%", "--cores", "50"], "shim": None}
DAEMONSET = TESTS.parent / "deploy" / "vgpulimit.yaml"
IMAGE_PREFIX = "/opt/vgpulimit/0.1.0"   # vgpulimit in the node image, and on the node
NODE_DIR = "/run/vgpulimit/containers"


def in_namespace(binds: dict[str, Path], keep: Path, command: list[str]) -> list[str]:
    """``command`` in a mount namespace of its own where each path of
    ``binds`` (under /opt or /run/vgpulimit) is that directory; what else is
    in /opt stays there (``keep``: where its old tree is held meanwhile)."""
    lines = ["set -e", f"mount --bind /opt {keep}", "mount -t tmpfs -o mode=755 tmpfs /opt",
             (f'for e in {keep}/*; do [ -d "$e" ] || continue; n=/opt/${{e##*/}}; mkdir "$n"; '
              'mount --rbind "$e" "$n"; done'),
             "mount -t tmpfs -o mode=755 tmpfs /run/vgpulimit"]
    for path, source in binds.items():
        lines += [f"mkdir -p {path}", f"mount --bind {shlex.quote(str(source))} {path}"]
    keep.mkdir(exist_ok=True)
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(lines) + '\nexec "$@"',
            "sh", *command]


def node_image(at: Path) -> Path:
    """A stand-in for the node image's /opt/vgpulimit/0.1.0: a virtual
    environment with a copy of the installed vgpulimit in it, as
    deploy/Containerfile installs it there."""
    import vgpulimit

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(at)],
                   check=True, capture_output=True)
    [site] = (at / "lib").glob("python3*/site-packages")
    shutil.copytree(Path(vgpulimit.__file__).resolve().parent, site / "vgpulimit")
    return at


def install_node(base: Path) -> Path:
    """Runs the DaemonSet's init containers, in order, against the private
    root ``base/host``: each volume's mountPath (/host/…) stands for its
    hostPath under that root, and /opt/vgpulimit/0.1.0 is node_image's."""
    root = base / "host"
    manifest = next(m for m in yaml.safe_load_all(DAEMONSET.read_text()) if m and m["kind"] == "DaemonSet")
    spec = manifest["spec"]["template"]["spec"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    image = node_image(base / "image")
    for init in spec["initContainers"]:
        command = init["command"]
        for mount in init.get("volumeMounts", []):
            host = root / volumes[mount["name"]].lstrip("/")
            host.mkdir(parents=True, exist_ok=True)
            command = [part.replace(mount["mountPath"], str(host)) for part in command]
        ran = subprocess.run(in_namespace({IMAGE_PREFIX: image}, base / "keep", command),
                             capture_output=True, text=True, env=base_env(), timeout=120, check=False)
        assert ran.returncode == 0, f"init container {init['name']}: {ran.stderr}"
    return root


@pytest.fixture(scope="module", params=SUITES)
def containerd(request, tmp_path_factory):
    """One containerd of each Debian suite for the module, with vgpulimit's CDI
    devices: "1gib" (a cap), "share" (a quarter of the GPU's memory and half
    its time) and "shim" (limits left to the container)."""
    reason = why_no_containerd(request.param)
    if reason:
        pytest.skip(reason)
    pytest.importorskip("cuda.bindings")
    base = tmp_path_factory.mktemp(f"pods-{request.param}")
    engine = Containerd(base, request.param)
    try:
        engine.host = root = install_node(base)
        for name in ("node", "cdi"):
            (base / name).mkdir()
        engine.wrap = in_namespace({"/opt/vgpulimit": root / "opt" / "vgpulimit", NODE_DIR: base / "node"},
                                   base / "keep", [])
        shutil.copy(root / "etc" / "cdi" / "vgpulimit.json", base / "cdi")
        reason = engine.start()
        if reason:
            pytest.skip(reason)
        for name, limits in DEVICES.items():
            if limits is not None:
                subprocess.run(vgpulimit_cmd("cdi", "generate", "--name", name, *limits,
                                             "--output", str(base / "cdi" / f"vgpulimit-{name}.json")),
                               capture_output=True, text=True, env=base_env(), check=True)
        yield engine
    finally:
        engine.stop()


class Node:
    """The node of one test: the hook's node directory and one simulated GPU
    that every container of the test shares (mounted at /gpu)."""

    def __init__(self, containerd: Containerd, gpu) -> None:
        self.containerd = containerd
        self.dir = containerd.base / "node"
        self.gpu = gpu

    def env(self, at: str) -> dict[str, str]:
        return {"SIMGPU_STATE": f"{at}/simgpu.state", "SIMGPU_MEMORY": "16GiB", "SIMGPU_RESERVED": "0",
                "SIMGPU_CONTEXT_OVERHEAD": "0"}

    def create(self, pod, name: str, args: list[str], **create) -> str:
        return pod.create(name, args, env={**self.env("/gpu"), **create.pop("env", {})},
                          mounts=[("/gpu", str(self.gpu), False)], **create)

    def status(self) -> dict:
        """`vgpulimit status --all` on the node, which sees the GPU (NVML) too."""
        env = base_env(LD_LIBRARY_PATH=str(_paths.simgpu_dir()), **self.env(str(self.gpu)))
        result = subprocess.run(vgpulimit_cmd("status", "--all", str(self.dir), "--json", "--interval", "0"),
                                capture_output=True, text=True, env=env, check=False, timeout=60)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def gpu_used(self) -> int:
        [gpu] = self.status()["gpus"]
        return gpu["used_bytes"]


@pytest.fixture
def node(containerd, tmp_path):
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    node = Node(containerd, gpu)
    yield node
    for pod in list(containerd.pods):
        containerd.remove_pod(pod)
    for left in node.dir.iterdir() if node.dir.exists() else ():
        shutil.rmtree(left)


def device(name: str) -> str:
    assert name in DEVICES
    return f"{KIND}={name}"


def reports(pod, name: str, count: int, attempt: int = 0, timeout: float = 60) -> list[dict]:
    """The first ``count`` JSON lines the container wrote on stdout (its CRI log)."""
    log = pod.logs / name / f"{attempt}.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [entry.split(" ", 3)[3] for entry in (log.read_text().splitlines() if log.exists() else ())
                 if entry.split(" ", 3)[1:3] == ["stdout", "F"]]
        if len(lines) >= count:
            return [json.loads(line) for line in lines[:count]]
        time.sleep(0.05)
    raise AssertionError(f"container {name} wrote {count} lines in {timeout} s: {lines}")


def exited(containerd, container: str):
    for _ in range(600):
        status = containerd.status(container)
        if status.state == EXITED:
            return status
        time.sleep(0.05)
    raise AssertionError("the container did not exit")


def wait_for(predicate, what: str, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen in {timeout} s: {what}")
        time.sleep(0.1)


def test_the_daemonsets_set_up_is_what_the_pods_run_with(containerd, node):
    """What deploy/vgpulimit.yaml's init containers installed: the node
    image's vgpulimit at the same path on the node, the shim for device
    plugins, the hooks.d entry and the CDI spec, both running that vgpulimit
    with the node directory its metrics container reads.  A pod given the
    spec's device with a limit in its env is capped by it."""
    from vgpulimit._paths import libpath

    host = containerd.host
    python = f"{IMAGE_PREFIX}/bin/python"
    assert (host / IMAGE_PREFIX.lstrip("/") / "bin" / "python").exists()
    assert (host / "opt" / "vgpulimit" / "libvgpulimit.so").read_bytes() == libpath().read_bytes()
    hooks_d = json.loads((host / "usr/share/containers/oci/hooks.d/vgpulimit.json").read_text())
    assert hooks_d["hook"]["args"] == [python, "-m", "vgpulimit", "oci-hook"]
    spec = json.loads((host / "etc" / "cdi" / "vgpulimit.json").read_text())
    [shim] = spec["devices"]
    # The shim the device mounts is the image's, at the path it was copied to on the node.
    [mount] = shim["containerEdits"]["mounts"]
    assert mount["hostPath"].startswith(f"{IMAGE_PREFIX}/lib/python3")
    assert (host / mount["hostPath"].lstrip("/")).read_bytes() == libpath().read_bytes()
    assert f"{spec['kind']}={shim['name']}" == device("shim")
    assert [(h["hookName"], h["args"]) for h in shim["containerEdits"]["hooks"]] == \
        [(stage, [python, "-m", "vgpulimit", "oci-hook"]) for stage in ("createRuntime", "poststop")]
    manifest = next(m for m in yaml.safe_load_all(DAEMONSET.read_text()) if m and m["kind"] == "DaemonSet")
    containers = {c["name"]: c for c in manifest["spec"]["template"]["spec"]["containers"]}
    assert NODE_DIR in containers["metrics"]["command"]

    pod = containerd.run_pod("daemonset", namespace="team-d")
    container = node.create(pod, "main", [*FILL, str(256 * MiB), "3", "--hold", "/never"],
                            cdi_devices=[device("shim")], env={"VGPULIMIT_MEMORY": "512MiB"})
    pod.start(container)
    [report] = reports(pod, "main", 1)
    assert report["before"]["total"] == 512 * MiB
    assert report["allocs"] == ["CUDA_SUCCESS"] * 2 + ["CUDA_ERROR_OUT_OF_MEMORY"]
    [region] = node.status()["regions"]
    assert region["region"] == str(node.dir / container / "region")
    assert (region["identity"]["namespace"], region["identity"]["pod"]) == ("team-d", "daemonset")


def test_a_container_that_died_holding_memory_restarts_in_its_pod_with_a_clean_count(containerd, node):
    """kubelet's restart of a container that died (an OOM kill, a crash): its
    process killed while it held 1 GiB, then CreateContainer again with the
    next attempt in the same sandbox.  The dead one's memory goes back to the
    GPU and its region with it; the new one has the same cap, nothing charged."""
    pod = containerd.run_pod("trainer", namespace="team-a")
    # sh is the container's init, cuda_fill its child: killed, sh exits as a crash does.
    held = [*FILL, str(256 * MiB), "5", "--hold", "/never"]
    first = node.create(pod, "main", ["sh", "-c", " ".join(held) + "; exit $?"],
                        cdi_devices=[device("1gib")])
    pod.start(first)
    [report] = reports(pod, "main", 1)
    assert report["allocs"] == ["CUDA_SUCCESS"] * 4 + ["CUDA_ERROR_OUT_OF_MEMORY"]
    [region] = node.status()["regions"]
    assert region["identity"]["container_id"] == first
    assert region["devices"][0]["used_bytes"] == GiB
    assert node.gpu_used() == GiB
    killed = containerd.exec_sync(first, ["kill", "-KILL", str(report["pid"])])
    assert killed.exit_code == 0, killed.stderr
    status = exited(containerd, first)
    assert status.exit_code == 128 + 9
    wait_for(lambda: node.status()["regions"] == [], "the dead container's region taken back")
    assert node.gpu_used() == 0

    second = node.create(pod, "main", [*FILL, str(256 * MiB), "5", "--hold", "/never"],
                         cdi_devices=[device("1gib")], attempt=1)
    pod.start(second)
    [report] = reports(pod, "main", 1, attempt=1)
    assert report["before"] == {"free": GiB, "total": GiB}
    assert report["allocs"] == ["CUDA_SUCCESS"] * 4 + ["CUDA_ERROR_OUT_OF_MEMORY"]
    [region] = node.status()["regions"]
    assert region["identity"]["container_id"] == second
    assert (region["identity"]["pod"], region["identity"]["container"]) == ("trainer", "main")
    assert region["devices"][0]["used_bytes"] == GiB
    assert [p["used_bytes"] for p in region["processes"]] == [GiB]
    assert node.gpu_used() == GiB


# Where a container's processes live: its own pid namespace (kubelet's
# default), the pod's (shareProcessNamespace) or the node's (hostPID).
@pytest.mark.parametrize("pid", ["CONTAINER", "POD", "NODE"])
def test_a_daemonised_child_is_named_with_its_pod_and_dies_with_it(containerd, node, pid):
    """A process that escapes its parent (setsid and a double fork: its parent
    is init, not the container's command) still belongs to its container: the
    view counts it in the container's region under the pod's name, and when
    the pod is deleted it is killed with the rest -- by the kernel with the
    container's pid namespace, by containerd's shim (all of the container's
    cgroup) otherwise -- so its memory goes back to the GPU, and nothing of
    the pod is left on the node."""
    pod = containerd.run_pod(f"daemon-{pid.lower()}", namespace="team-b", pid=pid)
    hold = " ".join([*FILL, str(256 * MiB), "1", "--hold", "/never"])
    script = f"setsid sh -c '{hold} &' & exec {hold}"
    container = node.create(pod, "main", ["sh", "-c", script], cdi_devices=[device("1gib")])
    pod.start(container)
    both = reports(pod, "main", 2)
    assert all(r["allocs"] == ["CUDA_SUCCESS"] for r in both)
    [region] = node.status()["regions"]
    assert (region["identity"]["namespace"], region["identity"]["pod"]) == ("team-b", f"daemon-{pid.lower()}")
    processes = region["processes"]
    assert sorted(p["pid"] for p in processes) == sorted(r["pid"] for r in both)
    assert [p["used_bytes"] for p in processes] == [256 * MiB] * 2
    assert region["devices"][0]["used_bytes"] == 512 * MiB
    host_pids = [p["host_pid"] for p in processes]
    sessions = {os.getsid(p) for p in host_pids}
    assert len(sessions) == 2   # one of them did escape its session
    assert [p["host"]["container_id"] for p in processes] == [container] * 2   # not its cgroup

    containerd.remove_pod(pod.id)
    wait_for(lambda: not any(running(p) for p in host_pids), "the pod's processes killed", 10)
    assert node.status()["regions"] == []
    assert list(node.dir.iterdir()) == []
    assert node.gpu_used() == 0


def test_three_containers_of_one_pod_each_see_their_own_limit(containerd, node):
    """One pod: a container capped at 1 GiB, one given no device (uncapped), one
    given a share (a quarter of the GPU's memory, half its time), on one GPU.
    Each sees its own; the node's view tells them apart by name, and shows the
    uncapped one's memory on the GPU outside any region."""
    pod = containerd.run_pod("mixed", namespace="team-c")
    # The shared one's spec asks for no compute limit: the device's policy stands.
    asks = {"capped": (256 * MiB, [device("1gib")], {}), "uncapped": (GiB, [], {}),
            "shared": (GiB, [device("share")], {"VGPULIMIT_CORES_POLICY": "none"})}
    containers = {}
    for name, (block, devices, env) in asks.items():
        containers[name] = node.create(pod, name, [*FILL, str(block), "5", "--hold", "/never"],
                                       cdi_devices=devices, env=env)
        pod.start(containers[name])
    seen = {name: reports(pod, name, 1)[0] for name in asks}
    assert seen["capped"]["before"]["total"] == GiB
    assert seen["capped"]["allocs"] == ["CUDA_SUCCESS"] * 4 + ["CUDA_ERROR_OUT_OF_MEMORY"]
    assert seen["uncapped"]["before"]["total"] == GPU_MEMORY
    assert seen["uncapped"]["allocs"] == ["CUDA_SUCCESS"] * 5
    assert seen["shared"]["before"]["total"] == GPU_MEMORY // 4
    assert seen["shared"]["allocs"] == ["CUDA_SUCCESS"] * 4 + ["CUDA_ERROR_OUT_OF_MEMORY"]

    status = node.status()
    regions = {r["identity"]["container"]: r for r in status["regions"]}
    assert set(regions) == {"capped", "shared"}
    assert {r["identity"]["pod"] for r in regions.values()} == {"mixed"}
    assert regions["capped"]["devices"][0]["limit"]["text"] == "1 GiB"
    assert regions["capped"]["devices"][0]["cores_pct"] is None
    assert regions["shared"]["devices"][0]["cap_bytes"] == GPU_MEMORY // 4
    assert regions["shared"]["devices"][0]["cores_pct"] == 50
    assert regions["shared"]["devices"][0]["cores_policy"] == "hard"
    assert regions["shared"]["devices"][0]["used_bytes"] == 4 * GiB
    [gpu] = status["gpus"]
    assert gpu["used_bytes"] == GiB + 4 * GiB + 5 * GiB
    assert gpu["regions_used_bytes"] == GiB + 4 * GiB
    assert {c["identity"]["container"]: c["cap_bytes"] for c in gpu["containers"]} == \
        {"capped": GiB, "shared": GPU_MEMORY // 4}
    # The hook never ran for the uncapped one (no device asked for it): the
    # driver's process list alone shows it, with its container's id (its cgroup's).
    [outside] = gpu["outside_processes"]
    assert outside["used_bytes"] == gpu["outside_bytes"] == 5 * GiB
    assert outside["host"]["command"].endswith(f"cuda_fill.py {GiB} 5 --hold /never")
    assert outside["host"]["container_id"] == containers["uncapped"]


def test_a_bad_variable_fails_the_start_with_its_one_line(containerd, node):
    """The container's own variable (from its pod spec's env), not an
    annotation: the same fail-closed start, the one line in the container's
    status (what `kubectl describe pod` shows), nothing of it on the node."""
    import grpc

    pod = containerd.run_pod("bad-env")
    container = node.create(pod, "main", [*FILL, str(256 * MiB), "1"], cdi_devices=[device("shim")],
                            env={"VGPULIMIT_MEMORY": "lots"})
    with pytest.raises(grpc.RpcError):
        pod.start(container)
    status = containerd.status(container)
    assert status.state == EXITED and status.reason == "StartError"
    lines = [line for line in status.message.split("\n") if "vgpulimit: error:" in line]
    assert len(lines) == 1 and "VGPULIMIT_MEMORY" in lines[0] and "'lots'" in lines[0], status.message
    assert "Traceback" not in status.message
    assert list(node.dir.iterdir()) == []



# What a pod's author can add to the container's env beside a capped device
# (its VGPULIMIT_MEMORY=1GiB), and what the container gets for it.  Each of
# the refused ones ran with the whole GPU before the hook weighed variables
# against each other and refused a region named beside vgpulimit's own.
@pytest.mark.parametrize("env, expected", [
    ({"VGPULIMIT_MEMORY": "100GiB"}, GiB),          # the device's edit replaces the pod's
    ({"VGPULIMIT_MEMORY": "0"}, GiB),
    ({"CUDA_DEVICE_MEMORY_LIMIT_0": "100g"}, GiB),  # HAMi's: below ours
    ({"CUDA_DISABLE_CONTROL": "true"}, GiB),        # honoured in HAMi's forms only
    ({"VGPULIMIT_MEMORY_0": "512MiB"}, 512 * MiB),  # tighter: kept
    ({"VGPULIMIT_MEMORY_0": "100GiB"},
     "VGPULIMIT_MEMORY_0=100GiB would loosen VGPULIMIT_MEMORY=1GiB"),
    ({"VGPULIMIT_REGION": "/tmp/mine"},
     "VGPULIMIT_REGION names a region of another injector, while VGPULIMIT_MEMORY asks the hook for one"),
    ({"CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/mine.cache"},
     "CUDA_DEVICE_MEMORY_SHARED_CACHE names a region of another injector"),
])
def test_the_pods_own_variables_cannot_loosen_the_cap_of_its_device(containerd, node, env, expected):
    import grpc

    pod = containerd.run_pod("loosen-env")
    container = node.create(pod, "main", [*FILL, str(GiB), "2", "--hold", "/never"],
                            cdi_devices=[device("1gib")], env=env)
    if isinstance(expected, int):
        pod.start(container)
        [report] = reports(pod, "main", 1)
        assert report["before"]["total"] == expected
        assert report["allocs"][-1] == "CUDA_ERROR_OUT_OF_MEMORY"
        return
    with pytest.raises(grpc.RpcError):
        pod.start(container)
    status = containerd.status(container)
    assert status.state == EXITED and status.reason == "StartError"
    assert status.message.count(expected) == 1, status.message
    assert list(node.dir.iterdir()) == []

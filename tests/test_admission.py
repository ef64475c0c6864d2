"""`vgpulimit oci-hook --admit` (issue 13): on a node without a scheduler, the
hook refuses a container whose memory cap would over-commit its GPU, and one
that asks for a GPU with no cap; who a container is (its Kubernetes
annotations) labels it in every view.  Real containers: runc and podman, on a
node of two simulated GPUs of 16 GiB."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request

import pytest
from conftest import TESTS, GiB, MiB, base_env, vgpulimit_cmd
from podman import Podman, podman_unavailable
from prometheus_client.parser import text_string_to_metric_families
from runc_bundle import hook_entry, make_bundle

from vgpulimit import _paths

HOLD = [sys.executable, str(TESTS / "clients" / "cuda_fill.py"), str(256 * MiB), "1", "--hold",
        "/tmp/release"]
# A container that uses no GPU itself: its devices stay as the hook placed them.
# (Each container has a simulated GPU of its own, on which its device 0 is
# always the node's GPU 0; what the toolkit would mount, simgpu cannot.)
WAIT = [sys.executable, "-c", ("import os, time; print('{\"waiting\": true}', flush=True)\n"
                               "while not os.path.exists('/tmp/release'): time.sleep(0.05)")]
POD = {"io.kubernetes.pod.name": "trainer-0", "io.kubernetes.pod.namespace": "team-a",
       "io.kubernetes.container.name": "main", "io.kubernetes.pod.uid": "4f1c-77"}


def node_env(tmp_path) -> dict[str, str]:
    """What the hook and the views on the host see: the node's two GPUs of
    16 GiB, all of it theirs to give (no driver's reserve)."""
    (tmp_path / "gpus").mkdir(exist_ok=True)
    return base_env(LD_LIBRARY_PATH=str(_paths.simgpu_dir()), SIMGPU_DEVICES="2",
                    SIMGPU_STATE=str(tmp_path / "gpus" / "node.simgpu"), SIMGPU_MEMORY="16GiB",
                    SIMGPU_CONTEXT_OVERHEAD="0", SIMGPU_RESERVED="0")


def admitting_hook(tmp_path, *flags: str) -> dict:
    entry = hook_entry(tmp_path / "node", "--admit", *flags)
    entry["env"] = [f"{k}={v}" for k, v in node_env(tmp_path).items()]
    return entry


@pytest.fixture
def runc_node(tmp_path, runc):
    """Starts runc containers with the admitting hook; stops them afterwards."""
    pytest.importorskip("cuda.bindings")
    bundles, running = [], []

    def start(name, args, env, annotations=None, flags=(), wait=True, devices=(), shared=False):
        """``shared``: the container's processes use the node's simulated GPUs
        (its state file, mounted), not a GPU of their own."""
        if shared:
            env = {**env, **{k: v for k, v in node_env(tmp_path).items() if k.startswith("SIMGPU_")}}
        bundle = make_bundle(tmp_path / name, list(map(str, args)), env)
        if shared:
            gpus = str(tmp_path / "gpus")
            bundle.config["mounts"].append({"destination": gpus, "type": "bind", "source": gpus,
                                            "options": ["rbind", "rw"]})
        bundle.config["annotations"] = dict(annotations or {})
        for path in devices:   # a GPU's device file (NVIDIA's major number, 195)
            minor = int(path.removeprefix("/dev/nvidia"))
            bundle.config["linux"].setdefault("devices", []).append(
                {"path": path, "type": "c", "major": 195, "minor": minor, "fileMode": 0o666})
        for stage in ("createRuntime", "poststop"):
            bundle.add_hook(stage, admitting_hook(tmp_path, *flags))
        bundles.append(bundle)
        proc, _ = bundle.start()
        running.append((proc, bundle))
        if not wait:
            return proc, bundle
        line = proc.stdout.readline()
        if not line:
            _, err = proc.communicate(timeout=60)
            return proc.returncode, err
        return json.loads(line), ""

    yield start
    for proc, bundle in running:
        (bundle.rootfs / "tmp" / "release").touch()
        try:
            proc.communicate(timeout=60)
        finally:
            bundle.cleanup()


def refused(err: str) -> str:
    [line] = [line for line in err.replace('\\"', '"').splitlines() if "vgpulimit: error:" in line]
    return line[line.index("vgpulimit: error:"):]


def test_runc_a_cap_that_would_over_commit_the_gpu_is_refused(tmp_path, runc_node):
    first, _ = runc_node("a", HOLD, {"VGPULIMIT_MEMORY": "10GiB", "NVIDIA_VISIBLE_DEVICES": "0"},
                         POD)
    assert first["allocs"] == ["CUDA_SUCCESS"]
    code, err = runc_node("b", HOLD, {"VGPULIMIT_MEMORY": "8GiB", "NVIDIA_VISIBLE_DEVICES": "0"})
    assert code != 0
    line = refused(err)
    assert "its memory cap 8 GiB would over-commit GPU 0 (GPU-" in line
    assert "guarantees (requests, else caps) there already 10 GiB (team-a/trainer-0/main 10 GiB); 6 GiB left" in line
    # The same cap fits on the other GPU, named by its UUID as the toolkit takes it.
    gpus = json.loads(subprocess.run(
        vgpulimit_cmd("status", "--all", str(tmp_path / "node"), "--json", "--interval", "0"),
        capture_output=True, text=True, env=node_env(tmp_path), check=True).stdout)["gpus"]
    third, _ = runc_node("c", WAIT, {"VGPULIMIT_MEMORY": "8GiB",
                                     "NVIDIA_VISIBLE_DEVICES": gpus[1]["uuid"]})
    assert third == {"waiting": True}
    # No cap on a GPU: refused, unless the hook admits such containers.
    code, err = runc_node("d", HOLD, {"NVIDIA_VISIBLE_DEVICES": "1"})
    assert code != 0 and "asks for GPU 1 (GPU-" in refused(err)
    assert "with no memory cap" in refused(err)
    fourth, _ = runc_node("e", WAIT, {"NVIDIA_VISIBLE_DEVICES": "1"}, flags=["--admit-uncapped"])
    assert fourth == {"waiting": True}
    # What the node shows: 10 GiB committed on GPU 0, 8 GiB on GPU 1 (whose
    # uncapped container has no region: it commits nothing).
    view = json.loads(subprocess.run(
        vgpulimit_cmd("status", "--all", str(tmp_path / "node"), "--json", "--interval", "0"),
        capture_output=True, text=True, env=node_env(tmp_path), check=True).stdout)
    assert [g["committed_bytes"] for g in view["gpus"]] == [10 * GiB, 8 * GiB]
    [pod] = [r for r in view["regions"] if r["identity"]["pod"]]
    assert pod["identity"]["namespace"] == "team-a" and pod["identity"]["container"] == "main"
    assert pod["identity"]["gpus"] == [gpus[0]["uuid"]]


def test_runc_containers_starting_at_once_cannot_all_take_the_gpu(tmp_path, runc_node):
    """Five containers of 10 GiB each start at once on a GPU of 16 GiB: one starts."""
    env = {"VGPULIMIT_MEMORY": "10GiB", "NVIDIA_VISIBLE_DEVICES": "0"}
    started = [runc_node(name, WAIT, env, wait=False) for name in "abcde"]
    lines, errors = [], []

    def watch(proc):
        line = proc.stdout.readline()
        if line:
            lines.append(line)
        else:
            errors.append(proc.communicate(timeout=60)[1])

    threads = [threading.Thread(target=watch, args=(proc,)) for proc, _ in started]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(lines) == 1 and len(errors) == 4, (lines, errors)
    for err in errors:
        assert "guarantees (requests, else caps) there already 10 GiB" in refused(err)


# containerd's CRI plugin names the same things otherwise.
CONTAINERD_POD = {"io.kubernetes.cri.sandbox-name": "trainer-0",
                  "io.kubernetes.cri.sandbox-namespace": "team-a",
                  "io.kubernetes.cri.container-name": "main",
                  "io.kubernetes.cri.sandbox-uid": "4f1c-77"}


@pytest.mark.parametrize("annotations", [POD, CONTAINERD_POD], ids=["cri-o", "containerd"])
def test_runc_pod_labels_in_metrics(tmp_path, runc_node, annotations):
    report, _ = runc_node("a", HOLD, {"VGPULIMIT_MEMORY": "4GiB", "NVIDIA_VISIBLE_DEVICES": "0"},
                          annotations)
    server = subprocess.Popen(
        vgpulimit_cmd("metrics", "--listen", "127.0.0.1:0", "--all", str(tmp_path / "node")),
        env=node_env(tmp_path), stderr=subprocess.PIPE, text=True)
    try:
        url = server.stderr.readline().split()[-1]
        with urllib.request.urlopen(url, timeout=30) as response:
            families = list(text_string_to_metric_families(response.read().decode()))
    finally:
        server.terminate()
        server.wait(timeout=30)
    samples = {f.name: f.samples for f in families}
    [used] = samples["vgpulimit_memory_used_bytes"]
    assert used.value == 256 * MiB
    assert {k: used.labels[k] for k in ("pod", "namespace", "container", "pod_uid")} == \
           {"pod": "trainer-0", "namespace": "team-a", "container": "main", "pod_uid": "4f1c-77"}
    [limit] = samples["vgpulimit_memory_limit_bytes"]
    assert (limit.labels["pod"], limit.value) == ("trainer-0", 4 * GiB)
    committed = {s.labels["gpu"]: s.value for s in samples["vgpulimit_gpu_memory_committed_bytes"]}
    assert committed == {"0": 4 * GiB, "1": 0}
    assert report["before"]["total"] == 4 * GiB


def test_runc_a_containers_process_is_found_on_the_driver_by_its_host_pid(tmp_path, runc_node):
    """The container has a /proc of its own: its processes know only their pid
    in it.  The node view finds them on the host (their pid there and their
    start time), so the driver's figures join the region's: nothing of theirs
    is outside any cap."""
    report, _ = runc_node("a", HOLD, {"VGPULIMIT_MEMORY": "4GiB", "NVIDIA_VISIBLE_DEVICES": "0"},
                          POD, shared=True)
    assert report["allocs"] == ["CUDA_SUCCESS"]
    view = json.loads(subprocess.run(
        vgpulimit_cmd("status", "--all", str(tmp_path / "node"), "--json", "--interval", "0"),
        capture_output=True, text=True, env=node_env(tmp_path), check=True).stdout)
    gpu = view["gpus"][0]
    assert (gpu["used_bytes"], gpu["regions_used_bytes"]) == (256 * MiB, 256 * MiB)
    assert (gpu["outside_bytes"], gpu["outside_processes"]) == (0, [])
    [container] = gpu["containers"]
    assert container["identity"]["pod"] == "trainer-0" and container["cap_bytes"] == 4 * GiB
    [proc] = view["regions"][0]["processes"]
    assert proc["pid"] == report["pid"] and proc["host_pid"] not in (None, report["pid"])
    assert "cuda_fill.py" in proc["host"]["command"] and not proc["gone"]


@pytest.fixture
def podman_node(tmp_path):
    reason = podman_unavailable()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("cuda.bindings")
    engine = Podman(tmp_path / "podman")
    result = subprocess.run(vgpulimit_cmd("install-hook", "--dir", str(engine.hooks_dir),
                                          "--node-dir", str(tmp_path / "node"), "--admit"),
                            capture_output=True, text=True, env=base_env(), check=False)
    assert result.returncode == 0, result.stderr
    # The node's GPUs are simulated: the hook reads them through simgpu's NVML.
    path = engine.hooks_dir / "vgpulimit.json"
    config = json.loads(path.read_text())
    assert "--admit" in config["hook"]["args"]
    config["hook"]["env"] = [f"{k}={v}" for k, v in node_env(tmp_path).items()]
    path.write_text(json.dumps(config))
    yield engine
    engine.cleanup()


def test_podman_a_cap_that_would_over_commit_the_gpu_is_refused(tmp_path, podman_node):
    proc, _, rootfs = podman_node.start(HOLD, *(a for k, v in POD.items()
                                                for a in ("--annotation", f"{k}={v}")),
                                        env={"VGPULIMIT_MEMORY": "12GiB",
                                             "NVIDIA_VISIBLE_DEVICES": "0"})
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        assert json.loads(line)["allocs"] == ["CUDA_SUCCESS"]
        result = podman_node.run(["true"], env={"VGPULIMIT_MEMORY": "50%",
                                                "NVIDIA_VISIBLE_DEVICES": "0"})
        assert result.returncode != 0
        line = refused(result.stderr)
        assert "its memory cap 8 GiB would over-commit GPU 0" in line
        assert "guarantees (requests, else caps) there already 12 GiB (team-a/trainer-0/main 12 GiB); 4 GiB left" in line
        fits = podman_node.run(["true"], env={"VGPULIMIT_MEMORY": "4GiB",
                                              "NVIDIA_VISIBLE_DEVICES": "0"})
        assert fits.returncode == 0, fits.stderr
    finally:
        (rootfs / "tmp" / "release").touch()
        proc.communicate(timeout=60)


def test_runc_the_hook_waits_for_the_lock_on_the_node_directory(tmp_path, runc_node):
    """What makes simultaneous starts safe: the check and the new region are
    made under the node directory's lock, which another admission holds."""
    import fcntl
    import os
    import select

    node = tmp_path / "node"
    node.mkdir()
    fd = os.open(node, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        proc, _ = runc_node("a", WAIT, {"VGPULIMIT_MEMORY": "4GiB",
                                        "NVIDIA_VISIBLE_DEVICES": "0"}, wait=False)
        ready, _, _ = select.select([proc.stdout], [], [], 3)
        assert not ready, "the container started while the node directory was locked"
    finally:
        os.close(fd)
    assert json.loads(proc.stdout.readline()) == {"waiting": True}


@pytest.mark.parametrize("named", ["index", "uuid", "cdi annotation", "device node"])
def test_runc_each_way_of_naming_the_gpu_is_counted(tmp_path, runc_node, named):
    first, _ = runc_node("a", WAIT, {"VGPULIMIT_MEMORY": "10GiB", "NVIDIA_VISIBLE_DEVICES": "1"})
    assert first == {"waiting": True}
    uuid = json.loads(subprocess.run(
        vgpulimit_cmd("status", "--all", str(tmp_path / "node"), "--json", "--interval", "0"),
        capture_output=True, text=True, env=node_env(tmp_path), check=True).stdout)["gpus"][1]["uuid"]
    env, annotations = {"VGPULIMIT_MEMORY": "8GiB"}, {}
    if named == "index":
        env["NVIDIA_VISIBLE_DEVICES"] = "1"
    elif named == "uuid":
        env["NVIDIA_VISIBLE_DEVICES"] = uuid
    elif named == "cdi annotation":
        annotations["cdi.k8s.io/vgpulimit-test"] = "nvidia.com/gpu=1"
        env["NVIDIA_VISIBLE_DEVICES"] = "void"   # as CDI-mode images set it
    code, err = runc_node("b", WAIT, env, annotations,
                          devices=["/dev/nvidia1"] if named == "device node" else ())
    assert code != 0
    assert f"would over-commit GPU 1 ({uuid}" in refused(err)


def test_runc_admission_counts_requests_so_caps_above_them_may_over_commit(runc_node):
    """Two containers of cap 12 GiB and request 4 GiB on a GPU of 16 GiB: their
    caps over-commit it, their requests do not, and both start; a third that
    asks for 10 GiB guaranteed is refused, naming the requests there."""
    for name in ("a", "b"):
        started, _ = runc_node(name, HOLD, {"VGPULIMIT_MEMORY": "12GiB", "VGPULIMIT_MEMORY_REQUEST": "4GiB",
                                            "NVIDIA_VISIBLE_DEVICES": "0"})
        assert started["allocs"] == ["CUDA_SUCCESS"]
    code, err = runc_node("c", HOLD, {"VGPULIMIT_MEMORY": "12GiB", "NVIDIA_VISIBLE_DEVICES": "0"},
                          {"vgpulimit.io/memory-request": "10GiB"})
    assert code != 0
    line = refused(err)
    assert "its memory request 10 GiB would over-commit GPU 0 (GPU-" in line
    assert "guarantees (requests, else caps) there already 8 GiB" in line and "; 8 GiB left" in line

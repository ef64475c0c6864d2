"""Pods and containers started through containerd's CRI, as kubelet starts them
(tests/cri.py), with vgpulimit's CDI device and annotations: the simulated GPU
runs inside each container, and what is checked is what a user of the pod
sees (the cap, an honest OOM at it, `vgpulimit status --all` naming the pod)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from conftest import TESTS, GiB, MiB, base_env, vgpulimit_cmd
from cri import ALLOWLIST, PLAIN, SUITES, Containerd, _config, running, why_no_containerd
from test_producers import node_metrics, series_of

from vgpulimit.cdi import KIND

FILL = [sys.executable, str(TESTS / "clients" / "cuda_fill.py")]
HOLD = [*FILL, str(256 * MiB), "5", "--hold", "/tmp/release"]
EXITED = 2   # cri_api.v1.api_pb2.CONTAINER_EXITED
# The CDI devices of the session's containerd, as `vgpulimit cdi generate` makes them.
DEVICES = {"1gib": ["--memory", "1GiB"], "shim": ["--memory", "none", "--cores", "none"]}


@pytest.fixture(scope="session", params=SUITES)
def containerd(request, tmp_path_factory):
    """One containerd of each Debian suite (trixie's 1.7, sid's 2.x) for the
    session, with vgpulimit's CDI devices in its spec directory: "1gib" (a cap)
    and "shim" (the shim and the hook, limits left to the container, e.g. to
    its pod's annotations)."""
    reason = why_no_containerd(request.param)
    if reason:
        pytest.skip(reason)
    pytest.importorskip("cuda.bindings")
    base = tmp_path_factory.mktemp(f"cri-{request.param}")
    engine = Containerd(base, request.param)
    try:
        reason = engine.start()
        if reason:
            pytest.skip(reason)
        node = base / "node"
        for name, limits in DEVICES.items():
            subprocess.run(vgpulimit_cmd("cdi", "generate", "--name", name, *limits, "--node-dir",
                                         str(node), "--output", str(base / "cdi" / f"vgpulimit-{name}.json")),
                           capture_output=True, text=True, env=base_env(), check=True)
        yield engine
    finally:
        engine.stop()


@pytest.fixture
def node(containerd):
    """The node directory of the hook the CDI devices run, emptied after each
    test (a region one left behind failed that test, not the next)."""
    node = containerd.base / "node"
    yield node
    for pod in list(containerd.pods):
        containerd.remove_pod(pod)
    for left in node.iterdir():
        shutil.rmtree(left)


def device(name: str) -> str:
    """The fully qualified name of one of the fixture's CDI devices."""
    assert name in DEVICES
    return f"{KIND}={name}"


def node_status(node) -> dict:
    result = subprocess.run(vgpulimit_cmd("status", "--all", str(node), "--json", "--interval", "0"),
                            capture_output=True, text=True, env=base_env(), check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def run_held(containerd, pod, name: str, **create) -> tuple[str, dict]:
    """Creates and starts a container holding what cuda_fill could allocate;
    returns its id and cuda_fill's report (from the container's log)."""
    container = pod.create(name, HOLD, **create)
    pod.start(container)
    return container, json.loads(pod.output_line(name))


def release(containerd, container: str) -> None:
    containerd.release("/tmp/release", container)


@pytest.mark.parametrize("major, cri", [
    (1, ("plugins", "io.containerd.grpc.v1.cri")),
    (2, ("plugins", "io.containerd.cri.v1.runtime")),
])
def test_the_configuration_of_each_version_says_cdi_and_the_allow_list(tmp_path, major, cri):
    """Checked where no containerd runs too: a configuration containerd cannot
    read would only skip the tests below ("containerd did not start")."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's TOML reader")
    config = tomllib.loads(_config(tmp_path, major))
    section = config
    for key in cri:
        section = section[key]
    assert section["enable_cdi"] is True
    assert section["cdi_spec_dirs"] == [str(tmp_path / "cdi")]
    runtimes = section["containerd"]["runtimes"]
    assert runtimes[ALLOWLIST]["pod_annotations"] == ["vgpulimit.io/*", "cdi.k8s.io/*"]
    assert runtimes[PLAIN]["pod_annotations"] == []
    assert config["plugins"]["io.containerd.nri.v1.nri"]["disable"] is False


def test_the_runtime_is_containerd_1_7_or_later_with_nri_on(containerd):
    """What the rest holds for: containerd >= 1.7 (1.6 has no CDI), its CRI
    answering, and NRI on (its socket served), as on current nodes."""
    import stat

    version = containerd.version
    assert version.runtime_name == "containerd"
    major, minor = (int(p) for p in version.runtime_version.split(".")[:2])
    assert (major, minor) >= (1, 7), version.runtime_version
    assert stat.S_ISSOCK(os.stat(containerd.base / "nri.sock").st_mode)


# How kubelet hands a container a CDI device: a device plugin's CDI annotation
# lands in the container's CRI config (older kubelets), its CDI device names
# in the CDI_devices field (DevicePluginCDIDevices, Kubernetes >= 1.28).
@pytest.mark.parametrize("how", ["annotation", "CDI_devices"])
def test_the_cdi_device_caps_the_container_and_the_node_names_the_pod(containerd, node, how):
    name = device("1gib")
    pod = containerd.run_pod(f"train-{how.lower()}", namespace="team-a")
    create = ({"annotations": {"cdi.k8s.io/vgpulimit": name}} if how == "annotation"
              else {"cdi_devices": [name]})
    container, report = run_held(containerd, pod, "main", **create)
    assert report["before"] == {"free": GiB, "total": GiB}
    assert report["allocs"] == ["CUDA_SUCCESS"] * 4 + ["CUDA_ERROR_OUT_OF_MEMORY"]
    [region] = node_status(node)["regions"]
    assert region["identity"]["pod"] == pod.config.metadata.name
    assert region["identity"]["namespace"] == "team-a"
    assert region["identity"]["container"] == "main"
    assert region["devices"][0]["used_bytes"] == GiB
    uid = pod.config.metadata.uid
    [(key, used)] = series_of(node_metrics(node), "vgpulimit_memory_used_bytes", pod_uid=uid).items()
    assert used == GiB
    assert {("pod", pod.config.metadata.name), ("namespace", "team-a"), ("container", "main")} <= set(key[1])
    release(containerd, container)
    containerd.remove_pod(pod.id)
    assert os.listdir(node) == []


@pytest.mark.parametrize("handler", [ALLOWLIST, PLAIN])
def test_a_cdi_annotation_on_the_pod_gives_no_device(containerd, node, handler):
    """containerd (1.7 and 2.1) reads CDI annotations from the container's CRI
    config only: the same annotation on the pod (all a pod's author can write) gives
    the container nothing, allow-listed or not, and it runs uncapped.  So
    docs/kubernetes.md and deploy/ do not offer it as a way to ask."""
    pod = containerd.run_pod(f"pod-cdi-{handler}", handler=handler,
                             annotations={"cdi.k8s.io/vgpulimit": device("1gib")})
    container, report = run_held(containerd, pod, "main")
    assert report["before"]["total"] == report["total_mem"] > GiB
    assert report["allocs"] == ["CUDA_SUCCESS"] * 5
    assert node_status(node)["regions"] == []
    release(containerd, container)


@pytest.mark.parametrize("handler", [ALLOWLIST, PLAIN])
def test_pod_annotations_reach_the_hook_only_through_the_allow_list(containerd, node, handler):
    """The "shim" device leaves the limits to the container: here to its pod's
    vgpulimit.io/memory annotation.  containerd passes a pod's annotations to
    the OCI config (where the hook reads them) only if the runtime handler's
    pod_annotations allow-list names them; without it the hook sees no limit
    and sets nothing up, and the container has the whole GPU."""
    pod = containerd.run_pod(f"ann-{handler}", handler=handler,
                             annotations={"vgpulimit.io/memory": "512MiB"})
    container, report = run_held(containerd, pod, "main", cdi_devices=[device("shim")])
    regions = node_status(node)["regions"]
    if handler == ALLOWLIST:
        assert report["before"] == {"free": 512 * MiB, "total": 512 * MiB}
        assert report["allocs"] == ["CUDA_SUCCESS"] * 2 + ["CUDA_ERROR_OUT_OF_MEMORY"] * 3
        [region] = regions
        assert region["devices"][0]["limit"]["text"] == "512 MiB"
        assert region["identity"]["pod"] == f"ann-{handler}"
    else:
        assert report["before"]["total"] == report["total_mem"] > 512 * MiB
        assert report["allocs"] == ["CUDA_SUCCESS"] * 5
        assert regions == []
    release(containerd, container)


def test_a_pod_annotation_cannot_loosen_the_cap_of_its_device(containerd, node):
    """Through the allow-list the pod's author writes its annotations; the
    device's cap is the setter's.  An annotation asking for more fails the
    start with one line, and nothing runs uncapped."""
    import grpc

    pod = containerd.run_pod("loosen", handler=ALLOWLIST, annotations={"vgpulimit.io/memory": "100GiB"})
    container = pod.create("main", HOLD, cdi_devices=[device("1gib")])
    with pytest.raises(grpc.RpcError):
        pod.start(container)
    status = containerd.status(container)
    assert status.state == EXITED and status.reason == "StartError"
    assert status.message.count("annotation vgpulimit.io/memory 100GiB would loosen VGPULIMIT_MEMORY=1GiB") == 1
    assert os.listdir(node) == []


def test_a_pod_annotation_may_tighten_the_cap_of_its_device(containerd, node):
    pod = containerd.run_pod("tighten", handler=ALLOWLIST, annotations={"vgpulimit.io/memory": "512MiB"})
    container, report = run_held(containerd, pod, "main", cdi_devices=[device("1gib")])
    release(containerd, container)
    assert report["before"]["total"] == 512 * MiB


def test_a_bad_annotation_fails_the_start_with_its_one_line(containerd, node):
    """What `kubectl describe pod` shows: the container's status says why it
    did not start, in the hook's one line; nothing of it ran."""
    import grpc

    pod = containerd.run_pod("bad", handler=ALLOWLIST, annotations={"vgpulimit.io/memory": "lots"})
    container = pod.create("main", HOLD, cdi_devices=[device("shim")])
    with pytest.raises(grpc.RpcError):
        pod.start(container)
    status = containerd.status(container)
    assert status.state == EXITED and status.reason == "StartError"
    line = ("vgpulimit: error: annotation vgpulimit.io/memory: 'lots' is not a valid value; "
            "accepted forms: 4GiB")
    assert status.message.count(line) == 1
    assert "Traceback" not in status.message
    assert not (pod.logs / "main" / "0.log").exists() or (pod.logs / "main" / "0.log").read_text() == ""
    assert os.listdir(node) == []


def test_a_device_no_spec_defines_fails_the_create_naming_it(containerd, node):
    import grpc

    pod = containerd.run_pod("unknown")
    with pytest.raises(grpc.RpcError) as failed:
        pod.create("main", HOLD, cdi_devices=[f"{KIND}=2gib"])
    assert f"{KIND}=2gib" in failed.value.details()
    assert os.listdir(node) == []


def test_a_pod_removed_while_it_holds_memory_leaves_no_region(containerd, node):
    """kubelet deleting a pod: StopPodSandbox kills its containers, and their
    removal runs the hook's poststop, which takes the region back."""
    pod = containerd.run_pod("held", namespace="team-b")
    _, report = run_held(containerd, pod, "main", cdi_devices=[device("1gib")])
    assert report["allocs"] == ["CUDA_SUCCESS"] * 4 + ["CUDA_ERROR_OUT_OF_MEMORY"]
    [region] = node_status(node)["regions"]
    [process] = region["processes"]
    assert region["identity"]["namespace"] == "team-b"
    containerd.remove_pod(pod.id)
    assert os.listdir(node) == []
    for _ in range(200):
        if not running(process["host_pid"]):
            break
        time.sleep(0.05)
    assert not running(process["host_pid"])

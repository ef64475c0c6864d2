"""Every scheduler's producer, end to end through containerd's CRI (issue 41):
each pod and container is started as kubelet starts it (tests/cri.py), given
exactly what that producer hands a container, as its source writes it, with
vgpulimit's shim where the producer puts HAMi-core's libvgpu.so.  What is
checked is what the pod's user sees inside (the cap as cuMemGetInfo's and
NVML's total, an honest CUDA_ERROR_OUT_OF_MEMORY at it) and what the node's
views say (`vgpulimit metrics --all` naming pod, namespace and container).

The producers, and where what they hand the container is written (the
repositories as fetched for this test, each file at its newest commit then):

- HAMi's DRA driver, Project-HAMi/k8s-dra-driver
  cmd/hami-kubelet-plugin/hami_core.go `GetCDIContainerEdits` (ebeaad9): a
  claim's CDI device `k8s.hami-core-gpu.project-hami.io/claim=<claim UID>-
  hami-gpu-<minor>` (cdi.go `GetClaimDeviceName`, main.go `DriverName`)
  whose edits set CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/claims/
  <claim UID>/<uuid>.cache, per device CUDA_DEVICE_SM_LIMIT_<i> (the claim's
  consumed "cores", else 60) and CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m (the
  consumed "memory", else the whole device), and mount the claim's directory
  (rw, same path on both sides), libvgpu.so and ld.so.preload (ro) and
  /tmp/vgpulock (rw).
- HAMi's device plugin, Project-HAMi/HAMi pkg/device-plugin/nvidiadevice/
  nvinternal/plugin/server.go `Allocate` (4707fb0): env
  CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m, CUDA_DEVICE_SM_LIMIT (no index),
  CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/<uuid>.cache; mounts
  libvgpu.so (ro), /usr/local/vgpu <- <hook>/vgpu/containers/<pod UID>_
  <container> (rw), /tmp/vgpulock (rw), /etc/ld.so.preload (ro) unless the
  container sets CUDA_DISABLE_CONTROL true.
- Volcano's vGPU device plugin, Project-HAMi/volcano-vgpu-device-plugin
  pkg/plugin/server.go `Allocate` (4fb76ba): the same variables, but the
  cache at /tmp/vgpu/<uuid>.cache, /tmp/vgpu <- $HOOK_PATH/vgpu/containers/
  <pod UID>_<container> with HOOK_PATH=/usr/local/vgpu (its DaemonSet), and
  ld.so.preload mounted unless CUDA_DISABLE_CONTROL is set at all.
- KAI, kai-scheduler/KAI-Scheduler (d5bc503): NVIDIA_VISIBLE_DEVICES,
  GPU_PORTION and RUNAI_NUM_OF_GPUS from the pod's GPU-sharing ConfigMap
  (pkg/binder/common/gpu_access.go), CUDA_DEVICE_MEMORY_LIMIT (no index,
  <portion x the node's nvidia.com/gpu.memory label>m) from the same
  ConfigMap, optional, and left out where the node has no such label
  (pkg/binder/plugins/hamicore/hami_core.go, as on GB10: KAI-Scheduler#1967);
  the resource isolator's webhook (docs/gpu-sharing/hami/README.md) mounts
  the node's /usr/local/vgpu and ld.so.preload and sets POD_UID,
  CONTAINER_NAME, CONTAINER_VGPU_MOUNT.
- NVIDIA's DRA driver, NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/
  sharing.go `MpsControlDaemon.GetCDIContainerEdits` (2240711): an MPS claim's
  container gets CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps and mounts of the
  claim's MPS pipe and shm directories; the limits (active thread
  percentage, pinned memory) are set in the claim's control daemon
  (templates/mps-control-daemon.tmpl.yaml), nothing of them in the container.

The simulated GPU has no device nodes: the producers' device edits
(/dev/nvidia*, NVIDIA's CDI devices) are left out, everything else is as
written.  Host paths are the test node's own directory, not /usr/local; the
paths inside the container are the producers'."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import TESTS, GiB, MiB, base_env, vgpulimit_cmd
from cri import HOOKED, PLAIN, SUITES, Containerd, bindir, why_no_containerd
from test_producers import node_metrics, opened_usr, series_of

from vgpulimit._paths import libpath

FILL = [sys.executable, str(TESTS / "clients" / "cuda_fill.py")]
NVML = [sys.executable, str(TESTS / "clients" / "nvml_memory.py")]
HOOK = "/usr/local/vgpu"          # where every producer puts libvgpu.so in the container
EXITED = 2                        # cri_api.v1.api_pb2.CONTAINER_EXITED
SIMULATED = {"SIMGPU_MEMORY": "16GiB"}  # the hardware, not the producer
HAMI_DRA_KIND = "k8s.hami-core-gpu.project-hami.io/claim"
GPU_UUID = "GPU-4fa8a4d4-1c1e-4b8e-9c59-0d2b5e0e6f11"


def hooked_base_spec(base: Path, suite: str) -> Path:
    """containerd's default OCI spec (`ctr oci spec`) with vgpulimit's hook at
    createRuntime and poststop, for the runtime handler's base_runtime_spec:
    how a containerd node runs the hook for every container, whatever asked
    for its GPU (docs/kubernetes.md)."""
    said = subprocess.run([str(bindir(suite) / "ctr"), "oci", "spec"], capture_output=True, text=True,
                          check=True)
    spec = json.loads(said.stdout)
    hook = {"path": sys.executable,
            "args": [sys.executable, "-m", "vgpulimit", "oci-hook", "--node-dir", str(base / "hooknode")]}
    spec["hooks"] = {"createRuntime": [hook], "poststop": [hook]}
    path = base / "base-spec.json"
    path.write_text(json.dumps(spec))
    return path


@pytest.fixture(scope="module", params=SUITES)
def containerd(request, tmp_path_factory):
    """One containerd of each Debian suite for this module's tests."""
    reason = why_no_containerd(request.param)
    if reason:
        pytest.skip(reason)
    pytest.importorskip("cuda.bindings")
    base = tmp_path_factory.mktemp(f"crip-{request.param}")
    engine = Containerd(base, request.param, base_spec=hooked_base_spec(base, request.param))
    try:
        reason = engine.start()
        if reason:
            pytest.skip(reason)
        engine.hosts = opened_usr(base)
        (base / "hooknode").mkdir()
        yield engine
    finally:
        engine.stop()


@pytest.fixture
def node(containerd):
    """The node's HAMi-core directory after the operator put vgpulimit's shim
    where libvgpu.so was (the producers' own ld.so.preload names it), and its
    /tmp/vgpulock; emptied after each test."""
    vgpu = containerd.base / "vgpu"
    vgpu.mkdir()
    shutil.copy(libpath(), vgpu / "libvgpu.so")
    (vgpu / "ld.so.preload").write_text(f"{HOOK}/libvgpu.so\n")
    (containerd.base / "vgpulock").mkdir()
    yield vgpu
    for pod in list(containerd.pods):
        containerd.remove_pod(pod)
    for spec in (containerd.base / "cdi").glob("producer-*.json"):
        spec.unlink()
    shutil.rmtree(vgpu)
    shutil.rmtree(containerd.base / "vgpulock")


def create(pod, name: str, args: list[str], env: dict[str, str] | None = None,
           mounts: list[tuple[str, str, bool]] = (), cdi_devices: list[str] = ()) -> str:
    return pod.create(name, args, env={**SIMULATED, **(env or {})}, mounts=mounts,
                      cdi_devices=cdi_devices, host_paths=pod.cri.hosts)


def started(pod, name: str, args: list[str], **given) -> tuple[str, dict]:
    """Creates and starts a container; returns its id and the first line it
    printed (cuda_fill's report)."""
    container = create(pod, name, args, **given)
    pod.start(container)
    return container, json.loads(pod.output_line(name))


def hold(release: str, block: int, count: int) -> list[str]:
    return [*FILL, str(block), str(count), "--hold", release]


def stderr_of(pod, name: str, container: str, timeout: float = 60) -> str:
    """What the container wrote on stderr (its CRI log), once it exited."""
    deadline = time.monotonic() + timeout
    while pod.cri.status(container).state != EXITED:
        assert time.monotonic() < deadline, f"container {name} did not exit in {timeout} s"
        time.sleep(0.05)
    entries = [e.split(" ", 3) for e in (pod.logs / name / "0.log").read_text().splitlines()]
    return "\n".join(line for _, stream, _, line in entries if stream == "stderr")


def finish(containerd, release: str, *containers: str) -> None:
    containerd.release(release, *containers)


def nvml_in(containerd, container: str) -> dict:
    """What NVML says inside the running container (ExecSync)."""
    result = containerd.exec_sync(container, NVML)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def node_status(*directories: Path, pod_logs: Path | None = None) -> dict:
    args = [a for d in directories for a in ("--all", str(d))]
    args += ["--pod-logs", str(pod_logs)] if pod_logs else []
    result = subprocess.run(vgpulimit_cmd("status", *args, "--json", "--interval", "0"),
                            capture_output=True, text=True, env=base_env(), check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def ours(path: Path) -> bool:
    return path.read_bytes()[:8] == b"VGPULIM\0"


# -- HAMi's DRA driver ---------------------------------------------------------------------------


def hami_dra_claim(containerd, vgpu: Path, consumed: list[dict[str, int]]) -> tuple[str, str]:
    """Prepares a claim as HAMi's DRA driver does: its directory, and the CDI
    spec of its device with the container edits of GetCDIContainerEdits
    (``consumed``: each device's consumed capacity, "cores" and "memory" in
    bytes, either missing where the claim names none).  Returns the claim's
    UID and the CDI device kubelet hands the container."""
    claim = str(uuid.uuid4())
    in_container = f"{HOOK}/claims/{claim}"
    host = vgpu / "claims" / claim
    host.mkdir(parents=True)
    host.chmod(0o777)
    env = [f"CUDA_DEVICE_MEMORY_SHARED_CACHE={in_container}/{uuid.uuid4()}.cache"]
    for idx, capacity in enumerate(consumed):
        cores = capacity.get("cores", 60)           # the driver's "60" where none is consumed
        memory = capacity.get("memory", 16 * GiB)   # else the whole device
        env += [f"CUDA_DEVICE_SM_LIMIT_{idx}={cores}",
                f"CUDA_DEVICE_MEMORY_LIMIT_{idx}={memory // MiB}m"]
    name = f"{claim}-hami-gpu-0"
    options = ["nosuid", "nodev", "bind"]
    spec = {"cdiVersion": "0.5.0", "kind": HAMI_DRA_KIND, "devices": [{"name": name, "containerEdits": {
        "env": env,
        "mounts": [
            {"containerPath": in_container, "hostPath": str(host), "options": ["rw", *options]},
            {"containerPath": f"{HOOK}/libvgpu.so", "hostPath": str(vgpu / "libvgpu.so"),
             "options": ["ro", *options]},
            {"containerPath": "/etc/ld.so.preload", "hostPath": str(vgpu / "ld.so.preload"),
             "options": ["ro", *options]},
            {"containerPath": "/tmp/vgpulock", "hostPath": str(vgpu.parent / "vgpulock"),
             "options": ["rw", *options]},
        ]}}]}
    (containerd.base / "cdi" / f"producer-hami-{claim}.json").write_text(json.dumps(spec))
    return claim, f"{HAMI_DRA_KIND}={name}"


def test_hami_dra_two_containers_of_one_pod_share_the_claims_cap(containerd, node):
    """The cache file is the claim's, so the claim's containers share one
    region: one cap, which each sees the other's use of; the views tell the
    two apart by process (the claim's directory names no pod)."""
    claim, device = hami_dra_claim(containerd, node, [{"cores": 30, "memory": GiB}])
    pod = containerd.run_pod("dra-pair", namespace="team-a", handler=HOOKED)
    release = f"{HOOK}/claims/{claim}/release"
    first, holding = started(pod, "trainer", hold(release, 256 * MiB, 3), cdi_devices=[device])
    second, report = started(pod, "sidecar", hold(release, 256 * MiB, 2), cdi_devices=[device])
    nvml = nvml_in(containerd, second)
    [region] = node_status(node)["regions"]
    samples = node_metrics(node, pod_logs=containerd.base / "logs")
    finish(containerd, release, first, second)

    assert holding["before"] == {"free": GiB, "total": GiB}
    assert holding["allocs"] == ["CUDA_SUCCESS"] * 3
    assert report["before"] == {"free": 256 * MiB, "total": GiB}
    assert report["allocs"] == ["CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY"]
    assert nvml["v1"]["total"] == GiB and nvml["v1"]["used"] == GiB
    [cache] = (node / "claims" / claim).glob("*.cache")
    assert ours(cache) and region["region"] == str(cache)
    assert region["devices"][0]["limit"]["text"] == "1 GiB" and region["devices"][0]["cores_pct"] == 30
    assert sorted(p["used_bytes"] for p in region["processes"]) == [256 * MiB, 3 * 256 * MiB]
    # Each process named by its container's id, as `crictl ps` and the pod's status show it.
    assert sorted(p["host"]["container_id"] for p in region["processes"]) == sorted([first, second])
    assert list(series_of(samples, "vgpulimit_memory_used_bytes", claim_uid=claim).values()) == [GiB]
    per_process = series_of(samples, "vgpulimit_process_memory_used_bytes", claim_uid=claim)
    assert sorted(per_process.values()) == [256 * MiB, 3 * 256 * MiB]


def test_hami_dra_claim_naming_no_cores_is_held_to_60_percent_and_says_so(containerd, node):
    """The driver writes CUDA_DEVICE_SM_LIMIT_<i>=60 where the claim consumes
    no cores, and the whole device's memory where it consumes no memory: the
    container is held to 60 % of the compute, which its log says in one line."""
    _, device = hami_dra_claim(containerd, node, [{}])
    pod = containerd.run_pod("dra-memory-only", handler=HOOKED)
    container, report = started(pod, "main", [*FILL, str(256 * MiB), "1"], cdi_devices=[device])
    stderr = stderr_of(pod, "main", container)
    assert report["before"]["total"] == 16 * GiB
    assert report["allocs"] == ["CUDA_SUCCESS"]
    line = ("CUDA_DEVICE_SM_LIMIT_0=60 holds this container to 60% of the GPU's compute: HAMi's DRA driver "
            "writes 60 also where the claim asks for no cores")
    assert stderr.count(line) == 1, stderr
    [region] = node_status(node)["regions"]
    assert region["devices"][0]["cores_pct"] == 60


@pytest.mark.parametrize("handler", [HOOKED, PLAIN])
def test_a_bad_producer_variable_fails_the_start_where_the_hook_runs(containerd, node, handler):
    """With vgpulimit's hook in the runtime's base spec, a value the shim could
    not use fails StartContainer with one line in ContainerStatus (what
    `kubectl describe pod` shows); without the hook the container starts, the
    line is in its log, and every allocation is refused: never uncapped."""
    import grpc

    claim, device = hami_dra_claim(containerd, node, [{"cores": 30, "memory": GiB}])
    spec = containerd.base / "cdi" / f"producer-hami-{claim}.json"
    spec.write_text(spec.read_text().replace('_0=1024m"', '_0=lots"'))
    pod = containerd.run_pod(f"bad-{handler}", handler=handler)
    container = create(pod, "main", [*FILL, str(256 * MiB), "1"], cdi_devices=[device])
    line = "CUDA_DEVICE_MEMORY_LIMIT_0: 'lots' is not a valid value; accepted forms: "
    if handler == PLAIN:
        pod.start(container)
        assert json.loads(pod.output_line("main"))["allocs"] == ["CUDA_ERROR_OUT_OF_MEMORY"]
        assert stderr_of(pod, "main", container).count(line) == 1
        return
    with pytest.raises(grpc.RpcError):
        pod.start(container)
    status = containerd.status(container)
    assert status.state == EXITED and status.reason == "StartError"
    assert status.message.count(f"vgpulimit: error: process.env {line}") == 1, status.message
    assert "Traceback" not in status.message
    assert not list((node / "claims" / claim).glob("*.cache"))


# -- HAMi's device plugin and Volcano's ----------------------------------------------------------


def device_plugin(vgpu: Path, pod, name: str, cache_dir: str, limits: dict[str, str],
                  hook_dir: str = "vgpu") -> tuple[dict[str, str], list[tuple[str, str, bool]]]:
    """An Allocate response of HAMi's device plugin (cache_dir /usr/local/vgpu)
    or Volcano's (/tmp/vgpu, its host directory under $HOOK_PATH/vgpu): the
    container's own directory, made by the plugin, and what kubelet turns into
    CRI mounts."""
    uid = pod.config.metadata.uid
    own = vgpu / hook_dir / "containers" / f"{uid}_{name}"
    own.mkdir(parents=True)
    own.chmod(0o777)
    env = {**limits, "CUDA_DEVICE_MEMORY_SHARED_CACHE": f"{cache_dir}/{uuid.uuid4()}.cache",
           "NVIDIA_VISIBLE_DEVICES": GPU_UUID}
    mounts = [(f"{HOOK}/libvgpu.so", str(vgpu / "libvgpu.so"), True), (cache_dir, str(own), False),
              ("/tmp/vgpulock", str(vgpu.parent / "vgpulock"), False),
              ("/etc/ld.so.preload", str(vgpu / "ld.so.preload"), True)]
    return env, mounts


@pytest.mark.parametrize("producer", ["hami", "volcano"])
def test_a_device_plugins_container_is_capped_and_named_by_pod(containerd, node, producer):
    pod = containerd.run_pod(f"{producer}-train", namespace="ml", handler=HOOKED)
    cache_dir, hook_dir = (HOOK, "") if producer == "hami" else ("/tmp/vgpu", "vgpu")
    env, mounts = device_plugin(node, pod, "train", cache_dir, {
        "CUDA_DEVICE_MEMORY_LIMIT_0": "1024m", "CUDA_DEVICE_SM_LIMIT": "50"}, hook_dir)
    release = f"{cache_dir}/release"
    container, report = started(pod, "train", hold(release, 256 * MiB, 5), env=env, mounts=mounts)
    nvml = nvml_in(containerd, container)
    samples = node_metrics(node, pod_logs=containerd.base / "logs")
    [region] = node_status(node, pod_logs=containerd.base / "logs")["regions"]
    finish(containerd, release, container)

    assert report["before"] == {"free": GiB, "total": GiB}
    assert report["allocs"] == ["CUDA_SUCCESS"] * 4 + ["CUDA_ERROR_OUT_OF_MEMORY"]
    assert nvml["v1"]["total"] == GiB and nvml["v1"]["used"] == GiB
    assert region["devices"][0]["cores_pct"] == 50
    # The pod named as its logs name it, in `status --all` as in the metrics.
    assert (region["identity"]["container"], region["identity"]["pod"], region["identity"]["namespace"]) \
        == ("train", f"{producer}-train", "ml")
    assert region["identity"]["pod_uid"] == pod.config.metadata.uid
    uid = pod.config.metadata.uid
    [(key, used)] = series_of(samples, "vgpulimit_memory_used_bytes", pod_uid=uid).items()
    assert used == GiB
    assert {("pod", f"{producer}-train"), ("namespace", "ml"), ("container", "train")} <= set(key[1])


# -- KAI -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("label", [16384, None], ids=["memory-label", "no-memory-label"])
def test_kai_fraction_is_capped_with_or_without_the_nodes_memory_label(containerd, node, label):
    """GPU_PORTION 0.25 of a 16 GiB GPU: with the node's label KAI also hands
    CUDA_DEVICE_MEMORY_LIMIT=4096m (one limit, the same); without it (GB10,
    KAI-Scheduler#1967) only the portion, which still caps at 4 GiB."""
    pod = containerd.run_pod(f"kai-{'label' if label else 'nolabel'}", namespace="research", handler=HOOKED)
    uid = pod.config.metadata.uid
    env = {"NVIDIA_VISIBLE_DEVICES": GPU_UUID, "GPU_PORTION": "0.25", "RUNAI_NUM_OF_GPUS": "0.25",
           "POD_UID": uid, "CONTAINER_NAME": "main", "CONTAINER_VGPU_MOUNT": HOOK}
    if label:
        env["CUDA_DEVICE_MEMORY_LIMIT"] = f"{int(label * 0.25)}m"
    mounts = [(HOOK, str(node), False), ("/etc/ld.so.preload", str(node / "ld.so.preload"), True)]
    release = "/tmp/release"
    container, report = started(pod, "main", hold(release, GiB, 5), env=env, mounts=mounts)
    samples = node_metrics(node, pod_logs=containerd.base / "logs")
    finish(containerd, release, container)

    assert report["before"] == {"free": 4 * GiB, "total": 4 * GiB}
    assert report["allocs"] == ["CUDA_SUCCESS"] * 4 + ["CUDA_ERROR_OUT_OF_MEMORY"]
    assert ours(node / "containers" / f"{uid}_main" / "vgpulimit.cache")
    [(key, cap)] = series_of(samples, "vgpulimit_memory_limit_bytes", pod_uid=uid).items()
    assert cap == 4 * GiB
    assert {("pod", pod.config.metadata.name), ("namespace", "research"), ("container", "main")} <= set(key[1])


# -- NVIDIA's DRA driver: MPS, time-slicing ------------------------------------------------------


def nvidia_mps_claim(containerd) -> str:
    """The CDI device of an MPS claim as NVIDIA's DRA driver writes its edits
    (the pipe and shm directories of the claim's control daemon)."""
    claim = str(uuid.uuid4())
    daemon = containerd.base / "mps" / claim
    for sub in ("pipe", "shm"):
        (daemon / sub).mkdir(parents=True)
    options = ["rw", "nosuid", "nodev", "bind"]
    spec = {"cdiVersion": "0.5.0", "kind": "k8s.gpu.nvidia.com/claim", "devices": [{
        "name": f"{claim}-gpu-0", "containerEdits": {
            "env": ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"],
            "mounts": [{"containerPath": "/dev/shm", "hostPath": str(daemon / "shm"), "options": options},
                       {"containerPath": "/tmp/nvidia-mps", "hostPath": str(daemon / "pipe"),
                        "options": options}]}}]}
    (containerd.base / "cdi" / f"producer-nvidia-{claim}.json").write_text(json.dumps(spec))
    return f"k8s.gpu.nvidia.com/claim={claim}-gpu-0"


def test_an_mps_client_keeps_its_memory_cap_and_is_told_a_compute_share_adds_to_mps(containerd, node):
    """The claim hands the container only MPS's pipe: alone it runs with no
    region (MPS's daemon holds its limits).  Given vgpulimit's limits too (the
    hook in the base spec reads them), the memory cap holds; a compute share
    is kept (a tenant can set the variable too) and said, once, to apply on
    top of MPS's."""
    device = nvidia_mps_claim(containerd)
    pod = containerd.run_pod("mps", namespace="infer", handler=HOOKED)
    _, bare = started(pod, "bare", [*FILL, str(GiB), "2"], cdi_devices=[device])
    assert bare["before"]["total"] == 16 * GiB and bare["allocs"] == ["CUDA_SUCCESS"] * 2
    assert os.listdir(containerd.base / "hooknode") == []
    capped, report = started(pod, "capped", hold("/tmp/release", 256 * MiB, 5), cdi_devices=[device],
                             env={"VGPULIMIT_MEMORY": "1GiB", "VGPULIMIT_CORES": "30"})
    [region] = node_status(containerd.base / "hooknode")["regions"]
    finish(containerd, "/tmp/release", capped)
    stderr = stderr_of(pod, "capped", capped)
    assert report["before"]["total"] == GiB
    assert report["allocs"] == ["CUDA_SUCCESS"] * 4 + ["CUDA_ERROR_OUT_OF_MEMORY"]
    line = ("CUDA_MPS_PIPE_DIRECTORY is set: this MPS client's compute is held both by its MPS daemon's "
            "limits and by VGPULIMIT_CORES=30, the tighter applying")
    assert stderr.count(line) == 1, stderr
    assert region["identity"]["pod"] == "mps" and region["identity"]["container"] == "capped"
    assert region["devices"][0]["limit"]["text"] == "1 GiB"
    assert region["devices"][0]["cores_pct"] == 30


@pytest.mark.parametrize("cgroup, found", [
    ("12:pids:/k8s.io/" + "a" * 64 + "\n11:cpu:/k8s.io/" + "a" * 64, "a" * 64),
    ("0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-" + "b" * 64 + ".scope", "b" * 64),
    ("0::/kubepods.slice/kubepods-burstable.slice/crio-" + "c" * 64 + ".scope/container", "c" * 64),
    ("0::/user.slice/user-0.slice/session-1.scope", ""),
    ("9:name=systemd:/\n8:pids:/", ""),
    ("0::/k8s.io/" + "d" * 63, ""),
    # A cgroup the tenant made below its own, named as another container's id.
    ("0::/kubepods.slice/cri-containerd-" + "e" * 64 + ".scope/" + "f" * 64, "e" * 64),
])
def test_a_process_is_named_by_the_container_its_cgroup_says(cgroup, found):
    from vgpulimit.processes import container_id_of

    assert container_id_of(cgroup) == found

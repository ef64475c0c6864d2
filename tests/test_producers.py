"""vgpulimit in place of HAMi-core's libvgpu.so, under the engines that decide
who gets what fraction of a GPU on Kubernetes (issue 16).  Each engine's
container is built here with exactly the environment and mounts that engine
hands it, as its source writes them; only the library under
/usr/local/vgpu/libvgpu.so is ours.  A cuda-bindings client runs in it on
the simulated GPU, and the node's `vgpulimit metrics` names it by the
directories the engine keeps its file in.

- HAMi's device plugin (Allocate): CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m,
  CUDA_DEVICE_SM_LIMIT, CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/<uuid>.cache;
  /usr/local/vgpu <- host .../vgpu/containers/<pod UID>_<container>,
  the library read-only, /tmp/vgpulock, /etc/ld.so.preload read-only.
- HAMi's DRA driver: the same variables per claim (indexed in its own order)
  and the cache under /usr/local/vgpu/claims/<claim UID>/, as CDI edits.
- KAI: NVIDIA_VISIBLE_DEVICES, GPU_PORTION, RUNAI_NUM_OF_GPUS, and
  CUDA_DEVICE_MEMORY_LIMIT only where the node has its GPU memory label; its
  resource isolator mounts the node's /usr/local/vgpu and /etc/ld.so.preload
  and sets POD_UID, CONTAINER_NAME, CONTAINER_VGPU_MOUNT."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import schemas
from conftest import TESTS, GiB, MiB, base_env, vgpulimit_cmd
from podman import CDI_DIR, Podman, podman_unavailable
from runc_bundle import Bundle, host_dirs, make_bundle, runc_unavailable
from test_views import scrape

from vgpulimit import environment
from vgpulimit._paths import libpath

HOOK = Path("/usr/local/vgpu")          # HAMi's hook path and KAI's CONTAINER_VGPU_MOUNT
LIBRARY = HOOK / "libvgpu.so"
PRELOAD_LINE = f"{LIBRARY}\n"
FILL = [sys.executable, str(TESTS / "clients" / "cuda_fill.py")]
CDI_SCHEMA = "cdi/schema.json"
GPU_UUID = "GPU-4fa8a4d4-1c1e-4b8e-9c59-0d2b5e0e6f11"
SIMULATED = {"SIMGPU_MEMORY": "16GiB"}  # the hardware, not the engine


@pytest.fixture
def node(tmp_path):
    """A node's /usr/local/vgpu (at another path: the tests' containers see it
    where the engines mount it) after the operator put vgpulimit's shim where
    libvgpu.so was; the ld.so.preload file is the engine's own."""
    reason = runc_unavailable()
    if reason:
        pytest.skip(reason)
    pytest.importorskip("cuda.bindings")
    vgpu = tmp_path / "node" / "vgpu"
    vgpu.mkdir(parents=True)
    shutil.copy(libpath(), vgpu / "libvgpu.so")
    (vgpu / "ld.so.preload").write_text(PRELOAD_LINE)
    (tmp_path / "node" / "vgpulock").mkdir()
    bundles: list[Bundle] = []
    yield vgpu, bundles
    for bundle in bundles:
        bundle.cleanup()


def bind(source: Path, destination: Path, *options: str) -> dict:
    return {"destination": str(destination), "type": "bind", "source": str(source),
            "options": ["rbind", "nosuid", "nodev", *options]}


def opened_usr(base: Path) -> list[Path]:
    """The host's directories for the rootfs, with /usr and /usr/local given
    entry by entry, so that /usr/local/vgpu is a mount point of the container
    as on a node (the host's own /usr/local has none)."""
    dirs = []
    for path in host_dirs(base):
        if path != Path("/usr"):
            dirs.append(path)
            continue
        for top in sorted(Path("/usr").iterdir()):
            entries = sorted(top.iterdir()) if top.name == "local" else [top]
            dirs += [e for e in entries if e.is_dir() and not e.is_symlink()]
    return dirs


def container(base: Path, node_vgpu: Path, env: dict[str, str], mounts: list[dict],
              args: list[str], bundles: list[Bundle]) -> Bundle:
    """A runc bundle of one container with the engine's ``env`` and ``mounts``
    (in the order a CRI runtime applies them: parents first)."""
    hosts = opened_usr(base)
    bundle = make_bundle(base, args, {**SIMULATED, **env}, host_paths=hosts)
    for link in ("/usr", "/usr/local"):
        for entry in Path(link).iterdir():
            if entry.is_symlink():
                (bundle.rootfs / entry.relative_to("/")).parent.mkdir(parents=True, exist_ok=True)
                (bundle.rootfs / entry.relative_to("/")).symlink_to(os.readlink(entry))
    lock = node_vgpu.parent / "vgpulock"
    bundle.config["mounts"] += sorted([*mounts, bind(lock, Path("/tmp/vgpulock"), "rw")],
                                      key=lambda m: len(Path(m["destination"]).parts))
    bundles.append(bundle)
    return bundle


def hami_device_plugin(node_vgpu: Path, pod_uid: str, name: str, limits: dict[str, str],
                       preload: bool = True) -> tuple[dict[str, str], list[dict]]:
    """What HAMi's device plugin hands one container (Allocate): the cache
    file named by a fresh UUID in a directory of the container's own."""
    own = node_vgpu / "containers" / f"{pod_uid}_{name}"
    own.mkdir(parents=True)
    env = {**limits, "CUDA_DEVICE_MEMORY_SHARED_CACHE": f"{HOOK}/{uuid.uuid4()}.cache"}
    mounts = [bind(node_vgpu / "libvgpu.so", LIBRARY, "ro"), bind(own, HOOK, "rw")]
    if preload:   # unless the container sets CUDA_DISABLE_CONTROL=true
        mounts.append(bind(node_vgpu / "ld.so.preload", Path("/etc/ld.so.preload"), "ro"))
    return env, mounts


def hami_dra_spec(node_vgpu: Path, claim_uid: str, limits: list[tuple[str, str]]) -> dict:
    """The CDI spec of one claim as HAMi's DRA driver writes its container
    edits (GetCDIContainerEdits): one cache file for every container of the
    claim, each device's limits indexed in the driver's own order."""
    claim = node_vgpu / "claims" / claim_uid
    claim.mkdir(parents=True)
    claim.chmod(0o777)
    in_container = HOOK / "claims" / claim_uid
    env = [f"CUDA_DEVICE_MEMORY_SHARED_CACHE={in_container}/{uuid.uuid4()}.cache"]
    for idx, (cores, memory) in enumerate(limits):
        env += [f"CUDA_DEVICE_SM_LIMIT_{idx}={cores}", f"CUDA_DEVICE_MEMORY_LIMIT_{idx}={memory}"]
    spec = {"cdiVersion": "0.5.0", "kind": "k8s.gpu.hami.io/gpu",
            "devices": [{"name": claim_uid, "containerEdits": {
                "env": env,
                "mounts": [
                    {"containerPath": str(in_container), "hostPath": str(claim),
                     "options": ["rw", "nosuid", "nodev", "bind"]},
                    {"containerPath": str(LIBRARY), "hostPath": str(node_vgpu / "libvgpu.so"),
                     "options": ["ro", "nosuid", "nodev", "bind"]},
                    {"containerPath": "/etc/ld.so.preload",
                     "hostPath": str(node_vgpu / "ld.so.preload"),
                     "options": ["ro", "nosuid", "nodev", "bind"]},
                    {"containerPath": "/tmp/vgpulock",
                     "hostPath": str(node_vgpu.parent / "vgpulock"),
                     "options": ["rw", "nosuid", "nodev", "bind"]},
                ]}}]}
    return spec


def test_the_hami_dra_specs_here_validate(tmp_path):
    schemas.validate(CDI_SCHEMA, hami_dra_spec(tmp_path / "vgpu", "claim-1", [("30", "1024m"), ("60", "2g")]))


def apply_cdi(spec: dict) -> tuple[dict[str, str], list[dict]]:
    """The OCI edits a runtime makes of the spec's one device."""
    edits = spec["devices"][0]["containerEdits"]
    env = dict(entry.split("=", 1) for entry in edits["env"])
    mounts = [{"destination": m["containerPath"], "type": "bind", "source": m["hostPath"],
               "options": ["rbind", *[o for o in m["options"] if o != "bind"]]}
              for m in edits["mounts"]]
    return env, mounts


def kai(node_vgpu: Path, pod_uid: str, name: str, portion: str, memory_label_mib: int | None,
        ) -> tuple[dict[str, str], list[dict]]:
    """What KAI gives a fractional container, with its hamicore binder plugin
    and its resource isolator: CUDA_DEVICE_MEMORY_LIMIT = portion x the node's
    GPU memory label, and nothing when the label is missing."""
    env = {"NVIDIA_VISIBLE_DEVICES": GPU_UUID, "GPU_PORTION": portion,
           "RUNAI_NUM_OF_GPUS": portion, "POD_UID": pod_uid, "CONTAINER_NAME": name,
           "CONTAINER_VGPU_MOUNT": str(HOOK)}
    if memory_label_mib is not None:
        env["CUDA_DEVICE_MEMORY_LIMIT"] = f"{int(memory_label_mib * float(portion))}m"
    mounts = [bind(node_vgpu, HOOK, "rw"),
              bind(node_vgpu / "ld.so.preload", Path("/etc/ld.so.preload"), "ro")]
    return env, mounts


def run_fill(bundle: Bundle, block: int, count: int) -> tuple[dict, str]:
    bundle.config["process"]["args"] = [*FILL, str(block), str(count)]
    result = bundle.run(timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


def node_metrics(*directories: Path, pod_logs: Path | None = None) -> dict:
    """One scrape of the node's `vgpulimit metrics --all` over ``directories``."""
    args = [a for d in directories for a in ("--all", str(d))]
    if pod_logs is not None:
        args += ["--pod-logs", str(pod_logs)]
    server = subprocess.Popen(vgpulimit_cmd("metrics", "--listen", "127.0.0.1:0", *args),
                              env=base_env(), stderr=subprocess.PIPE, text=True)
    try:
        line = server.stderr.readline()
        assert "serving metrics on http://127.0.0.1:" in line, line
        return scrape(line.split()[-1])
    finally:
        server.terminate()
        server.wait(timeout=30)


def series_of(samples: dict, name: str, **labels: str) -> dict[tuple, float]:
    return {key: value for key, value in samples.items()
            if key[0] == name and all((k, v) in key[1] for k, v in labels.items())}


def ours(path: Path) -> bool:
    return path.read_bytes()[:8] == b"VGPULIM\0"


# -- HAMi's device plugin ------------------------------------------------------------------------


def test_hami_device_plugin_container_is_capped_and_named_by_the_node(tmp_path, node):
    vgpu, bundles = node
    pod_uid = str(uuid.uuid4())
    env, mounts = hami_device_plugin(vgpu, pod_uid, "train", {
        "CUDA_DEVICE_MEMORY_LIMIT_0": "1024m", "CUDA_DEVICE_SM_LIMIT": "50",
        "LIBCUDA_LOG_LEVEL": "1", "GPU_CORE_UTILIZATION_POLICY": "disable"})
    bundle = container(tmp_path / "a", vgpu, env, mounts, [], bundles)
    report, _ = run_fill(bundle, 256 * MiB, 5)
    assert report["before"]["total"] == GiB
    assert report["allocs"] == ["CUDA_SUCCESS"] * 4 + ["CUDA_ERROR_OUT_OF_MEMORY"]

    [cache] = (vgpu / "containers" / f"{pod_uid}_train").glob("*.cache")
    assert cache.name == Path(env["CUDA_DEVICE_MEMORY_SHARED_CACHE"]).name and ours(cache)
    # The kubelet's log directory of the pod names it.
    pod_logs = tmp_path / "pods"
    (pod_logs / f"ml_trainer-7f9c_{pod_uid}" / "train").mkdir(parents=True)
    samples = node_metrics(vgpu, pod_logs=pod_logs)
    [(key, cap)] = series_of(samples, "vgpulimit_memory_limit_bytes", pod_uid=pod_uid).items()
    assert cap == GiB
    labels = dict(key[1])
    assert (labels["container"], labels["pod"], labels["namespace"]) == ("train", "trainer-7f9c",
                                                                         "ml")
    assert labels["claim_uid"] == ""
    # GPU_CORE_UTILIZATION_POLICY=disable drops HAMi's own compute share.
    assert not series_of(samples, "vgpulimit_compute_limit_ratio", pod_uid=pod_uid)


def test_hami_device_plugin_without_the_preload_runs_unlimited(tmp_path, node):
    """CUDA_DISABLE_CONTROL=true: HAMi's plugin mounts no /etc/ld.so.preload,
    so nothing loads the shim and the node has no region for it."""
    vgpu, bundles = node
    pod_uid = str(uuid.uuid4())
    env, mounts = hami_device_plugin(vgpu, pod_uid, "free", {
        "CUDA_DEVICE_MEMORY_LIMIT_0": "1024m", "CUDA_DISABLE_CONTROL": "true"}, preload=False)
    bundle = container(tmp_path / "a", vgpu, env, mounts, [], bundles)
    report, _ = run_fill(bundle, 256 * MiB, 5)
    assert report["allocs"] == ["CUDA_SUCCESS"] * 5
    assert report["before"]["total"] == 16 * GiB
    assert not list((vgpu / "containers" / f"{pod_uid}_free").glob("*.cache"))


# -- HAMi's DRA driver ---------------------------------------------------------------------------


def test_hami_dra_two_containers_of_one_pod_share_the_claims_region(tmp_path, node):
    vgpu, bundles = node
    claim_uid = str(uuid.uuid4())
    spec = hami_dra_spec(vgpu, claim_uid, [("30", "1024m")])
    env, mounts = apply_cdi(spec)
    release = HOOK / "claims" / claim_uid / "release"
    first = container(tmp_path / "a", vgpu, env, mounts,
                      [*FILL, str(256 * MiB), "3", "--hold", str(release)], bundles)
    second = container(tmp_path / "b", vgpu, env, mounts, [], bundles)
    proc, _ = first.start()
    try:
        holding = json.loads(proc.stdout.readline())
        assert holding["allocs"] == ["CUDA_SUCCESS"] * 3
        report, _ = run_fill(second, 256 * MiB, 2)
        samples = node_metrics(vgpu)
    finally:
        (vgpu / "claims" / claim_uid / "release").touch()
        proc.wait(timeout=60)
    # The second container sees what the first holds: one region, one cap.
    assert report["before"]["free"] == 256 * MiB
    assert report["allocs"] == ["CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY"]
    [cache] = (vgpu / "claims" / claim_uid).glob("*.cache")
    assert ours(cache)
    # Scraped after the second exited: what the first still holds.
    used = series_of(samples, "vgpulimit_memory_used_bytes", claim_uid=claim_uid)
    assert list(used.values()) == [3 * 256 * MiB]
    [(key, pct)] = series_of(samples, "vgpulimit_compute_limit_ratio",
                             claim_uid=claim_uid).items()
    assert pct == 0.3 and dict(key[1])["pod_uid"] == ""


def test_a_later_container_with_looser_variables_is_held_to_the_region_made_first(
        tmp_path, node):
    """A tenant's own variables (another container on the claim, or an exec)
    cannot loosen a region that a living process holds."""
    vgpu, bundles = node
    claim_uid = str(uuid.uuid4())
    env, mounts = apply_cdi(hami_dra_spec(vgpu, claim_uid, [("30", "1024m")]))
    release = HOOK / "claims" / claim_uid / "release"
    first = container(tmp_path / "a", vgpu, env, mounts,
                      [*FILL, str(256 * MiB), "1", "--hold", str(release)], bundles)
    looser = {**env, "CUDA_DEVICE_MEMORY_LIMIT_0": "8192m"}
    second = container(tmp_path / "b", vgpu, looser, mounts, [], bundles)
    proc, _ = first.start()
    try:
        assert json.loads(proc.stdout.readline())["allocs"] == ["CUDA_SUCCESS"]
        report, stderr = run_fill(second, 256 * MiB, 4)
    finally:
        (vgpu / "claims" / claim_uid / "release").touch()
        proc.wait(timeout=60)
    assert report["before"]["total"] == GiB
    assert report["allocs"] == ["CUDA_SUCCESS"] * 3 + ["CUDA_ERROR_OUT_OF_MEMORY"]
    assert "CUDA_DEVICE_MEMORY_LIMIT_0 is not what the region" in stderr


def test_podman_applies_the_dra_drivers_cdi_edits_and_a_pods_containers_share_the_claim(
        tmp_path, node):
    """The same claim, its CDI spec read and applied by podman itself."""
    reason = podman_unavailable()
    if reason:
        pytest.skip(reason)
    vgpu, _ = node
    claim_uid = str(uuid.uuid4())
    spec = hami_dra_spec(vgpu, claim_uid, [("30", "1024m")])
    made = not CDI_DIR.exists()
    CDI_DIR.mkdir(parents=True, exist_ok=True)
    spec_file = CDI_DIR / f"hami-{claim_uid}.json"
    spec_file.write_text(json.dumps(spec))
    engine = Podman(tmp_path / "podman", host_paths=opened_usr(tmp_path))
    options = ["--device", f"{spec['kind']}={claim_uid}", "-e", "SIMGPU_MEMORY=16GiB"]
    release = HOOK / "claims" / claim_uid / "release"
    try:
        proc, _, _ = engine.start([*FILL, str(256 * MiB), "3", "--hold", str(release)], *options)
        try:
            holding = json.loads(proc.stdout.readline() or "{}")
            assert holding.get("allocs") == ["CUDA_SUCCESS"] * 3, proc.stderr.read()
            result = engine.run([*FILL, str(256 * MiB), "2"], *options)
            assert result.returncode == 0, result.stderr
            report = json.loads(result.stdout)
        finally:
            (vgpu / "claims" / claim_uid / "release").touch()
            proc.wait(timeout=60)
    finally:
        engine.cleanup()
        spec_file.unlink()
        if made:
            CDI_DIR.rmdir()
    assert report["before"]["free"] == 256 * MiB
    assert report["allocs"] == ["CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY"]
    [cache] = (vgpu / "claims" / claim_uid).glob("*.cache")
    assert ours(cache)


def test_hami_dra_with_cuda_disable_control_runs_unlimited_and_says_so_once(tmp_path, node):
    """The DRA driver mounts the preload whatever the container sets; the shim
    then honours CUDA_DISABLE_CONTROL=true as HAMi-core does."""
    vgpu, bundles = node
    env, mounts = apply_cdi(hami_dra_spec(vgpu, str(uuid.uuid4()), [("30", "1024m")]))
    bundle = container(tmp_path / "a", vgpu, {**env, "CUDA_DISABLE_CONTROL": "true"}, mounts, [],
                       bundles)
    report, stderr = run_fill(bundle, 256 * MiB, 5)
    assert report["allocs"] == ["CUDA_SUCCESS"] * 5
    assert report["before"]["total"] == 16 * GiB
    assert stderr.count("CUDA_DISABLE_CONTROL=true: no limit is enforced in this process") == 1


def test_hami_dra_indices_name_no_device_so_the_tightest_caps_each():
    env = environment.read({
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": f"{HOOK}/claims/c1/{uuid.uuid4()}.cache",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m", "CUDA_DEVICE_MEMORY_LIMIT_1": "2048m",
        "CUDA_DEVICE_SM_LIMIT_0": "30", "CUDA_DEVICE_SM_LIMIT_1": "60"})
    assert {s.value.bytes for s in env.memory.values()} == {2048 * MiB}
    assert len(env.memory) == environment.MAX_DEVICES
    assert {s.value for s in env.cores.values()} == {30}
    assert any("CUDA_DEVICE_MEMORY_LIMIT_1=\"2048m\" applies to every device" in w
               for w in env.warnings)
    # In the device plugin's form an index is the container's device number.
    plugin = environment.read({
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": f"{HOOK}/{uuid.uuid4()}.cache",
        "CUDA_DEVICE_MEMORY_LIMIT_0": "4096m", "CUDA_DEVICE_MEMORY_LIMIT_1": "2048m"})
    assert {i: s.value.bytes for i, s in plugin.memory.items()} == {0: 4096 * MiB, 1: 2048 * MiB}
    assert not plugin.warnings


# -- KAI -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("label", [16384, None], ids=["memory-label", "no-memory-label"])
def test_kai_fraction_holds_with_or_without_the_nodes_memory_label(tmp_path, node, label):
    vgpu, bundles = node
    pod_uid = str(uuid.uuid4())
    env, mounts = kai(vgpu, pod_uid, "main", "0.25", label)
    bundle = container(tmp_path / "a", vgpu, env, mounts, [], bundles)
    report, stderr = run_fill(bundle, GiB, 5)
    assert report["before"]["total"] == 4 * GiB
    assert report["allocs"] == ["CUDA_SUCCESS"] * 4 + ["CUDA_ERROR_OUT_OF_MEMORY"]
    assert "disagree" not in stderr   # the portion and the size are one limit

    own = vgpu / "containers" / f"{pod_uid}_main"
    assert ours(own / "vgpulimit.cache")
    [(key, cap)] = series_of(node_metrics(vgpu), "vgpulimit_memory_limit_bytes",
                             pod_uid=pod_uid).items()
    assert cap == 4 * GiB and dict(key[1])["container"] == "main"


def test_gpu_portion_is_a_fraction_and_yields_to_any_size():
    assert environment.read({"GPU_PORTION": "0.5"}).memory[0].value.ppm == 500_000
    assert environment.read({"GPU_PORTION": "1"}).memory[3].value.ppm == 1_000_000
    sized = environment.read({"GPU_PORTION": "0.5", "CUDA_DEVICE_MEMORY_LIMIT": "3000m"})
    assert sized.memory[0].value.bytes == 3000 * MiB and not sized.warnings
    for bad in ("2", "0", "0.5m", "50%", "half"):
        [line] = environment.read({"GPU_PORTION": bad}).errors
        assert line.startswith(f"GPU_PORTION: '{bad}' is ") and "fraction of the GPU" in line


@pytest.mark.parametrize("value,disabled", [
    ("true", True), ("1", True), ("True", True), ("false", False), ("0", False), ("yes", False),
])
def test_cuda_disable_control_is_read_as_hamis_plugin_reads_it(value, disabled):
    """As Go's strconv.ParseBool: what it cannot read leaves the limits on, and says so."""
    env = environment.read({"CUDA_DEVICE_MEMORY_LIMIT": "1g", "CUDA_DISABLE_CONTROL": value})
    assert env.control_disabled is disabled
    unreadable = [f'CUDA_DISABLE_CONTROL="{value}" is neither true nor false; limits are enforced']
    assert list(env.warnings) == (unreadable if value == "yes" else [])


def test_cuda_disable_control_cannot_undo_limits_vgpulimit_set_up():
    env = environment.read({"VGPULIMIT_REGION": "/run/vgpulimit/r",
                            "CUDA_DISABLE_CONTROL": "true"})
    assert not env.control_disabled
    [line] = env.warnings
    assert line == ("CUDA_DISABLE_CONTROL=true ignored: VGPULIMIT_REGION is set, and limits "
                    "vgpulimit sets up cannot be turned off")


def test_the_oci_hook_leaves_the_isolators_containers_to_it_and_caps_kais_fraction_without_it():
    """On a CRI-O node with vgpulimit's hook, a KAI container that the
    isolator set up already loads the shim from /usr/local/vgpu: a second
    injection would count every allocation twice.  Without the isolator, the
    hook is what makes KAI's fraction hold."""
    from vgpulimit.oci.request import requested

    kai_env = ["NVIDIA_VISIBLE_DEVICES=" + GPU_UUID, "GPU_PORTION=0.25", "RUNAI_NUM_OF_GPUS=0.25"]
    isolated = [*kai_env, "POD_UID=u1", "CONTAINER_NAME=main", f"CONTAINER_VGPU_MOUNT={HOOK}"]
    assert requested({"process": {"env": isolated}}) is None
    limits = requested({"process": {"env": kai_env}})
    assert limits is not None and limits.memory[0].value.ppm == 250_000


def test_layout_labels_name_only_what_the_directories_say(tmp_path):
    from vgpulimit.layouts import layout_labels, pod_names

    logs = tmp_path / "pods"
    for entry in ("ml_trainer_u1", "kube-system_coredns-5d_u2", "odd", "a_b", "x__u3"):
        (logs / entry).mkdir(parents=True)
    pods = pod_names(str(logs))
    assert pods == {"u1": ("ml", "trainer"), "u2": ("kube-system", "coredns-5d")}
    assert pod_names(str(tmp_path / "none")) == {}

    def labelled(path: str) -> dict[str, str]:
        return {k: v for k, v in layout_labels(path, pods).items() if v}

    assert labelled("/usr/local/vgpu/containers/u1_train/x.cache") == {
        "pod_uid": "u1", "container": "train", "pod": "trainer", "namespace": "ml"}
    assert labelled("/usr/local/vgpu/containers/u9_main/vgpulimit.cache") == {
        "pod_uid": "u9", "container": "main"}
    assert labelled("/usr/local/vgpu/claims/c1/x.cache") == {"claim_uid": "c1"}
    for nobody in ("/usr/local/vgpu/containers/nounderscore/x.cache", "/run/vgpulimit/c/region",
                   "/usr/local/vgpu/x.cache", "region"):
        assert labelled(nobody) == {}


# -- what a producer hands, as the readers make of it (tests/test_cri_producers.py runs each) ---


def test_hami_dras_default_60_percent_is_said_in_one_line_where_it_applies():
    claim = {"CUDA_DEVICE_MEMORY_SHARED_CACHE": f"{HOOK}/claims/c1/{uuid.uuid4()}.cache",
             "CUDA_DEVICE_MEMORY_LIMIT_0": "16384m"}
    line = ("CUDA_DEVICE_SM_LIMIT_0=60 holds this container to 60% of the GPU's compute: HAMi's DRA "
            "driver writes 60 also where the claim asks for no cores (ask for \"cores\": 100 for all of it)")
    said = environment.read({**claim, "CUDA_DEVICE_SM_LIMIT_0": "60"})
    assert said.cores[0].value == 60 and list(said.warnings) == [line]
    # Not where the claim consumed other cores, where ours beats it, or in
    # the device plugin's form (whose 60 is what the pod asked for).
    assert not environment.read({**claim, "CUDA_DEVICE_SM_LIMIT_0": "30"}).warnings
    ours = environment.read({**claim, "CUDA_DEVICE_SM_LIMIT_0": "60", "VGPULIMIT_CORES": "60"})
    assert not any("HAMi's DRA driver writes 60" in w for w in ours.warnings)
    plugin = environment.read({"CUDA_DEVICE_MEMORY_SHARED_CACHE": f"{HOOK}/{uuid.uuid4()}.cache",
                               "CUDA_DEVICE_SM_LIMIT": "60"})
    assert plugin.cores[0].value == 60 and not plugin.warnings


def test_an_mps_client_keeps_its_limits_and_is_told_both_apply():
    """NVIDIA's DRA driver hands an MPS claim's container CUDA_MPS_PIPE_DIRECTORY.
    A tenant can set it too: naming a directory must not shed a compute
    share, so one given is kept, and both limits are said to apply."""
    mps = {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps", "VGPULIMIT_MEMORY": "1GiB"}
    plain = environment.read(mps)
    assert plain.mps and plain.memory[0].value.bytes == GiB and not plain.cores and not plain.warnings
    for name, value in [("VGPULIMIT_CORES", "30"), ("CUDA_DEVICE_SM_LIMIT_1", "30"),
                        (f"VGPULIMIT_CORES_{GPU_UUID}", "30")]:
        env = environment.read({**mps, name: value})
        assert {s.value for s in env.cores.values()} | {s.value for s in env.cores_by_uuid.values()} == {30}
        shown = "a compute share by UUID" if "GPU-" in name else f"{name}={value}"
        said = (f"CUDA_MPS_PIPE_DIRECTORY is set: this MPS client's compute is held both by its MPS daemon's "
                f"limits and by {shown}, the tighter applying; to leave compute to MPS, give it no compute share")
        assert list(env.warnings) == [said]
    assert not environment.read({"VGPULIMIT_CORES": "30"}).mps


def test_the_hook_keeps_an_mps_clients_cores_annotation_and_says_both_apply():
    from vgpulimit.oci.request import requested

    limits = requested({"process": {"env": ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]},
                        "annotations": {"vgpulimit.io/memory": "1GiB", "vgpulimit.io/cores": "30"}})
    assert limits.memory[0].value.bytes == GiB and limits.cores[0].value == 30
    assert any(w.startswith("CUDA_MPS_PIPE_DIRECTORY is set: this MPS client's compute is held both")
               for w in limits.warnings)


@pytest.mark.parametrize("name, value, line", [
    ("CUDA_DEVICE_MEMORY_LIMIT_0", "lots", "CUDA_DEVICE_MEMORY_LIMIT_0: 'lots' is not a valid value; accepted forms: "),
    ("CUDA_DEVICE_MEMORY_LIMIT", "8 GB", "CUDA_DEVICE_MEMORY_LIMIT: '8 GB' is not a valid value; accepted forms: "),
    ("CUDA_DEVICE_SM_LIMIT", "150", "CUDA_DEVICE_SM_LIMIT: '150' is out of range"),
    ("GPU_PORTION", "1.5", "GPU_PORTION: '1.5' is "),
])
def test_a_producers_bad_value_fails_the_hook_even_where_the_producer_named_the_region(name, value, line):
    """HAMi's forms name their region, and the container is the producer's to
    set up; a value the shim cannot use still fails the start with one line
    (the shim would refuse every allocation)."""
    from vgpulimit.oci import HookError
    from vgpulimit.oci.request import requested

    env = [f"CUDA_DEVICE_MEMORY_SHARED_CACHE={HOOK}/{uuid.uuid4()}.cache", f"{name}={value}"]
    with pytest.raises(HookError) as failed:
        requested({"process": {"env": env}})
    message = str(failed.value)
    assert message.startswith(f"process.env {line}") and "\n" not in message
    assert len(environment.read(dict(e.split("=", 1) for e in env)).errors) == 1

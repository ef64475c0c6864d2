"""Sharing one MIG instance (simgpu in MIG mode, tests/test_simgpu_mig.py):
limits that name a MIG device by its UUID, shares of the instance, HAMi's and
KAI's variables on it, and what a capped container on a MIG slice shows to
nvidia-smi's calls, nvitop, gpustat and pynvml, whose
nvmlDeviceGetHandleByIndex(0) is the instance's GPU.  The compute share holds
inside an instance, measured with CUDA events (NVML has no utilisation on
MIG), and a busy neighbour in another instance does not move it."""

from __future__ import annotations

import json
import sys
import time

import pytest
from conftest import C_DIR, GiB, MiB, compile_c, have, run, vgpulimit_cmd
from containers import CLIENTS, container, joined
from helpers import one_error_line, status_json
from test_compute_share import Container, loops, share
from test_views import serve_and_scrape

from vgpulimit.region import Region

H100_LAYOUT = "3g.40gb,2g.20gb,1g.10gb"
TWO_G_MIB = 20090        # the H100's 2g.20gb (mig/profiles.json)


def mig_env(sim_env, **more) -> dict[str, str]:
    env = {k: v for k, v in sim_env.items() if k != "SIMGPU_MEMORY"}
    return env | {"SIMGPU_PROFILE": "h100-80gb", "SIMGPU_MIG": H100_LAYOUT} | more


def view(env, *args, check=True):
    result = run([sys.executable, CLIENTS / "mig_view.py", *map(str, args)], env, check=check)
    return json.loads(result.stdout) if check else result


@pytest.fixture
def slice_env(sim_env):
    """A container's environment given the 2g.20gb instance, as NVIDIA's
    device plugin gives one (NVIDIA_VISIBLE_DEVICES=MIG-<uuid>, which the
    toolkit turns into that one device), without MIG monitoring rights."""
    env = mig_env(sim_env)
    uuid = view(env)["gpus"][0]["mig"][1]["uuid"]
    return env | {"CUDA_VISIBLE_DEVICES": uuid, "SIMGPU_MIG_MONITOR": "none"}, uuid


@pytest.mark.parametrize("flags, cap", [
    (["--memory-device", "{uuid}=4GiB"], 4 * GiB),
    (["--memory", "50%"], TWO_G_MIB * MiB // 2),
    (["--memory-device", "0=0.25"], TWO_G_MIB * MiB // 4),
])
def test_a_cap_on_a_mig_device_is_of_its_instance(slice_env, flags, cap):
    """cuMemGetInfo, the MIG device and its GPU all show the cap, and an
    allocation past it is refused."""
    env, uuid = slice_env
    cmd = vgpulimit_cmd("run", "--simulate", *[f.format(uuid=uuid) for f in flags], "--",
                        sys.executable, CLIENTS / "mig_view.py", 256 * MiB)
    seen = json.loads(run(cmd, env).stdout)
    [device] = seen["cuda"]
    assert device["mem_get_info_total"] == cap and device["name"].endswith("MIG 2g.20gb")
    [gpu] = seen["gpus"]
    [mig] = gpu["mig"]
    assert mig["uuid"] == uuid and mig["index"] == 0
    assert gpu["memory"] == mig["memory"] == {"total": cap, "used": 256 * MiB}
    [entry] = gpu["processes"]
    assert (entry["used"], entry["gi"], entry["ci"]) == (256 * MiB, 5, 0)
    past = run([*cmd[:-1], cap + MiB], env, check=False)
    assert "CUDA_ERROR_OUT_OF_MEMORY" in past.stderr


@pytest.mark.parametrize("variables, cap_mib", [
    ({"GPU_PORTION": "0.5"}, TWO_G_MIB // 2),              # KAI: a portion of the instance
    ({"CUDA_DEVICE_MEMORY_LIMIT": "3000m"}, 3000),          # HAMi-core
    ({"CUDA_DEVICE_MEMORY_LIMIT_0": "2g"}, 2048),
])
def test_hami_and_kai_variables_cap_a_mig_device(slice_env, shim_path, variables, cap_mib):
    env, _ = slice_env
    seen = view(env | variables | {"LD_PRELOAD": str(shim_path)}, MiB)
    assert seen["cuda"][0]["mem_get_info_total"] == cap_mib * MiB
    assert seen["gpus"][0]["memory"]["total"] == cap_mib * MiB


def test_a_mig_uuid_limit_variable_and_a_bad_one(slice_env, shim_path):
    env, uuid = slice_env
    seen = view(env | {f"VGPULIMIT_MEMORY_{uuid}": "1GiB", "LD_PRELOAD": str(shim_path)}, MiB)
    assert seen["cuda"][0]["mem_get_info_total"] == GiB
    result = run(vgpulimit_cmd("run", "--simulate", "--memory-device", "MIG-12=1GiB", "--", "true"), env,
                 check=False)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        ("vgpulimit: error: --memory-device: 'MIG-12' is not a GPU or MIG device UUID (GPU- or MIG- "
         "and 32 hex digits, as nvidia-smi -L prints them)")]


def test_a_limit_for_a_mig_gpu_by_its_own_uuid_is_refused_naming_its_mig_devices(slice_env, sim_env, shim_path,
                                                                                  tmp_path):
    """The GPU's UUID, the first line nvidia-smi -L prints, names no device
    CUDA shows (only its MIG devices): its cap would cap nothing, and the
    process got all 3000 MiB it asked.  `run` refuses it at start (and `set`
    on a live region, and `cdi generate` where NVML says), a bare preload
    refuses the process's allocations, each in one line naming the MIG
    devices to give it for."""
    env, uuid = slice_env
    gpu = view(mig_env(sim_env))["gpus"][0]
    migs = [m["uuid"] for m in gpu["mig"]]
    ask = [sys.executable, CLIENTS / "mig_view.py", 3000 * MiB]
    line = one_error_line(run(vgpulimit_cmd("run", "--simulate", "--memory-device", f"{gpu['uuid']}=1GiB",
                                            "--", *ask), env, check=False), 2)
    assert line.startswith(f"vgpulimit: error: --memory-device {gpu['uuid']}: that GPU is in MIG mode")
    assert all(m in line for m in migs)
    Region.create(tmp_path / "region").close()
    line = one_error_line(run(vgpulimit_cmd("set", "--region", tmp_path / "region", "--memory-device",
                                            f"{gpu['uuid']}=1GiB"), env, check=False), 2)
    assert line.startswith(f"vgpulimit: error: --memory-device {gpu['uuid']}: that GPU is in MIG mode")
    line = one_error_line(run(vgpulimit_cmd("cdi", "generate", "--device", gpu["uuid"], "--memory", "1GiB"), env,
                              check=False), 2)
    assert line.startswith(f"vgpulimit: error: --device {gpu['uuid']}: that GPU is in MIG mode")
    bare = run([*ask], env | {f"VGPULIMIT_MEMORY_{gpu['uuid']}": "1GiB", "LD_PRELOAD": str(shim_path)},
               check=False)
    assert bare.returncode != 0 and "mig_view: CUDA_ERROR_OUT_OF_MEMORY" in bare.stderr
    [said] = [ln for ln in bare.stderr.splitlines() if ": error: " in ln]
    assert f"the limits given for {gpu['uuid']} would cap nothing: that GPU is in MIG mode" in said
    assert f"{uuid} (this process's)" in said and all(m in said for m in migs)


def test_a_limit_for_a_device_the_process_does_not_see_is_said(slice_env, sim_env, shim_path):
    """Another instance's MIG UUID: said in one line.  With nothing else capped
    the process is refused (it got its 3000 MiB before), under `run` as under
    a bare preload; with a cap that does apply, it runs under that one."""
    env, uuid = slice_env
    other = next(m["uuid"] for m in view(mig_env(sim_env))["gpus"][0]["mig"] if m["uuid"] != uuid)
    warning = (f"warning: the limits given for {other} apply to no device of this process, which sees "
               f"{uuid}")
    cmd = vgpulimit_cmd("run", "--simulate", "--memory-device", f"{other}=1GiB")
    alone = run([*cmd, "--", sys.executable, CLIENTS / "mig_view.py", 3000 * MiB], env, check=False)
    assert alone.returncode != 0 and "mig_view: CUDA_ERROR_OUT_OF_MEMORY" in alone.stderr
    assert warning in alone.stderr
    assert ("error: none of the limits given by UUID applies to a device of this process (it sees "
            f"{uuid}), and nothing else caps it; device memory allocations are refused") in alone.stderr
    bare = view(env | {f"VGPULIMIT_MEMORY_{other}": "1GiB", "LD_PRELOAD": str(shim_path)}, 3000 * MiB,
                check=False)
    assert "mig_view: CUDA_ERROR_OUT_OF_MEMORY" in bare.stderr and warning in bare.stderr
    capped = run([*cmd, "--memory", "2GiB", "--", sys.executable, CLIENTS / "mig_view.py", GiB], env)
    assert json.loads(capped.stdout)["cuda"][0]["mem_get_info_total"] == 2 * GiB
    assert warning in capped.stderr and ": error: " not in capped.stderr


def test_a_regions_mig_device_is_shown_by_its_mig_uuid(slice_env, tmp_path):
    """The region keeps a device's kind: `status --region` names a MIG device
    MIG-, as NVML does (it said GPU- with the same digits)."""
    env, uuid = slice_env
    region = tmp_path / "c" / "region"
    with container(env, region, ["--memory-device", f"{uuid}=4GiB"], [(GiB, 1)]):
        [device] = status_json(env, region)["devices"]
    assert device["uuid"] == uuid and uuid.startswith("MIG-")


def test_containers_sharing_an_instance_each_see_their_own_cap(slice_env, tmp_path, shim_path):
    """Two containers on one 2g.20gb instance: one holds 3 GiB under 4 GiB, and
    a tool in the other (8 GiB) sees its own cap and none of it."""
    env, _ = slice_env
    with container(env, tmp_path / "a" / "region", ["--memory", "4GiB"], [(3 * GiB, 1)]) as [a], \
            container(env, tmp_path / "b" / "region", ["--memory", "8GiB"], [(GiB, 1)]) as [b]:
        seen = view(joined(env, tmp_path / "b" / "region", shim_path))
    mig = seen["gpus"][0]["mig"][0]
    assert mig["memory"] == {"total": 8 * GiB, "used": GiB}
    listed = [p["pid"] for p in mig["processes"]]
    assert b["pid"] in listed and a["pid"] not in listed


@pytest.fixture(scope="module")
def smi_view(tmp_path_factory):
    return compile_c(tmp_path_factory.mktemp("smi") / "smi_view", [C_DIR / "smi_view.c"], "-ldl")


@pytest.mark.parametrize("name", ["nvidia-smi calls", "nvitop -1", "gpustat --json", "pynvml"])
def test_a_tool_in_a_capped_container_on_a_mig_slice(slice_env, tmp_path, shim_path, smi_view, name):
    """A tool exec'd into a container capped at 4 GiB on the instance, whose
    process holds 1 GiB: the GPU it finds by index 0 and its MIG device show
    the cap (where the driver would refuse the GPU's memory to a container),
    only the container's instance, no utilisation, and no crash."""
    if name == "gpustat --json" and not have("gpustat"):
        pytest.skip("gpustat is not installed (pip install '.[test]' installs it)")
    env, uuid = slice_env
    region = tmp_path / "c" / "region"
    tool = {"nvidia-smi calls": [smi_view], "nvitop -1": [sys.executable, "-m", "nvitop", "-1"],
            "gpustat --json": [sys.executable, "-m", "gpustat", "--json"],
            "pynvml": [sys.executable, CLIENTS / "nvml_view.py"]}[name]
    with container(env, region, ["--memory-device", f"{uuid}=4GiB"], [(GiB, 1)]) as [holder]:
        out = run(tool, joined(env, region, shim_path, COLUMNS="120")).stdout
    if name == "nvidia-smi calls":
        assert "Memory-Usage 1024MiB / 4096MiB  GPU-Util N/A" in out
        assert "MIG 0/0:  GI 5  CI 0  Memory-Usage 1024MiB / 4096MiB  SM 32" in out
        assert "MIG 0/1" not in out and f"Process: {holder['pid']}  GI 5 CI 0  1024 MiB" in out
    elif name == "nvitop -1":
        assert "2g.20gb @ GI/CI: 5/0" in out and "3g.40gb" not in out
        assert "1024MiB / 4096MiB" in out and "1024MiB /  4096MiB" in out   # the GPU and its MIG device
        assert f"0:0 {holder['pid']:>7} C" in out
    elif name == "gpustat --json":
        [gpu] = json.loads(out)["gpus"]
        assert (gpu["memory.used"], gpu["memory.total"], gpu["utilization.gpu"]) == (1024, 4096, None)
    else:
        [dev] = json.loads(out)["devices"]
        assert (dev["v2"]["used"], dev["v2"]["total"]) == (GiB, 4 * GiB)
        assert dev["utilization"] == "NVMLError_NotSupported"


def test_without_limits_a_mig_container_gets_the_drivers_answers(slice_env):
    """No vgpulimit variable: the shim is not there, and the GPU's memory is
    the driver's answer to a container, NO_PERMISSION."""
    env, _ = slice_env
    assert view(env)["gpus"][0]["memory"] == "NoPermission"


@pytest.mark.slow
def test_the_compute_share_holds_inside_an_instance_beside_a_busy_neighbour(sim_env, launch_client):
    """Containers at 30 % and 60 % on the 3g.40gb instance, and one without a
    share flat out on the 2g.20gb: each gets its share of its own instance."""
    env = mig_env(sim_env)
    migs = view(env)["gpus"][0]["mig"]
    three_g = env | {"CUDA_VISIBLE_DEVICES": migs[0]["uuid"]}
    started = time.monotonic()
    pair = [Container(three_g, cores, loops(launch_client, 1)) for cores in (30, 60)]
    neighbour = Container(env | {"CUDA_VISIBLE_DEVICES": migs[1]["uuid"]}, None, loops(launch_client, 1))
    shares = [share(c.finish(), started + 1, started + 4) for c in pair]
    alone = share(neighbour.finish(), started + 1, started + 4)
    assert 20 <= shares[0] <= 40 and 50 <= shares[1] <= 70, shares
    # Its instance to itself, measured beside them: well past the 60 % one.
    assert alone >= 1.3 * shares[1], (alone, shares)


def test_the_node_view_shows_gpu_then_instance_then_containers(slice_env, tmp_path):
    """status --all: the GPU in MIG mode, then each instance (profile, GPU and
    compute instance, its memory) with the containers on it and their caps;
    metrics --all label the instance's series and its containers' as DCGM
    exporter does (the GPU's UUID, GPU_I_ID, GPU_I_PROFILE)."""
    env, uuid = slice_env
    env = env | {"SIMGPU_MIG_MONITOR": "all"}   # the node's view: the host's rights
    region = tmp_path / "c" / "region"
    with container(env, region, ["--memory-device", f"{uuid}=4GiB"], [(GiB, 1)]):
        node = json.loads(run(vgpulimit_cmd("status", "--all", tmp_path, "--json", "--interval", "0"),
                              env).stdout)
        text = run(vgpulimit_cmd("status", "--all", tmp_path, "--interval", "0"), env).stdout
        samples = serve_and_scrape(env, "--all", tmp_path)
    gpu, *instances = node["gpus"]
    assert gpu["mig_mode"] and gpu["mig"] is None and gpu["containers"] == []
    assert [(i["mig"]["profile"], i["mig"]["gpu_instance"], i["total_bytes"]) for i in instances] == [
        ("3g.40gb", 1, 40448 * MiB), ("2g.20gb", 5, TWO_G_MIB * MiB), ("1g.10gb", 13, 9984 * MiB)]
    two_g = instances[1]
    assert two_g["uuid"] == uuid and two_g["mig"]["parent_uuid"] == gpu["uuid"]
    [tenant] = two_g["containers"]
    assert (tenant["region"], tenant["cap_bytes"], tenant["used_bytes"]) == (str(region), 4 * GiB, GiB)
    [shown_region] = node["regions"]
    assert shown_region["devices"][0]["uuid"] == uuid   # MIG-, as NVML names it
    assert two_g["committed_bytes"] == 4 * GiB and instances[0]["containers"] == []
    at = text.index("  MIG 0/1 2g.20gb (GPU instance 5, compute instance 0)")
    section = text[at:text.index("  MIG 0/2 1g.10gb (GPU instance 13")]
    assert text.index("GPU 0: NVIDIA H100 80GB HBM3, bus 00000000:18:00.0, utilisation n/a, MIG mode") < at
    assert "    CONTAINER" in section and "4 GiB" in section and uuid in section
    dcgm = {"UUID": gpu["uuid"], "gpu": "0", "modelName": "NVIDIA H100 80GB HBM3", "GPU_I_ID": "5",
            "GPU_I_PROFILE": "2g.20gb"}
    [(_, labels)] = [k for k in samples if k[0] == "vgpulimit_gpu_memory_total_bytes"
                     and dict(k[1])["GPU_I_ID"] == "5"]
    assert dcgm.items() <= dict(labels).items()
    [(_, labels)] = [k for k in samples if k[0] == "vgpulimit_memory_limit_bytes"]
    del dcgm["gpu"]   # a container's series says its own device instead
    assert dcgm.items() <= dict(labels).items() and dict(labels)["device"] == "0"
    assert samples[("vgpulimit_memory_limit_bytes", labels)] == 4 * GiB


# A container that reports the memory its one device shows and waits.
SHOW_AND_WAIT = [sys.executable, "-c", (
    "import json, os, time\n"
    "from cuda.bindings import driver as cu\n"
    "cu.cuInit(0); _, dev = cu.cuDeviceGet(0); _, ctx = cu.cuDevicePrimaryCtxRetain(dev)\n"
    "cu.cuCtxSetCurrent(ctx); _, free, total = cu.cuMemGetInfo()\n"
    "print(json.dumps({'total': total}), flush=True)\n"
    "while not os.path.exists('/tmp/release'): time.sleep(0.05)")]


def test_the_hook_caps_and_admits_a_container_given_a_mig_device(tmp_path, runc, slice_env):
    """NVIDIA_VISIBLE_DEVICES=MIG-<uuid> (NVIDIA's device plugin, mixed
    strategy): the hook caps the container on that instance, and --admit
    counts the instance's own memory: a second 12 GiB container does not fit
    the 2g.20gb instance beside the first, while it fits the 3g.40gb one."""
    from runc_bundle import hook_entry, make_bundle

    env, uuid = slice_env
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    node = {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"} | {
        "SIMGPU_STATE": str(gpus / "node.simgpu"), "SIMGPU_MIG_MONITOR": "all"}
    three_g = view(node)["gpus"][0]["mig"][0]["uuid"]
    hook = hook_entry(tmp_path / "node", "--admit") | {"env": [f"{k}={v}" for k, v in node.items()]}
    bundles, running = [], []

    def start(name: str, mig: str):
        inside = {k: v for k, v in node.items() if k.startswith("SIMGPU_")} | {
            "VGPULIMIT_MEMORY": "12GiB", "NVIDIA_VISIBLE_DEVICES": mig,
            # What the toolkit's device nodes would leave CUDA: that one device.
            "CUDA_VISIBLE_DEVICES": mig}
        bundle = make_bundle(tmp_path / name, SHOW_AND_WAIT, inside)
        bundle.config["mounts"].append({"destination": str(gpus), "type": "bind", "source": str(gpus),
                                        "options": ["rbind", "rw"]})
        for stage in ("createRuntime", "poststop"):
            bundle.add_hook(stage, hook)
        bundles.append(bundle)
        proc, _ = bundle.start()
        running.append((proc, bundle))
        line = proc.stdout.readline()
        return json.loads(line) if line else proc.communicate(timeout=60)[1]

    try:
        assert start("a", uuid) == {"total": 12 * GiB}
        refused = start("b", uuid)
        assert "its memory cap 12 GiB would over-commit GPU 0 (" + uuid in refused
        assert "19.6 GiB): guarantees (requests, else caps) there already 12 GiB" in refused
        assert start("c", three_g) == {"total": 12 * GiB}
        shown = json.loads(run(vgpulimit_cmd("status", "--all", tmp_path / "node", "--json",
                                             "--interval", "0"), node).stdout)
        assert [g["committed_bytes"] for g in shown["gpus"]] == [0, 12 * GiB, 12 * GiB, 0]
    finally:
        for proc, bundle in running:
            (bundle.rootfs / "tmp" / "release").touch()
            try:
                proc.communicate(timeout=60)
            finally:
                bundle.cleanup()


def test_a_cdi_device_for_a_mig_device_caps_its_instance(tmp_path, runc, slice_env):
    """`cdi generate --device MIG-<uuid> --memory 50%`: a device named after
    the MIG device whose containers get half of that instance."""
    from runc_bundle import make_bundle
    from test_cdi import apply_edits, spec_of

    env, uuid = slice_env
    [device] = spec_of("--device", uuid.upper(), "--memory", "50%",   # either case, as NVML's
                       "--node-dir", str(tmp_path / "node"))["devices"]
    assert device["name"].startswith(f"{uuid[:12]}-50pct-node-")
    assert f"VGPULIMIT_MEMORY_{uuid}=50%" in device["containerEdits"]["env"]
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    inside = {k: v for k, v in env.items() if k.startswith("SIMGPU_")} | {
        "SIMGPU_STATE": str(gpus / "node.simgpu"), "CUDA_VISIBLE_DEVICES": uuid}
    bundle = make_bundle(tmp_path / "c", SHOW_AND_WAIT, inside)
    bundle.config["mounts"].append({"destination": str(gpus), "type": "bind", "source": str(gpus),
                                    "options": ["rbind", "rw"]})
    apply_edits(bundle.config, device["containerEdits"])
    proc, _ = bundle.start()
    try:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        assert json.loads(line) == {"total": TWO_G_MIB * MiB // 2}
    finally:
        (bundle.rootfs / "tmp" / "release").touch()
        proc.communicate(timeout=60)
        bundle.cleanup()


def test_cdi_generate_refuses_a_device_that_is_no_uuid():
    result = run(vgpulimit_cmd("cdi", "generate", "--device", "MIG-1/0/0", "--memory", "1GiB"), {},
                 check=False)
    assert result.returncode == 2
    assert "--device: 'MIG-1/0/0' is not a GPU or MIG device UUID" in result.stderr


def test_verify_checks_the_limits_on_the_mig_instance_it_finds_itself_on(slice_env):
    """Inside a container capped at half of its MIG device: every check
    passes against the instance, and verify says where it is."""
    env, uuid = slice_env
    result = run([*vgpulimit_cmd("run", "--simulate", "--memory", "50%", "--cores", "30", "--"),
                  *vgpulimit_cmd("verify", "--json")], env, timeout=180, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert f"MIG 2g.20gb ({uuid})" in checks["driver"]["message"]
    assert "a MIG instance: the limits are shares of the instance" in checks["driver"]["message"]
    assert checks["cuMemGetInfo"]["status"] == "pass" and "9.8 GiB = the cap" in checks["cuMemGetInfo"][
        "message"]
    assert checks["compute share"]["status"] == "pass"
    assert checks["nvml utilization"]["message"].startswith("not supported on a MIG instance")


def test_top_shows_each_instance_under_its_gpu(slice_env, tmp_path):
    import pexpect

    env, uuid = slice_env
    env = env | {"SIMGPU_MIG_MONITOR": "all", "TERM": "xterm"}
    region = tmp_path / "c" / "region"
    with container(env, region, ["--memory-device", f"{uuid}=4GiB"], [(GiB, 1)]):
        top = pexpect.spawn(sys.executable, ["-m", "vgpulimit", "top", "--interval", "0.5", "--all",
                                             str(tmp_path)], env=env, dimensions=(50, 140),
                            encoding="utf-8", timeout=30)
        try:
            top.expect_exact("MIG 0/1 2g.20gb (GPU instance 5, compute instance 0)")
            top.expect_exact(uuid)
            top.expect_exact("1 GiB / 4 GiB")   # the container's row under the instance
            top.expect_exact("MIG 0/2 1g.10gb")
            top.send("q")
            top.expect(pexpect.EOF)
        finally:
            top.close(force=True)
    assert top.exitstatus == 0


@pytest.mark.slow
@pytest.mark.parametrize("where", ["same instance", "other instance"])
def test_a_high_container_goes_first_on_its_own_instance_only(tmp_path, sim_env, launch_client, where):
    """A low container on the 3g.40gb instance, then a high one for two
    seconds: on the same instance the low one holds back; on the 2g.20gb
    it keeps its whole instance (instances run at once)."""
    from test_compute_share import wait_for
    from test_priority import alone_then, goes_first, reported, span

    env = mig_env(sim_env)
    migs = view(env)["gpus"][0]["mig"]
    low_env = env | {"CUDA_VISIBLE_DEVICES": migs[0]["uuid"]}
    high_env = env | {"CUDA_VISIBLE_DEVICES": migs[0 if where == "same instance" else 1]["uuid"]}
    started = time.monotonic()
    low = Container(low_env, None, loops(launch_client, 1, seconds=5.2), region=tmp_path / "low.region",
                    flags=["--priority", "low"])
    wait_for(lambda: reported(low, started + 1.0), "progress from the low container")
    high_out = Container(high_env, None, loops(launch_client, 1, seconds=2.0), region=tmp_path / "high.region",
                         flags=["--priority", "high"]).finish()
    low_out = low.finish()
    first, last = span(high_out)
    if where == "same instance":
        goes_first(high_out, low_out, first + 0.3, last)
    else:
        # Its pace beside the high one on the other instance, against its own alone before.
        alone, beside = alone_then(low_out, (span(low_out)[0] + 0.3, first), (first + 0.3, last))
        assert beside >= 0.7 * alone, (alone, beside)

"""`vgpulimit verify`: what it says, and its exit code, where the limits hold
and where they do not -- on the simulated GPU, and on a real one when there
is one.  Its figures (share, added cost) are reported, never asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
from conftest import TESTS, MiB, run, vgpulimit_cmd

from vgpulimit.region import read_snapshot

CLIENTS = TESTS / "clients"

# simgpu runs kernels it cannot time by name for SIMGPU_KERNEL_US: as long as
# the spin kernel is meant to run on a GPU.
SPIN_US = "1000"


def verify(env, *args: str, under: list[str] | None = None) -> subprocess.CompletedProcess:
    cmd = [*(under or []), *vgpulimit_cmd("verify", *args)]
    return run(cmd, env, timeout=180, check=False)


def under_run(*flags: str) -> list[str]:
    return vgpulimit_cmd("run", "--simulate", *flags, "--")


def statuses(result: subprocess.CompletedProcess) -> dict[str, list[str]]:
    """{check name: its statuses}, from the JSON document."""
    found: dict[str, list[str]] = {}
    for check in json.loads(result.stdout)["checks"]:
        found.setdefault(check["name"], []).append(check["status"])
    return found


def failures(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("FAIL ")]


@pytest.fixture
def schema():
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is a test dependency")
    document = json.loads(resources.files("vgpulimit").joinpath("verify.schema.json").read_text())
    cls = jsonschema.validators.validator_for(document)
    cls.check_schema(document)
    return cls(document)


def test_passes_under_run_with_memory_and_cores(sim_env, schema):
    env = dict(sim_env, SIMGPU_KERNEL_US=SPIN_US)
    result = verify(env, "--json", under=under_run("--memory", "1GiB", "--cores", "30"))
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads(result.stdout)
    schema.validate(document)
    assert document["ok"] is True and document["mode"] == "here"
    found = statuses(result)
    for name in ("shim", "cuMemGetInfo", "cuDeviceTotalMem", "nvmlDeviceGetMemoryInfo",
                 "nvmlDeviceGetMemoryInfo_v2", "nvml processes", "past the cap",
                 "compute share", "left behind"):
        assert found.get(name) == ["pass"], (name, found)
    facts = document["facts"]
    assert facts["shim"]["via"] == ["LD_PRELOAD"]
    assert facts["cap_bytes"] == 1 << 30
    assert facts["fill"]["past_cap"] == "CUDA_ERROR_OUT_OF_MEMORY"
    # The share came from the driver's events, against the 30% the region holds.
    assert facts["share"]["kernels"] > 0 and facts["region"]["cores_pct"] == 30
    assert "launch_ns" in document["baseline"]["costs"]


def test_text_names_where_the_limits_came_from(sim_env):
    result = verify(sim_env, "--quick", under=under_run("--memory", "1GiB"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "named by VGPULIMIT_REGION" in result.stdout
    assert "SKIP compute share: no compute share set" in result.stdout
    assert result.stdout.rstrip().endswith("all checks passed (limits set up here, device 0)")


def test_hami_variables_alone(sim_env, shim_path):
    env = dict(sim_env, LD_PRELOAD=str(shim_path), CUDA_DEVICE_MEMORY_LIMIT="1g")
    result = verify(env, "--quick", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    limits = [c["message"] for c in json.loads(result.stdout)["checks"] if c["name"] == "limits"]
    assert "CUDA_DEVICE_MEMORY_LIMIT=1g" in limits[0]
    assert statuses(result)["past the cap"] == ["pass"]


def test_fresh_region_on_a_node_is_removed_after(sim_env, tmp_path):
    result = verify(sim_env, "--simulate", "--memory", "1GiB", "--cores", "30", "--quick",
                    "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads(result.stdout)
    assert document["mode"] == "fresh-region"
    region = Path(document["facts"]["region"]["path"])
    assert region.is_relative_to(tmp_path / "run") and not region.exists()
    assert list((tmp_path / "run" / "vgpulimit").iterdir()) == []


def test_region_without_the_shim_fails(sim_env, tmp_path):
    region = tmp_path / "region"
    run(vgpulimit_cmd("run", "--simulate", "--memory", "1GiB", "--region", str(region),
                      "--", "true"), sim_env)
    result = verify(dict(sim_env, VGPULIMIT_REGION=str(region)), "--quick")
    assert result.returncode == 1
    assert failures(result)[0] == (
        f"FAIL shim: limits are configured (region {region}, named by VGPULIMIT_REGION) but "
        "the shim is not loaded in this process: it is in neither LD_PRELOAD nor "
        "/etc/ld.so.preload")
    # Without the shim, verify takes nothing past the cap from the device's other tenants.
    assert "SKIP past the cap: not tried" in result.stdout


# Loaded by every Python started with this directory on PYTHONPATH: the probe's
# first call of nvmlDeviceGetUtilizationRates reads address 0, as the shim did
# on an H200 (issue 23), and the probe dies of SIGSEGV there.
CRASH_IN_UTILIZATION = """
import ctypes

_attribute = ctypes.CDLL.__getattr__


def _crashing(self, name):
    if name == "nvmlDeviceGetUtilizationRates":
        return lambda *args: ctypes.string_at(0)
    return _attribute(self, name)


ctypes.CDLL.__getattr__ = _crashing
"""


@pytest.mark.parametrize("mode", ["here", "fresh-region"])
def test_a_probe_that_crashes_is_said_to_have_crashed(sim_env, tmp_path, schema, mode):
    """The probe is killed by a signal in its check of NVML: verify says so,
    with the signal and the last check the probe reached, and judges what
    the probe found before (the shim was loaded) -- never that the shim is
    not loaded."""
    hook = tmp_path / "crash"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(CRASH_IN_UTILIZATION)
    env = dict(sim_env, PYTHONPATH=os.pathsep.join(
        p for p in (str(hook), sim_env.get("PYTHONPATH")) if p))
    if mode == "here":
        text = verify(env, "--quick", under=under_run("--memory", "1GiB"))
        as_json = verify(env, "--quick", "--json", under=under_run("--memory", "1GiB"))
    else:
        text = verify(env, "--simulate", "--memory", "1GiB", "--quick")
        as_json = verify(env, "--simulate", "--memory", "1GiB", "--quick", "--json")
    assert text.returncode == as_json.returncode == 1
    reached = "nvmlDeviceGetUtilizationRates (NVML's view, before the fill)"
    crashed = ("FAIL probe: the probe crashed: killed by SIGSEGV (signal 11); the last check "
               f"it reached: {reached}")
    assert failures(text) == [crashed, "FAIL past the cap: not tried: the probe stopped before it"]
    assert "not loaded" not in text.stdout
    assert "PASS shim: loaded from " in text.stdout
    assert "PASS nvmlDeviceGetMemoryInfo_v2: total 1 GiB = the cap" in text.stdout
    document = json.loads(as_json.stdout)
    schema.validate(document)
    assert document["mode"] == mode
    assert document["facts"]["crashed"] == {"signal": "SIGSEGV", "reached": reached}


def test_cap_other_than_asked_fails(sim_env):
    result = verify(sim_env, "--memory", "1GiB", "--quick", under=under_run("--memory", "2GiB"))
    assert result.returncode == 1
    assert failures(result) == [
        "FAIL limits: the memory cap here is 2 GiB, not the 1 GiB asked with --memory"]


def test_share_other_than_asked_fails(sim_env):
    result = verify(sim_env, "--cores", "30", "--quick", under=under_run("--cores", "50"))
    assert result.returncode == 1
    assert failures(result) == [
        "FAIL limits: the compute share here is 50%, not the 30% asked with --cores"]


def test_device_smaller_than_the_cap_fails(sim_env):
    env = dict(sim_env, SIMGPU_MEMORY="512MiB")
    result = verify(env, "--simulate", "--memory", "1GiB", "--quick")
    assert result.returncode == 1
    assert failures(result) == [
        "FAIL device: device 0 has 512 MiB, less than its cap of 1 GiB: the cap cannot be given"]


# A cap below what a context costs: the shim refuses the context itself.
# Before, verify called the cap "unknown" and its source "the environment".
@pytest.mark.parametrize("where, cap", [("fresh", "1MiB"), ("fresh", "100MiB"), ("here", "100MiB")])
def test_a_cap_below_the_contexts_own_memory_says_the_context_does_not_fit(sim_env, where, cap):
    env = dict(sim_env, SIMGPU_CONTEXT_OVERHEAD="300MiB")
    if where == "fresh":
        result = verify(env, "--simulate", "--memory", cap, "--quick")
    else:
        result = verify(env, "--memory", cap, "--quick", under=under_run("--memory", cap))
    assert result.returncode == 1
    shown = cap.replace("MiB", " MiB")
    assert failures(result) == [(
        f"FAIL context: the CUDA context's own memory does not fit under the cap of {shown} "
        "(cuDevicePrimaryCtxRetain was refused with CUDA_ERROR_OUT_OF_MEMORY): a context costs the "
        "driver device memory before anything is allocated; give a cap above that (hundreds of "
        "MiB on most GPUs)")]
    assert f"INFO limits: device 0: memory {shown}, compute no share; from " in result.stdout
    assert "unknown" not in result.stdout and "from the environment" not in result.stdout


def test_nothing_to_verify_fails(sim_env):
    result = verify(sim_env, "--quick")
    assert result.returncode == 1
    assert failures(result)[0].startswith("FAIL limits: no limits are set up here")


def test_nothing_left_allocated(sim_env, tmp_path, shim_path):
    """A neighbour holds 512 MiB in the region; verify fills only what is
    left under the cap, and after it the region's usage is the neighbour's
    again and NVML lists no process of verify's."""
    region, release = tmp_path / "region", tmp_path / "release"
    holder = subprocess.Popen(list(map(str, vgpulimit_cmd(
        "run", "--simulate", "--memory", "1GiB", "--region", region, "--",
        sys.executable, CLIENTS / "cuda_fill.py", str(512 * MiB), "1", "--hold", release))),
        env=sim_env, stdout=subprocess.PIPE, text=True)
    try:
        assert json.loads(holder.stdout.readline())["allocs"] == ["CUDA_SUCCESS"]
        env = dict(sim_env, VGPULIMIT_REGION=str(region), LD_PRELOAD=str(shim_path))
        result = verify(env, "--quick", "--json")
        assert result.returncode == 0, result.stdout + result.stderr
        facts = json.loads(result.stdout)["facts"]
        assert facts["fill"]["free_before"] == 512 * MiB
        assert read_snapshot(region).devices[0].used_bytes == 512 * MiB
        listed = run([sys.executable, "-c", NVML_PIDS], sim_env).stdout.split()
        assert listed and not set(map(int, listed)) & set(facts["pids"])
    finally:
        release.touch()
        holder.wait(timeout=60)


NVML_PIDS = """
import pynvml
pynvml.nvmlInit()
handle = pynvml.nvmlDeviceGetHandleByIndex(0)
print(*[p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)])
"""


@pytest.mark.parametrize("args, message", [
    (["--memory", "lots"], "--memory"),
    (["--cores", "300"], "--cores"),
    (["--device", "99"], "--device"),
])
def test_bad_input_is_one_line(sim_env, args, message):
    result = verify(sim_env, *args)
    assert result.returncode == 2
    assert result.stdout == "" and len(result.stderr.splitlines()) == 1
    assert message in result.stderr


def test_spin_kernel_compiles_for_current_gpus():
    """The PTX the probe hands the driver compiles for Turing to Blackwell
    (nvJitLink does what cuModuleLoadData does in the driver)."""
    nvjitlink = pytest.importorskip("cuda.bindings.nvjitlink",
                                    reason="cuda-bindings is a test dependency")
    ptx = resources.files("vgpulimit").joinpath("spin.ptx").read_bytes()
    for arch in ("sm_75", "sm_80", "sm_90", "sm_100"):
        handle = nvjitlink.create(1, [f"-arch={arch}"])
        try:
            nvjitlink.add_data(handle, nvjitlink.InputType.PTX, ptx, len(ptx), "spin.ptx")
            nvjitlink.complete(handle)
            assert nvjitlink.get_linked_cubin_size(handle) > 0
        finally:
            nvjitlink.destroy(handle)


def test_the_readiness_probe_runs_verify_in_a_capped_pod():
    yaml = pytest.importorskip("yaml", reason="PyYAML is a test dependency")
    import vgpulimit
    from vgpulimit.cli import _build_parser
    from vgpulimit.oci import CORES_ANNOTATION, MEMORY_ANNOTATION

    pod = yaml.safe_load((TESTS.parent / "deploy" / "verify-pod.yaml").read_text())
    assert {MEMORY_ANNOTATION, CORES_ANNOTATION} <= pod["metadata"]["annotations"].keys()
    [container] = pod["spec"]["containers"]
    command = container["readinessProbe"]["exec"]["command"]
    python = f"/opt/vgpulimit/{vgpulimit.__version__}/bin/python"
    assert command[:3] == [python, "-m", "vgpulimit"]
    args = _build_parser().parse_args(command[3:])
    # No --memory or --cores: where the hook did not set limits up, verify must
    # fail, not check a fresh region of its own.  --no-alloc: a probe beside the
    # workload must not fill the memory under the cap the workload allocates in.
    assert (args.action, args.no_alloc, args.json, args.memory, args.cores) == \
        ("verify", True, True, None, None)
    [mount] = container["volumeMounts"]
    [volume] = pod["spec"]["volumes"]
    assert python.startswith(mount["mountPath"] + "/") and mount["readOnly"]
    assert volume["hostPath"]["path"] == mount["mountPath"]


def test_an_allocation_past_the_cap_that_succeeds_fails():
    """What verify says when a driver (or a shim) lets an allocation through
    past the cap: judged from the facts a probe would report."""
    from vgpulimit import verify as v

    facts = {"pids": [1], "shim": {"loaded": True, "path": "/x/libvgpulimit.so",
                                   "via": ["LD_PRELOAD"]},
             "cap_bytes": 1 << 30,
             "fill": {"chunk_bytes": 128 * MiB, "free_before": 1 << 30, "filled_bytes": 1 << 30,
                      "past_cap": "CUDA_SUCCESS",
                      "meminfo_after": {"free": 1 << 30, "total": 1 << 30}}}
    report = v.Report("here", 0, facts=facts)
    config = v.read_configuration({"VGPULIMIT_MEMORY": "1GiB"})
    v.judge(report, config, None, None, None)
    assert not report.ok
    assert [c.message for c in report.checks if c.status == "fail"] == [
        ("an allocation past the cap succeeded: 1 GiB held, 128 MiB more granted over a cap "
         "of 1 GiB")]


def test_no_alloc_allocates_nothing_beyond_the_context(sim_env, schema):
    """`verify --no-alloc` (the readiness probe's mode) checks the shim, the
    limits and the capped views and allocates nothing: the region and NVML
    count the probe's context (300 MiB here) and no more, and no fill, cost or
    share ran."""
    context = 300 * MiB
    env = dict(sim_env, SIMGPU_CONTEXT_OVERHEAD=str(context))
    result = verify(env, "--no-alloc", "--json",
                    under=under_run("--memory", "1GiB", "--cores", "30"))
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads(result.stdout)
    schema.validate(document)
    facts, found = document["facts"], statuses(result)
    assert not {"fill", "costs", "share"} & facts.keys()
    assert document["baseline"] == {"error": "not measured (--no-alloc)"}
    assert found["past the cap"] == ["skip"] and found["compute share"] == ["skip"]
    assert found["allocated nothing"] == ["pass"]
    for name in ("shim", "cuMemGetInfo", "cuDeviceTotalMem", "nvmlDeviceGetMemoryInfo_v2"):
        assert found[name] == ["pass"], name
    # The region counted the context once it was made, NVML lists the probe at
    # its end with that and no more, and cuMemGetInfo's free figure is the cap
    # less the context from start to end.
    assert facts["region"]["used_bytes"] == context
    [mine] = [p for p in facts["nvml"]["processes"] if p["pid"] in facts["pids"]]
    assert mine["used_bytes"] == context
    assert facts["meminfo_after"] == facts["cuda"]["mem_get_info"] == \
        {"total": 1 << 30, "free": (1 << 30) - context}


def test_an_nvml_without_the_mig_calls_reads_as_not_supported(sim_env, simgpu_dir, tmp_path):
    """Issue 39: on a driver whose NVML lacks functions -- the MIG calls,
    which came with R450; minimal or vendor NVMLs lack others -- verify,
    status --all, top and the metrics run and read what is missing as not
    supported (no MIG here), as nvidia-ml-py does: no traceback, no FAIL."""
    from containers import container
    from test_node_view import gpu_series, node_json, serve_metrics

    no_mig = simgpu_dir / "no-mig"
    env = dict(sim_env, SIMGPU_KERNEL_US=SPIN_US, LD_LIBRARY_PATH=f"{no_mig}{os.pathsep}{simgpu_dir}")
    asks = ("import ctypes; nvml = ctypes.CDLL('libnvidia-ml.so.1'); print([hasattr(nvml, f) for f in "
            "('nvmlDeviceIsMigDeviceHandle', 'nvmlDeviceGetMigMode', 'nvmlDeviceGetMemoryInfo')])")
    lacks = run([sys.executable, "-c", asks], env)
    assert lacks.stdout.strip() == "[False, False, True]"
    checked = verify(env, under=vgpulimit_cmd("run", "--memory", "1GiB", "--"))
    assert (checked.returncode, failures(checked)) == (0, []), checked.stdout + checked.stderr
    assert "Traceback" not in checked.stderr
    assert "PASS nvmlDeviceGetMemoryInfo_v2: total 1 GiB = the cap" in checked.stdout
    node = tmp_path / "node"
    with container(sim_env, node / "a" / "region", ["--memory", "4GiB"], [(256 * MiB, 1)]):
        [gpu] = node_json(env, node)["gpus"]
        shown = run(vgpulimit_cmd("status", "--all", node, "--interval", "0"), env)
        once = run(vgpulimit_cmd("top", "-1", "--all", node), dict(env, COLUMNS="100"))
        [samples], log = serve_metrics(env, node)
    assert (gpu["used_bytes"], gpu["regions_used_bytes"]) == (256 * MiB, 256 * MiB)
    for out in (shown, once):
        assert "Traceback" not in out.stderr and "MIG" not in out.stdout, out.stdout + out.stderr
    assert "Traceback" not in log
    assert gpu_series(samples, "vgpulimit_gpu_memory_used_bytes") == [256 * MiB]

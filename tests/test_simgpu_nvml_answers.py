"""SIMGPU_NVML_ANSWER: any NVML function simgpu exports gives any answer the
real NVML may give, call after call, so that tests can drive NVML's callers
through answers no simulated GPU would give on its own. A scripted answer
writes nothing (but the count of INSUFFICIENT_SIZE=N), so a caller that reads
what it was not promised reads its own leftovers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import TESTS, run

CLIENTS = TESTS / "clients"
GPU_IS_LOST, NOT_FOUND, INSUFFICIENT_SIZE = 15, 6, 7
# The functions with a count out-argument that NVML's size protocol sets.
COUNTED = [f"nvmlDevice{kind}RunningProcesses{v}" for kind in ("GetCompute", "GetGraphics", "GetMPSCompute")
           for v in ("", "_v2", "_v3")] + ["nvmlDeviceGetProcessUtilization", "nvmlDeviceGetRunningProcessDetailList"]


def exported_nvml(simgpu_dir) -> list[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(simgpu_dir / "libnvidia-ml.so.1")],
                         capture_output=True, text=True, check=True).stdout
    return sorted(line.split()[-1] for line in out.splitlines() if line.split()[-1].startswith("nvml"))


def scripted(env, mode: str, names: list[str]) -> dict:
    return json.loads(run([sys.executable, CLIENTS / "nvml_scripted.py", mode, *names], env, timeout=60).stdout)


def test_every_exported_nvml_function_gives_a_scripted_answer_and_writes_nothing(sim_env, simgpu_dir):
    names = exported_nvml(simgpu_dir)
    # nvmlErrorString answers a string, not an nvmlReturn_t: the one that cannot be scripted.
    answering = [n for n in names if n != "nvmlErrorString"]
    assert len(answering) == len(names) - 1 and len(answering) > 50
    env = sim_env | {"SIMGPU_NVML_ANSWER": ",".join(f"{n}:GPU_IS_LOST" for n in answering)}
    seen = scripted(env, "untouched", answering)
    assert {n: a for n, a in seen.items() if a != [GPU_IS_LOST, True]} == {}


def test_insufficient_size_sets_the_count_of_every_function_that_has_one(sim_env, simgpu_dir):
    assert set(COUNTED) <= set(exported_nvml(simgpu_dir))
    env = sim_env | {"SIMGPU_NVML_ANSWER": ",".join(f"{n}:INSUFFICIENT_SIZE=72;NOT_FOUND" for n in COUNTED)}
    seen = scripted(env, "count", COUNTED)
    first = {n: calls[0] for n, calls in seen.items()}
    second = {n: calls[1] for n, calls in seen.items()}
    assert first == {n: [INSUFFICIENT_SIZE, 72] for n in COUNTED}
    # The next answer, NOT_FOUND, leaves the count as the caller gave it.
    assert second == {n: [NOT_FOUND, 5] for n in COUNTED}


def pynvml_result(env, program: str) -> subprocess.CompletedProcess:
    """Runs `program` with `call(f, *args)`, which appends f's result or the
    name of the NVMLError it raised to what is printed as JSON."""
    code = ("import json, pynvml\nseen = []\n"
            "def call(f, *a):\n"
            "    try:\n        r = f(*a)\n        seen.append(r if isinstance(r, (int, str)) else 'ok')\n"
            "    except pynvml.NVMLError as e:\n        seen.append(type(e).__name__)\n"
            + program + "\nprint(json.dumps(seen))")
    return run([sys.executable, "-c", code], env, timeout=60)


def pynvml_run(env, program: str) -> list:
    return json.loads(pynvml_result(env, program).stdout)


def test_answers_follow_the_calls_and_the_last_repeats(sim_env):
    env = sim_env | {"SIMGPU_NVML_ANSWER": "nvmlDeviceGetName:UNKNOWN;real,"
                                           "nvmlDeviceGetCount_v2:real;NOT_FOUND,"
                                           "nvmlDeviceGetUUID:999;18;NO_PERMISSION"}
    seen = pynvml_run(env, "pynvml.nvmlInit()\nh = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
                           "for _ in range(3):\n"
                           "    call(pynvml.nvmlDeviceGetName, h)\n"
                           "    call(pynvml.nvmlDeviceGetCount)\n"
                           "    call(pynvml.nvmlDeviceGetUUID, h)\n")
    name = seen[3]
    assert name.startswith("NVIDIA ")
    assert seen == ["NVMLError_Unknown", 1, "NVMLError_Unknown",
                    name, "NVMLError_NotFound", "NVMLError_LibRmVersionMismatch",
                    name, "NVMLError_NotFound", "NVMLError_NoPermission"]


def test_a_scripted_init_failure_leaves_nvml_uninitialised(sim_env):
    env = sim_env | {"SIMGPU_NVML_ANSWER": "nvmlInitWithFlags:DRIVER_NOT_LOADED;real"}
    seen = pynvml_run(env, "call(pynvml.nvmlInit)\n"
                           "call(pynvml.nvmlDeviceGetCount)\n"
                           "call(pynvml.nvmlInit)\n"
                           "call(pynvml.nvmlDeviceGetCount)\n")
    assert seen == ["NVMLError_DriverNotLoaded", "NVMLError_Uninitialized", "ok", 1]


@pytest.mark.parametrize("value, why", [
    ("nvmlDeviceGetNmae:NOT_FOUND", "not an NVML function"),
    ("nvmlErrorString:NOT_FOUND", "not an NVML function"),
    ("nvmlDeviceGetName", "no ':'"),
    ("nvmlDeviceGetName:NOT_FOUNDX", "not an answer"),
    ("nvmlDeviceGetName:NVML_ERROR_NOT_FOUND", "not an answer"),
    ("nvmlDeviceGetName:", "not an answer"),
    ("nvmlDeviceGetName:real;", "not an answer"),
    ("nvmlDeviceGetName:-1", "not an answer"),
    ("nvmlDeviceGetName:INSUFFICIENT_SIZE=3", "no count"),
    ("nvmlDeviceGetComputeRunningProcesses_v3:NOT_FOUND=3", "only INSUFFICIENT_SIZE"),
    ("nvmlDeviceGetComputeRunningProcesses_v3:INSUFFICIENT_SIZE=x", "not a count"),
    ("nvmlDeviceGetName:real,nvmlDeviceGetName:UNKNOWN", "named twice"),
    ("nvmlDeviceGetName:" + ";".join(["UNKNOWN"] * 17), "more than 16"),
    ("nvmlDeviceGetName:real,", "no ':'"),
])
def test_a_bad_script_fails_nvml_init_with_one_line(sim_env, value, why):
    result = pynvml_result(sim_env | {"SIMGPU_NVML_ANSWER": value}, "call(pynvml.nvmlInit)")
    assert json.loads(result.stdout) == ["NVMLError_Unknown"]
    [line] = result.stderr.splitlines()
    assert line.startswith("simgpu: SIMGPU_NVML_ANSWER: ") and why in line
    assert "FUNCTION:ANSWER[;ANSWER...]" in line

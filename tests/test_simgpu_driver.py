"""simgpu's libcuda.so.1 as a CUDA program meets it: cuda-bindings end to end
(with and without the per-thread default stream), the calls a C program makes
that cuda-bindings does not (through ctypes), and its configuration. Every
client runs in a child process on the test's own simulated GPU."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest
from conftest import TESTS, GiB, MiB, run

CLIENTS = TESTS / "clients"
PER_THREAD_ENV = {"default-stream": {},
                  "per-thread": {"CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM": "1"}}


def end_to_end(env, tmp_path):
    data = os.urandom(1 * MiB)
    (tmp_path / "data.bin").write_bytes(data)
    result = run([sys.executable, CLIENTS / "cuda_end_to_end.py", tmp_path / "data.bin", tmp_path],
                 env, timeout=60)
    return json.loads(result.stdout), data, result.stderr


@pytest.mark.parametrize("stream", PER_THREAD_ENV)
def test_cuda_bindings_end_to_end(sim_env, tmp_path, stream):
    report, data, _ = end_to_end(sim_env | PER_THREAD_ENV[stream], tmp_path)
    # The device.
    assert report["driver_version"] == 13000
    assert report["count"] == 1
    assert report["name"].startswith("NVIDIA ")
    assert len(bytes.fromhex(report["uuid"])) == 16 and report["uuid"] != "00" * 16
    assert report["total_mem"] == report["meminfo_total"] == 16 * GiB
    assert report["cc_major"] == 9  # an H100
    # Memory needs a context; the primary context is on device 0.
    assert report["alloc_without_context"] == "CUDA_ERROR_INVALID_CONTEXT"
    assert report["context_device"] == 0
    assert report["alloc_taken"] == report["alloc_bytes"]
    # Real bytes make the round trip, through both ends of the allocation.
    assert (tmp_path / "near.bin").read_bytes() == data
    assert (tmp_path / "far.bin").read_bytes() == data
    assert report["copy_past_end"] == "CUDA_ERROR_INVALID_VALUE"
    assert report["memset_head"] == "ab" * 16 + "04030201" * 4
    # Pitch: rows of 1000 bytes padded to a multiple of 512; all of it is charged.
    assert report["pitch"] >= 1000 and report["pitch"] % 512 == 0
    assert report["pitch_taken"] == report["pitch"] * 10
    assert report["pitch_bad_element_size"] == "CUDA_ERROR_INVALID_VALUE"
    assert report["launch_empty_grid"] == "CUDA_ERROR_INVALID_VALUE"
    # Freed memory comes back; a second free and more than the device are refused.
    assert report["double_free"] == "CUDA_ERROR_INVALID_VALUE"
    assert report["free_at_end"] == report["free_at_start"]
    assert report["alloc_more_than_device"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert report["oom_name"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert report["oom_string"] == "out of memory"
    # A created context is pushed and is popped by its destruction.
    assert report["created"] not in (0, report["primary"])
    assert report["current_after_create"] == report["created"]
    assert report["current_after_destroy"] == report["primary"]


# Every driver function cuda_end_to_end.py calls.
CALLED = {
    "cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetName",
    "cuDeviceGetUuid", "cuDeviceTotalMem", "cuDeviceGetAttribute", "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease", "cuCtxSetCurrent", "cuCtxGetCurrent", "cuCtxGetDevice",
    "cuCtxSynchronize", "cuCtxCreate", "cuCtxDestroy", "cuMemGetInfo", "cuMemAlloc",
    "cuMemAllocPitch", "cuMemFree", "cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemcpyDtoD", "cuMemsetD8",
    "cuMemsetD32", "cuModuleLoadData", "cuModuleGetFunction", "cuModuleUnload", "cuLaunchKernel",
    "cuStreamCreate", "cuStreamSynchronize", "cuStreamDestroy", "cuGetErrorName",
    "cuGetErrorString",
}
# Those of them that have a per-thread variant, and that variant.
PER_THREAD_VARIANTS = {
    "cuMemcpyHtoD": "cuMemcpyHtoD_v2_ptds", "cuMemcpyDtoH": "cuMemcpyDtoH_v2_ptds",
    "cuMemcpyDtoD": "cuMemcpyDtoD_v2_ptds", "cuMemsetD8": "cuMemsetD8_v2_ptds",
    "cuMemsetD32": "cuMemsetD32_v2_ptds", "cuLaunchKernel": "cuLaunchKernel_ptsz",
    "cuStreamSynchronize": "cuStreamSynchronize_ptsz",
}
TRACE_LINE = re.compile(r'simgpu: cuGetProcAddress_v2\("([^"]*)", (\d+), (\d+)\) -> (.*)')


@pytest.mark.parametrize("stream", PER_THREAD_ENV)
def test_cuda_bindings_finds_every_call_it_makes(sim_env, tmp_path, stream):
    """SIMGPU_TRACE=1 logs each lookup: cuda-bindings asks with the flag of its
    stream mode, and gets the per-thread variants exactly in per-thread mode."""
    env = sim_env | PER_THREAD_ENV[stream] | {"SIMGPU_TRACE": "1"}
    _, _, stderr = end_to_end(env, tmp_path)
    rows = [m.groups() for m in map(TRACE_LINE.fullmatch, stderr.splitlines()) if m]
    assert len(rows) > len(CALLED)
    assert {int(flags) for _, _, flags, _ in rows} == {2 if stream == "per-thread" else 0}
    assert [row for row in rows if row[3] == "(version not sufficient)"] == []
    answers: dict[str, set[str]] = {}
    for name, _, _, answer in rows:
        if name in CALLED:
            answers.setdefault(name, set()).add(answer)
    assert set(answers) == CALLED
    assert {n: a for n, a in answers.items() if any(s.startswith("(") for s in a)} == {}
    handed_per_thread = {n: a for n, a in answers.items() if any(s.endswith(("_ptsz", "_ptds"))
                                                                 for s in a)}
    if stream == "per-thread":
        assert handed_per_thread == {n: {v} for n, v in PER_THREAD_VARIANTS.items()}
    else:
        assert handed_per_thread == {}


def ctypes_client(env, scenario: str) -> dict:
    result = run([sys.executable, CLIENTS / "cuda_ctypes.py", scenario], env, timeout=60)
    return json.loads(result.stdout)


def test_before_cuinit_only_the_version_answers(sim_env):
    assert ctypes_client(sim_env, "before_init") == {
        "cuDeviceGetCount": "CUDA_ERROR_NOT_INITIALIZED",
        "cuDriverGetVersion": "CUDA_SUCCESS", "version": 13000}


def test_memory_calls_need_a_context(sim_env):
    assert ctypes_client(sim_env, "without_context") == {
        "cuInit": "CUDA_SUCCESS", "cuMemAlloc_v2": "CUDA_ERROR_INVALID_CONTEXT",
        "cuMemGetInfo_v2": "CUDA_ERROR_INVALID_CONTEXT"}


def test_meminfo_skips_a_null_output_and_v1_clamps_to_32_bits(sim_env):
    seen = ctypes_client(sim_env, "meminfo_outputs")
    assert seen["total_only"] == ["CUDA_SUCCESS", 16 * GiB]
    assert seen["free_only"][0] == "CUDA_SUCCESS" and 0 < seen["free_only"][1] <= 16 * GiB
    assert seen["neither"] == "CUDA_ERROR_INVALID_VALUE"
    assert seen["v1"] == ["CUDA_SUCCESS", 0xFFFFFFFF, 0xFFFFFFFF]
    assert seen["v1_total_mem"] == ["CUDA_SUCCESS", 0xFFFFFFFF]


def test_allocation_edges(sim_env):
    seen = ctypes_client(sim_env, "alloc_edges")
    src, dst = seen.pop("memcpy_data")
    assert dst == src
    assert seen == {
        "alloc_zero": "CUDA_ERROR_INVALID_VALUE", "free_null": "CUDA_SUCCESS",
        "alloc": "CUDA_SUCCESS", "free_interior": "CUDA_ERROR_INVALID_VALUE",
        "free_unknown": "CUDA_ERROR_INVALID_VALUE",
        "memset32_unaligned": "CUDA_ERROR_INVALID_VALUE",
        "memcpy_to_device": "CUDA_SUCCESS", "memcpy_to_host": "CUDA_SUCCESS",
        "free": "CUDA_SUCCESS"}


def test_v1_calls_use_32_bit_pointers(sim_env):
    seen = ctypes_client(sim_env, "v1_calls")
    assert 0 < seen.pop("ptr") < 1 << 32
    src, dst = seen.pop("data")
    assert dst == src
    assert seen == {"alloc": "CUDA_SUCCESS", "htod": "CUDA_SUCCESS", "dtoh": "CUDA_SUCCESS",
                    "pitch_alloc": "CUDA_SUCCESS", "pitch": 512,
                    "free": ["CUDA_SUCCESS", "CUDA_SUCCESS"]}


def test_a_created_context_is_a_stack_entry_that_owns_its_memory(sim_env):
    assert ctypes_client(sim_env, "created_context") == {
        "create": "CUDA_SUCCESS", "alloc": "CUDA_SUCCESS", "taken": 1 * GiB,
        "pop": "CUDA_SUCCESS", "popped_is_created": True, "current_after_pop_is_primary": True,
        "push": "CUDA_SUCCESS", "get_device": ["CUDA_SUCCESS", 0], "destroy": "CUDA_SUCCESS",
        "given_back": 1 * GiB, "current_after_destroy_is_primary": True,
        "push_destroyed": "CUDA_ERROR_INVALID_CONTEXT",
        "destroy_primary": "CUDA_ERROR_INVALID_CONTEXT"}


def test_releasing_the_primary_context_ends_it_and_frees_its_memory(sim_env):
    assert ctypes_client(sim_env, "primary_context") == {
        "get_state": "CUDA_SUCCESS", "active": 1,
        "set_flags_v1_while_active": "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
        "set_flags_v2": "CUDA_SUCCESS", "set_unknown_flags": "CUDA_ERROR_INVALID_VALUE",
        "alloc": "CUDA_SUCCESS", "release": "CUDA_SUCCESS",
        "alloc_after_release": "CUDA_ERROR_CONTEXT_IS_DESTROYED",
        "release_again": "CUDA_ERROR_INVALID_CONTEXT",
        "meminfo": "CUDA_SUCCESS", "free_total": [16 * GiB, 16 * GiB]}


def test_a_forked_child_starts_uninitialised_and_owns_nothing(sim_env):
    assert ctypes_client(sim_env, "forked_child") == {
        "parent_alloc": "CUDA_SUCCESS",
        "child": {"count": "CUDA_ERROR_NOT_INITIALIZED", "init": "CUDA_SUCCESS",
                  "free_parents": "CUDA_ERROR_INVALID_CONTEXT", "retain": "CUDA_SUCCESS",
                  "set": "CUDA_SUCCESS", "alloc": "CUDA_SUCCESS"},
        "child_exit": 0, "parent_free": "CUDA_SUCCESS"}


def test_a_new_thread_has_no_current_context(sim_env):
    assert ctypes_client(sim_env, "new_thread") == {
        "alloc_before_set": "CUDA_ERROR_INVALID_CONTEXT", "set": "CUDA_SUCCESS",
        "alloc": "CUDA_SUCCESS", "free": "CUDA_SUCCESS"}


def test_launches_are_validated(sim_env):
    assert ctypes_client(sim_env, "launches") == {
        "load": "CUDA_SUCCESS", "get": "CUDA_SUCCESS", "get_again": "CUDA_SUCCESS",
        "same_function": True, "null_function": "CUDA_ERROR_INVALID_HANDLE",
        "block_too_big": "CUDA_ERROR_INVALID_VALUE", "ptsz": "CUDA_SUCCESS",
        "load_missing_file": "CUDA_ERROR_FILE_NOT_FOUND"}


def test_error_names_of_known_and_unknown_codes(sim_env):
    assert ctypes_client(sim_env, "error_names") == {
        "known": ["CUDA_SUCCESS", "CUDA_ERROR_CONTEXT_IS_DESTROYED"],
        "unknown": ["CUDA_ERROR_INVALID_VALUE", None]}


INIT_TWICE = ("from cuda.bindings import driver as cu; "
              "print(cu.cuInit(0)[0].name, cu.cuInit(0)[0].name)")


@pytest.mark.parametrize("variable, value", [
    ("SIMGPU_MEMORY", "8GBx"), ("SIMGPU_MEMORY", "50%"), ("SIMGPU_DEVICES", "33"),
    ("SIMGPU_DEVICES", "two"), ("SIMGPU_DRIVER_VERSION", "13.0"),
])
def test_bad_configuration_is_one_line_and_an_init_error(sim_env, variable, value):
    result = run([sys.executable, "-c", INIT_TWICE], sim_env | {variable: value}, timeout=60)
    assert result.stdout.split() == ["CUDA_ERROR_INVALID_VALUE"] * 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and variable in lines[0] and value in lines[0], result.stderr


def test_a_state_file_made_for_another_configuration_is_refused(sim_env):
    assert run([sys.executable, "-c", INIT_TWICE], sim_env).stdout.split() == ["CUDA_SUCCESS"] * 2
    result = run([sys.executable, "-c", INIT_TWICE], sim_env | {"SIMGPU_MEMORY": "8GiB"})
    assert result.stdout.split() == ["CUDA_ERROR_INVALID_VALUE"] * 2
    assert "SIMGPU_MEMORY" in result.stderr

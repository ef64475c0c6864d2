"""Page-locked host memory on the simulated GPU, as a C program linked with
-lcuda and a cuda-bindings client use it, on simgpu alone and through the shim
under a 1 GiB cap: allocation, registration, device pointers (the host
pointers, under unified addressing), flags, the driver's errors for memory
registered twice or never, copies through it. Host memory is not the
device's: 2 GiB of it leave the free bytes under the cap as they were."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import C_DIR, TESTS, compile_c, run, vgpulimit_cmd

THROUGH = {
    "simgpu": [],
    "shim, 1 GiB cap": vgpulimit_cmd("run", "--simulate", "--memory", "1GiB", "--"),
}


@pytest.fixture(scope="module")
def host_memory_test(tmp_path_factory, simgpu_dir):
    out = tmp_path_factory.mktemp("host_memory")
    (out / "libcuda.so").symlink_to(simgpu_dir / "libcuda.so.1")
    return compile_c(out / "host_memory_test", [C_DIR / "host_memory_test.c"], f"-L{out}", "-lcuda")


@pytest.mark.parametrize("through", THROUGH)
def test_a_c_program_uses_pinned_host_memory(sim_env, host_memory_test, through):
    result = run([*THROUGH[through], host_memory_test], sim_env)
    assert result.stdout.strip().endswith(" 0 failed"), result.stdout + result.stderr


@pytest.mark.parametrize("through", THROUGH)
def test_cuda_bindings_uses_pinned_host_memory(sim_env, through):
    got = json.loads(run([*THROUGH[through], sys.executable, TESTS / "clients" / "host_memory.py"],
                         sim_env).stdout)
    assert got == {
        "free_unchanged_by_2GiB": True,
        "flags": 3,  # PORTABLE | DEVICEMAP, as given
        "device_pointer_is_host_pointer": True,
        "bad_flags": "CUDA_ERROR_INVALID_VALUE",
        "register": "CUDA_SUCCESS",
        "register_again": "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
        "registered_device_pointer_is_host_pointer": True,
        "registered_flags": "CUDA_ERROR_INVALID_VALUE",  # cuMemHostGetFlags: allocations only
        "unregister": "CUDA_SUCCESS",
        "unregister_again": "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
        "pageable_device_pointer": "CUDA_ERROR_INVALID_VALUE",
        "round_trip": True,
        "free_host": ["CUDA_SUCCESS", "CUDA_SUCCESS"],
        "free_twice": "CUDA_ERROR_INVALID_VALUE",
    }

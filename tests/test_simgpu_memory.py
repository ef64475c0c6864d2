"""simgpu's device-allocation families beyond cuMemAlloc, through cuda-bindings:
managed memory, stream-ordered allocation from the default pool and from pools
of one's own, virtual memory management, arrays and mipmapped arrays, graph
memory nodes. For each:
what the device's used memory grows by (cuMemGetInfo, and NVML's per-process
usage, which must agree), the refusal when the device is full, and the bytes
back on free, trim, release, unmap, destroy, or kill -9. Each test has a
simulated GPU of its own, of 1 GiB."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from conftest import TESTS, GiB, MiB, run

CLIENTS = TESTS / "clients"
OOM, INVALID = "CUDA_ERROR_OUT_OF_MEMORY", "CUDA_ERROR_INVALID_VALUE"
PER_THREAD_ENV = {
    "default-stream": {},
    "per-thread": {"CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM": "1"},
}


@pytest.fixture
def small_gpu(sim_env):
    return sim_env | {"SIMGPU_MEMORY": "1GiB"}


def family(env, name: str) -> dict:
    return json.loads(
        run([sys.executable, CLIENTS / "cuda_memory_families.py", name], env, timeout=120).stdout
    )


def used(n: int) -> dict:
    """What cuMemGetInfo and NVML's per-process usage both show in use."""
    return {"used": n, "nvml": n}


def test_managed_memory_is_charged_like_cuMemAlloc(small_gpu):
    got = family(small_gpu, "managed")
    assert got["bad_flags"] == INVALID
    assert got["allocated"] == used(100 * MiB + 1)  # the bytes asked for, as cuMemAlloc
    assert got["round_trip"] and got["host_write_seen"]
    assert got["too_much"] == OOM
    assert got["freed"] == used(0)


def pool_state(n_used, reserved, reserved_high, in_use, in_use_high):
    return used(n_used) | {
        "reserved_mem_current": reserved,
        "reserved_mem_high": reserved_high,
        "used_mem_current": in_use,
        "used_mem_high": in_use_high,
    }


@pytest.mark.parametrize("stream", PER_THREAD_ENV)
def test_the_default_pool_is_charged_what_it_reserves(small_gpu, stream):
    got = family(small_gpu | PER_THREAD_ENV[stream], "async")
    assert got["current_is_default"]
    # 1 MiB reserves a 2 MiB chunk; a second MiB fits in it; 3 MiB needs a 4 MiB chunk.
    assert got["one_mib"] == pool_state(2 * MiB, 2 * MiB, 2 * MiB, 1 * MiB, 1 * MiB)
    assert got["two_mib"] == pool_state(2 * MiB, 2 * MiB, 2 * MiB, 2 * MiB, 2 * MiB)
    assert got["five_mib"] == pool_state(6 * MiB, 6 * MiB, 6 * MiB, 5 * MiB, 5 * MiB)
    assert got["round_trip"]
    assert got["copy_past_end"] == INVALID
    # Freed memory stays reserved, and charged, until the pool is trimmed.
    assert got["all_freed"] == pool_state(6 * MiB, 6 * MiB, 6 * MiB, 0, 5 * MiB)
    assert got["double_free"] == INVALID
    # Trimming keeps at least what was asked: the 2 MiB chunk goes, the 4 MiB one stays.
    assert got["trimmed_to_3"] == pool_state(4 * MiB, 4 * MiB, 6 * MiB, 0, 5 * MiB)
    assert got["trimmed_to_0"] == pool_state(0, 0, 6 * MiB, 0, 5 * MiB)
    # The pool fills the device; what it holds after a free is still taken until trimmed.
    assert got["full"] == used(GiB)
    assert got["async_when_full"] == OOM
    assert got["alloc_while_reserved"] == OOM
    assert got["half_trimmed"] == used(GiB // 2)
    assert got["end"] == used(0)
    assert got["destroy_default"] == INVALID


def test_a_pool_of_ones_own(small_gpu):
    got = family(small_gpu, "pool")
    assert got["created"] == used(0)  # an empty pool reserves nothing
    assert got["first"] == pool_state(40 * MiB, 40 * MiB, 40 * MiB, 40 * MiB, 40 * MiB)
    assert got["past_max_size"] == OOM  # 40 + 30 MiB > the pool's maxSize of 64 MiB
    # Made the device's current pool, it serves cuMemAllocAsync.
    assert got["current_is_pool"]
    assert got["second"] == pool_state(50 * MiB, 50 * MiB, 50 * MiB, 50 * MiB, 50 * MiB)
    assert got["threshold"] == 32 * MiB
    assert got["set_high_nonzero"] == got["set_current"] == INVALID
    assert got["high_reset"] == {
        "reserved_mem_current": 50 * MiB,
        "reserved_mem_high": 50 * MiB,
        "used_mem_current": 40 * MiB,
        "used_mem_high": 40 * MiB,
    }
    # Destroyed with 40 MiB live: the unused 10 MiB chunk goes now, the rest at the free.
    assert got["destroyed"] == used(40 * MiB)
    assert got["current_is_default_again"]
    assert got["attr_after_destroy"] == INVALID
    assert got["last_freed"] == used(0)
    assert got["bad_device"] == "CUDA_ERROR_INVALID_DEVICE"


def graph_pool_state(n_used, reserved, in_use, in_use_high):
    """The graph pool of a walk whose reserve never passes 4 MiB."""
    return pool_state(n_used, reserved, 4 * MiB, in_use, in_use_high)


def test_graph_memory_is_charged_what_the_graph_pool_reserves(small_gpu):
    got = family(small_gpu, "graph")
    assert got["address_fixed"]  # an alloc node's address is known when it is made
    assert got["created"] == pool_state(0, 0, 0, 0, 0)
    # A launch takes 3 MiB in a 4 MiB reserve; its free node gives them back to the pool.
    assert got["launched"] == got["relaunched"] == graph_pool_state(4 * MiB, 4 * MiB, 0, 4 * MiB)
    # The next graph's allocation fits in that reserve, and outlives its launch.
    assert got["kept"] == graph_pool_state(4 * MiB, 4 * MiB, 4 * MiB, 4 * MiB)
    assert got["round_trip"]
    assert got["relaunch_while_live"] == INVALID
    assert got["freed"] == graph_pool_state(4 * MiB, 4 * MiB, 0, 4 * MiB)  # held until trimmed
    assert got["double_free"] == got["free_node_of_other"] == INVALID
    assert got["too_much"] == OOM
    assert got["trimmed"] == graph_pool_state(0, 0, 0, 4 * MiB)
    assert got["set_high_nonzero"] == INVALID
    assert got["high_reset"] == {
        "reserved_mem_current": 0,
        "reserved_mem_high": 0,
        "used_mem_current": 0,
        "used_mem_high": 0,
    }


def test_virtual_memory_is_charged_until_released_and_unmapped(small_gpu):
    got = family(small_gpu, "vmm")
    assert got["granularity"] == [2 * MiB, 2 * MiB]
    assert got["unaligned_size"] == INVALID  # not a multiple of the granularity
    assert got["created"] == used(4 * MiB)
    assert got["props"] == ["CU_MEM_ALLOCATION_TYPE_PINNED", "CU_MEM_LOCATION_TYPE_DEVICE", 0]
    assert got["reserved"] == used(4 * MiB)  # address space costs nothing
    assert got["reservation_aligned"]
    assert got["copy_before_access"] == INVALID
    assert got["round_trip"] and got["aliased"]
    assert got["mapped_twice"] == used(4 * MiB)  # a mapping is not an allocation
    assert got["free_a_mapping"] == got["unmap_part"] == got["address_free_while_mapped"] == INVALID
    assert got["released"] == used(4 * MiB)  # still mapped
    assert got["release_again"] == INVALID
    assert got["one_unmapped"] == used(4 * MiB)
    assert got["unmapped"] == used(0)
    assert got["copy_after_unmap"] == INVALID
    assert got["full"] == used(GiB)
    assert got["create_when_full"] == OOM
    assert got["end"] == used(0)


def test_arrays_are_charged_by_simgpus_rule(small_gpu):
    got = family(small_gpu, "arrays")
    # 1000 float4 = 16000 bytes a row, padded to 16384; 1000 rows; rounded up to 2 MiB.
    assert got["2d"] == used(16 * MiB)
    assert got["2d_descriptor"] == [1000, 1000, "CU_AD_FORMAT_FLOAT", 4]
    assert got["2d_requirements"] == INVALID  # cuda.h: only for CUDA_ARRAY3D_DEFERRED_MAPPING
    assert got["2d_destroyed"] == used(0)
    assert got["destroy_again"] == "CUDA_ERROR_INVALID_HANDLE"
    assert got["1d"] == used(2 * MiB)  # 100 bytes: one padded row, rounded up
    assert got["3d"] == used(32 * MiB)  # 256 x 256 rows of 256 bytes padded to 512
    assert got["3d_descriptor"] == [256, 256, 256, 0]
    # Deferred mapping: no memory of its own, and the size it would need.
    assert got["deferred"] == used(0)
    assert got["deferred_requirements"] == [16 * MiB, 2 * MiB]
    assert got["bad_cubemap"] == got["three_channels"] == INVALID
    assert got["too_big"] == OOM
    # 11 levels of 1024x1024 floats: 4 MiB + 1 MiB + ... + 512 B = 5,635,584 B, rounded up.
    assert got["too_many_levels"] == INVALID
    assert got["mipmapped"] == used(6 * MiB)
    assert got["levels"] == [[1024, 1024], [1, 1]]
    assert got["level_past_end"] == INVALID
    assert got["mipmapped_requirements"] == INVALID
    assert got["mipmapped_destroyed"] == used(0)
    # An array goes with the context it was made in.
    assert got["in_context"] == used(16 * MiB)
    assert got["context_destroyed"] == used(0)


def test_every_family_comes_back_when_its_holder_is_killed(small_gpu, tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            str(CLIENTS / "cuda_memory_families.py"),
            "all",
            "--hold",
            str(tmp_path / "never"),
        ],
        env=small_gpu,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = holder.stdout.readline()
        assert line, f"the holder exited {holder.wait(timeout=30)} before reporting"
        assert json.loads(line)["held"] == used(4 * 64 * MiB)  # managed, pool, VMM, array
        fill = [sys.executable, CLIENTS / "cuda_fill.py", 1, 0]
        assert json.loads(run(fill, small_gpu).stdout)["before"]["free"] == GiB - 4 * 64 * MiB
        holder.send_signal(signal.SIGKILL)
        assert holder.wait(timeout=30) == -signal.SIGKILL
        assert json.loads(run(fill, small_gpu).stdout)["before"]["free"] == GiB
    finally:
        holder.kill()
        holder.wait(timeout=30)
        holder.stdout.close()


# ---- memory the driver takes on its own after the context (simgpu/modules.c) ----

RESIDENT_THREADS = 132 * 2048  # the default board's SMs times threads per SM


def driver_memory(env, *steps: str) -> dict:
    out = run([sys.executable, CLIENTS / "driver_memory.py", *steps], env, timeout=120).stdout
    return {line["step"]: line for line in map(json.loads, out.splitlines())}


def test_module_code_loads_at_a_kernels_first_run_in_whole_granules(sim_env):
    """CUDA_MODULE_LOADING=LAZY, the driver's default: nothing at load; the
    module's code at its first kernel's first run, the context's code one pool
    in 2 MiB granules (a default module's 64 KiB shares the first's last
    granule until it spills), back at unload. NVML and cuMemGetInfo agree."""
    seen = driver_memory(sim_env, "alloc:1048576", "load:40MiB", "launch:fill", "launch:fill_us5", "load:-",
                         "launch:k", "unload")
    assert [seen[s]["nvml"] for s in seen] == [1 * MiB, 1 * MiB, 41 * MiB, 41 * MiB, 41 * MiB, 43 * MiB, 41 * MiB]
    assert all(s["result"] == "CUDA_SUCCESS" for s in seen.values())
    assert all(s["free"] == 16 * GiB - s["nvml"] for s in seen.values())


def test_eager_loading_takes_the_code_when_the_module_loads(sim_env):
    seen = driver_memory(sim_env | {"CUDA_MODULE_LOADING": "EAGER"}, "load:40MiB", "launch:fill", "library:3MiB",
                         "launch:k")
    assert [s["nvml"] for s in seen.values()] == [40 * MiB, 40 * MiB, 44 * MiB, 44 * MiB]


def test_local_memory_grows_to_the_kernels_need_and_stays_until_the_context_goes(sim_env):
    """A kernel needing N bytes of local memory per thread grows the
    context's pool to N times the threads the device holds at once."""
    seen = driver_memory(sim_env, "load:0", "local:fill_local256_us5", "launch:fill_local256_us5",
                         "launch:small_local128", "launch:big_local512", "launch:none", "release")
    assert seen["local:fill_local256_us5"]["result"] == 256
    pool = [seen[s]["nvml"] for s in ("launch:fill_local256_us5", "launch:small_local128", "launch:big_local512",
                                      "launch:none")]
    assert pool == [256 * RESIDENT_THREADS, 256 * RESIDENT_THREADS, 512 * RESIDENT_THREADS, 512 * RESIDENT_THREADS]
    # A fresh context in its place has none of it.
    assert seen["release"]["nvml"] == 0 and seen["release"]["free"] == 16 * GiB


def test_a_launch_the_device_has_no_room_for_fails_out_of_memory(sim_env):
    env = sim_env | {"SIMGPU_MEMORY": "1GiB"}
    seen = driver_memory(env, f"alloc:{1000 * MiB}", "load:40MiB", "launch:fill", "load:0", "launch:fill_local256")
    assert seen["launch:fill"]["result"] == seen["launch:fill_local256"]["result"] == "CUDA_ERROR_OUT_OF_MEMORY"
    assert seen["launch:fill_local256"]["nvml"] == 1000 * MiB


def test_the_driver_memory_goes_with_the_process(sim_env):
    driver_memory(sim_env, "load:40MiB", "launch:fill_local256")
    after = json.loads(run([sys.executable, CLIENTS / "nvml_memory.py"], sim_env, timeout=60).stdout)
    assert after["v2"]["used"] == 0


def test_a_bad_code_declaration_is_a_bad_image(sim_env):
    seen = driver_memory(sim_env, "load:40XB", "library:-1")
    assert [s["result"] for s in seen.values()] == ["CUDA_ERROR_INVALID_IMAGE"] * 2

"""Every device-allocation family counts against the cap, through cuda-bindings:
refused at the cap, and its bytes back when it is freed, released, trimmed or
destroyed — the way the driver itself gives the memory back."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import TESTS, GiB, MiB, run, vgpulimit_cmd

OOM = "CUDA_ERROR_OUT_OF_MEMORY"
OK = "CUDA_SUCCESS"


def run_families(sim_env, family, block=256 * MiB, count=5, cap="1GiB", device=0):
    cmd = vgpulimit_cmd("run", "--simulate", "--memory", cap, "--",
                        sys.executable, TESTS / "clients" / "families.py", family, str(block),
                        str(count), str(device))
    return run(cmd, sim_env)


def families(sim_env, family, **kwargs):
    return json.loads(run_families(sim_env, family, **kwargs).stdout)


@pytest.mark.parametrize("mode", ["dlsym", "procaddr"])
def test_cuda_2_arrays_with_32_bit_sizes_are_charged(sim_env, cbin, mode):
    """cuArrayCreate and cuArray3DCreate of CUDA 2.x are still exported and
    still handed out for version 2000: an array past the cap is refused by
    either, one under it is charged."""
    def arrays(side: int) -> dict[str, list[str]]:
        cmd = vgpulimit_cmd("run", "--simulate", "--memory", "1GiB", "--",
                            cbin / "legacy_arrays", mode, str(side), str(side))
        return {line.split()[0]: line.split()[1:] for line in run(cmd, sim_env).stdout.splitlines()}

    big = arrays(9000)     # 9000 x 9000 float4: 1.2 GiB before any padding
    assert (big["array2d"], big["array3d"]) == (["2"], ["2"])  # CUDA_ERROR_OUT_OF_MEMORY
    small = arrays(1024)   # 16 MiB each
    assert (small["array2d"], small["array3d"]) == (["0"], ["0"])
    free, total = map(int, small["meminfo"])
    assert total == GiB and total - free >= 32 * MiB


def test_managed_memory(sim_env):
    got = families(sim_env, "managed")
    assert got["results"] == [OK] * 4 + [OOM]
    assert (got["start"], got["filled"], got["freed"]) == (GiB, 0, GiB)


@pytest.mark.parametrize("family", ["async", "pool"])
def test_pools_are_charged_what_they_reserve(sim_env, family):
    got = families(sim_env, family)
    assert got["results"] == [OK] * 4 + [OOM]
    assert got["filled"] == 0
    # Freed into the pool, which may hold it (simgpu does, until trimmed) or
    # release it at the synchronisation (a real driver, release threshold 0).
    assert got["freed"] in (0, GiB)
    assert got["returned"] == GiB  # trimmed (and, for a pool of our own, destroyed)


def test_graph_memory_is_charged_what_the_graph_pool_reserves(sim_env):
    got = families(sim_env, "graph")
    # Relaunching a graph that frees what it allocates reuses the pool's block.
    assert got["repeated"] == [OK] * 3
    assert got["reused"] == GiB - 256 * MiB
    # That block serves the first launch below; the fifth would pass the cap.
    assert got["results"] == [OK] * 4 + [OOM]
    assert got["filled"] == 0
    assert got["freed"] == 0  # freed into the graph pool, which keeps it until trimmed
    assert got["returned"] == GiB


def test_virtual_memory_is_held_until_released_and_unmapped(sim_env):
    got = families(sim_env, "vmm")
    assert got["results"] == [OK] * 4 + [OOM]
    assert got["filled"] == 0
    assert got["freed"] == GiB - 256 * MiB  # released, but one handle is still mapped
    assert got["returned"] == GiB


@pytest.mark.parametrize("family", ["array", "mipmap"])
def test_arrays_are_charged_what_the_driver_says_they_need(sim_env, family):
    got = families(sim_env, family, block=200 * MiB, count=6)
    assert got["drop"] == got["size"] >= 200 * MiB  # padded, and for a mipmap every level
    fits = GiB // got["size"]
    assert 1 <= fits < 6
    assert got["results"] == [OK] * fits + [OOM] * (6 - fits)
    assert got["filled"] == GiB - fits * got["size"]
    assert got["freed"] == got["returned"] == GiB


@pytest.mark.parametrize("family", ["plain", "async", "pool", "graph"])
def test_a_device_past_the_sixteen_a_region_counts_is_refused(sim_env, family):
    """CUDA may see more GPUs than the 16 a region accounts for
    (VGL_MAX_DEVICES).  Under a cap, a pool allocation or a graph's alloc node
    on device 16 is refused as cuMemAlloc is there, out of memory with a line
    saying why, never handed out uncharged, while device 0 keeps its cap."""
    env = dict(sim_env, SIMGPU_DEVICES="17")
    first = families(env, family, device=0)
    assert first["results"] == [OK] * 4 + [OOM]
    assert first["returned"] == GiB
    past = run_families(env, family, device=16)
    got = json.loads(past.stdout)
    assert got["results"] == [OOM] * 5
    assert got.get("repeated", [OOM] * 3) == [OOM] * 3  # graph: launches of one that frees what it allocates
    assert got["start"] == 0  # cuMemGetInfo: nothing to allocate there
    assert "device 16 is beyond the 16 devices a region accounts for" in past.stderr

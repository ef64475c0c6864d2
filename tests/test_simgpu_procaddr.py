"""simgpu's cuGetProcAddress as the CUDA runtime and cuda-bindings meet it: the
newest variant at or below the version asked for, the per-thread variant under
the per-thread flag where one exists, NOT_FOUND with the matching status
otherwise, and pointers that are the exported functions themselves (so that a
shim can map them back). Each lookup runs in a child on the test's own GPU."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from conftest import TESTS, have

CLIENTS = TESTS / "clients"

# CUresult, CUdriverProcAddressQueryResult and cuGetProcAddress flags, from cuda.h.
SUCCESS, INVALID_VALUE, NOT_FOUND = 0, 1, 500
FOUND, SYMBOL_NOT_FOUND, VERSION_NOT_SUFFICIENT = 0, 1, 2
LEGACY_STREAM, PER_THREAD = 1, 2


def lookups(env, **query) -> dict:
    """The answers of tests/clients/procaddr.py to QUERY (see there)."""
    result = subprocess.run([sys.executable, str(CLIENTS / "procaddr.py")], env=env, check=False,
                            input=json.dumps(query), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def assert_found(env, cases):
    """Each (name, version, flags) resolves to the exported symbol named with it,
    at the address dlsym gives for that symbol."""
    answers = lookups(env, v2=[case[:3] for case in cases],
                      symbols=sorted({symbol for *_, symbol in cases}))
    got = [(a["rc"], a["status"], a["symbol"]) for a in answers["v2"]]
    assert got == [(SUCCESS, FOUND, symbol) for *_, symbol in cases]
    assert [a["pfn"] for a in answers["v2"]] == [answers["symbols"][s] for *_, s in cases]


def test_the_newest_variant_at_or_below_the_version_asked_for(sim_env):
    assert_found(sim_env, [
        ("cuMemAlloc", 2000, 0, "cuMemAlloc"),
        ("cuMemAlloc", 3010, 0, "cuMemAlloc"),
        ("cuMemAlloc", 3020, 0, "cuMemAlloc_v2"),
        ("cuMemAlloc", 13000, 0, "cuMemAlloc_v2"),
        ("cuCtxGetDevice", 12090, 0, "cuCtxGetDevice"),
        ("cuCtxGetDevice", 13000, 0, "cuCtxGetDevice_v2"),
        ("cuCtxSynchronize", 13050, 0, "cuCtxSynchronize_v2"),
        ("cuCtxCreate", 12040, 0, "cuCtxCreate_v3"),
        ("cuCtxCreate", 12050, 0, "cuCtxCreate_v4"),
        ("cuDeviceGetUuid", 11030, 0, "cuDeviceGetUuid"),
        ("cuDeviceGetUuid", 11040, 0, "cuDeviceGetUuid_v2"),
        ("cuGetProcAddress", 11030, 0, "cuGetProcAddress"),
        ("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"),
        # Without the per-thread flag, never a per-thread variant.
        ("cuLaunchKernel", 13000, 0, "cuLaunchKernel"),
        ("cuMemcpyHtoD", 13000, 0, "cuMemcpyHtoD_v2"),
    ])


def test_the_per_thread_flag_gives_ptsz_ptds_where_they_exist(sim_env):
    assert_found(sim_env, [
        ("cuLaunchKernel", 7000, PER_THREAD, "cuLaunchKernel_ptsz"),
        ("cuLaunchKernel", 6050, PER_THREAD, "cuLaunchKernel"),  # no _ptsz before CUDA 7.0
        ("cuMemcpyHtoD", 13000, PER_THREAD, "cuMemcpyHtoD_v2_ptds"),
        ("cuMemsetD8", 7000, PER_THREAD, "cuMemsetD8_v2_ptds"),
        ("cuStreamSynchronize", 13000, PER_THREAD, "cuStreamSynchronize_ptsz"),
        ("cuMemAlloc", 13000, PER_THREAD, "cuMemAlloc_v2"),  # it has none: the plain one
        ("cuLaunchKernel", 13000, LEGACY_STREAM, "cuLaunchKernel"),
        ("cuMemcpyHtoD", 13000, LEGACY_STREAM, "cuMemcpyHtoD_v2"),
    ])


def test_unknown_names_are_not_found_with_a_null_pointer(sim_env):
    # "" at version 0 is how libcudart probes the driver; a variant's own name is
    # not a base name.
    queries = [["", 0, 0], ["cuNoSuchThing", 13000, 0], ["cuMemAlloc_v2", 13000, 0]]
    answers = lookups(sim_env, v2=queries)["v2"]
    assert answers == [{"rc": NOT_FOUND, "status": SYMBOL_NOT_FOUND, "pfn": None, "symbol": None}
                       ] * len(queries)


def test_a_known_name_below_its_first_version_is_version_not_sufficient(sim_env):
    queries = [["cuGetProcAddress", 11020, 0], ["cuLaunchKernel", 3020, 0], ["cuMemAlloc", 0, 0]]
    answers = lookups(sim_env, v2=queries)["v2"]
    assert answers == [{"rc": NOT_FOUND, "status": VERSION_NOT_SUFFICIENT, "pfn": None,
                        "symbol": None}] * len(queries)


def test_unknown_flags_are_an_invalid_value(sim_env):
    answer, = lookups(sim_env, v2=[["cuMemAlloc", 13000, 4]])["v2"]
    assert answer["rc"] == INVALID_VALUE


def test_the_four_argument_entry_point_follows_the_same_rules(sim_env):
    answers = lookups(sim_env, v1=[["cuMemFree", 13000, 0], ["cuMemcpyDtoH", 13000, PER_THREAD],
                                   ["cuNoSuchThing", 13000, 0], ["cuGetProcAddress", 11020, 0]],
                      symbols=["cuMemFree_v2", "cuMemcpyDtoH_v2_ptds"])
    symbols = answers["symbols"]
    assert answers["v1"] == [
        {"rc": SUCCESS, "pfn": symbols["cuMemFree_v2"], "symbol": "cuMemFree_v2"},
        {"rc": SUCCESS, "pfn": symbols["cuMemcpyDtoH_v2_ptds"], "symbol": "cuMemcpyDtoH_v2_ptds"},
        {"rc": NOT_FOUND, "pfn": None, "symbol": None},
        {"rc": NOT_FOUND, "pfn": None, "symbol": None},
    ]


def test_a_driver_hands_out_no_variant_newer_than_itself(sim_env):
    """A 12.8 driver gives a program built for 13.0 the cuCtxGetDevice it has."""
    assert_found(dict(sim_env, SIMGPU_DRIVER_VERSION="12080"), [
        ("cuCtxGetDevice", 13000, 0, "cuCtxGetDevice"),
        ("cuCtxSynchronize", 13000, 0, "cuCtxSynchronize"),
        ("cuCtxCreate", 13000, 0, "cuCtxCreate_v4"),
    ])


def base_name(symbol: str) -> str:
    return re.fullmatch(r"(cu[A-Za-z0-9]+?)(?:_v\d+)?(?:_ptsz|_ptds)?", symbol)[1]


@pytest.mark.skipif(not have("nm"), reason="binutils (nm) is not installed")
def test_every_export_is_handed_out_under_its_own_name_and_nothing_else(sim_env, simgpu_dir):
    nm = subprocess.run(["nm", "-D", "--defined-only", str(simgpu_dir / "libcuda.so.1")],
                        capture_output=True, text=True, check=True).stdout
    exported = set(re.findall(r"^\S+ T (\S+)$", nm, flags=re.MULTILINE))
    assert {"cuInit", "cuMemAlloc_v2", "cuLaunchKernel_ptsz"} <= exported
    handed_out = lookups(sim_env, sweep=sorted({base_name(s) for s in exported}))["sweep"]
    assert {s for symbols in handed_out.values() for s in symbols} == exported
    assert {name: sorted(s for s in symbols if base_name(s) != name)
            for name, symbols in handed_out.items()} == {name: [] for name in handed_out}

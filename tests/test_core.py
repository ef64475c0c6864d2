"""The shim's C core and its ABI: built here with AddressSanitizer and UBSan,
pinned against the CUDA toolkit's headers where they exist, and seen the same
way from C and from the Python binding."""

from __future__ import annotations

import re
import subprocess

import pytest
from conftest import BASE, C_DIR, SHIM_SRC, base_env, compile_c, cuda_toolkit_include, have, run

CORE_SOURCES = [*(SHIM_SRC / name for name in ("limits.c", "region.c", "slot_owner.c", "ledger.c", "board.c", "log.c")),
                *(BASE / name for name in ("clock.c", "identity.c", "robust.c", "create.c", "number.c"))]


# The C tests of the core, one program per module tested (tests/c/*_test.c), and
# the tests each runs (each takes them by name: `PROGRAM SCRATCH_DIR [TEST...]`).
CORE_TESTS = {
    "limits_test": ("parser",),
    "region_test": ("start_time", "region_files", "broken_lock", "exec_again"),
    "ledger_test": ("racing", "death_mid_change", "stopped_mid_change", "dead_holders", "kill_storm",
                    "stuck_holder"),
    "board_test": ("board",),
}


@pytest.mark.parametrize("program", CORE_TESTS)
def test_core_under_sanitizers(tmp_path, program):
    binary = compile_c(tmp_path / program, [C_DIR / f"{program}.c", *CORE_SOURCES],
                       "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-lpthread")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    result = run([binary, scratch], base_env(ASAN_OPTIONS="detect_leaks=1"), check=False,
                 timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"^\d+ passed, 0 failed$", result.stdout, flags=re.MULTILINE), result.stdout
    assert "runtime error" not in result.stderr and "AddressSanitizer" not in result.stderr


@pytest.mark.skipif(cuda_toolkit_include() is None,
                    reason="no CUDA toolkit headers (cuda.h) to check our declarations against")
def test_declarations_match_the_toolkit(tmp_path):
    include = cuda_toolkit_include()
    compile_c(tmp_path / "check_cuda_abi", [C_DIR / "check_cuda_abi.c"], f"-I{include}")


def test_region_layout_is_pinned_and_seen_alike_from_python(tmp_path):
    from vgpulimit._core import ffi

    binary = compile_c(tmp_path / "region_layout", [C_DIR / "region_layout.c"])
    result = run([binary], base_env(), check=False)
    assert result.returncode == 0, result.stderr
    seen = 0
    for line in result.stdout.splitlines():
        expr, value = line.rsplit(" ", 1)
        if m := re.fullmatch(r"sizeof\(struct (\w+)\)", expr):
            assert ffi.sizeof(f"struct {m[1]}") == int(value), expr
        elif m := re.fullmatch(r"offsetof\(struct (\w+), (\w+)\)", expr):
            assert ffi.offsetof(f"struct {m[1]}", m[2]) == int(value), expr
        else:
            continue
        seen += 1
    assert seen >= 20


def exported(path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True,
                         text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def hooked_names() -> set[str]:
    text = (SHIM_SRC / "hooks.def").read_text()
    return set(re.findall(r"^(?:CU|NVML)_HOOK\((\w+),", text, flags=re.MULTILINE))


@pytest.mark.skipif(not have("nm"), reason="binutils (nm) is not installed")
def test_the_shim_exports_only_its_hooks_and_dlsym(shim_path):
    hooks = hooked_names()
    assert {"cuMemAlloc_v2", "cuGetProcAddress_v2", "nvmlDeviceGetMemoryInfo"} <= hooks
    assert exported(shim_path) == hooks | {"dlsym"}


@pytest.mark.skipif(not have("readelf"), reason="binutils (readelf) is not installed")
@pytest.mark.parametrize("name", ["libcuda.so.1", "libnvidia-ml.so.1"])
def test_simgpu_binds_its_own_symbols_like_a_real_driver(simgpu_dir, name):
    dynamic = subprocess.run(["readelf", "-d", str(simgpu_dir / name)], capture_output=True,
                             text=True, check=True).stdout
    assert f"Library soname: [{name}]" in dynamic
    assert "SYMBOLIC" in dynamic
    assert all(not n.startswith(("sim_", "vgl_")) for n in exported(simgpu_dir / name))


@pytest.mark.skipif(not have("nm"), reason="binutils (nm) is not installed")
@pytest.mark.parametrize("name", ["libcuda.so.1", "libnvidia-ml.so.1"])
def test_simgpu_links_the_base_and_none_of_the_shim(simgpu_dir, name):
    """The test bench shares no code with what it tests: every vgl_ function in
    simgpu is one of the neutral base's (base/base.h, base/glibc_floor.h)."""
    declared = set()
    for header in ("base.h", "glibc_floor.h"):
        declared |= set(re.findall(r"\b(vgl_\w+)\(", (BASE / header).read_text()))
    out = subprocess.run(["nm", str(simgpu_dir / name)], capture_output=True, text=True,
                         check=True).stdout
    linked = {line.split()[-1] for line in out.splitlines()
              if line.split()[-1].startswith("vgl_") and line.split()[1] in "tTdDbBrR"}
    assert "vgl_robust_lock_within" in linked   # the shared state file's lock: the base is linked
    assert linked - declared == set()


@pytest.mark.parametrize("target", ["fuzz_limits", "fuzz_region"])
def test_fuzz_targets_smoke(tmp_path, target):
    """A short, deterministic run of each fuzz target under ASan/UBSan; the
    million-input libFuzzer runs are in docs/development.md."""
    fuzz = C_DIR.parent / "fuzz"
    binary = compile_c(tmp_path / target, [fuzz / f"{target}.c", fuzz / "smoke.c", *CORE_SOURCES],
                       "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-lpthread")
    iterations = 20000 if target == "fuzz_limits" else 2000
    result = run([binary, str(iterations)], base_env(), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == f"{iterations} inputs\n"

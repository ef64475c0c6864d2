"""Shared fixtures: the installed package's native parts, C test programs built
once per session against them, an isolated simulated GPU per test, and runc;
with the helpers they are built on.  The helpers of the tests themselves (the
CLI, its one error line, status) are in helpers.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vgpulimit import _paths

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
C_DIR = TESTS / "c"
SHIM_INCLUDE = ROOT / "shim" / "include"
SHIM_SRC = ROOT / "shim" / "src"
BASE = ROOT / "base"
CC = os.environ.get("CC", "cc")
MiB = 1 << 20
GiB = 1 << 30

# With fork support on, grpcio (the CRI tests' client) restarts its poller in
# every child this process forks, and a child that closes its descriptors
# before exec can die there (grpc/grpc#43055, grpcio >= 1.80): `vgpulimit top`
# under pexpect did, after the CRI tests, in a loaded run.  No test uses gRPC
# across a fork.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")


def pytest_collection_modifyitems(items) -> None:
    """A `slow` test measures shares over seconds, on a CPU the machine shares
    (CI's two cores); it judges them in the simulated GPU's time or by ratios
    between tenants measured together, but a launch loop starved of the CPU
    for long still moves a share with no fault of vgpulimit's.  Such a test
    runs once more when it fails (pytest-rerunfailures, a test extra), and the
    summary lists it with its first failure; a defect fails it both times."""
    for item in items:
        if item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.flaky(reruns=1))


def pytest_terminal_summary(terminalreporter) -> None:
    """Every test that needed its rerun, by name, with what its first run
    failed on: a rerun must not hide a defect (pytest's -ra only counts them)."""
    reruns = terminalreporter.stats.get("rerun", [])
    if reruns:
        terminalreporter.section("tests that needed a rerun")
        for report in reruns:
            crash = getattr(report.longrepr, "reprcrash", None)
            why = crash.message.splitlines()[0] if crash and crash.message else str(report.longrepr)[-200:]
            terminalreporter.line(f"RERUN {report.nodeid}: {why[:200]}")


def compile_c(output: Path, sources: list[Path], *flags: str, cc: str = CC) -> Path:
    cmd = [cc, "-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror", "-g", "-O1",
           f"-I{SHIM_INCLUDE}", f"-I{SHIM_SRC}", f"-I{BASE}", "-o", str(output), *map(str, sources), *flags]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.fail(f"compiling {output.name} failed:\n{' '.join(cmd)}\n{result.stderr}")
    return output


@pytest.fixture(scope="session")
def shim_path() -> Path:
    return _paths.libpath()


@pytest.fixture(scope="session")
def simgpu_dir() -> Path:
    return _paths.simgpu_dir()


@pytest.fixture(scope="session")
def cbin(tmp_path_factory, simgpu_dir) -> Path:
    """The C test programs, built against the installed simulated driver."""
    out = tmp_path_factory.mktemp("cbin")
    # meson-python installs libcuda.so.1 only; a program linked -lcuda needs the
    # unversioned name at link time, as on a real system with the driver.
    (out / "libcuda.so").symlink_to(simgpu_dir / "libcuda.so.1")
    compile_c(out / "alloc_client", [C_DIR / "alloc_client.c"], f"-L{out}", "-lcuda", "-ldl")
    compile_c(out / "meminfo_null", [C_DIR / "meminfo_null.c"], f"-L{out}", "-lcuda")
    compile_c(out / "racer", [C_DIR / "racer.c"], f"-L{out}", "-lcuda")
    compile_c(out / "legacy_arrays", [C_DIR / "legacy_arrays.c"], "-ldl")
    compile_c(out / "librtld_next_base.so", [C_DIR / "rtld_next_base.c"], "-shared", "-fPIC")
    compile_c(out / "librtld_next_wrap.so", [C_DIR / "rtld_next_wrap.c"], "-shared", "-fPIC", "-ldl")
    compile_c(out / "rtld_next_main", [C_DIR / "rtld_next_main.c"], "-Wl,--no-as-needed",
              f"-L{out}", "-lrtld_next_wrap", "-lrtld_next_base", "-ldl", f"-Wl,-rpath,{out}")
    return out


@pytest.fixture(scope="session")
def launch_client(tmp_path_factory) -> Path:
    """tests/c/launch_client.c: launches kernels and reports its progress."""
    return compile_c(tmp_path_factory.mktemp("launch") / "launch_client", [C_DIR / "launch_client.c"],
                     "-ldl")


@pytest.fixture
def runc() -> str:
    """The runc that runs the tests' containers (tests/runc_bundle.py); the
    test is skipped, saying why, where it cannot."""
    from runc_bundle import RUNC, runc_unavailable

    reason = runc_unavailable()
    if reason:
        pytest.skip(reason)
    return RUNC


def base_env(**extra: str) -> dict[str, str]:
    """The test process's environment without anything of ours in it."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VGPULIMIT_", "SIMGPU_", "CUDA_DEVICE_"))
           and k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    env.update(extra)
    return env


@pytest.fixture
def sim_env(tmp_path, simgpu_dir) -> dict[str, str]:
    """An environment on a fresh simulated GPU of this test's own (16 GiB, one
    device, otherwise simgpu's default board), whose contexts cost no memory
    and whose driver keeps none for itself: each test's arithmetic is about its
    own allocations (tests of those costs set SIMGPU_CONTEXT_OVERHEAD,
    SIMGPU_RESERVED or SIMGPU_PROFILE). Its runtime directory exists, as a
    login manager makes it."""
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    return base_env(SIMGPU_STATE=str(tmp_path / "simgpu.state"), SIMGPU_MEMORY="16GiB",
                    SIMGPU_CONTEXT_OVERHEAD="0", SIMGPU_RESERVED="0",
                    LD_LIBRARY_PATH=str(simgpu_dir), XDG_RUNTIME_DIR=str(runtime))


def vgpulimit_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "vgpulimit", *args]


def run(cmd, env, timeout=120, check=True) -> subprocess.CompletedProcess:
    result = subprocess.run(list(map(str, cmd)), env=env, capture_output=True, text=True,
                            timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"{cmd} exited {result.returncode}\n"
                             f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}")
    return result


def cuda_toolkit_include() -> Path | None:
    for candidate in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if candidate and (Path(candidate) / "include" / "cuda.h").is_file():
            return Path(candidate) / "include"
    return None


def have(tool: str) -> bool:
    return shutil.which(tool) is not None


def real_gpu_missing() -> str | None:
    """Why there is no real GPU here, or None when there is one."""
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi: no NVIDIA driver on this machine"
    result = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    if result.returncode != 0 or "GPU" not in result.stdout:
        return "nvidia-smi lists no GPU"
    return None

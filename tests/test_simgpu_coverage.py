"""The coverage table in docs/simulated-gpu.md ("What the simulated GPU implements") is
generated from simgpu's export tables (simgpu/driver_api.def, and nvml_api.def for NVML) and the
toolkit's list of entry points, checked in (simgpu/driver_api_reference.tsv):
it is current, every exported row is a variant the toolkit has, and the
reference is what the toolkit's headers say where they are installed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from conftest import ROOT, cuda_toolkit_include

SCRIPT = ROOT / "simgpu" / "api_coverage.py"


def coverage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, check=False,
                          timeout=60)


def test_the_table_in_the_readme_is_current():
    result = coverage("check")
    assert result.returncode == 0, result.stderr


def test_the_table_counts_what_simgpu_exports():
    table = coverage("table").stdout
    pinned = next(line for line in table.splitlines() if line.startswith("| Memory Management |"))
    implemented = pinned.split(" | ")[2]
    assert "`cuMemHostAlloc`" in implemented and "`cuMemcpyHtoDAsync`" in implemented
    assert "`cuMemHostRegister`: `CU_MEMHOSTREGISTER_IOMEMORY`" in pinned
    assert all(f"`{name}`" in implemented for name in (
        "cuIpcGetMemHandle", "cuIpcOpenMemHandle", "cuIpcCloseMemHandle", "cuIpcGetEventHandle",
        "cuIpcOpenEventHandle"))


def test_the_table_counts_the_sharing_paths():
    """What frameworks share memory between processes with (docs/memory.md, "Framework paths")."""
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")
            for line in coverage("table").stdout.splitlines() if line.startswith("| ")}
    vmm, pools = rows["Virtual Memory Management"], rows["Stream Ordered Memory Allocator"]
    assert "`cuMemExportToShareableHandle`" in vmm[2] and "`cuMemImportFromShareableHandle`" in vmm[2]
    assert "host locations" not in vmm[3].split(";")[0]  # cuMemCreate takes them
    assert all(f"`{name}`" in pools[2] for name in (
        "cuMemPoolExportToShareableHandle", "cuMemPoolImportFromShareableHandle", "cuMemPoolExportPointer",
        "cuMemPoolImportPointer"))


def test_the_table_lists_simgpus_nvml_by_the_file_that_answers_it():
    table = coverage("table").stdout
    mig = next(line for line in table.splitlines() if line.startswith("| `nvml_mig.c`:"))
    assert "`nvmlDeviceGetMigDeviceHandleByIndex`" in mig and "`nvmlDeviceGetGpuInstanceProfileInfoV`" in mig
    assert "`nvmlDeviceGetMemoryInfo_v2`" not in mig


def test_a_stale_table_is_found(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("simgpu_api_coverage", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    readme = tmp_path / "simulated-gpu.md"
    readme.write_text((ROOT / "docs" / "simulated-gpu.md").read_text().replace("`cuMemHostAlloc`, ", ""))
    monkeypatch.setattr(module, "README", readme)
    assert module.main(["api_coverage.py", "check"]) == 1
    assert module.main(["api_coverage.py", "write"]) == 0
    assert module.main(["api_coverage.py", "check"]) == 0


@pytest.mark.skipif(cuda_toolkit_include() is None, reason="no CUDA toolkit headers (cuda.h) here")
def test_the_reference_is_the_toolkits():
    include = cuda_toolkit_include()
    if not (include / "cudaTypedefs.h").is_file():
        pytest.skip(f"{include} has no cudaTypedefs.h")
    made = coverage("reference", str(include)).stdout
    checked_in = (ROOT / "simgpu" / "driver_api_reference.tsv").read_text()
    if "13000" not in (include / "cuda.h").read_text().split("#define CUDA_VERSION ", 1)[1][:6]:
        pytest.skip("the reference is CUDA 13.0's; these headers are another version's")
    assert made == checked_in

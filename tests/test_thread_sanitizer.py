"""The shim and the simulated driver built with ThreadSanitizer (meson's
b_sanitize=thread), driven by threads that allocate and free every family
at once under a cap: no data race reported, and the ledger exact after.

(The C core's own tests, tests/c/{limits,region,ledger,board}_test.c, kill
processes that hold a robust process-shared mutex, which ThreadSanitizer does
not model; they run under AddressSanitizer and UBSan in test_core.py.)"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import C_DIR, base_env, compile_c
from helpers import sanitized_build

from vgpulimit.region import Region, read_snapshot

pytestmark = pytest.mark.skipif(
    shutil.which("meson") is None or shutil.which("ninja") is None,
    reason="meson and ninja are needed to build the sanitized tree (pip install meson ninja)")

FAMILIES = ["pointer", "pitch", "managed", "array", "mipmap", "vmm", "pool", "graph"]


def runtime() -> str:
    return subprocess.run(["cc", "-print-file-name=libtsan.so"], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture(scope="module")
def tsan(tmp_path_factory) -> dict[str, Path]:
    if not Path(runtime()).is_absolute():
        pytest.skip("the compiler has no ThreadSanitizer runtime (libtsan)")
    build = tmp_path_factory.mktemp("tsan-build")
    bin_dir = sanitized_build(build, "thread")
    compile_c(bin_dir / "thread_churn", [C_DIR / "thread_churn.c"], "-fsanitize=thread", f"-L{bin_dir}",
              "-lcuda", "-lpthread")
    return {"build": build, "bin": bin_dir}


@pytest.mark.parametrize("family", FAMILIES)
def test_threads_churning_every_family_race_on_nothing(tsan, tmp_path, family):
    # The runtime first: it must be up before the shim's constructor runs.
    env = base_env(LD_PRELOAD=f"{runtime()} {tsan['build'] / 'shim' / 'libvgpulimit.so'}",
                   LD_LIBRARY_PATH=str(tsan["build"] / "simgpu"), SIMGPU_STATE=str(tmp_path / "simgpu.state"),
                   SIMGPU_MEMORY="16GiB", SIMGPU_CONTEXT_OVERHEAD="0", SIMGPU_RESERVED="0",
                   VGPULIMIT_MEMORY="1GiB", CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp_path / "region"),
                   TSAN_OPTIONS="halt_on_error=1 exitcode=66")
    result = subprocess.run([str(tsan["bin"] / "thread_churn"), family, "8", "100", "8"], env=env,
                            input="\n\n", capture_output=True, text=True, timeout=600, check=False)
    assert "ThreadSanitizer" not in result.stderr, result.stderr[-6000:]
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == f"filled {1 << 30}\nfreed\n"


def test_threads_borrowing_past_a_request_race_on_nothing(tsan, tmp_path):
    """The same churn in a container with a row for elastic memory and a
    request below what the threads hold: every allocation past it looks at
    the board and the beacons, every free wakes waiters."""
    from test_sanitized import elastic_region

    region = elastic_region(tmp_path, "churn", "1GiB", "64MiB", "100ms")
    elastic_region(tmp_path, "neighbour", "4GiB", "4GiB")
    env = base_env(LD_PRELOAD=f"{runtime()} {tsan['build'] / 'shim' / 'libvgpulimit.so'}",
                   LD_LIBRARY_PATH=str(tsan["build"] / "simgpu"), SIMGPU_STATE=str(tmp_path / "simgpu.state"),
                   SIMGPU_MEMORY="16GiB", SIMGPU_CONTEXT_OVERHEAD="0", SIMGPU_RESERVED="0",
                   VGPULIMIT_REGION=str(region), TSAN_OPTIONS="halt_on_error=1 exitcode=66")
    result = subprocess.run([str(tsan["bin"] / "thread_churn"), "pointer", "8", "100", "8"], env=env,
                            input="\n\n", capture_output=True, text=True, timeout=600, check=False)
    assert "ThreadSanitizer" not in result.stderr, result.stderr[-6000:]
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == f"filled {1 << 30}\nfreed\n"


def priority_region(tmp_path: Path, name: str, priority: str) -> Path:
    """A region with a row of `priority` in the board beside it, as `vgpulimit run --priority` makes them."""
    from vgpulimit import board

    path, board_path = tmp_path / f"{name}.region", str(tmp_path / "priority.board")
    with Region.create(path, None, None) as region:
        row = board.join(board_path, priority, str(path))
        region.set_board_row(board_path, row.row, row.key)
    return path


def test_threads_launching_beside_a_higher_container_race_on_nothing(tsan, tmp_path, launch_client):
    """Four threads of a low container keep 20 ms of kernels queued each,
    and destroy their streams at the end, while a high one launches: every
    launch reads the beacons and the process's fence, those let go record
    it, and a stream's measurement ends before the stream does (another
    thread's recorded an event on a destroyed stream before)."""
    client = compile_c(tsan["bin"] / "thread_launch", [C_DIR / "thread_launch.c"], "-fsanitize=thread",
                       f"-L{tsan['bin']}", "-lcuda", "-lpthread")
    shared = {"LD_LIBRARY_PATH": str(tsan["build"] / "simgpu"), "SIMGPU_STATE": str(tmp_path / "simgpu.state"),
              "SIMGPU_MEMORY": "16GiB", "SIMGPU_CONTEXT_OVERHEAD": "0", "SIMGPU_RESERVED": "0",
              "TSAN_OPTIONS": "halt_on_error=1 exitcode=66"}
    preload = f"{runtime()} {tsan['build'] / 'shim' / 'libvgpulimit.so'}"
    high_region, low_region = priority_region(tmp_path, "high", "high"), priority_region(tmp_path, "low", "low")
    high = subprocess.Popen([str(launch_client), "kernel", "1000", "3"], stdout=subprocess.PIPE, text=True,
                            env=base_env(LD_PRELOAD=preload, VGPULIMIT_REGION=str(high_region), **shared))
    low = subprocess.run([str(client), "4", "1000", "20", "2"], capture_output=True, text=True, timeout=600,
                         check=False, env=base_env(LD_PRELOAD=preload, VGPULIMIT_REGION=str(low_region), **shared))
    high_out, _ = high.communicate(timeout=600)
    assert "ThreadSanitizer" not in low.stderr, low.stderr[-6000:]
    assert low.returncode == 0 and low.stdout.startswith("launched "), low.stderr[-3000:]
    assert high.returncode == 0 and "done " in high_out
    assert read_snapshot(str(low_region)).devices[0].yielded_ns > 0, "the low threads were never held back"

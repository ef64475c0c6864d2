"""Region files that a tenant truncated, grew, filled with garbage or made
read-only: no reader crashes.  The application fails closed, the supervisor
keeps supervising, and `status`, `top` and `metrics` show the broken region
as one line and every other region as before."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pexpect
import pytest
from conftest import GiB, MiB, base_env, run, vgpulimit_cmd
from helpers import status
from test_views import scrape, series

from vgpulimit.limits import parse_memory
from vgpulimit.region import REGION_BYTES, Region, ffi

TRUNCATED = f"truncated or resized region file (4096 bytes, expected {REGION_BYTES})"
GARBLED = "garbled region file"


def make_region(path: Path, used_bytes: int = 256 * MiB) -> Path:
    """A region with a 1 GiB cap on device 0 where this test process holds `used_bytes`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with Region.create(path, {0: parse_memory("1GiB")}) as region:
        assert region.reserve(region.attach(os.getpid()), 0, used_bytes, GiB)
    return path


def rewrite(path: Path, edit) -> None:
    """Changes fields of the region file through the layout cffi knows from region.h."""
    image = bytearray(path.read_bytes())
    edit(ffi.cast("struct vgl_region *", ffi.from_buffer(image)))
    path.write_bytes(image)


@pytest.fixture
def regions(tmp_path) -> tuple[Path, Path]:
    """A directory of containers: one good region, one truncated to 4096 bytes."""
    good = make_region(tmp_path / "run" / "good" / "region")
    bad = make_region(tmp_path / "run" / "bad" / "region")
    os.truncate(bad, 4096)
    return good, bad


# -- inside a container: the application and the supervisor ---------------------------------------

CLIENT = f"""
import json, os, sys
from cuda.bindings import driver as cu
cu.cuInit(0)
ctx = cu.cuDevicePrimaryCtxRetain(cu.cuDeviceGet(0)[1])[1]
cu.cuCtxSetCurrent(ctx)
err, held = cu.cuMemAlloc({256 * MiB})
print(json.dumps({{"held": int(err)}}), flush=True)
sys.stdin.readline()                     # the test truncates the region meanwhile
err, _ = cu.cuMemAlloc({64 * MiB})
print(json.dumps({{"after": int(err), "free": int(cu.cuMemFree(held)[0])}}), flush=True)
sys.exit(3)
"""


def test_truncated_under_a_running_client(sim_env, tmp_path):
    """The client's next allocation is refused (OUT_OF_MEMORY, one line), it
    does not die of SIGBUS, and the supervisor, which reclaims in the region
    until the end, exits with the client's status."""
    region = tmp_path / "region"
    proc = subprocess.Popen(
        list(map(str, vgpulimit_cmd("run", "--simulate", "--memory", "1GiB", "--region", region,
                                    "--", sys.executable, "-c", CLIENT))),
        env=sim_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        assert json.loads(proc.stdout.readline()) == {"held": 0}
        os.truncate(region, 4096)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        report = json.loads(proc.stdout.readline())
    finally:
        _, stderr = proc.communicate(timeout=60)
    assert report == {"after": 2, "free": 0}   # CUDA_ERROR_OUT_OF_MEMORY; the free still works
    assert proc.returncode == 3, stderr
    lines = stderr.splitlines()
    shim = [line for line in lines if "was truncated while in use" in line]
    assert len(shim) == 1 and "device memory allocations are refused" in shim[0], stderr
    supervisor = [line for line in lines if line.startswith("vgpulimit run:")]
    said = (f"vgpulimit run: cannot reclaim in {region}: truncated or resized region file; "
            "the slots of dead processes are no longer reclaimed")
    assert supervisor == [said]
    assert len(lines) == 2, stderr


def test_a_garbled_region_fails_the_client_closed(sim_env, tmp_path, cbin, shim_path):
    region = make_region(tmp_path / "region")
    rewrite(region, lambda r: setattr(r.devices[0], "used_bytes", 2**63))
    env = dict(sim_env, LD_PRELOAD=str(shim_path), VGPULIMIT_REGION=str(region))
    result = run([cbin / "alloc_client", "dlsym", str(MiB), "2"], env)
    assert [line for line in result.stdout.splitlines() if line.startswith("alloc")] == \
           ["alloc 0 2", "alloc 1 2"]
    [line] = set(result.stderr.splitlines())   # said at each attempt to open it
    assert str(region) in line and GARBLED in line


def test_other_sigbus_still_kills(tmp_path):
    """The guard takes only faults on a region's pages; a truncated file of
    the program's own still kills it, as without vgpulimit."""
    program = f"""
import mmap, os
from vgpulimit.region import Region
region = Region.create({str(tmp_path / "region")!r})
with open({str(tmp_path / "other")!r}, "w+b") as f:
    f.truncate(8192)
    view = mmap.mmap(f.fileno(), 8192)
    f.truncate(0)
    view[4096]
"""
    result = run([sys.executable, "-c", program], base_env(), check=False)
    assert result.returncode == -signal.SIGBUS, result.stderr


# -- the views -------------------------------------------------------------------------------------


def test_status_of_a_truncated_region_is_one_line(sim_env, regions):
    _, bad = regions
    result = status(sim_env, "--interval", "0", "--region", str(bad), check=False)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == f"vgpulimit: error: region {bad}: {TRUNCATED}\n"


def test_status_all_shows_the_good_beside_the_truncated(sim_env, regions):
    good, bad = regions
    runs = good.parent.parent
    data = json.loads(status(sim_env, "--interval", "0", "--json", "--all", str(runs),
                             check=False).stdout)
    [shown] = data["regions"]
    assert shown["region"] == str(good) and shown["devices"][0]["used_bytes"] == 256 * MiB
    assert data["errors"] == [{"region": str(bad), "error": TRUNCATED}]
    text = status(sim_env, "--interval", "0", "--all", str(runs), check=False)
    assert text.returncode == 0
    assert f"region {good} (generation 1)" in text.stdout
    assert [line for line in text.stdout.splitlines() if str(bad) in line] == \
           [f"region {bad}: {TRUNCATED}"]


def test_top_shows_the_good_beside_the_truncated(sim_env, regions):
    good, bad = regions
    top = pexpect.spawn(sys.executable, ["-m", "vgpulimit", "top", "--all",
                                         str(good.parent.parent)],
                        env=dict(sim_env, TERM="xterm"), dimensions=(40, 200),
                        encoding="utf-8", timeout=30)
    try:
        top.expect_exact(f"region {bad}: truncated or resized region file")
        top.expect_exact("256 MiB / 1 GiB")   # the good region's device, in the same frame
        top.send("q")
        top.expect(pexpect.EOF)
    finally:
        top.close(force=True)
    assert top.exitstatus == 0


def test_metrics_serve_the_good_beside_the_truncated(sim_env, regions):
    good, bad = regions
    server = subprocess.Popen(
        list(map(str, vgpulimit_cmd("metrics", "--listen", "127.0.0.1:0", "--all",
                                    good.parent.parent))),
        env=sim_env, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stderr.readline()
        assert "serving metrics on http://127.0.0.1:" in line, line
        samples = scrape(line.split()[-1])
        scrape(line.split()[-1])
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=30)
    assert samples[("vgpulimit_region_readable", series(good))] == 1
    assert samples[("vgpulimit_region_readable", series(bad))] == 0
    dev = series(good, device="0", UUID="")
    assert samples[("vgpulimit_memory_used_bytes", dev)] == 256 * MiB
    assert samples[("vgpulimit_memory_limit_bytes", dev)] == GiB
    about_bad = [k for k in samples if ("region", str(bad)) in k[1]]
    assert about_bad == [("vgpulimit_region_readable", series(bad))]
    # Logged once, though scraped twice.
    assert stderr.splitlines() == [f"vgpulimit metrics: region {bad}: {TRUNCATED}"]


def test_a_fifo_under_the_directory_does_not_hang_status(sim_env, regions):
    good, _ = regions
    os.mkfifo(good.parent / "fifo")
    result = status(sim_env, "--interval", "0", "--json", "--all", str(good.parent.parent),
                    check=False)
    assert [r["region"] for r in json.loads(result.stdout)["regions"]] == [str(good)]


BODY_BYTES = REGION_BYTES - ffi.offsetof("struct vgl_region", "devices")
IMPOSSIBLE = {
    "a share over 100%": lambda r: setattr(r.devices[0].limit, "ppm", 3_113_880_000),
    "a pebibyte in use": lambda r: setattr(r.devices[0], "used_bytes", 2**63),
    "a compute policy": lambda r: setattr(r.devices[0], "cores_policy", 9),
    "a parent path that is not absolute": lambda r: ffi.memmove(r.parent, b"mine", 4),
    "a slot state": lambda r: setattr(r.slots[0], "state", 7),
    "a live slot of pid 0": lambda r: setattr(r.slots[0], "pid", 0),
    "a negative host pid": lambda r: setattr(r.slots[0], "host_pid", -5),
    "a header size": lambda r: setattr(r, "header_size", 4096),
    "random bytes after the header": lambda r: ffi.memmove(
        ffi.addressof(r, "devices"), random.Random(9).randbytes(BODY_BYTES), BODY_BYTES),
}


@pytest.mark.parametrize("edit", IMPOSSIBLE.values(), ids=IMPOSSIBLE.keys())
def test_impossible_values_show_as_garbled(sim_env, tmp_path, edit):
    region = make_region(tmp_path / "region")
    rewrite(region, edit)
    result = status(sim_env, "--interval", "0", "--region", str(region), check=False)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (f"vgpulimit: error: region {region}: {GARBLED} "
                             "(it holds values that vgpulimit never writes)\n")


@pytest.mark.parametrize("content, says", [
    (lambda image: image + b"\0" * 100,
     f"truncated or resized region file ({REGION_BYTES + 100} bytes, expected {REGION_BYTES})"),
    (lambda image: random.Random(7).randbytes(len(image)),
     "not a vgpulimit region file (wrong magic)"),
], ids=["grown", "random bytes"])
def test_grown_and_random_files(sim_env, tmp_path, content, says):
    region = make_region(tmp_path / "region")
    region.write_bytes(content(region.read_bytes()))
    result = status(sim_env, "--interval", "0", "--region", str(region), check=False)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"vgpulimit: error: region {region}: {says}\n"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to run status as another user")
@pytest.mark.parametrize("identity", [b"not json", b'{"pod": ["x"], "gpus": "GPU-0"}', None])
def test_a_garbled_identity_is_no_identity(sim_env, tmp_path, identity):
    """What a view reads beside a region, it believes no more than the region:
    garbage, wrong types or a FIFO there leave the container unnamed."""
    good = make_region(tmp_path / "run" / "c" / "region")
    beside = good.parent / "identity.json"
    if identity is None:
        os.mkfifo(beside)
    else:
        beside.write_bytes(identity)
    data = json.loads(status(sim_env, "--interval", "0", "--json", "--all", str(tmp_path / "run"),
                             check=False).stdout)
    [shown] = data["regions"]
    assert shown["identity"] == {"container_id": None, "pod": None, "namespace": None,
                                 "container": None, "pod_uid": None, "hpc_job": None,
                                 "user": None, "shards": None, "gpus": None}
    assert shown["devices"][0]["used_bytes"] == 256 * MiB


def test_status_needs_read_access_only(sim_env):
    """A region file its reader may read but not write (0400, owned by an
    unprivileged user: root would be let write anyway) still shows."""
    nobody = 65534
    with tempfile.TemporaryDirectory() as directory:   # pytest's tmp_path is root's alone
        os.chmod(directory, 0o755)
        region = make_region(Path(directory) / "region")
        os.chown(region, nobody, nobody)
        os.chmod(region, 0o400)
        as_nobody = ["setpriv", f"--reuid={nobody}", f"--regid={nobody}", "--clear-groups"]
        # What `status` imports, psutil included: in a venv with the system's
        # site-packages, those may lie where uid 65534 cannot read (/root).
        if run([*as_nobody, sys.executable, "-c", "import vgpulimit.query, vgpulimit.status"], sim_env,
               check=False).returncode != 0:
            pytest.skip(f"the installed vgpulimit or what it imports cannot be imported by uid {nobody} "
                        f"({sys.executable}'s packages are not readable by it)")
        cmd = [*as_nobody,
               *vgpulimit_cmd("status", "--json", "--interval", "0", "--region", str(region))]
        result = run(cmd, sim_env, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["devices"][0]["used_bytes"] == 256 * MiB

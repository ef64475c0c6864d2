"""Real containers for the tests: OCI bundles run by runc.

The rootfs is a small writable directory (its own /etc, /tmp, /run) with the
host's directories bind-mounted read-only at their own paths: /usr and the
top-level library and program directories, and wherever this interpreter,
its packages (cuda-bindings, the installed vgpulimit with simgpu) and the
tests live, so that the host's Python runs inside.  There is no user
namespace (runc runs as root here, see docs/facts.md §2)."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import vgpulimit

TESTS = Path(__file__).resolve().parent
RUNC = shutil.which("runc")
CONFIG_SCHEMA = "oci-runtime-spec/config-schema.json"
# The host's top-level directories that programs load from; a symbolic link
# among them (merged /usr) is copied as a link, a directory is bind-mounted.
_SYSTEM_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr")


@functools.cache
def runc_unavailable() -> str | None:
    """Why runc cannot run the tests' containers here, or None (found out once,
    by running one)."""
    if RUNC is None:
        return "runc is not installed (.ci/run installs it with apt-get when run as root)"
    if os.geteuid() != 0:
        return "runc without a user namespace needs root"
    with tempfile.TemporaryDirectory(prefix="vgl-runc-probe-") as base:
        bundle = make_bundle(Path(base), ["true"])
        try:
            result = bundle.run()
        finally:
            bundle.cleanup()
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines() or ["no message"]
        return f"runc cannot run a container here: {lines[-1]}"
    return None


def hook_entry(node_dir: Path, *extra: str) -> dict[str, Any]:
    """A config.json hook that runs the installed `vgpulimit oci-hook`."""
    args = [sys.executable, "-m", "vgpulimit", "oci-hook", "--node-dir", str(node_dir), *extra]
    return {"path": sys.executable, "args": args}


def host_dirs(base: Path) -> list[Path]:
    """Host directories the container needs, outermost only: never one that
    holds the bundle, and no top-level one but the system's."""
    import cuda.bindings

    wanted = [Path("/", name) for name in _SYSTEM_DIRS]
    wanted += [Path(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)]
    wanted += [Path(os.path.realpath(sys.executable)).parent.parent,
               Path(vgpulimit.__file__).resolve().parent.parent,
               Path(cuda.bindings.__file__).resolve().parent.parent.parent,
               TESTS]
    wanted += [Path(p) for p in sys.path if p and os.path.isdir(p)]
    dirs = sorted({Path(os.path.realpath(p)) for p in wanted
                   if p.is_dir() and not p.is_symlink()})
    outermost: list[Path] = []
    for path in dirs:
        if len(path.parts) < 3 and path.name not in _SYSTEM_DIRS:
            continue
        if base.is_relative_to(path) or any(path.is_relative_to(o) for o in outermost):
            continue
        outermost.append(path)
    return outermost


@dataclass
class Bundle:
    path: Path
    rootfs: Path
    config: dict[str, Any]
    ids: list[str] = field(default_factory=list)

    @property
    def env(self) -> list[str]:
        return self.config["process"]["env"]

    def add_hook(self, stage: str, hook: dict[str, Any]) -> None:
        self.config.setdefault("hooks", {}).setdefault(stage, []).append(hook)

    def write(self) -> None:
        (self.path / "config.json").write_text(json.dumps(self.config, indent=1))

    def _argv(self, action: str) -> tuple[list[str], str]:
        self.write()
        container_id = f"vgl-test-{uuid.uuid4().hex[:12]}"
        self.ids.append(container_id)
        return [RUNC, action, "--bundle", str(self.path), container_id], container_id

    def run(self, timeout: float = 60) -> subprocess.CompletedProcess:
        argv, _ = self._argv("run")
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)

    def start(self) -> tuple[subprocess.Popen, str]:
        """Runs the container in the foreground of a child process: its stdout
        is the container's."""
        argv, container_id = self._argv("run")
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL)
        return proc, container_id

    def settle(self) -> None:
        """Runs the container once as `true`, without hooks, so that runc makes
        its mount points in the rootfs: later runs add nothing there of their own."""
        saved = json.loads(json.dumps(self.config))
        self.config["process"]["args"] = ["true"]
        self.config.pop("hooks", None)
        result = self.run()
        self.config = saved
        assert result.returncode == 0, result.stderr

    def cleanup(self) -> None:
        for container_id in self.ids:
            subprocess.run([RUNC, "delete", "--force", container_id], capture_output=True,
                           check=False)


def make_rootfs(rootfs: Path) -> Path:
    """A writable rootfs of its own /etc, /tmp and /run, and links where the
    host's system directories are links (merged /usr); the host's directories
    are to be bind-mounted onto it."""
    for name in ("etc", "tmp", "run"):
        (rootfs / name).mkdir(parents=True)
    (rootfs / "tmp").chmod(0o1777)
    for name in _SYSTEM_DIRS:
        host = Path("/", name)
        if host.is_symlink():
            (rootfs / name).symlink_to(os.readlink(host))
    return rootfs


def container_env() -> dict[str, str]:
    """The environment of a container's process: this interpreter first on PATH,
    and a simulated GPU of the container's own, whose contexts cost nothing."""
    from vgpulimit._paths import simgpu_dir

    bindir = os.path.dirname(sys.executable)
    return {"PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp",
            "LD_LIBRARY_PATH": str(simgpu_dir()), "SIMGPU_STATE": "/tmp/simgpu.state",
            "SIMGPU_CONTEXT_OVERHEAD": "0"}


def make_bundle(base: Path, args: list[str], env: dict[str, str] | None = None,
                host_paths: list[Path] | None = None) -> Bundle:
    """A bundle under ``base`` running ``args`` with ``env`` (plus PATH, HOME,
    and the simulated GPU), its rootfs a writable directory with the host's
    directories bind-mounted read-only."""
    path = base / "bundle"
    rootfs = make_rootfs(path / "rootfs")
    mounts = []
    for host in host_paths if host_paths is not None else host_dirs(base):
        mounts.append({"destination": str(host), "type": "bind", "source": str(host),
                       "options": ["rbind", "ro", "nosuid", "nodev"]})
    spec = subprocess.run([RUNC, "spec", "--bundle", str(path)], capture_output=True, text=True,
                          check=False)
    if spec.returncode != 0:
        pytest.skip(f"runc spec failed: {spec.stderr.strip()}")
    config = json.loads((path / "config.json").read_text())
    config["root"] = {"path": "rootfs", "readonly": False}
    process_env = {**container_env(), **(env or {})}
    config["process"].update(terminal=False, args=args, cwd="/",
                             env=[f"{k}={v}" for k, v in process_env.items()])
    config["mounts"] += mounts
    config["hostname"] = "vgpulimit-test"
    return Bundle(path=path, rootfs=rootfs, config=config)


def tree(root: Path, dir_times: bool = True, skip: tuple[str, ...] = ()) -> dict[str, tuple]:
    """Every entry under ``root`` as the host sees it, but for the top-level
    directories in ``skip``: type and mode, size, link target, and the time of
    the last change (of directories too if ``dir_times``: adding and removing
    a file changes its directory's)."""
    entries = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if dirpath == str(root):
            dirnames[:] = [d for d in dirnames if d not in skip]
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            target = os.readlink(full) if os.path.islink(full) else None
            mtime = st.st_mtime_ns if dir_times or not os.path.isdir(full) else None
            entries[os.path.relpath(full, root)] = (st.st_mode, st.st_size, target, mtime)
    return entries

"""Real containers for the tests, run by podman (Debian 12's 4.3.1 with runc,
see docs/facts.md §3): the rootfs of runc_bundle given with --rootfs (no
registry, no image), the host's directories bind-mounted read-only, and a
store, hooks directory and state of the test's own."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from runc_bundle import container_env, host_dirs, make_rootfs

PODMAN = shutil.which("podman")
# Where podman 4.3 reads CDI specs (it has no --cdi-spec-dir); /var/run/cdi is
# the one of the two that goes with the machine's next boot.
CDI_DIR = Path("/var/run/cdi")


@functools.cache
def podman_unavailable() -> str | None:
    """Why podman cannot run the tests' containers here, or None (found out
    once, by running one)."""
    if PODMAN is None:
        return "podman is not installed (.ci/run installs it with apt-get when run as root)"
    if os.geteuid() != 0:
        return "podman with the host's directories bind-mounted needs root"
    if shutil.which("runc") is None:
        return "podman runs its containers with runc here, which is not installed"
    with tempfile.TemporaryDirectory(prefix="vgl-podman-probe-") as base:
        engine = Podman(Path(base))
        try:
            result = engine.run(["true"])
        finally:
            engine.cleanup()
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines() or ["no message"]
        return f"podman cannot run a container here: {lines[-1]}"
    return None


@dataclass
class Podman:
    """podman with everything of its own under ``base``; each container runs
    from a rootfs of its own, named after it."""

    base: Path
    host_paths: list[Path] | None = None   # default: runc_bundle.host_dirs
    names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.hooks_dir = self.base / "hooks.d"
        self.hooks_dir.mkdir(parents=True, exist_ok=True)
        hosts = self.host_paths if self.host_paths is not None else host_dirs(self.base)
        self._mounts = [a for d in hosts for a in ("-v", f"{d}:{d}:ro")]
        # podman refuses a runroot of more than 50 characters.
        self._runroot = tempfile.mkdtemp(prefix="vgl-podman-")

    def command(self, *args: str) -> list[str]:
        """A podman command line: runc, cgroupfs and files (these machines have
        neither systemd nor journald), and this test's hooks.d only."""
        return [PODMAN, "--root", str(self.base / "store"), "--runroot", self._runroot,
                "--tmpdir", str(self.base / "tmp"), "--runtime", "runc",
                "--cgroup-manager", "cgroupfs", "--events-backend", "file",
                "--hooks-dir", str(self.hooks_dir), *args]

    def run_command(self, args: list[str], *options: str, env: dict[str, str] | None = None,
                    name: str | None = None) -> tuple[list[str], Path]:
        """`podman run` of ``args`` in a container of a fresh rootfs; returns the
        command and the rootfs."""
        name = name or f"vgl-test-{uuid.uuid4().hex[:12]}"
        self.names.append(name)
        rootfs = make_rootfs(self.base / name)
        variables = [a for k, v in {**container_env(), **(env or {})}.items()
                     for a in ("-e", f"{k}={v}")]
        # Small rlimits: the defaults are refused here ("error setting rlimit").
        argv = self.command("run", "--rm", "--name", name, "--network", "none",
                            "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
                            *self._mounts, *variables, *options, "--rootfs", str(rootfs), *args)
        return argv, rootfs

    def run(self, args: list[str], *options: str, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
        argv, _ = self.run_command(args, *options, env=env)
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)

    def start(self, args: list[str], *options: str, env: dict[str, str] | None = None
              ) -> tuple[subprocess.Popen, str, Path]:
        """Runs the container in the foreground of a child process: its stdout
        is the container's.  Returns the process, the container's name and its rootfs."""
        argv, rootfs = self.run_command(args, *options, env=env)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL)
        return proc, self.names[-1], rootfs

    def exec(self, name: str, args: list[str], *options: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.command("exec", *options, name, *args), capture_output=True,
                              text=True, timeout=120, stdin=subprocess.DEVNULL, check=False)

    def cleanup(self) -> None:
        for name in self.names:
            subprocess.run(self.command("rm", "--force", "--time", "0", name),
                           capture_output=True, check=False)
        shutil.rmtree(self._runroot, ignore_errors=True)

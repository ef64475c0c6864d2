"""What the test modules share besides fixtures (those are in conftest.py):
the CLI as a user runs it, the one line a refusal writes, and `vgpulimit
status` read back."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import base_env, run, vgpulimit_cmd


def vgpulimit(*args, env: dict[str, str] | None = None, cwd: Path | str | None = None,
              timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    """`vgpulimit ARGS`, its output captured and its exit status left to the
    caller; by default in the test process's environment without anything of
    ours in it (base_env)."""
    return subprocess.run(vgpulimit_cmd(*args), capture_output=True, text=True, check=False,
                          env=base_env() if env is None else env, cwd=cwd, timeout=timeout,
                          **kwargs)


def one_error_line(result: subprocess.CompletedProcess, code: int | None = None) -> str:
    """The one line a refusal writes on stderr, "vgpulimit: error: ...", once
    it exited with `code` (with any but 0 when None); no traceback."""
    if code is None:
        assert result.returncode != 0, result
    else:
        assert result.returncode == code, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("vgpulimit: error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def status(env: dict[str, str], *args, check: bool = True) -> subprocess.CompletedProcess:
    """`vgpulimit status ARGS`; with `check`, it must exit 0."""
    return run(vgpulimit_cmd("status", *args), env, check=check)


def status_json(env: dict[str, str], region: Path | str, *args) -> dict:
    """What `vgpulimit status --json --region REGION ARGS` says of a region."""
    return json.loads(status(env, "--json", "--region", region, *args).stdout)


def sanitized_build(build: Path, sanitize: str) -> Path:
    """The shim and simgpu built in `build` with meson's b_sanitize=`sanitize`
    (a debug build), and the directory the C clients linked to that simgpu go
    in (with the libcuda.so they link against)."""
    from conftest import ROOT

    for cmd in (["meson", "setup", str(build), str(ROOT), "-Dwerror=true", f"-Db_sanitize={sanitize}",
                 "-Dbuildtype=debug"], ["ninja", "-C", str(build)]):
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    bin_dir = build / "clients"
    bin_dir.mkdir()
    (bin_dir / "libcuda.so").symlink_to(build / "simgpu" / "libcuda.so.1")
    return bin_dir

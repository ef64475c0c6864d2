"""The hooks.d entry (oci-hooks(5)) that makes podman and CRI-O run the hook."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HOOKS_D_NAME = "vgpulimit.json"
HOOKS_D_DIR = "/usr/share/containers/oci/hooks.d"
HOOK_STAGES = ("createRuntime", "poststop")


def hook_command(node_dir: str | None = None) -> list[str]:
    """The hook as a runtime runs it: this interpreter, so that it finds this
    installation of vgpulimit."""
    args = [sys.executable, "-m", "vgpulimit", "oci-hook"]
    if node_dir is not None:
        args += ["--node-dir", node_dir]
    return args


def hooks_d_config(node_dir: str | None = None) -> dict[str, Any]:
    """A hooks.d (oci-hooks(5), version 1.0.0) entry for this installation.  The
    hook runs for every container and decides itself: hooks.d cannot match on
    environment variables."""
    args = hook_command(node_dir)
    return {"version": "1.0.0", "hook": {"path": args[0], "args": args},
            "when": {"always": True}, "stages": list(HOOK_STAGES)}


def install_hooks_d(directory: Path, node_dir: str | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / HOOKS_D_NAME
    temp = directory / f".{HOOKS_D_NAME}.tmp"
    temp.write_text(json.dumps(hooks_d_config(node_dir), indent=2) + "\n", encoding="utf-8")
    temp.chmod(0o644)
    temp.replace(path)
    return path

"""The hooks.d entry (oci-hooks(5)) that makes podman and CRI-O run the hook."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HOOKS_D_NAME = "vgpulimit.json"
HOOKS_D_DIR = "/usr/share/containers/oci/hooks.d"
HOOK_STAGES = ("createRuntime", "poststop")


def hook_command(node_dir: str | None = None, admit: bool = False,
                 admit_uncapped: bool = False) -> list[str]:
    """The hook as a runtime runs it: this interpreter, so that it finds this
    installation of vgpulimit."""
    args = [sys.executable, "-m", "vgpulimit", "oci-hook"]
    if node_dir is not None:
        args += ["--node-dir", node_dir]
    if admit:
        args.append("--admit")
    if admit_uncapped:
        args.append("--admit-uncapped")
    return args


def hooks_d_config(node_dir: str | None = None, admit: bool = False,
                   admit_uncapped: bool = False) -> dict[str, Any]:
    """A hooks.d (oci-hooks(5), version 1.0.0) entry for this installation.  The
    hook runs for every container and decides itself: hooks.d cannot match on
    environment variables."""
    args = hook_command(node_dir, admit, admit_uncapped)
    return {"version": "1.0.0", "hook": {"path": args[0], "args": args},
            "when": {"always": True}, "stages": list(HOOK_STAGES)}


def install_hooks_d(directory: Path, node_dir: str | None = None, admit: bool = False,
                    admit_uncapped: bool = False) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / HOOKS_D_NAME
    temp = directory / f".{HOOKS_D_NAME}.tmp"
    config = hooks_d_config(node_dir, admit, admit_uncapped)
    temp.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    temp.chmod(0o644)
    temp.replace(path)
    return path

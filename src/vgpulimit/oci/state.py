"""The container's OCI state (on the hook's stdin) and its bundle's config.json."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from vgpulimit.errors import quoted
from vgpulimit.oci import HookError

# A container id as runc accepts it.  It names a directory of ours (and
# runc's, /run/runc/<id>), so it is one file name: at most NAME_MAX bytes.
_CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
MAX_CONTAINER_ID = 255


@dataclass(frozen=True)
class State:
    id: str
    status: str
    bundle: Path
    pid: int | None


def read_state(stream: IO[str] | None) -> State:
    if stream is None or stream.isatty():
        what = "closed" if stream is None else "a terminal"
        raise HookError("the hook reads the container's state (OCI state JSON) on stdin, as a "
                        f"runtime gives it; stdin is {what}")
    try:
        state = json.loads(stream.read())
    except OSError as exc:
        raise HookError(f"cannot read the container state on stdin: {exc.strerror}") from None
    except ValueError as exc:
        raise HookError(f"the container state on stdin is not JSON ({exc}); a runtime passes "
                        "the OCI state object there") from None
    except RecursionError:
        raise HookError("the container state on stdin is JSON nested too deeply to read; a "
                        "runtime passes the OCI state object there") from None
    if not isinstance(state, dict):
        raise HookError("the container state on stdin is not a JSON object (OCI state)")
    for key in ("id", "status", "bundle"):
        if not isinstance(state.get(key), str):
            raise HookError(f"the container state on stdin has no string {key!r} (OCI state)")
    if not _CONTAINER_ID.fullmatch(state["id"]) or len(state["id"]) > MAX_CONTAINER_ID:
        raise HookError(f"container id {quoted(state['id'])} is not one a runtime gives "
                        f"(1 to {MAX_CONTAINER_ID} letters, digits, '_', '.', '+', '-', "
                        "the first a letter or digit)")
    bundle = Path(state["bundle"])
    if not bundle.is_absolute():
        raise HookError(f"bundle {state['bundle']!r} in the container state is not an "
                        "absolute path")
    pid = state.get("pid")
    if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0):
        raise HookError(f"pid {pid!r} in the container state is not a process id")
    return State(id=state["id"], status=state["status"], bundle=bundle, pid=pid)


def load_config(bundle: Path) -> dict[str, Any]:
    path = bundle / "config.json"
    try:
        with open(path, encoding="utf-8") as file:
            config = json.load(file)
    except FileNotFoundError:
        what = "no config.json" if bundle.is_dir() else "no such directory"
        raise HookError(f"bundle {bundle}: {what}") from None
    except OSError as exc:
        raise HookError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise HookError(f"{path} is not JSON: {exc}") from None
    except RecursionError:
        raise HookError(f"{path} is JSON nested too deeply to read, not an OCI runtime "
                        "config") from None
    if not isinstance(config, dict):
        raise HookError(f"{path} is not a JSON object (OCI runtime config)")
    return config


def environment(config: Mapping[str, Any]) -> dict[str, str]:
    env = {}
    for entry in (config.get("process") or {}).get("env") or []:
        if isinstance(entry, str):
            name, _, value = entry.partition("=")
            env[name] = value
    return env


def annotations(config: Mapping[str, Any]) -> dict[str, str]:
    annotations = config.get("annotations") or {}
    return {k: v for k, v in annotations.items() if isinstance(v, str)}


def rootfs_of(config: Mapping[str, Any], bundle: Path) -> Path:
    root = config.get("root")
    path = root.get("path") if isinstance(root, dict) else None
    if not isinstance(path, str) or not path:
        raise HookError(f"{bundle / 'config.json'} has no root.path")
    return bundle / path   # an absolute root.path stays itself

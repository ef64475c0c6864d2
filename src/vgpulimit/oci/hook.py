"""The command a runtime runs: the stage is read from the state's status, so one
hooks.d entry serves createRuntime, prestart and poststop."""

from __future__ import annotations

from pathlib import Path
from typing import IO

from vgpulimit.oci import HookError
from vgpulimit.oci.admit import Admission
from vgpulimit.oci.install import install, remove
from vgpulimit.oci.state import load_config, read_state

# OCI status -> what to do.  createRuntime and prestart see "creating" (runc)
# or "created"; poststop sees "stopped".
_INSTALL_STATUSES = frozenset({"creating", "created"})
_REMOVE_STATUSES = frozenset({"stopped"})


def run(stream: IO[str] | None, node_dir: Path, admission: Admission | None = None) -> int:
    state = read_state(stream)
    if state.status in _REMOVE_STATUSES:
        remove(state, node_dir)
        return 0
    if state.status not in _INSTALL_STATUSES:
        raise HookError(f"container status {state.status!r}: the hook runs at createRuntime or "
                        "prestart (status creating or created) and poststop (stopped)")
    install(state, load_config(state.bundle), node_dir, admission)
    return 0

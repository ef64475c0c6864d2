"""The environment a supervised command starts with: the region's path as
the one carrier of its limits, the shim first in LD_PRELOAD, and on the
simulated GPU its driver first on the library path."""

from __future__ import annotations

import re
from collections.abc import Mapping

from vgpulimit._paths import libpath, simgpu_dir
from vgpulimit.kinds import KINDS

REGION_VAR = "VGPULIMIT_REGION"
SETTER_VAR = "VGPULIMIT_SETTER"

# The limit and region variables of the environment contract (every limit
# kind's, kinds.py, in every form: _<i>, _GPU-<uuid>): a child gets the
# region's path alone (the region carries the limits), so none of these may
# reach it with another meaning.
_CONTRACT_VARS = re.compile(
    "|".join(f"{re.escape(var)}(_.*)?" for kind in KINDS for var in kind.variables())
    + "|CUDA_DEVICE_MEMORY_SHARED_CACHE")


def prepend_path(value: str | None, entry: str, separators: str = ":") -> str:
    """``entry`` first, then the entries of ``value`` (split on any of
    ``separators``) other than it, joined with colons."""
    rest = [item for item in re.split(f"[{separators}]", value or "") if item and item != entry]
    return ":".join([entry, *rest])


def child_environment(environ: Mapping[str, str], region_path: str,
                      simulate: bool) -> dict[str, str]:
    """The command's environment: ours, with the region's path as the one
    carrier of its limits (the limit variables are dropped: the region holds
    what they said), the shim first in LD_PRELOAD (after it, the user's
    entries), and with ``simulate`` the simulated driver first on
    LD_LIBRARY_PATH."""
    env = {k: v for k, v in environ.items() if not _CONTRACT_VARS.fullmatch(k)}
    env[REGION_VAR] = region_path
    # The mark by which the shim tells a process that lost its region from
    # one that never had one (shim/src/environment.c, lost_region).
    env[SETTER_VAR] = "run"
    # The dynamic linker splits LD_PRELOAD on spaces and colons.
    env["LD_PRELOAD"] = prepend_path(environ.get("LD_PRELOAD"), str(libpath()), " :")
    if simulate:
        env["LD_LIBRARY_PATH"] = prepend_path(environ.get("LD_LIBRARY_PATH"), str(simgpu_dir()))
    return env

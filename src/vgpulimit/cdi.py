"""`vgpulimit cdi generate`: a CDI spec (Container Device Interface) whose device
gives a container what the OCI hook gives it.

A CDI-aware runtime (podman, CRI-O, containerd with CDI enabled) applies the
device's edits to the container's config.json: the limits as environment
variables, the shim mounted read-only where the hook would have copied it
(the runtime refuses to start the container if the shim is missing on the
host), and the hook itself at createRuntime and poststop, which adds the
preload line and mounts the region -- the part no static edit can do, since
the region belongs to one container.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from vgpulimit.errors import UsageError, quoted
from vgpulimit.oci import SHIM_PATH
from vgpulimit.oci.hooks_d import HOOK_STAGES, hook_command

KIND = "vgpulimit.io/gpu"
# CDI device names: a letter or digit, then letters, digits, '_', '.', ':', '-'.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*")
NAME_FORMS = "a letter or digit, then letters, digits, '_', '.', ':' or '-'"


def minimum_version(spec: dict[str, Any]) -> str:
    """The lowest cdiVersion that can hold ``spec``, reckoned as the CDI
    library does (container-device-interface, specs-go/version.go,
    MinimumRequiredVersion): an engine refuses a version newer than it knows
    (podman 4.3.1 reads up to 0.5.0), so the spec claims no more than it needs.
    Only the rules that apply to what we write are here: our specs have no
    device nodes, annotations, IntelRdt or additional GIDs, and a kind whose
    class has no dot."""
    edits = [spec.get("containerEdits", {})] + [d["containerEdits"] for d in spec["devices"]]
    # 0.5.0: a device name may start with something other than a letter.
    if any(re.match("[^A-Za-z]", d["name"]) for d in spec["devices"]):
        return "0.5.0"
    # 0.4.0: a mount may have a type.
    if any(mount.get("type") for e in edits for mount in e.get("mounts", [])):
        return "0.4.0"
    return "0.3.0"   # the earliest the library accepts


class CdiError(UsageError):
    """A flag the spec cannot be made from."""


def default_name(memory: str | None, cores: str | None, cores_policy: str | None = None,
                 priority: str | None = None, admit: bool = False, admit_uncapped: bool = False,
                 node_dir: str | None = None, device: str | None = None, memory_request: str | None = None,
                 memory_wait: str | None = None) -> str:
    """A device name that says what it gives: "1GiB", "50pct-cores30",
    "cores30-policy-borrow-priority-low", "shim".  Every flag that changes the
    spec is in it: two specs in one directory that name the same device make
    the engine refuse it ("unresolvable CDI devices") without saying why.
    ``cores_policy`` and ``priority`` as their parsers return them."""
    parts = []
    if device is not None:   # "MIG-7cf0ca4b": a UUID's first digits tell devices apart
        parts.append(device[:12])
    if memory is not None:
        parts.append(memory.strip().replace("%", "pct"))
    if cores is not None:
        parts.append("cores" + cores.strip().rstrip("%"))
    if cores_policy is not None:
        parts.append(f"policy-{cores_policy}")
    if priority is not None:
        parts.append(f"priority-{priority}")
    if memory_request is not None:
        parts.append("request-" + memory_request.strip().replace("%", "pct"))
    if memory_wait is not None:
        parts.append("wait-" + memory_wait.strip())
    if admit:
        parts.append("admit-uncapped" if admit_uncapped else "admit")
    if node_dir is not None:
        # A path has characters no name may hold: its digest stands for it.
        parts.append("node-" + hashlib.sha256(node_dir.encode("utf-8", "surrogateescape")).hexdigest()[:8])
    name = "-".join(parts) or "shim"
    return name if _NAME.fullmatch(name) else "limits"


def generate(name: str | None = None, memory: str | None = None, cores: str | None = None,
             node_dir: str | None = None, cores_policy: str | None = None,
             admit: bool = False, admit_uncapped: bool = False,
             priority: str | None = None, device: str | None = None, memory_request: str | None = None,
             memory_wait: str | None = None) -> dict[str, Any]:
    """The spec, as a JSON-ready dict.  Limits are checked by the one parser and
    kept as the user wrote them, as `vgpulimit run` passes them on.  With
    ``device`` (a GPU's or MIG device's UUID), the limits are that device's
    (VGPULIMIT_MEMORY_<uuid>, VGPULIMIT_CORES_<uuid>): a share of a MIG
    instance is of the instance."""
    from vgpulimit._paths import libpath
    from vgpulimit.limits import (
        parse_cores,
        parse_cores_policy,
        parse_memory,
        parse_priority,
        parse_uuid,
    )

    if device is not None:
        device = parse_uuid(device, "--device")

    # "none" says so: a spec whose containers run with no limit is asked for
    # by name, never the silent result of a forgotten flag.
    memory_none = memory is not None and memory.strip().lower() == "none"
    cores_none = cores is not None and cores.strip().lower() == "none"
    if memory_none:
        memory = None
    elif memory is not None:
        parse_memory(memory, "--memory")
    if cores_none:
        cores = None
    elif cores is not None:
        parse_cores(cores, "--cores")
    policy_value = None if cores_policy is None else parse_cores_policy(cores_policy, "--cores-policy")
    priority_value = None if priority is None else parse_priority(priority, "--priority")
    if memory_request is not None:
        from vgpulimit.environment import Setting
        from vgpulimit.request import check_requests

        asked = parse_memory(memory_request, "--memory-request")
        if memory is not None:
            check_requests({0: Setting(memory_request, "--memory-request", asked)},
                           {0: Setting(memory, "--memory", parse_memory(memory, "--memory"))})
    if memory_wait is not None:
        from vgpulimit.limits import parse_wait

        parse_wait(memory_wait, "--memory-wait")
    if name is None:
        name = default_name(memory, cores, policy_value, priority_value, admit, admit_uncapped,
                            node_dir, device, memory_request, memory_wait)
    elif not _NAME.fullmatch(name):
        raise CdiError(f"--name: {quoted(name)} is not a CDI device name ({NAME_FORMS})")
    if memory is None and cores is None and not (memory_none and cores_none):
        raise CdiError("cdi generate: no limit given, and a device with none runs its containers "
                       "uncapped; give --memory SIZE and/or --cores PCT, or --memory none --cores none "
                       "for a device that installs the shim and leaves the limits to the container")
    from vgpulimit.kinds import KINDS

    # A share's policy is said even where it is the default: the device's
    # variable replaces one the container's own spec would add (none lifts it).
    policy = cores_policy if cores_policy is not None or cores is None else "hard"
    given = {"memory": memory, "cores": cores, "cores_policy": policy, "priority": priority,
             "memory_request": memory_request, "memory_wait": memory_wait}
    of = "" if device is None else f"_{device}"
    env = [f"{kind.ours}{of if kind.by_uuid else ''}={given[kind.name]}" for kind in KINDS
           if given[kind.name] is not None]
    args = hook_command(node_dir, admit, admit_uncapped)
    edits: dict[str, Any] = {"env": env} if env else {}
    edits |= {
        "mounts": [{"hostPath": str(libpath()), "containerPath": SHIM_PATH,
                    "type": "bind", "options": ["ro", "nosuid", "nodev", "bind"]}],
        "hooks": [{"hookName": stage, "path": args[0], "args": args} for stage in HOOK_STAGES],
    }
    spec = {"kind": KIND, "devices": [{"name": name, "containerEdits": edits}]}
    return {"cdiVersion": minimum_version(spec), **spec}

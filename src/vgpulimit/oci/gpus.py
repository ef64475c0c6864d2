"""Which GPUs a container asks for, read from its config as the NVIDIA
container toolkit reads it: CDI devices of kind nvidia.com/gpu named in
``cdi.k8s.io/*`` annotations, else NVIDIA_VISIBLE_DEVICES in process.env,
else the /dev/nvidia<minor> device nodes the runtime gives it (what an engine
that resolved a CDI device itself, podman's --device nvidia.com/gpu=0, leaves
in the config)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from vgpulimit.oci import HookError
from vgpulimit.oci.state import annotations as config_annotations
from vgpulimit.oci.state import environment as config_environment

CDI_PREFIX = "cdi.k8s.io/"
CDI_KIND = "nvidia.com/gpu"
_DEVICE_NODE = re.compile(r"/dev/nvidia(\d+)")
_NO_GPU = {"none", "void", ""}


def requested_gpus(config: Mapping[str, Any]) -> list[str] | None:
    """What the container names its GPUs by, in its own order: "all", NVML
    indices, UUIDs, or "minor:N" for a device node; [] for none ("none",
    "void"); None when it names no GPU at all."""
    cdi = []
    for key, value in config_annotations(config).items():
        if key.startswith(CDI_PREFIX):
            for device in value.split(","):
                kind, _, name = device.strip().partition("=")
                if kind == CDI_KIND and name:
                    cdi.append(name)
    if cdi:
        return cdi
    visible = config_environment(config).get("NVIDIA_VISIBLE_DEVICES")
    if visible is not None and visible.strip().lower() not in _NO_GPU:
        return [part.strip() for part in visible.split(",") if part.strip()]
    nodes = []
    for device in (config.get("linux") or {}).get("devices") or []:
        m = _DEVICE_NODE.fullmatch(str(device.get("path", ""))) if isinstance(device, dict) else None
        if m:
            nodes.append(f"minor:{m[1]}")
    if nodes:
        return nodes
    return [] if visible is not None else None


def resolve(names: Sequence[str], gpus: Sequence) -> list:
    """The node's GPUs (node.Gpu) that ``names`` name, in the container's
    order, each once: whole GPUs by index, device node or UUID, MIG instances
    by their MIG-<uuid> (NVIDIA's device plugin, mixed strategy).  HookError
    for a name that is no GPU of this node."""
    found: list = []
    whole = [g for g in gpus if g.mig is None]
    for name in names:
        if name.lower() == "all":
            matches = whole
        elif name.isascii() and name.isdigit():
            matches = [g for g in whole if g.index == int(name)]
        elif name.startswith("minor:"):
            matches = [g for g in whole if g.minor is not None and str(g.minor) == name[6:]]
        elif ":" in name:
            raise HookError(f"GPU {name!r}: a MIG instance named by GPU:GI; name it by its "
                            "MIG-<uuid> (nvidia-smi -L)")
        else:
            matches = [g for g in gpus if g.uuid == name]
            if not matches and len(name) >= 8:   # a UUID prefix, as CUDA accepts one
                matches = [g for g in gpus if g.uuid.startswith(name)]
                matches = matches if len(matches) == 1 else []
        if not matches:
            what = f"/dev/nvidia{name[6:]}" if name.startswith("minor:") else repr(name)
            raise HookError(f"GPU {what}, which the container asks for, is not one of this "
                            f"node's {len(gpus)} GPU(s) (indices 0-{len(gpus) - 1}, or UUIDs)")
        found += [g for g in matches if g not in found]
    return found

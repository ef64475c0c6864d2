"""Who owns a container's region on the host: its process's uid and gid, mapped
through the container's user namespace."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vgpulimit.oci import HookError


def _host_id(container_id: int, mappings: Any, what: str) -> int:
    if not mappings:
        return container_id
    for mapping in mappings:
        start, host, size = (mapping.get(k) for k in ("containerID", "hostID", "size"))
        if not all(isinstance(v, int) for v in (start, host, size)):
            continue
        if start <= container_id < start + size:
            return host + container_id - start
    raise HookError(f"the container's {what} {container_id} is not in linux.{what}Mappings")


def region_owner(config: Mapping[str, Any]) -> tuple[int, int]:
    """The host uid and gid of the container's process (through its user namespace)."""
    user = (config.get("process") or {}).get("user") or {}
    uid, gid = user.get("uid", 0), user.get("gid", 0)
    linux = config.get("linux") or {}
    return (_host_id(uid, linux.get("uidMappings"), "uid"),
            _host_id(gid, linux.get("gidMappings"), "gid"))

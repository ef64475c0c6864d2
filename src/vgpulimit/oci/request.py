"""The limits a container asks for, read from its bundle."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vgpulimit.errors import UsageError
from vgpulimit.oci import (
    CORES_ANNOTATION,
    CORES_POLICY_ANNOTATION,
    MEMORY_ANNOTATION,
    MEMORY_REQUEST_ANNOTATION,
    MEMORY_WAIT_ANNOTATION,
    PRIORITY_ANNOTATION,
    HookError,
)
from vgpulimit.oci.state import annotations as config_annotations
from vgpulimit.oci.state import environment as config_environment


def requested(config: Mapping[str, Any]):
    """The limits the container asks for (a request.Limits), or None when
    it asks for none.  Its variables are read by the shim's own reader, in
    the shim's precedence; an annotation beats every variable of its kind
    (the variables may come with the image, the annotation from whoever runs
    it)."""
    from vgpulimit import environment
    from vgpulimit.limits import (
        LimitError,
        parse_cores,
        parse_cores_policy,
        parse_memory,
        parse_priority,
        parse_wait,
    )
    from vgpulimit.request import Limits, Setting, check_requests, layer

    env, annotations = config_environment(config), config_annotations(config)
    found = environment.read(env)
    asks_by_annotation = (MEMORY_ANNOTATION in annotations or CORES_ANNOTATION in annotations
                          or PRIORITY_ANNOTATION in annotations or MEMORY_REQUEST_ANNOTATION in annotations
                          or MEMORY_WAIT_ANNOTATION in annotations)
    by_uuid = found.memory_by_uuid or found.cores_by_uuid or found.request_by_uuid
    elastic = found.request or found.memory_wait
    if not (found.memory or found.cores or by_uuid or found.priority or elastic or asks_by_annotation
            or found.errors):
        return None
    if found.region_path:
        # A device plugin that mounts the shim itself named the region (HAMi's
        # sets CUDA_DEVICE_MEMORY_SHARED_CACHE): the container is its to set up.
        return None
    if found.errors:
        raise HookError(f"process.env {found.errors[0]}")

    def annotation(name: str, parse) -> Setting | None:
        if name not in annotations:
            return None
        try:
            return Setting(annotations[name], f"annotation {name}", parse(annotations[name],
                                                                           f"annotation {name}"))
        except LimitError as exc:
            raise HookError(str(exc)) from None

    warnings = list(found.warnings)
    memory = layer(found.memory, annotation(MEMORY_ANNOTATION, parse_memory), {}, warnings)
    cores = layer(found.cores, annotation(CORES_ANNOTATION, parse_cores), {}, warnings)
    policy = annotation(CORES_POLICY_ANNOTATION, parse_cores_policy) or found.cores_policy
    priority = annotation(PRIORITY_ANNOTATION, parse_priority) or found.priority
    request = layer(found.request, annotation(MEMORY_REQUEST_ANNOTATION, parse_memory), {}, warnings)
    wait = annotation(MEMORY_WAIT_ANNOTATION, parse_wait) or found.memory_wait
    try:
        check_requests(request, memory)
    except UsageError as exc:
        raise HookError(str(exc)) from None
    return Limits(memory=memory, cores=cores, cores_policy=policy, priority=priority, warnings=tuple(warnings),
                  memory_by_uuid=found.memory_by_uuid, cores_by_uuid=found.cores_by_uuid,
                  request=request, request_by_uuid=found.request_by_uuid, memory_wait=wait)

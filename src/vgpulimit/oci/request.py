"""The limits a container asks for, read from its bundle."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vgpulimit.errors import UsageError
from vgpulimit.kinds import KINDS
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
    the shim's precedence.  An annotation may tighten what a variable of its
    kind sets, never loosen it: through containerd's allow-list annotations
    are the pod author's to write, while a variable may be the setter's (a CDI
    device's, a device plugin's), so an annotation that would loosen one fails
    the start with one line."""
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
    # A compute policy alone limits nothing: it asks for no setup of its own.
    asks_by_annotation = any(kind.annotation in annotations for kind in KINDS if kind.name != "cores_policy")
    by_uuid = found.memory_by_uuid or found.cores_by_uuid or found.request_by_uuid
    elastic = found.request or found.memory_wait
    if not (found.memory or found.cores or by_uuid or found.priority or elastic or asks_by_annotation
            or found.errors):
        return None
    if found.errors and not (found.region_path and found.control_disabled):
        # Also where a device plugin or DRA driver mounts the shim itself: the
        # shim would refuse every allocation, so the start fails here instead
        # (unless HAMi's CUDA_DISABLE_CONTROL turns its shim off).
        raise HookError(f"process.env {found.errors[0]}")
    ours = [s.source for s in (*found.memory.values(), *found.cores.values()) if s.source.startswith("VGPULIMIT_")]
    if found.region_path:
        if ours or asks_by_annotation:
            # vgpulimit's variables come from its CDI device or its setter; a
            # region named beside them (a variable any pod spec can add) would
            # leave the container without the hook, and so without its cap.
            asked = ours[0] if ours else "a vgpulimit.io annotation"
            raise HookError(f"process.env {found.region_source} names a region of another injector, while "
                            f"{asked} asks the hook for one: give the container one of the two")
        # A device plugin that mounts the shim itself named the region (HAMi's
        # sets CUDA_DEVICE_MEMORY_SHARED_CACHE): the container is its to set up.
        return None
    _refuse_loosening(env, found)

    def annotation(name: str, parse) -> Setting | None:
        if name not in annotations:
            return None
        try:
            return Setting(annotations[name], f"annotation {name}", parse(annotations[name],
                                                                           f"annotation {name}"))
        except LimitError as exc:
            raise HookError(str(exc)) from None

    warnings = list(found.warnings)
    if found.mps and CORES_ANNOTATION in annotations and not found.cores:
        # As the reader says of a compute variable (environment.c note_mps).
        warnings.append(f"CUDA_MPS_PIPE_DIRECTORY is set: this MPS client's compute is held both by its MPS "
                        f"daemon's limits and by annotation {CORES_ANNOTATION} {annotations[CORES_ANNOTATION]}, "
                        "the tighter applying; to leave compute to MPS, give it no compute share")
    memory = layer(found.memory, tightening(found.memory, annotation(MEMORY_ANNOTATION, parse_memory)),
                   {}, warnings)
    cores = layer(found.cores, tightening(found.cores, annotation(CORES_ANNOTATION, parse_cores)), {}, warnings)
    # A share the variables set is hard unless they say otherwise.
    implied = next((Setting(s.text, s.source, "hard") for s in found.cores.values()), None)
    policy = tightening({0: found.cores_policy or implied} if found.cores_policy or implied else {},
                        annotation(CORES_POLICY_ANNOTATION, parse_cores_policy)) or found.cores_policy
    priority = tightening({0: found.priority} if found.priority else {},
                          annotation(PRIORITY_ANNOTATION, parse_priority)) or found.priority
    request = layer(found.request, tightening(found.request, annotation(MEMORY_REQUEST_ANNOTATION, parse_memory)),
                    {}, warnings)
    wait = annotation(MEMORY_WAIT_ANNOTATION, parse_wait) or found.memory_wait
    try:
        check_requests(request, memory)
    except UsageError as exc:
        raise HookError(str(exc)) from None
    return Limits(memory=memory, cores=cores, cores_policy=policy, priority=priority, warnings=tuple(warnings),
                  memory_by_uuid=found.memory_by_uuid, cores_by_uuid=found.cores_by_uuid,
                  request=request, request_by_uuid=found.request_by_uuid, memory_wait=wait)


def _refuse_loosening(env: Mapping[str, str], found) -> None:
    """A container's variables are the pod spec's and its device's together
    (a CDI device adds VGPULIMIT_MEMORY=1GiB to what the pod's author wrote),
    and the hook cannot tell whose each is.  So where variables of one kind
    stand in one another's way (VGPULIMIT_MEMORY_0 beats VGPULIMIT_MEMORY,
    which beats HAMi's), the one that wins may only tighten those it hides:
    HookError naming both where it would loosen one."""
    from vgpulimit import environment

    reads: dict[frozenset[str], Any] = {}

    def without(names: frozenset[str]):
        if names not in reads:
            reads[names] = environment.read({k: v for k, v in env.items() if k not in names})
        return reads[names]

    for kind in ("memory", "cores", "request"):
        for i, upper in getattr(found, kind).items():
            gone: frozenset[str] = frozenset()
            while upper.source in env and upper.source not in gone:
                gone |= {upper.source}
                lower = getattr(without(gone), kind).get(i)
                if lower is None:
                    break
                # KAI writes a size beside its GPU_PORTION: a size and a share
                # are weighed only against a variable of ours (a device's).
                if lower.source.startswith("VGPULIMIT_") or _looser(upper.value, lower.value) is not None:
                    tightening({i: lower}, upper, "a variable")
                upper = lower
        # By UUID a variable may name any device: it may loosen none of ours.
        for upper in getattr(found, f"{kind}_by_uuid").values():
            tightening({i: s for i, s in getattr(found, kind).items() if s.source.startswith("VGPULIMIT_")},
                       upper, "a variable")


# Lower is tighter: a priority's rank, as the board orders them; a cores
# policy's, from a hard share to none.
_PRIORITY_RANK = {"high": 0, "normal": 1, "low": 2}
_POLICY_RANK = {"hard": 0, "borrow": 1, "none": 2}


def tightening(below, upper, what: str = "an annotation"):
    """``upper`` (an annotation's Setting, or None) where it tightens every
    variable's Setting in ``below`` (by device index); HookError naming both
    where it would loosen one, or where the two cannot be compared (a size
    against a fraction of the device)."""
    if upper is None:
        return None
    shown = f"{upper.source}={upper.text}" if what == "a variable" else f"{upper.source} {upper.text}"
    for lower in below.values():
        looser = _looser(upper.value, lower.value)
        if looser is None:
            raise HookError(f"{shown} cannot be weighed against {lower.source}={lower.text}, "
                            f"which the container's device or environment sets: give the {what.split()[-1]} in the "
                            "same form (a size, or a share of the device), no looser")
        if looser:
            raise HookError(f"{shown} would loosen {lower.source}={lower.text}, which "
                            f"the container's device or environment sets: {what} may only tighten it")
    return upper


def _looser(upper, lower) -> bool | None:
    if isinstance(upper, str) and upper in _POLICY_RANK:
        return _POLICY_RANK[upper] > _POLICY_RANK[lower]
    if isinstance(upper, str):
        return _PRIORITY_RANK[upper] < _PRIORITY_RANK[lower]
    if isinstance(upper, int):
        return upper > lower
    if upper.bytes and lower.bytes:
        return upper.bytes > lower.bytes
    if upper.ppm and lower.ppm:
        return upper.ppm > lower.ppm
    return None

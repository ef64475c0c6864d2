"""Who a region belongs to: the container id the runtime gave, the Kubernetes
pod, namespace and container names its annotations carry, and the GPUs it was
given, as the OCI hook found them when it set the container up.

The hook writes them as a small JSON file beside the region, in the
container's directory on the node (the region's layout is the shim's C ABI
and carries no names).  The views read it as they read a region: a file they
cannot believe is no identity, never a crash.

``of_region`` and ``region_labels`` are the one place that says who a region
belongs to for every view and metric: what the hook recorded, and where it
recorded nothing (a device plugin set the container up), what the engine's
directories say (layouts.py)."""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

from vgpulimit import layouts

IDENTITY_NAME = "identity.json"

# What the hook records of a container's Kubernetes identity, and the Slurm
# Prolog of a job's (hpc_job: DCGM exporter's label for it).
LABELS = ("pod", "namespace", "container", "pod_uid", "hpc_job")

# Where each label's value is in the OCI config's annotations: CRI-O's names
# first, then containerd's (its CRI plugin).
ANNOTATIONS: Mapping[str, tuple[str, ...]] = {
    "pod": ("io.kubernetes.pod.name", "io.kubernetes.cri.sandbox-name"),
    "namespace": ("io.kubernetes.pod.namespace", "io.kubernetes.cri.sandbox-namespace"),
    "container": ("io.kubernetes.container.name", "io.kubernetes.cri.container-name"),
    "pod_uid": ("io.kubernetes.pod.uid", "io.kubernetes.cri.sandbox-uid"),
}

# A Kubernetes name is at most 253 characters; the id of a container 1024.
_MAX_VALUE = 1024
_MAX_FILE = 64 * 1024
_MAX_GPUS = 64


@dataclass(frozen=True)
class Identity:
    container_id: str = ""
    pod: str = ""
    namespace: str = ""
    container: str = ""
    pod_uid: str = ""
    gpus: tuple[str, ...] | None = None   # UUIDs of the GPUs given, in the container's
                                          # numbering (its device 0 first); None: not known
    hpc_job: str = ""                     # a Slurm job's id, its user and its shards
    user: str = ""                        # ("2/8"), as the Prolog found them
    shards: str = ""

    def labels(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in LABELS}

    @property
    def name(self) -> str:
        """How a person calls the container: "namespace/pod/container", else its id."""
        if self.pod:
            return "/".join(p for p in (self.namespace, self.pod, self.container) if p)
        if self.hpc_job:
            detail = ", ".join(p for p in (self.user, self.shards and f"{self.shards} shards") if p)
            return f"slurm job {self.hpc_job}" + (f" ({detail})" if detail else "")
        return self.container_id


def from_annotations(container_id: str, annotations: Mapping[str, str],
                     gpus: tuple[str, ...] | None) -> Identity:
    found = {}
    for label, keys in ANNOTATIONS.items():
        found[label] = next((_clean(annotations[k]) for k in keys if annotations.get(k)), "")
    return Identity(container_id=container_id, gpus=gpus, **found)


def write(entry_fd: int, identity: Identity) -> None:
    """Into the container's directory on the node, whole or not at all."""
    temp = f".{IDENTITY_NAME}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644,
                 dir_fd=entry_fd)
    data = asdict(identity)
    data["gpus"] = None if identity.gpus is None else list(identity.gpus)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        json.dump(data, file)
    os.rename(temp, IDENTITY_NAME, src_dir_fd=entry_fd, dst_dir_fd=entry_fd)


def path_beside(region_path: str) -> str:
    return os.path.join(os.path.dirname(os.fspath(region_path)), IDENTITY_NAME)


def read(region_path: str) -> Identity:
    """The identity kept beside the region; an empty one when there is none or
    it is not one the hook wrote (a region of `vgpulimit run`, a garbled file)."""
    try:
        data = json.loads(_read_small(path_beside(region_path)))
    except (OSError, ValueError, RecursionError):
        return Identity()
    if not isinstance(data, dict):
        return Identity()
    values = {k: _clean(data[k]) for k in ("container_id", *LABELS, "user", "shards")
              if isinstance(data.get(k), str)}
    gpus = data.get("gpus")
    if isinstance(gpus, list) and len(gpus) <= _MAX_GPUS and all(isinstance(g, str) for g in gpus):
        values["gpus"] = tuple(_clean(g) for g in gpus)
    return Identity(**values)


def of_region(region_path: str,
              pods: Mapping[str, tuple[str, str]] | None = None) -> Identity:
    """Who the region's container is: what the hook recorded beside it, each
    name it left empty taken from the engine's directories (``pods``:
    layouts.pod_names)."""
    recorded = read(region_path)
    found = layouts.layout_labels(region_path, pods)
    return replace(recorded, **{k: found[k] for k in LABELS if not getattr(recorded, k)})


def region_labels(region_path: str,
                  pods: Mapping[str, tuple[str, str]] | None = None) -> dict[str, str]:
    """The labels every series about the container carries, layouts.LABELS
    in their order, each "" where nothing says."""
    recorded = read(region_path).labels()
    found = layouts.layout_labels(region_path, pods)
    return {k: recorded.get(k) or found[k] for k in layouts.LABELS}


def _read_small(path: str) -> bytes:
    """A regular file, no link followed, no FIFO waited on, no more than _MAX_FILE."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb", buffering=0) as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EPROTO, "not a regular file")
        return file.read(_MAX_FILE)


def _clean(value: str) -> str:
    """Printable and bounded: a label value lands in terminals and scrapes."""
    return "".join(c for c in value[:_MAX_VALUE] if c.isprintable())

"""Who a region belongs to, read from where the engines that inject HAMi-core
keep its file on the node, so that the node's metrics name the pod without
asking Kubernetes:

- HAMi's device plugin, and KAI's resource isolator:
  ``<hook path>/vgpu/containers/<pod UID>_<container>/<file>``
- HAMi's DRA driver: ``<hook path>/vgpu/claims/<claim UID>/<file>``

A pod UID holds no '_' and a container name (a DNS label) none either, so the
first '_' splits them.  Any other path names nobody: no labels.

A pod's name and namespace come from the kubelet's log directories,
``/var/log/pods/<namespace>_<pod>_<pod UID>/``, which exist for every pod of
the node while it runs (neither name may hold a '_')."""

from __future__ import annotations

import os
from collections.abc import Mapping

LABELS = ("pod_uid", "container", "claim_uid", "pod", "namespace", "hpc_job")


def pod_names(pod_logs: str | None) -> dict[str, tuple[str, str]]:
    """Pod UID -> (namespace, name), from the kubelet's log directories under
    ``pod_logs``; none where that cannot be read."""
    names = {}
    try:
        entries = os.listdir(pod_logs) if pod_logs else []
    except OSError:
        return {}
    for entry in entries:
        parts = entry.split("_")
        if len(parts) == 3 and all(parts):
            namespace, name, uid = parts
            names[uid] = (namespace, name)
    return names


def layout_labels(path: str, pods: Mapping[str, tuple[str, str]] | None = None) -> dict[str, str]:
    """``pod_uid``, ``container``, ``claim_uid``, ``pod`` and ``namespace`` of
    the region at ``path`` (``pods`` from pod_names), each "" where the
    directories do not say."""
    labels = dict.fromkeys(LABELS, "")
    parts = os.path.normpath(path).split(os.sep)
    if len(parts) >= 3 and parts[-3] == "containers":
        pod_uid, sep, container = parts[-2].partition("_")
        if sep and pod_uid and container:
            labels.update(pod_uid=pod_uid, container=container)
            namespace, pod = (pods or {}).get(pod_uid, ("", ""))
            labels.update(pod=pod, namespace=namespace)
    elif len(parts) >= 3 and parts[-3] == "claims" and parts[-2]:
        labels["claim_uid"] = parts[-2]
    return labels

"""Who a region belongs to, read from where the engines that inject HAMi-core
keep its file on the node, so that the node's metrics name the pod without
asking Kubernetes:

- HAMi's device plugin, and KAI's resource isolator:
  ``<hook path>/vgpu/containers/<pod UID>_<container>/<file>``
- HAMi's DRA driver: ``<hook path>/vgpu/claims/<claim UID>/<file>``

A pod UID holds no '_' and a container name (a DNS label) none either, so the
first '_' splits them.  Any other path names nobody: no labels."""

from __future__ import annotations

import os

LABELS = ("pod_uid", "container", "claim_uid")


def layout_labels(path: str) -> dict[str, str]:
    """``pod_uid``, ``container`` and ``claim_uid`` of the region at ``path``,
    each "" where its directory does not say."""
    labels = dict.fromkeys(LABELS, "")
    parts = os.path.normpath(path).split(os.sep)
    if len(parts) >= 3 and parts[-3] == "containers":
        pod_uid, sep, container = parts[-2].partition("_")
        if sep and pod_uid and container:
            labels.update(pod_uid=pod_uid, container=container)
    elif len(parts) >= 3 and parts[-3] == "claims" and parts[-2]:
        labels["claim_uid"] = parts[-2]
    return labels

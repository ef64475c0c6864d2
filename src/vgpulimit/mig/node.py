"""The node's GPUs for the MIG planner, through NVML: their model (by PCI
device id, as the profile tables and mig-parted's device-filter know them)
and their indices.  Reads only; the planner never changes MIG."""

from __future__ import annotations

from vgpulimit import nvml
from vgpulimit.errors import UsageError, VgpulimitError
from vgpulimit.mig.profiles import GpuModel, by_pci_device_id, model_names


class NoNode(VgpulimitError):
    """NVML cannot say what the node's GPUs are."""


def node_gpus() -> tuple[GpuModel, list[int]]:
    """The model of the node's GPUs and their NVML indices; NoNode when NVML
    cannot be read, UsageError when a GPU has no MIG profiles here or the
    node mixes models (give --model then)."""
    try:
        with nvml.session() as session:
            count = int(session.required("nvmlDeviceGetCount", function="nvmlDeviceGetCount_v2"))
            found: list[tuple[int, str, GpuModel | None]] = []
            for index in range(count):
                handle = session.required("nvmlDeviceGetHandleByIndex", index,
                                          function="nvmlDeviceGetHandleByIndex_v2")
                name = nvml.text(session.query("nvmlDeviceGetName", handle, default="?"))
                pci = session.required("nvmlDeviceGetPciInfo", handle, function="nvmlDeviceGetPciInfo_v3")
                found.append((index, name, by_pci_device_id(int(pci.pciDeviceId))))
    except nvml.NvmlError as exc:
        raise NoNode(f"mig plan: cannot read the node's GPUs ({exc}); give --model "
                     f"({model_names()}) and --gpus N") from None
    if not found:
        raise NoNode(f"mig plan: NVML shows no GPU; give --model ({model_names()}) and --gpus N")
    for index, name, model in found:
        if model is None:
            raise UsageError(f"mig plan: GPU {index} ({name}) has no MIG profiles here; give --model "
                             f"({model_names()}) to plan for another")
    models = {model.model for _, _, model in found if model is not None}
    if len(models) > 1:
        raise UsageError(f"mig plan: the node has GPUs of several models ({', '.join(sorted(models))}); "
                         "give --model to plan for one")
    model = found[0][2]
    assert model is not None
    return model, [index for index, _, _ in found]

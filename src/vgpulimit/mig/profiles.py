"""The MIG profile tables (profiles.json, installed beside this module),
read into dataclasses.  The tables are data, with their sources, so that the
planner here and simgpu's MIG mode (whose C table the build writes from the
same file) cannot disagree; nothing in this module adds a number of its own."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

from vgpulimit.errors import UsageError

DATA_PATH = Path(__file__).with_name("profiles.json")
MiB = 1 << 20


@dataclass(frozen=True)
class Profile:
    """One GPU-instance profile of one GPU model (a row of docs/mig-facts.md §1.2)."""

    name: str                  # "3g.40gb", as nvidia-smi and mig-parted name it
    id: int                    # the driver's profile id (nvidia-smi mig -lgip, column ID)
    nvml_enum: str             # NVML_GPU_INSTANCE_PROFILE_*
    nvml_enum_value: int
    compute_slices: int        # of the GPU's compute_slices
    memory_slices: int         # of the GPU's memory_slices
    memory_mib: int
    sms: int
    copy_engines: int
    max_count: int             # instances of this profile one GPU can hold
    placements: tuple[int, ...]   # legal start memory slices
    media_extensions: bool     # a +me profile (the GPU's media engines)
    source: str

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MiB

    def span(self, start: int) -> range:
        """The memory slices an instance placed at ``start`` holds."""
        return range(start, start + self.memory_slices)


@dataclass(frozen=True)
class GpuModel:
    """A GPU model's MIG geometry and profiles."""

    model: str                 # "H100 80GB"
    names: tuple[str, ...]     # other names --model accepts (NVML's, simgpu's key)
    pci_device_ids: tuple[str, ...]   # "0x233010DE", as mig-parted's device-filter wants them
    compute_slices: int
    memory_slices: int
    sources: tuple[str, ...]
    profiles: tuple[Profile, ...]

    def profile(self, name: str) -> Profile:
        return next(p for p in self.profiles if p.name == name)

    @property
    def largest(self) -> Profile:
        return max(self.profiles, key=lambda p: (p.memory_mib, p.sms))


def _key(name: str) -> str:
    """A model's name as --model compares it: "NVIDIA H100 80GB HBM3",
    "h100-80gb" and "H100 80GB" differ only in case and punctuation."""
    return re.sub(r"[^a-z0-9]", "", name.lower()).removeprefix("nvidia")


@functools.cache
def models() -> tuple[GpuModel, ...]:
    """Every GPU model of the data file, in its order."""
    document = json.loads(DATA_PATH.read_text(encoding="utf-8"))
    return tuple(
        GpuModel(model=gpu["model"], names=tuple(gpu["names"]),
                 pci_device_ids=tuple(gpu["pci_device_ids"]),
                 compute_slices=gpu["compute_slices"], memory_slices=gpu["memory_slices"],
                 sources=tuple(gpu["sources"]),
                 profiles=tuple(Profile(**{**row, "placements": tuple(row["placements"])})
                                for row in gpu["profiles"]))
        for gpu in document["gpus"])


def model_names() -> str:
    """The models --model accepts, for messages: "A100 40GB, A100 80GB, ..."."""
    return ", ".join(gpu.model for gpu in models())


def find(name: str, source: str = "--model") -> GpuModel:
    """The model called ``name`` (its model name or any of its names, in any
    case and punctuation); UsageError naming the accepted ones otherwise."""
    for gpu in models():
        if _key(name) in {_key(gpu.model), *map(_key, gpu.names)}:
            return gpu
    raise UsageError(f"{source}: {name!r} is not a GPU model with MIG profiles here; "
                     f"accepted: {model_names()} (or their NVML names, e.g. 'NVIDIA H100 80GB HBM3')")


def by_pci_device_id(device_id: int) -> GpuModel | None:
    """The model of a PCI device id as NVML gives it (pciDeviceId, 0x233010DE)."""
    for gpu in models():
        if any(int(text, 16) == device_id for text in gpu.pci_device_ids):
            return gpu
    return None

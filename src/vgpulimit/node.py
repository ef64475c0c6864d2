"""The node as its operator sees it: every physical GPU as the NVIDIA driver
counts it (NVML, through nvidia-ml-py), and on each the containers whose
regions use it, joined with the driver's own figures.

Per GPU: what the driver says is used (NVML v2's `used`), what it keeps for
itself (v2's `reserved`, shown as such, never as anyone's use), what the
regions on it use, and the difference, "outside any cap" -- split into
processes the driver lists that are in no region (another tenant, a process
that escaped the shim) and the rest (processes it does not list).  Where NVML
has no v2, v1's `used` is shown, and said to hold the driver's reserve.  The
caps on a GPU added up are what is committed on it; above its memory, the GPU
is over-committed.

NVML is read through nvml.py: a function the driver lacks or does not
support leaves its figure unavailable (None, shown "n/a") and is named once
(NodeView.unavailable), never a traceback.

A region is placed on a GPU by the UUID its processes recorded for a device
and, for devices no process has used yet, by the GPUs the hook found the
container was given (identity.py).  Reads only; a node without a driver is
one line (``NodeView.error``), not a failure.

A GPU in MIG mode is followed by its MIG instances, each a Gpu of its own
(``mig`` says which: profile, GPU and compute instance): they hold the memory,
the processes and the containers, and the GPU itself only its total, its
reserve and what its instances use (the instances list its processes).  A
region's device is placed by its UUID's 32 hex digits: the region says GPU- or
MIG- only where the process that saw the device first could ask NVML."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from vgpulimit.identity import Identity, of_region
from vgpulimit.nvml import FUNCTION_NOT_FOUND, Nvml, NvmlError, Unavailable
from vgpulimit.nvml import session as nvml_session
from vgpulimit.nvml import text as nvml_text
from vgpulimit.region import DeviceSnapshot
from vgpulimit.status import ContainerView, Sample, Sampler


@dataclass(frozen=True)
class DriverProcess:
    pid: int                      # in the host's pid namespace
    used_bytes: int | None        # None: the driver does not say (NVML_VALUE_NOT_AVAILABLE)


@dataclass(frozen=True)
class MigSlot:
    """Where a MIG instance sits: its GPU and its place there."""

    parent_uuid: str              # the GPU's "GPU-..."
    index: int                    # its MIG device index on the GPU
    profile: str                  # "2g.20gb", as nvidia-smi and DCGM's GPU_I_PROFILE name it
    gpu_instance: int             # GPU_I_ID
    compute_instance: int


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as NVML reports it, or one of its MIG instances
    (``mig``); None: NVML did not say."""

    index: int
    uuid: str
    name: str
    bus_id: str
    total_bytes: int | None
    used_bytes: int | None        # as the driver means it: NVML v2's, without its reserve
                                  # (v1's, with it, where reserved_bytes is None)
    utilization_pct: int | None   # None: not supported
    processes: tuple[DriverProcess, ...] | None = ()   # None: NVML cannot list them
    minor: int | None = None      # /dev/nvidia<minor>; None: not known
    reserved_bytes: int | None = 0  # what the driver keeps for itself (NVML v2), apart from
                                  # used_bytes; None: not known apart, counted in used_bytes
    mig_mode: bool = False        # a GPU in MIG mode: its instances follow it
    mig: MigSlot | None = None    # a MIG instance of GPU `index`; None: a GPU

    @property
    def used_includes_reserved(self) -> bool:
        return self.used_bytes is not None and self.reserved_bytes is None


def _memory(nvml: Nvml, handle) -> tuple[int | None, int | None, int | None]:
    """(total, used, reserved) bytes: NVML v2's, where the driver's reserve is
    apart from used; else v1's, whose used includes it (reserved None)."""
    version = getattr(nvml.pynvml, "nvmlMemory_v2", None)
    v1_says = "used is v1's, with the driver's reserve"
    if version is None:
        nvml.note("nvmlDeviceGetMemoryInfo_v2", FUNCTION_NOT_FOUND, v1_says)
        v2 = None
    else:
        v2 = nvml.query("nvmlDeviceGetMemoryInfo", handle, version=version,
                        function="nvmlDeviceGetMemoryInfo_v2", shown=v1_says)
    if v2 is not None:
        return int(v2.total), int(v2.used), int(v2.reserved)
    v1 = nvml.query("nvmlDeviceGetMemoryInfo", handle, shown="memory n/a")
    if v1 is None:
        return None, None, None
    return int(v1.total), int(v1.used), None


def _processes(nvml: Nvml, handle) -> tuple[DriverProcess, ...] | None:
    """The processes the driver lists on the GPU (compute, then graphics);
    None when it cannot list the compute ones."""
    compute = nvml.query("nvmlDeviceGetComputeRunningProcesses_v3", handle,
                         shown="processes n/a")
    if compute is None:
        return None
    graphics = nvml.query("nvmlDeviceGetGraphicsRunningProcesses_v3", handle, default=[],
                          shown="graphics processes n/a")
    procs: dict[int, DriverProcess] = {}
    for p in [*compute, *graphics]:
        procs.setdefault(int(p.pid), DriverProcess(
            int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory)))
    return tuple(procs.values())


def _mig_instances(nvml: Nvml, gpu: Gpu, handle) -> Iterator[Gpu]:
    """The MIG instances of a GPU in MIG mode: its MIG devices, at the indices
    up to the maximum that have one (NOT_FOUND holes skipped, as tools do)."""
    for mig_index in range(nvml.query("nvmlDeviceGetMaxMigDeviceCount", handle, default=0) or 0):
        mig = nvml.query("nvmlDeviceGetMigDeviceHandleByIndex", handle, mig_index, note=False)
        if mig is None:
            continue
        name = nvml_text(nvml.query("nvmlDeviceGetName", mig, default="n/a", shown="name n/a"))
        total, used, reserved = _memory(nvml, mig)
        yield dataclasses.replace(
            gpu, uuid=nvml_text(nvml.required("nvmlDeviceGetUUID", mig)), name=name,
            total_bytes=total, used_bytes=used, reserved_bytes=reserved, utilization_pct=None,
            processes=_processes(nvml, mig), mig_mode=False,
            mig=MigSlot(parent_uuid=gpu.uuid, index=mig_index, profile=name.rpartition(" ")[2],
                        gpu_instance=int(nvml.query("nvmlDeviceGetGpuInstanceId", mig, default=-1)),
                        compute_instance=int(nvml.query("nvmlDeviceGetComputeInstanceId", mig,
                                                        default=-1))))


def read_node() -> tuple[tuple[Gpu, ...], tuple[Unavailable, ...]]:
    """Every GPU of the node, each in MIG mode followed by its instances, and
    what NVML did not answer about them (each function once); NvmlError when
    NVML cannot say which GPUs there are."""
    with nvml_session() as nvml:
        gpus = []
        count = nvml.required("nvmlDeviceGetCount", function="nvmlDeviceGetCount_v2")
        for index in range(count):
            handle = nvml.required("nvmlDeviceGetHandleByIndex", index,
                                   function="nvmlDeviceGetHandleByIndex_v2")
            total, used, reserved = _memory(nvml, handle)
            pci = nvml.query("nvmlDeviceGetPciInfo_v3", handle, shown="bus id n/a")
            mode = nvml.query("nvmlDeviceGetMigMode", handle, note=False)
            mig_mode = mode is not None and mode[0] == 1
            util = None if mig_mode else nvml.query("nvmlDeviceGetUtilizationRates", handle,
                                                    shown="utilisation n/a")
            gpu = Gpu(
                index=index,
                uuid=nvml_text(nvml.required("nvmlDeviceGetUUID", handle)),
                name=nvml_text(nvml.query("nvmlDeviceGetName", handle, default="n/a",
                                          shown="name n/a")),
                bus_id=nvml_text(pci.busId) if pci is not None else "",
                total_bytes=total,
                used_bytes=used,
                reserved_bytes=reserved,
                utilization_pct=None if util is None else int(util.gpu),
                processes=() if mig_mode else _processes(nvml, handle),
                minor=nvml.query("nvmlDeviceGetMinorNumber", handle, note=False),
                mig_mode=mig_mode,
            )
            gpus.append(gpu)
            if mig_mode:
                gpus += _mig_instances(nvml, gpu, handle)
        return tuple(gpus), nvml.unavailable


def read_gpus() -> tuple[Gpu, ...]:
    """Every GPU of the node; NvmlError when NVML cannot say which there are."""
    return read_node()[0]


# -- regions on GPUs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tenant:
    """One container's part of one GPU."""

    view: ContainerView
    identity: Identity
    index: int                    # the device as the container numbers it
    device: DeviceSnapshot | None  # None: given to the container, no cap, not used yet
    cap_bytes: int | None         # None: no cap
    view_total: int = 0           # the GPU's memory as NVML says it (0: not known)

    @property
    def out_bytes(self) -> int:
        """Its memory off the GPU while it is suspended (suspend.py)."""
        return self.view.suspend.out_on(self.index)

    @property
    def used_bytes(self) -> int:
        """What it holds on the GPU: its memory, less what is out."""
        held = self.device.used_bytes if self.device is not None else 0
        return max(held - self.out_bytes, 0)

    @property
    def share_pct(self) -> float | None:
        return self.view.share_pct.get(self.index)

    @property
    def throttled_ns(self) -> int:
        return self.device.throttled_ns if self.device is not None else 0

    @property
    def request_bytes(self) -> int | None:
        """What the container is guaranteed here: its request, else its cap (None: neither)."""
        if self.device is None or self.device.request is None:
            return self.cap_bytes
        total = self.device.total_bytes or self.view_total
        if not total:
            return self.cap_bytes
        asked = self.device.request.cap_bytes(total)
        return asked if self.cap_bytes is None or asked is None else min(asked, self.cap_bytes)

    @property
    def borrowed_bytes(self) -> int:
        """In use past its guarantee (lent by the GPU's spare memory)."""
        guaranteed = self.request_bytes
        return 0 if guaranteed is None else max(self.used_bytes - guaranteed, 0)

    @property
    def waiting(self) -> int:
        return self.device.waiting if self.device is not None else 0

    @property
    def waited_ns(self) -> int:
        return self.device.waited_ns if self.device is not None else 0

    @property
    def wait_timeouts(self) -> int:
        return self.device.wait_timeouts if self.device is not None else 0

    @property
    def name(self) -> str:
        name = self.identity.name or self.view.path
        return name if self.view.suspend.state == "running" else f"{name} [{self.view.suspend.state}]"


@dataclass(frozen=True)
class GpuView:
    gpu: Gpu
    tenants: tuple[Tenant, ...]
    outside: tuple[DriverProcess, ...] | None   # the driver's processes that are in no region;
                                                # None: the driver's list is not available

    @property
    def committed_bytes(self) -> int:
        """The caps on this GPU added up (containers with no cap count nothing)."""
        return sum(t.cap_bytes or 0 for t in self.tenants)

    @property
    def uncapped(self) -> int:
        return sum(1 for t in self.tenants if t.cap_bytes is None)

    @property
    def commit_ratio(self) -> float | None:
        """Committed over the GPU's memory; above 1: over-committed; None: its
        memory is not known."""
        return self.committed_bytes / self.gpu.total_bytes if self.gpu.total_bytes else None

    @property
    def overcommitted(self) -> bool:
        return self.gpu.total_bytes is not None and self.committed_bytes > self.gpu.total_bytes

    @property
    def requested_bytes(self) -> int:
        """The guarantees on this GPU added up (each container's request, else
        its cap): what admission holds the GPU's memory to."""
        return sum(t.request_bytes or 0 for t in self.tenants)

    @property
    def borrowed_bytes(self) -> int:
        return sum(t.borrowed_bytes for t in self.tenants)

    @property
    def waiters(self) -> int:
        return sum(t.waiting for t in self.tenants)

    @property
    def regions_used_bytes(self) -> int:
        return sum(t.used_bytes for t in self.tenants)

    @property
    def outside_bytes(self) -> int | None:
        """What the driver counts as used that no region holds; negative only
        when the two were read a moment apart while memory moved.  Never the
        driver's reserve, unless NVML has no v2 (Gpu.used_includes_reserved)."""
        if self.gpu.used_bytes is None:
            return None
        return self.gpu.used_bytes - self.regions_used_bytes

    @property
    def outside_processes_bytes(self) -> int | None:
        if self.outside is None:
            return None
        return sum(p.used_bytes or 0 for p in self.outside)

    @property
    def outside_other_bytes(self) -> int | None:
        """Outside any cap and in no process the driver lists."""
        if self.outside_bytes is None or self.outside_processes_bytes is None:
            return None
        return self.outside_bytes - self.outside_processes_bytes


@dataclass(frozen=True)
class NodeView:
    gpus: tuple[GpuView, ...] = ()
    error: str | None = None      # why there is no physical view (no driver); None: there is
    elsewhere: tuple[tuple[ContainerView, int], ...] = field(default=())   # (region, device)
                                  # on a GPU that NVML does not list (another node's, or gone)
    unavailable: tuple[Unavailable, ...] = ()   # what NVML did not answer, each function once


def _placements(view: ContainerView, identity: Identity,
                by_uuid: dict[str, Gpu]) -> Iterator[tuple[str | None, Tenant]]:
    """(GPU UUID, tenant) for each device of the region; the UUID is None
    for a device with a cap that no process has used and that the container
    may not have (VGPULIMIT_MEMORY caps all sixteen)."""
    devices = {dev.index: dev for dev in view.snapshot.devices}
    given = identity.gpus or ()
    for index in sorted(set(devices) | set(range(len(given)))):
        dev = devices.get(index)
        uuid = dev.uuid if dev is not None and dev.uuid else (
            given[index] if index < len(given) else None)
        gpu = by_uuid.get(uuid_key(uuid)) if uuid is not None else None
        total = (gpu.total_bytes or 0) if gpu is not None else 0
        cap = None
        if dev is not None and dev.limit is not None:
            cap = dev.cap_bytes if dev.cap_bytes is not None else (
                dev.limit.cap_bytes(total) if total else None)
        yield uuid, Tenant(view, identity, index, dev, cap, total)


def uuid_key(uuid: str) -> str:
    """A GPU's or MIG device's UUID without its GPU-/MIG- prefix: a region's
    device of unknown kind (bound where NVML could not say) reads as GPU-."""
    return uuid[4:].lower()


def build(sample: Sample, gpus: Sequence[Gpu],
          unavailable: tuple[Unavailable, ...] = ()) -> NodeView:
    by_uuid = {uuid_key(gpu.uuid): gpu for gpu in gpus}
    on: dict[str, list[Tenant]] = {uuid_key(gpu.uuid): [] for gpu in gpus}
    elsewhere = []
    inside: set[int] = set()
    for view in sample.views:
        identity = of_region(view.path, sample.pods)
        inside.update(pid for p in view.snapshot.processes if (pid := sample.host_pid(p)))
        for uuid, tenant in _placements(view, identity, by_uuid):
            if uuid is not None and uuid_key(uuid) in on:
                on[uuid_key(uuid)].append(tenant)
            elif uuid is not None:
                elsewhere.append((view, tenant.index))
    views = tuple(
        GpuView(gpu, tuple(on[uuid_key(gpu.uuid)]), None if gpu.processes is None else
                tuple(p for p in gpu.processes if p.pid not in inside))
        for gpu in gpus)
    return NodeView(views, None, tuple(elsewhere), unavailable)


def take(sampler: Sampler) -> tuple[Sample, NodeView]:
    """A sample of the regions and the node view of it, the GPUs read just
    after; the driver's processes outside any region are looked up too
    (their figures join the sample's)."""
    sample = sampler.sample(strict=False)
    try:
        gpus, unavailable = read_node()
    except NvmlError as exc:
        return sample, NodeView(error=str(exc))
    node = build(sample, gpus, unavailable)
    outside = {p.pid for gpu in node.gpus for p in gpu.outside or ()}
    details = {**sample.details, **sampler.look(outside)}
    return dataclasses.replace(sample, details=details, device_count=len(gpus)), node


# -- rendering (status) ----------------------------------------------------------------------------

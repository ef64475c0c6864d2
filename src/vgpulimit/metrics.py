"""`vgpulimit metrics`: the regions' limits and usage in Prometheus' exposition
format, read afresh on every scrape.  Reads only.

Every series is labelled with the container's region file (``region``) and
who it is: ``pod``, ``namespace``, ``container`` and ``pod_uid`` as the OCI
hook found them in the container's annotations (identity.py), else the pod
UID, container name and claim UID that the file's directories give in the
layouts of HAMi and KAI, and the pod's name and namespace where the kubelet's
log directories name that UID (layouts.py); "" where nothing says.  Series
about a device also carry the device index as the container numbers it, the
device's UUID ("" until a process of the container has seen the device) and
its modelName (NVML's name of the GPU of that UUID; "" where NVML cannot say).
Per-process series are bounded: at most ``max_processes`` per container and
device (per GPU for the processes outside any cap), the largest by memory;
the rest are summed into one series whose command is ``(others)`` and whose
pid and host_pid are "".
With --hami-names, the figures HAMi's vGPU monitor exports are served under
its names and labels too (_hami_families), so that HAMi's dashboards work.
Series about a GPU are labelled as DCGM exporter labels its own --
``UUID`` ("GPU-…"), ``modelName``, ``Hostname`` (the node: $NODE_NAME, else
the host's name), and on the physical GPU series ``gpu`` (its index) -- so
that a dashboard joins them with DCGM's without relabelling.  A MIG instance
is labelled as DCGM labels one: its GPU's UUID, index and modelName, and
``GPU_I_ID`` (its GPU instance) and ``GPU_I_PROFILE`` ("2g.20gb"); both are ""
elsewhere, which Prometheus reads as absent, as DCGM leaves them.
Devices a container has not used yet are left out.  The compute utilisation
is the share of the whole GPU that the container's kernels took since the
previous scrape (since the server started, for the first).  Per-process
memory is its own family, so that a sum over
vgpulimit_memory_used_bytes counts each byte once.  A region file that cannot
be read (truncated, garbled, gone) has vgpulimit_region_readable 0 and no
other series, its reason is logged once, and the scrape serves the others.

With --all, the physical GPUs as the driver counts them (vgpulimit_gpu_*,
labelled by the GPU's UUID, index and name): its memory, what the driver
counts as used (NVML v2, without its own reserve) and what it reserves for
itself, the caps committed on it and their ratio to its memory (above 1:
over-committed), and what is used outside any cap -- in all, and per process
the driver lists that is in no region.  Without a driver, these are left out
and the reason logged once; a figure NVML does not give (a function it lacks
or does not support) is left out, and the function named once in the log.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from vgpulimit import __version__
from vgpulimit.errors import UsageError, VgpulimitError
from vgpulimit.identity import region_labels
from vgpulimit.layouts import LABELS, pod_names
from vgpulimit.metrics_server import MetricsServer
from vgpulimit.node import Gpu, NodeView
from vgpulimit.node import uuid_key as node_uuid_key
from vgpulimit.processes import shown
from vgpulimit.status import Sample, Sampler

DEFAULT_LISTEN = "127.0.0.1:9489"
# Per-process series per container and device: the largest by memory, the rest summed.
DEFAULT_MAX_PROCESSES = 10
OTHERS = "(others)"
# A command line as a label value: enough to tell processes apart, not a whole argv.
_COMMAND_CHARS = 120
_LISTEN = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d{1,5})")


class ListenError(UsageError):
    """--listen is not HOST:PORT."""


class ServeError(VgpulimitError, RuntimeError):
    """The address cannot be listened on."""


def parse_listen(text: str) -> tuple[str, int]:
    """"HOST:PORT", "[IPv6]:PORT" or ":PORT" (every interface); port 0: any free one."""
    m = _LISTEN.fullmatch(text.strip())
    port = int(m["port"]) if m else -1
    if not m or port > 65535:
        raise ListenError(f"--listen {text!r}: expected HOST:PORT with a port 0-65535, "
                          f"e.g. {DEFAULT_LISTEN}, [::1]:9489 or :9489 (every interface)")
    host = m["v6"] if m["v6"] is not None else (m["host"] or "0.0.0.0")
    return host, port


def hostname() -> str:
    """The node, as DCGM exporter names it: $NODE_NAME (set from the pod's
    spec.nodeName in a DaemonSet), else the host's name."""
    return os.environ.get("NODE_NAME") or socket.gethostname()


def bounded(rows: Sequence[tuple[list[str], int]], most: int
            ) -> tuple[list[tuple[list[str], int]], int, int]:
    """The ``most`` largest rows (labels, bytes) and the bytes and count of the rest."""
    ranked = sorted(rows, key=lambda row: row[1], reverse=True)
    rest = ranked[most:]
    return ranked[:most], sum(b for _, b in rest), len(rest)


class RegionCollector(Collector):
    def __init__(self, sampler: Sampler, pod_logs: str | None = None,
                 physical: bool = False, max_processes: int = DEFAULT_MAX_PROCESSES,
                 hami_names: bool = False) -> None:
        self._sampler = sampler
        self._max_processes = max_processes
        self._hami_names = hami_names
        self._hostname = hostname()
        self._pod_logs = pod_logs
        self._physical = physical
        self._lock = threading.Lock()   # scrapes may overlap; the sampler keeps state
        self._complained: set[str] = set()
        # A device's UUID (node.uuid_key: a region says GPU- or MIG- only where NVML could)
        # -> its labels as DCGM gives them: UUID, modelName, GPU_I_ID,
        # GPU_I_PROFILE; modelName "" where NVML could not say.  A board's name
        # never changes: NVML is asked once per UUID.
        self._device_labels: dict[str, tuple[str, str, str, str]] = {}
        self._collections = 0

    def collect(self) -> Iterator[Metric]:
        """Every family, each label value printable (processes.shown): a
        directory, a process name or a command line is the tenant's choice,
        and a byte that is not UTF-8 in one of them would fail the whole
        scrape, a control character forge what a dashboard shows."""
        started = time.monotonic()
        with self._lock:
            self._collections += 1
            collections = self._collections
        families = list(self._families())
        took = GaugeMetricFamily("vgpulimit_scrape_duration_seconds",
                                 "Time this server took to read the regions for this scrape "
                                 "(scrapes that came while it read were served the same reading)")
        took.add_metric([], time.monotonic() - started)
        count = CounterMetricFamily("vgpulimit_scrape_collections_total",
                                    "Readings of the regions this server made (one serves every "
                                    "scrape that came while it ran)")
        count.add_metric([], collections)
        yield from _printable([*families, took, count])

    def _families(self) -> Iterator[Metric]:
        with self._lock:
            if self._physical:
                from vgpulimit import node

                sample, gpus = node.take(self._sampler)
            else:
                sample, gpus = self._sampler.sample(strict=False), None
            self._learn_device_labels(sample, gpus)
            device_labels = dict(self._device_labels)
        # Pods come and go: read at each scrape.
        reading = _Reading(sample, gpus, pod_names(self._pod_logs), device_labels, self._hostname,
                           self._max_processes)
        return _families(reading, self._complain, self._hami_names)

    def _learn_device_labels(self, sample, node) -> None:
        """The labels of the devices the containers have used, from the node
        view read for this scrape (--all), else from NVML once per new UUID.
        Where NVML cannot be read, modelName "" for now, and asked again at the
        next scrape."""
        if node is not None:
            self._device_labels.update((node_uuid_key(v.gpu.uuid), gpu_labels(v.gpu))
                                       for v in node.gpus)
        new = {node_uuid_key(dev.uuid) for view in sample.views for dev in view.snapshot.devices
               if dev.seen and dev.uuid and node_uuid_key(dev.uuid) not in self._device_labels}
        if not new or (node is not None and node.error is not None):
            return
        known: dict[str, tuple[str, str, str, str]] = {}
        if node is None:
            from vgpulimit import node as node_view
            from vgpulimit.nvml import NvmlError

            try:
                known = {node_uuid_key(gpu.uuid): gpu_labels(gpu) for gpu in node_view.read_gpus()}
            except NvmlError as exc:
                self._complain(f"modelName is \"\" on the containers' series: {exc}")
                return
        # A UUID NVML does not list (another node's GPU): "" for good.
        self._device_labels.update((key, known.get(key, (f"GPU-{key}", "", "", ""))) for key in new)

    def _complain(self, line: str) -> None:
        """Once per distinct problem: a scrape loop must not flood the log."""
        if line not in self._complained:
            self._complained.add(line)
            print(f"vgpulimit metrics: {shown(line)}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class _Reading:
    """One scrape's reading, which the families are written from: the regions'
    sample, the node's GPUs (with --all; else None), the pods by UID, each
    device's DCGM labels by UUID, the node's name, and how many processes a
    container's device lists."""

    sample: Sample
    gpus: NodeView | None
    pods: dict[str, tuple[str, str]]
    device_labels: dict[str, tuple[str, str, str, str]]
    hostname: str
    max_processes: int


def _families(r: _Reading, complain: Callable[[str], None], hami_names: bool) -> Iterator[Metric]:
    """Every family of one scrape but the scrape's own, in the order they are
    served; each problem told to ``complain``."""
    build = GaugeMetricFamily("vgpulimit_build_info", "1, labelled with vgpulimit's version",
                              labels=["version"])
    build.add_metric([__version__], 1)
    yield build
    yield _readable(r, complain)
    yield from _container_families(r)
    yield from _suspend_families(r)
    yield from _agent_families(r)
    if r.gpus is not None:
        yield from _physical_families(r, complain)
    if hami_names:
        yield from _hami_families(r)


def _suspend_families(r: _Reading) -> Iterator[Metric]:
    """Each container's suspends and resumes (suspend.py), of those ever suspended."""
    labels = ["region", *LABELS, "Hostname"]
    state = GaugeMetricFamily("vgpulimit_suspend_state", "1 for where the container is: running, "
                              "suspending, suspended or resuming", labels=[*labels, "state"])
    out = GaugeMetricFamily("vgpulimit_memory_out_bytes", "The container's device memory off the GPU "
                            "while it is suspended", labels=labels)
    suspends = CounterMetricFamily("vgpulimit_suspends_total", "Suspends of the container", labels=labels)
    resumes = CounterMetricFamily("vgpulimit_resumes_total", "Resumes of the container", labels=labels)
    suspended = CounterMetricFamily("vgpulimit_suspended_seconds_total", "Time the container was "
                                    "suspended", labels=labels)
    took = GaugeMetricFamily("vgpulimit_suspend_last_seconds", "How long the container's last suspend "
                             "(or resume) took", labels=[*labels, "action"])
    for view in r.sample.views:
        record = view.suspend
        if record.state == "running" and not record.suspends:
            continue
        named = [*_who(view.path, r.pods), r.hostname]
        state.add_metric([*named, record.state], 1)
        out.add_metric(named, record.out_total_bytes if record.state == "suspended" else 0)
        suspends.add_metric(named, record.suspends)
        resumes.add_metric(named, record.resumes)
        suspended.add_metric(named, record.suspended_total_ns(view.snapshot.taken_ns) / 1e9)
        took.add_metric([*named, "suspend"], record.last_suspend_ns / 1e9)
        took.add_metric([*named, "resume"], record.last_resume_ns / 1e9)
    yield from (state, out, suspends, resumes, suspended, took)


def _agent_families(r: _Reading) -> Iterator[Metric]:
    """The node agent of each board the containers have rows in (docs/agent.md)."""
    import time

    from vgpulimit.agent.journal import node_agents

    labels = ["board", "Hostname"]
    up = GaugeMetricFamily("vgpulimit_agent_up", "1 while a node agent serves the board (alive, looked "
                           "within 5 s); 0: nothing is suspended for others", labels=labels)
    held = GaugeMetricFamily("vgpulimit_agent_suspended_containers", "Containers the agent holds suspended",
                             labels=labels)
    suspends = CounterMetricFamily("vgpulimit_agent_suspends_total", "Containers the agent suspended",
                                   labels=labels)
    resumes = CounterMetricFamily("vgpulimit_agent_resumes_total", "Containers the agent resumed",
                                  labels=labels)
    refused = CounterMetricFamily("vgpulimit_agent_refusals_total", "Suspends or resumes the agent tried "
                                  "and the driver or the container refused", labels=labels)
    who = GaugeMetricFamily("vgpulimit_agent_holds", "1 for each container the agent holds suspended, "
                            "with the container it was suspended for", labels=["region", "for_region", *labels])
    for agent in node_agents([v.agent for v in r.sample.views], time.monotonic_ns()):
        named = [agent.board, r.hostname]
        up.add_metric(named, int(agent.serving))
        s = agent.state
        if s is None:
            continue
        held.add_metric(named, len(s.suspended))
        suspends.add_metric(named, s.suspends)
        resumes.add_metric(named, s.resumes)
        refused.add_metric(named, s.refusals)
        for name, entry in s.suspended.items():
            who.add_metric([name, entry.for_name or "", *named], 1)
    yield from (up, held, suspends, resumes, refused, who)


def _readable(r: _Reading, complain: Callable[[str], None]) -> Metric:
    sample, pods = r.sample, r.pods
    # Hostname here too: a dashboard counts the unreadable regions by node.
    readable = GaugeMetricFamily("vgpulimit_region_readable",
                                 "Whether the container's region file could be read at this "
                                 "scrape (0: truncated, garbled or unreadable; no other series)",
                                 labels=["region", *LABELS, "Hostname"])
    for view in sample.views:
        readable.add_metric([*_who(view.path, pods), r.hostname], 1)
    for path, why in sample.errors:
        readable.add_metric([*_who(path, pods), r.hostname], 0)
        complain(f"region {path}: {why}")
    return readable

def _container_families(r: _Reading) -> list[Metric]:
    """The series of each device a container has used, and of its processes there."""
    sample, pods = r.sample, r.pods
    families = _DeviceFamilies.make(r.max_processes)
    for view in sample.views:
        snap = view.snapshot
        for dev in snap.devices:
            if not dev.seen:
                continue
            uuid, model, instance, profile = r.device_labels.get(
                node_uuid_key(dev.uuid or ""), (dev.uuid or "", "", "", ""))
            labels = [*_who(snap.path, pods), str(dev.index), uuid, model, r.hostname, instance,
                      profile]
            families.add(labels, dev, snap)
            rows = []
            for proc in snap.processes:
                host = sample.host_pid(proc)
                details = sample.details.get(host or -1)
                if details is not None and details.gone:
                    continue   # never memory for a process that is gone
                if dev.index in proc.used_bytes:
                    rows.append(([str(proc.pid), str(host or ""), proc.comm],
                                 proc.used_bytes[dev.index]))
            _add_bounded(families.process_used, labels, rows, r.max_processes)
    return families.in_order()

def _hami_families(r: _Reading) -> Iterator[Metric]:
    """The same figures under the names and labels of HAMi's vGPU monitor
    (its legacy names, which HAMi's own dashboards query), for a node that
    moves from HAMi: its zone label is "vGPU", a device type is
    "NVIDIA-" and NVML's name, utilisations are percentages.  Only what
    vgpulimit measures: no context/module/data split of a container's
    memory (those labels are ""), no last kernel time, no MIG."""
    sample, node, pods = r.sample, r.gpus, r.pods
    who = ["zone", "podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid"]
    usage = GaugeMetricFamily("vGPU_device_memory_usage_in_bytes", "vGPU device usage",
                              labels=who)
    limit = GaugeMetricFamily("vGPU_device_memory_limit_in_bytes", "vGPU device limit",
                              labels=who)
    memory = GaugeMetricFamily("Device_memory_desc_of_container",
                               "Container device memory description",
                               labels=[*who, "context", "module", "data", "offset"])
    utilization = GaugeMetricFamily("Device_utilization_desc_of_container",
                                    "Container device utilization description", labels=who)
    for view in sample.views:
        names = region_labels(view.path, pods)
        for dev in view.snapshot.devices:
            if not dev.seen:
                continue
            labels = ["vGPU", names["namespace"], names["pod"], names["container"],
                      str(dev.index), dev.uuid or ""]
            usage.add_metric(labels, dev.used_bytes)
            # HAMi's limit is the device's memory where there is no cap.
            room = dev.cap_bytes if dev.cap_bytes is not None else dev.total_bytes
            if room:
                limit.add_metric(labels, room)
            memory.add_metric([*labels, "", "", "", ""], dev.used_bytes)
            share = view.share_pct.get(dev.index)
            if share is not None:   # measured between two scrapes: none at the first
                utilization.add_metric(labels, share)
    yield from (usage, limit, memory, utilization)
    if node is None or node.error is not None:
        return
    host = ["zone", "nodeid", "deviceidx", "deviceuuid", "devicetype"]
    host_memory = GaugeMetricFamily("HostGPUMemoryUsage", "GPU device memory usage",
                                    labels=host)
    host_util = GaugeMetricFamily("HostCoreUtilization", "GPU core utilization", labels=host)
    for view in node.gpus:
        g = view.gpu
        labels = ["vGPU", r.hostname, str(g.index), g.uuid, f"NVIDIA-{g.name}"]
        if g.used_bytes is not None:
            host_memory.add_metric(labels, g.used_bytes)
        if g.utilization_pct is not None:
            host_util.add_metric(labels, g.utilization_pct)
    yield from (host_memory, host_util)

def _physical_families(r: _Reading, complain: Callable[[str], None]) -> Iterator[Metric]:
    node, sample = r.gpus, r.sample
    if node.error is not None:
        complain(f"no physical GPU view: {node.error}")
        return
    names = ["UUID", "gpu", "modelName", "Hostname", "GPU_I_ID", "GPU_I_PROFILE"]

    def gauge(name: str, text: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, text, labels=[*names, *extra])

    for missing in node.unavailable:
        complain(missing.line)
    total = gauge("vgpulimit_gpu_memory_total_bytes", "Memory of the GPU")
    used = gauge("vgpulimit_gpu_memory_used_bytes", "Memory of the GPU in use, as the driver "
                 "counts it (NVML v2: without the driver's reserve; where NVML has no v2, "
                 "v1's, with it, and vgpulimit_gpu_memory_reserved_bytes is absent)")
    reserved = gauge("vgpulimit_gpu_memory_reserved_bytes",
                     "Memory the driver keeps for itself on the GPU (NVML v2 reserved): "
                     "neither used nor outside any cap")
    committed = gauge("vgpulimit_gpu_memory_committed_bytes",
                      "The memory caps of the containers on the GPU, added up")
    ratio = gauge("vgpulimit_gpu_memory_committed_ratio",
                  "Committed over the GPU's memory (above 1: over-committed)")
    uncapped = gauge("vgpulimit_gpu_uncapped_containers",
                     "Containers on the GPU with no memory cap")
    unaccounted = gauge("vgpulimit_gpu_memory_unaccounted_bytes",
                        "Memory the driver counts as used that no container's region holds "
                        "(outside any cap)")
    outside = gauge("vgpulimit_gpu_process_unaccounted_bytes",
                    f"Memory a process the driver lists holds outside any cap (in no region; "
                    f"the largest {r.max_processes}, command {OTHERS!r}: the rest, "
                    f"summed)",
                    ("host_pid", "command"))
    requested = gauge("vgpulimit_gpu_memory_requested_bytes",
                      "The memory guarantees of the containers on the GPU (each one's request, else "
                      "its cap), added up: what --admit holds to the GPU's memory")
    gpu_borrowed = gauge("vgpulimit_gpu_memory_borrowed_bytes",
                         "Memory the containers on the GPU hold past their requests, added up")
    waiters = gauge("vgpulimit_gpu_memory_waiting_allocations",
                    "Allocations waiting for memory on the GPU now")
    util = gauge("vgpulimit_gpu_utilization_ratio",
                 "Share of the last sample period the GPU was busy, as the driver says (0-1)")
    for view in node.gpus:
        g = view.gpu
        uuid, model, instance, profile = gpu_labels(g)
        labels = [uuid, str(g.index), model, r.hostname, instance, profile]
        # A figure NVML did not give is left out, never shown as 0.
        if g.total_bytes is not None:
            total.add_metric(labels, g.total_bytes)
        if g.used_bytes is not None:
            used.add_metric(labels, g.used_bytes)
        if g.reserved_bytes is not None:
            reserved.add_metric(labels, g.reserved_bytes)
        committed.add_metric(labels, view.committed_bytes)
        if view.commit_ratio is not None:
            ratio.add_metric(labels, view.commit_ratio)
        uncapped.add_metric(labels, view.uncapped)
        requested.add_metric(labels, view.requested_bytes)
        gpu_borrowed.add_metric(labels, view.borrowed_bytes)
        waiters.add_metric(labels, view.waiters)
        if view.outside_bytes is not None:
            unaccounted.add_metric(labels, view.outside_bytes)
        if g.utilization_pct is not None:
            util.add_metric(labels, g.utilization_pct / 100)
        rows = []
        for proc in view.outside or ():
            details = sample.details.get(proc.pid)
            if proc.used_bytes is None or (details is not None and details.gone):
                continue   # never memory for a process that is gone
            command = details.command[:_COMMAND_CHARS] if details is not None else ""
            rows.append(([str(proc.pid), command], proc.used_bytes))
        _add_bounded(outside, labels, rows, r.max_processes)
    yield from (total, used, reserved, committed, ratio, uncapped, unaccounted, outside, util, requested,
                gpu_borrowed, waiters)

def _add_bounded(family: GaugeMetricFamily, labels: list[str], rows: Sequence[tuple[list[str], int]],
                 most: int) -> None:
    """The ``most`` largest rows, and the rest summed in one whose command is OTHERS."""
    kept, rest, count = bounded(rows, most)
    for own, value in kept:
        family.add_metric([*labels, *own], value)
    if count:
        blank = [""] * (len(rows[0][0]) - 1)
        family.add_metric([*labels, *blank, OTHERS], rest)


def _who(path: str, pods: dict[str, tuple[str, str]]) -> list[str]:
    """A region's labels: its path, then who it is (identity.py, layouts.py)."""
    return [path, *region_labels(path, pods).values()]


_DEVICE_LABELS = ["region", *LABELS, "device", "UUID", "modelName", "Hostname", "GPU_I_ID", "GPU_I_PROFILE"]


@dataclass
class _DeviceFamilies:
    """The series about a device a container has used, one family each, in
    the order they are served."""

    limit: GaugeMetricFamily
    used: GaugeMetricFamily
    process_used: GaugeMetricFamily
    refusals: CounterMetricFamily
    cores: GaugeMetricFamily
    policy: GaugeMetricFamily
    busy: CounterMetricFamily
    throttled: CounterMetricFamily
    yielded: CounterMetricFamily
    request: GaugeMetricFamily
    borrowed: GaugeMetricFamily
    waiting: GaugeMetricFamily
    waited: CounterMetricFamily
    timeouts: CounterMetricFamily
    borrow_refusals: CounterMetricFamily

    @classmethod
    def make(cls, max_processes: int) -> _DeviceFamilies:
        labels = _DEVICE_LABELS

        def gauge(name: str, text: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, text, labels=labels)

        def counter(name: str, text: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, text, labels=labels)

        return cls(
            limit=gauge("vgpulimit_memory_limit_bytes", "Memory cap of the device for the container"),
            used=gauge("vgpulimit_memory_used_bytes", "Device memory the container holds"),
            process_used=GaugeMetricFamily(
                "vgpulimit_process_memory_used_bytes",
                f"Device memory one process of the container holds (the largest "
                f"{max_processes}; command {OTHERS!r}: the rest, summed)",
                labels=[*labels, "pid", "host_pid", "command"]),
            refusals=counter("vgpulimit_oom_refusals_total", "Allocations refused at the memory cap"),
            cores=gauge("vgpulimit_compute_limit_ratio", "Compute share the container is capped at (0.3: 30 %)"),
            policy=GaugeMetricFamily("vgpulimit_compute_policy",
                                     "1 for the container's compute policy: hard (never past the "
                                     "share), borrow (past it while no other tenant uses the device) "
                                     "or none", labels=[*labels, "policy"]),
            # A counter, for rate(): a utilisation "since the previous scrape"
            # would be wrong for every scraper but one.
            busy=counter("vgpulimit_compute_busy_seconds_total",
                         "GPU time the container's kernels took (its rate is the share of the GPU they took)"),
            throttled=counter("vgpulimit_throttled_seconds_total",
                              "Time the container's launches waited for compute budget"),
            yielded=counter("vgpulimit_yielded_seconds_total",
                            "Time the container's launches held back for containers of a higher priority"),
            request=gauge("vgpulimit_memory_request_bytes",
                          "Memory guaranteed to the container on the device (its request, else its cap)"),
            borrowed=gauge("vgpulimit_memory_borrowed_bytes", "Device memory the container holds past its request"),
            waiting=gauge("vgpulimit_memory_waiting_allocations",
                          "Allocations of the container waiting for memory now"),
            waited=counter("vgpulimit_memory_waited_seconds_total",
                           "Time the container's allocations waited for memory"),
            timeouts=counter("vgpulimit_memory_wait_timeouts_total", "Waits for memory that ended in a refusal"),
            borrow_refusals=counter("vgpulimit_memory_borrow_refusals_total",
                                    "Allocations past the request refused for memory other containers use or "
                                    "are guaranteed"))

    def add(self, labels: list[str], dev, snap) -> None:
        """One device's figures; its processes' are added apart (bounded)."""
        if dev.cap_bytes is not None:
            self.limit.add_metric(labels, dev.cap_bytes)
        self.used.add_metric(labels, dev.used_bytes)
        self.refusals.add_metric(labels, dev.oom_refusals)
        if dev.cores_pct:
            self.cores.add_metric(labels, dev.cores_pct / 100)
            self.policy.add_metric([*labels, dev.cores_policy], 1)
        self.busy.add_metric(labels, dev.busy_ns / 1e9)
        self.throttled.add_metric(labels, dev.throttled_ns / 1e9)
        if snap.priority is not None:
            self.yielded.add_metric(labels, dev.yielded_ns / 1e9)
        if dev.request_bytes is not None:
            self.request.add_metric(labels, dev.request_bytes)
        self.borrowed.add_metric(labels, dev.borrowed_bytes)
        self.waiting.add_metric(labels, dev.waiting)
        self.waited.add_metric(labels, dev.waited_ns / 1e9)
        self.timeouts.add_metric(labels, dev.wait_timeouts)
        self.borrow_refusals.add_metric(labels, dev.borrow_refusals)

    def in_order(self) -> list[Metric]:
        return [getattr(self, f.name) for f in fields(self)]


def gpu_labels(gpu: Gpu) -> tuple[str, str, str, str]:
    """(UUID, modelName, GPU_I_ID, GPU_I_PROFILE) of a GPU or MIG instance, as
    DCGM exporter labels them: a MIG instance by its GPU's UUID and model."""
    if gpu.mig is None:
        return gpu.uuid, gpu.name, "", ""
    return (gpu.mig.parent_uuid, gpu.name.rpartition(" MIG ")[0] or gpu.name,
            str(gpu.mig.gpu_instance), gpu.mig.profile)


def _printable(families: Iterable[Metric]) -> Iterator[Metric]:
    for family in families:
        family.samples = [
            sample if all(value.isprintable() for value in sample.labels.values())
            else sample._replace(labels={name: shown(value) for name, value in sample.labels.items()})
            for sample in family.samples]
        yield family


def serve(listen: str, paths: Sequence[str] = (), directory: str | Sequence[str] | None = None,
          pod_logs: str | None = None, max_processes: int = DEFAULT_MAX_PROCESSES,
          hami_names: bool = False) -> None:
    """Serves /metrics until interrupted.  A named region that cannot be read
    is an error at start; later, and for regions found under ``directory``,
    problems are logged once and the scrape goes on without them."""
    host, port = parse_listen(listen)
    sampler = Sampler(paths, directory)
    sampler.sample()   # the start of the first utilisation window; raises for a bad --region
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RegionCollector(sampler, pod_logs, physical=directory is not None,
                                      max_processes=max_processes, hami_names=hami_names))
    at = f"[{host}]" if ":" in host else host
    try:
        server = MetricsServer(host, port, registry.collect)
    except OSError as exc:
        raise ServeError(f"--listen {listen}: cannot listen on {at}:{port}: "
                         f"{exc.strerror or exc}") from None
    print(f"vgpulimit: serving metrics on http://{at}:{server.server_port}/metrics",
          file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()

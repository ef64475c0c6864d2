"""`vgpulimit metrics`: the regions' limits and usage in Prometheus' exposition
format, read afresh on every scrape.  Reads only.

Every series is labelled with the container's region file (``region``), the
pod UID, container name and claim UID that the file's directories give in the
layouts of HAMi and KAI, and the pod's name and namespace where the kubelet's
log directories name that UID ("" elsewhere; layouts.py), the device index as the
container numbers it, and the device's UUID ("" until a process of the
container has seen the device).  Devices a container has not used yet
are left out.  The compute utilisation is the share of the whole GPU that the
container's kernels took since the previous scrape (since the server started,
for the first).  Per-process memory is its own family, so that a sum over
vgpulimit_memory_used_bytes counts each byte once.  A region file that cannot
be read (truncated, garbled, gone) has vgpulimit_region_readable 0 and no other
series, its reason is logged once, and the scrape serves the others."""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Iterator, Sequence

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from vgpulimit.layouts import LABELS, layout_labels, pod_names
from vgpulimit.status import Sampler

DEFAULT_LISTEN = "127.0.0.1:9400"
_LISTEN = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d{1,5})")


class ListenError(ValueError):
    """--listen is not HOST:PORT."""


class ServeError(RuntimeError):
    """The address cannot be listened on."""


def parse_listen(text: str) -> tuple[str, int]:
    """"HOST:PORT", "[IPv6]:PORT" or ":PORT" (every interface); port 0: any free one."""
    m = _LISTEN.fullmatch(text.strip())
    port = int(m["port"]) if m else -1
    if not m or port > 65535:
        raise ListenError(f"--listen {text!r}: expected HOST:PORT with a port 0-65535, "
                          f"e.g. {DEFAULT_LISTEN}, [::1]:9400 or :9400 (every interface)")
    host = m["v6"] if m["v6"] is not None else (m["host"] or "0.0.0.0")
    return host, port


class RegionCollector(Collector):
    def __init__(self, sampler: Sampler, pod_logs: str | None = None) -> None:
        self._sampler = sampler
        self._pod_logs = pod_logs
        self._lock = threading.Lock()   # scrapes may overlap; the sampler keeps state
        self._complained: set[str] = set()

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            sample = self._sampler.sample(strict=False)
        pods = pod_names(self._pod_logs)   # pods come and go: read at each scrape

        def _who(path: str) -> list[str]:
            return [path, *layout_labels(path, pods).values()]

        readable = GaugeMetricFamily("vgpulimit_region_readable",
                                     "Whether the container's region file could be read at this "
                                     "scrape (0: truncated, garbled or unreadable; no other series)",
                                     labels=["region", *LABELS])
        for view in sample.views:
            readable.add_metric(_who(view.path), 1)
        for path, why in sample.errors:
            readable.add_metric(_who(path), 0)
            self._complain(f"region {path}: {why}")
        device_labels = ["region", *LABELS, "device", "uuid"]
        limit = GaugeMetricFamily("vgpulimit_memory_limit_bytes",
                                  "Memory cap of the device for the container", labels=device_labels)
        used = GaugeMetricFamily("vgpulimit_memory_used_bytes",
                                 "Device memory the container holds", labels=device_labels)
        process_used = GaugeMetricFamily(
            "vgpulimit_process_memory_used_bytes", "Device memory one process of the container holds",
            labels=[*device_labels, "pid", "host_pid", "command"])
        refusals = CounterMetricFamily("vgpulimit_oom_refusals_total",
                                       "Allocations refused at the memory cap", labels=device_labels)
        cores = GaugeMetricFamily("vgpulimit_compute_limit_percent",
                                  "Compute share the container is capped at", labels=device_labels)
        policy = GaugeMetricFamily("vgpulimit_compute_policy",
                                   "1 for the container's compute policy: hard (never past the "
                                   "share), borrow (past it while no other tenant uses the device) "
                                   "or none", labels=[*device_labels, "policy"])
        share = GaugeMetricFamily("vgpulimit_compute_utilization_percent",
                                  "Share of the whole GPU the container's kernels took since the "
                                  "previous scrape", labels=device_labels)
        throttled = CounterMetricFamily("vgpulimit_throttled_seconds_total",
                                        "Time the container's launches waited for compute budget",
                                        labels=device_labels)
        for view in sample.views:
            snap = view.snapshot
            for dev in snap.devices:
                if not dev.seen:
                    continue
                labels = [*_who(snap.path), str(dev.index), dev.uuid or ""]
                if dev.cap_bytes is not None:
                    limit.add_metric(labels, dev.cap_bytes)
                used.add_metric(labels, dev.used_bytes)
                refusals.add_metric(labels, dev.oom_refusals)
                if dev.cores_pct:
                    cores.add_metric(labels, dev.cores_pct)
                    policy.add_metric([*labels, dev.cores_policy], 1)
                if dev.index in view.share_pct:
                    share.add_metric(labels, view.share_pct[dev.index])
                throttled.add_metric(labels, dev.throttled_ns / 1e9)
                for proc in snap.processes:
                    if dev.index in proc.used_bytes:
                        process_used.add_metric(
                            [*labels, str(proc.pid), str(proc.host_pid or ""), proc.comm],
                            proc.used_bytes[dev.index])
        yield from (readable, limit, used, process_used, refusals, cores, policy, share, throttled)

    def _complain(self, line: str) -> None:
        """Once per distinct problem: a scrape loop must not flood the log."""
        if line not in self._complained:
            self._complained.add(line)
            print(f"vgpulimit metrics: {line}", file=sys.stderr, flush=True)


def serve(listen: str, paths: Sequence[str] = (), directory: str | Sequence[str] | None = None,
          pod_logs: str | None = None) -> None:
    """Serves /metrics until interrupted.  A named region that cannot be read
    is an error at start; later, and for regions found under ``directory``,
    problems are logged once and the scrape goes on without them."""
    host, port = parse_listen(listen)
    sampler = Sampler(paths, directory)
    sampler.sample()   # the start of the first utilisation window; raises for a bad --region
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RegionCollector(sampler, pod_logs))
    shown = f"[{host}]" if ":" in host else host
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ServeError(f"--listen {listen}: cannot listen on {shown}:{port}: "
                         f"{exc.strerror or exc}") from None
    print(f"vgpulimit: serving metrics on http://{shown}:{server.server_port}/metrics",
          file=sys.stderr, flush=True)
    try:
        thread.join()
    finally:
        server.shutdown()

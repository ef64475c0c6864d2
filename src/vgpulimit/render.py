"""The views written out: `vgpulimit status` for people (80 columns) and for
programs (JSON, bytes as integers), a container's and the node's.  The
models they write (status.py: regions and the share measured; node.py: the
GPUs as the driver counts them) never import this module, as nvitop's api
never imports its tui; top.py draws the same models on a terminal.  The
display helpers (a table, a cut line, a byte count) are here once."""

from __future__ import annotations

import json
import time
from typing import Any

from vgpulimit import identity
from vgpulimit.agent.journal import node_agents
from vgpulimit.limits import format_bytes, format_wait
from vgpulimit.node import DriverProcess, Gpu, GpuView, NodeView, Tenant, uuid_key
from vgpulimit.processes import ProcessDetails, format_age, plain, shown
from vgpulimit.region import DeviceSnapshot, ProcessSnapshot, RegionSnapshot
from vgpulimit.status import ContainerView, Sample, devices_of

# `status --json`'s "version", as verify --json's: bumped when a field changes meaning or goes;
# a field added leaves it.  verify --json carries its own (verify.schema.json).
STATUS_VERSION = 1


def _bytes_or_dash(count: int | None) -> str:
    return "-" if count is None else format_bytes(count)


def _limit_text(dev: DeviceSnapshot) -> str:
    if dev.limit is None:
        return "none"
    if dev.limit.ppm and dev.cap_bytes is not None:
        percent = dev.limit.describe().split("%")[0]
        return f"{format_bytes(dev.cap_bytes)} ({percent}%)"
    return dev.limit.describe()


def _index_ranges(indices: list[int]) -> str:
    """[1, 2, 3, 5] -> "1-3,5"."""
    parts: list[str] = []
    start = prev = indices[0]
    for index in indices[1:] + [None]:
        if index is not None and index == prev + 1:
            prev = index
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if index is not None:
            start = prev = index
    return ",".join(parts)


def _device_rows(devices: tuple[DeviceSnapshot, ...]) -> list[tuple[str, ...]]:
    """One row per device; devices that no process has used yet and that have
    the same limit share a row, so sixteen unused slots take one line."""
    rows: list[tuple[str, ...]] = []
    unseen: dict[str, list[int]] = {}
    for dev in devices:
        if dev.total_bytes == 0 and dev.used_bytes == 0 and dev.oom_refusals == 0:
            unseen.setdefault(_limit_text(dev), []).append(dev.index)
            continue
        rows.append((
            str(dev.index),
            _limit_text(dev),
            format_bytes(dev.used_bytes),
            _bytes_or_dash(dev.free_bytes),
            # What the container may use, as nvidia-smi's Total reads inside it;
            # the device's own size has its column.
            _bytes_or_dash(dev.cap_bytes if dev.cap_bytes is not None else dev.total_bytes or None),
            _bytes_or_dash(dev.total_bytes or None),
            str(dev.oom_refusals),
        ))
    for limit_text, indices in unseen.items():
        rows.append((_index_ranges(indices), limit_text, "-", "-", "-", "not seen", "-"))
    return rows


def _process_used(proc: ProcessSnapshot) -> str:
    if not proc.used_bytes:
        return "0 B"
    return ", ".join(f"{format_bytes(n)} on {d}" for d, n in sorted(proc.used_bytes.items()))


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in [header, *rows]]


def _share_text(view: ContainerView, index: int) -> str:
    share = view.share_pct.get(index)
    return "n/a" if share is None else f"{share:.0f}%"


def _compute_rows(view: ContainerView, devices: tuple[DeviceSnapshot, ...]
                  ) -> list[tuple[str, ...]]:
    """Devices the container used, or that have a compute cap (unused ones
    with the same cap share a row)."""
    rows: list[tuple[str, ...]] = []
    unseen: dict[int, list[int]] = {}
    for dev in devices:
        if not dev.seen:
            if dev.cores_pct:
                unseen.setdefault(dev.cores_pct, []).append(dev.index)
            continue
        rows.append((str(dev.index), _cores_text(dev.cores_pct, dev.cores_policy),
                     _share_text(view, dev.index), f"{dev.throttled_ns / 1e9:.1f} s"))
    for cores, indices in unseen.items():
        rows.append((_index_ranges(indices), f"{cores}%", "-", "-"))
    return rows


def _elastic_rows(devices: tuple[DeviceSnapshot, ...], wait_ns: int) -> list[tuple[str, ...]]:
    """Devices with a request below the cap, or that waited (with a memory wait set)."""
    return [(str(dev.index), _bytes(dev.request_bytes, "the cap") if dev.request is not None else "the cap",
             format_bytes(dev.borrowed_bytes), str(dev.waiting), f"{dev.waited_ns / 1e9:.1f} s",
             str(dev.wait_timeouts), str(dev.borrow_refusals))
            for dev in devices if dev.seen and (dev.request is not None or wait_ns or dev.waited_ns)]


def _cores_text(cores_pct: int, policy: str) -> str:
    """"30%", or "30% borrow" / "30% none" where the policy is not the hard cap."""
    if not cores_pct:
        return "none"
    return f"{cores_pct}%" + ("" if policy == "hard" else f" {policy}")


def priority_text(snap: RegionSnapshot, yielded_ns: int | None = None) -> str | None:
    """What the views say of a container's priority (None: it has none): its
    wait for higher ones is ``yielded_ns`` (one device's, where a line is about
    one device), else that of all its devices."""
    if snap.priority is None:
        return None
    if snap.board is None:
        return f"priority {snap.priority} asked for, but no board: takes no part"
    if yielded_ns is None:
        yielded_ns = sum(d.yielded_ns for d in snap.devices)
    return f"priority {snap.priority} (held back for higher ones: {yielded_ns / 1e9:.1f} s)"


def process_row(proc: ProcessSnapshot, details: ProcessDetails | None,
                host_pid: int | None = None) -> tuple[str, ...]:
    """PID, HOST PID, USER, CPU, RSS, AGE, USED, COMMAND; a process that is
    gone shows no memory."""
    host = str(host_pid or proc.host_pid or "-")
    comm = shown(proc.comm)
    if details is not None and details.gone:
        return (str(proc.pid), host, "-", "-", "-", "-", "gone", comm)
    if details is None:
        return (str(proc.pid), host, "-", "-", "-", "-", _process_used(proc), comm)
    return (str(proc.pid), host, shown(details.user) or "-",
            "-" if details.cpu_pct is None else f"{details.cpu_pct:.0f}%",
            _bytes_or_dash(details.rss_bytes), format_age(details.age_s), _process_used(proc),
            shown(details.command) or comm)


PROCESS_HEADER = ("PID", "HOST PID", "USER", "CPU", "RSS", "AGE", "GPU MEMORY", "COMMAND")


def _cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[:width - 1] + "…"


def render_text(view: ContainerView | RegionSnapshot, sample: Sample | None = None,
                width: int = 80) -> str:
    if isinstance(view, RegionSnapshot):
        view = ContainerView(view)
    snap = view.snapshot
    who = identity.of_region(snap.path, sample.pods if sample else None)
    named = f" - {shown(who.name)}" if who.name else ""
    lines = [f"region {shown(snap.path)} (generation {snap.generation}){named}", ""]
    said = priority_text(snap)
    if said is not None:
        lines[-1:-1] = [said]
    suspended = view.suspend.view_text(snap.taken_ns)
    if suspended is not None:
        lines[-1:-1] = [suspended]
    if view.agent is not None and view.agent.said(snap.memory_wait_ns):
        lines[-1:-1] = [view.agent.text()]
    if snap.memory_wait_ns:
        wait = format_wait(snap.memory_wait_ns)
        lines[-1:-1] = [f"memory wait {wait}: an allocation that would be refused waits that long for memory"]
    devices = devices_of(view, sample)
    if devices:
        lines += _table(("DEVICE", "LIMIT", "USED", "FREE", "TOTAL", "PHYSICAL", "OOM REFUSED"),
                        _device_rows(devices))
        elastic = _elastic_rows(devices, snap.memory_wait_ns)
        if elastic:
            lines.append("")
            lines += _table(("DEVICE", "REQUEST", "BORROWED", "WAITING", "WAITED", "TIMEOUTS",
                             "BORROW REFUSED"), elastic)
        compute = _compute_rows(view, devices)
        if compute:
            lines.append("")
            lines += _table(("DEVICE", "COMPUTE CAP", "MEASURED SHARE", "THROTTLED"), compute)
    else:
        lines.append("no limits set and no device seen yet")
    lines.append("")
    if snap.processes:
        sample = sample or Sample(())
        rows = []
        for proc in snap.processes:
            host = sample.host_pid(proc)
            rows.append(process_row(proc, sample.details.get(host or -1), host))
        lines += [_cut(line, width) for line in _table(PROCESS_HEADER, rows)]
    else:
        lines.append("no processes attached")
    return "\n".join(lines) + "\n"


def render_text_all(sample: Sample, node: NodeView | None = None) -> str:
    """The physical GPUs first (with ``node``), then every container, one
    block each; unreadable region files at the end."""
    head = ""
    if node is not None:

        head = render_node_text(node, sample)
    if not sample.views and not sample.errors:
        return head + "\n" * bool(head) + "no regions found\n"
    blocks = [head] * bool(head) + [render_text(view, sample) for view in sample.views]
    blocks += [f"region {shown(path)}: {shown(why)}\n" for path, why in sample.errors]
    return "\n".join(blocks)


def identity_json(who: identity.Identity) -> dict[str, Any]:
    return {"container_id": who.container_id or None,
            **{label: value or None for label, value in who.labels().items()},
            "user": who.user or None, "shards": who.shards or None,
            "gpus": None if who.gpus is None else list(who.gpus)}


def _process_json(proc: ProcessSnapshot, sample: Sample) -> dict[str, Any]:
    host = sample.host_pid(proc)
    details = sample.details.get(host or -1)
    gone = details is not None and details.gone
    return {
        "pid": proc.pid,
        "host_pid": host,
        "comm": proc.comm,
        "gone": gone,
        "used_bytes": None if gone else proc.total_used_bytes,
        "devices": [] if gone else [{"index": d, "used_bytes": n}
                                    for d, n in sorted(proc.used_bytes.items())],
        "host": None if details is None else details.to_json(),
    }


def to_json(view: ContainerView | RegionSnapshot, sample: Sample | None = None) -> dict[str, Any]:
    if isinstance(view, RegionSnapshot):
        view = ContainerView(view)
    snap = view.snapshot
    return {
        "region": snap.path,
        "identity": identity_json(identity.of_region(snap.path, sample.pods if sample else None)),
        "generation": snap.generation,
        "priority": snap.priority,
        "priority_board": snap.board,
        "memory_wait_ns": snap.memory_wait_ns,
        "suspend": view.suspend.view_json(snap.taken_ns),
        "agent": None if view.agent is None else view.agent.to_json(),
        "devices": [
            {
                "index": dev.index,
                "uuid": dev.uuid,
                "limit": None if dev.limit is None else {
                    "bytes": dev.limit.bytes or None,
                    "ppm": dev.limit.ppm or None,
                    "text": dev.limit.describe(),
                },
                "cap_bytes": dev.cap_bytes,
                "cores_pct": dev.cores_pct or None,
                "cores_policy": dev.cores_policy,
                "total_bytes": dev.total_bytes or None,
                "used_bytes": dev.used_bytes,
                "free_bytes": dev.free_bytes,
                "oom_refusals": dev.oom_refusals,
                "compute_share_pct": view.share_pct.get(dev.index),
                "busy_ns": dev.busy_ns,
                "throttled_ns": dev.throttled_ns,
                "yielded_ns": dev.yielded_ns,
                "request": None if dev.request is None else {
                    "bytes": dev.request.bytes or None,
                    "ppm": dev.request.ppm or None,
                    "text": dev.request.describe(),
                },
                "request_bytes": dev.request_bytes,
                "borrowed_bytes": dev.borrowed_bytes,
                "waiting": dev.waiting,
                "waited_ns": dev.waited_ns,
                "wait_timeouts": dev.wait_timeouts,
                "borrow_refusals": dev.borrow_refusals,
                "out_bytes": view.suspend.out_on(dev.index),
            }
            for dev in devices_of(view, sample)
        ],
        "processes": [_process_json(proc, sample or Sample(())) for proc in snap.processes],
    }


def status_document(view: ContainerView | RegionSnapshot, sample: Sample | None = None
                    ) -> dict[str, Any]:
    """What `status --json` prints of one region; `status --query` writes the same as CSV."""
    return _plain_strings({"version": STATUS_VERSION} | to_json(view, sample))


def status_document_all(sample: Sample, node: NodeView | None = None) -> dict[str, Any]:
    """What `status --all --json` prints: the node's GPUs, every region, the unreadable ones."""
    document: dict[str, Any] = {"version": STATUS_VERSION}
    regions = [to_json(view, sample) for view in sample.views]
    if node is not None:
        document |= node_json(node, sample)
        # A region says whether a device is a GPU or a MIG device only where the
        # process that bound it could ask NVML: NVML's UUID of it says which.
        named = {uuid_key(v.gpu.uuid): v.gpu.uuid for v in node.gpus}
        for device in (d for r in regions for d in r["devices"] if d["uuid"]):
            device["uuid"] = named.get(uuid_key(device["uuid"]), device["uuid"])
    document |= {
        "regions": regions,
        "errors": [{"region": path, "error": why} for path, why in sample.errors],
    }
    return _plain_strings(document)


def _plain_strings(value: Any) -> Any:
    """Every string in a document processes.plain: a path or a command line
    holds what bytes its tenant chose, and a program reading the document
    must get text it can decode (control characters JSON escapes itself)."""
    if isinstance(value, str):
        return plain(value)
    if isinstance(value, dict):
        return {plain(k) if isinstance(k, str) else k: _plain_strings(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain_strings(v) for v in value]
    return value


def render_json(view: ContainerView | RegionSnapshot, sample: Sample | None = None) -> str:
    return json.dumps(status_document(view, sample), indent=2) + "\n"


def render_json_all(sample: Sample, node: NodeView | None = None) -> str:
    return json.dumps(status_document_all(sample, node), indent=2) + "\n"



def tail(text: str, width: int) -> str:
    """The end of ``text`` in ``width`` characters: a path's end tells it apart."""
    return text if len(text) <= width else "…" + text[len(text) - width + 1:]


def commit_text(gpu: GpuView) -> str:
    """"committed 18 GiB of 16 GiB (1.12x, over-committed); 1 container without a cap"."""
    ratio = "n/a" if gpu.commit_ratio is None else f"{gpu.commit_ratio:.2f}x"
    text = (f"committed {format_bytes(gpu.committed_bytes)} of "
            f"{_bytes(gpu.gpu.total_bytes, 'n/a')} ({ratio}"
            + (", OVER-COMMITTED)" if gpu.overcommitted else ")"))
    if gpu.uncapped:
        text += f"; {gpu.uncapped} container{'s' * (gpu.uncapped != 1)} without a cap"
    return text


def used_text(gpu: GpuView) -> str:
    """"used 1.4 GiB of 140 GiB as the driver counts it: 1.4 GiB in 2 containers"."""
    g, count = gpu.gpu, len(gpu.tenants)
    return (f"used {_bytes(g.used_bytes, 'n/a')} of {_bytes(g.total_bytes, 'n/a')} as the "
            f"driver counts it: {format_bytes(gpu.regions_used_bytes)} in {count} "
            f"container{'s' * (count != 1)}")


def reserve_text(gpu: GpuView) -> str:
    """What the driver keeps for itself: never use, never outside a cap."""
    g = gpu.gpu
    if g.reserved_bytes is not None:
        return f"reserved by the driver {format_bytes(g.reserved_bytes)}, not counted as used"
    if g.used_bytes is None:
        return "reserved by the driver: n/a"
    return "reserved by the driver: not known apart, counted in used (NVML has no v2 here)"


def outside_text(gpu: GpuView) -> str:
    if gpu.outside_bytes is None:
        return "outside any cap: n/a"
    text = f"outside any cap {format_bytes(max(gpu.outside_bytes, 0))}: "
    if gpu.outside is None or gpu.outside_processes_bytes is None \
            or gpu.outside_other_bytes is None:
        return text + "processes n/a"
    count = len(gpu.outside)
    return (text + f"{format_bytes(gpu.outside_processes_bytes)} in {count} "
            f"process{'es' * (count != 1)}, {format_bytes(max(gpu.outside_other_bytes, 0))} "
            + ("other, the reserve in it" if gpu.gpu.used_includes_reserved
               else "other"))


def mig_title(gpu: Gpu) -> str:
    """"MIG 0/1 2g.20gb (GPU instance 5, compute instance 0)": a MIG instance, as
    nvidia-smi's MIG devices table places it."""
    m = gpu.mig
    assert m is not None
    return (f"MIG {gpu.index}/{m.index} {m.profile} (GPU instance {m.gpu_instance}, "
            f"compute instance {m.compute_instance})")


def _share(tenant: Tenant) -> str:
    share = tenant.share_pct
    return "n/a" if share is None else f"{share:.0f}%"


def elastic_text(gpu: GpuView) -> str | None:
    """"requests 10 GiB, borrowed 2 GiB, 1 waiting"; None where no container
    has a request below its cap and none waits or borrows."""
    if not any(t.device is not None and (t.device.request is not None or t.device.waited_ns)
               for t in gpu.tenants):
        return None
    return (f"requests {format_bytes(gpu.requested_bytes)}, in use {format_bytes(gpu.regions_used_bytes)}, "
            f"borrowed {format_bytes(gpu.borrowed_bytes)}, {gpu.waiters} waiting")


def render_node_text(node: NodeView, sample: Sample, width: int = 80) -> str:

    if node.error is not None:
        return f"no physical view: {node.error}\n"
    lines: list[str] = []
    for gpu in node.gpus:
        g = gpu.gpu
        util = "n/a" if g.utilization_pct is None else f"{g.utilization_pct}%"
        pad = "  " * (1 + (g.mig is not None))
        if g.mig is not None:
            lines.append(f"  {mig_title(g)}")
        else:
            lines.append(f"GPU {g.index}: {g.name}, bus {g.bus_id or '-'}, utilisation {util}"
                         + (", MIG mode" if g.mig_mode else ""))
        lines += [f"{pad}{g.uuid}", f"{pad}{used_text(gpu)}", f"{pad}{reserve_text(gpu)}"]
        if g.mig_mode:   # its memory is its instances', below
            continue
        lines += [f"{pad}{outside_text(gpu)}", f"{pad}{commit_text(gpu)}"]
        elastic = elastic_text(gpu)
        if elastic is not None:
            lines.append(f"{pad}{elastic}")
        if gpu.tenants and elastic is not None:
            rows = [(tail(shown(t.name), 32), str(t.index), _bytes(t.request_bytes, "none"),
                     _bytes(t.cap_bytes, "none"), format_bytes(t.used_bytes), format_bytes(t.borrowed_bytes),
                     str(t.waiting), f"{t.waited_ns / 1e9:.1f} s", str(t.wait_timeouts))
                    for t in gpu.tenants]
            lines += [pad + line for line in
                      _table(("CONTAINER", "DEV", "REQUEST", "CAP", "USED", "BORROWED", "WAITING", "WAITED",
                              "TIMEOUTS"), rows)]
        elif gpu.tenants:
            rows = [(tail(shown(t.name), 32), str(t.index), _bytes(t.cap_bytes, "none"),
                     format_bytes(t.used_bytes), _share(t), f"{t.throttled_ns / 1e9:.1f} s")
                    for t in gpu.tenants]
            lines += [pad + line for line in
                      _table(("CONTAINER", "DEV", "CAP", "USED", "SHARE", "THROTTLED"), rows)]
        if gpu.outside:
            looked = sample.details
            rows = [_outside_row(p, looked.get(p.pid)) for p in gpu.outside]
            lines += [f"{pad}outside any cap:"]
            lines += [_cut(pad + line, width) for line in _table(PROCESS_HEADER[1:], rows)]
        lines.append("")
    lines += [u.line for u in node.unavailable]   # whole: the function's name matters
    for agent in node_agents([v.agent for v in sample.views], time.monotonic_ns()):
        lines += [_cut(line, width) for line in (agent.text(), *agent.latest_text())]
    for view, index in node.elsewhere:
        lines.append(f"region {shown(view.path)} device {index}: on a GPU this node's driver does "
                     "not list")
    return "\n".join(lines).rstrip("\n") + "\n"


def _bytes(count: int | None, none: str = "-") -> str:
    return none if count is None else format_bytes(count)


def _outside_row(proc: DriverProcess, details) -> tuple[str, ...]:
    if details is not None and details.gone:
        return (str(proc.pid), "-", "-", "-", "-", "gone", "")
    used = _bytes(proc.used_bytes, "n/a")
    if details is None:
        return (str(proc.pid), "-", "-", "-", "-", used, "")
    return (str(proc.pid), shown(details.user) or "-",
            "-" if details.cpu_pct is None else f"{details.cpu_pct:.0f}%",
            _bytes(details.rss_bytes), format_age(details.age_s), used, shown(details.command))


def node_json(node: NodeView, sample: Sample) -> dict[str, Any]:

    if node.error is not None:
        return {"gpus": None, "gpus_error": node.error}
    gpus = []
    for gpu in node.gpus:
        g = gpu.gpu
        outside = None if gpu.outside is None else []
        for p in gpu.outside or ():
            details = sample.details.get(p.pid)
            gone = details is not None and details.gone
            outside.append({"pid": p.pid, "gone": gone,
                            "used_bytes": None if gone else p.used_bytes,
                            "host": None if details is None else details.to_json()})
        gpus.append({
            "index": g.index, "uuid": g.uuid, "name": g.name, "bus_id": g.bus_id,
            "mig_mode": g.mig_mode,
            "mig": None if g.mig is None else {
                "parent_uuid": g.mig.parent_uuid, "index": g.mig.index, "profile": g.mig.profile,
                "gpu_instance": g.mig.gpu_instance, "compute_instance": g.mig.compute_instance},
            "total_bytes": g.total_bytes, "used_bytes": g.used_bytes,
            "reserved_bytes": g.reserved_bytes,
            "used_includes_reserved": g.used_includes_reserved,
            "utilization_pct": g.utilization_pct,
            "regions_used_bytes": gpu.regions_used_bytes,
            "outside_bytes": gpu.outside_bytes,
            "outside_processes_bytes": gpu.outside_processes_bytes,
            "outside_other_bytes": gpu.outside_other_bytes,
            "committed_bytes": gpu.committed_bytes,
            "commit_ratio": gpu.commit_ratio,
            "overcommitted": gpu.overcommitted,
            "uncapped": gpu.uncapped,
            "requested_bytes": gpu.requested_bytes,
            "borrowed_bytes": gpu.borrowed_bytes,
            "waiters": gpu.waiters,
            "containers": [{"region": t.view.path, "device": t.index,
                            "identity": identity_json(t.identity),
                            "cap_bytes": t.cap_bytes, "used_bytes": t.used_bytes,
                            "suspend_state": t.view.suspend.state, "out_bytes": t.out_bytes,
                            "request_bytes": t.request_bytes, "borrowed_bytes": t.borrowed_bytes,
                            "waiting": t.waiting, "waited_ns": t.waited_ns, "wait_timeouts": t.wait_timeouts,
                            "compute_share_pct": t.share_pct, "throttled_ns": t.throttled_ns}
                           for t in gpu.tenants],
            "outside_processes": outside,
        })
    return {"gpus": gpus, "gpus_error": None,
            "agents": [a.to_json() for a in node_agents([v.agent for v in sample.views], time.monotonic_ns())],
            "nvml_unavailable": [{"function": u.function, "answer": u.answer, "shown": u.shown}
                                 for u in node.unavailable]}

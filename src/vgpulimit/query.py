"""`vgpulimit status --query FIELD,... [--format csv[,noheader][,nounits]]`:
the document `status --json` prints, written as CSV for scripts, one row per
device of each container, in the manner of `nvidia-smi --query-gpu=...
--format=csv`.

No second data path: every field reads the dictionaries of that document
(render.status_document), so a field means what its JSON key means.  As
nvidia-smi writes them: ", " between values, the unit after a value ("1024
MiB", "30 %") and in brackets in the header ("memory.used [MiB]"), where
`nounits` drops it from the values only; "[N/A]" for a value not known.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vgpulimit.errors import UsageError, quoted
from vgpulimit.identity import Identity
from vgpulimit.processes import shown

NOT_KNOWN = "[N/A]"   # as nvidia-smi writes a value it cannot give
NO_LIMIT = "none"     # no cap set: a setting, not a value missing
_MiB = 1 << 20

Region = Mapping[str, Any]   # one region of the document: "region", "identity", "processes"
Device = Mapping[str, Any]   # one of its "devices"


@dataclass(frozen=True)
class Field:
    name: str
    unit: str | None          # "MiB", "%", "s"; None: a word or a count
    help: str                 # one line, for `--query help`
    value: Callable[[Region, Device], Any]   # None: not known


def _mib(count: int | None) -> int | None:
    return None if count is None else count // _MiB   # whole MiB, as nvidia-smi rounds down


def _identity_name(region: Region) -> str | None:
    who = region["identity"]
    return Identity(container_id=who["container_id"] or "", pod=who["pod"] or "",
                    namespace=who["namespace"] or "", container=who["container"] or "",
                    hpc_job=who.get("hpc_job") or "", user=who.get("user") or "",
                    shards=who.get("shards") or "").name or None


def _seconds(ns: int) -> str:
    return f"{ns / 1e9:.3f}"


def _processes_on(region: Region, index: int) -> int:
    return sum(1 for proc in region["processes"] if not proc["gone"]
               and any(d["index"] == index and d["used_bytes"] for d in proc["devices"]))


def _or_none(value: Any, none: Any = NO_LIMIT) -> Any:
    return none if value is None else value


FIELDS: tuple[Field, ...] = (
    Field("region", None, "the region file of the container",
          lambda r, d: r["region"]),
    Field("container", None, "who the container is: namespace/pod/container, else its id, as the "
          "hook recorded it", lambda r, d: _identity_name(r)),
    Field("index", None, "the device's index as CUDA numbers it in the container",
          lambda r, d: d["index"]),
    Field("uuid", None, "the device's UUID as CUDA reports it (GPU-...); [N/A] before a process "
          "of the container has used it", lambda r, d: d["uuid"] or None),
    Field("memory.total", "MiB", "what the container may use: the cap, else the device's memory "
          "(as nvidia-smi reads it in the container)",
          lambda r, d: _mib(d["cap_bytes"] if d["cap_bytes"] is not None else d["total_bytes"])),
    Field("memory.used", "MiB", "memory the container's processes hold on the device",
          lambda r, d: _mib(d["used_bytes"])),
    Field("memory.free", "MiB", "what is left under the cap (never more than the device has free)",
          lambda r, d: _mib(d["free_bytes"])),
    Field("memory.limit", "MiB", "the memory cap; none where there is none, [N/A] for a share of "
          "a device whose size is not known yet",
          lambda r, d: NO_LIMIT if d["limit"] is None else _mib(d["cap_bytes"])),
    Field("memory.physical", "MiB", "the device's own memory, as its driver gives it",
          lambda r, d: _mib(d["total_bytes"])),
    Field("memory.oom_refusals", None, "allocations refused at the cap",
          lambda r, d: d["oom_refusals"]),
    Field("cores.limit", "%", "the compute share, in percent of the GPU's time; none where there "
          "is none", lambda r, d: _or_none(d["cores_pct"])),
    Field("cores.policy", None, "hard (never past the share), borrow (past it while no other "
          "tenant uses the device) or none", lambda r, d: d["cores_policy"]),
    Field("cores.measured", "%", "the GPU time the container's kernels took over the wall time "
          "of --interval, in percent of the whole GPU; [N/A] with --interval 0",
          lambda r, d: None if d["compute_share_pct"] is None else round(d["compute_share_pct"])),
    Field("cores.throttled", "s", "how long the container's launches waited for their share, "
          "in all", lambda r, d: _seconds(d["throttled_ns"])),
    Field("cores.busy", "s", "the GPU time the container's kernels took, in all",
          lambda r, d: _seconds(d["busy_ns"])),
    Field("priority", None, "the container's priority between tenants: high, normal or low; none "
          "where it takes no part", lambda r, d: _or_none(r["priority"])),
    Field("priority.yielded", "s", "how long the container's launches on the device held back for "
          "containers of a higher priority, in all", lambda r, d: _seconds(d["yielded_ns"])),
    Field("processes.count", None, "the container's live processes that hold memory on the "
          "device", lambda r, d: _processes_on(r, d["index"])),
)
BY_NAME: Mapping[str, Field] = {f.name: f for f in FIELDS}
FORMAT_OPTIONS = ("noheader", "nounits")   # after csv, as nvidia-smi's --format takes them


@dataclass(frozen=True)
class Format:
    header: bool = True
    units: bool = True


def parse_fields(text: str) -> tuple[Field, ...]:
    """"index,memory.used" -> its fields, in order (one may come twice, as
    nvidia-smi allows); an unknown name is a usage error naming the known ones."""
    names = [name.strip() for name in text.split(",")]
    if not any(names):
        raise UsageError(f"--query {text!r} names no field; {_known()}")
    for name in names:
        if name not in BY_NAME:
            raise UsageError(f"--query: unknown field {quoted(name)}; {_known()}")
    return tuple(BY_NAME[name] for name in names)


def parse_format(text: str) -> Format:
    """"csv", "csv,noheader", "csv,nounits", "csv,noheader,nounits" (any order)."""
    words = [word.strip() for word in text.split(",")]
    wrong = [w for w in words if w not in ("csv", *FORMAT_OPTIONS)]
    if wrong or "csv" not in words:
        raise UsageError(f"--format {text!r}: give csv, optionally with "
                         f"{' and '.join(FORMAT_OPTIONS)} (e.g. csv,noheader,nounits)")
    return Format(header="noheader" not in words, units="nounits" not in words)


def _known() -> str:
    return (f"the fields are {', '.join(BY_NAME)} "
            "(see 'vgpulimit status --query help')")


def help_text() -> str:
    """The fields, one line each, as `nvidia-smi --help-query-gpu` lists its own."""
    width = max(len(_header(f, True)) for f in FIELDS)
    lines = [("Fields of 'vgpulimit status --query FIELD,...' (one CSV row per device of each "
              "container; [N/A]: not known):")]
    lines += [f"  {_header(f, True).ljust(width)}  {f.help}" for f in FIELDS]
    return "\n".join(lines) + "\n"


def _header(f: Field, units: bool) -> str:
    return f"{f.name} [{f.unit}]" if units and f.unit else f.name


def _cell(f: Field, value: Any, fmt: Format) -> str:
    if value is None:
        return NOT_KNOWN
    text = shown(str(value))
    if f.unit and fmt.units and value != NO_LIMIT:
        text = f"{text} {f.unit}"
    if any(c in text for c in ',"'):   # a path or a name with a comma stays one value
        text = '"' + text.replace('"', '""') + '"'
    return text


def regions_of(document: Mapping[str, Any]) -> Sequence[Region]:
    """The regions of a `status --json` document: its own (one region) or
    its "regions" (--all)."""
    return document.get("regions", [document])


def render_csv(document: Mapping[str, Any], fields: Sequence[Field], fmt: Format) -> str:
    """One row per device of each region of ``document``; the header keeps
    the units in brackets even with nounits, as nvidia-smi's does."""
    lines = [", ".join(_header(f, True) for f in fields)] if fmt.header else []
    for region in regions_of(document):
        for device in region["devices"]:
            lines.append(", ".join(_cell(f, f.value(region, device), fmt) for f in fields))
    return "".join(line + "\n" for line in lines)

"""The limit kinds, as the shim's table has them (shim/src/limit_kinds.def,
read here through the cffi binding, so that Python and C go by one compiled
table): each kind's variables, flags, annotation and parser.  The flags of
`run`, `set` and `cdi generate`, the variables `cdi generate` writes, the OCI
hook's annotations and the variables a supervised child loses are all taken
from here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vgpulimit._paths import core


@dataclass(frozen=True)
class Kind:
    name: str            # the row's id: "memory", "cores", "memory_request", ...
    what: str            # "memory limit", for messages
    ours: str            # VGPULIMIT_…; per_device adds _<i>, by_uuid _GPU-<uuid> / _MIG-<uuid>
    hami: str | None     # HAMi-core's variable
    kai: str | None      # KAI's variable (a fraction of the device, for every device)
    flag: str            # --memory; per_device adds --memory-device I=VALUE
    per_device: bool
    by_uuid: bool
    annotation: str      # the OCI hook's
    parser: str          # limits.parse_<parser>
    hami_parser: str | None
    region_field: str    # struct.field of region.h
    board_field: str | None
    example: str         # a value of ours, and of HAMi's
    hami_example: str | None
    help: str            # the flag's (argparse: %% is a percent sign)
    device_help: str | None

    @property
    def device_flag(self) -> str | None:
        return f"{self.flag}-device" if self.per_device else None

    @property
    def dest(self) -> str:
        """The flag's attribute on argparse's namespace."""
        return self.flag[2:].replace("-", "_")

    def variables(self) -> tuple[str, ...]:
        """Every variable of the kind, for every device (the stems)."""
        return tuple(v for v in (self.ours, self.hami, self.kai) if v)

    def parse(self, text: str, source: str | None = None):
        """``text`` read by the kind's parser (limits.py), LimitError naming ``source``."""
        return parse_function(self.parser)(text, source or self.flag)


def parse_function(parser: str) -> Callable:
    from vgpulimit import limits

    return getattr(limits, f"parse_{parser}")


def _load() -> tuple[Kind, ...]:
    ffi, lib = core()

    def text(chars) -> str:
        return ffi.string(chars).decode()

    rows = []
    index = 0
    while (row := lib.vgl_limit_kind(index)) != ffi.NULL:
        rows.append(Kind(
            name=text(row.id), what=text(row.what), ours=text(row.ours), hami=text(row.hami) or None,
            kai=text(row.kai) or None, flag=text(row.flag), per_device=bool(row.per_device),
            by_uuid=bool(row.by_uuid), annotation=text(row.annotation), parser=text(row.parser),
            hami_parser=text(row.hami_parser) or None, region_field=text(row.region_field),
            board_field=text(row.board_field) or None, example=text(row.example),
            hami_example=text(row.hami_example) or None, help=text(row.help),
            device_help=text(row.device_help) or None))
        index += 1
    return tuple(rows)


KINDS: tuple[Kind, ...] = _load()
BY_NAME: dict[str, Kind] = {kind.name: kind for kind in KINDS}


def kind(name: str) -> Kind:
    return BY_NAME[name]

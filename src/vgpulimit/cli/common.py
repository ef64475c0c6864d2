"""What every command of the CLI shares: the parser that says a bad flag in
one line, each option given once, the limit flags of the kinds table, the
region a command acts on, and the errors a command may end in."""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
from collections.abc import Callable, Mapping

from vgpulimit.errors import UsageError, VgpulimitError

PROG = "vgpulimit"


# Every form a SIZE may take; errors name the common ones and point here.
SIZE_FORMS = ("SIZE is bytes (1073741824); binary units Ki, Mi, Gi, Ti with or without B (4Gi, 4GiB, "
              "512Mi); k, m, g, t in lower case as HAMi and Docker mean them (3000m = 3000 MiB); decimal "
              "units K, M, G, T with or without B (4G = 4*10^9 bytes); a percentage of the device (50%) "
              "or a fraction of it from 0 to 1 (0.5).  PCT is a whole percentage from 1 to 100 (30 or 30%).  "
              "A device is I, its index as CUDA numbers it in the container, or GPU-<uuid> (MIG-<uuid> for "
              "a MIG device), the whole UUID as nvidia-smi -L prints it; 50% and 0.5 of a MIG device are "
              "of its instance.")


class Once(argparse.Action):
    """An option that takes one value and may be given once: argparse's own
    "the last one wins" would let `--memory 1GiB --memory 2GiB` run at 2 GiB,
    or `set --memory 1GiB --memory none` lift the cap, without a word."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = namespace.__dict__.setdefault("_given", {})
        if self.dest in given:
            raise UsageError(f"{option_string or self.dest} is given twice ({given[self.dest]!r}, then "
                             f"{values!r}); give it once")
        given[self.dest] = values
        setattr(namespace, self.dest, values)


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own usage errors: one line, exit 2
        raise UsageError(f"{message} (see '{self.prog} --help')")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Every option that stores a value is given once (see Once); groups
        # share their parser's registry.
        self.register("action", None, Once)
        self.register("action", "store", Once)


def dash_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``--memory -1GiB`` as ``--memory=-1GiB``: argparse takes a value that
    starts with '-' for an option and says only "expected one argument", where
    the value's own parser says what is wrong with it.  A value that is an
    option of the command (``--memory --cores 30``) is left as it is, and so is
    everything from ``--`` or the first word that is not an option on (a
    command to run, with options of its own)."""
    out: list[str] = []
    words = iter(argv)
    for word in words:
        out.append(word)
        if word == "--":
            break
        if not word.startswith("-"):
            sub = _subparser(parser, word)
            if sub is None:
                break
            parser = sub
            continue
        action = parser._option_string_actions.get(word)
        if action is None or action.nargs is not None or not action.option_strings \
                or isinstance(action, argparse._HelpAction) or action.const is not None:
            continue
        following = next(words, None)
        if following is None:
            break
        # A negative number is a value even where the command has it as a
        # flag (`top --interval -1`: top's own -1 would leave --interval empty).
        if following.startswith("-") and following != "--" and (
                following not in parser._option_string_actions or following[1:].isdigit()):
            out[-1] = f"{word}={following}"
        else:
            out.append(following)
    out.extend(words)
    return out


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(name)
    return None


# The metavar of a flag, by its kind's parser.
_METAVARS = {"memory": "SIZE", "cores": "PCT", "cores_policy": "POLICY", "priority": "PRIORITY",
             "wait": "DURATION"}


def add_limit_flags(parser: argparse.ArgumentParser, per_device: bool, none: str = "",
                     then: Mapping[str, Callable[[], None]] | None = None) -> None:
    """A flag for each limit kind of the shim's table (kinds.py), and with
    ``per_device`` its -device form; ``none``: what the help adds where
    'none' lifts a limit (memory limits and shares); ``then``: by kind, what
    adds a command's own flags of that kind after its."""
    from vgpulimit.kinds import KINDS

    for kind in KINDS:
        metavar = _METAVARS[kind.parser]
        lifts = none if kind.parser in ("memory", "cores") else ""
        parser.add_argument(kind.flag, metavar=metavar, help=kind.help + lifts)
        if per_device and kind.per_device:
            parser.add_argument(kind.device_flag, metavar=f"I={metavar}", action="append", default=[],
                                help=kind.device_help)
        if then and kind.name in then:
            then[kind.name]()


def limit_flags(args: argparse.Namespace, per_device: bool = True) -> dict[str, object]:
    """The limit flags as given, by keyword (``memory``, ``memory_device``,
    ...): the names resolve_limits, Change.parse and cdi.generate take."""
    from vgpulimit.kinds import KINDS

    given = {kind.dest: getattr(args, kind.dest) for kind in KINDS}
    if per_device:
        given |= {f"{kind.dest}_device": getattr(args, f"{kind.dest}_device") for kind in KINDS if kind.per_device}
    return given


def refuse_mig_gpus(given: dict[str, str], simulate: bool) -> None:
    """A limit for a GPU in MIG mode by its own UUID ({UUID: its flag or
    variable}) is refused before anything is made, with the MIG devices to
    name (request.named_mig_gpu).  Where NVML cannot say, the shim refuses it
    in the command, as it does under a bare preload."""
    from vgpulimit import node, nvml, request

    if not any(uuid[:4].upper() == "GPU-" for uuid in given):
        return
    if simulate:
        nvml.use_simulated()
    try:
        gpus = node.read_gpus()
    except nvml.NvmlError:
        return
    line = request.named_mig_gpu(given, gpus)
    if line:
        raise UsageError(line)


def region_file(args: argparse.Namespace) -> str:
    if args.region == "":
        raise UsageError(f"{args.action}: --region is empty; give the path of a region file, or leave "
                         "--region out for $VGPULIMIT_REGION")
    path = args.region or os.environ.get("VGPULIMIT_REGION")
    if not path:
        raise NoRegion("no region: give --region PATH or set VGPULIMIT_REGION")
    return path


def absolute_node_dir(command: str, node_dir: str | None) -> None:
    """The node directory is where `status --all` looks on the node: a path
    relative to whatever directory the runtime runs its hooks in is none."""
    if node_dir is not None and not node_dir.startswith("/"):
        raise UsageError(f"{command}: --node-dir {node_dir!r} is not an absolute path; give "
                         "one such as /run/vgpulimit/containers, or leave it out for the default")


def replace_file(name: str, text: str, flag: str) -> None:
    """Writes ``text`` to a temporary file beside ``name`` and renames it over
    ``name``: a reader sees the old file or the new one.  Refuses a directory
    or a device in its place, and leaves no temporary file behind."""
    from pathlib import Path

    path = Path(name)
    try:
        mode = path.stat().st_mode
    except OSError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise CannotWrite(f"{flag} {path}: {what}; give a file name")
    temp = path.with_name(f".{path.name}.tmp")
    try:
        temp.write_text(text, encoding="utf-8")
        temp.replace(path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise CannotWrite(f"{flag} {path}: {exc.strerror}") from None


class NoRegion(VgpulimitError, LookupError):
    pass


class CannotWrite(VgpulimitError, OSError):
    pass

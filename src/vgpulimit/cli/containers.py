"""The container commands: `oci-hook` (run by a runtime), `install-hook`
(hooks.d) and `cdi generate` (a CDI spec)."""

from __future__ import annotations

import argparse
import sys

from vgpulimit.cli.common import (
    CannotWrite,
    Parser,
    absolute_node_dir,
    add_limit_flags,
    limit_flags,
    refuse_mig_gpus,
    replace_file,
)
from vgpulimit.errors import UsageError


def add(commands) -> None:
    """oci-hook, install-hook and cdi."""
    from vgpulimit import oci
    from vgpulimit.oci import hooks_d

    hook = commands.add_parser(
        "oci-hook", help="OCI hook: put the shim into containers that ask for limits",
        description="Run by a container runtime with the container's state on stdin: at "
                    "createRuntime (or prestart) it installs the shim into a container whose "
                    "process.env has VGPULIMIT_* or HAMi's CUDA_DEVICE_* limits, or whose "
                    f"annotations have {oci.MEMORY_ANNOTATION} or "
                    f"{oci.CORES_ANNOTATION} (an annotation beats the variables of its "
                    "kind); at poststop it removes what it installed.  If a container asked for "
                    "limits that cannot be enforced, it fails, so the container does not start.")
    hook.add_argument("--node-dir", metavar="DIR", default=oci.NODE_DIR,
                      help="where each container's region is kept for the node view "
                           "(default: %(default)s)")
    _add_admit_flags(hook)

    install = commands.add_parser(
        "install-hook", help="install the OCI hook for podman and CRI-O (hooks.d)",
        description="Write the hooks.d file that makes podman and CRI-O run "
                    "'vgpulimit oci-hook' for every container.")
    install.add_argument("--dir", metavar="DIR", default=hooks_d.HOOKS_D_DIR,
                         help="the hooks.d directory (default: %(default)s)")
    install.add_argument("--node-dir", metavar="DIR",
                         help="the hook's node directory (default: its own)")
    _add_admit_flags(install)

    cdi = commands.add_parser("cdi", help="write a CDI spec (Container Device Interface)")
    cdi_commands = cdi.add_subparsers(dest="cdi_action", metavar="COMMAND", parser_class=Parser)
    cdi_commands.required = True
    generate = cdi_commands.add_parser(
        "generate", help="write a CDI spec of kind vgpulimit.io/gpu",
        description="Write a CDI spec with one device of kind vgpulimit.io/gpu that gives a "
                    "container the limits, the shim and the OCI hook: "
                    "'podman run --device vgpulimit.io/gpu=NAME ...'.  At least one limit is "
                    "required; a device with none is asked for with --memory none --cores none.")
    generate.add_argument("--name", help="the device's name (default: from the limits)")
    add_limit_flags(generate, per_device=False, none="; 'none' lifts it")
    generate.add_argument("--device", metavar="UUID",
                          help="the limits are for this device only: GPU-<uuid>, or a MIG device's "
                               "MIG-<uuid> (50%% of which is half its instance)")
    generate.add_argument("--output", metavar="FILE", help="write here (default: stdout)")
    generate.add_argument("--node-dir", metavar="DIR",
                          help="the hook's node directory (default: its own)")
    _add_admit_flags(generate)


def _add_admit_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--admit", action="store_true",
                        help="refuse a container whose memory cap would push the caps on one of "
                             "its GPUs (NVIDIA_VISIBLE_DEVICES, CDI annotations, /dev/nvidiaN) "
                             "past the GPU's memory, and one that asks for a GPU with no cap; "
                             "a container that names no GPU is not counted")
    parser.add_argument("--admit-uncapped", action="store_true",
                        help="with --admit, let containers with no memory cap start (they "
                             "commit nothing)")


def _cmd_oci_hook(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vgpulimit.oci import hook

    absolute_node_dir("oci-hook", args.node_dir)
    return hook.run(sys.stdin, Path(args.node_dir), _admission(args))


def _admission(args: argparse.Namespace):
    from vgpulimit.oci.admit import Admission

    if args.admit_uncapped and not args.admit:
        raise UsageError("--admit-uncapped goes with --admit")
    return Admission(allow_uncapped=args.admit_uncapped) if args.admit else None


def _cmd_install_hook(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vgpulimit.oci import hooks_d

    if not args.dir:
        raise UsageError("install-hook: --dir is empty; give the hooks.d directory "
                         f"(default {hooks_d.HOOKS_D_DIR})")
    # Written into the hooks.d file, where the hook reads it from whatever
    # directory the runtime runs it in: every limited container would fail.
    absolute_node_dir("install-hook", args.node_dir)
    try:
        admission = _admission(args)
        print(hooks_d.install_hooks_d(Path(args.dir), args.node_dir, admission is not None,
                                      args.admit_uncapped))
    except OSError as exc:
        raise CannotWrite(f"install-hook: cannot write {exc.filename or args.dir}: "
                           f"{exc.strerror}") from None
    return 0


def _cmd_cdi(args: argparse.Namespace) -> int:
    import json

    from vgpulimit import cdi

    absolute_node_dir("cdi generate", args.node_dir)
    admission = _admission(args)
    spec = cdi.generate(args.name, node_dir=args.node_dir, admit=admission is not None,
                        admit_uncapped=args.admit_uncapped, device=args.device,
                        **limit_flags(args, per_device=False))
    if args.device is not None:
        refuse_mig_gpus({args.device.strip(): f"--device {args.device.strip()}"}, False)
    text = json.dumps(spec, indent=2) + "\n"
    if args.output is None:
        sys.stdout.write(text)
        return 0
    if not args.output:
        raise UsageError("cdi generate: --output is empty; give the spec's file name "
                         "(e.g. /etc/cdi/vgpulimit.json), or no --output for stdout")
    replace_file(args.output, text, "--output")
    return 0


COMMANDS = {"oci-hook": _cmd_oci_hook, "install-hook": _cmd_install_hook, "cdi": _cmd_cdi}

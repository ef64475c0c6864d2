"""`vgpulimit verify`: whether the limits hold, checked on this GPU."""

from __future__ import annotations

import argparse
import sys

from vgpulimit.errors import EXIT_FAILURE, quoted


def _device(text: str) -> int:
    from vgpulimit.region import MAX_DEVICES

    if not (text.isascii() and text.isdigit() and int(text) < MAX_DEVICES):
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not a device index 0-{MAX_DEVICES - 1}")
    return int(text)


def add(commands) -> None:
    """verify."""
    verify = commands.add_parser(
        "verify", help="check, on this GPU, that the limits hold",
        description="Start a CUDA process and check what it sees against the limits: the shim "
                    "is loaded, the cap shows in cuMemGetInfo, cuDeviceTotalMem and NVML, an "
                    "allocation past the cap is refused, the compute share holds, and nothing "
                    "is left behind.  Where limits are set up already (a container, a "
                    "'vgpulimit run', limit variables) it checks those, and --memory/--cores "
                    "say what they should be; elsewhere --memory/--cores make a fresh region "
                    "for the check, removed after.  Exit 0 only when every check passes.")
    verify.add_argument("--memory", metavar="SIZE",
                        help="the memory cap to expect (or, on a node, to check): 1GiB, 50%%, ...")
    verify.add_argument("--cores", metavar="PCT",
                        help="the compute share to expect (or, on a node, to check): 30 or 30%%")
    verify.add_argument("--device", metavar="I", type=_device, default=0,
                        help="the device to check, as this process numbers it (default 0)")
    verify.add_argument("--simulate", action="store_true",
                        help="check on the simulated GPU that ships with vgpulimit")
    verify.add_argument("--quick", action="store_true", help="skip the compute-share measurement")
    verify.add_argument("--no-alloc", action="store_true",
                        help="allocate nothing: check the shim, the limits and the capped views "
                             "only (for readiness probes beside a running workload)")
    verify.add_argument("--json", action="store_true",
                        help="the checks and what the probe saw, as one JSON document")


def _cmd_verify(args: argparse.Namespace) -> int:
    from vgpulimit import supervisor, verify

    report = verify.verify(verify.Options(memory=args.memory, cores=args.cores,
                                          device=args.device, simulate=args.simulate,
                                          quick=args.quick, no_alloc=args.no_alloc),
                           supervisor.run)
    sys.stdout.write(verify.render_json(report) if args.json else verify.render_text(report))
    return 0 if report.ok else EXIT_FAILURE


COMMANDS = {"verify": _cmd_verify}

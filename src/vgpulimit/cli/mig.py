"""`vgpulimit mig plan`: a MIG layout for a set of requests."""

from __future__ import annotations

import argparse
import sys

from vgpulimit.cli.common import (
    Parser,
    replace_file,
)
from vgpulimit.errors import UsageError


def add(commands) -> None:
    """mig and its plan."""
    from vgpulimit.mig import plan as mig_plan
    from vgpulimit.mig import render as mig_render

    parser = commands.add_parser(
        "mig", help="MIG: plan a layout and each request's limits (mig plan)",
        description="MIG (Multi-Instance GPU) planning.  'plan' never changes MIG itself.")
    actions = parser.add_subparsers(dest="mig_action", metavar="COMMAND", parser_class=Parser)
    actions.required = True
    plan = actions.add_parser(
        "plan", help="fit requests onto MIG layouts, shared where that takes fewer GPUs",
        description="Fit requests onto the fewest GPUs' MIG layouts: each GPU's instances at legal "
                    "placements, requests sharing an instance under vgpulimit caps where that fits "
                    "more onto fewer GPUs, isolated ones on instances of their own.  Prints the plan, "
                    "a mig-parted config for NVIDIA's MIG manager, or both as JSON.",
        epilog=f"A request is {mig_plan.REQUEST_FORMS}.  A --requests file is {mig_plan.FILE_FORMS}.")
    source = plan.add_mutually_exclusive_group()
    source.add_argument("--model", metavar="MODEL",
                        help="the GPU model: A100 40GB, A100 80GB, H100 80GB, H200 141GB (default: "
                             "the node's GPUs, through NVML)")
    source.add_argument("--simulate", action="store_true",
                        help="the node's GPUs are the simulated ones (SIMGPU_PROFILE, SIMGPU_DEVICES)")
    plan.add_argument("--gpus", metavar="N", help="at most N GPUs (default: the node's; with --model, "
                                                  "as many as the plan needs)")
    plan.add_argument("--request", metavar="SPEC", action="append", default=[],
                      help="a request: SIZE[,cores=PCT][,count=N][,isolated][,name=NAME] (repeatable)")
    plan.add_argument("--requests", metavar="FILE", help="requests from a JSON or YAML file")
    plan.add_argument("--format", choices=mig_render.FORMATS, default="text",
                      help="text (default), json (the plan, flags and config) or mig-parted (the "
                           "config, YAML)")
    plan.add_argument("--config-name", metavar="NAME", default=mig_render.CONFIG_NAME,
                      help="the mig-parted config's name (default: %(default)s)")
    plan.add_argument("--output", metavar="FILE", help="write here (default: stdout)")


def _cmd_mig(args: argparse.Namespace) -> int:
    from vgpulimit import limits
    from vgpulimit.mig import plan as mig_plan
    from vgpulimit.mig import profiles as mig_profiles
    from vgpulimit.mig import render as mig_render

    requests = []
    for i, text in enumerate(args.request):
        requests.extend(mig_plan.parse_request(text, "--request", f"request{i + 1}"))
    if args.requests is not None:
        requests.extend(mig_plan.read_requests(args.requests))
    if not requests:
        raise UsageError("mig plan: no requests; give --request SIZE[,cores=PCT][,count=N][,isolated] "
                         "or --requests FILE")
    gpus_most = None
    if args.gpus is not None:
        gpus_most = limits.ascii_number(args.gpus.strip(), 4097)
        if not gpus_most:
            raise UsageError(f"--gpus {args.gpus!r}: not a whole number of GPUs from 1 to 4096")
    if not args.config_name.strip() or any(c.isspace() or not c.isprintable()
                                           for c in args.config_name):
        raise UsageError(f"--config-name {args.config_name!r}: give a name without spaces "
                         "(e.g. vgpulimit-plan)")
    devices = None
    if args.model is not None:
        model = mig_profiles.find(args.model)
    else:
        from vgpulimit import nvml
        from vgpulimit.mig import node as mig_node

        if args.simulate:
            nvml.use_simulated()
        model, devices = mig_node.node_gpus()
        gpus_most = len(devices) if gpus_most is None else min(gpus_most, len(devices))
    plan = mig_plan.plan(requests, model, gpus_most, devices)
    text = mig_render.render(plan, args.format, args.config_name)
    if args.output is None:
        sys.stdout.write(text)
    elif not args.output:
        raise UsageError("mig plan: --output is empty; give a file name, or no --output for stdout")
    else:
        replace_file(args.output, text, "--output")
    return 0


COMMANDS = {"mig": _cmd_mig}

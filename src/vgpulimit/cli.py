"""The `vgpulimit` command.

Every expected error becomes one line on stderr and an exit code, here and
only here (each error's ``exit_code``, vgpulimit.errors); tracebacks are for bugs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import sys
import time
from collections.abc import Sequence

from vgpulimit import signals
from vgpulimit.errors import EXIT_FAILURE, UsageError, VgpulimitError, quoted

PROG = "vgpulimit"
# Every form a SIZE may take; errors name the common ones and point here.
SIZE_FORMS = ("SIZE is bytes (1073741824); binary units Ki, Mi, Gi, Ti with or without B (4Gi, 4GiB, "
              "512Mi); k, m, g, t in lower case as HAMi and Docker mean them (3000m = 3000 MiB); decimal "
              "units K, M, G, T with or without B (4G = 4*10^9 bytes); a percentage of the device (50%) "
              "or a fraction of it from 0 to 1 (0.5).  PCT is a whole percentage from 1 to 100 (30 or 30%).  "
              "A device is I, its index as CUDA numbers it in the container, or GPU-<uuid> (MIG-<uuid> for "
              "a MIG device), the whole UUID as nvidia-smi -L prints it; 50% and 0.5 of a MIG device are "
              "of its instance.")


class _Once(argparse.Action):
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


def given(args: argparse.Namespace, dest: str) -> bool:
    """Whether the option of ``dest`` was on the command line (not its default)."""
    return dest in getattr(args, "_given", {})


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own usage errors: one line, exit 2
        raise UsageError(f"{message} (see '{self.prog} --help')")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Every option that stores a value is given once (see _Once); groups
        # share their parser's registry.
        self.register("action", None, _Once)
        self.register("action", "store", _Once)


def _dash_values(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
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


# The shortest interval of a view: below it, top redraws without a pause and
# never gets to read its keys (q), and status measures noise.
MIN_INTERVAL_S = 0.1


def _seconds(text: str, zero: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (MIN_INTERVAL_S <= value <= 3600 or (zero and value == 0)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds from "
                                         f"{MIN_INTERVAL_S:g} to 3600{', or 0' if zero else ''}")
    return value


def _redraw_interval(text: str) -> float:
    return _seconds(text, zero=False)


def _measure_interval(text: str) -> float:
    """0: measure nothing."""
    return _seconds(text, zero=True)


def _device(text: str) -> int:
    from vgpulimit.region import MAX_DEVICES

    if not (text.isascii() and text.isdigit() and int(text) < MAX_DEVICES):
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not a device index 0-{MAX_DEVICES - 1}")
    return int(text)


def _add_view_sources(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--region", metavar="PATH",
                        help="the region file (default: $VGPULIMIT_REGION)")
    source.add_argument("--all", metavar="DIR", action="append",
                        help="every region file under DIR (e.g. the run directory of a node); "
                             "repeat for several, e.g. vgpulimit's and HAMi's /usr/local/vgpu")
    parser.add_argument("--simulate", action="store_true",
                        help="read the simulated GPU that ships with vgpulimit as the node's "
                             "physical GPUs (as 'run --simulate' runs on it)")


def _build_parser() -> argparse.ArgumentParser:
    from vgpulimit import __version__
    from vgpulimit.completion import SHELLS

    parser = _Parser(prog=PROG, description="Per-container GPU memory caps, "
                     "enforced by an LD_PRELOAD shim.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="action", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    run = commands.add_parser(
        "run", help="run a command under GPU limits",
        description="Run CMD with the shim preloaded and the limits in a fresh region file. "
                    "Limits not given as flags are taken from VGPULIMIT_MEMORY[_<i>|_GPU-<uuid>|_MIG-<uuid>] "
                    "and VGPULIMIT_CORES[_<i>|_GPU-<uuid>|_MIG-<uuid>] in the environment.",
        epilog=SIZE_FORMS)
    run.add_argument("--memory", metavar="SIZE",
                     help="memory cap for every device: 4GiB, 3000m, 50%%, 0.2, ...")
    run.add_argument("--memory-device", metavar="I=SIZE", action="append", default=[],
                     help="memory cap for device I as CUDA numbers it in the container, or for "
                          "the device of a UUID: GPU-<uuid>=SIZE or MIG-<uuid>=SIZE (overrides --memory; repeatable)")
    run.add_argument("--memory-units", metavar="N",
                     help="memory cap as N units of --unit, as Alibaba's gpushare counts it "
                          "(instead of --memory)")
    run.add_argument("--unit", metavar="SIZE",
                     help="the size of one --memory-units unit: 1GiB (default), 128Mi, ...")
    run.add_argument("--memory-request", metavar="SIZE",
                     help="memory guaranteed on every device, at most the cap (default: the cap); "
                          "above it the container borrows what no other container uses or is "
                          "guaranteed (docs/memory.md)")
    run.add_argument("--memory-request-device", metavar="I=SIZE", action="append", default=[],
                     help="memory request for device I, or GPU-<uuid>=SIZE (overrides "
                          "--memory-request; repeatable)")
    run.add_argument("--memory-wait", metavar="DURATION",
                     help="how long an allocation that would be refused waits for memory before "
                          "it is refused: 500ms, 2s, 1m (default 0: refused at once)")
    run.add_argument("--cores", metavar="PCT",
                     help="compute share of every device, in percent: 30 or 30%%")
    run.add_argument("--cores-device", metavar="I=PCT", action="append", default=[],
                     help="compute share of device I, or GPU-<uuid>=PCT or MIG-<uuid>=PCT (overrides --cores; "
                          "repeatable)")
    run.add_argument("--cores-policy", metavar="POLICY",
                     help="hard (default: never past the share), borrow (past it while no other "
                          "tenant uses the device) or none (no compute limit)")
    run.add_argument("--priority", metavar="PRIORITY",
                     help="high, normal or low: while a container of a higher priority has work "
                          "on a GPU, lower ones hold back (default: none, takes no part)")
    run.add_argument("--board", metavar="PATH",
                     help="the node's board of priorities and memory guarantees, with --priority or "
                          "a memory cap (default: priority.board in the directory run makes regions in)")
    run.add_argument("--simulate", action="store_true",
                     help="run on the simulated GPU that ships with vgpulimit")
    run.add_argument("--region", metavar="PATH",
                     help="create the region file here and keep it afterwards "
                          "(default: a private one, removed when CMD exits)")
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...")

    status = commands.add_parser(
        "status", help="show limits, usage and processes of a region",
        description="Show each device's cap, use, free memory, compute cap, measured compute "
                    "share, throttled time and OOM refusals, and each process's use, user, CPU, "
                    "RSS, age and command line.  With --all, the node's physical GPUs first "
                    "(NVML): memory as the driver counts it, the containers on each, memory "
                    "outside any cap and the caps committed against the GPU's memory.")
    status.add_argument("--json", action="store_true", help="machine-readable, bytes as integers")
    status.add_argument("--query", metavar="FIELD,...",
                        help="for scripts, as nvidia-smi's --query-gpu: these fields of each "
                             "device, one CSV row each (e.g. index,memory.used,cores.measured); "
                             "'--query help' lists them")
    status.add_argument("--format", metavar="FORMAT",
                        help="with --query: csv (default), csv,noheader (no header line), "
                             "csv,nounits (no units after the values) or csv,noheader,nounits")
    _add_view_sources(status)
    status.add_argument("--interval", metavar="SECONDS", type=_measure_interval, default=0.5,
                        help=f"measure the compute share over this long, {MIN_INTERVAL_S:g} to "
                             "3600 (default 0.5; 0: n/a)")

    top = commands.add_parser(
        "top", help="live view of containers' memory, compute share and processes",
        description="Redraw each container's memory, compute share and processes every "
                    "interval; with --all, each physical GPU first, its containers under it and "
                    "their processes under each.  Keys: q or Ctrl-C quits, s changes the order, "
                    "g (or 0-9) shows one GPU, a all of them.")
    _add_view_sources(top)
    top.add_argument("--interval", metavar="SECONDS", type=_redraw_interval, default=1.0,
                     help=f"redraw every SECONDS, {MIN_INTERVAL_S:g} to 3600 (default 1)")
    top.add_argument("-1", "--once", action="store_true",
                     help="print one frame to stdout and exit (for logs and scripts)")

    metrics = commands.add_parser(
        "metrics", help="serve Prometheus metrics of containers",
        description="Serve the limits and usage of one container, or of every region file "
                    "under a directory, at http://HOST:PORT/metrics.")
    metrics.add_argument("--listen", metavar="HOST:PORT", default="127.0.0.1:9489",
                         help="where to serve (default 127.0.0.1:9489; port 0: any free port)")
    metrics.add_argument("--pod-logs", metavar="DIR",
                         help="the kubelet's pod log directory (/var/log/pods), whose "
                              "<namespace>_<pod>_<uid> entries name the pods of HAMi's and KAI's "
                              "regions (default: none)")
    metrics.add_argument("--max-processes", metavar="N", type=_max_processes, default=10,
                         help="per-process series per container and device, the largest by "
                              "memory; the rest are summed into one (default 10, 0 to 1000)")
    metrics.add_argument("--hami-names", action="store_true",
                         help="also serve the figures under the names and labels of HAMi's vGPU "
                              "monitor (vGPU_device_memory_usage_in_bytes, HostGPUMemoryUsage, "
                              "...), so that HAMi's dashboards work")
    _add_view_sources(metrics)

    set_ = commands.add_parser(
        "set", help="change the limits of a running container",
        description="Change the limits in a region file; its processes apply them to their next "
                    "allocation or kernel launch.  Lowering a cap below what is in use frees "
                    "nothing: new allocations are refused until usage falls under it.  Prints what "
                    "changed, old → new.",
        epilog=SIZE_FORMS)
    set_.add_argument("--memory", metavar="SIZE",
                      help="memory cap for every device: 4GiB, 3000m, 50%%, 0.2, ... or 'none'")
    set_.add_argument("--memory-device", metavar="I=SIZE", action="append", default=[],
                      help="memory cap for device I as CUDA numbers it in the container, or for "
                           "the device of a UUID: GPU-<uuid>=SIZE or MIG-<uuid>=SIZE (overrides --memory; repeatable)")
    set_.add_argument("--memory-request", metavar="SIZE",
                      help="memory guaranteed on every device, at most the cap, or 'none' (the cap)")
    set_.add_argument("--memory-request-device", metavar="I=SIZE", action="append", default=[],
                      help="memory request for device I (overrides --memory-request; repeatable)")
    set_.add_argument("--memory-wait", metavar="DURATION",
                      help="how long an allocation that would be refused waits for memory: 500ms, "
                           "2s, ... or 0")
    set_.add_argument("--cores", metavar="PCT",
                      help="compute share of every device: 30 or 30%%, or 'none'")
    set_.add_argument("--cores-device", metavar="I=PCT", action="append", default=[],
                      help="compute share of device I, or GPU-<uuid>=PCT or MIG-<uuid>=PCT (overrides --cores; "
                           "repeatable)")
    set_.add_argument("--cores-policy", metavar="POLICY",
                      help="hard, borrow or none (every device)")
    set_.add_argument("--priority", metavar="PRIORITY",
                      help="high, normal or low, for a container that has one (written in the "
                           "node's priority board, which a tenant cannot write)")
    set_.add_argument("--region", metavar="PATH",
                      help="the region file (default: $VGPULIMIT_REGION)")

    for name, what in (("suspend", "move a container's GPU memory to host memory and free the GPU"),
                       ("resume", "bring a suspended container's GPU memory back and let it run on")):
        sub = commands.add_parser(
            name, help=what,
            description=(f"{what[0].upper()}{what[1:]}, through the driver's checkpoint API (driver "
                         "570 or later): every process of the container, all or nothing.  A setter's "
                         "act, from outside the container (docs/suspend.md)."))
        which = sub.add_mutually_exclusive_group()
        which.add_argument("--region", metavar="PATH",
                           help="the container's region file (default: $VGPULIMIT_REGION)")
        which.add_argument("--container", metavar="ID",
                           help="the container of this id (or its start, or its name as status shows "
                                "it, or its region's path or the end of it, as status --all and top "
                                "--all show it) among the regions under --all DIR")
        sub.add_argument("--all", metavar="DIR", action="append",
                         help="with --container: where its region is, e.g. the OCI hook's node "
                              "directory (repeatable)")
        sub.add_argument("--simulate", action="store_true",
                         help="the container runs on the simulated GPU that ships with vgpulimit")
        if name == "suspend":
            sub.add_argument("--timeout", metavar="DURATION", default="10s",
                             help="how long each process may take to finish its submitted GPU work "
                                  "before the suspend is given up: 500ms, 2s, ... (default 10s)")

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

    completion = commands.add_parser(
        "completion", help="print a shell completion script",
        description="Print the completion script of vgpulimit for SHELL, written from this "
                    "parser.  Load it in the running shell with "
                    "'source <(vgpulimit completion bash)' (or zsh), or for good: save bash's "
                    "as /etc/bash_completion.d/vgpulimit, and source zsh's from ~/.zshrc.")
    completion.add_argument("shell", metavar="SHELL", choices=SHELLS, help=" or ".join(SHELLS))

    commands.add_parser("libpath", help="print the path of libvgpulimit.so (for LD_PRELOAD)")
    commands.add_parser("simgpu-path",
                        help="print the directory of the simulated driver (for LD_LIBRARY_PATH)")
    _add_container_commands(commands)
    _add_slurm_command(commands)
    _add_mig_command(commands)
    return parser


# --- mig plan (begin) ---------------------------------------------------------
def _add_mig_command(commands) -> None:
    from vgpulimit.mig import plan as mig_plan
    from vgpulimit.mig import render as mig_render

    parser = commands.add_parser(
        "mig", help="MIG: plan a layout and each request's limits (mig plan)",
        description="MIG (Multi-Instance GPU) planning.  'plan' never changes MIG itself.")
    actions = parser.add_subparsers(dest="mig_action", metavar="COMMAND", parser_class=_Parser)
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
        _replace_file(args.output, text, "--output")
    return 0
# --- mig plan (end) -----------------------------------------------------------


def _add_slurm_command(commands) -> None:
    from vgpulimit import slurm

    parser = commands.add_parser(
        "slurm", help="Slurm: GRES shards as memory caps and compute shares (Prolog, Epilog, TaskProlog)",
        description="A job given N shards of a GPU of S shards gets a memory cap of N/S of the GPU's "
                    "memory and N/S of its time, in one region per job and node.  'install' writes "
                    "the three scripts and prints the slurm.conf lines; slurmd runs the rest.")
    actions = parser.add_subparsers(dest="slurm_action", metavar="COMMAND", parser_class=_Parser)
    actions.required = True

    def mapping(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--shard-memory", metavar="SIZE", default=slurm.FRACTION,
                         help="what one shard is worth in memory: 'fraction' (default: N/S of the "
                              "GPU) or a size per shard, as gpushare's units: 1GiB, 128Mi")
        sub.add_argument("--shard-cores", metavar="PCT", default=slurm.FRACTION,
                         help="what one shard is worth in GPU time: 'fraction' (default: N/S), "
                              "'none' or a percent per shard")
        sub.add_argument("--shards-per-gpu", metavar="S", type=int,
                         help="the shards of one GPU (default: the node's shards over its GPUs, "
                              "from scontrol show node)")
        sub.add_argument("--mps", action="store_true",
                         help="cap --gres=mps:N jobs too, as shard jobs: N of the GPU's mps count "
                              "(100 by Slurm's convention: N percent of the GPU)")

    for name, text in (("prolog", "slurmd's Prolog (root): make the job's region"),
                       ("epilog", "slurmd's Epilog (root): remove the job's region")):
        sub = actions.add_parser(name, help=text)
        sub.add_argument("--node-dir", metavar="DIR", default=slurm.NODE_DIR,
                         help="where each job's region is kept (default: %(default)s, where the shim "
                              "finds a job's region by its cgroup)")
        if name == "prolog":
            mapping(sub)
    install = actions.add_parser(
        "install", help="write the Prolog, Epilog and TaskProlog; print the slurm.conf lines; "
                        "check the node")
    install.add_argument("--dir", metavar="DIR", default=slurm.SCRIPT_DIR,
                         help="where to write the scripts (default: %(default)s)")
    install.add_argument("--node-dir", metavar="DIR", default=slurm.NODE_DIR,
                         help="where each job's region is kept (default: %(default)s, where the shim "
                              "finds a job's region by its cgroup)")
    install.add_argument("--slurm-conf", metavar="FILE",
                         help="the slurm.conf to check (default: $SLURM_CONF, else "
                              "/etc/slurm/slurm.conf)")
    install.add_argument("--print-only", action="store_true",
                         help="write nothing; print what would be written")
    mapping(install)


def _add_container_commands(commands) -> None:
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
    cdi_commands = cdi.add_subparsers(dest="cdi_action", metavar="COMMAND", parser_class=_Parser)
    cdi_commands.required = True
    generate = cdi_commands.add_parser(
        "generate", help="write a CDI spec of kind vgpulimit.io/gpu",
        description="Write a CDI spec with one device of kind vgpulimit.io/gpu that gives a "
                    "container the limits, the shim and the OCI hook: "
                    "'podman run --device vgpulimit.io/gpu=NAME ...'.  At least one limit is "
                    "required; a device with none is asked for with --memory none --cores none.")
    generate.add_argument("--name", help="the device's name (default: from the limits)")
    generate.add_argument("--memory", metavar="SIZE",
                          help="memory cap for every device: 4GiB, 3000m, 50%%, 0.2, ... or 'none'")
    generate.add_argument("--cores", metavar="PCT",
                          help="compute share in percent: 30 or 30%%, or 'none'")
    generate.add_argument("--cores-policy", metavar="POLICY", help="hard (default), borrow or none")
    generate.add_argument("--priority", metavar="PRIORITY", help="high, normal or low")
    generate.add_argument("--device", metavar="UUID",
                          help="the limits are for this device only: GPU-<uuid>, or a MIG device's "
                               "MIG-<uuid> (50%% of which is half its instance)")
    generate.add_argument("--memory-request", metavar="SIZE",
                          help="memory guaranteed on every device, at most --memory")
    generate.add_argument("--memory-wait", metavar="DURATION",
                          help="how long a refused allocation waits for memory: 500ms, 2s, ...")
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


def _cmd_run(args: argparse.Namespace) -> int:
    from vgpulimit import request, supervisor

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise UsageError("run: no command given (usage: vgpulimit run [OPTIONS] -- CMD [ARG...])")
    if not command[0].strip():
        # A shell's "$CMD" left empty: no program has that name, and exec
        # would refuse it only after the region is made.
        raise UsageError(f"run: the command's name is {command[0]!r}; give a program on PATH or "
                         "a path to one (e.g. vgpulimit run -- python3 app.py)")
    memory = args.memory
    if args.unit is not None and args.memory_units is None:
        raise UsageError("run: --unit is the size of one --memory-units unit, and no --memory-units "
                         "is given; give --memory-units N with it (e.g. --memory-units 8 --unit 128Mi), "
                         "or --memory SIZE")
    if args.memory_units is not None:
        if memory is not None:
            raise UsageError("run: give --memory or --memory-units, not both")
        memory = request.memory_units(args.memory_units, args.unit)
    limits = request.resolve_limits(memory, args.memory_device, os.environ,
                                    args.cores, args.cores_device, args.cores_policy, args.priority,
                                    args.memory_request, args.memory_request_device, args.memory_wait)
    if args.board is not None and limits.priority is None and not limits.takes_memory_row():
        raise UsageError("run: --board is the node's board of --priority and of memory caps and requests, "
                         "and neither is given; give --priority high|normal|low or --memory SIZE with it")
    if args.board is not None and not os.path.isabs(args.board):
        raise UsageError(f"run: --board {args.board!r} must be an absolute path (e.g. "
                         "/run/vgpulimit/priority.board)")
    if args.region == "":
        raise UsageError("run: --region is empty; give the path where the region file is made "
                         "(e.g. /run/vgpulimit/job.region), or leave --region out for a private one")
    given = {u: s.source for kind in (limits.memory_by_uuid, limits.cores_by_uuid, limits.request_by_uuid)
             for u, s in kind.items()}
    _refuse_mig_gpus(given, args.simulate)
    options = request.RunOptions(command=command, limits=limits, simulate=args.simulate,
                                 region_path=args.region, board_path=args.board)
    return supervisor.run(options)


def _refuse_mig_gpus(given: dict[str, str], simulate: bool) -> None:
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


def _region_path(args: argparse.Namespace) -> str:
    if args.region == "":
        raise UsageError(f"{args.action}: --region is empty; give the path of a region file, or leave "
                         "--region out for $VGPULIMIT_REGION")
    path = args.region or os.environ.get("VGPULIMIT_REGION")
    if not path:
        raise _NoRegion("no region: give --region PATH or set VGPULIMIT_REGION")
    return path


def _view_sources(args: argparse.Namespace) -> tuple[list[str], str | None]:
    """The region files a view reads: --all DIR, else --region / $VGPULIMIT_REGION."""
    if args.simulate:
        from vgpulimit import nvml

        nvml.use_simulated()
    if args.all is not None:
        for directory in args.all:
            if not os.path.isdir(directory):
                raise UsageError(f"--all {directory}: not a directory")
        return [], args.all
    return [_region_path(args)], None


def _cmd_status(args: argparse.Namespace) -> int:
    from vgpulimit import query, render, status

    if args.format is not None and args.query is None:
        raise UsageError("status: --format is the form of --query's rows; give --query FIELD,... "
                         "with it (see 'vgpulimit status --query help')")
    if args.query is not None:
        if args.json:
            raise UsageError("status: --query writes CSV and --json JSON; give one of them")
        if args.query.strip() == "help":
            sys.stdout.write(query.help_text())
            return 0
        fields = query.parse_fields(args.query)
        fmt = query.parse_format("csv" if args.format is None else args.format)
    paths, directory = _view_sources(args)
    if directory is None:
        sample = status.take(paths, directory, args.interval)
        [view] = sample.views
        if args.query is not None:
            sys.stdout.write(query.render_csv(render.status_document(view, sample), fields, fmt))
        else:
            sys.stdout.write(render.render_json(view, sample) if args.json
                             else render.render_text(view, sample))
        return 0
    from vgpulimit import node

    sampler = status.Sampler(paths, directory)
    sample, gpus = node.take(sampler)
    if args.interval > 0:
        time.sleep(args.interval)
        sample, gpus = node.take(sampler)
    if args.query is not None:
        document = render.status_document_all(sample, gpus)
        sys.stdout.write(query.render_csv(document, fields, fmt))
        for error in document["errors"]:   # on stderr: the rows stay CSV
            print(f"{PROG}: region {error['region']}: {error['error']}", file=sys.stderr)
        return 0
    sys.stdout.write(render.render_json_all(sample, gpus) if args.json
                     else render.render_text_all(sample, gpus))
    return 0


def _cmd_top(args: argparse.Namespace) -> int:
    paths, directory = _view_sources(args)
    from vgpulimit import top

    return top.run(paths, directory, args.interval, once=args.once)


def _max_processes(text: str) -> int:
    if not (text.isascii() and text.isdigit() and int(text) <= 1000):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number 0-1000")
    return int(text)


def _cmd_metrics(args: argparse.Namespace) -> int:
    paths, directory = _view_sources(args)
    from vgpulimit import metrics

    if args.pod_logs is not None and not os.path.isdir(args.pod_logs):
        raise UsageError(f"--pod-logs {args.pod_logs}: not a directory")
    metrics.serve(args.listen, paths, directory, args.pod_logs, args.max_processes, args.hami_names)
    return 0


def _cmd_set(args: argparse.Namespace) -> int:
    from vgpulimit import change

    asked = change.Change.parse(args.memory, args.memory_device, args.cores, args.cores_device,
                                args.cores_policy, args.priority, args.memory_request,
                                args.memory_request_device, args.memory_wait)
    for note in asked.notes:
        print(f"{PROG}: note: {note}", file=sys.stderr)
    _refuse_mig_gpus({u: f"--memory-device {u}" for u in asked.memory_by_uuid}
                     | {u: f"--cores-device {u}" for u in asked.cores_by_uuid}, False)
    lines = change.apply(_region_path(args), asked)
    print("\n".join(lines) if lines else "nothing changed: the limits were already these")
    return 0


def _container_region(args: argparse.Namespace) -> str:
    """The region of the container --container names, among those under --all."""
    from vgpulimit import identity
    from vgpulimit.status import find_regions

    if not args.all:
        raise UsageError(f"{args.action}: --container needs --all DIR, the directory its region is under")
    for directory in args.all:
        if not os.path.isdir(directory):
            raise UsageError(f"--all {directory}: not a directory")
    wanted = args.container
    found = []
    for path in sorted({p for d in args.all for p in find_regions(d)}):
        who = identity.of_region(path)
        # The node view (status --all, top --all) names a container without a
        # name by its region's path, which it may show by its end alone.
        shown = path == wanted or path.endswith(f"/{wanted.lstrip('/')}")
        if wanted and (who.container_id.startswith(wanted) or who.name == wanted or shown):
            found.append(path)
    if len(found) != 1:
        where = ", ".join(args.all)
        raise _NoRegion(f"--container {wanted!r}: no container of that id, name or region path under {where}" if not found
                        else f"--container {wanted!r}: {len(found)} containers under {where} match; give more of "
                             "the id")
    return found[0]


def _cmd_suspend(args: argparse.Namespace) -> int:
    from vgpulimit import suspend
    from vgpulimit.limits import format_bytes, parse_wait

    if args.all and args.container is None:
        raise UsageError(f"{args.action}: --all DIR is where --container ID looks; give --container with it")
    region = _container_region(args) if args.container is not None else _region_path(args)
    timeout_ms = 0
    if args.action == "suspend":
        timeout_ns = parse_wait(args.timeout, "--timeout")
        if timeout_ns == 0:
            raise UsageError("--timeout 0: expected a duration (500ms, 2s, ...): a suspend that waits forever "
                             "for a process's GPU work is not offered")
        timeout_ms = max(1, timeout_ns // 1_000_000)
    driver = suspend.Driver(args.simulate)
    if args.action == "suspend":
        record = suspend.suspend(region, driver, timeout_ms)
        print(f"suspended: {format_bytes(record.out_total_bytes)} off the GPU in "
              f"{record.last_suspend_ns / 1e9:.3f} s")
    else:
        record = suspend.resume(region, driver)
        print(f"resumed in {record.last_resume_ns / 1e9:.3f} s")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from vgpulimit import supervisor, verify

    report = verify.verify(verify.Options(memory=args.memory, cores=args.cores,
                                          device=args.device, simulate=args.simulate,
                                          quick=args.quick, no_alloc=args.no_alloc),
                           supervisor.run)
    sys.stdout.write(verify.render_json(report) if args.json else verify.render_text(report))
    return 0 if report.ok else EXIT_FAILURE


def _cmd_completion(args: argparse.Namespace) -> int:
    from vgpulimit import completion

    sys.stdout.write(completion.script(_build_parser(), args.shell))
    return 0


def _cmd_libpath(args: argparse.Namespace) -> int:
    from vgpulimit._paths import libpath

    print(libpath())
    return 0


def _cmd_simgpu_path(args: argparse.Namespace) -> int:
    from vgpulimit._paths import simgpu_dir

    print(simgpu_dir())
    return 0


def _cmd_oci_hook(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vgpulimit.oci import hook

    _absolute_node_dir("oci-hook", args.node_dir)
    return hook.run(sys.stdin, Path(args.node_dir), _admission(args))


def _admission(args: argparse.Namespace):
    from vgpulimit.oci.admit import Admission

    if args.admit_uncapped and not args.admit:
        raise UsageError("--admit-uncapped goes with --admit")
    return Admission(allow_uncapped=args.admit_uncapped) if args.admit else None


def _absolute_node_dir(command: str, node_dir: str | None) -> None:
    """The node directory is where `status --all` looks on the node: a path
    relative to whatever directory the runtime runs its hooks in is none."""
    if node_dir is not None and not node_dir.startswith("/"):
        raise UsageError(f"{command}: --node-dir {node_dir!r} is not an absolute path; give "
                         "one such as /run/vgpulimit/containers, or leave it out for the default")


def _cmd_install_hook(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vgpulimit.oci import hooks_d

    if not args.dir:
        raise UsageError("install-hook: --dir is empty; give the hooks.d directory "
                         f"(default {hooks_d.HOOKS_D_DIR})")
    # Written into the hooks.d file, where the hook reads it from whatever
    # directory the runtime runs it in: every limited container would fail.
    _absolute_node_dir("install-hook", args.node_dir)
    try:
        admission = _admission(args)
        print(hooks_d.install_hooks_d(Path(args.dir), args.node_dir, admission is not None,
                                      args.admit_uncapped))
    except OSError as exc:
        raise _CannotWrite(f"install-hook: cannot write {exc.filename or args.dir}: "
                           f"{exc.strerror}") from None
    return 0


def _cmd_cdi(args: argparse.Namespace) -> int:
    import json

    from vgpulimit import cdi

    _absolute_node_dir("cdi generate", args.node_dir)
    admission = _admission(args)
    spec = cdi.generate(args.name, args.memory, args.cores, args.node_dir, args.cores_policy,
                        admission is not None, args.admit_uncapped, priority=args.priority,
                        device=args.device, memory_request=args.memory_request, memory_wait=args.memory_wait)
    if args.device is not None:
        _refuse_mig_gpus({args.device.strip(): f"--device {args.device.strip()}"}, False)
    text = json.dumps(spec, indent=2) + "\n"
    if args.output is None:
        sys.stdout.write(text)
        return 0
    if not args.output:
        raise UsageError("cdi generate: --output is empty; give the spec's file name "
                         "(e.g. /etc/cdi/vgpulimit.json), or no --output for stdout")
    _replace_file(args.output, text, "--output")
    return 0


def _replace_file(name: str, text: str, flag: str) -> None:
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
        raise _CannotWrite(f"{flag} {path}: {what}; give a file name")
    temp = path.with_name(f".{path.name}.tmp")
    try:
        temp.write_text(text, encoding="utf-8")
        temp.replace(path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise _CannotWrite(f"{flag} {path}: {exc.strerror}") from None


def _cmd_slurm(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vgpulimit import slurm

    _absolute_node_dir(f"slurm {args.slurm_action}", args.node_dir)
    if args.slurm_action == "prolog":
        print(slurm.prolog(os.environ, Path(args.node_dir), (args.shard_memory, args.shard_cores),
                           args.shards_per_gpu, args.mps), file=sys.stderr)
        return 0
    if args.slurm_action == "epilog":
        print(slurm.epilog(os.environ, Path(args.node_dir)), file=sys.stderr)
        return 0
    conf = args.slurm_conf or os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    try:
        done = slurm.install(Path(args.dir), args.node_dir, (args.shard_memory, args.shard_cores),
                             args.shards_per_gpu, sys.executable, Path(conf), not args.print_only,
                             args.mps)
    except OSError as exc:
        raise _CannotWrite(f"slurm install: cannot write {exc.filename or args.dir}: "
                           f"{exc.strerror}") from None
    verb = "would write" if args.print_only else "wrote"
    for path in done.scripts.values():
        print(f"# {verb} {path}")
    print("# slurm.conf needs:")
    print("\n".join(done.conf_lines))
    print("# node check:")
    for ok, what in done.checks:
        print(f"{'ok  ' if ok else 'MISSING'} {what}")
    return 0 if all(ok for ok, _ in done.checks) else 1


class _NoRegion(VgpulimitError, LookupError):
    pass


class _CannotWrite(VgpulimitError, OSError):
    pass


_COMMANDS = {
    "run": _cmd_run,
    "status": _cmd_status,
    "top": _cmd_top,
    "metrics": _cmd_metrics,
    "set": _cmd_set,
    "suspend": _cmd_suspend,
    "resume": _cmd_suspend,
    "verify": _cmd_verify,
    "completion": _cmd_completion,
    "libpath": _cmd_libpath,
    "simgpu-path": _cmd_simgpu_path,
    "oci-hook": _cmd_oci_hook,
    "install-hook": _cmd_install_hook,
    "cdi": _cmd_cdi,
    "slurm": _cmd_slurm,
    "mig": _cmd_mig,
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `run` holds the signals it forwards from here, not from the child's
    # start: as a container's PID 1, a `docker stop` during the set-up (the
    # parser, the imports, the region: tens of ms) would be lost.  Only
    # --help and --version may come before a command, so `run` is first.
    with signals.held() if argv[:1] == ["run"] else contextlib.nullcontext():
        try:
            parser = _build_parser()
            args = parser.parse_args(_dash_values(parser, argv))
            return _COMMANDS[args.action](args)
        except KeyboardInterrupt:
            return 128 + 2
        except VgpulimitError as exc:   # every expected error, and its code: here only
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return exc.exit_code

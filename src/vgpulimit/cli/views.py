"""The views: `status`, `top` and `metrics`, each reading regions and the
node's GPUs (the only commands that reach the renderers)."""

from __future__ import annotations

import argparse
import os
import sys
import time

from vgpulimit.cli.common import (
    PROG,
    region_file,
)
from vgpulimit.errors import UsageError

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


def _add_view_sources(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--region", metavar="PATH",
                        help="the region file (default: $VGPULIMIT_REGION)")
    source.add_argument("--all", metavar="DIR", action="append",
                        help="every region file under DIR (e.g. the run directory of a node); "
                             "repeat for several, e.g. vgpulimit's and HAMi's /usr/local/vgpu")
    parser.add_argument("--pod-logs", metavar="DIR",
                        help="the kubelet's pod log directory (/var/log/pods), whose "
                             "<namespace>_<pod>_<uid> entries name the pods of HAMi's and KAI's "
                             "regions (default: none)")
    parser.add_argument("--simulate", action="store_true",
                        help="read the simulated GPU that ships with vgpulimit as the node's "
                             "physical GPUs (as 'run --simulate' runs on it)")


def _max_processes(text: str) -> int:
    if not (text.isascii() and text.isdigit() and int(text) <= 1000):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number 0-1000")
    return int(text)


def add(commands) -> None:
    """status, top and metrics."""
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
    metrics.add_argument("--max-processes", metavar="N", type=_max_processes, default=10,
                         help="per-process series per container and device, the largest by "
                              "memory; the rest are summed into one (default 10, 0 to 1000)")
    metrics.add_argument("--hami-names", action="store_true",
                         help="also serve the figures under the names and labels of HAMi's vGPU "
                              "monitor (vGPU_device_memory_usage_in_bytes, HostGPUMemoryUsage, "
                              "...), so that HAMi's dashboards work")
    _add_view_sources(metrics)


def _view_sources(args: argparse.Namespace) -> tuple[list[str], str | None]:
    """The region files a view reads: --all DIR, else --region / $VGPULIMIT_REGION."""
    if args.simulate:
        from vgpulimit import nvml

        nvml.use_simulated()
    if args.pod_logs is not None and not os.path.isdir(args.pod_logs):
        raise UsageError(f"--pod-logs {args.pod_logs}: not a directory")
    if args.all is not None:
        for directory in args.all:
            if not os.path.isdir(directory):
                raise UsageError(f"--all {directory}: not a directory")
        return [], args.all
    return [region_file(args)], None


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

    sampler = status.Sampler(paths, directory, args.pod_logs)
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

    return top.run(paths, directory, args.interval, once=args.once, pod_logs=args.pod_logs)


def _cmd_metrics(args: argparse.Namespace) -> int:
    paths, directory = _view_sources(args)
    from vgpulimit import metrics

    metrics.serve(args.listen, paths, directory, args.pod_logs, args.max_processes, args.hami_names)
    return 0


COMMANDS = {"status": _cmd_status, "top": _cmd_top, "metrics": _cmd_metrics}

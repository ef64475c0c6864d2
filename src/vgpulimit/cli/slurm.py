"""`vgpulimit slurm`: Slurm's hooks and their install."""

from __future__ import annotations

import argparse
import os
import sys

from vgpulimit.cli.common import (
    CannotWrite,
    Parser,
    absolute_node_dir,
)


def add(commands) -> None:
    """slurm and its actions."""
    from vgpulimit import slurm

    parser = commands.add_parser(
        "slurm", help="Slurm: GRES shards as memory caps and compute shares (Prolog, Epilog, TaskProlog)",
        description="A job given N shards of a GPU of S shards gets a memory cap of N/S of the GPU's "
                    "memory and N/S of its time, in one region per job and node.  'install' writes "
                    "the three scripts and prints the slurm.conf lines; slurmd runs the rest.")
    actions = parser.add_subparsers(dest="slurm_action", metavar="COMMAND", parser_class=Parser)
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


def _cmd_slurm(args: argparse.Namespace) -> int:
    from pathlib import Path

    from vgpulimit import slurm

    absolute_node_dir(f"slurm {args.slurm_action}", args.node_dir)
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
        raise CannotWrite(f"slurm install: cannot write {exc.filename or args.dir}: "
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


COMMANDS = {"slurm": _cmd_slurm}

"""What a shell asks of vgpulimit: `completion`, `libpath` (for LD_PRELOAD)
and `simgpu-path` (for LD_LIBRARY_PATH)."""

from __future__ import annotations

import argparse
import sys


def add(commands) -> None:
    """completion, libpath and simgpu-path."""
    from vgpulimit.completion import SHELLS

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


def _cmd_completion(args: argparse.Namespace) -> int:
    from vgpulimit import completion
    sys.stdout.write(completion.script(args.parser, args.shell))
    return 0


def _cmd_libpath(args: argparse.Namespace) -> int:
    from vgpulimit._paths import libpath

    print(libpath())
    return 0


def _cmd_simgpu_path(args: argparse.Namespace) -> int:
    from vgpulimit._paths import simgpu_dir

    print(simgpu_dir())
    return 0


COMMANDS = {"completion": _cmd_completion, "libpath": _cmd_libpath, "simgpu-path": _cmd_simgpu_path}

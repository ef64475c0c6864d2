"""Shell completion, written from the CLI's own parser: a flag or command
added to the parser completes without a second list to keep in step.

The script is a table (the commands under each command, the options of each,
what each option's value is) and one fixed function that walks the words typed
so far through it.  zsh runs the same function through its bash emulation
(bashcompinit), so both shells complete from one script that is tested.
"""

from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass, field

from vgpulimit.limits import CORES_POLICIES

SHELLS = ("bash", "zsh")

# What an option's value is, by its metavar, where argparse has no choices to
# offer (a policy is checked by the limit parser, whose message says more than
# argparse's "invalid choice").
_FILE_METAVARS = {"PATH", "FILE"}
_DIR_METAVARS = {"DIR"}
_WORD_METAVARS = {"POLICY": CORES_POLICIES}
# A value with nothing to offer: completion stays quiet rather than offering
# options or files where a size or a percentage goes.
FREE = "?"


@dataclass
class Command:
    """One command's words: its subcommands (or the choices of its argument),
    its options and what each takes."""

    words: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)
    values: dict[str, str] = field(default_factory=dict)   # option -> file, dir, FREE or words
    runs_a_command: bool = False    # takes `-- CMD ...`


def model(parser: argparse.ArgumentParser) -> dict[str, Command]:
    """Every command of ``parser`` by its path ("" for the top, "cdi generate")."""
    commands: dict[str, Command] = {}

    def walk(path: str, parser: argparse.ArgumentParser) -> None:
        command = commands[path] = Command()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    command.words.append(name)
                    walk(f"{path} {name}".strip(), sub)
            elif action.option_strings:
                command.options.extend(action.option_strings)
                if action.nargs != 0:
                    kind = _value_kind(action)
                    command.values.update(dict.fromkeys(action.option_strings, kind))
            elif action.nargs == argparse.REMAINDER:
                command.runs_a_command = True
            elif action.choices:
                command.words.extend(map(str, action.choices))
    walk("", parser)
    return commands


def _value_kind(action: argparse.Action) -> str:
    if action.choices:
        return " ".join(map(str, action.choices))
    if action.metavar in _WORD_METAVARS:
        return " ".join(_WORD_METAVARS[action.metavar])
    if action.metavar in _FILE_METAVARS:
        return "file"
    if action.metavar in _DIR_METAVARS:
        return "dir"
    return FREE


# The walk, fixed.  Its tables' names are none of zsh's special ones
# (commands, options, words).  Files are offered only where a file goes
# (compopt: as file names, a slash after a directory), never in place of a
# size.  bash's COMP_WORDBREAKS splits `--memory=4GiB` into three words,
# `--memory`, `=`, `4GiB`, hence the `=` cases.
_FUNCTION = r"""
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} path=@PROG@ word kind key
    local -i i=1
    COMPREPLY=()
    while (( i < COMP_CWORD )); do
        word=${COMP_WORDS[i]}
        if [[ $word == -- && -n ${cmd_remainder[$path]} ]]; then
            # The command to run: its name, then whatever it takes.
            if (( i == COMP_CWORD - 1 )); then
                COMPREPLY=($(compgen -c -- "$cur"))
            else
                compopt -o filenames 2>/dev/null
                COMPREPLY=($(compgen -f -- "$cur"))
            fi
            return 0
        fi
        key="$path $word"   # a quoted subscript is taken literally by zsh
        if [[ -n ${option_values[$key]} ]]; then
            i+=1
            [[ ${COMP_WORDS[i]} == = ]] && i+=1
        elif [[ $word != -* && " ${cmd_words[$path]} " == *" $word "* ]]; then
            path="$path $word"
        fi
        i+=1
    done
    if [[ $cur == = ]]; then
        cur=""
    elif [[ $prev == = ]]; then
        prev=${COMP_WORDS[COMP_CWORD-2]}
    fi
    key="$path $prev"
    kind=${option_values[$key]}
    case $kind in
        "") ;;
        file) compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- "$cur")); return 0 ;;
        dir) compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -d -- "$cur")); return 0 ;;
        "?") return 0 ;;
        *) COMPREPLY=($(compgen -W "$kind" -- "$cur")); return 0 ;;
    esac
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "${cmd_options[$path]}" -- "$cur"))
    else
        COMPREPLY=($(compgen -W "${cmd_words[$path]}" -- "$cur"))
    fi
    return 0
"""


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script of ``parser.prog`` for ``shell`` (one of SHELLS)."""
    if shell not in SHELLS:
        raise ValueError(f"no completion for {shell!r}: one of {', '.join(SHELLS)}")
    prog = parser.prog
    function = "_" + "".join(c if c.isalnum() else "_" for c in prog)
    commands = model(parser)

    def table(name: str, rows: dict[str, str]) -> str:
        body = "".join(f"\n        [{shlex.quote(key)}]={shlex.quote(value)}"
                       for key, value in rows.items())
        return f"    local -A {name}=({body}\n    )\n"

    def key(path: str) -> str:
        # A command's words from the program's name on: bash refuses an empty
        # key, which the top command would otherwise have.
        return f"{prog} {path}".rstrip()

    tables = (
        table("cmd_words", {key(path): " ".join(c.words) for path, c in commands.items()
                           if c.words})
        + table("cmd_options", {key(path): " ".join(c.options) for path, c in commands.items()})
        + table("option_values", {f"{key(path)} {option}": kind for path, c in commands.items()
                           for option, kind in c.values.items()})
        + table("cmd_remainder", {key(path): "1" for path, c in commands.items()
                              if c.runs_a_command})
    )
    head = f"# {shell} completion for {prog}, written by '{prog} completion {shell}'.\n"
    if shell == "bash":
        head += f"# Load it with: source <({prog} completion bash)\n"
    else:
        head += (f"# Load it with: source <({prog} completion zsh)\n"
                 "# zsh runs bash's completion function through bashcompinit.\n"
                 "autoload -U +X bashcompinit && bashcompinit\n")
    body = _FUNCTION.lstrip("\n").replace("@PROG@", shlex.quote(prog))
    return (f"{head}{function}() {{\n{tables}{body}}}\n"
            f"complete -F {function} {prog}\n")

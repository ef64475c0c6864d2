"""`vgpulimit slurm install`: the Prolog, Epilog and TaskProlog slurmd runs,
the slurm.conf lines that name them, and what the node lacks."""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from vgpulimit.slurm.hooks import REFUSED_NAME, REGION_NAME
from vgpulimit.slurm.mapping import parse_mapping

SCRIPT_DIR = "/etc/slurm"
SCRIPTS = {"Prolog": "vgpulimit-prolog", "Epilog": "vgpulimit-epilog",
           "TaskProlog": "vgpulimit-task-prolog"}


def task_prolog_script(node_dir: str, shim: str) -> str:
    """The TaskProlog: POSIX sh, since it runs once per task as the job's user
    and Python's start would be paid by every task."""
    return f"""#!/bin/sh
# vgpulimit's Slurm TaskProlog, written by 'vgpulimit slurm install': exports
# the shim and the region the Prolog made for the job's shards, or refuses the
# task (a non-zero exit: the task does not run, the node stays up).
dir={shlex.quote(node_dir)}/"$SLURM_JOB_ID"
refuse() {{
    # The TaskProlog's own stderr goes nowhere: the task's is the job's.
    case "$SLURM_TASK_PID" in
        ''|*[!0-9]*) printf 'vgpulimit: error: %s\\n' "$1" >&2 ;;
        *) printf 'vgpulimit: error: %s\\n' "$1" >"/proc/$SLURM_TASK_PID/fd/2" 2>/dev/null \\
               || printf 'vgpulimit: error: %s\\n' "$1" >&2 ;;
    esac
    exit 1
}}
case "$SLURM_JOB_ID" in ''|*[!0-9]*) refuse "SLURM_JOB_ID '$SLURM_JOB_ID' is not a job id" ;; esac
if [ -f "$dir/{REFUSED_NAME}" ]; then
    refuse "$(head -n 1 "$dir/{REFUSED_NAME}")"
fi
if [ -f "$dir/{REGION_NAME}" ]; then
    echo "export LD_PRELOAD={shim}${{LD_PRELOAD:+:$LD_PRELOAD}}"
    echo "export VGPULIMIT_REGION=$dir/{REGION_NAME}"
    # A process that sheds the region but keeps this is told so by the shim.
    echo "export VGPULIMIT_SETTER=slurm"
    exit 0
fi
case "${{SLURM_SHARDS_ON_NODE:-0}}" in
    0) exit 0 ;;
esac
refuse "Slurm job $SLURM_JOB_ID has $SLURM_SHARDS_ON_NODE GPU shard(s) here but no region in $dir: \\
the Prolog (vgpulimit slurm prolog) did not make one; refused rather than run uncapped"
"""


def _hook_script(python: str, command: str, node_dir: str, extra: list[str]) -> str:
    args = " ".join(shlex.quote(a) for a in ["--node-dir", node_dir, *extra])
    # slurmd runs its Prolog with no PATH: the scontrol found now.
    found = shutil.which("scontrol")
    path = ":".join(dict.fromkeys([*([os.path.dirname(found)] if found else []),
                                   "/usr/local/bin", "/usr/bin", "/bin"]))
    return (f"#!/bin/sh\n# vgpulimit's Slurm {command}, written by 'vgpulimit slurm install'.\n"
            f"PATH={shlex.quote(path)}; export PATH\n"
            f"exec {shlex.quote(python)} -m vgpulimit slurm {command} {args}\n")


@dataclass(frozen=True)
class Installed:
    scripts: dict[str, Path]
    conf_lines: list[str]
    checks: list[tuple[bool, str]]


def install(script_dir: Path, node_dir: str, mapping_text: tuple[str, str], per_gpu: int | None,
            python: str, slurm_conf: Path | None, write: bool, mps: bool = False) -> Installed:
    """The three scripts (written with ``write``), the slurm.conf lines that
    name them, and what the node lacks."""
    from vgpulimit._paths import libpath

    parse_mapping(*mapping_text)   # a site's typo fails here, not in every job
    extra = ["--shard-memory", mapping_text[0], "--shard-cores", mapping_text[1]]
    if per_gpu is not None:
        extra += ["--shards-per-gpu", str(per_gpu)]
    if mps:
        extra.append("--mps")
    shim = str(libpath())
    texts = {"Prolog": _hook_script(python, "prolog", node_dir, extra),
             "Epilog": _hook_script(python, "epilog", node_dir, []),
             "TaskProlog": task_prolog_script(node_dir, shim)}
    scripts = {key: script_dir / name for key, name in SCRIPTS.items()}
    if write:
        script_dir.mkdir(parents=True, exist_ok=True)
        for key, path in scripts.items():
            temp = path.with_name(f".{path.name}.tmp")
            temp.write_text(texts[key], encoding="utf-8")
            os.chmod(temp, 0o755)
            os.replace(temp, path)
    conf_lines = [f"{key}={path}" for key, path in scripts.items()]
    conf_lines.append("GresTypes=gpu,mps   # with the node's Gres=gpu:N,mps:100*N" if mps else
                      "GresTypes=gpu,shard   # with the node's Gres=gpu:N,shard:M")
    return Installed(scripts, conf_lines, _check(slurm_conf, scripts, shim, "mps" if mps else "shard"))


def _check(slurm_conf: Path | None, scripts: Mapping[str, Path], shim: str,
           gres: str) -> list[tuple[bool, str]]:
    checks = [(os.path.isfile(shim), f"the shim is at {shim}"),
              (shutil.which("scontrol") is not None,
               "scontrol is on PATH (the Prolog asks it for the job's shards)")]
    if slurm_conf is None:
        return checks
    try:
        conf = _read_conf(slurm_conf)
    except OSError as exc:
        return [*checks, (False, f"{slurm_conf}: {exc.strerror}")]
    for key, path in scripts.items():
        have = conf.get(key.lower(), "")
        checks.append((have == str(path), f"{slurm_conf}: {key}={path}"
                       + ("" if have in ("", str(path)) else f" (it has {key}={have})")))
    types = {t.strip().lower() for t in conf.get("grestypes", "").split(",")}
    checks.append((gres in types, f"{slurm_conf}: GresTypes has {gres}"))
    return checks


def _read_conf(path: Path) -> dict[str, str]:
    """slurm.conf's KEY=VALUE lines (the last wins, as in Slurm); keys lower-cased."""
    conf = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.split("#", 1)[0].strip()
        key, sep, value = line.partition("=")
        if sep and " " not in key:
            conf[key.strip().lower()] = value.strip().split()[0] if value.strip() else ""
    return conf


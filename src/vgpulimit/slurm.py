"""Slurm GRES shards as vgpulimit limits: Slurm's hooks set up, the shim enforces.

Slurm (22.05 and later) shares a GPU between jobs as ``shard`` GRES but fences
nothing.  Here a job given N shards of a GPU of S shards on a node gets one
region on that node, made by the root-side Prolog and removed by the Epilog:
by default a memory cap of N/S of the GPU's memory and a compute share of N/S.

What each hook is given (observed on slurmd 22.05.8):

- The Prolog runs as root with SLURM_JOB_ID, SLURM_JOB_UID/GID, SLURM_JOB_USER
  and SLURMD_NODENAME, and nothing of the job's GRES: the shards are read from
  ``scontrol show job -d`` (``Nodes=... GRES=shard:2(IDX:0)``) and the GPU's
  shard count from ``scontrol show node`` (``Gres=gpu:1,shard:8``).
- The TaskProlog runs as the job's user, once per task, with the task's
  environment (SLURM_SHARDS_ON_NODE, SLURM_TASK_PID).  Its ``export`` lines
  set the task's environment; its stderr goes nowhere.  When it exits non-zero
  the task does not run, slurmstepd says so in the job's error output, and the
  node stays up.
- The Epilog runs as root with SLURM_JOB_ID, also after scancel.

A Prolog that fails drains the node (and requeues the job), so a job's bad
request must not fail it: the Prolog records the reason beside where the
region would be, and the TaskProlog refuses every task of the job with it.
The TaskProlog also refuses a task that has shards but finds no region, so a
job that asked for shards never runs uncapped."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from vgpulimit import _paths, identity
from vgpulimit.errors import UsageError, VgpulimitError
from vgpulimit.limits import LimitError, MemoryLimit, parse_memory

NODE_DIR = _paths.slurm_dir()   # the shim finds a job's region there by its cgroup
REGION_NAME = "region"
REFUSED_NAME = "refused"
SCRIPT_DIR = "/etc/slurm"
SCRIPTS = {"Prolog": "vgpulimit-prolog", "Epilog": "vgpulimit-epilog",
           "TaskProlog": "vgpulimit-task-prolog"}
FRACTION = "fraction"
_PPM = 1_000_000
_SCONTROL_TIMEOUT_S = 10


class SlurmError(VgpulimitError):
    """A job's GRES or the site's mapping that cannot be turned into limits."""


@dataclass(frozen=True)
class ShardMapping:
    """What one shard is worth.  ``memory_unit``: None for N/S of the GPU's
    memory, else the bytes of one shard; ``cores_pct``: None for N/S of the
    GPU's time, 0 for no compute limit, else the percent of one shard."""

    memory_unit: MemoryLimit | None = None
    cores_pct: int | None = None

    def limits(self, shards: int, per_gpu: int) -> tuple[MemoryLimit, int]:
        """The memory cap and compute share (percent, 0: none) of ``shards``
        of a GPU of ``per_gpu`` shards."""
        if self.memory_unit is None:
            memory = MemoryLimit(bytes=0, ppm=max(1, shards * _PPM // per_gpu))
        else:
            memory = MemoryLimit(bytes=shards * self.memory_unit.bytes, ppm=0)
        if self.cores_pct is None:
            cores = max(1, shards * 100 // per_gpu)
        else:
            cores = min(100, shards * self.cores_pct)
        return memory, 0 if cores >= 100 else cores


def parse_mapping(memory_text: str, cores_text: str) -> ShardMapping:
    """``--shard-memory`` (``fraction`` or a SIZE per shard) and
    ``--shard-cores`` (``fraction``, ``none`` or a percent per shard)."""
    memory = None
    if memory_text != FRACTION:
        try:
            memory = parse_memory(memory_text, "--shard-memory")
        except LimitError as exc:
            raise UsageError(f"unknown shard mapping: {exc}; or 'fraction' (N/S of the GPU)") from None
        if memory.ppm:
            raise UsageError(f"unknown shard mapping: --shard-memory {memory_text!r} is a share of the "
                             "GPU; give a size per shard (1GiB, 128Mi) or 'fraction' (N/S of the GPU)")
    if cores_text == FRACTION:
        cores = None
    elif cores_text == "none":
        cores = 0
    else:
        number = cores_text.removesuffix("%")
        if not (number.isascii() and number.isdigit() and 1 <= int(number) <= 100):
            raise UsageError(f"unknown shard mapping: --shard-cores {cores_text!r}: give 'fraction' "
                             "(N/S of the GPU's time), 'none' or a percent per shard, 1-100")
        cores = int(number)
    return ShardMapping(memory, cores)


# One item of a GRES list: name[:type]:count[(IDX:list)] or name[:type]:count[(S:list)];
# or name(CNT:count), as slurm 22.05.8 writes a job's shards on a node that has mps too.
_GRES_ITEM = re.compile(r"(?P<name>[A-Za-z][\w-]*)(?::(?P<type>[\w.-]+))?"
                        r"(?::(?P<count>\d+)|\(CNT:(?P<cnt>\d+)\))"
                        r"(?:\((?:IDX|S):(?P<index>[\d,\-]*|N/A)\))?")


@dataclass(frozen=True)
class Gres:
    shards: int = 0
    gpus: int = 0
    indices: str = ""   # the GPUs' indices on the node ("0", "0-1"), as Slurm writes them
    mps: int = 0        # MPS GRES: by Slurm's convention a GPU has 100, a job its percent

    def as_shards(self) -> Gres:
        """The MPS GRES read as shards, for a site that caps mps jobs as shard jobs (--mps)."""
        return Gres(shards=self.mps, gpus=self.gpus, indices=self.indices)


def parse_gres(text: str) -> Gres:
    """A GRES list as scontrol prints it: ``shard:2(IDX:0)``,
    ``gpu:a100:1(IDX:0),shard:...``; ``(null)`` or empty for none."""
    text = text.strip()
    if text in ("", "(null)"):
        return Gres()
    counts = {"shard": 0, "gpu": 0, "mps": 0}
    indices = []
    for item in _split_top_level(text):
        match = _GRES_ITEM.fullmatch(item)
        if match is None:
            raise SlurmError(f"GRES {text!r}: cannot read {item!r}; expected name[:type]:count[(IDX:list)]")
        if match["name"] in counts:
            counts[match["name"]] += int(match["count"] or match["cnt"])
            if match["index"] and match["name"] in ("shard", "mps"):
                indices.append(match["index"])
    return Gres(shards=counts["shard"], gpus=counts["gpu"], indices=",".join(indices), mps=counts["mps"])


def _split_top_level(text: str) -> list[str]:
    """Splits on the commas outside parentheses (an IDX list holds commas)."""
    items, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += (c == "(") - (c == ")")
        if c == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return items


def expand_hostlist(text: str) -> list[str]:
    """Slurm's host list ``node[01-03,7],gpu1`` as names."""
    names = []
    for item in _split_top_level(text.replace("[", "(").replace("]", ")")):
        match = re.fullmatch(r"([^()]*)\(([^()]*)\)(.*)", item)
        if match is None:
            names.append(item)
            continue
        prefix, ranges, suffix = match.groups()
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            if not (low.isdigit() and (not high or high.isdigit())):
                raise SlurmError(f"host list {text!r}: cannot read {part!r}")
            for n in range(int(low), int(high or low) + 1):
                names.append(f"{prefix}{n:0{len(low)}d}{suffix}")
    return names


def job_gres_on(job_text: str, node: str) -> Gres:
    """The job's GRES on ``node`` from ``scontrol show job -d``: the
    ``Nodes=LIST ... GRES=...`` line whose list holds the node."""
    for line in job_text.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "Nodes" in fields and "CPU_IDs" in fields and node in expand_hostlist(fields["Nodes"]):
            return parse_gres(fields.get("GRES", ""))
    return Gres()


def node_gres(node_text: str) -> Gres:
    """The node's GRES from ``scontrol show node``'s ``Gres=`` field."""
    for field in node_text.split():
        if field.startswith("Gres="):
            return parse_gres(field[len("Gres="):])
    return Gres()


def shards_per_gpu(node: Gres) -> int:
    """Slurm spreads a node's shards evenly over its GPUs unless gres.conf
    says otherwise per GPU; a site that does says so with --shards-per-gpu."""
    if node.shards == 0 or node.gpus == 0 or node.shards % node.gpus:
        raise SlurmError(f"the node has {node.shards} shard(s) over {node.gpus} GPU(s): give the "
                         "shards of one GPU with --shards-per-gpu")
    return node.shards // node.gpus


@dataclass(frozen=True)
class Job:
    job_id: str
    user: str
    uid: int
    gid: int
    node: str

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> Job:
        job_id = env.get("SLURM_JOB_ID", "")
        if not (job_id.isascii() and job_id.isdigit()):
            raise SlurmError(f"SLURM_JOB_ID {job_id!r} is not a job id: run by slurmd as its Prolog")
        try:
            uid, gid = int(env["SLURM_JOB_UID"]), int(env["SLURM_JOB_GID"])
        except (KeyError, ValueError):
            raise SlurmError("SLURM_JOB_UID or SLURM_JOB_GID missing or not a number") from None
        return cls(job_id, identity._clean(env.get("SLURM_JOB_USER", str(uid))), uid, gid,
                   env.get("SLURMD_NODENAME", "") or os.uname().nodename)


def scontrol(*args: str) -> str:
    try:
        done = subprocess.run(["scontrol", *args], capture_output=True, text=True,
                              timeout=_SCONTROL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"scontrol {' '.join(args)}: {exc}") from None
    if done.returncode != 0:
        raise SlurmError(f"scontrol {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def job_dir(node_dir: Path, job_id: str) -> Path:
    return node_dir / job_id


def prolog(env: Mapping[str, str], node_dir: Path, mapping_text: tuple[str, str],
           per_gpu: int | None = None, mps: bool = False) -> str:
    """Makes the job's region when it has shards on this node; returns what
    it did, in one line.  Never raises for a job's bad input: that is
    recorded for the TaskProlog (a failing Prolog would drain the node).
    With ``mps``, a job with MPS GRES and no shards has its mps count as its
    shards, of the node's mps per GPU (100 by Slurm's convention)."""
    job = Job.from_environment(env)
    entry = job_dir(node_dir, job.job_id)
    _remove_entry(entry)   # a requeued job's, whose Epilog did not run
    try:
        gres = job_gres_on(scontrol("show", "job", "-d", job.job_id), job.node)
        by_mps = mps and gres.shards == 0 and gres.mps > 0
        if by_mps:
            gres = gres.as_shards()
        if gres.shards == 0:
            return f"job {job.job_id}: no shards{' or mps' if mps else ''} here, left alone"
        mapping = parse_mapping(*mapping_text)
        if per_gpu is None or by_mps:
            node = node_gres(scontrol("show", "node", job.node))
            per_gpu = shards_per_gpu(node.as_shards() if by_mps else node)
        if gres.shards > per_gpu and "," not in gres.indices and "-" not in gres.indices:
            raise SlurmError(f"{gres.shards} shards on one GPU of {per_gpu}")
        memory, cores = mapping.limits(gres.shards, per_gpu)
    except VgpulimitError as exc:
        _refuse(entry, f"Slurm job {job.job_id} refused: {exc}")
        return f"job {job.job_id}: refused: {exc}"
    _make_region(entry, job, gres.shards, per_gpu, memory, cores)
    share = "no compute limit" if cores == 0 else f"{cores}% of its time"
    return f"job {job.job_id}: {gres.shards}/{per_gpu} shards: {memory.describe()}, {share}"


def _make_region(entry: Path, job: Job, shards: int, per_gpu: int, memory: MemoryLimit,
                 cores: int) -> None:
    from vgpulimit import provision

    entry.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    entry.mkdir(mode=0o755)   # root's: the job may use its region, never swap it
    who = identity.Identity(container_id=f"slurm-{job.job_id}", hpc_job=job.job_id, user=job.user,
                            shards=f"{shards}/{per_gpu}")
    provision.provision(_tenant(entry, memory, cores, who, (job.uid, job.gid))).close()


def _tenant(entry: Path, memory: MemoryLimit | None = None, cores: int = 0, who=None, owner=None):
    """The job as a tenant: every device alike (the job sees the GPU its
    shards are on), its region given to the job's user."""
    from vgpulimit import provision
    from vgpulimit.environment import Setting
    from vgpulimit.region import MAX_DEVICES
    from vgpulimit.request import Limits

    limits = Limits(memory={i: Setting("shards", "Slurm", memory) for i in range(MAX_DEVICES)} if memory else {},
                    cores={i: Setting("shards", "Slurm", cores) for i in range(MAX_DEVICES)})
    return provision.Tenant(entry / REGION_NAME, limits, who=who or identity.Identity(), owner=owner,
                            group_shared=True)


def _refuse(entry: Path, line: str) -> None:
    entry.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    entry.mkdir(mode=0o755, exist_ok=True)
    temp = entry / f".{REFUSED_NAME}.tmp"
    temp.write_text(" ".join(line.split())[:1000] + "\n", encoding="utf-8")
    os.chmod(temp, 0o644)
    os.rename(temp, entry / REFUSED_NAME)


def epilog(env: Mapping[str, str], node_dir: Path) -> str:
    """Removes the job's region; says so when processes still held GPU
    memory in it (the job's processes are gone by now, so they were not its)."""
    from vgpulimit.region import Region, RegionError

    job_id = env.get("SLURM_JOB_ID", "")
    if not (job_id.isascii() and job_id.isdigit()):
        raise SlurmError(f"SLURM_JOB_ID {job_id!r} is not a job id: run by slurmd as its Epilog")
    entry = job_dir(node_dir, job_id)
    said = f"job {job_id}: region removed"
    try:
        with Region.open(entry / REGION_NAME) as region:
            holders = [p.host_pid or p.pid for p in region.snapshot().processes
                       if p.total_used_bytes and os.path.exists(f"/proc/{p.host_pid or p.pid}")]
        if holders:
            pids = ", ".join(map(str, holders))
            said = f"job {job_id}: region removed; processes still held GPU memory in it: {pids}"
            said += _tell_job(job_id, f"vgpulimit: warning: Slurm job {job_id} has ended, but processes "
                                      f"still held GPU memory in its region (pids {pids}): the GPU's "
                                      "memory is not free until they exit")
    except (RegionError, OSError):
        pass
    if not entry.exists():
        said = f"job {job_id}: no region here"
    elif not entry.is_symlink():
        from vgpulimit import provision

        provision.deprovision(_tenant(entry))
    _remove_entry(entry)
    return said


@dataclass(frozen=True)
class JobLog:
    path: str
    uid: int
    gid: int


def job_log(job_text: str) -> JobLog | None:
    """The file the job's error output went to (else its output), and whose
    it is, from ``scontrol show job``; None for a job with no such file
    (``srun`` alone: its output went to the srun, beyond the node's reach)."""
    fields = {}
    for field in job_text.split():
        key, sep, value = field.partition("=")
        if sep:
            fields.setdefault(key, value)
    path = fields.get("StdErr") or fields.get("StdOut") or ""
    ids = [re.fullmatch(r".*\((\d+)\)", fields.get(key, "")) for key in ("UserId", "GroupId")]
    if not path.startswith("/") or None in ids:
        return None
    return JobLog(path, int(ids[0][1]), int(ids[1][1]))


def _tell_job(job_id: str, line: str) -> str:
    """Appends ``line`` to the job's log as the job's user (the file and its
    path are the user's: root must not follow a link it was given there).
    What it did, for the Epilog's own line."""
    try:
        log = job_log(scontrol("show", "job", job_id))
    except SlurmError:
        return "; the job's log could not be found"
    if log is None:
        return "; the job has no log file"
    if os.geteuid() != 0 and os.geteuid() != log.uid:
        return f"; not said in {log.path} (another user's)"
    pid = os.fork()
    if pid == 0:   # the child: the job's user, then one append
        code = 1
        try:
            if os.geteuid() == 0:
                os.setgroups([])
                os.setresgid(log.gid, log.gid, log.gid)
                os.setresuid(log.uid, log.uid, log.uid)
            fd = os.open(log.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NOCTTY
                         | os.O_NONBLOCK | os.O_CLOEXEC)
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.write(fd, (line + "\n").encode())
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return f"; said in {log.path}" if os.waitstatus_to_exitcode(status) == 0 else \
        f"; could not say so in {log.path}"


def _remove_entry(entry: Path) -> None:
    if entry.is_symlink() or not entry.is_dir():
        return
    shutil.rmtree(entry, ignore_errors=True)


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


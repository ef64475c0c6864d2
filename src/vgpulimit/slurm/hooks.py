"""`vgpulimit slurm prolog` and `epilog`: a job's region made on the node
before its first step there, and removed after its last.

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
import shutil
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from vgpulimit import _paths, identity
from vgpulimit.errors import VgpulimitError
from vgpulimit.limits import MemoryLimit
from vgpulimit.slurm.gres import SlurmError, job_gres_on, node_gres, shards_per_gpu
from vgpulimit.slurm.mapping import parse_mapping

NODE_DIR = _paths.slurm_dir()   # the shim finds a job's region there by its cgroup
REGION_NAME = "region"
REFUSED_NAME = "refused"
_SCONTROL_TIMEOUT_S = 10


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


"""A real Slurm on this machine for the tests and the benchmark: munged,
slurmctld and slurmd (Debian 12's slurm-wlm 22.05.8), each started in the
foreground with a configuration, key, sockets, ports and state of a
directory of its own, one node "localhost" with one GPU of 8 shards whose
device file is a file in that directory, and vgpulimit's Prolog, Epilog and
TaskProlog as `vgpulimit slurm install` writes them.  Jobs run as root, so
their commands name the interpreter that has vgpulimit (sys.executable)."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "scontrol", "scancel", "sinfo")
SHARDS = 8
MPS = 100   # Slurm's convention: a GPU's mps count is 100, a job's its percent of it


@functools.cache
def slurm_unavailable() -> str | None:
    """Why a Slurm cannot be started here, or None."""
    if os.geteuid() != 0:
        return "the Slurm tests need root (slurmd runs jobs as their users, the Prolog as root)"
    missing = [d for d in DAEMONS if shutil.which(d) is None]
    if missing:
        return (f"slurm-wlm or munge is not installed ({', '.join(missing)} not found; .ci/run "
                "installs them with apt-get when run as root)")
    return None


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class Cluster:
    root: Path
    node_dir: Path
    scripts: Path
    env: dict[str, str]
    processes: list[subprocess.Popen] = field(default_factory=list)

    def command(self, *args: str, timeout: float = 120, check: bool = True,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        done = subprocess.run(args, env=env or self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: exit {done.returncode}\n{done.stdout}{done.stderr}")
        return done

    def node_state(self) -> str:
        """scontrol's: sinfo says "mixed" of an idle node once a shard job ran."""
        shown = self.command("scontrol", "show", "node", "localhost", check=False).stdout
        return next((f[len("State="):] for f in shown.split() if f.startswith("State=")), "")

    def wait_idle(self, timeout: float = 30) -> None:
        """Until the node runs no job (and its Epilogs are done)."""
        deadline = time.monotonic() + timeout
        while (state := self.node_state()) != "IDLE":
            if time.monotonic() > deadline:
                jobs = self.command("squeue", "-h", "-o", "%i %T %b %R", check=False).stdout
                raise AssertionError(f"node is {state!r}, not idle, after {timeout} s; jobs: {jobs!r}")
            time.sleep(0.1)

    def log(self, name: str) -> str:
        path = self.root / "log" / name
        return path.read_text(errors="replace") if path.exists() else ""


def _config(root: Path, ports: list[int], scripts: Path, hooks: bool, mps: bool) -> str:
    hook_lines = (f"Prolog={scripts}/vgpulimit-prolog\nEpilog={scripts}/vgpulimit-epilog\n"
                  f"TaskProlog={scripts}/vgpulimit-task-prolog\n") if hooks else ""
    return f"""ClusterName=vgpulimit-test
SlurmctldHost=localhost
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
AuthType=auth/munge
AuthInfo=socket={root}/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
SchedulerParameters=sched_interval=1
ReturnToService=2
GresTypes=gpu,shard{",mps" if mps else ""}
{hook_lines}NodeName=localhost CPUs=8 Gres=gpu:1,shard:{SHARDS}{f",mps:{MPS}" if mps else ""} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


@contextlib.contextmanager
def cluster(job_env: dict[str, str], hooks: bool = True, mps: bool = False) -> Iterator[Cluster]:
    """A running Slurm whose jobs get ``job_env`` (srun and sbatch pass the
    caller's environment on); everything it started is stopped on leaving.
    With ``mps``, the GPU is also MPS GRES of 100 (slurm 22.05.8 takes both
    on one node), and the Prolog caps mps jobs too (--mps)."""
    root = Path(tempfile.mkdtemp(prefix="vgpulimit-slurm-"))
    os.chmod(root, 0o755)
    for sub in ("state", "spool", "log", "etc"):
        (root / sub).mkdir()
    (root / "nvidia0").touch()
    (root / "munge.key").write_bytes(os.urandom(1024))
    os.chmod(root / "munge.key", 0o400)
    node_dir = root / "run"
    scripts = root / "etc"
    conf = root / "slurm.conf"
    conf.write_text(_config(root, _free_ports(2), scripts, hooks, mps))
    (root / "gres.conf").write_text(f"NodeName=localhost Name=gpu File={root}/nvidia0\n"
                                    f"NodeName=localhost Name=shard Count={SHARDS} File={root}/nvidia0\n"
                                    + (f"NodeName=localhost Name=mps Count={MPS} File={root}/nvidia0\n"
                                       if mps else ""))
    env = {**job_env, "SLURM_CONF": str(conf)}
    found = Cluster(root, node_dir, scripts, env)
    try:
        subprocess.run([sys.executable, "-m", "vgpulimit", "slurm", "install", "--dir", str(scripts),
                        "--node-dir", str(node_dir), "--slurm-conf", str(conf), *(["--mps"] if mps else [])],
                       env=env, check=hooks, capture_output=True, text=True)
        found.processes.append(subprocess.Popen(
            ["munged", "--foreground", f"--key-file={root}/munge.key", f"--socket={root}/munge.sock",
             f"--pid-file={root}/munged.pid", f"--log-file={root}/log/munged.log",
             f"--seed-file={root}/munge.seed"], env=env, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL))
        _wait_for(lambda: (root / "munge.sock").exists(), "munged's socket")
        for daemon in (["slurmctld", "-D", "-i", "-f", str(conf)],
                       ["slurmd", "-D", "-N", "localhost", "-f", str(conf)]):
            found.processes.append(subprocess.Popen(daemon, env=env, stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.DEVNULL))
        _wait_for(lambda: found.node_state() == "IDLE", "the node to be idle", timeout=60)
        yield found
    finally:
        with contextlib.suppress(Exception):
            found.command("scancel", "--full", "-u", "root", check=False, timeout=10)
        for process in reversed(found.processes):
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(root, ignore_errors=True)


def _wait_for(predicate, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout} s for {what}")
        time.sleep(0.1)

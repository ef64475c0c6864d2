"""Slurm GRES shards as vgpulimit limits: Slurm's hooks set up, the shim enforces.

Slurm (22.05 and later) shares a GPU between jobs as ``shard`` GRES but fences
nothing.  Here a job given N shards of a GPU of S shards on a node gets one
region on that node, made by the root-side Prolog and removed by the Epilog:
by default a memory cap of N/S of the GPU's memory and a compute share of N/S.

One module per concern: gres (what scontrol prints of a job's and a node's
shards, read), mapping (what one shard is worth), hooks (the Prolog and the
Epilog: the job's region made and removed), scripts (the scripts slurmd runs,
and the slurm.conf lines that name them).  Here, what the CLI calls."""

from vgpulimit.slurm.hooks import NODE_DIR, epilog, prolog
from vgpulimit.slurm.mapping import FRACTION
from vgpulimit.slurm.scripts import SCRIPT_DIR, install

__all__ = ["FRACTION", "NODE_DIR", "SCRIPT_DIR", "epilog", "install", "prolog"]

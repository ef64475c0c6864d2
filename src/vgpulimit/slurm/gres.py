"""What scontrol prints of a job's and a node's GRES, read: the shards a job
has on a node, and the shards of one GPU.  Pure, so that tests feed it text."""

from __future__ import annotations

import re
from dataclasses import dataclass

from vgpulimit.errors import VgpulimitError


class SlurmError(VgpulimitError):
    """A job's GRES or the site's mapping that cannot be turned into limits."""



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


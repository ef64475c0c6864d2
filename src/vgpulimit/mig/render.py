"""A MIG plan (vgpulimit.mig.plan) written out: as text for people, as JSON,
and as the mig-parted config that NVIDIA's MIG manager applies (docs/mig-facts.md §1.7:
``version: v1``, ``mig-configs``, ``devices``, ``mig-enabled``,
``mig-devices``, ``device-filter``).  Each request's limits are vgpulimit
flags naming its MIG device; a MIG device's UUID exists only once the layout
is made, so the flags say ``MIG-<uuid>`` and the plan names the instance
(GPU, profile, placement) whose UUID goes there."""

from __future__ import annotations

import json

from vgpulimit.limits import format_bytes
from vgpulimit.mig.plan import Instance, Plan, Request, share_pct

FORMATS = ("text", "json", "mig-parted")
CONFIG_NAME = "vgpulimit-plan"
UUID = "MIG-<uuid>"
NOTES = (("MIG-<uuid>: the instance's MIG device, known once the layout exists (nvidia-smi -L); "
          "instances of one profile on one GPU are interchangeable."),
         ("Apply the layout with nvidia-mig-parted (--format mig-parted); this command changes no MIG "
          "setting.  The flags cap each request on its instance (docs/mig.md, sharing a MIG slice)."))


def size_flag(count: int) -> str:
    """A byte count as --memory reads it back exactly: 4GiB, 3000MiB, 1234."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count % (1 << shift) == 0:
            return f"{count >> shift}{unit}"
    return str(count)


def where(plan_gpu: int, instance: Instance) -> str:
    """"GPU 0 3g.40gb at 4:4": the instance as nvidia-smi mig -lgi shows it."""
    return f"GPU {plan_gpu} {instance.profile.name} at {instance.start}:{instance.profile.memory_slices}"


def flags(request: Request, instance: Instance, plan: Plan) -> list[str]:
    """The request's vgpulimit flags on its instance; none when it has the
    instance to itself by asking for isolation."""
    if request.isolated:
        return []
    out = ["--memory-device", f"{UUID}={size_flag(request.memory_bytes)}"]
    share = share_pct(request, instance.profile, plan.model)
    if share is not None:
        out.extend(["--cores-device", f"{UUID}={share}"])
    return out


def _method(plan: Plan) -> str:
    return "the fewest, by exhaustive search" if plan.exact else "first-fit decreasing"


def render_text(plan: Plan) -> str:
    count = sum(len(i.requests) for g in plan.gpus for i in g.instances)
    gpus = f"{len(plan.gpus)} {plan.model.model} GPU{'s' if len(plan.gpus) != 1 else ''}"
    lines = [f"MIG plan: {count} requests on {gpus} ({_method(plan)})"]
    for gpu in plan.gpus:
        lines.append("")
        layout = ", ".join(f"{i.profile.name} at {i.start}:{i.profile.memory_slices}"
                           for i in gpu.instances)
        lines.append(f"GPU {gpu.index}: {layout}")
        for instance in gpu.instances:
            used = sum(r.memory_bytes for r in instance.requests)
            shares = sum(share_pct(r, instance.profile, plan.model) or 0 for r in instance.requests)
            lines.append(f"  {instance.profile.name} at {instance.start}:{instance.profile.memory_slices} "
                         f"({format_bytes(instance.profile.memory_bytes)}, {instance.profile.sms} SMs): "
                         f"{len(instance.requests)} request{'s' if len(instance.requests) != 1 else ''}, "
                         f"{format_bytes(used)}, {shares}% of its time in shares")
            width = max(len(r.name) for r in instance.requests)
            for request in instance.requests:
                limits = " ".join(flags(request, instance, plan)) or "isolated: the whole instance"
                lines.append(f"    {request.name:<{width}}  {format_bytes(request.memory_bytes):>9}  "
                             f"{limits}")
    lines.append("")
    lines.extend(NOTES)
    return "\n".join(lines) + "\n"


def document(plan: Plan, config_name: str = CONFIG_NAME) -> dict:
    """The plan as JSON: every figure in bytes or percent."""
    return {
        "model": plan.model.model,
        "pci_device_ids": list(plan.model.pci_device_ids),
        "exact": plan.exact,
        "gpus": [{
            "index": gpu.index,
            "instances": [{
                "profile": i.profile.name,
                "profile_id": i.profile.id,
                "placement": {"start": i.start, "size": i.profile.memory_slices},
                "memory_bytes": i.profile.memory_bytes,
                "sms": i.profile.sms,
                "requests": [{
                    "name": r.name,
                    "memory_bytes": r.memory_bytes,
                    "cores_pct": r.cores_pct,
                    "instance_cores_pct": share_pct(r, i.profile, plan.model),
                    "isolated": r.isolated,
                    "flags": flags(r, i, plan),
                } for r in i.requests],
            } for i in gpu.instances],
        } for gpu in plan.gpus],
        "mig_parted": mig_parted(plan, config_name),
        "notes": list(NOTES),
    }


def render_json(plan: Plan, config_name: str = CONFIG_NAME) -> str:
    return json.dumps(document(plan, config_name), indent=2) + "\n"


def mig_parted(plan: Plan, config_name: str = CONFIG_NAME) -> dict:
    """The mig-parted v1 config: one entry per distinct layout, its GPUs by
    index, limited to the model's PCI ids."""
    entries: list[dict] = []
    for gpu in plan.gpus:
        counts: dict[str, int] = {}
        for instance in sorted(gpu.instances, key=lambda i: (-i.profile.memory_slices, i.profile.name)):
            counts[instance.profile.name] = counts.get(instance.profile.name, 0) + 1
        same = next((e for e in entries if e["mig-devices"] == counts), None)
        if same is not None:
            same["devices"].append(gpu.index)
        else:
            entries.append({"device-filter": list(plan.model.pci_device_ids), "devices": [gpu.index],
                            "mig-enabled": True, "mig-devices": counts})
    return {"version": "v1", "mig-configs": {config_name: entries}}


def render_mig_parted(plan: Plan, config_name: str = CONFIG_NAME) -> str:
    """The config as YAML (written here: the fields are few and fixed)."""
    config = mig_parted(plan, config_name)
    count = sum(len(i.requests) for g in plan.gpus for i in g.instances)
    lines = [f"# vgpulimit mig plan: {count} requests on {len(plan.gpus)} {plan.model.model} GPUs.",
             f"# Apply: nvidia-mig-parted apply -f FILE -c {config_name}",
             ("# (or as the GPU Operator's MIG manager config, node label "
              f"nvidia.com/mig.config={config_name})"),
             "version: v1", "mig-configs:", f"  {json.dumps(config_name)}:"]
    for entry in config["mig-configs"][config_name]:
        lines.append(f"    - device-filter: {json.dumps(entry['device-filter'])}")
        lines.append(f"      devices: {json.dumps(entry['devices'])}")
        lines.append("      mig-enabled: true")
        lines.append("      mig-devices:")
        lines.extend(f"        {json.dumps(name)}: {n}" for name, n in entry["mig-devices"].items())
    return "\n".join(lines) + "\n"


def render(plan: Plan, fmt: str, config_name: str = CONFIG_NAME) -> str:
    if fmt == "json":
        return render_json(plan, config_name)
    if fmt == "mig-parted":
        return render_mig_parted(plan, config_name)
    return render_text(plan)

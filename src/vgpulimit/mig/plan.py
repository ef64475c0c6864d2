"""The MIG planner's model: requests in, a legal MIG layout per GPU and the
requests placed on its instances out.  Pure: it reads the profile tables
(vgpulimit.mig.profiles) and nothing of the node; the CLI reads the node,
vgpulimit.mig.render writes the plan.  It never changes MIG.

The rules a plan keeps (``check`` tests them):
- each GPU's instances are at legal placements of their profiles (memory
  slices, docs/mig-facts.md §1.2), none overlapping, each profile at most its
  ``max_count`` times; +me profiles are not planned (no request asks for the
  media engines);
- an ``isolated`` request has an instance to itself;
- requests that share an instance fit its memory (the sum of their caps) and
  its time (the sum of their compute shares, each as a share of the instance,
  at most 100 %).

A request's ``cores`` is a share of a whole GPU's compute in MIG mode (the
SMs of its largest instance): a request of 10 % on an H100 (132 SMs) needs
13.2 SMs, so on a 1g.10gb (16 SMs) it is ``--cores 83``.  The shares are
whole percents, rounded up.

The fewest GPUs: exact (every set of requests one GPU can hold, then the
fewest such sets that cover them all) up to EXACT_MOST requests; above,
first-fit decreasing (isolated requests to the smallest profile that holds
them, the rest best-fit over the space left, a fresh GPU being one 7g
instance), which serves 1000 requests in well under a second.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

from vgpulimit import limits
from vgpulimit.errors import UsageError, VgpulimitError
from vgpulimit.mig.profiles import GpuModel, Profile

EXACT_MOST = 10       # requests; the exact search takes 3^n steps
COUNT_MOST = 10_000   # copies of one request
REQUEST_FORMS = ("SIZE[,cores=PCT][,count=N][,isolated][,name=NAME], e.g. 4GiB,cores=30,count=14 "
                 "(SIZE as --memory takes it: 4GiB, 3000m, 20G; PCT a share of a whole GPU, 1-100)")
FILE_FORMS = ("a JSON or YAML list of requests, or {\"requests\": [...]}, each "
              "{memory: SIZE, cores: PCT, count: N, isolated: true|false, name: NAME} "
              "(memory required)")


@dataclass(frozen=True)
class Request:
    name: str
    memory_bytes: int
    cores_pct: int | None = None   # of a whole GPU; None: no compute share
    isolated: bool = False


@dataclass
class Instance:
    """One MIG instance of a plan, and the requests on it."""

    profile: Profile
    start: int                     # its first memory slice
    requests: list[Request] = field(default_factory=list)


@dataclass
class GpuPlan:
    index: int                     # the GPU's index in the config's devices
    instances: list[Instance]


@dataclass
class Plan:
    model: GpuModel
    gpus: list[GpuPlan]
    devices: list[int]             # the GPUs' indices (NVML's, or 0.. for --model)
    exact: bool                    # the fewest GPUs, by exhaustive search


class NoFit(UsageError):
    """A request no instance of the model can hold."""


class TooFewGpus(VgpulimitError):
    """The requests need more GPUs than there are."""


# --- requests ----------------------------------------------------------------

def parse_request(text: str, source: str = "--request", default_name: str = "request") -> list[Request]:
    """``4GiB,cores=30,count=14,isolated`` as its requests (count copies,
    named ``name[i]``)."""
    parts = [part.strip() for part in text.split(",")]
    fields: dict[str, object] = {"memory": parts[0]}
    for part in parts[1:]:
        key, eq, value = part.partition("=")
        if key == "isolated" and not eq:
            fields["isolated"] = True
        elif eq and key in ("cores", "count", "name") and key not in fields:
            fields[key] = value
        else:
            raise UsageError(f"{source} {text!r}: {part!r} is not a part of a request; "
                             f"accepted forms: {REQUEST_FORMS}")
    return _requests(fields, f"{source} {text!r}", default_name)


def _requests(fields: dict, where: str, default_name: str) -> list[Request]:
    memory_text = fields.get("memory")
    if isinstance(memory_text, int) and not isinstance(memory_text, bool):
        memory_text = str(memory_text)
    if not isinstance(memory_text, str) or not memory_text:
        raise UsageError(f"{where}: no memory size; accepted forms: {REQUEST_FORMS}")
    memory = limits.parse_memory(memory_text, f"{where}: memory")
    if memory.ppm:
        raise UsageError(f"{where}: memory {memory_text!r} is a share of a device, which has none "
                         "before the plan; give a size (4GiB, 3000m)")
    cores = fields.get("cores")
    cores_pct = None if cores is None else limits.parse_cores(str(cores), f"{where}: cores")
    count_text = str(fields.get("count", 1))
    count = limits.ascii_number(count_text.strip(), COUNT_MOST + 1)
    if not count or isinstance(fields.get("count"), bool):
        raise UsageError(f"{where}: count {count_text!r} is not a whole number from 1 to {COUNT_MOST}")
    isolated = fields.get("isolated", False)
    if not isinstance(isolated, bool):
        raise UsageError(f"{where}: isolated {isolated!r} is not true or false")
    name = str(fields.get("name", default_name))
    if not name.strip() or len(name) > 64 or any(not c.isprintable() or c.isspace() for c in name):
        raise UsageError(f"{where}: name {name!r} is not 1-64 printable characters without spaces")
    return [Request(name if count == 1 else f"{name}[{i + 1}]", memory.bytes, cores_pct, isolated)
            for i in range(count)]


def read_requests(path: str, source: str = "--requests") -> list[Request]:
    """The requests of a JSON or YAML file (see FILE_FORMS)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{source} {path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") \
            from None
    try:
        document = json.loads(text)
    except ValueError:
        document = _yaml(text, path, source)
    if isinstance(document, dict) and set(document) == {"requests"}:
        document = document["requests"]
    if not isinstance(document, list) or not document:
        raise UsageError(f"{source} {path}: not {FILE_FORMS}")
    requests: list[Request] = []
    for i, entry in enumerate(document):
        where = f"{source} {path}: request {i + 1}"
        if not isinstance(entry, dict) or not set(entry) <= {"memory", "cores", "count", "isolated",
                                                               "name"}:
            raise UsageError(f"{where}: not {FILE_FORMS}")
        requests.extend(_requests(entry, where, f"request{i + 1}"))
    return requests


def _yaml(text: str, path: str, source: str):
    try:
        import yaml
    except ImportError:
        raise UsageError(f"{source} {path}: not JSON, and reading YAML needs PyYAML "
                         "(pip install pyyaml); or give the file as JSON") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{source} {path}: neither JSON nor YAML{at}; {FILE_FORMS}") from None


# --- the model's arithmetic --------------------------------------------------

def full_sms(model: GpuModel) -> int:
    """A whole GPU's SMs in MIG mode: its largest instance's."""
    return model.largest.sms


def share_pct(request: Request, profile: Profile, model: GpuModel) -> int | None:
    """The request's compute share of an instance of ``profile``, as the
    whole percent ``--cores`` takes (rounded up); None without a share."""
    if request.cores_pct is None:
        return None
    return -(-request.cores_pct * full_sms(model) // profile.sms)


def fits(requests: list[Request], profile: Profile, model: GpuModel) -> bool:
    """Whether ``requests`` can share an instance of ``profile``."""
    if len(requests) > 1 and any(r.isolated for r in requests):
        return False
    shares = [share_pct(r, profile, model) or 0 for r in requests]
    return (sum(r.memory_bytes for r in requests) <= profile.memory_bytes
            and sum(shares) <= 100)


def plannable(model: GpuModel) -> tuple[Profile, ...]:
    return tuple(p for p in model.profiles if not p.media_extensions)


@functools.cache
def layouts(model: GpuModel) -> dict[tuple[str, ...], tuple[tuple[str, int], ...]]:
    """Every legal layout of one GPU that no instance can be added to: its
    profiles' names (sorted) -> one legal placement of them, (name, start)
    each.  A layout with fewer instances is a part of one of these."""
    profiles = plannable(model)
    found: dict[tuple[str, ...], tuple[tuple[str, int], ...]] = {}

    def extend(placed: list[tuple[Profile, int]], used: frozenset[int], first: int) -> None:
        grown = False
        for i, profile in enumerate(profiles):
            if sum(1 for p, _ in placed if p is profile) >= profile.max_count:
                continue
            for start in profile.placements:
                if used.isdisjoint(profile.span(start)):
                    grown = True
                    if i >= first:
                        extend([*placed, (profile, start)], used | set(profile.span(start)), i)
        if not grown:
            key = tuple(sorted(p.name for p, _ in placed))
            found.setdefault(key, tuple(sorted(((p.name, s) for p, s in placed), key=lambda x: x[1])))

    extend([], frozenset(), 0)
    return found


# --- one GPU -----------------------------------------------------------------

def _kind(request: Request) -> tuple[bool, int, int]:
    """What the planner sees of a request: two of one kind are interchangeable."""
    return (not request.isolated, -request.memory_bytes, -(request.cores_pct or 0))


def _assign(requests: list[Request], bins: list[Profile], model: GpuModel) -> list[list[Request]] | None:
    """The requests spread over instances of ``bins`` so that each instance's
    share fits; None when they cannot be.  Backtracking, largest first, an
    empty instance before a shared one (the least sharing found first), and
    each placement tried once: equal instances in equal states are one
    choice, and a request like the one before it goes no earlier."""
    order = sorted(requests, key=_kind)
    held: list[list[Request]] = [[] for _ in bins]
    where = [0] * len(order)

    def place(k: int) -> bool:
        if k == len(order):
            return True
        first = where[k - 1] if k and _kind(order[k]) == _kind(order[k - 1]) else 0
        tried = set()
        for b in sorted(range(first, len(bins)), key=lambda b: len(held[b]) > 0):
            state = (bins[b].name, tuple(map(_kind, held[b])))
            if state in tried:
                continue
            tried.add(state)
            held[b].append(order[k])
            where[k] = b
            if fits(held[b], bins[b], model) and place(k + 1):
                return True
            held[b].pop()
        return False

    return held if place(0) else None


def _may_hold(requests: list[Request], bins: list[Profile], model: GpuModel) -> bool:
    """What any layout holding ``requests`` must have: as much memory, as many
    SMs as their shares ask, an instance for each isolated request."""
    sms_needed = sum(r.cores_pct or 0 for r in requests) * full_sms(model) / 100
    return (sum(r.memory_bytes for r in requests) <= sum(p.memory_bytes for p in bins)
            and sms_needed <= sum(p.sms for p in bins)
            and sum(r.isolated for r in requests) <= len(bins))


def one_gpu(requests: list[Request], model: GpuModel) -> list[Instance] | None:
    """A legal layout of one GPU holding ``requests``, with only the instances
    they use; None when no layout can.  Layouts of more instances first."""
    for placement in sorted(layouts(model).values(), key=lambda p: -len(p)):
        bins = [model.profile(name) for name, _ in placement]
        if not _may_hold(requests, bins, model):
            continue
        held = _assign(requests, bins, model)
        if held is not None:
            return [Instance(profile, start, on) for (_, start), profile, on in zip(placement, bins, held)
                    if on]
    return None


# --- many GPUs ---------------------------------------------------------------

def check_fit(requests: list[Request], model: GpuModel) -> None:
    """NoFit for the first request no instance of ``model`` can hold alone."""
    for request in requests:
        if not any(fits([request], p, model) for p in plannable(model)):
            largest = model.largest
            cores = "" if request.cores_pct is None else f", cores {request.cores_pct}% of a GPU"
            raise NoFit(f"request {request.name} ({limits.format_bytes(request.memory_bytes)}{cores}) "
                        f"fits in no MIG instance of the {model.model}: the largest, {largest.name}, "
                        f"has {limits.format_bytes(largest.memory_bytes)} and {largest.sms} SMs")


def plan(requests: list[Request], model: GpuModel, gpus_most: int | None = None,
         devices: list[int] | None = None) -> Plan:
    """The plan with the fewest GPUs that this module finds (see the module's
    note); TooFewGpus when it needs more than ``gpus_most``."""
    check_fit(requests, model)
    exact = len(requests) <= EXACT_MOST
    groups = _fewest_exact(requests, model) if exact else _first_fit(requests, model)
    if gpus_most is not None and len(groups) > gpus_most:
        raise TooFewGpus(f"the {len(requests)} requests need {len(groups)} {model.model} GPUs "
                         f"in MIG mode, and {gpus_most} are given")
    devices = list(devices) if devices is not None else list(range(len(groups)))
    result = Plan(model, [GpuPlan(devices[i], instances) for i, instances in enumerate(groups)],
                  devices[:len(groups)], exact)
    check(result)
    return result


def _fewest_exact(requests: list[Request], model: GpuModel) -> list[list[Instance]]:
    """The fewest GPUs: for each set of requests whether one GPU holds it,
    then the fewest such sets that cover every request (sets are closed under
    taking parts, so the fewest covering sets are a partition)."""
    n = len(requests)
    if n == 0:
        return []

    kinds = [_kind(r) for r in requests]
    by_kinds: dict[tuple, bool] = {}

    def held(mask: int) -> bool:
        # Whether one GPU holds these requests; sets of the same kinds are one question.
        key = tuple(sorted(kinds[i] for i in range(n) if mask >> i & 1))
        if key not in by_kinds:
            by_kinds[key] = one_gpu([requests[i] for i in range(n) if mask >> i & 1], model) is not None
        return by_kinds[key]

    @functools.cache
    def fewest(mask: int) -> tuple[int, tuple[int, ...]]:
        if mask == 0:
            return 0, ()
        low = mask & -mask
        rest = mask ^ low
        best: tuple[int, tuple[int, ...]] | None = None
        sub = rest
        while True:   # every part of mask that holds its lowest request
            part = sub | low
            if held(part):
                count, parts = fewest(mask ^ part)
                if best is None or count + 1 < best[0]:
                    best = (count + 1, (part, *parts))
            if sub == 0:
                break
            sub = (sub - 1) & rest
        assert best is not None, "a request that fits alone was held by no GPU"
        return best

    _, parts = fewest((1 << n) - 1)
    found = [one_gpu([requests[i] for i in range(n) if part >> i & 1], model) for part in parts]
    return [instances for instances in found if instances is not None]


def _first_fit(requests: list[Request], model: GpuModel) -> list[list[Instance]]:
    """First-fit decreasing, for many requests."""
    profiles = sorted(plannable(model), key=lambda p: (p.memory_slices, p.compute_slices, p.memory_mib))
    gpus: list[list[Instance]] = []

    def free_start(gpu: list[Instance], profile: Profile) -> int | None:
        if sum(1 for i in gpu if i.profile is profile) >= profile.max_count:
            return None
        used = {s for i in gpu for s in i.profile.span(i.start)}
        # High starts for the profiles that can take them, keeping the low
        # slots for those that cannot (HAMi's preferHighMigPlacement).
        for start in sorted(profile.placements, reverse=True):
            if used.isdisjoint(profile.span(start)):
                return start
        return None

    def add(profile: Profile) -> Instance:
        for gpu in gpus:
            start = free_start(gpu, profile)
            if start is not None:
                gpu.append(Instance(profile, start))
                return gpu[-1]
        gpus.append([Instance(profile, profile.placements[-1])])
        return gpus[-1][-1]

    isolated = sorted((r for r in requests if r.isolated),
                      key=lambda r: (-r.memory_bytes, -(r.cores_pct or 0)))
    by_size = sorted(isolated, key=lambda r: -next(p for p in profiles if fits([r], p, model)).memory_slices)
    for request in by_size:
        add(next(p for p in profiles if fits([request], p, model))).requests.append(request)

    # Largest first by the resource a request uses most of, as a part of a
    # whole GPU: its memory or its compute share.
    whole_bytes = max(p.memory_bytes for p in profiles)
    shared = sorted((r for r in requests if not r.isolated),
                    key=lambda r: -max(r.memory_bytes / whole_bytes, (r.cores_pct or 0) / 100))
    if not shared:
        return gpus
    # The space the isolated requests leave, as the largest instances that fit it.
    bins: list[Instance] = []
    for gpu in gpus:
        while True:
            room = [(p, free_start(gpu, p)) for p in reversed(profiles)]
            room = [(p, s) for p, s in room if s is not None]
            if not room:
                break
            profile, start = max(room, key=lambda ps: (ps[0].memory_mib, ps[0].sms))
            gpu.append(Instance(profile, start))
            bins.append(gpu[-1])
    whole = max(profiles, key=lambda p: (p.memory_mib, p.sms))
    left = {id(b): (b.profile.memory_bytes, 100) for b in bins}
    for request in shared:
        best = None
        for b in bins:
            memory, time_pct = left[id(b)]
            share = share_pct(request, b.profile, model) or 0
            if request.memory_bytes <= memory and share <= time_pct:
                # Best fit: the bin this request leaves least of, in the
                # resource it leaves least of.
                rest = min((memory - request.memory_bytes) / b.profile.memory_bytes,
                           (time_pct - share) / 100)
                if best is None or rest < best[0]:
                    best = (rest, b, share)
        if best is None:
            gpus.append([Instance(whole, whole.placements[0])])
            b = gpus[-1][0]
            bins.append(b)
            left[id(b)] = (b.profile.memory_bytes, 100)
            best = (0, b, share_pct(request, whole, model) or 0)
        _, b, share = best
        b.requests.append(request)
        memory, time_pct = left[id(b)]
        left[id(b)] = (memory - request.memory_bytes, time_pct - share)
    return [[i for i in gpu if i.requests] for gpu in gpus]


def check(result: Plan) -> None:
    """AssertionError where the plan breaks a rule of the module's note: a
    bug, never the user's input."""
    model = result.model
    for gpu in result.gpus:
        used: set[int] = set()
        for instance in gpu.instances:
            profile = instance.profile
            assert not profile.media_extensions
            assert instance.start in profile.placements, (profile.name, instance.start)
            assert used.isdisjoint(profile.span(instance.start)), gpu
            used |= set(profile.span(instance.start))
            assert instance.requests and fits(instance.requests, profile, model), instance
        for profile in model.profiles:
            assert sum(1 for i in gpu.instances if i.profile is profile) <= profile.max_count


def whole_instances_hami(requests: list[Request], model: GpuModel) -> int:
    """GPUs that whole instances chosen as HAMi chooses them take: for each
    request the smallest profile whose memory holds it (ties: fewer slices;
    its compute share ignored, as HAMi ignores gpucores), placed first-fit."""
    by_memory = sorted(plannable(model), key=lambda p: (p.memory_mib, p.memory_slices, p.compute_slices))
    hami = [Request(r.name, r.memory_bytes, None, True) for r in requests]
    for r in hami:
        if not any(r.memory_bytes <= p.memory_bytes for p in by_memory):
            check_fit([r], model)
    chosen = [next(p for p in by_memory if r.memory_bytes <= p.memory_bytes) for r in hami]
    # Each request alone on its chosen profile: pack those instances.
    gpus: list[list[tuple[Profile, int]]] = []
    for profile in sorted(chosen, key=lambda p: -p.memory_slices):
        for gpu in gpus:
            if sum(1 for p, _ in gpu if p is profile) >= profile.max_count:
                continue
            used = {s for p, start in gpu for s in p.span(start)}
            start = next((s for s in sorted(profile.placements, reverse=True)
                          if used.isdisjoint(profile.span(s))), None)
            if start is not None:
                gpu.append((profile, start))
                break
        else:
            gpus.append([(profile, profile.placements[-1])])
    return len(gpus)


def as_isolated(requests: list[Request]) -> list[Request]:
    """Every request on an instance of its own (whole instances)."""
    return [Request(r.name, r.memory_bytes, r.cores_pct, True) for r in requests]


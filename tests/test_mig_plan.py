"""`vgpulimit mig plan`: the profile tables are docs/mig-facts.md's, every plan is legal,
the fewest GPUs on small inputs are what an exhaustive search written here
finds, the mig-parted config parses, and the CLI's errors are one line.

The rules are checked from the data file itself (mig/profiles.json), never
from the planner's own checks; a few rows are compared with docs/mig-facts.md's numbers,
written here with the line they come from."""

from __future__ import annotations

import functools
import json
import math
import re
from collections import Counter

import pytest
from conftest import base_env
from helpers import one_error_line, vgpulimit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vgpulimit.mig import plan as mig_plan
from vgpulimit.mig import profiles as mig_profiles
from vgpulimit.mig import render as mig_render
from vgpulimit.mig.plan import Request

GiB = 1 << 30
MiB = 1 << 20
DATA = json.loads(mig_profiles.DATA_PATH.read_text())


def _data_gpu(model: str) -> dict:
    return next(g for g in DATA["gpus"] if g["model"] == model)


# --- the data file against docs/mig-facts.md ---------------------------------------------

# docs/mig-facts.md §1.2, "H100 80GB HBM3" table (real print, jbarrow.ai): | Profile | id | -lgip GiB | SMs | CE | max |
MIG_FACTS_H100 = {
    "1g.10gb": (19, "9.75", 16, 1, 7),     # "| 1g.10gb | 19 | 9.75 | 16 | 1 | 1/1/0 | 7 |"
    "1g.20gb": (15, "19.62", 26, 1, 4),    # "| 1g.20gb | 15 | 19.62 | 26 | 1 | 1/1/0 | 4 |"
    "2g.20gb": (14, "19.62", 32, 2, 3),    # "| 2g.20gb | 14 | 19.62 | 32 | 2 | 2/2/0 | 3 |"
    "3g.40gb": (9, "39.50", 60, 3, 2),     # "| 3g.40gb | 9 | 39.50 | 60 | 3 | 3/3/0 | 2 |"
    "4g.40gb": (5, "39.50", 64, 4, 1),     # "| 4g.40gb | 5 | 39.50 | 64 | 4 | 4/4/0 | 1 |"
    "7g.80gb": (0, "79.25", 132, 8, 1),    # "| 7g.80gb | 0 | 79.25 | 132 | 8 | 7/7/1 | 1 |"
}
# docs/mig-facts.md §1.2, "A100-SXM4-40GB" table: | Profile | id | NVML enum | memorySizeMB (mock) | -lgip GiB (real)
# | SMs | CE | max | placements (mock) |; the real -lgip figure wins over the mock's MB.
MIG_FACTS_A100_40 = {
    "1g.5gb": (19, "4.75", 14, 1, 7, [0, 1, 2, 3, 4, 5, 6]),   # "| 1g.5gb | 19 | 1_SLICE | 4864 | 4.75 | 14 | 1 | 7 | {0,1,2,3,4,5,6}:1 |"
    "2g.10gb": (14, "9.75", 28, 2, 3, [0, 2, 4]),             # "| 2g.10gb | 14 | 2_SLICE | 9856 | 9.75 | 28 | 2 | 3 | {0,2,4}:2 |"
    "3g.20gb": (9, "19.62", 42, 3, 2, [0, 4]),                # "| 3g.20gb | 9 | 3_SLICE | 19968 | 19.62 | 42 | 3 | 2 | {0,4}:4 |"
    "4g.20gb": (5, "19.62", 56, 4, 1, [0]),                   # "| 4g.20gb | 5 | 4_SLICE | 19968 | 19.62 | 56 | 4 | 1 | {0}:4 |"
    "7g.40gb": (0, "39.50", 98, 7, 1, [0]),                   # "| 7g.40gb | 0 | 7_SLICE | 40192 | 39.50 | 98 | 7 | 1 | {0}:8 |"
}


@pytest.mark.parametrize("model, rows", [("H100 80GB", MIG_FACTS_H100), ("A100 40GB", MIG_FACTS_A100_40)])
def test_the_profiles_are_mig_md_s_real_prints(model, rows):
    profiles = {p.name: p for p in mig_profiles.find(model).profiles}
    for name, (pid, gib, sms, ce, most, *placements) in rows.items():
        p = profiles[name]
        assert (p.id, f"{p.memory_mib / 1024:.2f}", p.sms, p.copy_engines, p.max_count) == \
            (pid, gib, sms, ce, most), name
        if placements:
            assert list(p.placements) == placements[0], name


def test_the_reader_reads_what_the_file_says():
    for gpu, model in zip(DATA["gpus"], mig_profiles.models()):
        assert model.model == gpu["model"] and list(model.pci_device_ids) == gpu["pci_device_ids"]
        for row, profile in zip(gpu["profiles"], model.profiles, strict=True):
            assert profile.memory_bytes == row["memory_mib"] * MiB
            assert list(profile.placements) == row["placements"]


@pytest.mark.parametrize("gpu", DATA["gpus"], ids=lambda g: g["model"])
def test_the_data_file_agrees_with_itself(gpu):
    for p in gpu["profiles"]:
        # A printed GiB figure, rounded down to MiB, is the MiB.
        printed = re.search(r"-lgip ([\d.]+) GiB", p["source"])
        if printed:
            assert p["memory_mib"] == math.floor(float(printed[1]) * 1024), p["name"]
        assert all(0 <= s and s + p["memory_slices"] <= gpu["memory_slices"] for s in p["placements"])
        if not p["media_extensions"]:
            # The most instances: as many placements as do not overlap.
            apart = [s for i, s in enumerate(p["placements"])
                     if all(s >= t + p["memory_slices"] for t in p["placements"][:i])]
            assert p["max_count"] == len(apart), p["name"]
    assert gpu["pci_device_ids"] and all(re.fullmatch(r"0x[0-9A-F]{4}10DE", x) for x in gpu["pci_device_ids"])


def test_a_model_is_found_by_any_of_its_names():
    assert mig_profiles.find("NVIDIA H100 80GB HBM3").model == "H100 80GB"
    assert mig_profiles.find("h200-141gb").model == "H200 141GB"
    assert mig_profiles.by_pci_device_id(0x233010DE).model == "H100 80GB"
    assert mig_profiles.by_pci_device_id(0x12345678) is None


# --- legality, checked from the data file -------------------------------------

def assert_legal(plan: mig_plan.Plan, requests: list[Request]) -> None:
    gpu = _data_gpu(plan.model.model)
    rows = {p["name"]: p for p in gpu["profiles"]}
    full_sms = max(p["sms"] for p in gpu["profiles"])
    placed = []
    for g in plan.gpus:
        used: set[int] = set()
        counts = Counter()
        for i in g.instances:
            row = rows[i.profile.name]
            assert not row["media_extensions"]
            assert i.start in row["placements"]
            span = set(range(i.start, i.start + row["memory_slices"]))
            assert not used & span, f"overlap on GPU {g.index}"
            used |= span
            counts[i.profile.name] += 1
            assert i.requests, "an empty instance is planned"
            if any(r.isolated for r in i.requests):
                assert len(i.requests) == 1
            assert sum(r.memory_bytes for r in i.requests) <= row["memory_mib"] * MiB
            shares = [math.ceil(r.cores_pct * full_sms / row["sms"]) for r in i.requests if r.cores_pct]
            assert sum(shares) <= 100
            placed.extend(i.requests)
        assert all(counts[name] <= rows[name]["max_count"] for name in counts)
        assert sum(rows[n]["compute_slices"] * c for n, c in counts.items()) <= gpu["compute_slices"]
    assert Counter(placed) == Counter(requests)


MODELS = [g["model"] for g in DATA["gpus"]]


@st.composite
def request_lists(draw, most: int, sizes_gib=(1, 3, 4, 5, 9, 10, 12, 18, 20, 30, 35, 40, 60, 70)):
    n = draw(st.integers(1, most))
    return [Request(f"r{i}", draw(st.sampled_from(sizes_gib)) * GiB,
                    draw(st.sampled_from([None, None, 5, 10, 30, 60])), draw(st.booleans()))
            for i in range(n)]


def _fitting(requests: list[Request], model) -> list[Request]:
    return [r for r in requests if any(mig_plan.fits([r], p, model) for p in mig_plan.plannable(model))]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(MODELS), request_lists(most=30))
def test_every_plan_is_legal(model_name, requests):
    model = mig_profiles.find(model_name)
    requests = _fitting(requests, model)
    assert_legal(mig_plan.plan(requests, model), requests)


def test_a_thousand_requests_are_legal():
    model = mig_profiles.find("H100 80GB")
    requests = [Request(f"r{i}", (1 + i % 9) * GiB, [None, 10, 25][i % 3], i % 5 == 0)
                for i in range(1000)]
    plan = mig_plan.plan(requests, model)
    assert_legal(plan, requests)
    assert not plan.exact


# --- the fewest GPUs, against an exhaustive search written here -----------------

@functools.cache
def _layouts(model_name: str) -> list[tuple[str, ...]]:
    """Every legal set of instances of one GPU, as its profiles' names, from
    the data file: every choice of non-overlapping placements."""
    gpu = _data_gpu(model_name)
    rows = [p for p in gpu["profiles"] if not p["media_extensions"]]
    slots = [(p["name"], s, p["memory_slices"]) for p in rows for s in p["placements"]]
    found = set()

    def grow(k: int, chosen: list, used: set):
        found.add(tuple(sorted(name for name, _, _ in chosen)))
        for j in range(k, len(slots)):
            _, s, size = slots[j]
            span = set(range(s, s + size))
            if not used & span:
                grow(j + 1, [*chosen, slots[j]], used | span)

    grow(0, [], set())
    most = {p["name"]: p["max_count"] for p in rows}
    return [names for names in found if all(names.count(n) <= most[n] for n in names)]


def _one_gpu_holds(model_name: str, kinds: tuple) -> bool:
    gpu = _data_gpu(model_name)
    rows = {p["name"]: p for p in gpu["profiles"]}
    full_sms = max(p["sms"] for p in gpu["profiles"])
    for names in _layouts(model_name):
        room = [[rows[n]["memory_mib"] * MiB, 100, rows[n]["sms"], 0, False] for n in names]

        def put(k: int, room=room) -> bool:
            if k == len(kinds):
                return True
            memory, cores, isolated = kinds[k]
            for slot in room:
                share = math.ceil(cores * full_sms / slot[2]) if cores else 0
                if slot[0] >= memory and slot[1] >= share and not slot[4] and not (isolated and slot[3]):
                    saved = list(slot)
                    slot[0] -= memory
                    slot[1] -= share
                    slot[3] += 1
                    slot[4] = isolated
                    if put(k + 1):
                        return True
                    slot[:] = saved
            return False

        if put(0):
            return True
    return False


def fewest_gpus_exhaustive(model_name: str, requests: list[Request]) -> int:
    """Every partition of the requests into GPUs; the fewest parts that one
    GPU each holds."""
    kinds = [(r.memory_bytes, r.cores_pct or 0, r.isolated) for r in requests]
    holds = functools.cache(lambda key: _one_gpu_holds(model_name, key))
    best = len(requests)

    def split(k: int, parts: list[list]) -> None:
        nonlocal best
        if len(parts) >= best:
            return
        if k == len(kinds):
            best = len(parts)
            return
        for part in parts:
            part.append(kinds[k])
            if holds(tuple(sorted(part))):
                split(k + 1, parts)
            part.pop()
        parts.append([kinds[k]])
        split(k + 1, parts)
        parts.pop()

    split(0, [])
    return best


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["H100 80GB", "A100 40GB"]), request_lists(most=8))
def test_the_fewest_gpus_are_what_an_exhaustive_search_finds(model_name, requests):
    model = mig_profiles.find(model_name)
    requests = _fitting(requests, model)
    plan = mig_plan.plan(requests, model)
    assert plan.exact
    assert_legal(plan, requests)
    assert len(plan.gpus) == fewest_gpus_exhaustive(model_name, requests)


def test_sharing_puts_fourteen_notebooks_on_one_h100():
    model = mig_profiles.find("H100 80GB")
    notebooks = mig_plan.parse_request("4GiB,count=14,name=nb")
    assert len(mig_plan.plan(notebooks, model).gpus) == 1
    assert len(mig_plan.plan(mig_plan.as_isolated(notebooks), model).gpus) == 2
    assert mig_plan.whole_instances_hami(notebooks, model) == 2


# --- the mig-parted config ------------------------------------------------------

def test_the_mig_parted_config_parses_and_has_the_layout():
    yaml = pytest.importorskip("yaml")
    model = mig_profiles.find("H100 80GB")
    requests = (mig_plan.parse_request("20GiB,count=3,isolated,name=train")
                + mig_plan.parse_request("5GiB,count=6,name=nb"))
    plan = mig_plan.plan(requests, model)
    config = yaml.safe_load(mig_render.render_mig_parted(plan, "my-plan"))
    assert config["version"] == "v1" and list(config["mig-configs"]) == ["my-plan"]
    seen = []
    for entry in config["mig-configs"]["my-plan"]:
        assert set(entry) == {"device-filter", "devices", "mig-enabled", "mig-devices"}
        assert entry["mig-enabled"] is True
        assert entry["device-filter"] == _data_gpu("H100 80GB")["pci_device_ids"]
        for index in entry["devices"]:
            gpu = next(g for g in plan.gpus if g.index == index)
            assert entry["mig-devices"] == Counter(i.profile.name for i in gpu.instances)
            seen.append(index)
    assert sorted(seen) == [g.index for g in plan.gpus]
    assert config == mig_render.mig_parted(plan, "my-plan")


# --- the CLI --------------------------------------------------------------------

def test_the_text_plan_names_instances_and_flags():
    result = vgpulimit("mig", "plan", "--model", "H100 80GB", "--request", "20GiB,count=3,name=train",
                       "--request", "5GiB,cores=10,count=6,name=nb")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("MIG plan: 9 requests on 2 H100 80GB GPUs")
    assert re.search(r"^GPU 0: \S+ at \d:\d", result.stdout, re.MULTILINE)
    assert "--memory-device MIG-<uuid>=20GiB" in result.stdout
    assert re.search(r"--cores-device MIG-<uuid>=\d+", result.stdout)


def test_json_and_the_output_file(tmp_path):
    out = tmp_path / "plan.json"
    result = vgpulimit("mig", "plan", "--model", "a100-40gb", "--request", "4GiB,count=3,isolated",
                       "--format", "json", "--output", str(out))
    assert result.returncode == 0 and result.stdout == "", result.stderr
    document = json.loads(out.read_text())
    assert document["model"] == "A100 40GB"
    [gpu] = document["gpus"]
    assert [i["profile"] for i in gpu["instances"]] == ["1g.5gb"] * 3
    assert all(r["flags"] == [] for i in gpu["instances"] for r in i["requests"])
    assert document["mig_parted"]["version"] == "v1"


@pytest.mark.parametrize("suffix, text", [
    (".json", json.dumps({"requests": [{"memory": "4GiB", "count": 2, "name": "nb"},
                                       {"memory": "30GiB", "cores": 40, "isolated": True}]})),
    (".yaml", "- memory: 4GiB\n  count: 2\n  name: nb\n- memory: 30GiB\n  cores: 40\n  isolated: true\n"),
])
def test_requests_from_a_file(tmp_path, suffix, text):
    if suffix == ".yaml":
        pytest.importorskip("yaml")
    path = tmp_path / f"requests{suffix}"
    path.write_text(text)
    result = vgpulimit("mig", "plan", "--model", "H100", "--requests", str(path), "--format", "json")
    assert result.returncode == 0, result.stderr
    names = sorted(r["name"] for g in json.loads(result.stdout)["gpus"] for i in g["instances"]
                   for r in i["requests"])
    assert names == ["nb[1]", "nb[2]", "request2"]


@pytest.mark.parametrize("args, code, words", [
    (["--model", "H300", "--request", "4GiB"], 2, ["--model", "'H300'", "H100 80GB", "A100 40GB"]),
    (["--model", "H100", "--request", "4GiB,colors=3"], 2, ["--request", "colors=3", "SIZE[,cores=PCT]"]),
    (["--model", "H100", "--request", "4GiB,cores=130"], 2, ["--request", "cores", "130", "1 to 100"]),
    (["--model", "H100", "--request", "4 apples"], 2, ["--request", "accepted forms"]),
    (["--model", "H100", "--request", "50%"], 2, ["--request", "a size"]),
    (["--model", "H100", "--request", "4GiB,count=0"], 2, ["count", "1 to"]),
    (["--model", "H100", "--request", "90GiB,name=big"], 2, ["big", "90 GiB", "7g.80gb", "79.2 GiB"]),
    (["--model", "H100", "--gpus", "1", "--request", "50GiB,count=2"], 1, ["need 2", "1 are given"]),
    (["--model", "H100", "--gpus", "x", "--request", "4GiB"], 2, ["--gpus", "'x'"]),
    (["--model", "H100"], 2, ["no requests", "--request"]),
    (["--model", "H100", "--request", "4GiB", "--format", "xml"], 2, ["--format", "mig-parted"]),
    (["--model", "H100", "--requests", "/nonexistent/r.json"], 2, ["--requests", "/nonexistent/r.json"]),
])
def test_bad_input_is_one_line(args, code, words):
    line = one_error_line(vgpulimit("mig", "plan", *args), code)
    for word in words:
        assert word in line, line


def test_a_bad_file_is_one_line_naming_it(tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps([{"memory": "4GiB", "colour": "red"}]))
    line = one_error_line(vgpulimit("mig", "plan", "--model", "H100", "--requests", str(path)), 2)
    assert str(path) in line and "request 1" in line and "memory: SIZE" in line


def test_the_node_s_gpus_through_nvml_on_the_simulated_gpu(tmp_path):
    env = base_env(SIMGPU_STATE=str(tmp_path / "state"), SIMGPU_PROFILE="h100-80gb", SIMGPU_DEVICES="2")
    result = vgpulimit("mig", "plan", "--simulate", "--request", "39GiB,count=3,isolated",
                       "--format", "json", env=env)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["model"] == "H100 80GB" and [g["index"] for g in document["gpus"]] == [0, 1]
    # Three need more than the node's two GPUs.
    line = one_error_line(vgpulimit("mig", "plan", "--simulate", "--request", "50GiB,count=3",
                                    env=env), 1)
    assert "need 3" in line and "2 are given" in line


def test_without_nvml_it_says_to_give_the_model():
    from vgpulimit import nvml

    if nvml.device_count() is not None:
        pytest.skip("NVML answers here")
    line = one_error_line(vgpulimit("mig", "plan", "--request", "4GiB"), 1)
    assert "--model" in line and "H100 80GB" in line

"""`vgpulimit status --query FIELD,... [--format csv[,noheader][,nounits]]`,
as a script meets it: the figures of `status --json`, one CSV row per
device, written as `nvidia-smi --query-gpu=... --format=csv` writes its own."""

from __future__ import annotations

import csv
import json

import pytest
from conftest import GiB, MiB
from containers import container
from helpers import status

from vgpulimit import query
from vgpulimit.region import MAGIC


def rows(text: str) -> list[list[str]]:
    """nvidia-smi's CSV: ", " between values."""
    return list(csv.reader(text.splitlines(), skipinitialspace=True))


FIELDS = ("index,uuid,memory.total,memory.used,memory.free,memory.limit,memory.physical,"
          "memory.oom_refusals,cores.limit,cores.policy,cores.measured,cores.throttled,"
          "processes.count")


def test_query_writes_the_figures_of_status_json_one_row_per_device(sim_env, tmp_path):
    region = tmp_path / "c" / "region"
    with container(sim_env, region, ["--memory", "2GiB", "--cores", "30"],
                   [(256 * MiB, 1), (128 * MiB, 2)]):
        [dev] = json.loads(status(sim_env, "--json", "--region", region,
                                  "--interval", "0").stdout)["devices"]
        text = status(sim_env, "--region", region, "--query", FIELDS).stdout
        bare = status(sim_env, "--region", region, "--query", "memory.used,memory.limit,cores.limit",
                      "--format", "csv,noheader,nounits").stdout
        no_units = status(sim_env, "--region", region, "--query", "memory.used",
                          "--format", "csv,nounits").stdout
        no_header = status(sim_env, "--region", region, "--query", "index,memory.used",
                           "--format", "csv,noheader").stdout
    [header, row] = rows(text)
    assert header == ["index", "uuid", "memory.total [MiB]", "memory.used [MiB]",
                      "memory.free [MiB]", "memory.limit [MiB]", "memory.physical [MiB]",
                      "memory.oom_refusals", "cores.limit [%]", "cores.policy",
                      "cores.measured [%]", "cores.throttled [s]", "processes.count"]
    got = dict(zip(header, row, strict=True))
    assert got["index"] == "0" and got["uuid"] == dev["uuid"] and dev["uuid"].startswith("GPU-")
    assert got["memory.total [MiB]"] == got["memory.limit [MiB]"] == "2048 MiB"
    assert got["memory.used [MiB]"] == "512 MiB" == f"{dev['used_bytes'] // MiB} MiB"
    assert got["memory.free [MiB]"] == "1536 MiB"
    assert got["memory.physical [MiB]"] == f"{16 * GiB // MiB} MiB"
    assert (got["memory.oom_refusals"], got["cores.limit [%]"], got["cores.policy"]) == \
           ("0", "30 %", "hard")
    # Measured over the default half second, a whole percentage as nvidia-smi's utilisation.
    measured, unit = got["cores.measured [%]"].split(" ")
    assert measured.isdigit() and unit == "%"
    assert got["cores.throttled [s]"].endswith(" s") and got["processes.count"] == "2"
    # nounits drops the units from the values only; noheader the header line.
    assert rows(bare) == [["512", "2048", "30"]]
    assert rows(no_units) == [["memory.used [MiB]"], ["512"]]   # the header keeps its unit
    assert rows(no_header) == [["0", "512 MiB"]]


def test_query_all_gives_a_row_per_device_of_each_container(sim_env, tmp_path):
    runs = tmp_path / "run"
    (runs / "broken").mkdir(parents=True)
    (runs / "broken" / "region").write_bytes(MAGIC + b"\0" * 16)   # unreadable
    with container(sim_env, runs / "a" / "region", ["--memory", "1GiB"], [(256 * MiB, 1)]), \
            container(sim_env, runs / "b" / "region", ["--cores", "50"], [(128 * MiB, 1)]):
        result = status(sim_env, "--all", runs, "--interval", "0", "--query",
                        "region,index,memory.total,memory.used,memory.limit,cores.limit,"
                        "cores.measured,container")
    [header, *found] = rows(result.stdout)
    assert header[0] == "region" and len(found) == 2
    by_region = {row[0]: row[1:] for row in found}
    physical = f"{16 * GiB // MiB} MiB"
    assert by_region == {
        str(runs / "a" / "region"): ["0", "1024 MiB", "256 MiB", "1024 MiB", "none", "[N/A]",
                                     "[N/A]"],
        # No memory cap: it may use the whole device, as nvidia-smi in it reads.
        str(runs / "b" / "region"): ["0", physical, "128 MiB", "none", "50 %", "[N/A]", "[N/A]"],
    }
    # The unreadable region is a line on stderr; the rows stay CSV.
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"vgpulimit: region {runs / 'broken' / 'region'}: ")


def test_query_help_lists_every_field_one_line_each(sim_env):
    text = status(sim_env, "--query", "help").stdout
    lines = text.splitlines()
    assert len(lines) == 1 + len(query.FIELDS)
    for line, field in zip(lines[1:], query.FIELDS, strict=True):
        assert line.split()[0] == field.name and field.help in line
    assert "memory.used [MiB]" in text and "cores.measured [%]" in text


@pytest.mark.parametrize("args, says", [
    (["--query", "index,memory.usage"],
     ("--query: unknown field 'memory.usage'; the fields are region, container, index, uuid, "
      "memory.total, memory.used")),
    (["--query", ","], "--query ',' names no field"),
    (["--format", "csv"], "--format is the form of --query's rows"),
    (["--query", "index", "--json"], "--query writes CSV and --json JSON; give one of them"),
    (["--query", "index", "--format", "csv,noheadr"], "--format 'csv,noheadr': give csv"),
    (["--query", "index", "--format", "nounits"], "--format 'nounits': give csv"),
])
def test_query_bad_input_is_one_line_and_exit_2(sim_env, args, says):
    # Refused before any region is read: none is given.
    result = status(sim_env, *args, check=False)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and says in result.stderr, result.stderr


def test_a_value_with_a_comma_stays_one_csv_value_and_unknown_is_na():
    document = {"region": "/run/a, b/region",
                "identity": {"container_id": None, "pod": "p", "namespace": "ns",
                             "container": "c", "pod_uid": None, "gpus": None},
                "devices": [{"index": 3, "uuid": None, "limit": {"bytes": None, "ppm": 500000,
                                                                 "text": "50%"},
                             "cap_bytes": None, "cores_pct": None, "cores_policy": "hard",
                             "total_bytes": None, "used_bytes": 0, "free_bytes": None,
                             "oom_refusals": 0, "compute_share_pct": 12.6, "busy_ns": 2_500_000,
                             "throttled_ns": 0}],
                "processes": [{"pid": 9, "gone": False, "devices": [{"index": 3,
                                                                     "used_bytes": MiB}]},
                              {"pid": 10, "gone": True, "devices": []}]}
    fields = query.parse_fields("region,container,index,uuid,memory.total,memory.limit,"
                                "cores.limit,cores.measured,cores.busy,processes.count")
    text = query.render_csv(document, fields, query.parse_format("csv,noheader"))
    assert text == ('"/run/a, b/region", ns/p/c, 3, [N/A], [N/A], [N/A], none, 13 %, 0.003 s, 1\n')
    assert rows(text)[0][0] == "/run/a, b/region"


def test_query_priority_and_its_wait_as_status_json_gives_them(sim_env, tmp_path):
    """`priority` is the container's (none without one), `priority.yielded`
    each device's `yielded_ns`, in seconds as `cores.throttled`."""
    from test_views import held_back

    low, plain = tmp_path / "low" / "region", tmp_path / "plain" / "region"
    with container(sim_env, low, ["--priority", "low", "--memory", "1GiB"], [(128 * MiB, 1)]), \
            container(sim_env, plain, ["--memory", "1GiB"], [(128 * MiB, 1)]):
        held_back(low, 1.5)
        document = json.loads(status(sim_env, "--json", "--region", low, "--interval", "0").stdout)
        text = status(sim_env, "--region", low, "--interval", "0", "--query",
                      "index,priority,priority.yielded").stdout
        bare = status(sim_env, "--region", plain, "--interval", "0", "--query",
                      "priority,priority.yielded", "--format", "csv,noheader,nounits").stdout
    assert document["priority"] == "low" and document["devices"][0]["yielded_ns"] == 1_500_000_000
    assert rows(text) == [["index", "priority", "priority.yielded [s]"], ["0", "low", "1.500 s"]]
    assert rows(bare) == [["none", "0.000"]]
    help_lines = status(sim_env, "--query", "help").stdout.splitlines()
    assert any(line.split()[:1] == ["priority"] for line in help_lines)
    assert any(line.split()[:2] == ["priority.yielded", "[s]"] for line in help_lines)

"""The operator's views of running containers: `vgpulimit status` (one region
or a node's worth), `vgpulimit metrics` scraped over HTTP, and `vgpulimit
top` on a pseudo-terminal."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request

import pexpect
import pytest
from conftest import TESTS, GiB, MiB, run, vgpulimit_cmd
from containers import container
from helpers import status
from prometheus_client.parser import text_string_to_metric_families

import vgpulimit
from vgpulimit.metrics import OTHERS, hostname

# The node, as the metrics server run by these tests names it (DCGM's Hostname).
NODE = hostname()


def test_status_json_matches_what_three_processes_allocated(sim_env, tmp_path):
    region = tmp_path / "c" / "region"
    clients = [(256 * MiB, 1), (256 * MiB, 2), (128 * MiB, 3)]
    with container(sim_env, region, ["--memory", "2GiB"], clients) as reports:
        data = json.loads(status(sim_env, "--json", "--region", str(region)).stdout)
    block_of = {count: block for block, count in clients}   # the counts tell them apart
    held = {r["pid"]: r["allocs"].count("CUDA_SUCCESS") * block_of[len(r["allocs"])]
            for r in reports}
    assert sorted(held.values()) == [256 * MiB, 384 * MiB, 512 * MiB]
    procs = {p["pid"]: p for p in data["processes"]}
    assert {pid: p["used_bytes"] for pid, p in procs.items()} == held
    assert all(p["devices"] == [{"index": 0, "used_bytes": held[pid]}] for pid, p in procs.items())
    assert all(p["comm"].startswith("python") for p in procs.values())
    dev0 = data["devices"][0]
    assert (dev0["cap_bytes"], dev0["used_bytes"], dev0["free_bytes"]) == \
           (2 * GiB, 1152 * MiB, 896 * MiB)
    assert dev0["uuid"].startswith("GPU-") and dev0["total_bytes"] == 16 * GiB
    assert dev0["oom_refusals"] == 0 and dev0["throttled_ns"] == 0
    # Measured over the default half second: a number, not "n/a".
    assert isinstance(dev0["compute_share_pct"], float)


def test_status_all_lists_every_container_under_a_directory(sim_env, tmp_path):
    runs = tmp_path / "run"
    (runs / "junk").mkdir(parents=True)
    (runs / "junk" / "notes.txt").write_text("not a region")
    with container(sim_env, runs / "a" / "region", ["--memory", "1GiB"], [(256 * MiB, 1)]), \
            container(sim_env, runs / "b" / "region", ["--memory", "3GiB"], [(512 * MiB, 1)]):
        data = json.loads(status(sim_env, "--json", "--all", str(runs)).stdout)
        text = status(sim_env, "--all", str(runs), "--interval", "0").stdout
    seen = {r["region"]: (r["devices"][0]["cap_bytes"], r["devices"][0]["used_bytes"])
            for r in data["regions"]}
    assert seen == {str(runs / "a" / "region"): (1 * GiB, 256 * MiB),
                    str(runs / "b" / "region"): (3 * GiB, 512 * MiB)}
    assert data["errors"] == []
    assert f"region {runs / 'a' / 'region'}" in text and f"region {runs / 'b' / 'region'}" in text
    assert "n/a" in text   # one read: no share measured


@pytest.mark.parametrize("args, says", [
    (["--all", "/nonexistent"], "--all /nonexistent: not a directory"),
    (["--interval", "soon"], "'soon' is not a number of seconds"),
])
def test_status_bad_input_is_one_line(sim_env, args, says):
    result = run(vgpulimit_cmd("status", "--region", "/nonexistent", *args)
                 if args[0] == "--interval" else vgpulimit_cmd("status", *args), sim_env,
                 check=False)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and says in result.stderr


def series(region, **labels: str) -> tuple:
    """The labels of a series about ``region``, as scrape() keys them: a
    region in no engine's layout names no pod, container or claim."""
    who = {"region": str(region), "pod_uid": "", "container": "", "claim_uid": "", "pod": "",
           "namespace": "", "hpc_job": "", "Hostname": NODE}
    if "device" in labels:   # a series about a GPU: labelled as DCGM exporter labels its own
        who |= {"modelName": "", "GPU_I_ID": "", "GPU_I_PROFILE": ""}
    return tuple(sorted({**who, **labels}.items()))


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_metrics_scraped_over_http(sim_env, tmp_path):
    region = tmp_path / "c" / "region"
    with container(sim_env, region, ["--memory", "2GiB"], [(512 * MiB, 5)]) as [holder]:
        server = subprocess.Popen(
            list(map(str, vgpulimit_cmd("metrics", "--listen", "127.0.0.1:0", "--all", tmp_path))),
            env=sim_env, stderr=subprocess.PIPE, text=True)
        try:
            line = server.stderr.readline()
            assert "serving metrics on http://127.0.0.1:" in line, line
            url = line.split()[-1]
            samples = scrape(url)
        finally:
            server.terminate()
            server.wait(timeout=30)
        uuid = json.loads(status(sim_env, "--json", "--interval", "0", "--region",
                                 str(region)).stdout)["devices"][0]["uuid"]
        [gpu] = json.loads(status(sim_env, "--json", "--interval", "0", "--all",
                                  str(tmp_path)).stdout)["gpus"]
    assert holder["allocs"].count("CUDA_SUCCESS") == 4
    dev = series(region, device="0", UUID=uuid, modelName=gpu["name"])
    assert samples[("vgpulimit_region_readable", series(region))] == 1
    assert samples[("vgpulimit_memory_limit_bytes", dev)] == 2 * GiB
    assert samples[("vgpulimit_memory_used_bytes", dev)] == 2 * GiB
    assert samples[("vgpulimit_oom_refusals_total", dev)] == 1
    assert samples[("vgpulimit_throttled_seconds_total", dev)] == 0
    assert samples[("vgpulimit_compute_busy_seconds_total", dev)] >= 0
    [(key, one)] = [(k, v) for k, v in samples.items() if k[0] == "vgpulimit_build_info"]
    assert one == 1 and dict(key[1])["version"] == vgpulimit.__version__ != "unknown"
    per_process = {k: v for k, v in samples.items()
                   if k[0] == "vgpulimit_process_memory_used_bytes"}
    assert len(per_process) == 1
    [(key, value)] = per_process.items()
    assert value == 2 * GiB
    labels = dict(key[1])
    assert labels["pid"] == str(holder["pid"]) and labels["command"].startswith("python")
    assert labels["host_pid"] in (str(holder["pid"]), "")


def serve_and_scrape(env, *args) -> dict[tuple[str, tuple], float]:
    server = subprocess.Popen(
        list(map(str, vgpulimit_cmd("metrics", "--listen", "127.0.0.1:0", *args))),
        env=env, stderr=subprocess.PIPE, text=True)
    try:
        return scrape(server.stderr.readline().split()[-1])
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_metrics_label_gpus_as_dcgm_exporter_does(sim_env, tmp_path):
    """UUID, modelName and Hostname (from $NODE_NAME, as DCGM exporter's
    DaemonSet sets it) on the GPU series and on the container's, so that a
    query joins them with DCGM's on those labels."""
    env = dict(sim_env, NODE_NAME="gpu-node-7")
    region = tmp_path / "c" / "region"
    with container(env, region, ["--memory", "2GiB"], [(256 * MiB, 1)]):
        [gpu] = json.loads(status(env, "--all", tmp_path, "--json", "--interval",
                                  "0").stdout)["gpus"]
        samples = serve_and_scrape(env, "--all", tmp_path)
    [(_, labels)] = [k for k in samples if k[0] == "vgpulimit_gpu_memory_total_bytes"]
    assert dict(labels) == {"UUID": gpu["uuid"], "gpu": "0", "modelName": gpu["name"],
                            "Hostname": "gpu-node-7", "GPU_I_ID": "", "GPU_I_PROFILE": ""}
    assert gpu["uuid"].startswith("GPU-") and gpu["name"].startswith("NVIDIA ")
    dev = {**dict(series(region, device="0", UUID=gpu["uuid"], modelName=gpu["name"])),
           "Hostname": "gpu-node-7"}
    assert samples[("vgpulimit_memory_used_bytes", tuple(sorted(dev.items())))] == 256 * MiB
    # Every series about a device carries all three, the same on each.
    about_devices = [dict(k[1]) for k in samples if "UUID" in dict(k[1])]
    assert about_devices and all(
        (labels["modelName"], labels["Hostname"]) == (gpu["name"], "gpu-node-7")
        for labels in about_devices if labels["UUID"] == gpu["uuid"])
    assert not [k for k in samples if "uuid" in dict(k[1]) or "name" in dict(k[1])]


# HAMi's vGPU monitor's names, and the labels of each (its cmd/vGPUmonitor/metrics.go).
HAMI_CONTAINER = {"zone", "podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid"}
HAMI_FAMILIES = {
    "vGPU_device_memory_usage_in_bytes": HAMI_CONTAINER,
    "vGPU_device_memory_limit_in_bytes": HAMI_CONTAINER,
    "Device_memory_desc_of_container": HAMI_CONTAINER | {"context", "module", "data", "offset"},
    "Device_utilization_desc_of_container": HAMI_CONTAINER,
    "HostGPUMemoryUsage": {"zone", "nodeid", "deviceidx", "deviceuuid", "devicetype"},
    "HostCoreUtilization": {"zone", "nodeid", "deviceidx", "deviceuuid", "devicetype"},
}


def test_hami_names_serve_the_same_figures_as_hamis_monitor_names_them(sim_env, tmp_path):
    """--hami-names: a HAMi dashboard's queries find the container's use and
    cap and the GPU's use under HAMi's names and labels; without it, none."""
    env = dict(sim_env, NODE_NAME="gpu-node-7")
    region = tmp_path / "c" / "region"
    with container(env, region, ["--memory", "2GiB"], [(256 * MiB, 1)]):
        [gpu] = json.loads(status(env, "--all", tmp_path, "--json", "--interval",
                                  "0").stdout)["gpus"]
        plain = serve_and_scrape(env, "--all", tmp_path)
        server = subprocess.Popen(
            list(map(str, vgpulimit_cmd("metrics", "--listen", "127.0.0.1:0", "--hami-names",
                                        "--all", tmp_path))),
            env=env, stderr=subprocess.PIPE, text=True)
        try:
            url = server.stderr.readline().split()[-1]
            scrape(url)
            samples = scrape(url)   # the second: a utilisation measured since the first
        finally:
            server.terminate()
            server.wait(timeout=30)
    assert not [k for k in plain if k[0] in HAMI_FAMILIES]
    hami = {}
    for (name, labels), value in samples.items():
        if name in HAMI_FAMILIES:
            assert {label for label, _ in labels} == HAMI_FAMILIES[name], name
            hami[name] = (dict(labels), value)
    assert set(hami) == set(HAMI_FAMILIES)
    ctr = {"zone": "vGPU", "podnamespace": "", "podname": "", "ctrname": "", "vdeviceid": "0",
           "deviceuuid": gpu["uuid"]}
    assert hami["vGPU_device_memory_usage_in_bytes"] == (ctr, 256 * MiB)
    assert hami["vGPU_device_memory_limit_in_bytes"] == (ctr, 2 * GiB)
    assert hami["Device_memory_desc_of_container"][1] == 256 * MiB
    assert 0 <= hami["Device_utilization_desc_of_container"][1] <= 100
    host = {"zone": "vGPU", "nodeid": "gpu-node-7", "deviceidx": "0", "deviceuuid": gpu["uuid"],
            "devicetype": f"NVIDIA-{gpu['name']}"}
    assert hami["HostGPUMemoryUsage"][0] == host and hami["HostGPUMemoryUsage"][1] >= 256 * MiB
    assert hami["HostCoreUtilization"][0] == host


def test_per_process_series_are_bounded(sim_env, tmp_path):
    """Four processes in one container, --max-processes 2: the two largest
    have a series each, the other two are summed into one, (others)."""
    region = tmp_path / "c" / "region"
    blocks = [64 * MiB, 128 * MiB, 256 * MiB, 32 * MiB]
    with container(sim_env, region, ["--memory", "2GiB"], [(b, 1) for b in blocks]) as reports:
        samples = serve_and_scrape(sim_env, "--max-processes", "2", "--region", region)
    per_process = {dict(k[1])["pid"] or dict(k[1])["command"]: v
                   for k, v in samples.items() if k[0] == "vgpulimit_process_memory_used_bytes"}
    others = per_process.pop(OTHERS)
    assert others == (64 + 32) * MiB
    assert sorted(per_process.values()) == [128 * MiB, 256 * MiB]
    assert set(per_process) <= {str(r["pid"]) for r in reports}
    [used] = [v for k, v in samples.items() if k[0] == "vgpulimit_memory_used_bytes"]
    assert sum(per_process.values()) + others == used == sum(blocks)
    # With --region alone there is no node view: the GPU's name is NVML's all the same.
    [gpu] = json.loads(status(sim_env, "--all", tmp_path, "--json", "--interval",
                              "0").stdout)["gpus"]
    assert {dict(k[1])["modelName"] for k in samples if "UUID" in dict(k[1])} == {gpu["name"]}


@pytest.mark.parametrize("value", ["-1", "1001", "many"])
def test_metrics_max_processes_bad_input_is_one_line(sim_env, tmp_path, value):
    result = run(vgpulimit_cmd("metrics", "--max-processes", value, "--all", tmp_path), sim_env,
                 check=False)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "--max-processes" in result.stderr


def test_metrics_bad_listen_is_one_line(sim_env, tmp_path):
    result = run(vgpulimit_cmd("metrics", "--listen", "localhost", "--all", tmp_path), sim_env,
                 check=False)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--listen 'localhost'" in result.stderr
    assert "HOST:PORT" in result.stderr


def test_top_shows_the_cap_and_a_process_and_quits_on_q(sim_env, tmp_path):
    region = tmp_path / "c" / "region"
    with container(sim_env, region, ["--memory", "2GiB"], [(512 * MiB, 1)]) as [holder]:
        top = pexpect.spawn(sys.executable, ["-m", "vgpulimit", "top", "--region", str(region)],
                            env=dict(sim_env, TERM="xterm"), dimensions=(30, 80),
                            encoding="utf-8", timeout=30)
        try:
            top.expect_exact("512 MiB / 2 GiB")
            top.expect_exact(str(holder["pid"]))
            top.send("q")
            top.expect(pexpect.EOF)
        finally:
            top.close(force=True)
    assert top.exitstatus == 0


def held_back(region, seconds: float, device: int = 0) -> None:
    """Counts in a region what a container's launches would have waited for
    higher priorities (the shim counts it only beside a higher container)."""
    from vgpulimit.region import Region

    with Region.open(region) as mapped:
        mapped._mapped.yielded_ns[device] = int(seconds * 1e9)


def test_top_shows_a_containers_priority_as_status_does(sim_env, tmp_path):
    """On the container's own view and under its GPU in the node's, within
    the terminal's width; a container without one shows none."""
    node = tmp_path / "node"
    low, plain = node / "low" / "region", node / "plain" / "region"
    with container(sim_env, low, ["--priority", "low", "--memory", "1GiB"], [(256 * MiB, 1)]), \
            container(sim_env, plain, ["--memory", "1GiB"], [(128 * MiB, 1)]):
        held_back(low, 1.5)
        said = status(sim_env, "--region", low, "--interval", "0").stdout
        own = run(vgpulimit_cmd("top", "-1", "--region", low, "--interval", "0.1"),
                  dict(sim_env, COLUMNS="80")).stdout
        nodes = run(vgpulimit_cmd("top", "-1", "--all", node, "--interval", "0.1"),
                    dict(sim_env, COLUMNS="80")).stdout
        other = run(vgpulimit_cmd("top", "-1", "--region", plain, "--interval", "0.1"),
                    dict(sim_env, COLUMNS="80")).stdout
    line = "priority low (held back for higher ones: 1.5 s)"
    assert line in said.splitlines()
    assert line in own.splitlines()
    [shown] = [text for text in nodes.splitlines() if "priority" in text]
    assert shown.strip() == line
    assert max(len(text) for text in nodes.splitlines()) <= 80
    assert "priority" not in other


@pytest.mark.parametrize("gpus", [1, 2])
def test_status_shows_the_devices_the_node_has(sim_env, tmp_path, gpus):
    """A cap for every device is kept for all sixteen device numbers; the
    views show those of the devices there are (issue 23: a one-GPU node
    showed a "1-15" row, and --json sixteen devices)."""
    env = dict(sim_env, SIMGPU_DEVICES=str(gpus))
    used, unused = tmp_path / "used" / "region", tmp_path / "unused" / "region"
    unused.parent.mkdir()
    run(vgpulimit_cmd("run", "--simulate", "--memory", "4GiB", "--cores", "30",
                      "--region", unused, "--", "true"), env)
    with container(env, used, ["--memory", "4GiB", "--cores", "30"], [(256 * MiB, 1)]):
        seen = {region: json.loads(status(env, "--json", "--interval", "0", "--region",
                                          str(region)).stdout)
                for region in (used, unused)}
        text = {region: status(env, "--interval", "0", "--region", str(region)).stdout
                for region in (used, unused)}
        node = json.loads(status(env, "--json", "--all", str(tmp_path), "--interval", "0").stdout)
        every = status(env, "--all", str(tmp_path), "--interval", "0").stdout
    assert [d["index"] for d in seen[used]["devices"]] == list(range(gpus))
    assert [d["index"] for d in seen[unused]["devices"]] == list(range(gpus))
    assert [[d["index"] for d in r["devices"]] for r in node["regions"]] == [list(range(gpus))] * 2
    for region in (used, unused):
        for table in device_tables(text[region]):
            assert table == (["0"] if gpus == 1 else ["0-1"] if region == unused else ["0", "1"])
    region_blocks = every.split("\nregion ")[1:]
    assert len(region_blocks) == 2
    for block in region_blocks:
        assert len(device_tables(block)) == 2   # memory, compute
        # Its last device is the node's last: no row for devices it does not have.
        assert all(table[-1].endswith(str(gpus - 1)) for table in device_tables(block))
    assert "not seen" in text[unused]


def test_status_with_no_driver_in_reach_shows_the_devices_the_container_noted(sim_env, tmp_path):
    """`status --region` where NVML cannot be loaded (no driver in reach, as
    on a machine where the views run without the simulated GPU) and no hook
    recorded the container's GPUs: the devices its processes noted, no
    "2-15" row."""
    env = dict(sim_env, SIMGPU_DEVICES="2")
    region = tmp_path / "c" / "region"
    with container(env, region, ["--memory", "4GiB"], [(256 * MiB, 1)]):
        no_driver = {k: v for k, v in env.items() if k != "LD_LIBRARY_PATH"}
        text = status(no_driver, "--interval", "0", "--region", str(region)).stdout
        seen = json.loads(status(no_driver, "--json", "--interval", "0", "--region",
                                 str(region)).stdout)
    assert [d["index"] for d in seen["devices"]] == [0, 1]
    memory, compute = device_tables(text)
    assert memory == ["0", "1"]
    assert compute == ["0"]   # a device with no share that nothing ran on has no compute row


def device_tables(text: str) -> list[list[str]]:
    """The DEVICE column of each table of `status` text that has one."""
    tables, rows = [], None
    for line in text.splitlines():
        if line.startswith("DEVICE"):
            rows = []
            tables.append(rows)
        elif rows is not None and line.strip():
            rows.append(line.split()[0])
        else:
            rows = None
    return tables


DEPLOY = TESTS.parent / "deploy"
# PromQL words that are not metric names: functions (followed by "("), and these.
_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
                 "unless", "bool", "offset"}


def promql_metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: its identifiers outside label
    matchers, ranges, strings and grouping lists, less functions and keywords."""
    bare = re.sub(r'"[^"]*"|\{[^}]*\}|\[[^\]]*\]', " ", expr)
    bare = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", bare)
    words = [m[1] for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?", bare) if not m[2]]
    return {w for w in words if w not in _PROMQL_WORDS}


def test_the_dashboard_and_servicemonitor_use_what_the_exporter_serves(sim_env, tmp_path):
    """deploy/grafana-dashboard.json queries only metrics `vgpulimit metrics`
    serves (a scrape on the simulated GPU with a capped container and --all),
    and deploy/servicemonitor.yaml scrapes the metrics Service's port with
    honorLabels."""
    yaml = pytest.importorskip("yaml", reason="PyYAML is a test dependency")
    region = tmp_path / "node" / "c" / "region"
    with container(sim_env, region, ["--memory", "2GiB", "--cores", "30"], [(256 * MiB, 1)]):
        samples = serve_and_scrape(sim_env, "--all", tmp_path / "node")
    served = {name for name, _ in samples}
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["definition"].removeprefix("label_values(").split(",")[0]
              for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert len(exprs) >= 8
    used = set().union(*map(promql_metric_names, exprs))
    assert used and all(name.startswith("vgpulimit_") for name in used), used
    assert used <= served, used - served
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    # Every label it filters on, lists values of or names in a legend is one
    # the series it queries carry (modelName on the containers' as on the GPUs').
    labels_of = {name: set() for name in served}
    for name, labels in samples:
        labels_of[name].update(label for label, _ in labels)
    queries = [(t["expr"], re.findall(r"\{\{(\w+)\}\}", t.get("legendFormat", "")))
               for p in dashboard["panels"] for t in p["targets"]]
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":   # label_values(SELECTOR, LABEL)
            selector, label = v["definition"].removeprefix("label_values(").rsplit(",", 1)
            queries.append((selector, [label.strip(" )")]))
    for expr, shown in queries:
        carried = set.intersection(*(labels_of[name] for name in promql_metric_names(expr)))
        for name, matchers in re.findall(r"([A-Za-z_:][\w:]*)\{([^}]*)\}", expr):
            matched = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers))
            assert matched <= labels_of[name], (expr, matched - labels_of[name])
        assert set(shown) <= carried, (expr, set(shown) - carried)

    monitor = yaml.safe_load((DEPLOY / "servicemonitor.yaml").read_text())
    manifests = list(yaml.safe_load_all((DEPLOY / "vgpulimit.yaml").read_text()))
    [service] = [m for m in manifests if m and m["kind"] == "Service"]
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1",
                                                        "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == \
        [service["metadata"]["namespace"]]
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in [p["name"] for p in service["spec"]["ports"]]
    assert endpoint["honorLabels"] is True and endpoint["path"] == "/metrics"


def test_promql_metric_names():
    assert promql_metric_names(
        'sum by (pod) (rate(a_total{x="b(c)"}[5m])) * on(UUID) group_left(modelName) b_c'
        ' / count(d == 0)') == {"a_total", "b_c", "d"}

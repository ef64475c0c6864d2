"""`vgpulimit metrics` under load: scrapes that come together share one
reading of the regions, scrapes whose clients left cost nothing, and the
server answers the next scrape at once however many came before.  (How long
a scrape takes is a figure: benchmarks/metrics_scrape.py.)"""

from __future__ import annotations

import socket
import subprocess
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from urllib.parse import urlsplit

from conftest import vgpulimit_cmd
from prometheus_client.parser import text_string_to_metric_families

from vgpulimit.limits import parse_memory
from vgpulimit.region import Region

REGIONS = 200


def node_of(tmp_path, count: int = REGIONS):
    node = tmp_path / "node"
    for i in range(count):
        (node / f"c{i}").mkdir(parents=True)
        Region.create(node / f"c{i}" / "region", {0: parse_memory("1GiB")}).close()
    return node


@contextmanager
def serving(env, node):
    server = subprocess.Popen(list(map(str, vgpulimit_cmd("metrics", "--listen", "127.0.0.1:0", "--all", node))),
                              env=env, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stderr.readline()
        assert "serving metrics on http://127.0.0.1:" in line, line
        yield line.split()[-1]
    finally:
        server.terminate()
        server.wait(timeout=30)


def scrape(url: str) -> dict[str, list]:
    """name -> its samples, of one scrape; the timeout bounds a test that fails, it times nothing."""
    with urllib.request.urlopen(url, timeout=60) as response:
        text = response.read().decode()
    found: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def collections(samples: dict[str, list]) -> int:
    [sample] = samples.get("vgpulimit_scrape_collections_total", [None])
    assert sample is not None, "no vgpulimit_scrape_collections_total: the server says not how often it read"
    return int(sample.value)


def test_scrapes_that_come_together_share_one_reading_of_the_regions(sim_env, tmp_path):
    node = node_of(tmp_path)
    with serving(sim_env, node) as url, ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(lambda _: scrape(url), range(32)))
    assert all(len(a["vgpulimit_region_readable"]) == REGIONS for a in answers)   # each a whole answer
    # One reading per scrape would be 32 of them, one after the other.
    assert len({collections(a) for a in answers}) <= 8


def test_the_next_scrape_is_answered_after_a_burst_of_abandoned_ones(sim_env, tmp_path):
    """200 scrapers that send their request and leave (as Prometheus does at
    its scrape_timeout): the server reads the regions for none of them, and
    answers the next scrape as if they had never come."""
    node = node_of(tmp_path)
    with serving(sim_env, node) as url:
        address = urlsplit(url)
        for _ in range(200):
            with socket.create_connection((address.hostname, address.port), timeout=30) as s:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: node\r\n\r\n")
        answer = scrape(url)
    assert len(answer["vgpulimit_region_readable"]) == REGIONS
    assert collections(answer) <= 10   # 200 abandoned scrapes cost at most a few readings

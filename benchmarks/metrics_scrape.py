"""How long a scrape of `vgpulimit metrics --all` takes, and what many scrapers at once get.

Makes N region files under one directory (each with a slot of this process
holding 1 MiB, so that every region has a process series and the process's
figures are looked up), serves them with `vgpulimit metrics --all` on the
simulated GPU, and prints:

- the time of one scrape (HTTP request to last byte; median of --repeat (30), after one
  to warm up) at 10, 100 and 1000 regions.  Goal (issue 31): <= 1 s at 1000;
- at 1000 regions, C scrapers at once (--concurrent, 200): how many are
  answered, their median and longest wait, and how many readings of the regions
  served them;
- at 1000 regions, C scrapers that send their request and leave at once, then
  how long the next scrape waits (the server must answer as if they had never come).

    python benchmarks/metrics_scrape.py [--regions 10,100,1000] [--repeat 30] [--concurrent 200]

The default run takes about a minute; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

from vgpulimit import _paths
from vgpulimit.limits import parse_memory
from vgpulimit.region import Region

TIMEOUT_S = 120.0   # what the scrapers gave up after


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def make_regions(node: Path, count: int) -> None:
    """``count`` regions, each holding 1 MiB for this process: its slots stay
    live while it runs (closing a region detaches nothing)."""
    for i in range(count):
        directory = node / "containers" / f"pod{i:05d}_main"
        directory.mkdir(parents=True)
        with Region.create(directory / "vgpulimit.cache", {0: parse_memory("1GiB")}) as region:
            region.reserve(region.attach(os.getpid()), 0, 1 << 20)


def serve(node: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    server = subprocess.Popen([sys.executable, "-m", "vgpulimit", "metrics", "--listen", "127.0.0.1:0",
                               "--all", str(node)], env=env, stderr=subprocess.PIPE, text=True)
    line = server.stderr.readline()
    if "serving metrics" not in line:
        raise SystemExit(f"the server did not start: {line}")
    return server, line.split()[-1]


def scrape(url: str) -> tuple[float | None, bytes]:
    """Seconds to the last byte, None where it failed or timed out."""
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            body = response.read()
    except OSError:
        return None, b""
    return time.perf_counter() - started, body


def collections(body: bytes) -> int | None:
    for line in body.decode(errors="replace").splitlines():
        if line.startswith("vgpulimit_scrape_collections_total "):
            return int(float(line.split()[1]))
    return None


def abandon(url: str) -> None:
    address = urlsplit(url)
    try:
        with socket.create_connection((address.hostname, address.port), timeout=TIMEOUT_S) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: node\r\n\r\n")
    except OSError:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regions", default="10,100,1000", help="region counts, comma-separated")
    parser.add_argument("--repeat", type=int, default=30, help="scrapes timed per count")
    parser.add_argument("--concurrent", type=int, default=200, help="scrapers at once, at the largest count")
    args = parser.parse_args()
    counts = [int(c) for c in args.regions.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, SIMGPU_STATE=str(Path(tmp) / "simgpu.state"), SIMGPU_MEMORY="80GiB",
                   LD_LIBRARY_PATH=str(_paths.simgpu_dir()))
        print(f"{'regions':>8} {'scrape (median)':>16} {'longest':>8} {'size':>9}")
        for count in counts:
            node = Path(tmp) / f"node{count}"
            progress(f"making {count} regions ...")
            make_regions(node, count)
            server, url = serve(node, env)
            try:
                scrape(url)
                times, size = [], 0
                for i in range(args.repeat):
                    progress(f"  {count} regions: scrape {i + 1}/{args.repeat}")
                    took, body = scrape(url)
                    if took is not None:
                        times.append(took)
                        size = len(body)
                if times:
                    print(f"{count:>8} {statistics.median(times):>14.3f} s {max(times):>6.3f} s "
                          f"{size / 1e6:>6.2f} MB", flush=True)
                else:
                    print(f"{count:>8} every scrape failed", flush=True)
                if count == counts[-1]:
                    concurrent(url, args.concurrent, count, server.pid)
            finally:
                server.send_signal(signal.SIGTERM)
                server.wait(timeout=30)


def concurrent(url: str, clients: int, count: int, pid: int) -> None:
    progress(f"  {clients} scrapers at once over {count} regions ...")
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(lambda _: scrape(url), range(clients)))
    wall = time.perf_counter() - started
    waits = sorted(t for t, _ in results if t is not None)
    readings = {collections(body) for t, body in results if t is not None}
    print(f"\n{clients} scrapers at once, {count} regions:")
    print(f"  answered {len(waits)}/{clients} (timeout {TIMEOUT_S:.0f} s) in {wall:.2f} s; "
          f"wait median {statistics.median(waits) if waits else float('nan'):.2f} s, "
          f"longest {max(waits) if waits else float('nan'):.2f} s; "
          f"served by {len(readings - {None})} readings of the regions")
    progress(f"  {clients} scrapers that leave at once ...")
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(lambda _: abandon(url), range(clients)))
    took, body = scrape(url)
    threads = len(os.listdir(f"/proc/{pid}/task")) if os.path.isdir(f"/proc/{pid}/task") else -1
    shown = "not answered" if took is None else f"answered in {took:.2f} s"
    print(f"{clients} scrapers that sent their request and left: the next scrape {shown}; "
          f"server threads after: {threads}; readings so far: {collections(body)}")


if __name__ == "__main__":
    main()

"""Elastic memory (issue 34, docs/memory.md): a guaranteed request below the
cap, borrowing above it of what no other container uses or is guaranteed,
and waiting for memory instead of failing.  Each test runs two or more
containers (`vgpulimit run --simulate`) on one simulated 16 GiB GPU, driven
line by line (tests/c/elastic_client.c)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import C_DIR, SHIM_SRC, GiB, base_env, compile_c, run, vgpulimit_cmd
from helpers import one_error_line, status_json

OOM = 2   # CUDA_ERROR_OUT_OF_MEMORY


@pytest.fixture(scope="module")
def client(tmp_path_factory, simgpu_dir) -> Path:
    out = tmp_path_factory.mktemp("elastic")
    (out / "libcuda.so").symlink_to(simgpu_dir / "libcuda.so.1")
    return compile_c(out / "elastic_client", [C_DIR / "elastic_client.c"], f"-L{out}", "-lcuda")


class Container:
    """`vgpulimit run --simulate FLAGS -- elastic_client`, stepped by the test
    (no flags and `bare`: the client alone, in no container)."""

    def __init__(self, env: dict[str, str], client: Path, *flags: str, region: Path | None = None,
                 bare: bool = False) -> None:
        where = ["--region", str(region)] if region is not None else []
        cmd = [str(client)] if bare else [*map(str, vgpulimit_cmd("run", "--simulate", *where, *flags, "--")),
                                          str(client)]
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        assert self.read() == ["ready"], self.proc.stderr.read()

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def read(self) -> list[str]:
        return self.proc.stdout.readline().split()

    def ask(self, line: str) -> list[str]:
        self.send(line)
        return self.read()

    def alloc(self, nbytes: int) -> tuple[int, int]:
        """(block id, result) of one cuMemAlloc."""
        _, block, rc, _ = self.ask(f"alloc {nbytes}")
        return int(block), int(rc)

    def meminfo(self) -> tuple[int, int]:
        _, free, total, rc = self.ask("meminfo")
        assert rc == "0"
        return int(free), int(total)

    def close(self) -> str:
        self.send("exit")
        _, err = self.proc.communicate(timeout=60)
        return err


@pytest.fixture
def containers(sim_env, client):
    """Starts containers on the test's simulated GPU; all stop at the end."""
    started: list[Container] = []

    def start(*flags: str, **kw) -> Container:
        started.append(Container(sim_env, client, *flags, **kw))
        return started[-1]

    yield start
    for c in started:
        if c.proc.poll() is None:
            c.proc.kill()
            c.proc.wait(timeout=30)


def node(sim_env) -> dict:
    """`status --all --json` of the runtime directory every `vgpulimit run` of the test makes its regions in."""
    where = Path(sim_env["XDG_RUNTIME_DIR"]) / "vgpulimit"
    return json.loads(run(vgpulimit_cmd("status", "--all", where, "--json", "--simulate", "--interval", "0"),
                          sim_env).stdout)


def seen_waiting(sim_env, count: int, region: Path | None = None) -> None:
    """Returns once ``count`` allocations wait: on the GPU as `status --all`
    sees it, or in the container of ``region``."""
    for _ in range(400):
        seen = device0(sim_env, region)["waiting"] if region else node(sim_env)["gpus"][0]["waiters"]
        if seen == count:
            return
        time.sleep(0.05)
    raise AssertionError(f"never {count} waiting, but {seen}")


def device0(sim_env, region: Path) -> dict:
    return status_json(sim_env, region, "--interval", "0")["devices"][0]


# -- the request and the wait, as given --------------------------------------------------------


@pytest.mark.parametrize("flags, env, expected", [
    (["--memory", "4GiB", "--memory-request", "8GiB"], {},
     "--memory-request 8GiB is above the limit --memory 4GiB on device 0; a request is at most the limit"),
    (["--memory", "50%", "--memory-request", "0.75"], {},
     "--memory-request 0.75 is above the limit --memory 50% on device 0"),
    ([], {"VGPULIMIT_MEMORY": "1GiB", "VGPULIMIT_MEMORY_REQUEST": "2GiB"},
     "VGPULIMIT_MEMORY_REQUEST=2GiB is above the limit VGPULIMIT_MEMORY=1GiB on every device"),
    ([], {"VGPULIMIT_MEMORY_1": "1GiB", "VGPULIMIT_MEMORY_REQUEST_1": "3GiB"},
     "VGPULIMIT_MEMORY_REQUEST_1=3GiB is above the limit VGPULIMIT_MEMORY_1=1GiB on device 1"),
    (["--memory-device", "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6=1GiB",
      "--memory-request-device", "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6=2GiB"], {},
     "--memory-request-device GPU-8932f937-d72c-4106-c12f-20bd9faed9f6 2GiB is above the limit"),
    (["--memory-request", "1GiB", "--memory-request", "2GiB"], {},
     "--memory-request is given twice ('1GiB', then '2GiB'); give it once"),
    (["--memory-request-device", "0=1GiB", "--memory-request-device", "0=2GiB"], {},
     "--memory-request-device: device 0 is given twice"),
    (["--memory-wait", "5"], {}, ("--memory-wait: '5' is a number without a unit; accepted forms: 0, or a "
                                  "duration with a unit up to 1h: 500ms, 2s, 1.5m")),
    (["--memory-wait", "-1s"], {}, "--memory-wait: '-1s' is negative (a wait is 0 or a duration)"),
    (["--memory-wait", "2h"], {}, "--memory-wait: '2h' is out of range (more than 1h)"),
    ([], {"VGPULIMIT_MEMORY_WAIT": "3"}, ("VGPULIMIT_MEMORY_WAIT: '3' is not a valid value; accepted forms: 0, "
                                          "or a duration with a unit up to 1h")),
    ([], {"VGPULIMIT_MEMORY_REQUEST": "lots"}, ("VGPULIMIT_MEMORY_REQUEST: 'lots' is not a valid value; "
                                                "accepted forms: 4GiB")),
])
def test_bad_requests_and_waits_are_one_line_naming_the_source(sim_env, flags, env, expected):
    result = run(vgpulimit_cmd("run", "--simulate", *flags, "--", "true"), dict(sim_env, **env), check=False)
    assert expected in one_error_line(result, 2)


def test_the_shim_refuses_a_request_above_its_limit_in_the_environment_alone(sim_env, client, shim_path,
                                                                            tmp_path):
    """A CDI device or a bare preload: the shim's own reader says it once, and
    fails closed (allocations refused), never runs without limits."""
    env = dict(sim_env, LD_PRELOAD=str(shim_path), VGPULIMIT_MEMORY="1GiB", VGPULIMIT_MEMORY_REQUEST="2GiB")
    c = Container(env, client, bare=True)
    assert c.alloc(GiB // 4)[1] == OOM
    err = c.close()
    assert err.count("VGPULIMIT_MEMORY_REQUEST=2GiB is above the limit VGPULIMIT_MEMORY=1GiB") == 1


def test_request_and_wait_reach_the_region_from_flags_variables_cdi_and_annotations(sim_env, tmp_path):
    region = tmp_path / "flags.region"
    run(vgpulimit_cmd("run", "--simulate", "--region", region, "--memory", "8GiB", "--memory-request", "2GiB",
                      "--memory-wait", "1.5s", "--", "true"), sim_env)
    shown = status_json(sim_env, region, "--interval", "0")
    assert shown["memory_wait_ns"] == 1_500_000_000
    assert [d["request"]["text"] for d in shown["devices"]] == ["2 GiB"]
    # The variables, per device, beaten by a flag for every device.
    region = tmp_path / "env.region"
    env = dict(sim_env, VGPULIMIT_MEMORY="8GiB", VGPULIMIT_MEMORY_REQUEST_0="3GiB", VGPULIMIT_MEMORY_WAIT="250ms")
    run(vgpulimit_cmd("run", "--simulate", "--region", region, "--", "true"), env)
    shown = status_json(sim_env, region, "--interval", "0")
    assert (shown["memory_wait_ns"], shown["devices"][0]["request"]["text"]) == (250_000_000, "3 GiB")
    spec = json.loads(run(vgpulimit_cmd("cdi", "generate", "--memory", "8GiB", "--memory-request", "25%",
                                        "--memory-wait", "2s"), sim_env).stdout)
    [device] = spec["devices"]
    assert device["name"] == "8GiB-request-25pct-wait-2s"
    assert {"VGPULIMIT_MEMORY_REQUEST=25%", "VGPULIMIT_MEMORY_WAIT=2s"} <= set(device["containerEdits"]["env"])
    from vgpulimit.oci.request import requested

    limits = requested({"annotations": {"vgpulimit.io/memory": "8GiB", "vgpulimit.io/memory-request": "1GiB",
                                        "vgpulimit.io/memory-wait": "300ms"},
                        "process": {"env": ["VGPULIMIT_MEMORY_REQUEST=4GiB"]}})
    assert (limits.request[0].value.bytes, limits.memory_wait_ns()) == (GiB, 300_000_000)


def test_a_request_annotation_above_the_limit_is_refused_by_the_hook():
    from vgpulimit.oci import HookError
    from vgpulimit.oci.request import requested

    with pytest.raises(HookError) as refused:
        requested({"annotations": {"vgpulimit.io/memory": "1GiB", "vgpulimit.io/memory-request": "2GiB"}})
    assert "annotation vgpulimit.io/memory-request 2GiB is above the limit annotation vgpulimit.io/memory" \
        in str(refused.value)
    with pytest.raises(HookError) as refused:
        requested({"annotations": {"vgpulimit.io/memory-wait": "forever"}})
    assert str(refused.value).startswith("annotation vgpulimit.io/memory-wait: 'forever' is not a valid value")


# -- borrowing and guarantees ------------------------------------------------------------------


def test_a_container_borrows_only_memory_no_other_uses_or_is_guaranteed(sim_env, containers):
    """16 GiB: a plain cap of 10 GiB is guaranteed its cap.  Beside it a
    container of request 2 GiB and cap 8 GiB gets its 2 GiB and borrows the
    4 GiB left, never the other's 10 GiB, though the other uses none."""
    plain = containers("--memory", "10GiB")
    elastic = containers("--memory", "8GiB", "--memory-request", "2GiB")
    assert [elastic.alloc(GiB)[1] for _ in range(7)] == [0] * 6 + [OOM]
    assert elastic.meminfo() == (0, 8 * GiB)
    assert plain.alloc(10 * GiB)[1] == 0   # its guarantee is all there
    view = node(sim_env)
    [gpu] = view["gpus"]
    assert (gpu["requested_bytes"], gpu["borrowed_bytes"], gpu["waiters"]) == (12 * GiB, 4 * GiB, 0)
    rows = {c["request_bytes"]: c for c in gpu["containers"]}
    assert (rows[2 * GiB]["used_bytes"], rows[2 * GiB]["borrowed_bytes"]) == (6 * GiB, 4 * GiB)
    assert rows[10 * GiB]["borrowed_bytes"] == 0
    [refusals] = [d["borrow_refusals"] for r in view["regions"] for d in r["devices"] if d["request"]]
    assert refusals == 1
    assert "past the container's memory request" in elastic.close()


def test_without_a_request_a_cap_is_as_before(sim_env, containers):
    """No request, no wait: the cap is the guarantee, and nothing borrows."""
    a, b = containers("--memory", "12GiB"), containers("--memory", "12GiB")
    assert [a.alloc(4 * GiB)[1] for _ in range(3)] == [0, 0, 0]
    assert [b.alloc(4 * GiB)[1] for _ in range(2)] == [0, OOM]   # the GPU is full: the driver says so
    assert b.meminfo() == (0, 12 * GiB)


def test_set_changes_a_request_live_and_the_board_with_it(sim_env, containers, tmp_path):
    """Beside a plain cap of 10 GiB, a container of request 4 GiB may borrow
    2 GiB; raised to 7 GiB by `set`, which writes the node's board, the same
    allocation is within its request."""
    region = tmp_path / "elastic.region"
    containers("--memory", "10GiB")
    elastic = containers("--memory", "8GiB", "--memory-request", "4GiB", region=region)
    assert elastic.alloc(4 * GiB)[1] == 0
    assert elastic.alloc(3 * GiB)[1] == OOM
    result = run(vgpulimit_cmd("set", "--region", region, "--memory-request", "7GiB", "--memory-wait", "1s"),
                 sim_env)
    assert result.stdout.splitlines() == ["devices 0-15: memory request 4 GiB → 7 GiB", "memory wait: 0 → 1s"]
    assert elastic.alloc(3 * GiB)[1] == 0
    bad = run(vgpulimit_cmd("set", "--region", region, "--memory-request", "9GiB"), sim_env, check=False)
    assert "--memory-request 9 GiB is above the limit the cap 8 GiB on device 0" in one_error_line(bad, 2)
    shown = status_json(sim_env, region, "--interval", "0")
    assert (shown["memory_wait_ns"], shown["devices"][0]["request_bytes"]) == (1_000_000_000, 7 * GiB)


def test_a_tenants_lies_cost_its_own_guarantee_never_anothers(sim_env, containers, tmp_path):
    """A borrower that writes a larger request into its region, and zero use
    into its beacon, still borrows nothing of another's guarantee: its
    request is the board's, and its use its ledger's.  A guarantee holder
    that claims more use than it has loses its own guarantee to borrowers."""
    from vgpulimit._paths import core
    from vgpulimit.region import Region

    ffi, _ = core()
    borrower_region = tmp_path / "borrower.region"
    holder = containers("--memory", "10GiB", region=tmp_path / "holder.region")
    borrower = containers("--memory", "8GiB", "--memory-request", "2GiB", region=borrower_region)
    assert borrower.alloc(6 * GiB)[1] == 0
    with Region.open(borrower_region) as r:
        r._mapped.devices[0].request.bytes = 8 * GiB
        beacon = Path(r.snapshot().board).parent / f"beacon-{r.board_key:016x}"
    used_at = ffi.offsetof("struct vgl_beacon", "device") + ffi.offsetof("struct vgl_beacon_device", "used_bytes")
    with open(beacon, "r+b") as f:
        f.seek(used_at)
        f.write(bytes(8))
    assert borrower.alloc(GiB)[1] == OOM
    # The holder says it uses its whole guarantee: borrowers may take it.
    with Region.open(tmp_path / "holder.region") as r:
        holder_beacon = Path(r.snapshot().board).parent / f"beacon-{r.board_key:016x}"
    with open(holder_beacon, "r+b") as f:
        f.seek(used_at)
        f.write((10 * GiB).to_bytes(8, sys.byteorder))
    assert borrower.alloc(2 * GiB)[1] == 0
    assert holder.alloc(10 * GiB)[1] == OOM   # its own lie: 8 GiB free on the GPU


# -- getting a guarantee back, and waiting -----------------------------------------------------


def test_memory_flows_back_from_a_caching_borrower_to_the_owner_of_a_guarantee(sim_env, containers):
    """A borrower took 14 GiB before a container of 8 GiB guaranteed
    started.  The owner's allocation within its request waits (the GPU is
    full); the borrower's next allocation past its request is refused, it
    empties its cache, as PyTorch's caching allocator does, and tries again;
    the owner gets its memory as soon as the cache is freed.  Nothing is killed."""
    borrower = containers("--memory", "14GiB", "--memory-request", "2GiB")
    ids = [borrower.ask(f"cache {2 * GiB}") for _ in range(7)]
    assert [line[2] for line in ids] == ["0"] * 7
    for block in range(1, 7):
        borrower.ask(f"uncache {block}")
    owner = containers("--memory", "8GiB", "--memory-wait", "20s")
    owner.send(f"alloc {4 * GiB}")
    seen_waiting(sim_env, 1)
    _, block, rc, freed = borrower.ask(f"cache {GiB}")
    assert (rc, freed) == ("0", "6")   # refused past its request; its cache emptied; then granted
    _, got, rc, _ = owner.read()
    assert (got, rc) == ("0", "0")
    [gpu] = node(sim_env)["gpus"]
    assert gpu["waiters"] == 0
    owner_row = next(c for c in gpu["containers"] if c["request_bytes"] == 8 * GiB)
    assert (owner_row["used_bytes"], owner_row["wait_timeouts"]) == (4 * GiB, 0)
    assert owner_row["waited_ns"] > 0
    assert borrower.proc.poll() is None and owner.proc.poll() is None


def test_a_wait_ends_in_an_honest_refusal_and_nothing_hangs(sim_env, containers):
    """Two containers fill the GPU and each waits for more: neither frees,
    so both are refused at their timeouts, each counted."""
    a = containers("--memory", "10GiB", "--memory-wait", "300ms")
    b = containers("--memory", "10GiB", "--memory-wait", "300ms")
    assert a.alloc(8 * GiB)[1] == 0 and b.alloc(8 * GiB)[1] == 0
    a.send(f"alloc {GiB}")
    b.send(f"alloc {GiB}")
    assert [a.read()[2], b.read()[2]] == [str(OOM), str(OOM)]
    [gpu] = node(sim_env)["gpus"]
    assert [c["wait_timeouts"] for c in gpu["containers"]] == [1, 1]
    assert gpu["waiters"] == 0


def test_a_waiter_at_its_cap_gets_what_its_containers_other_process_frees(sim_env, client, shim_path, tmp_path,
                                                                         containers):
    region = tmp_path / "shared.region"
    first = containers("--memory", "4GiB", "--memory-wait", "20s", region=region)
    containers("--memory", "8GiB")   # a neighbour on the GPU
    second = Container(dict(sim_env, LD_PRELOAD=str(shim_path), VGPULIMIT_REGION=str(region)), client, bare=True)
    try:
        assert second.alloc(3 * GiB)[1] == 0
        first.send(f"alloc {2 * GiB}")
        seen_waiting(sim_env, 1, region)
        assert second.ask("free 0")[:3] == ["free", "0", "0"]
        assert first.read()[1:3] == ["0", "0"]
        shown = device0(sim_env, region)
        assert (shown["used_bytes"], shown["wait_timeouts"], shown["oom_refusals"]) == (2 * GiB, 0, 1)
    finally:
        second.close()


def test_waiters_are_served_higher_priority_first_then_oldest(sim_env, containers, client):
    """A process in no container holds 13 GiB; three containers, each of
    request 1 GiB, wait to borrow 4 GiB: a normal one first, then a high one,
    then another normal one.  As the holder frees 4 GiB at a time, the high
    one gets it first, then the older normal one, then the newer."""
    holder = Container(sim_env, client, bare=True)
    try:
        assert [holder.alloc(n * GiB)[1] for n in (4, 4, 4, 1)] == [0, 0, 0, 0]
        waiters = {}
        for name, priority in (("old", "normal"), ("high", "high"), ("new", "normal")):
            c = containers("--memory", "8GiB", "--memory-request", "1GiB", "--memory-wait", "30s",
                           "--priority", priority)
            assert c.alloc(GiB)[1] == 0
            c.send(f"alloc {4 * GiB}")
            waiters[name] = c
            seen_waiting(sim_env, len(waiters))
        served = []
        for block in range(3):
            holder.ask(f"free {block}")
            served.append(_first_answer({n: c for n, c in waiters.items() if n not in served}))
        assert served == ["high", "old", "new"]
    finally:
        holder.close()


def _first_answer(waiting: dict[str, Container]) -> str:
    """The name of the one container of ``waiting`` whose allocation returns
    next (its answer read), and that it was granted."""
    import selectors

    sel = selectors.DefaultSelector()
    for name, c in waiting.items():
        sel.register(c.proc.stdout, selectors.EVENT_READ, name)
    [(key, _)] = sel.select(timeout=30)[:1]
    name = key.data
    sel.close()
    _, _, rc, _ = waiting[name].read()
    assert rc == "0", name
    return name


# -- the dead hold nothing, waiting included ---------------------------------------------------


def node_dir(sim_env) -> Path:
    """Where `vgpulimit run` makes regions, and `status --all` finds them."""
    where = Path(sim_env["XDG_RUNTIME_DIR"]) / "vgpulimit"
    where.mkdir(mode=0o700, exist_ok=True)
    return where


def beacon_waits(region: Path) -> list[tuple[int, int]]:
    """(waiters, oldest_wait_ns) of every device in the beacon of the
    container of ``region``, as its file holds them."""
    from vgpulimit._paths import core
    from vgpulimit.region import Region

    ffi, _ = core()
    with Region.open(region) as r:
        beacon = Path(r.snapshot().board).parent / f"beacon-{r.board_key:016x}"
    image = bytearray(beacon.read_bytes())
    b = ffi.cast("struct vgl_beacon *", ffi.from_buffer(image))
    return [(int(d.waiters), int(d.oldest_wait_ns)) for d in b.device]


def no_one_waits(sim_env, *regions: Path) -> None:
    """Every count of waiting is 0: in each region, in each beacon, and in
    `status`, `top` and the metrics of the node."""
    from test_node_view import gpu_series, serve_metrics

    where = Path(sim_env["XDG_RUNTIME_DIR"]) / "vgpulimit"
    deadline = time.monotonic() + 30   # the supervisor repairs its beacon within a second
    while any(n or since for r in regions for n, since in beacon_waits(r)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for r in regions:
        assert beacon_waits(r) == [(0, 0)] * 16, r
        shown = status_json(sim_env, r, "--interval", "0")["devices"]
        assert shown and [d["waiting"] for d in shown] == [0] * len(shown)
    [gpu] = node(sim_env)["gpus"]
    assert gpu["waiters"] == 0 and [c["waiting"] for c in gpu["containers"]] == [0] * len(gpu["containers"])
    text = run(vgpulimit_cmd("status", "--all", where, "--simulate", "--interval", "0"), sim_env).stdout
    assert " 0 waiting" in text and " 1 waiting" not in text
    top = run(vgpulimit_cmd("top", "-1", "--all", where, "--simulate"), dict(sim_env, COLUMNS="160")).stdout
    assert "0 waiting" in top and " 1 waiting" not in top
    [samples], _ = serve_metrics(sim_env, where)
    assert gpu_series(samples, "vgpulimit_gpu_memory_waiting_allocations") == [0]
    assert set(gpu_series(samples, "vgpulimit_memory_waiting_allocations")) == {0}


def test_a_waiter_killed_while_it_waits_holds_no_one_back(sim_env, client, shim_path, tmp_path, containers):
    """Issue 39: a process in no container holds 15 of 16 GiB.  A second
    process of container W waits for 3 GiB and is killed with SIGKILL while
    W's first process lives on, and W's supervisor is stopped (SIGSTOP), so
    that nobody writes W's beacon again, as in a container of the hook.  A
    borrowing waiter of another container is served when the 15 GiB are
    freed, as if the killed one had never waited, though W's beacon still
    says one waits: a claim no live waiter holds is passed over.  Once W's
    supervisor runs again, no count anywhere says anyone waits."""
    import signal

    holder = Container(sim_env, client, bare=True)
    region = node_dir(sim_env) / "w.region"
    try:
        assert [holder.alloc(n * GiB)[1] for n in (8, 7)] == [0, 0]
        w = containers("--memory", "4GiB", "--memory-request", "512MiB", "--memory-wait", "60s", region=region)
        second = Container(dict(sim_env, LD_PRELOAD=str(shim_path), VGPULIMIT_REGION=str(region)), client,
                           bare=True)
        second.send(f"alloc {3 * GiB}")
        seen_waiting(sim_env, 1, region)
        w.proc.send_signal(signal.SIGSTOP)
        second.proc.kill()
        assert second.proc.wait(timeout=30) == -9
        borrower = containers("--memory", "8GiB", "--memory-request", "512MiB", "--memory-wait", "30s",
                              region=node_dir(sim_env) / "b.region")
        assert borrower.alloc(256 * 1024 * 1024)[1] == 0
        borrower.send(f"alloc {2 * GiB}")
        seen_waiting(sim_env, 1, node_dir(sim_env) / "b.region")
        holder.ask("free 0")
        holder.ask("free 1")
        assert borrower.read()[2] == "0"   # served, not refused at its deadline
        assert beacon_waits(region)[0][0] == 1   # the killed one's claim, never repaired meanwhile
        w.proc.send_signal(signal.SIGCONT)
        no_one_waits(sim_env, region)
    finally:
        holder.close()


def test_waiters_killed_at_any_moment_of_their_waits_and_wakes_leave_nothing(sim_env, client, shim_path,
                                                                           tmp_path, containers):
    """Many rounds: a process in no container holds 15 of 16 GiB, three
    processes of two containers wait to borrow 1 GiB each, one is killed
    (SIGKILL) a random moment into its wait, 2 GiB are freed, one more is
    killed a random moment into its wake, and the third is served as if the
    two had never waited.  The containers' supervisors are stopped
    meanwhile (nobody repairs a beacon but the waiters themselves, as in a
    container of the hook); once they run again, no count anywhere says
    anyone waits.  VGPULIMIT_TEST_ROUNDS sets how many rounds (the seed is
    in the failure)."""
    import os
    import random
    import selectors
    import signal

    rounds = int(os.environ.get("VGPULIMIT_TEST_ROUNDS", "25"))
    seed = int(os.environ.get("VGPULIMIT_TEST_SEED", str(time.time_ns())))
    rng = random.Random(seed)
    regions = [node_dir(sim_env) / "w.region", node_dir(sim_env) / "x.region"]
    supervisors = [containers("--memory", "4GiB", "--memory-request", "512MiB", "--memory-wait", "60s",
                              region=r).proc for r in regions]
    holder = Container(sim_env, client, bare=True)
    try:
        assert [holder.alloc(GiB)[1] for _ in range(15)] == [0] * 15
        for p in supervisors:
            p.send_signal(signal.SIGSTOP)
        for n in range(rounds):
            waiters = [Container(dict(sim_env, LD_PRELOAD=str(shim_path), VGPULIMIT_REGION=str(rng.choice(regions))),
                                 client, bare=True) for _ in range(3)]
            for w in waiters:
                w.send(f"alloc {GiB}")
            rng.shuffle(waiters)
            time.sleep(rng.choice([0, rng.uniform(0, 0.001), rng.uniform(0, 0.02)]))
            waiters[0].proc.kill()          # waiting, or starting to
            holder.ask("free 0")
            holder.ask("free 1")
            # The holder is in no row: waiters find its free at their next look (every 50 ms).
            time.sleep(rng.choice([0, rng.uniform(0, 0.003), rng.uniform(0, 0.06)]))
            waiters[1].proc.kill()          # waking, or served
            sel = selectors.DefaultSelector()
            sel.register(waiters[2].proc.stdout, selectors.EVENT_READ)
            assert sel.select(timeout=30), f"round {n} (seed {seed}): the last waiter was never served"
            sel.close()
            assert waiters[2].read()[2] == "0", f"round {n} (seed {seed})"
            waiters[2].close()
            for w in waiters[:2]:
                w.proc.wait(timeout=30)
            # Back to 15 GiB held, once the dead's memory is the driver's again.
            for block in (0, 1):
                while holder.alloc(GiB) != (block, 0):
                    time.sleep(0.01)
        for p in supervisors:
            p.send_signal(signal.SIGCONT)
        no_one_waits(sim_env, *regions)
    finally:
        holder.close()


# -- views ------------------------------------------------------------------------------------


def test_meminfo_nvml_and_total_agree_under_borrowing(sim_env, containers, shim_path, tmp_path):
    """Total is the cap everywhere; free is what the container may take now
    (past its request, only what no other container is guaranteed): the
    same in cuMemGetInfo and NVML v1 and v2, whose reserved holds the rest."""
    region = tmp_path / "borrower.region"
    containers("--memory", "10GiB")
    borrower = containers("--memory", "8GiB", "--memory-request", "2GiB", region=region)
    assert borrower.alloc(3 * GiB)[1] == 0
    free, total = borrower.meminfo()
    assert (free, total) == (3 * GiB, 8 * GiB)   # 16 - 3 used - 10 guaranteed to the other
    assert borrower.ask("total") == ["total", str(8 * GiB)]
    from conftest import TESTS

    nvml = json.loads(run([sys.executable, TESTS / "clients" / "nvml_memory_v2.py"],
                          dict(sim_env, LD_PRELOAD=str(shim_path), VGPULIMIT_REGION=str(region))).stdout)
    assert nvml["v1"] == {"total": 8 * GiB, "free": 3 * GiB, "used": 3 * GiB}
    assert nvml["v2"] == {"total": 8 * GiB, "reserved": 2 * GiB, "free": 3 * GiB, "used": 3 * GiB}


# -- the node ---------------------------------------------------------------------------------


def test_status_top_and_metrics_show_requests_borrowing_and_waiters(sim_env, containers):
    from test_node_view import gpu_series, serve_metrics

    containers("--memory", "10GiB")
    borrower = containers("--memory", "8GiB", "--memory-request", "2GiB", "--memory-wait", "20s")
    assert borrower.alloc(6 * GiB)[1] == 0
    borrower.send(f"alloc {GiB}")   # waits: nothing past 6 GiB is free of the other's guarantee
    where = Path(sim_env["XDG_RUNTIME_DIR"]) / "vgpulimit"
    seen_waiting(sim_env, 1)
    text = run(vgpulimit_cmd("status", "--all", where, "--simulate", "--interval", "0"), sim_env).stdout
    assert "requests 12 GiB, in use 6 GiB, borrowed 4 GiB, 1 waiting" in text
    top = run(vgpulimit_cmd("top", "-1", "--all", where, "--simulate"), dict(sim_env, COLUMNS="160")).stdout
    assert "request 2 GiB, borrowed 4 GiB, 1 waiting" in top
    [samples], _ = serve_metrics(sim_env, where)
    assert gpu_series(samples, "vgpulimit_gpu_memory_requested_bytes") == [12 * GiB]
    assert gpu_series(samples, "vgpulimit_gpu_memory_borrowed_bytes") == [4 * GiB]
    assert gpu_series(samples, "vgpulimit_gpu_memory_waiting_allocations") == [1]
    assert sorted(gpu_series(samples, "vgpulimit_memory_request_bytes")) == [2 * GiB, 10 * GiB]
    assert sorted(gpu_series(samples, "vgpulimit_memory_waiting_allocations")) == [0, 1]


# -- older files -----------------------------------------------------------------------------


def test_a_region_or_board_of_the_previous_layout_is_refused_with_one_line(sim_env, tmp_path):
    from vgpulimit._paths import core

    ffi, _ = core()
    region = tmp_path / "old.region"
    run(vgpulimit_cmd("run", "--simulate", "--region", region, "--memory", "1GiB", "--", "true"), sim_env)
    with open(region, "r+b") as f:   # the layout before requests: version 7
        f.seek(ffi.offsetof("struct vgl_region", "version"))
        f.write((7).to_bytes(4, sys.byteorder))
    shown = run(vgpulimit_cmd("status", "--region", region), sim_env, check=False)
    assert "a region file of another vgpulimit version (layout version differs)" in one_error_line(shown)
    board = Path(sim_env["XDG_RUNTIME_DIR"]) / "vgpulimit" / "priority.board"
    board.write_bytes(b"VGLBOARD" + (2).to_bytes(4, sys.byteorder) + bytes(24 + 64 * 104 - 12))
    asked = run(vgpulimit_cmd("run", "--simulate", "--memory", "4GiB", "--memory-request", "1GiB", "--", "true"),
                sim_env, check=False)
    assert "--memory-request 1GiB: cannot take a row in the priority board" in one_error_line(asked)
    assert "a board of another vgpulimit version (layout version differs)" in one_error_line(asked)
    plain = run(vgpulimit_cmd("run", "--simulate", "--memory", "4GiB", "--", "true"), sim_env)
    assert "a board of another vgpulimit version" in plain.stderr   # a warning: the cap alone holds


# -- the decisions alone ----------------------------------------------------------------------


def test_the_elastic_model_alone_under_sanitizers(tmp_path):
    binary = compile_c(tmp_path / "elastic_model_test",
                       [C_DIR / "elastic_model_test.c", SHIM_SRC / "elastic_model.c"],
                       "-fsanitize=address,undefined", "-fno-sanitize-recover=all")
    result = run([binary], base_env(), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.endswith(" passed, 0 failed\n")

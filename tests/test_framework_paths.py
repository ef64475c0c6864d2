"""The paths by which frameworks share device memory between processes, and
give it back and take it again: legacy CUDA IPC (torch.multiprocessing, CuPy),
VMM handles exported as file descriptors (PyTorch's expandable segments,
passed over a unix socket or fetched with pidfd_getfd), NCCL's host cuMem,
vLLM's and SGLang's sleep and wake, and a second preload library of
torch_memory_saver's shape. tests/c/share_client.c and tests/c/saver_client.c
run the frameworks' sequences of driver calls, one command at a time, so that
a test steps two processes (or two containers) in turn.

First what simgpu does, as the driver does (NVML's per-process figures), then
what the cap sees under the shim (docs/memory.md, "Framework paths")."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import C_DIR, TESTS, MiB, compile_c, vgpulimit_cmd
from containers import joined
from helpers import status_json

INVALID_VALUE, OUT_OF_MEMORY, INVALID_CONTEXT = "err 1", "err 2", "err 201"


@pytest.fixture(scope="module")
def clients(tmp_path_factory, simgpu_dir):
    out = tmp_path_factory.mktemp("share")
    (out / "libcuda.so").symlink_to(simgpu_dir / "libcuda.so.1")
    compile_c(out / "share_client", [C_DIR / "share_client.c"], f"-L{out}", "-lcuda")
    compile_c(out / "libmemory_saver.so", [C_DIR / "memory_saver.c"], "-shared", "-fPIC", f"-L{out}", "-lcuda")
    compile_c(out / "saver_client", [C_DIR / "saver_client.c"], f"-L{out}", "-lcuda", "-ldl")
    return out


class Client:
    """One share_client (or saver_client): a command in, its answer out."""

    def __init__(self, cmd, env):
        self.proc = subprocess.Popen(list(map(str, cmd)), env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        ready = self.proc.stdout.readline().strip()
        assert ready == "ready", ready
        self.pid = int(self("pid").split()[1]) if "share_client" in str(cmd) else self.proc.pid

    def __call__(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def ok(self, line: str) -> str:
        answer = self(line)
        assert answer.startswith("ok"), f"{line}: {answer}"
        return answer[3:]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture
def started():
    running: list[Client] = []

    def start(cmd, env) -> Client:
        running.append(Client(cmd, env))
        return running[-1]

    yield start
    for client in running:
        client.close()


def in_container(clients, region, memory, program="share_client"):
    return vgpulimit_cmd("run", "--simulate", "--memory", memory, "--region", region, "--",
                         clients / program)


def driver_view(env) -> tuple[dict[int, int], int]:
    """NVML's per-process memory (pid: MiB) and the device's used MiB, without the shim."""
    out = subprocess.run([sys.executable, TESTS / "clients" / "nvml_processes.py"], env=env,
                         capture_output=True, text=True, check=True, timeout=60).stdout
    seen = json.loads(out)
    return {int(pid): b // MiB for pid, b in seen["compute"].items()}, seen["used"] // MiB


def region_used(env, region) -> int:
    return status_json(env, region)["devices"][0]["used_bytes"] // MiB


# ---- simgpu: the driver's side ----


def test_ipc_memory_is_charged_to_one_holder_at_a_time(sim_env, clients, started):
    """torch.multiprocessing's sharing: the producer pays while it holds the
    block; freed while the consumer still has it open, the memory stays and the
    consumer is charged, until it closes it."""
    producer, consumer = started([clients / "share_client"], sim_env), started([clients / "share_client"], sim_env)
    producer.ok("alloc 100")
    producer.ok("write 7")
    handle = producer.ok("ipc_get")
    consumer.ok(f"ipc_open {handle}")
    assert consumer.ok("read") == "7"
    assert producer(f"ipc_open {handle}") == INVALID_CONTEXT  # not from the process that exported it
    assert driver_view(sim_env) == ({producer.pid: 100, consumer.pid: 0}, 100)
    producer.ok("free")
    assert driver_view(sim_env) == ({producer.pid: 0, consumer.pid: 100}, 100)
    assert consumer.ok("read") == "7"
    consumer.ok("ipc_close")
    assert driver_view(sim_env)[1] == 0


@pytest.mark.parametrize("passing", ["scm_rights", "pidfd_getfd"])
def test_an_exported_vmm_handle_lives_until_its_last_holder(sim_env, clients, started, tmp_path, passing):
    """PyTorch's expandable segments shared with another process: the fd
    passed over a unix socket, or fetched with pidfd_getfd as PyTorch does."""
    producer, consumer = started([clients / "share_client"], sim_env), started([clients / "share_client"], sim_env)
    producer.ok("segment 4")  # two 2 MiB pieces; the first is exported
    producer.ok("write 9")
    fd = producer.ok("export")
    if passing == "scm_rights":
        socket = tmp_path / "fd.sock"
        consumer.ok(f"listen {socket}")
        producer.ok(f"send {socket}")
        consumer.ok("recv")
    else:
        got = consumer(f"pidfd {producer.pid} {fd}")
        if got != "ok":
            pytest.skip(f"pidfd_getfd is refused here ({got}): ptrace is restricted")
    consumer.ok("import")
    assert consumer.ok("read") == "9"
    assert driver_view(sim_env) == ({producer.pid: 4, consumer.pid: 0}, 4)
    producer.ok("sleep")  # unmapped and released: the consumer's piece stays, now its
    assert driver_view(sim_env) == ({producer.pid: 0, consumer.pid: 2}, 2)
    assert producer("release") == INVALID_VALUE  # a double release
    consumer.ok("sleep")
    # The exported descriptor, open in both processes, still holds the piece:
    # the device's, no process's (the kernel driver's own client owns it).
    assert driver_view(sim_env) == ({producer.pid: 0, consumer.pid: 0}, 2)
    producer.ok("close_fd")
    consumer.ok("close_fd")
    assert driver_view(sim_env) == ({producer.pid: 0, consumer.pid: 0}, 0)


def test_host_cumem_is_host_memory_shared_by_fd(sim_env, clients, started, tmp_path):
    """NCCL's host cuMem (ncclCuMemHostAlloc): a HOST_NUMA allocation, exported
    to the other rank. No device memory, for either."""
    rank0, rank1 = started([clients / "share_client"], sim_env), started([clients / "share_client"], sim_env)
    rank0.ok("host 8")
    rank0.ok("write 5")
    rank0.ok("export")
    socket = tmp_path / "nccl.sock"
    rank1.ok(f"listen {socket}")
    rank0.ok(f"send {socket}")
    rank1.ok("recv")
    rank1.ok("import")
    assert rank1.ok("read") == "5"
    assert driver_view(sim_env) == ({rank0.pid: 0, rank1.pid: 0}, 0)


def test_a_pool_allocation_imported_by_another_process(sim_env, clients, started, tmp_path):
    """cudaMallocAsync IPC (PyTorch's and CuPy's async allocators): the pool
    exported as an fd, one allocation as export data. The importer sees the
    bytes and pays nothing; it frees first, as cuda.h asks, then the exporter
    frees and trims."""
    exporter, importer = started([clients / "share_client"], sim_env), started([clients / "share_client"], sim_env)
    exporter.ok("pool 10")
    exporter.ok("write 3")
    exporter.ok("pool_export")
    socket = tmp_path / "pool.sock"
    importer.ok(f"listen {socket}")
    exporter.ok(f"send {socket}")
    importer.ok("recv")
    importer.ok("pool_import")
    importer.ok(f"pool_open {exporter.ok('pool_ptr')}")
    assert importer.ok("read") == "3"
    assert driver_view(sim_env) == ({exporter.pid: 10, importer.pid: 0}, 10)
    importer.ok("free_opened")
    exporter.ok("free")
    exporter.ok("trim")
    assert driver_view(sim_env)[1] == 0
    assert importer(f"pool_open {'00' * 64}") == INVALID_VALUE


def test_an_interprocess_event_is_recorded_and_waited_on_across_processes(sim_env, clients, started):
    """PyTorch sends a CUDA tensor's event with it: the receiver waits on the
    sender's record, and records its own for the sender."""
    sender, receiver = started([clients / "share_client"], sim_env), started([clients / "share_client"], sim_env)
    assert sender("event 0") == INVALID_VALUE  # not made with CU_EVENT_INTERPROCESS
    handle = sender.ok("event")
    receiver.ok(f"event_open {handle}")  # never recorded: complete
    sender.ok("record")
    receiver.ok("wait_event")
    receiver.ok("record")
    sender.ok("wait_event")
    sender.ok("event_destroy")
    assert receiver(f"event_open {handle}") == INVALID_VALUE


# ---- the shim: what the caps count ----


def test_an_importing_container_pays_from_the_open(sim_env, clients, started, tmp_path):
    """Two containers. What the importer opens is charged to its cap when it
    opens it, whoever else holds it, and refused if it does not fit; it stays
    charged after the exporter frees it (the driver then charges the
    importer), until the importer closes it."""
    exporter_region, importer_region = tmp_path / "exporter.region", tmp_path / "importer.region"
    exporter = started(in_container(clients, exporter_region, "1GiB"), sim_env)
    importer = started(in_container(clients, importer_region, "160MiB"), sim_env)
    exporter.ok("alloc 100")
    importer.ok(f"ipc_open {exporter.ok('ipc_get')}")
    importer.ok("alloc 50")
    assert (region_used(sim_env, exporter_region), region_used(sim_env, importer_region)) == (100, 150)
    assert importer("alloc 20") == OUT_OF_MEMORY
    exporter.ok("free")
    assert (region_used(sim_env, exporter_region), region_used(sim_env, importer_region)) == (0, 150)
    importer.ok("ipc_close")
    assert region_used(sim_env, importer_region) == 50
    exporter.ok("alloc 100")
    small = started(in_container(clients, tmp_path / "small.region", "60MiB"), sim_env)
    assert small(f"ipc_open {exporter.ok('ipc_get')}") == OUT_OF_MEMORY
    assert region_used(sim_env, tmp_path / "small.region") == 0


def test_a_pool_import_is_charged_to_the_importer(sim_env, clients, started, tmp_path):
    """cudaMallocAsync IPC between two containers: the pool memory an import
    maps is charged to the importer's cap at the import (refused where it
    does not fit), and given back when it frees the pointer."""
    exporter_region, importer_region = tmp_path / "exporter.region", tmp_path / "importer.region"
    exporter = started(in_container(clients, exporter_region, "1GiB"), sim_env)
    importer = started(in_container(clients, importer_region, "48MiB"), sim_env)
    exporter.ok("pool 30")
    exporter.ok("pool_export")
    socket = tmp_path / "pool.sock"
    importer.ok(f"listen {socket}")
    exporter.ok(f"send {socket}")
    importer.ok("recv")
    importer.ok("pool_import")
    importer.ok(f"pool_open {exporter.ok('pool_ptr')}")
    importer.ok("alloc 10")
    assert (region_used(sim_env, exporter_region), region_used(sim_env, importer_region)) == (30, 40)
    assert importer("alloc 10") == OUT_OF_MEMORY
    importer.ok("free_opened")
    assert region_used(sim_env, importer_region) == 10
    # A pool destroyed while a pointer imported into it lives (cuda.h: its
    # memory goes with the last such pointer) keeps the charge as long.
    importer.ok(f"pool_open {exporter.ok('pool_ptr')}")
    importer.ok("pool_destroy")
    exporter.ok("free")
    exporter.ok("trim")
    assert driver_view(sim_env)[0][importer.pid] == 40
    assert region_used(sim_env, importer_region) == 40
    importer.ok("free_async opened")  # cudaFreeAsync: given back once its stream has reached it
    assert driver_view(sim_env)[0][importer.pid] == 10
    assert region_used(sim_env, importer_region) == 10


def test_a_stream_ordered_free_gives_a_pointers_charge_back(sim_env, clients, started, tmp_path):
    """cudaFreeAsync of a cudaMalloc block: its charge comes back once the
    stream has reached the free, and the cap holds another."""
    region = tmp_path / "region"
    client = started(in_container(clients, region, "60MiB"), sim_env)
    client.ok("alloc 50")
    assert client("alloc 50") == OUT_OF_MEMORY
    client.ok("free_async block")
    assert region_used(sim_env, region) == 0
    client.ok("alloc 50")


@pytest.mark.parametrize("containers", [1, 2])
def test_an_imported_vmm_handle_is_charged_to_its_importer_until_it_lets_go(
        sim_env, clients, started, shim_path, tmp_path, containers):
    """PyTorch's expandable segments shared by two processes of one container,
    or of two: the exporter pays for its segment, the importer for the piece
    it imports, from the import until it releases it; in one container the
    piece is counted for each while both hold it."""
    exporter_region = tmp_path / "exporter.region"
    importer_region = exporter_region if containers == 1 else tmp_path / "importer.region"
    exporter = started(in_container(clients, exporter_region, "60MiB"), sim_env)
    importer = started([clients / "share_client"], joined(sim_env, exporter_region, shim_path)) \
        if containers == 1 else started(in_container(clients, importer_region, "60MiB"), sim_env)
    exporter.ok("segment 8")
    socket = tmp_path / "fd.sock"
    importer.ok(f"listen {socket}")
    exporter.ok("export")
    exporter.ok(f"send {socket}")
    importer.ok("recv")
    importer.ok("import")
    if containers == 1:
        assert region_used(sim_env, exporter_region) == 10
    else:
        assert (region_used(sim_env, exporter_region), region_used(sim_env, importer_region)) == (8, 2)
    exporter.ok("sleep")
    exporter.ok("close_fd")
    importer.ok("close_fd")
    assert region_used(sim_env, importer_region) == 2
    if containers == 2:
        assert region_used(sim_env, exporter_region) == 0
    importer.ok("sleep")
    assert region_used(sim_env, importer_region) == 0


def driver_mib(env, pids) -> int:
    """What NVML lists for these processes together, in MiB."""
    listed, _ = driver_view(env)
    return sum(listed.get(pid, 0) for pid in pids)


def share_once(path, exporter, importer, tmp_path, cycle) -> str:
    """One cycle of issue 39's repro: the exporter allocates 40 MiB and shares
    it by `path`, the importer takes it, the exporter lets go of its own.
    Returns the importer's answer to the import."""
    socket = tmp_path / f"{path}{cycle}.sock"
    if path == "ipc":
        exporter.ok("alloc 40")
        got = importer(f"ipc_open {exporter.ok('ipc_get')}")
        exporter.ok("free")
        return got
    importer.ok(f"listen {socket}")
    if path == "vmm":
        exporter.ok("vmm 40")
        exporter.ok("export")
        exporter.ok(f"send {socket}")
        importer.ok("recv")
        got = importer("import")
        exporter.ok("sleep")  # unmapped and released: the importer's now
    else:
        exporter.ok("pool 40")
        exporter.ok("pool_export")
        exporter.ok(f"send {socket}")
        importer.ok("recv")
        importer.ok("pool_import")
        got = importer(f"pool_open {exporter.ok('pool_ptr')}")
        exporter.ok("free")  # before the importer, which cuda.h forbids and simgpu keeps for it
        exporter.ok("trim")
    exporter.ok("close_fd")
    importer.ok("close_fd")
    return got


@pytest.mark.parametrize("path", ["ipc", "vmm", "pool"])
@pytest.mark.parametrize("containers", [1, 2])
def test_an_idle_importer_holds_no_more_than_its_cap_however_often_it_imports(
        sim_env, clients, started, shim_path, tmp_path, path, containers):
    """Issue 39, part 2: an exporter that allocates, shares and frees, again
    and again, never leaves an idle importer holding more than its cap (plus
    the one allocation it was refused), as the driver lists it: each import is
    paid for when it is made, and the one that no longer fits is refused. The
    exporter's container stays under its own cap too."""
    cap, cycles = 100, 6
    exporter_region = tmp_path / "exporter.region"
    importer_region = exporter_region if containers == 1 else tmp_path / "importer.region"
    exporter = started(in_container(clients, exporter_region, f"{cap}MiB"), sim_env)
    importer = started([clients / "share_client"], joined(sim_env, exporter_region, shim_path)) \
        if containers == 1 else started(in_container(clients, importer_region, f"{cap}MiB"), sim_env)
    importers = [exporter.pid, importer.pid] if containers == 1 else [importer.pid]
    answers = []
    for cycle in range(cycles):
        answers.append(share_once(path, exporter, importer, tmp_path, cycle))
        assert driver_mib(sim_env, importers) <= cap + 40, (cycle, answers)
        assert driver_mib(sim_env, [exporter.pid]) <= cap
        assert region_used(sim_env, importer_region) <= cap
    assert set(answers) == {"ok", OUT_OF_MEMORY}, answers
    # The importer has been idle all along; what it holds is what its cap pays for.
    assert driver_mib(sim_env, importers) <= region_used(sim_env, importer_region)


@pytest.mark.parametrize("path", ["ipc", "vmm", "pool"])
def test_a_killed_importer_holds_nothing(sim_env, clients, started, shim_path, tmp_path, path):
    """An importer killed with what it imported: the driver lets go of its
    hold, and its container's next allocation has the whole cap again, as
    for any dead process's memory."""
    exporter = started(in_container(clients, tmp_path / "exporter.region", "1GiB"), sim_env)
    importer_region = tmp_path / "importer.region"
    keeper = started(in_container(clients, importer_region, "100MiB"), sim_env)
    importer = started([clients / "share_client"], joined(sim_env, importer_region, shim_path))
    assert share_once(path, exporter, importer, tmp_path, 0) == "ok"
    assert region_used(sim_env, importer_region) == 40
    assert keeper("alloc 80") == OUT_OF_MEMORY
    importer.proc.kill()
    importer.proc.wait(timeout=30)
    assert driver_view(sim_env)[0].get(importer.pid, 0) == 0
    keeper.ok("alloc 80")
    assert region_used(sim_env, importer_region) == 80


def test_sleep_and_wake_give_the_cap_back_and_take_it_again(sim_env, clients, started, tmp_path):
    """vLLM's sleep mode: unmap + release give the memory back at once; create
    + map at the same addresses take it again; a double release is the
    driver's error and changes nothing."""
    region = tmp_path / "sleeper.region"
    sleeper = started(in_container(clients, region, "64MiB"), sim_env)
    sleeper.ok("segment 48")
    for _ in range(3):
        assert region_used(sim_env, region) == 48
        sleeper.ok("sleep")
        assert region_used(sim_env, region) == 0
        assert sleeper("release") == INVALID_VALUE
        assert region_used(sim_env, region) == 0
        assert sleeper.ok("info").split()[0] == str(64 * MiB)
        sleeper.ok("wake")
    assert sleeper("segment 32") == OUT_OF_MEMORY  # 48 + 32 is past the cap


def test_a_sleeping_container_lets_another_wake(sim_env, clients, started, tmp_path):
    """Two containers whose caps together exceed a 256 MiB device: each wakes
    while the other sleeps."""
    env = sim_env | {"SIMGPU_MEMORY": "256MiB"}
    first = started(in_container(clients, tmp_path / "a.region", "200MiB"), env)
    second = started(in_container(clients, tmp_path / "b.region", "200MiB"), env)
    first.ok("segment 160")
    first.ok("sleep")
    second.ok("segment 160")
    second.ok("sleep")
    for sleeper, waker in ((first, second), (second, first)) * 2:
        waker.ok("wake")
        assert region_used(env, tmp_path / "a.region") + region_used(env, tmp_path / "b.region") == 160
        waker.ok("sleep")


def test_a_wake_that_finds_the_gpu_taken_waits_with_memory_wait(sim_env, clients, started, tmp_path):
    """vLLM's wake under `--memory-wait`: another container took the memory
    while this one slept, so the wake's cuMemCreate waits (it does not fail)
    and returns once the other sleeps."""
    env = sim_env | {"SIMGPU_MEMORY": "256MiB"}
    first = started(vgpulimit_cmd("run", "--simulate", "--memory", "200MiB", "--memory-wait", "20s", "--region",
                                  tmp_path / "a.region", "--", clients / "share_client"), env)
    second = started(in_container(clients, tmp_path / "b.region", "200MiB"), env)
    first.ok("segment 160")
    first.ok("sleep")
    second.ok("segment 160")
    first.proc.stdin.write("wake\n")
    first.proc.stdin.flush()
    waiting = lambda: status_json(env, tmp_path / "a.region")["devices"][0]["waiting"]
    deadline = time.monotonic() + 10
    while not waiting() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert waiting() == 1
    second.ok("sleep")
    assert first.proc.stdout.readline().strip() == "ok"
    assert region_used(env, tmp_path / "a.region") == 160


def test_host_cumem_passes_through_identically(sim_env, clients, started, tmp_path):
    """NCCL's host cuMem probe and allocation get the driver's own answer
    under a cap smaller than the allocation, as without the shim, and count
    against nothing."""
    region = tmp_path / "rank.region"
    capped = started(in_container(clients, region, "16MiB"), sim_env)
    plain = started([clients / "share_client"], sim_env)
    assert capped("host 64") == plain("host 64") == "ok"
    assert region_used(sim_env, region) == 0


@pytest.mark.parametrize("order", ["shim first", "saver first"])
def test_a_memory_saver_preload_works_under_the_shim(sim_env, clients, started, shim_path, tmp_path, order):
    """SGLang's torch_memory_saver shape: a second preload that defines
    cudaMalloc and allocates through VMM, paused and resumed under a cap."""
    region = tmp_path / "saver.region"
    saver = clients / "libmemory_saver.so"
    preload = [shim_path, saver] if order == "shim first" else [saver, shim_path]
    env = joined(sim_env, region, shim_path) | {"LD_PRELOAD": " ".join(map(str, preload))}
    subprocess.run(list(map(str, vgpulimit_cmd("run", "--simulate", "--memory", "64MiB", "--region", region,
                                               "--", "true"))), env=sim_env, check=True, timeout=60)
    program = started([clients / "saver_client"], env)
    program.ok("malloc 40")
    assert program("malloc 40") == "err 2"  # past the cap
    assert region_used(sim_env, region) == 40
    program.ok("pause")
    assert region_used(sim_env, region) == 0
    program.ok("malloc 30")
    assert program("resume") == "err 2"  # 40 more does not fit beside the 30
    assert region_used(sim_env, region) == 30

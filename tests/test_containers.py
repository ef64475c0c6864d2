"""`vgpulimit run` as a container's entrypoint (PID 1), the example image, and
the Kubernetes manifests."""

from __future__ import annotations

import functools
import json
import os
import pty
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TESTS, base_env, vgpulimit_cmd
from runc_bundle import make_bundle

import vgpulimit

REPO = TESTS.parent
FORWARDED = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGWINCH]


def instructions(path: Path) -> list[tuple[str, str]]:
    """A Containerfile's instructions: (KEYWORD, arguments), continuations joined."""
    result, pending = [], ""
    for line in path.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            keyword, _, args = pending.strip().partition(" ")
            result.append((keyword.upper(), args.strip()))
            pending = ""
    return result


def image_command() -> tuple[list[str], list[str]]:
    """The example image's ENTRYPOINT and CMD, in their exec (JSON) form."""
    found = dict(instructions(REPO / "examples" / "Containerfile"))
    return json.loads(found["ENTRYPOINT"]), json.loads(found["CMD"])


def test_the_example_image_starts_with_vgpulimit_run_and_takes_limits_from_env():
    entrypoint, cmd = image_command()
    assert entrypoint == ["vgpulimit", "run", "--"]
    assert cmd == ["python3", "/app/fill_gpu.py"]
    found = instructions(REPO / "examples" / "Containerfile")
    # No limit is baked into the image: it comes with `-e VGPULIMIT_MEMORY=...`.
    assert not any("VGPULIMIT_MEMORY" in args for keyword, args in found if keyword == "ENV")
    assert ("COPY", "examples/fill_gpu.py /app/fill_gpu.py") in found


# -- PID 1 in a PID namespace of its own ---------------------------------------------------------

# How a child below waits for its signal: ARMED before it says "ready", then WAIT.
# Not `while True: signal.pause()`: a signal that lands after the interpreter last
# looked for pending signals and before pause(2) begins runs only the C part of
# the handler (it notes the signal for later), and pause() then sleeps through it
# for good -- the test timed out at 60 s.  The C part also writes to the wake-up
# fd, so a read of it returns whether the signal came before or during the read,
# and the interpreter runs the Python handler as that read returns.
ARMED = """
import os, signal
_wakeup, _noted = os.pipe()
os.set_blocking(_noted, False)
signal.set_wakeup_fd(_noted)
"""
WAIT = """
while True:
    os.read(_wakeup, 1)
"""

# The handlers write with os.write, never print(): a handler runs between two
# bytecodes, which may be inside the child's own print("ready"), and a print
# there is a reentrant call into the same BufferedWriter (a RuntimeError).
SIGNAL_HANDLERS = """
import os, signal, sys
def on(sig, frame):
    os.write(1, f"child got {signal.Signals(sig).name}\\n".encode())
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)       # die of it, if that is what it does
    sys.exit(7)                     # it is not (SIGWINCH): exit with a status of our own
for sig in %s:
    signal.signal(sig, on)
""" % [int(s) for s in FORWARDED]
SIGNAL_CHILD = SIGNAL_HANDLERS + ARMED + 'print("ready", flush=True)\n' + WAIT


def test_a_child_acts_on_a_signal_that_lands_between_ready_and_its_wait():
    # The stretch between "ready" and the wait, a few bytecodes in the tests
    # above, is widened to about a second: one bytecode running a C loop in
    # which the interpreter does not look for signals.  A signal sent then lands
    # in it; with signal.pause() as the wait, the child never ran its handler.
    child = (SIGNAL_HANDLERS + ARMED + "import itertools\n" + 'print("ready", flush=True)\n'
             + "-1 in itertools.repeat(0, 100_000_000)\n" + WAIT)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        time.sleep(0.1)   # past print(), whose return looks for signals: into the stretch
        proc.send_signal(signal.SIGUSR2)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert out == "child got SIGUSR2\n"
    assert proc.returncode == -signal.SIGUSR2


def pid_namespace_or_skip() -> str:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) to make a PID namespace")
    probe = subprocess.run([unshare, "--pid", "--fork", "--mount-proc", "true"],
                           capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a PID namespace here (root needed): {probe.stderr.strip()}")
    return unshare


def only_child(pid: int) -> int:
    """The one child of ``pid``, once it has one."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.01)
    raise AssertionError(f"process {pid} started no child")


@pytest.mark.parametrize("sig", FORWARDED, ids=[s.name for s in FORWARDED])
def test_as_pid_1_each_signal_reaches_the_child_and_its_status_comes_back(tmp_path, sig):
    unshare = pid_namespace_or_skip()
    # No core file from SIGQUIT: sh sets the limit, then becomes unshare.
    proc = subprocess.Popen(["sh", "-c", 'ulimit -c 0 && exec "$@"', "sh",
                             unshare, "--pid", "--fork", "--mount-proc",
                             *vgpulimit_cmd("run", "--", sys.executable, "-c", SIGNAL_CHILD)],
                            stdout=subprocess.PIPE, text=True, env=base_env(), cwd=tmp_path)
    try:
        assert proc.stdout.readline() == "ready\n"
        supervisor = only_child(proc.pid)
        status = Path(f"/proc/{supervisor}/status").read_text()
        [nspid] = [line for line in status.splitlines() if line.startswith("NSpid:")]
        assert nspid.split()[-1] == "1"    # it is PID 1 in its namespace
        os.kill(supervisor, sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert out == f"child got {sig.name}\n"
    assert proc.returncode == (7 if sig == signal.SIGWINCH else 128 + sig)


def proc_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def core_loaded(pid: int) -> bool:
    """Whether ``pid`` runs vgpulimit (a fork of ours has not until its exec)
    and has loaded its native core."""
    try:
        return (Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:3] == [b"-m", b"vgpulimit"]
                and "/vgpulimit/_core." in Path(f"/proc/{pid}/maps").read_text())
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False


def in_set_up(supervisor: int, send) -> bool:
    """Calls ``send`` while the supervisor sets the run up; False if it had
    its child before this could.  It is in its set-up once it has loaded its
    native core (the parser's limits, the region) and has no child yet; it is
    stopped there, so that what is sent lands before the child exists."""
    deadline = time.monotonic() + 30
    while not core_loaded(supervisor):
        assert proc_state(supervisor) is not None, "the supervisor ended in its set-up"
        assert time.monotonic() < deadline, "the supervisor never loaded its native core"
        time.sleep(0.0005)
    os.kill(supervisor, signal.SIGSTOP)
    try:
        while proc_state(supervisor) not in ("T", None):
            time.sleep(0.0005)
        if Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split():
            return False
        send()
        return True
    finally:
        os.kill(supervisor, signal.SIGCONT)


# As PID 1, SIGTERM (`docker stop`) with no handler is dropped by the kernel;
# elsewhere SIGUSR1 with no handler kills the supervisor: either way, one that
# came before the child exists was lost, unless the supervisor holds it.
@pytest.mark.parametrize("pid_1, sig", [(True, signal.SIGTERM), (False, signal.SIGUSR1)],
                         ids=["pid-1-SIGTERM", "SIGUSR1"])
def test_a_signal_in_the_set_up_reaches_the_child(tmp_path, pid_1, sig):
    wrap = [pid_namespace_or_skip(), "--pid", "--fork", "--mount-proc"] if pid_1 else []
    for _ in range(5):
        # sleep exits 0 unless the signal reaches it and ends it.
        proc = subprocess.Popen([*wrap, *vgpulimit_cmd("run", "--", "sleep", "15")],
                                stderr=subprocess.PIPE, text=True, env=base_env(), cwd=tmp_path)
        try:
            supervisor = only_child(proc.pid) if pid_1 else proc.pid
            sent = in_set_up(supervisor, functools.partial(os.kill, supervisor, sig))
            if not sent:            # too late: end this run, try again
                only_child(supervisor)
                os.kill(supervisor, signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
            proc.wait()
        if sent:
            break
    assert sent, "the supervisor had its child each time before it could be signalled"
    assert proc.returncode == 128 + sig, err


def pending(pid: int) -> int:
    """The signals pending for the process ``pid`` as a whole, as a mask."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^ShdPnd:\s*(\w+)", status, re.MULTILINE)[1], 16)


def test_a_ctrl_c_in_the_set_up_ends_the_run_with_130():
    # The terminal's SIGINT reaches the supervisor's process group before the
    # child is in it: the child did not get it, so it is no double to drop.
    def ctrl_c(pid: int, fd: int) -> None:
        os.write(fd, b"\x03")
        deadline = time.monotonic() + 10
        while not pending(pid) & (1 << (signal.SIGINT - 1)):
            assert time.monotonic() < deadline, "the terminal's SIGINT never came"
            time.sleep(0.001)

    for _ in range(5):
        pid, fd = pty.fork()
        if pid == 0:
            os.execvpe(sys.executable, vgpulimit_cmd("run", "--", "sleep", "15"), base_env())
        code = None
        try:
            sent = in_set_up(pid, functools.partial(ctrl_c, pid, fd))
            if not sent:            # too late: end this run, try again
                only_child(pid)
                os.kill(pid, signal.SIGTERM)
            code = exit_code_within(pid, 60)
        finally:
            if code is None:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            os.close(fd)
        if sent:
            break
    assert sent, "the supervisor had its child each time before it could be signalled"
    assert code == 128 + signal.SIGINT


def exit_code_within(pid: int, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        assert time.monotonic() < deadline, f"process {pid} did not end in {seconds} s"
        time.sleep(0.01)


# -- PID 1 of a real container ------------------------------------------------------------------

ORPHAN_CHILD = """
import os, signal, subprocess, sys, time

def on_term(sig, frame):
    os.write(1, b"child got SIGTERM\\n")     # not print(): see SIGNAL_HANDLERS
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
signal.signal(signal.SIGTERM, on_term)

def state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1])        # state, parent
    except (FileNotFoundError, ProcessLookupError):   # reaped before, or while, it was read
        return None

# A grandchild whose parent exits at once: the orphan is reparented to PID 1.
orphan = int(subprocess.run(["sh", "-c", "sleep 600 >/dev/null 2>&1 & echo $!"],
                            capture_output=True, text=True, check=False).stdout)
print("orphan parent", state(orphan)[1], flush=True)
os.kill(orphan, signal.SIGKILL)                  # now it is a zombie until PID 1 reaps it
deadline = time.monotonic() + 30
while state(orphan) is not None and time.monotonic() < deadline:
    time.sleep(0.01)
print("orphan", "reaped" if state(orphan) is None else "left as " + state(orphan)[0], flush=True)
pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
print("zombies", sum(1 for p in pids if (state(p) or ("",))[0] == "Z"), flush=True)
""" + ARMED + 'print("ready", flush=True)\n' + WAIT


def test_as_pid_1_of_a_container_orphans_are_reaped_and_sigterm_ends_it_with_143(tmp_path, runc):
    entrypoint, _ = image_command()
    bundle = make_bundle(tmp_path, [*entrypoint, sys.executable, "-c", ORPHAN_CHILD])
    proc, container_id = bundle.start()
    try:
        lines = [proc.stdout.readline() for _ in range(4)]
        assert lines == ["orphan parent 1\n", "orphan reaped\n", "zombies 0\n", "ready\n"]
        kill = subprocess.run([runc, "kill", container_id, "TERM"], capture_output=True, text=True,
                              check=False)
        assert kill.returncode == 0, kill.stderr
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
        bundle.cleanup()
    assert out == "child got SIGTERM\n"
    assert proc.returncode == 143, err


def test_the_example_image_caps_what_its_command_allocates(tmp_path, runc):
    pytest.importorskip("cuda.bindings")
    entrypoint, cmd = image_command()
    bundle = make_bundle(tmp_path, [*entrypoint, *cmd], {"VGPULIMIT_MEMORY": "1GiB"})
    app = bundle.rootfs / "app"
    app.mkdir()
    shutil.copy(REPO / "examples" / "fill_gpu.py", app / "fill_gpu.py")   # as the image's COPY
    try:
        result = bundle.run()
    finally:
        bundle.cleanup()
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "before: free 1024 MiB of 1024 MiB",
        "block 1: 256 MiB allocated, 256 MiB in all",
        "block 2: 256 MiB allocated, 512 MiB in all",
        "block 3: 256 MiB allocated, 768 MiB in all",
        "block 4: 256 MiB allocated, 1024 MiB in all",
        "block 5: CUDA_ERROR_OUT_OF_MEMORY after 1024 MiB",
        "after: free 0 MiB of 1024 MiB",
    ]


# -- Kubernetes ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def manifests() -> dict[str, dict]:
    yaml = pytest.importorskip("yaml", reason="PyYAML is a test dependency")
    with open(REPO / "deploy" / "vgpulimit.yaml") as file:
        documents = [d for d in yaml.safe_load_all(file) if d]
    return {d["kind"]: d for d in documents}


def test_the_daemonset_installs_the_hook_and_serves_metrics(manifests):
    from vgpulimit.cli import _build_parser
    from vgpulimit.oci import NODE_DIR
    from vgpulimit.oci.hooks_d import HOOKS_D_DIR

    assert set(manifests) == {"Namespace", "DaemonSet", "Service"}
    daemonset, service = manifests["DaemonSet"], manifests["Service"]
    namespace = manifests["Namespace"]["metadata"]["name"]
    assert daemonset["metadata"]["namespace"] == service["metadata"]["namespace"] == namespace
    pod = daemonset["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    assert "nvidia.com/gpu.present" in pod["spec"]["nodeSelector"]

    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["spec"]["volumes"]}
    containers = pod["spec"]["initContainers"] + pod["spec"]["containers"]
    python = f"/opt/vgpulimit/{vgpulimit.__version__}/bin/python"
    commands = {}
    for container in containers:
        assert container["image"].endswith(f":{vgpulimit.__version__}")
        command = container["command"]
        if command[0] == "sh":
            continue
        # Run from the versioned directory that is copied to the same path on the node,
        # with arguments this version understands.
        assert command[:3] == [python, "-m", "vgpulimit"]
        _build_parser().parse_args(command[3:])
        commands[container["name"]] = command[3:]

    def host_path(container: dict, path: str) -> str:
        """The node's path behind ``path`` in ``container``."""
        for mount in container.get("volumeMounts", []):
            if path == mount["mountPath"] or path.startswith(mount["mountPath"] + "/"):
                return volumes[mount["name"]] + path[len(mount["mountPath"]):]
        raise AssertionError(f"{path} is not on a volume of {container['name']}")

    by_name = {c["name"]: c for c in containers}
    install_hook = commands["install-hook"]
    assert install_hook[:2] == ["install-hook", "--dir"]
    assert host_path(by_name["install-hook"], install_hook[2]) == HOOKS_D_DIR
    cdi = commands["install-cdi"]
    assert host_path(by_name["install-cdi"], cdi[cdi.index("--output") + 1]) == \
        "/etc/cdi/vgpulimit.json"
    install_script = by_name["install"]["command"][2]
    assert host_path(by_name["install"], "/host/opt/vgpulimit") == "/opt/vgpulimit"
    assert f"{python} -m vgpulimit libpath" in install_script
    assert f"/host/opt/vgpulimit/{vgpulimit.__version__}" in install_script
    assert "/host/opt/vgpulimit/libvgpulimit.so" in install_script

    metrics = commands["metrics"]
    assert metrics[:2] == ["metrics", "--all"]
    # The hook's regions, and those of HAMi's and KAI's layouts (tests/test_producers.py).
    read = {host_path(by_name["metrics"], metrics[i + 1])
            for i, arg in enumerate(metrics) if arg == "--all"}
    assert read == {NODE_DIR, "/usr/local/vgpu"}
    listen_port = int(metrics[metrics.index("--listen") + 1].rsplit(":", 1)[1])
    [port] = by_name["metrics"]["ports"]
    assert port["containerPort"] == listen_port
    [service_port] = service["spec"]["ports"]
    assert service_port["targetPort"] == port["name"]
    # The node view joins the driver's host pids and sees every GPU through NVML.
    assert pod["spec"]["hostPID"] is True
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in by_name["metrics"]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "utility" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")
    # The Hostname label is the node's name, as DCGM exporter's.
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


# A version in deploy/ (x.y.z, not an address's 0.0.0.0), and before it what
# makes it another project's: the CUDA base image of verify-pod.yaml.
_VERSION_IN_TEXT = re.compile(r"(nvidia/cuda:)?(?<!\d)(?<!\d\.)(\d+\.\d+\.\d+)(?!\.?\d)")


def test_every_version_deploy_spells_is_the_one_meson_build_writes():
    """The image tags, the versioned /opt/vgpulimit/<version> the hook runs
    from, the Containerfile's ARG and the page that explains them: a release
    that forgets one here fails this rather than a node."""
    [written] = re.findall(r"^\s*version:\s*'([^']+)'", (REPO / "meson.build").read_text(),
                           re.MULTILINE)
    assert vgpulimit.__version__ == written, "the installed package is not this tree's: reinstall"
    spelled = []
    for path in sorted((REPO / "deploy").iterdir()):
        for line_number, line in enumerate(path.read_text().splitlines(), 1):
            for m in _VERSION_IN_TEXT.finditer(line):
                if not m[1]:
                    spelled.append((f"{path.name}:{line_number}", m[2]))
    wrong = [(where, found) for where, found in spelled if found != written]
    assert wrong == [], f"deploy/ spells another version than meson.build's {written}: {wrong}"
    # The forms it has today, so that the pattern cannot quietly match none.
    assert {where.split(":")[0] for where, _ in spelled} >= \
        {"Containerfile", "README.md", "verify-pod.yaml", "vgpulimit.yaml"}


def test_the_kubernetes_page_names_the_paths_the_manifests_install(manifests):
    page = (REPO / "deploy" / "README.md").read_text()
    for path in ("/opt/vgpulimit/libvgpulimit.so", "/run/vgpulimit/containers",
                 "CUDA_DEVICE_MEMORY_SHARED_CACHE", "vgpulimit.io/memory"):
        assert path in page

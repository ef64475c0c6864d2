"""A real containerd for the tests, driven through its CRI as kubelet drives it
(docs/kubernetes.md says what was measured and why each setting is here).

containerd is Debian 13's 1.7 or unstable's 2.x (tests/get_containerd.sh
fetches and unpacks it, cached between runs); it runs on a root, state,
sockets, CDI spec directory, runc root and CNI configuration directory of its
own, so nothing of the machine's podman/runc set-up changes.  Pods share the host's network (such a
pod needs no CNI), as kubelet's hostNetwork pods do.

One image, built here and imported with `ctr images import` (no registry): the
rootfs of runc_bundle (its own /etc, /tmp and /run) and a static pause binary
for the sandbox.  A container gets the host's directories bind-mounted
read-only by CRI mounts, as in runc_bundle, so that the installed vgpulimit,
this interpreter and the simulated GPU run inside."""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from conftest import CC, TESTS
from runc_bundle import container_env, host_dirs, make_rootfs

GET_CONTAINERD = TESTS / "get_containerd.sh"
EXITED = 2   # cri_api.v1.api_pb2.CONTAINER_EXITED
CACHE = Path("/var/cache/vgpulimit-tests")
# Debian's suites and the containerd each has: trixie 1.7, sid (unstable) 2.x.
SUITES = ("trixie", "sid")
IMAGE = "vgpulimit.test/node:1"
# Two runtime handlers of one containerd: "runc" forwards no pod or container
# annotation of the user's to the OCI config (containerd's default), and
# "allowlist" forwards vgpulimit's and CDI's, as docs/kubernetes.md says to configure.
PLAIN, ALLOWLIST = "runc", "allowlist"
# A third, with a base runtime spec holding vgpulimit's hook, is there where a
# Containerd is given one (base_spec): the hook then runs for every container.
HOOKED = "hooked"
ALLOWED = ["vgpulimit.io/*", "cdi.k8s.io/*"]


def bindir(suite: str) -> Path:
    return CACHE / f"containerd-{suite}" / "usr" / "bin"


def running(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie holds nothing (the driver frees a
    process's memory at its exit), and who reaps it is the node's init."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def why_no_containerd(suite: str) -> str | None:
    """Why these tests cannot have the containerd of Debian's ``suite`` here, or None."""
    if os.geteuid() != 0:
        return "containerd's CRI with runc without a user namespace needs root"
    if shutil.which("runc") is None:
        return "runc is not installed (.ci/run installs it with apt-get when run as root)"
    if not (bindir(suite) / "containerd").exists():
        if shutil.which("apt-get") is None:
            return f"no containerd of Debian {suite} and no apt-get to fetch it (tests/get_containerd.sh)"
        fetched = subprocess.run([str(GET_CONTAINERD), suite], capture_output=True, text=True,
                                 timeout=600, check=False)
        if fetched.returncode != 0:
            lines = fetched.stderr.strip().splitlines() or ["no message"]
            return f"tests/get_containerd.sh {suite} could not fetch containerd: {lines[-1]}"
    try:
        import cri_api.v1.api_pb2  # noqa: F401
        import grpc  # noqa: F401
    except ImportError as e:
        return f"the CRI client is not installed ({e}; the test extras have it)"
    return None


def _config(base: Path, major: int, base_spec: Path | None = None) -> str:
    """containerd's configuration: version 2 for containerd 1.7, version 3 for
    2.x, whose CRI settings moved to the io.containerd.cri.v1.* plugins."""
    runc = shutil.which("runc")
    if major < 2:
        version, runtime = 2, 'plugins."io.containerd.grpc.v1.cri"'
        images = ""
        sandbox = f'  sandbox_image = "{IMAGE}"'
        snapshotter = f'[{runtime}.containerd]\n  snapshotter = "overlayfs"'
        cni = '  bin_dir = "/usr/lib/cni"'
    else:
        version, runtime = 3, "plugins.'io.containerd.cri.v1.runtime'"
        images = (f"[plugins.'io.containerd.cri.v1.images']\n  snapshotter = \"overlayfs\"\n"
                  f"[plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = \"{IMAGE}\"")
        snapshotter = f"[{runtime}.containerd]"
        sandbox = ""
        cni = '  bin_dirs = ["/usr/lib/cni"]'

    def handler(name: str, allowed: list[str], spec: Path | None = None) -> str:
        return "\n".join([
            f"[{runtime}.containerd.runtimes.{name}]",
            '  runtime_type = "io.containerd.runc.v2"',
            *([f'  base_runtime_spec = "{spec}"'] if spec else []),
            f"  pod_annotations = {json.dumps(allowed)}",
            f"  container_annotations = {json.dumps(allowed)}",
            f"[{runtime}.containerd.runtimes.{name}.options]",
            f'  BinaryName = "{runc}"',
            f'  Root = "{base}/runc"',
            "  SystemdCgroup = false"])

    return f"""version = {version}
root = "{base}/root"
state = "{base}/state"
[grpc]
  address = "{base}/containerd.sock"
[ttrpc]
  address = "{base}/containerd.sock.ttrpc"
{images}
[{runtime}]
  enable_cdi = true
  cdi_spec_dirs = ["{base}/cdi"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
{sandbox}
[{runtime}.cni]
{cni}
  conf_dir = "{base}/cni"
{snapshotter}
  default_runtime_name = "{PLAIN}"
{handler(PLAIN, [])}
{handler(ALLOWLIST, ALLOWED)}
{handler(HOOKED, [], base_spec) if base_spec else ""}
[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = "{base}/nri.sock"
  plugin_path = "{base}/nri/plugins"
  plugin_config_path = "{base}/nri/conf"
"""


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _tar_of(root: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(root.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(root)))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            if info.isfile():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buf.getvalue()


def oci_archive(rootfs: Path, name: str, entrypoint: list[str]) -> bytes:
    """An OCI image-layout tarball of one layer holding ``rootfs``; its name is
    the `io.containerd.image.name` annotation, which `ctr images import` takes."""
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    layer = _tar_of(rootfs)
    config = json.dumps({
        "architecture": arch, "os": "linux",
        "config": {"Entrypoint": entrypoint, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": _digest(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": _digest(layer), "size": len(layer)}]}).encode()
    index = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": _digest(manifest), "size": len(manifest),
                       "platform": {"architecture": arch, "os": "linux"},
                       "annotations": {"io.containerd.image.name": name,
                                       "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}}],
    }).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        files = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": index}
        files |= {f"blobs/sha256/{_digest(b)[7:]}": b for b in (layer, config, manifest)}
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass
class Containerd:
    """containerd with everything of its own under ``base`` (short: sockets)."""

    base: Path
    suite: str = "trixie"
    proc: subprocess.Popen | None = None
    pods: list[str] = field(default_factory=list)
    base_spec: Path | None = None
    wrap: list[str] = field(default_factory=list)   # runs containerd (a mount namespace of its own)

    @property
    def socket(self) -> Path:
        return self.base / "containerd.sock"

    def start(self) -> str | None:
        """Starts containerd and imports the image; returns why it could not, or None."""
        import grpc
        from cri_api.v1 import api_pb2, api_pb2_grpc

        for name in ("cdi", "cni", "node", "logs", "nri/plugins", "nri/conf"):
            (self.base / name).mkdir(parents=True, exist_ok=True)
        self.bindir = bindir(self.suite)
        said = subprocess.run([str(self.bindir / "containerd"), "--version"], capture_output=True,
                              text=True, check=False).stdout
        major = int(said.split()[2].split(".")[0]) if len(said.split()) > 2 else 1
        (self.base / "config.toml").write_text(_config(self.base, major, self.base_spec))
        env = dict(os.environ, PATH=f"{self.bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        self.log = (self.base / "containerd.log").open("w")
        self.proc = subprocess.Popen([*self.wrap, str(self.bindir / "containerd"), "--config",
                                      str(self.base / "config.toml")],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL)
        self.channel = grpc.insecure_channel(f"unix://{self.socket}")
        self.runtime = api_pb2_grpc.RuntimeServiceStub(self.channel)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.version = self.runtime.Version(api_pb2.VersionRequest(), timeout=2)
                break
            except grpc.RpcError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    return f"containerd did not start: {self._last_log_line()}"
                time.sleep(0.05)
        return self._import_image(env)

    def _last_log_line(self) -> str:
        lines = (self.base / "containerd.log").read_text(errors="replace").strip().splitlines()
        return lines[-1] if lines else "no message"

    def _import_image(self, env: dict[str, str]) -> str | None:
        with tempfile.TemporaryDirectory(prefix="vgl-cri-image-") as tmp:
            rootfs = make_rootfs(Path(tmp) / "rootfs")
            built = subprocess.run([CC, "-static", "-O2", "-o", str(rootfs / "pause"),
                                    str(TESTS / "c" / "pause.c")], capture_output=True, text=True,
                                   check=False)
            if built.returncode != 0:
                return f"cannot build the static pause binary: {built.stderr.strip()}"
            archive = Path(tmp) / "image.tar"
            archive.write_bytes(oci_archive(rootfs, IMAGE, ["/pause"]))
            imported = subprocess.run(
                [str(self.bindir / "ctr"), "--address", str(self.socket), "-n", "k8s.io",
                 "images", "import", str(archive)], capture_output=True, text=True, env=env,
                check=False, timeout=120)
        if imported.returncode != 0:
            return f"ctr images import failed: {imported.stderr.strip()}"
        return None

    def stop(self) -> None:
        for pod in list(self.pods):
            self.remove_pod(pod)
        if self.proc is not None:
            self.channel.close()
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.log.close()

    # -- CRI, as kubelet calls it ----------------------------------------------

    def run_pod(self, name: str, namespace: str = "default", handler: str = PLAIN,
                annotations: dict[str, str] | None = None, pid: str = "CONTAINER") -> Pod:
        """RunPodSandbox of a hostNetwork pod, with kubelet's labels; ``pid``:
        its containers' pid namespace, CONTAINER (kubelet's default), POD
        (shareProcessNamespace) or NODE (hostPID)."""
        from cri_api.v1 import api_pb2 as cri

        uid = str(uuid.uuid4())
        logs = self.base / "logs" / f"{namespace}_{name}_{uid}"
        logs.mkdir(parents=True)
        config = cri.PodSandboxConfig(
            metadata=cri.PodSandboxMetadata(name=name, namespace=namespace, uid=uid, attempt=0),
            log_directory=str(logs), annotations=annotations or {},
            labels={"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": namespace,
                    "io.kubernetes.pod.uid": uid},
            linux=cri.LinuxPodSandboxConfig(security_context=cri.LinuxSandboxSecurityContext(
                namespace_options=cri.NamespaceOption(network=cri.NODE, pid=getattr(cri, pid),
                                                      ipc=cri.POD))))
        response = self.runtime.RunPodSandbox(
            cri.RunPodSandboxRequest(config=config, runtime_handler=handler), timeout=60)
        self.pods.append(response.pod_sandbox_id)
        return Pod(self, response.pod_sandbox_id, config, logs)

    def remove_pod(self, pod_id: str) -> None:
        """What kubelet does when a pod is deleted: stop the sandbox (and its
        containers), then remove it."""
        from cri_api.v1 import api_pb2 as cri

        self.runtime.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
        self.runtime.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=pod_id), timeout=60)
        if pod_id in self.pods:
            self.pods.remove(pod_id)

    def status(self, container_id: str):
        from cri_api.v1 import api_pb2 as cri

        return self.runtime.ContainerStatus(
            cri.ContainerStatusRequest(container_id=container_id), timeout=30).status

    def release(self, path: str, *containers: str) -> None:
        """Touches ``path`` in the first container (ExecSync, as `kubectl
        exec` does), which lets the held memory go, and waits until every
        container exited, each with status 0."""
        result = self.exec_sync(containers[0], ["touch", path])
        assert result.exit_code == 0, result.stderr
        for container in containers:
            for _ in range(600):
                status = self.status(container)
                if status.state == EXITED:
                    assert status.exit_code == 0, status.message
                    break
                time.sleep(0.05)
            else:
                raise AssertionError("a container did not exit once released")

    def exec_sync(self, container_id: str, args: list[str], timeout: int = 60):
        from cri_api.v1 import api_pb2 as cri

        return self.runtime.ExecSync(cri.ExecSyncRequest(container_id=container_id, cmd=args,
                                                         timeout=timeout), timeout=timeout + 10)


@dataclass
class Pod:
    cri: Containerd
    id: str
    config: object
    logs: Path
    containers: list[str] = field(default_factory=list)

    def create(self, name: str, args: list[str], annotations: dict[str, str] | None = None,
               cdi_devices: list[str] = (), env: dict[str, str] | None = None,
               mounts: list[tuple[str, str, bool]] = (), host_paths: list[Path] | None = None,
               attempt: int = 0) -> str:
        """CreateContainer of the image running ``args`` with the host's
        directories (``host_paths``, else host_dirs) mounted read-only, the
        simulated GPU's environment, and ``mounts`` (container path, host
        path, read-only) as kubelet passes a device plugin's; ``attempt``:
        kubelet's restart count of the container in its pod."""
        from cri_api.v1 import api_pb2 as cri

        envs = {**container_env(), **(env or {})}
        hosts = host_dirs(self.cri.base) if host_paths is None else host_paths
        config = cri.ContainerConfig(
            metadata=cri.ContainerMetadata(name=name, attempt=attempt),
            image=cri.ImageSpec(image=IMAGE), command=args, working_dir="/",
            envs=[cri.KeyValue(key=k, value=v) for k, v in envs.items()],
            mounts=[*(cri.Mount(container_path=str(d), host_path=str(d), readonly=True) for d in hosts),
                    *(cri.Mount(container_path=c, host_path=h, readonly=ro) for c, h, ro in mounts)],
            annotations=annotations or {},
            labels={"io.kubernetes.container.name": name},
            log_path=f"{name}/{attempt}.log",
            CDI_devices=[cri.CDIDevice(name=d) for d in cdi_devices],
            linux=cri.LinuxContainerConfig(security_context=cri.LinuxContainerSecurityContext(
                namespace_options=self.config.linux.security_context.namespace_options)))
        (self.logs / name).mkdir(exist_ok=True)
        response = self.cri.runtime.CreateContainer(cri.CreateContainerRequest(
            pod_sandbox_id=self.id, config=config, sandbox_config=self.config), timeout=60)
        self.containers.append(response.container_id)
        return response.container_id

    def start(self, container_id: str) -> None:
        from cri_api.v1 import api_pb2 as cri

        self.cri.runtime.StartContainer(cri.StartContainerRequest(container_id=container_id),
                                        timeout=60)

    def output_line(self, name: str, timeout: float = 60, attempt: int = 0) -> str:
        """The first line the container wrote on stdout, from its CRI log
        ("<time> stdout F <line>"), as `kubectl logs` reads it."""
        log = self.logs / name / f"{attempt}.log"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if log.exists():
                for entry in log.read_text().splitlines():
                    _, stream, tag, line = entry.split(" ", 3)
                    if stream == "stdout" and tag == "F":
                        return line
            time.sleep(0.05)
        raise AssertionError(f"container {name} wrote nothing on stdout in {timeout} s")

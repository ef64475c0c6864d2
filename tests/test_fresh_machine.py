"""The front door on a fresh machine: a Debian 12 root bootstrapped with only
the packages the README's "You need" names (and what they depend on, not what
they recommend: the least an apt-get install of them brings), the repository
copied in as a clone has it, and the README's commands run in it exactly as
written -- its "Try it" block (the venv, the install, the main job, whose
output must be the README's sample) and its test command, limited here to
tests/test_docs.py (appended by this test), which proves that the test extras
install and that the suite starts and passes in a venv without the system's
packages.

It needs root, debootstrap (.ci/run installs it) and a Debian 12 archive in
this machine's apt sources; it skips and says which is missing elsewhere.  pip
in the root reaches its index as pip here does: the same PIP_* variables and
configuration files, and the local paths they name mounted read-only.  The
bootstrapped root is kept under CACHE (one, for the README's package list), so
a second run costs the installs and the tests only."""

from __future__ import annotations

import configparser
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT
from test_docs import _commands

pytestmark = pytest.mark.slow

CACHE = Path("/var/cache/vgpulimit-tests")
SUITE = "bookworm"                  # Debian 12
SBIN_PATH = f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin"
PIP_CONFIGS = [Path("/etc/pip.conf"), Path("/etc/xdg/pip/pip.conf"),
               Path.home() / ".config/pip/pip.conf", Path.home() / ".pip/pip.conf"]
README = (ROOT / "README.md").read_text()


def readme_packages() -> list[str]:
    """The Debian packages of the README's "You need"."""
    found = re.search(r"^\*\*You need:\*\*(.*?)^$", README, re.DOTALL | re.MULTILINE)
    assert found, "README.md has no **You need:** paragraph"
    install = re.search(r"`apt-get install ([^`]+)`", found[1].replace("\n", " "))
    assert install, "README.md's You need names no `apt-get install ...` for Debian"
    return install[1].split()


def readme_try_it() -> tuple[list[str], list[str]]:
    """The commands of the README's first console block, and what the last of
    them, the main job, is shown to print."""
    block = re.search(r"^```console\n(.*?)^```", README, re.DOTALL | re.MULTILINE)
    assert block, "README.md has no console block"
    steps = _commands(block[1])
    return [command for command, _ in steps], steps[-1][1]


def readme_test_command() -> str:
    lines = [line for block in re.findall(r"^```sh\n(.*?)^```", README, re.DOTALL | re.MULTILINE)
             for line in block.splitlines() if re.search(r"\bpytest\b", line)]
    assert len(lines) == 1, f"README.md's test command is not one line: {lines}"
    return lines[0]


def debian_archive() -> str | None:
    """The URI of a Debian 12 archive among this machine's apt sources (one-line
    .list entries or deb822 .sources), so that no address is written here."""
    apt = Path("/etc/apt")
    for path in [apt / "sources.list", *sorted((apt / "sources.list.d").glob("*.list"))]:
        for line in path.read_text().splitlines() if path.is_file() else []:
            words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
            if words[:1] == ["deb"] and len(words) > 2 and words[2] == SUITE:
                return words[1]
    for path in sorted((apt / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text()):
            fields = dict(re.findall(r"^([\w-]+):\s*(.*)$", stanza, re.MULTILINE))
            if ("deb" in fields.get("Types", "").split() and SUITE in fields.get("Suites", "").split()
                    and fields.get("Enabled", "yes") != "no"):
                return fields["URIs"].split()[0]
    return None


def bootstrapped_root(packages: list[str], archive: str, debootstrap: str) -> Path:
    """A minimal Debian 12 root with `packages`, made once for that list."""
    key = hashlib.sha256(f"{SUITE} minbase {' '.join(sorted(packages))}".encode()).hexdigest()
    made = CACHE / f"debian12-{key[:16]}"
    if (made / "root").is_dir():
        return made / "root"
    for stale in CACHE.glob("debian12-*"):    # an earlier package list: its root is of no use
        shutil.rmtree(stale)
    building = made / "root.partial"
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    result = subprocess.run([debootstrap, "--variant=minbase", f"--include={','.join(packages)}",
                             SUITE, str(building), archive],
                            capture_output=True, text=True, timeout=900, check=False)
    assert result.returncode == 0, f"debootstrap failed:\n{result.stdout[-3000:]}{result.stderr}"
    building.rename(made / "root")
    return made / "root"


def pip_as_here() -> tuple[dict[str, str], list[Path], list[Path]]:
    """pip's set-up on this machine: its PIP_* variables, its configuration
    files, and the local paths they name (indexes, certificates, constraints)."""
    env = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}
    configs = [path for path in PIP_CONFIGS if path.is_file()]
    texts = [*env.values()]
    for path in configs:
        parser = configparser.ConfigParser(interpolation=None)
        parser.read(path)
        texts += [value for section in parser.values() for value in section.values()]
    words = [word for text in texts for word in text.split()]
    # A local index's pages link to files beside it (simple/ to ../files/): its parent too.
    named = {Path(w.removeprefix("file://")).parent for w in words if w.startswith("file:///")}
    named |= {Path(w) for w in words if w.startswith("/")}
    return env, configs, sorted(p for p in named if p.exists() and not p.is_relative_to("/proc"))


# A mount namespace (nothing mounted outlives the run) and a PID namespace (a
# run killed at its timeout leaves no process behind).
NAMESPACES = ["unshare", "--mount", "--pid", "--fork", "--kill-child"]


# Run on this machine, in NAMESPACES: the root, fresh (an overlay on the
# cached one, or a copy where no overlay can be mounted), with /proc, /dev,
# /run and the repository.
ENTER = r"""
set -euo pipefail
mount -t overlay overlay -o "lowerdir=$CACHED,upperdir=$WORK/upper,workdir=$WORK/work" "$NEW" \
    2>/dev/null || cp -a "$CACHED/." "$NEW"
mount -t proc proc "$NEW/proc"
mount --bind /dev "$NEW/dev"
mount -t tmpfs tmpfs "$NEW/dev/shm"
mount -t tmpfs tmpfs "$NEW/run"
mkdir -p "$NEW/out" && mount --bind "$WORK/out" "$NEW/out"
cp -L /etc/resolv.conf "$NEW/etc/resolv.conf"
IFS=$'\n'
for config in $PIP_CONFIGS; do mkdir -p "$NEW$(dirname "$config")"; cp "$config" "$NEW$config"; done
for path in $PIP_PATHS; do
    if [ -d "$path" ]; then mkdir -p "$NEW$path"; else mkdir -p "$NEW$(dirname "$path")"; touch "$NEW$path"; fi
    mount --bind "$path" "$NEW$path" && mount -o remount,bind,ro "$NEW$path"
done
mkdir "$NEW/root/vgpulimit" && tar -x -C "$NEW/root/vgpulimit" -f "$WORK/source.tar"
exec chroot "$NEW" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$@" bash /out/readme.sh
"""


def source_tar(path: Path) -> None:
    """The repository as a clone of it has it (tracked and new files, nothing ignored)."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "-co", "--exclude-standard"],
                            capture_output=True, check=True).stdout.split(b"\0")
    names = b"\0".join(n for n in listed if n and (ROOT / os.fsdecode(n)).is_file())
    subprocess.run(["tar", "-c", "-f", str(path), "-C", str(ROOT), "--null", "-T", "-"],
                   input=names, check=True)


def can_bootstrap_or_skip() -> tuple[str, str]:
    """debootstrap's path and the archive to bootstrap from, or a skip that says
    what is missing."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to bootstrap a Debian root and chroot into it")
    debootstrap = shutil.which("debootstrap", path=SBIN_PATH)
    if debootstrap is None:
        pytest.skip("debootstrap is not installed (.ci/run installs it with apt-get, as root)")
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the repository as a git checkout, to copy it as a clone has it")
    archive = debian_archive()
    if archive is None:
        pytest.skip(f"no Debian 12 ({SUITE}) archive in this machine's apt sources")
    probe = subprocess.run([*NAMESPACES, "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount and PID namespace here: {probe.stderr.strip()}")
    return debootstrap, archive


def test_the_readmes_commands_work_as_written_on_a_fresh_debian_12(tmp_path):
    debootstrap, archive = can_bootstrap_or_skip()
    cached = bootstrapped_root(readme_packages(), archive, debootstrap)
    commands, shown = readme_try_it()
    test_command = f"{readme_test_command()} tests/test_docs.py"
    for name in ("upper", "work", "new", "out"):
        (tmp_path / name).mkdir()
    source_tar(tmp_path / "source.tar")
    # The main job's output goes to a file as well, to be compared with the sample.
    script = ["set -euo pipefail", "cd /root/vgpulimit", *commands[:-1],
              f"{{ {commands[-1]}\n}} | tee /out/main.txt", test_command]
    (tmp_path / "out" / "readme.sh").write_text("\n".join(script) + "\n")

    pip_env, pip_configs, pip_paths = pip_as_here()
    env = dict(os.environ, CACHED=str(cached), WORK=str(tmp_path), NEW=str(tmp_path / "new"),
               PIP_CONFIGS="\n".join(map(str, pip_configs)), PIP_PATHS="\n".join(map(str, pip_paths)))
    pip_vars = [f"{k}={v}" for k, v in pip_env.items()]
    try:
        with open(tmp_path / "log", "w+") as log:
            result = subprocess.run([*NAMESPACES, "bash", "-c", ENTER, "enter", *pip_vars],
                                    env=env, stdout=log, stderr=subprocess.STDOUT, timeout=1500,
                                    check=False)
            log.seek(0)
            output = log.read()
    finally:    # the root's changes (a venv, builds: about 1 GB); the log and out/ are kept
        for name in ("upper", "work", "new"):
            shutil.rmtree(tmp_path / name)
    assert result.returncode == 0, "in the fresh root:\n" + "\n".join(script) + "\n...\n" \
                                   + output[-6000:]
    main_job = (tmp_path / "out" / "main.txt").read_text().splitlines()
    assert main_job == shown, f"{commands[-1]} printed:\n" + "\n".join(main_job)
    summary = output.rstrip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary, output[-3000:]

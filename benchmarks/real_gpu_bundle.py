"""Carries the project to a lent GPU machine for benchmarks/real_gpu.py.

Such a machine has Python 3.12 with PyTorch, CuPy, JAX, nvidia-ml-py, psutil,
rich and prometheus-client, but no network, no cffi and no meson-python, so
vgpulimit cannot be built or installed there from source.  The bundle is a
folder of wheels (.whl/, ignored by git) that travels with the working tree:
the project's own wheel for CPython 3.12 (built here), cffi's (its compiled
module's runtime), and those of nvitop and gpustat (and gpustat's blessed,
wcwidth, jinxed) for their rows.

    python benchmarks/real_gpu_bundle.py build [--python PYTHON3.12]   # .whl/, from PyPI and this tree
    python benchmarks/real_gpu_bundle.py check                         # one wheel of each, cp312
    python benchmarks/real_gpu_bundle.py command                       # the one call for the device tool
    python benchmarks/real_gpu_bundle.py dry-run [--python PYTHON3.12] # that call's steps here, --simulate

`command` prints what the device tool's `run` takes (at most 2000 characters,
`.whl` in `carry`); docs/real-gpu.md ("Check it on your GPU") shows the same.
`dry-run` runs that command with bash in a copy of the working tree, with the
3.12 interpreter for `python3`, the packages the machine has installed into a
folder of their own, and `--simulate --quick` appended: everything but the
GPU.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BUNDLE = ROOT / ".whl"
CARRY_LIMIT_BYTES = 64 << 20          # the device tool carries at most 64 MiB, working tree included

# The wheels carried beside the project's, at the versions its test extras run
# with.  gpustat publishes no wheel (an sdist only): it is built here.
CARRIED = {"cffi": "2.0.0", "nvitop": "1.7.2", "gpustat": "1.1.1", "blessed": "1.52.0",
           "wcwidth": "0.9.4", "jinxed": "2.1.0"}
BUILT_FROM_SDIST = {"gpustat"}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# What the machine's Python has already (KINDS.md of the device tool): the
# project's run-time dependencies but cffi.  dry-run installs them apart.
ON_THE_MACHINE = ("rich", "prometheus-client", "nvidia-ml-py", "psutil")

SOURCE_FILE = "SOURCE"               # the commit the bundle's wheel was built from
SITE = "/tmp/site"
DEVICE_TIMEOUT_S = 600
COMMAND = (
    "set -o pipefail; export PYTHONUNBUFFERED=1; "
    "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "
    "--target {site} .whl/*.whl || exit 1; "
    "export PYTHONPATH={site}${{PYTHONPATH:+:$PYTHONPATH}} PATH={site}/bin:$PATH; "
    "nvidia-smi -L; python3 -m vgpulimit --version; "
    "timeout 570 python3 benchmarks/real_gpu.py --out $OUT{extra} 2>&1 | tee $OUT/real_gpu.log"
)


def command(site: str = SITE, extra: str = "") -> str:
    """The device tool's command: install the bundle, run the table into $OUT."""
    return COMMAND.format(site=site, extra=extra)


def wheel_name(path: Path) -> str:
    """The distribution's normalised name, from the wheel's file name."""
    return re.sub(r"[-_.]+", "-", path.name.split("-")[0]).lower()


def check(bundle: Path) -> list[str]:
    """What is wrong with the bundle ([] when nothing is)."""
    if not bundle.is_dir():
        return [f"{bundle} does not exist: python benchmarks/real_gpu_bundle.py build"]
    wheels = sorted(bundle.glob("*.whl"))
    problems = []
    by_name: dict[str, list[str]] = {}
    for wheel in wheels:
        by_name.setdefault(wheel_name(wheel), []).append(wheel.name)
    for name in ["vgpulimit", *CARRIED]:
        found = by_name.get(name, [])
        if not found:
            problems.append(f"no wheel of {name}")
        elif len(found) > 1:
            problems.append(f"{len(found)} wheels of {name} (pip stops at two): {', '.join(found)}")
    for name in ("vgpulimit", "cffi"):
        for file in by_name.get(name, []):
            if "-cp312-" not in file or "x86_64" not in file:
                problems.append(f"{file} is not for CPython 3.12 on x86_64")
    extra = sorted(set(by_name) - {"vgpulimit", *CARRIED})
    if extra:
        problems.append(f"wheels nobody asked for: {', '.join(extra)}")
    total = sum(w.stat().st_size for w in wheels)
    if total > CARRY_LIMIT_BYTES // 2:
        problems.append(f"{total >> 20} MiB of wheels: the device tool carries 64 MiB in all")
    return problems


def pip(python: str, *args: str) -> None:
    subprocess.run([python, "-m", "pip", *args], check=True)


def build(python: str, bundle: Path) -> None:
    version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    if version != "3.12":
        raise SystemExit(f"real_gpu_bundle: {python} is Python {version}; the lent machines run 3.12 "
                         "(--python python3.12, e.g. from pyenv)")
    bundle.mkdir(exist_ok=True)
    for old in bundle.glob("*.whl"):
        old.unlink()
    # The project's wheel: pip fetches meson-python, meson, ninja and cffi to build it.
    pip(python, "wheel", "-q", "--no-deps", "-w", str(bundle), str(ROOT))
    binary = [f"{name}=={v}" for name, v in CARRIED.items() if name not in BUILT_FROM_SDIST]
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    pip(python, "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
        "--implementation", "cp", *platforms, "-d", str(bundle), *binary)
    pip(python, "wheel", "-q", "--no-deps", "-w", str(bundle),
        *[f"{name}=={CARRIED[name]}" for name in sorted(BUILT_FROM_SDIST)])
    # The machine gets no .git: the table names the tree the wheel was built from.
    described = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                               capture_output=True, text=True, check=False).stdout.strip()
    (bundle / SOURCE_FILE).write_text(f"{described or 'unknown'}\n")


def working_tree(dest: Path) -> None:
    """What the device tool sends: tracked files and untracked ones git does
    not ignore (the bundle is carried on top)."""
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], capture_output=True, text=True, check=True).stdout
    for name in filter(None, files.split("\0")):
        source = ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


def dry_run(python: str, bundle: Path) -> int:
    """The device command's steps here: a copy of the working tree, the
    bundle carried into it, the machine's own packages in a folder of their
    own, `python3` the 3.12 interpreter, the run on the simulated GPU."""
    problems = check(bundle)
    if problems:
        print("real_gpu_bundle: the bundle is not ready:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="real_gpu_dry-") as tmp:
        tmp_path = Path(tmp)
        tree, image, site, out, bin_dir = (tmp_path / d for d in ("tree", "image", "site", "out", "bin"))
        for folder in (tree, image, out, bin_dir):
            folder.mkdir()
        working_tree(tree)
        shutil.copytree(bundle, tree / ".whl")
        pip(python, "install", "-q", "--target", str(image), *ON_THE_MACHINE)
        (bin_dir / "python3").symlink_to(shutil.which(python) or python)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("VGPULIMIT_", "SIMGPU_", "VIRTUAL_ENV")) and k not in ("LD_PRELOAD",)}
        env.update(PATH=f"{bin_dir}:/usr/bin:/bin", PYTHONPATH=str(image), OUT=str(out), PYTHONNOUSERSITE="1")
        line = command(site=str(site), extra=" --simulate --quick")
        print(f"$ {line}", flush=True)
        result = subprocess.run(["bash", "-c", line], cwd=tree, env=env, check=False)
        print(f"exit {result.returncode}; $OUT holds: {', '.join(sorted(p.name for p in out.iterdir()))}")
        return result.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["build", "check", "command", "dry-run"])
    parser.add_argument("--python", default="python3.12", help="a CPython 3.12 with pip (default python3.12)")
    parser.add_argument("--dir", type=Path, default=BUNDLE, help="the bundle (default .whl/ in the repository)")
    args = parser.parse_args(argv)
    if args.action == "command":
        print(command())
        return 0
    if args.action == "build":
        build(args.python, args.dir)
    if args.action == "dry-run":
        return dry_run(args.python, args.dir)
    problems = check(args.dir)
    for wheel in sorted(args.dir.glob("*.whl")):
        print(f"{wheel.stat().st_size >> 10:6d} KiB  {wheel.name}")
    for line in problems:
        print(f"problem: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

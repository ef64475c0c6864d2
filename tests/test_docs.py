"""The commands the README and docs/ show, run: each `$ command` of a
```console block runs here, on the simulated GPU as the page sets it up
(its own `export`s, simgpu's default board), and what it prints has the shape
of the sample under it -- as many lines, each with as many columns, the
tables' header lines word for word, a JSON line with the same keys, and the
figures that matter (a cap, a measured share) within a tolerance -- so a
sample cannot go stale.  Every `vgpulimit` command of a ```sh block, which
may need a real GPU or a node, is parsed by the CLI's own parser, so no page
shows a flag that is gone."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, base_env

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.DOTALL | re.MULTILINE)
_HEADER = re.compile(r"^[A-Z][A-Z ]+$")


def _blocks(kind: str) -> list[tuple[str, str]]:
    return [(f"{page.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}", m[2])
            for page in PAGES for text in [page.read_text()]
            for m in _FENCE.finditer(text) if m[1] == kind]


def _commands(block: str) -> list[tuple[str, list[str]]]:
    """A console block's commands (continuation lines joined), each with the
    lines it shows printed."""
    steps: list[tuple[str, list[str]]] = []
    lines = iter(block.splitlines())
    for line in lines:
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\"):
                command = command[:-1] + next(lines).strip()
            steps.append((command, []))
        elif steps:
            steps[-1][1].append(line)
    return steps


def _fields(line: str) -> list[str]:
    return [f for f in re.split(r"\s{2,}", line.strip()) if f]


# Table columns whose figures a sample holds, not only their shape: the caps
# as shown, a measured share within (points below, points above) the sample's.
# A share is a ceiling: above it is the shim's fault, below it may be a CPU
# too busy to keep the GPU fed (a loaded CI runner), so more is allowed below.
HELD_POINTS = {"LIMIT": (0, 0), "COMPUTE CAP": (0, 0), "MEASURED SHARE": (10, 5)}


def _held(header: list[str], shown: list[str], printed: list[str]) -> str | None:
    for column, (below, above) in HELD_POINTS.items():
        if column in header and len(shown) == len(header) == len(printed):
            i = header.index(column)
            want, got = shown[i].rstrip("%"), printed[i].rstrip("%")
            near = want.isdigit() and got.isdigit() and -below <= int(got) - int(want) <= above
            if want != got and not near:
                return f"{column} {printed[i]}, shown {shown[i]} (-{below}/+{above})"
    return None


def _same_shape(sample: list[str], real: list[str]) -> str | None:
    """What differs in shape, or in a figure HELD_POINTS holds; None when nothing does."""
    if len(sample) != len(real):
        return f"{len(real)} lines printed, {len(sample)} shown"
    header: list[str] = []
    for shown, printed in zip(sample, real):
        if shown.startswith("{"):
            if set(json.loads(shown)) != set(json.loads(printed)):
                return f"JSON keys differ: {printed!r} vs {shown!r}"
        elif all(_HEADER.match(field) for field in _fields(shown)) and _fields(shown):
            if _fields(shown) != _fields(printed):
                return f"header {printed!r}, shown {shown!r}"
            header = _fields(shown)
        elif len(_fields(shown)) != len(_fields(printed)):
            return f"line {printed!r} has other columns than {shown!r}"
        elif wrong := _held(header, _fields(shown), _fields(printed)):
            return wrong
    return None


CONSOLE = _blocks("console")


@pytest.mark.parametrize("where,block", CONSOLE, ids=[where for where, _ in CONSOLE])
def test_a_console_sample_is_what_its_commands_print(where, block, tmp_path):
    # `vgpulimit` and `python3` as the pages write them: this interpreter's, the installed package.
    # A script that execs it, not a symlink: a venv's Python started through a
    # symlink elsewhere finds no pyvenv.cfg beside it, and runs without the venv.
    bin_dir = Path(sys.executable).parent
    (tmp_path / "bin").mkdir()
    for name in ("python3", "python"):
        wrapper = tmp_path / "bin" / name
        wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
        wrapper.chmod(0o755)
    env = base_env(SIMGPU_STATE=str(tmp_path / "simgpu.state"), XDG_RUNTIME_DIR=str(tmp_path))
    env["PATH"] = f"{tmp_path / 'bin'}:{bin_dir}:{env.get('PATH', '')}"
    for command, shown in _commands(block):
        words = shlex.split(command)
        if words[:2] == ["pip", "install"] or words[:3] == ["python3", "-m", "venv"]:
            continue   # the suite runs on the installed package, in its own interpreter
        if "numba" in command:
            pytest.importorskip("numba.cuda", reason="numba-cuda is not installed (pip install '.[test]')")
        if words[0] == "export":
            env.update(word.split("=", 1) for word in words[1:])
            continue
        for i, word in enumerate(words[:-1]):   # a page's fixed region: made afresh here
            if word == "--region" and words[0] == "vgpulimit" and words[1] == "run":
                Path(words[i + 1]).unlink(missing_ok=True)
        result = subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True,
                                text=True, timeout=120, check=False)
        assert result.returncode == 0, f"{where}: {command}\n{result.stderr}"
        wrong = _same_shape(shown, result.stdout.splitlines())
        assert wrong is None, f"{where}: {command}: {wrong}\n{result.stdout}"


def test_a_held_figure_is_held():
    header = ["DEVICE", "COMPUTE CAP", "MEASURED SHARE"]
    assert _held(header, ["0", "50%", "52%"], ["0", "50%", "44%"]) is None
    assert _held(header, ["0", "50%", "52%"], ["0", "50%", "58%"]) == "MEASURED SHARE 58%, shown 52% (-10/+5)"
    assert _held(header, ["0", "50%", "52%"], ["0", "50%", "41%"]) is not None
    assert _held(header, ["0", "50%", "52%"], ["0", "40%", "52%"]) is not None


def test_every_vgpulimit_command_shown_parses():
    from vgpulimit.cli import _build_parser
    from vgpulimit.errors import UsageError

    shown = []
    for where, block in _blocks("sh") + CONSOLE:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0].strip().removeprefix("$ ")
            if line.startswith("vgpulimit "):
                shown.append((where, shlex.split(line.split(" && ")[0].split(" -- ")[0])[1:]))
    assert len(shown) >= 5
    for where, args in shown:
        try:
            _build_parser().parse_args(args)
        except UsageError as exc:   # a flag or command that is gone
            raise AssertionError(f"{where}: vgpulimit {' '.join(args)}: {exc}") from None


def test_the_pages_link_to_pages_that_are_there():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith("http"):
                assert (page.parent / target).exists(), f"{page.name} links to {target}, which is not there"


def test_the_readme_is_a_front_door():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200

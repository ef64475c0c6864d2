"""The repository passes ruff with the project's configuration (pyproject.toml):
among its rules, the wall that keeps the terminal UI (rich, vgpulimit.top) out
of the library modules.  And it stands alone: no source, test or page cites a
document outside it (the facts they rely on are in docs/facts.md and
docs/mig-facts.md, the schemas in tests/data/schemas)."""

import re
import subprocess
import sys

import pytest
from conftest import ROOT


def test_ruff_finds_nothing():
    try:
        import ruff  # noqa: F401  (the test extras install it)
    except ImportError:
        pytest.skip("ruff is not installed (pip install '.[test]' installs it)")
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache",
                             "--output-format", "concise", str(ROOT)],
                            capture_output=True, text=True, cwd=ROOT, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


_SOURCES = ("src", "shim", "base", "simgpu", "tests", "docs", "benchmarks", "examples", "deploy", "hooks",
            "cross", ".ci")
_OUTSIDE = re.compile(r"\.\./shared\b|(?<![\w.-])(?:FACTS|MIG|MEMORY|CHECKPOINT|DESIGN|STYLE)\.md\b")


def test_nothing_cites_a_document_outside_the_repository():
    files = [ROOT / "README.md", ROOT / "meson.build", ROOT / "pyproject.toml",
             *(path for top in _SOURCES for path in (ROOT / top).rglob("*")
               if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc")]
    assert len(files) > 200   # the reader sees the tree
    cited = {str(path.relative_to(ROOT)): sorted(set(_OUTSIDE.findall(text)))
             for path in files if path.suffix not in (".so", ".o", ".a") and path.name != "test_lint.py"
             for text in [path.read_text(errors="replace")] if _OUTSIDE.search(text)}
    assert cited == {}
    # The reader finds a citation where there is one (this file's own are such).
    assert _OUTSIDE.search("as measured (../shared/FACTS.md)") and _OUTSIDE.search("(MIG.md 1.3)")

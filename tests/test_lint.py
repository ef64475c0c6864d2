"""The repository passes ruff with the project's configuration (pyproject.toml):
among its rules, the wall that keeps the terminal UI (rich, vgpulimit.top) out
of the library modules."""

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

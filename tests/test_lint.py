"""The repository passes ruff with the project's configuration (pyproject.toml):
among its rules, the wall that keeps the terminal UI (rich, vgpulimit.top) out
of the library modules.  And it stands alone: no source, test or page cites a
document outside it (the facts they rely on are in docs/facts.md and
docs/mig-facts.md, the schemas in tests/data/schemas).  No function of the
C (the shim, its base, the simulated GPU) is longer than 120 lines."""

import re
import subprocess
import sys

import pytest
from conftest import BASE, ROOT, SHIM_SRC


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


def _function_lengths(text: str) -> dict[str, int]:
    """Each function's length in lines, from the `{` that starts its body at
    the line's start to the `}` that ends it there (the project's layout;
    a table's `= {` ends its first line, so tables are not counted)."""
    lines = text.splitlines()
    lengths, start = {}, None
    for i, line in enumerate(lines):
        if line.startswith("{"):
            start = i
        elif line.startswith("}") and start is not None:
            head = start - 1
            while head > 0 and lines[head][:1].isspace():
                head -= 1   # a signature continued over several lines
            name = re.findall(r"(\w+)\s*\(", lines[head]) if head >= 0 else []
            lengths[name[0] if name else f"line {start + 1}"] = i - start + 1
            start = None
    return lengths


def test_no_c_function_is_longer_than_120_lines():
    files = [*BASE.glob("*.c"), *SHIM_SRC.glob("*.c"), *(ROOT / "simgpu").glob("*.c")]
    long = {f"{path.relative_to(ROOT)}: {name}": n for path in files
            for name, n in _function_lengths(path.read_text()).items() if n > 120}
    assert long == {}
    # The reader sees functions, and a long one.
    assert _function_lengths("int f(void)\n{\n" + "    x();\n" * 130 + "}\n") == {"f": 132}


def _hooks_that_do_not_ask(sources: dict[str, str], hooks: list[str]) -> list[str]:
    """The hooks whose body, or that of the function it hands the call to,
    does not open with VGL_ASKS (a launch asks at its gate)."""
    bodies = {m["name"]: m["body"] or m["line"] for text in sources.values()
              for m in re.finditer(r"^\w[\w ]*?\b(?P<name>\w+)\([^;{]*?\)(?:\n\{\n(?P<body>.*?)^\}| \{ (?P<line>[^\n]*) \}$)",
                                   text, re.MULTILINE | re.DOTALL)}

    def asks(name: str, depth: int = 0) -> bool:
        body = bodies.get(name, "")
        if body.lstrip().startswith("VGL_ASKS();") or "gate_enter(" in body:
            return True
        return depth == 0 and any(asks(called, 1) for called in re.findall(r"return (\w+)\(", body))
    return [h for h in hooks if not asks(h)]


def test_every_hook_that_calls_the_driver_asks_to_be_resumed():
    """resume_ask.c: a suspended container's call that did not ask would wait
    unheard.  The checkpoint calls (another process's) and cuGetProcAddress
    (no work) are the exceptions."""
    hooks = [h for h in re.findall(r"^CU_HOOK\((\w+),", (SHIM_SRC / "hooks.def").read_text(), re.MULTILINE)
             if not h.startswith(("cuCheckpointProcess", "cuGetProcAddress"))]
    sources = {p.name: p.read_text() for p in SHIM_SRC.glob("*.c")}
    assert len(hooks) > 70
    assert _hooks_that_do_not_ask(sources, hooks) == []
    # The reader sees a hook that forgot, and one that hands its call on.
    sample = {"x.c": "CUresult cuA(int a)\n{\n    return real(a);\n}\n"
                     "CUresult cuB(void) { return b_common(1); }\n"
                     "static CUresult b_common(int v)\n{\n    VGL_ASKS();\n    return real(v);\n}\n"}
    assert _hooks_that_do_not_ask(sample, ["cuA", "cuB"]) == ["cuA"]

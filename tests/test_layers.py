"""The layers, read from the sources.  The C code's: the base calls nothing
above it, the core (what the Python binding links too) nothing of the preload
library, no two files of the shim call each other, round a circle of any
length, nor two files of the simulated GPU, and the simulated driver includes
nothing of the shim; priorities and elastic memory see the node's board and
the beacons through one file.  The Python package's: no two modules import each other round a
circle, no module but the CLI imports a renderer, and verify does not import
the supervisor.  docs/architecture.md draws them."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from conftest import BASE, ROOT, SHIM_SRC

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.DOTALL)
SIMGPU = ROOT / "simgpu"


def _defined(prefix: str) -> re.Pattern[str]:
    """A definition of a `prefix` name starts a line, outside `static`: a
    function, or a variable."""
    return re.compile(rf"^(?!static\b)(?!extern\b)[A-Za-z_][\w \*\(\)]*?\b({prefix}\w+)\s*(?:\(|=|;|\[)",
                      re.MULTILINE)


def _shim_files() -> list[Path]:
    """The C files of the base and the shim, whose shared names start vgl_."""
    return [*sorted(BASE.glob("*.c")), *sorted(SHIM_SRC.glob("*.c"))]


def _sources(files: Iterable[Path]) -> dict[str, str]:
    return {path.relative_to(ROOT).as_posix(): _COMMENT.sub("", path.read_text()) for path in files}


def _calls(prefix: str = "vgl_", files: Iterable[Path] | None = None) -> dict[str, set[str]]:
    """file -> the other files whose `prefix` names it uses, among `files`
    (the base's and the shim's unless given)."""
    sources = _sources(_shim_files() if files is None else files)
    defined = _defined(prefix)
    owner = {}
    for path, text in sources.items():
        for name in defined.findall(text):
            owner.setdefault(name, path)
    return {path: {owner[name] for name in re.findall(rf"\b{prefix}\w+\b", text)
                   if owner.get(name, path) != path}
            for path, text in sources.items()}


def _core_files() -> set[str]:
    """The sources of vgl_core, as shim/meson.build lists them."""
    build = (SHIM_SRC.parent / "meson.build").read_text()
    core = re.search(r"vgl_core = static_library\('vglcore',\s*files\((.*?)\)", build, re.DOTALL)
    assert core, "shim/meson.build no longer defines vgl_core"
    return {f"shim/{name}" for name in re.findall(r"'([^']+\.c)'", core[1])}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one file (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_reader_sees_the_calls_it_checks():
    calls = _calls()
    assert "shim/src/ledger.c" in calls["shim/src/region.c"]
    assert "base/identity.c" in calls["shim/src/slot_owner.c"]
    assert "shim/src/accounting.c" in calls["shim/src/charge.c"]


def test_no_two_files_call_each_other_round_a_circle():
    calls = _calls()
    assert _circles(calls) == []
    # The reader finds one when there is one.
    assert _circles({**calls, "shim/src/ledger.c": calls["shim/src/ledger.c"] | {
        "shim/src/region.c"}}) != []


def test_the_measurement_calls_neither_the_driver_nor_the_share():
    """busy_time.c is given the driver's events and hands settlements back:
    the launch hook calls it, and it calls only the cost model and the log."""
    calls = _calls()
    assert "shim/src/busy_time.c" in calls["shim/src/launch_hooks.c"]
    assert calls["shim/src/busy_time.c"] <= {"shim/src/cost_model.c", "shim/src/log.c"}


def test_priorities_and_elastic_memory_see_the_board_through_one_file():
    """beacons.c maps the node's board and the container's beacon, once per
    process, and reads the other containers' beacons; priority.c and
    elastic.c use it, neither calls the other, and neither opens, maps or
    reads a file itself."""
    calls = _calls()
    priority, elastic = "shim/src/priority.c", "shim/src/elastic.c"
    assert "shim/src/beacons.c" in calls[priority] and "shim/src/beacons.c" in calls[elastic]
    assert priority not in calls[elastic] and elastic not in calls[priority]
    sources = _sources([ROOT / priority, ROOT / elastic])
    for path, text in sources.items():
        assert re.findall(r"\b(open|mmap|pread|fstat|stat)\s*\(", text) == [], path


# -- the simulated GPU --------------------------------------------------------------------

def _simgpu_calls() -> dict[str, set[str]]:
    return _calls("sim_", sorted(SIMGPU.glob("*.c")))


def test_the_reader_sees_simgpus_calls():
    calls = _simgpu_calls()
    assert "simgpu/memory.c" in calls["simgpu/pools.c"]
    assert "simgpu/contexts.c" in calls["simgpu/memory.c"]
    assert "simgpu/graph_memory.c" in calls["simgpu/graphs.c"]
    assert "simgpu/state.c" in calls["simgpu/contexts.c"]


def test_no_two_simgpu_files_call_each_other_round_a_circle():
    """What every family asks sits low (initialized.c: whether cuInit succeeded;
    contexts.c: the current context; memory.c: the table of device memory;
    state.c: the machine-wide file, whose repair of a dead process's
    timeline is its own), and what reaches into every family high, above
    them: init.c (cuInit, fork), context_teardown.c (a context's end),
    frees.c (a free by address)."""
    calls = _simgpu_calls()
    assert _circles(calls) == []
    # The reader finds one when there is one.
    assert _circles({**calls, "simgpu/devices.c": calls["simgpu/devices.c"] | {
        "simgpu/contexts.c"}}) != []


def test_the_base_calls_nothing_above_it():
    for path, used in _calls().items():
        if path.startswith("base/"):
            assert {u for u in used if not u.startswith("base/")} == set(), path


def test_the_core_calls_nothing_of_the_preload_library():
    core = _core_files()
    assert "shim/src/region.c" in core and "shim/src/hooks.c" not in core
    for path in core:
        assert {u for u in _calls()[path] if u.startswith("shim/") and u not in core} == set(), path


# -- the Python package ----------------------------------------------------------------------

PACKAGE = ROOT / "src" / "vgpulimit"
# What writes the views out for people and scripts (nvitop's tui): the text and
# JSON of status (render), its CSV (query), the live terminal view (top), the
# Prometheus series (metrics, served by metrics_server), a MIG plan
# (mig.render).  Their models (status.py, node.py, mig.plan: nvitop's api) and
# everything else never import them; a renderer may use another's display
# helpers (top draws with render's).
RENDERERS = {"vgpulimit.render", "vgpulimit.query", "vgpulimit.top", "vgpulimit.metrics",
             "vgpulimit.mig.render"}
# The CLI: a package, one module per command or family (cli/run.py,
# cli/views.py, ...), every one of them the front.
FRONT = "vgpulimit.cli"


def _front(name: str) -> bool:
    return name == FRONT or name.startswith(FRONT + ".")


def test_simgpu_includes_nothing_of_the_shim():
    """The simulated driver and the shim share the ABI headers (base/vgpulimit/)
    and the base, never a header of the shim: a constant wrong there would be
    wrong on both sides at once, and no test could see it."""
    simgpu = ROOT / "simgpu"
    includes = {path.name: re.findall(r'^\s*#\s*include\s*"([^"]+)"', path.read_text(), re.MULTILINE)
                for path in [*simgpu.glob("*.c"), *simgpu.glob("*.h")]}
    assert sum(map(len, includes.values())) > 20  # the reader sees them
    build = (simgpu / "meson.build").read_text()
    generated = set(re.findall(r"output: '([^']+)'", build))  # by simgpu's own generators
    own = {path.name for path in simgpu.iterdir()} | generated | {p.relative_to(BASE).as_posix()
                                                                  for p in BASE.rglob("*.h")}
    assert {name: [i for i in found if i not in own] for name, found in includes.items()
            if any(i not in own for i in found)} == {}
    assert "shim_inc" not in build


def _module_name(path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _python_imports() -> dict[str, set[str]]:
    """module -> the package's modules it imports, at its top or inside a
    function (an import put off until a call is a dependency all the same)."""
    import ast

    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                    + ([base] if base else []))
                found.add(base)
                found |= {f"{base}.{alias.name}" for alias in node.names}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def test_the_python_reader_sees_the_imports_it_checks():
    graph = _python_imports()
    assert "vgpulimit.region" in graph["vgpulimit.status"]
    assert "vgpulimit.request" in graph["vgpulimit.supervisor"]
    assert "vgpulimit.placement" in graph["vgpulimit.verify"]
    # Imports put off until a call count too (the CLI imports each command's module in it).
    front = set().union(*(deps for name, deps in graph.items() if _front(name)))
    assert {"vgpulimit.supervisor", "vgpulimit.verify"} <= front
    assert {f"{FRONT}.run", f"{FRONT}.views"} <= graph[FRONT]
    # The rules below name modules that are there: none passes by naming nothing.
    assert RENDERERS | {FRONT, "vgpulimit.verify", "vgpulimit.verify_probe",
                        "vgpulimit.supervisor"} <= set(graph)


def test_no_two_python_modules_import_each_other_round_a_circle():
    graph = _python_imports()
    # A package imports its own modules only to re-export them; its modules
    # importing it back is no circle of meaning.
    graph = {name: {m for m in deps if not name.startswith(m + ".")} for name, deps in graph.items()}
    assert _circles(graph) == []
    # The reader finds one when there is one.
    assert _circles({**graph, "vgpulimit.region": graph["vgpulimit.region"] | {"vgpulimit.status"}}) != []


def test_no_module_but_the_cli_imports_a_renderer():
    """The OCI hook, the models of the views and the core never import what
    writes the views out; the hook may read the node's model (admission)."""
    graph = _python_imports()
    for name, deps in graph.items():
        if _front(name):
            continue
        allowed = RENDERERS - {name} if name in RENDERERS else set()
        assert not deps & RENDERERS - allowed, f"{name} imports the renderers {sorted(deps & RENDERERS)}"


def test_verify_does_not_import_the_supervisor():
    """verify judges; the supervisor spawns, forwards signals and reaps.  verify
    asks where regions are (placement.py) and what a child's environment is
    (child_env.py), and is handed the supervisor's run by the CLI for a fresh
    region."""
    graph = _python_imports()
    for name in ("vgpulimit.verify", "vgpulimit.verify_probe"):
        assert "vgpulimit.supervisor" not in graph[name], name

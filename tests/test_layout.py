"""The package's import graph: no cycles, no import of a later stage, and instant stage imports.

Every module under ``src/tutorial_utils`` is parsed with :mod:`ast` (nothing is imported), so
this test also covers modules whose heavy dependencies are missing. All ``import`` statements
count, including the ones inside functions and ``if TYPE_CHECKING:`` blocks: a lazy import
still ties two modules together, it only moves the failure to run time.

Stages, earliest first (a module may import its own stage and earlier ones)::

    plumbing < hub < data < sim < policies < bridge < train < serve < evaluate < runs < report < orchestration

- plumbing: the top-level modules below (``paths``, ``io``...), the plumbing sub-packages
  (``logs/``, ``jobs/``, each of whose modules may import only plumbing) and the package's own
  ``__init__``;
- a stage sub-package (``tutorial_utils/<stage>/``), its ``__init__`` included;
- orchestration: ``pipeline``, ``zoo``, ``cli`` and ``__main__``, which may import anything.

A new top-level module or sub-package must be given a stage here (the test says so).

The job registry (``jobs/registry.py``) names each job's config classes as ``"module:attribute"``
strings, resolved when a job runs: they are read from its ``JOBS`` literal and checked as edges from
plumbing into a stage's sub-package.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

PACKAGE = "tutorial_utils"
ROOT = Path(__file__).resolve().parents[1] / "src" / PACKAGE

PLUMBING = ("paths", "io", "profiles", "secrets", "errors", "params", "logs", "jobs")
STAGES = ("hub", "data", "sim", "policies", "bridge", "train", "serve", "evaluate", "runs", "report")
ORCHESTRATION = ("pipeline", "experiments", "cli", "__main__")

# rank of each stage: plumbing 0, the sub-packages 1..8, orchestration last
RANK = {"plumbing": 0, **{s: i + 1 for i, s in enumerate(STAGES)}, "orchestration": len(STAGES) + 1}

HEAVY = ("torch", "libero", "mujoco", "pyarrow")


# --- the graph ------------------------------------------------------------------------------------
def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py file in the package."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = (PACKAGE, *path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _resolve_base(importer: str, level: int, module: str | None) -> str:
    """The absolute module named by ``from <level dots><module> import ...`` in ``importer``."""
    if level == 0:
        return module or ""
    package = importer if _is_package(importer) else importer.rpartition(".")[0]
    parts = package.split(".")
    if level - 1 >= len(parts):
        raise ValueError(f"{MODULES[importer]}: relative import beyond the top-level package")
    base = ".".join(parts[: len(parts) - (level - 1)])
    return f"{base}.{module}" if module else base


def _own(name: str) -> str | None:
    """The package module that ``name`` lands in (itself, or the closest existing parent), or None."""
    if name != PACKAGE and not name.startswith(PACKAGE + "."):
        return None
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(name: str) -> dict[str, int]:
    """The package modules that module ``name`` imports -> the line of the first such import."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"), filename=str(MODULES[name]))
    found: dict[str, int] = {}

    def add(target: str | None, line: int) -> None:
        if target is not None and target != name:
            found.setdefault(target, line)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(_own(alias.name), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_base(name, node.level, node.module)
            for alias in node.names:
                # `from pkg import sub` imports the submodule pkg.sub when there is one
                full = f"{base}.{alias.name}"
                add(_own(full) if full in MODULES else _own(base), node.lineno)
    return found


GRAPH = {name: _imports(name) for name in MODULES}


def stage_of(name: str) -> str:
    parts = name.split(".")
    if len(parts) == 1:
        return "plumbing"  # the package's own __init__
    head = parts[1]
    if head in STAGES:
        return head
    if head in PLUMBING:  # a top-level module, or a plumbing sub-package's module
        return "plumbing"
    if head in ORCHESTRATION:  # likewise: experiments/ is an orchestration sub-package
        return "orchestration"
    raise AssertionError(
        f"{MODULES[name]}: module {name} has no stage. Add {head!r} to PLUMBING, STAGES or "
        f"ORCHESTRATION in {Path(__file__).name} (stage order: plumbing < {' < '.join(STAGES)} < orchestration)."
    )


# --- tests ----------------------------------------------------------------------------------------
def test_graph_sees_the_package():
    assert f"{PACKAGE}.paths" in MODULES and f"{PACKAGE}.policies" in MODULES
    assert any(GRAPH.values()), "no import between package modules found: is the parser broken?"


def test_every_module_has_a_stage():
    for name in MODULES:
        stage_of(name)


def _cycles(graph: dict[str, dict[str, int]], limit: int = 50) -> list[list[str]]:
    """The elementary cycles of ``graph`` (at most ``limit``), each as [a, b, ..., a] starting at
    its smallest module, shortest first."""
    order = sorted(graph)
    cycles: list[list[str]] = []

    def walk(start: str, path: list[str], allowed: set[str]) -> None:
        for w in sorted(graph[path[-1]]):
            if len(cycles) >= limit:
                return
            if w == start:
                cycles.append([*path, start])
            elif w in allowed and w not in path:
                walk(start, [*path, w], allowed)

    for i, start in enumerate(order):
        walk(start, [start], set(order[i:]))  # a cycle is found once: from its smallest member
    return sorted(cycles, key=lambda c: (len(c), c))


def test_no_import_cycles():
    problems = []
    for cycle in _cycles(GRAPH):
        steps = [f"{a} -> {b} ({MODULES[a].relative_to(ROOT.parent)}:{GRAPH[a][b]})" for a, b in pairwise(cycle)]
        problems.append("cycle: " + "; ".join(steps))
    assert not problems, (
        "import cycles between package modules (imports inside functions count). Break each one by "
        "moving the shared piece into the earlier module or a plumbing module:\n  " + "\n  ".join(problems)
    )


def test_no_import_of_a_later_stage():
    problems = []
    for importer, targets in sorted(GRAPH.items()):
        mine = stage_of(importer)
        for target, line in sorted(targets.items()):
            theirs = stage_of(target)
            if RANK[theirs] > RANK[mine]:
                where = f"{MODULES[importer].relative_to(ROOT.parent)}:{line}"
                problems.append(f"{where}: {importer} ({mine}) imports {target} ({theirs})")
    assert not problems, (
        f"a module imports a later stage (order: plumbing < {' < '.join(STAGES)} < orchestration). Move the "
        "shared piece to the earlier stage, or pass it in as an argument:\n  " + "\n  ".join(problems)
    )


# --- the job registry: string edges from plumbing into the stages -----------------------------------
REGISTRY = f"{PACKAGE}.jobs.registry"


def _top_level_names(name: str) -> set[str]:
    """The names module ``name`` defines or imports at its top level."""
    found: set[str] = set()
    for node in ast.parse(MODULES[name].read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return found


def _registry_edges() -> dict[str, list[str]]:
    """Job -> the ``"module:attribute"`` strings of its entry in the registry's ``JOBS`` literal,
    read with :mod:`ast` (nothing is imported)."""
    for node in ast.parse(MODULES[REGISTRY].read_text(encoding="utf-8")).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "JOBS" for t in targets):
            jobs = ast.literal_eval(node.value)
            return {
                job: [ref for value in entry.values() for ref in ([value] if isinstance(value, str) else value)]
                for job, entry in jobs.items()
            }
    raise AssertionError(f"{MODULES[REGISTRY]}: no literal `JOBS = {{...}}` to read")


def test_every_job_registry_entry_points_into_a_stage():
    """The job registry names each job's entry points as strings, resolved when the job runs: an edge
    from plumbing to a later stage that the import graph above cannot see. Each one must name a
    module of a stage's or orchestration's sub-package (never plumbing) that defines the attribute."""
    edges = _registry_edges()
    assert edges and all(edges.values()), f"{MODULES[REGISTRY]}: JOBS is empty or has an empty entry"
    problems = []
    for job, refs in sorted(edges.items()):
        for ref in refs:
            module, _, attr = ref.partition(":")
            where = f"{MODULES[REGISTRY].relative_to(ROOT.parent)}: {job}: {ref!r}"
            if module not in MODULES or not attr:
                problems.append(f"{where}: no module {module} in the package, or no ':attribute'")
            elif stage_of(module) == "plumbing" or module.count(".") < 2:
                problems.append(f"{where}: {module} is not a module of a job stage's sub-package")
            elif attr not in _top_level_names(module):
                problems.append(f"{where}: {module} does not define {attr}")
    assert not problems, "the job registry points at a wrong place:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("module", [PACKAGE, *(f"{PACKAGE}.{s}" for s in (*PLUMBING, *STAGES))])
def test_import_is_light(module):
    code = (
        "import importlib, json, sys\n"
        f"importlib.import_module({module!r})\n"
        f"heavy = {HEAVY!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"`import {module}` failed:\n{done.stderr}"
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert not loaded, (
        f"`import {module}` loads {', '.join(sorted({m.split('.')[0] for m in loaded}))} ({len(loaded)} modules, e.g. "
        f"{loaded[0]}); import them inside the functions that need them so importing a stage stays instant."
    )


def test_notebook_tooling_imports_without_building_a_grammar():
    """`make setup` removes rfc3987-syntax: jsonschema (under nbformat, papermill, jupyter-book)
    imports it when present, and its import compiles an Earley grammar, 2.6 s in every such process."""
    code = "import json, sys, nbformat, papermill; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert not loaded & {"rfc3987_syntax", "lark"}, (
        "rfc3987-syntax is installed again (jupyter-events asks for it); `make setup` uninstalls it: "
        f"{sys.executable} -m pip uninstall -y rfc3987-syntax lark"
    )


def test_the_checks_themselves():
    toy = {"a": {"b": 1}, "b": {"c": 1, "a": 2}, "c": {"a": 1}, "d": {"a": 1}}
    assert _cycles(toy) == [["a", "b", "a"], ["a", "b", "c", "a"]]
    assert _cycles({"a": {"b": 1}, "b": {}}) == []
    assert _resolve_base(f"{PACKAGE}.policies", 1, "base") == f"{PACKAGE}.policies.base"  # in an __init__
    assert _resolve_base(f"{PACKAGE}.policies.mini", 1, "base") == f"{PACKAGE}.policies.base"
    assert _resolve_base(f"{PACKAGE}.policies.mini", 2, None) == PACKAGE
    assert _resolve_base(f"{PACKAGE}.policies.mini", 2, "io") == f"{PACKAGE}.io"
    assert _own(f"{PACKAGE}.policies.base.Policy") == f"{PACKAGE}.policies.base"
    assert _own("torch.nn") is None
    assert stage_of(f"{PACKAGE}.jobs") == "plumbing" and stage_of(f"{PACKAGE}.cli") == "orchestration"
    assert stage_of(f"{PACKAGE}.jobs.runner") == "plumbing" and stage_of(f"{PACKAGE}.logs.diagnosis") == "plumbing"
    assert stage_of(f"{PACKAGE}.train") == "train"


def test_every_measured_duration_names_a_test_that_exists():
    """``tests/durations.json`` (where the ``slow`` marks come from) names only tests that exist: a
    renamed test would silently lose its mark and slow ``make test-quick`` down."""
    from conftest import DURATIONS, SLOW_S, measured_durations

    measured = measured_durations()
    assert measured, f"{DURATIONS} is missing or empty: run `make test-durations`"
    tests = DURATIONS.parent
    stale = []
    for nodeid in measured:
        path, _, name = nodeid.partition("::")
        func = name.split("[")[0].split("::")[-1]
        file = tests.parent / path
        if not file.exists() or f"def {func}(" not in file.read_text():
            stale.append(nodeid)
    assert not stale, f"{DURATIONS.name} names tests that no longer exist: {stale[:5]}; run `make test-durations`"
    from tutorial_utils.secrets import redact

    assert not [k for k in measured if redact(k) != k], f"{DURATIONS.name} holds a test id that looks like a secret"
    assert any(v >= SLOW_S for v in measured.values())


# --- the tests mirror the stages --------------------------------------------------------------------
#: what a test module may be about besides a stage, a plumbing module or an orchestration module: the
#: book as a whole (its pages, notebooks, browser checks), this layout, CONTRIBUTING.md, the benchmarks
PROJECT = ("book", "layout", "contributing", "benchmarks")
#: the shared modules of tests/ that test modules may import (fixtures, tiny configs, fake upstreams)
SHARED = ("helpers", "conftest", "fake_upstream", "upstream_logs", "lerobot03_load")
#: one exception: CONTRIBUTING.md's test reads the stage order from its one home, this module
READS_THE_LAYOUT = ("test_contributing",)


def _test_prefix_problem(filename: str) -> str | None:
    """Why ``filename`` does not follow ``test_<stage>_<module>.py`` (None when it does)."""
    known = (*STAGES, *PLUMBING, *ORCHESTRATION, *PROJECT)
    stem = filename.removesuffix(".py").removeprefix("test_")
    if any(stem == k or stem.startswith(f"{k}_") for k in known):
        return None
    return f"{filename}: name it test_<stage>_<module>.py after what it tests (<stage>: one of {', '.join(known)})"


def test_test_modules_are_named_after_their_stage():
    """``tests/test_<stage>_<module>.py`` (CONTRIBUTING.md, "Add a stage"): a reader looking for the
    tests of ``serve/config.py`` opens ``tests/test_serve_config.py``."""
    tests = Path(__file__).resolve().parent
    problems = [p for f in sorted(tests.glob("test_*.py")) if (p := _test_prefix_problem(f.name))]
    assert not problems, "\n".join(problems)
    assert _test_prefix_problem("test_serve_config.py") is None and _test_prefix_problem("test_train.py") is None
    assert _test_prefix_problem("test_zoo.py") and _test_prefix_problem("test_trainer.py")


def test_test_modules_import_no_other_test_module():
    """Shared fixtures live in ``tests/helpers.py``: a test module that imports another one runs that
    module's tests' set-up twice and breaks when it is renamed."""
    tests = Path(__file__).resolve().parent
    own = {p.stem for p in tests.glob("*.py")}
    bad = []
    for path in sorted(tests.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            bad += [
                f"{path.name} imports {n}"
                for n in names
                if n in own and n not in SHARED and not (n == "test_layout" and path.stem in READS_THE_LAYOUT)
            ]
    assert not bad, f"{bad}: move what they share into tests/helpers.py"

"""Every notebook the book lists, and every job notebook, follows the conventions:
a valid jupytext header, a first code cell tagged `parameters` whose defaults are the `ci`
settings, overridable by TUTORIAL_PROFILE and by papermill."""

import ast

import jupytext
import pytest

from conftest import REPO
from tutorial_utils import jobs
from tutorial_utils.report import book

NOTEBOOKS = book.toc_notebooks(REPO) + book.job_notebooks(REPO)
SIMPLE = (str, int, float, bool, type(None))


def _simple(v):
    return isinstance(v, SIMPLE) or (isinstance(v, (list, tuple)) and all(isinstance(x, SIMPLE) for x in v))


def _is_pick(node):
    f = node.func if isinstance(node, ast.Call) else None
    return (isinstance(f, ast.Name) and f.id == "pick") or (isinstance(f, ast.Attribute) and f.attr == "pick")


def _expected_by_profile(name, source):
    """{profile: {parameter: value}} from the cell's literals and ``pick(ci=..., cpu=..., gpu=...)``
    calls, with pick's documented fallbacks (cpu falls back to ci, gpu to cpu)."""
    out = {prof: {} for prof in ("ci", "cpu", "gpu")}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        try:
            if _is_pick(value):
                args = dict(zip(("ci", "cpu", "gpu"), value.args))
                args.update({k.arg: k.value for k in value.keywords})
                ci = ast.literal_eval(args["ci"])
                cpu = ast.literal_eval(args["cpu"]) if "cpu" in args else ci
                gpu = ast.literal_eval(args["gpu"]) if "gpu" in args else cpu
            else:
                ci = cpu = gpu = ast.literal_eval(value)
        except (KeyError, ValueError) as exc:
            raise AssertionError(
                f"{name}: parameters line {node.lineno}: a value must be a literal or pick(ci=..., cpu=..., gpu=...) "
                f"of literals ({exc!r})"
            ) from None
        for t in targets:
            if isinstance(t, ast.Name):
                for prof, v in (("ci", ci), ("cpu", cpu), ("gpu", gpu)):
                    out[prof][t.id] = v
    return out


def test_expected_by_profile_reads_pick_and_literals():
    src = "from x import pick\na = pick(ci=1, cpu=2, gpu=3)\nb = pick(ci='s')\nc = pick(0, 5)\nd = True\n"
    got = _expected_by_profile("t", src)
    assert got["ci"] == {"a": 1, "b": "s", "c": 0, "d": True}
    assert got["cpu"] == {"a": 2, "b": "s", "c": 5, "d": True}
    assert got["gpu"] == {"a": 3, "b": "s", "c": 5, "d": True}
    with pytest.raises(AssertionError, match="literal"):
        _expected_by_profile("t", "import os\na = os.cpu_count()\n")


def test_the_toc_lists_existing_files_and_notebooks():
    files = book.toc_files(REPO)
    assert files[0] == REPO / "book" / "intro.md"
    assert REPO / "notebooks" / "01_machine_check.md" in NOTEBOOKS
    # every chapter notebook in notebooks/ is in the TOC (jobs are not chapters)
    chapters = {p for p in (REPO / "notebooks").glob("*.md")}
    assert chapters <= set(files), f"notebooks missing from _toc.yml: {sorted(chapters - set(files))}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.relative_to(REPO).as_posix())
def test_header_and_parameters_cell(path, monkeypatch):
    text = path.read_text()
    header = text.split("\n---", 1)[0]
    for key in ("jupytext:", "format_name: myst", "kernelspec:", "name: python3"):
        assert key in header, f"{path.name}: jupytext header lacks {key!r}"
    nb = jupytext.read(path)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{path.name} has no code cell"
    assert "parameters" in code[0].metadata.get("tags", []), f"{path.name}: first code cell is not tagged `parameters`"
    # only assignments (and imports) in the parameters cell
    for node in ast.parse(code[0].source).body:
        assert isinstance(node, (ast.Assign, ast.AnnAssign, ast.Import, ast.ImportFrom)), (
            f"{path.name}: the parameters cell may only import and assign (line {node.lineno})"
        )
    # what each profile should give, read from the cell's source (not through profiles.pick)
    expected = _expected_by_profile(path.name, code[0].source)
    monkeypatch.delenv("TUTORIAL_PROFILE", raising=False)
    defaults = jobs.default_parameters(nb)
    assert all(_simple(v) for v in defaults.values()), f"{path.name}: parameters must be simple values: {defaults}"
    assert defaults == expected["ci"], f"{path.name}: the defaults (no TUTORIAL_PROFILE) are not the ci= values"
    for prof in ("cpu", "gpu"):
        got = jobs.default_parameters(nb, prof)
        assert got == expected[prof], f"{path.name}: under TUTORIAL_PROFILE={prof} the values are not the {prof}= ones"


def test_job_notebooks_take_a_run_dir():
    for path in book.job_notebooks(REPO):
        assert "run_dir" in jobs.declared_parameters(jupytext.read(path)), f"{path.name} lacks a run_dir parameter"

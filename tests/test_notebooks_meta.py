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
            f"{path.name}: the parameters cell may only import and assign (line {node.lineno})")
    monkeypatch.delenv("TUTORIAL_PROFILE", raising=False)
    defaults = jobs.default_parameters(nb)
    assert defaults == jobs.default_parameters(nb, "ci"), f"{path.name}: defaults are not the ci settings"
    assert all(_simple(v) for v in defaults.values()), f"{path.name}: parameters must be simple values: {defaults}"
    for prof in ("cpu", "gpu"):
        assert set(jobs.default_parameters(nb, prof)) == set(defaults)


def test_job_notebooks_take_a_run_dir():
    for path in book.job_notebooks(REPO):
        assert "run_dir" in jobs.declared_parameters(jupytext.read(path)), f"{path.name} lacks a run_dir parameter"

"""The build and the notebook tests fail loudly when a notebook breaks."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, write_notebook
from tutorial_utils.report import book

pytestmark = pytest.mark.book


def _throwaway_book(root: Path, failing: bool) -> Path:
    shutil.copy(REPO / "_config.yml", root / "_config.yml")
    (root / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n  - file: nb\n")
    (root / "intro.md").write_text("# Throwaway book\n\nA page.\n")
    (root / "_vendor").mkdir()
    (root / "_vendor_extra").mkdir()
    (root / "assets").mkdir()
    shutil.copy(REPO / "assets" / "favicon.svg", root / "assets" / "favicon.svg")
    cell = "raise RuntimeError('deliberate failure')" if failing else "print('fine')"
    write_notebook(root / "nb.md", [("md", "# A notebook"), ("code", cell)], params="x = 1")
    return root


@pytest.mark.slow
@pytest.mark.parametrize("failing", [True, False], ids=["failing", "passing"])
def test_book_build_fails_on_a_failing_cell(tmp_path, failing):
    root = _throwaway_book(tmp_path, failing)
    rc = book.build(root, clean=True)
    assert (rc != 0) == failing
    if not failing:
        assert (root / "_build" / "html" / "nb.html").is_file()


@pytest.mark.slow
def test_nbmake_fails_on_a_failing_cell(tmp_path):
    root = _throwaway_book(tmp_path, failing=True)
    twins = book.write_twins(dest=tmp_path / "twins", root=root)
    assert [t.name for t in twins] == ["nb.ipynb"]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbmake", "-p", "no:cacheprovider", "-q", str(twins[0])],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.returncode == 1, out.stdout
    assert "deliberate failure" in out.stdout


@pytest.mark.slow
def test_twins_beside_the_sources_do_not_break_the_build(tmp_path):
    root = _throwaway_book(tmp_path, failing=False)
    book.write_twins(root=root)
    assert (root / "nb.ipynb").is_file()
    assert book.build(root, clean=True) == 0


@pytest.mark.slow
def test_a_chapter_reading_logs_is_re_executed_when_the_logs_change(tmp_path):
    root = _throwaway_book(tmp_path, failing=False)
    (root / "logs").mkdir()
    (root / "logs" / "figure.txt").write_text("first-run-figure")
    write_notebook(
        root / "nb.md", [("md", "# A notebook"), ("code", "print(open('logs/figure.txt').read())")], params="x = 1"
    )
    assert book.build(root) == 0
    assert "first-run-figure" in (root / "_build" / "html" / "nb.html").read_text()
    assert book.build(root) == 0  # nothing changed: the cached outputs stay
    (root / "logs" / "figure.txt").write_text("second-run-figure")  # the code is unchanged
    assert book.build(root) == 0
    html = (root / "_build" / "html" / "nb.html").read_text()
    assert "second-run-figure" in html and "first-run-figure" not in html


@pytest.mark.slow
def test_the_build_shows_the_chapters_nbmake_ran_and_executes_them_again_when_their_inputs_changed(tmp_path):
    """`make test` runs the twins with nbmake --overwrite, then builds with --executed: the page
    shows nbmake's outputs (the chapter is not executed twice); a twin run from other logs is not
    reused. The cell prints its working folder, which tells the two executions apart."""
    (tmp_path / "book").mkdir()
    root = _throwaway_book(tmp_path / "book", failing=False)
    (root / "logs").mkdir()
    (root / "logs" / "figure.txt").write_text("first")
    write_notebook(root / "nb.md", [("md", "# A notebook"), ("code", "import os; print('cwd=' + os.getcwd())")])
    twins = tmp_path / "executed"
    book.write_twins(dest=twins, root=root)
    nbmake = [sys.executable, "-m", "pytest", "--nbmake", "--overwrite", "-p", "no:cacheprovider", "-q", "nb.ipynb"]
    assert subprocess.run(nbmake, cwd=twins, capture_output=True).returncode == 0
    assert book.reuse_executed(twins, root) == [root / "nb.md"]
    assert book.build(root, executed=twins) == 0
    html = (root / "_build" / "html" / "nb.html").read_text()
    assert f"cwd={twins}" in html and f"cwd={root}" not in html
    # the logs changed after nbmake ran: its outputs are not this build's, the build executes the chapter
    (root / "logs" / "figure.txt").write_text("second")
    assert book.reuse_executed(twins, root) == []
    assert book.build(root, executed=twins) == 0
    html = (root / "_build" / "html" / "nb.html").read_text()
    assert f"cwd={root}" in html and f"cwd={twins}" not in html


def test_a_twin_with_an_error_or_other_cells_is_not_reused(tmp_path):
    import nbformat

    (tmp_path / "book").mkdir()
    root = _throwaway_book(tmp_path / "book", failing=False)
    twins = tmp_path / "executed"
    (twin,) = book.write_twins(dest=twins, root=root)
    nb = nbformat.read(twin, as_version=4)
    for n, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        cell.execution_count = n + 1
    nbformat.write(nb, twin)
    assert book.reuse_executed(twins, root) == [root / "nb.md"]  # every cell ran, no error
    nb.cells[-1].outputs = [nbformat.v4.new_output("error", ename="E", evalue="x", traceback=[])]
    nbformat.write(nb, twin)
    assert book.reuse_executed(twins, root) == []
    nb.cells[-1].outputs, nb.cells[-1].source = [], "print('edited after the run')"
    nbformat.write(nb, twin)
    assert book.reuse_executed(twins, root) == []
    assert book.reuse_executed(tmp_path / "never_written", root) == []  # no stamp: nothing to reuse

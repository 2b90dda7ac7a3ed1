"""CONTRIBUTING.md agrees with the code where it can be checked: the layout map names every stage
and plumbing module the layout test knows, each command it shows exists, each file it points to
exists, each config class it names lives where it says, and the chapter helpers it names belong
to their chapters."""

from __future__ import annotations

import re

import pytest

from conftest import REPO
from test_layout import ORCHESTRATION, PLUMBING, STAGES
from tutorial_utils import cli, jobs, paths

TEXT = (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8")
PKG = REPO / "src" / "tutorial_utils"


def _layout_rows() -> dict[str, str]:
    """First cell -> second cell of the layout map table."""
    section = TEXT.split("## Layout map", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`"):
            rows[cells[0]] = cells[1]
    return rows


def test_the_layout_map_names_every_stage_and_plumbing_module():
    rows = _layout_rows()
    stages = {re.fullmatch(r"`(\w+)/`", k).group(1) for k in rows if re.fullmatch(r"`(\w+)/`", k)}
    assert stages == set(STAGES), "the layout map's stage rows differ from tests/test_layout.py's STAGES"
    order = [k.strip("`/") for k in rows if re.fullmatch(r"`(\w+)/`", k)]
    assert order == list(STAGES), "the layout map lists the stages in another order than the data flow"
    plumbing = next(k for k in rows if k.startswith("`paths"))
    assert set(plumbing.strip("`").split()) == set(PLUMBING)
    orchestration = next(k for k in rows if "pipeline.py" in k)
    # a module (`pipeline.py`) or a sub-package (`experiments/`)
    assert set(re.findall(r"`(\w+)(?:\.py|/)`", orchestration)) == set(ORCHESTRATION) - {"__main__"}


def test_every_command_shown_exists():
    shown = set(re.findall(r"python -m tutorial_utils (\w[\w-]*)", TEXT))
    assert shown and shown <= set(cli.COMMANDS), sorted(shown - set(cli.COMMANDS))


ROOTS = ("tests", "src", "notebooks", "benchmarks", "docs")


def _paths() -> set[str]:
    found = set(re.findall(r"`((?:tests|src|notebooks|benchmarks|docs)/[\w./-]+\.(?:py|md|yml))`", TEXT))
    package = re.findall(r"`((?:\w+/)?\w+\.py)`", TEXT)  # stage-relative: `serve/config.py`
    found |= {f"src/tutorial_utils/{p}" for p in package if "/" in p and not p.startswith(ROOTS)}
    return found


@pytest.mark.parametrize("path", sorted(_paths()))
def test_every_file_it_points_to_exists(path):
    assert (REPO / path).exists(), f"CONTRIBUTING.md points to {path}, which does not exist"


def test_the_config_classes_it_names_live_where_it_says():
    import importlib

    section = TEXT.split("## Add a job parameter", 1)[1].split("\n## ", 1)[0]
    classes = set(re.findall(r"`(\w+(?:Config|Params))`", section))
    modules = {
        "tutorial_utils." + m.removesuffix(".py").replace("/", ".")
        for m in re.findall(r"`([\w/]+\.py)`", section)
        if not m.startswith(ROOTS)
    }
    every_job = {c for nb in paths.JOBS.glob("*.md") for c in jobs.config_classes(jobs.read_notebook(nb))}
    missing = {c.__name__ for c in every_job} - classes
    assert not missing, f"'Add a job parameter' does not name {sorted(missing)}"
    for name in classes:
        owners = [m for m in modules if hasattr(importlib.import_module(m), name)]
        assert any(getattr(importlib.import_module(m), name).__module__ == m for m in owners), (
            f"{name} is not defined in any module 'Add a job parameter' names ({sorted(modules)})"
        )


def test_the_chapter_helpers_it_names_belong_to_their_chapters():
    pairs = re.findall(r"`report/(\w+)\.py` for chapter (\d+)", TEXT)
    assert pairs
    for module, chapter in pairs:
        doc = (PKG / "report" / f"{module}.py").read_text(encoding="utf-8")
        nb = re.search(rf"notebooks/({int(chapter):02d}_\w+)\.md", doc)
        assert nb and (REPO / "notebooks" / f"{nb.group(1)}.md").is_file(), (module, chapter)

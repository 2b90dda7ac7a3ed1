"""The page checker: each check fails on a small page seeded with its defect, and passes on a clean one;
and (with the built book) the real pages pass every check."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from conftest import REPO
from tutorial_utils import paths
from tutorial_utils.report import pagecheck

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 40).decode()


def page(body: str, next_href: str | None = "05_evaluation.html") -> str:
    nxt = f'<a class="right-next" href="{next_href}">next</a>' if next_href else ""
    return (
        "<html><head><script>var x = '/root/secret/js';</script></head><body><main><h1>A chapter</h1>"
        f"{body}</main><footer>{nxt}</footer></body></html>"
    )


def cell(source: str, output: str) -> str:
    return (
        f'<div class="cell docutils container"><div class="cell_input docutils container"><pre>{source}</pre></div>'
        f'<div class="cell_output docutils container"><div class="output text_plain">'
        f"<pre>{output}</pre></div></div></div>"
    )


CLEAN = page(
    "<p>Prose with a table:</p><table><tr><th>a</th><th>b</th></tr><tr><td>1</td><td>2</td></tr></table>"
    + cell("print('| a | b |')", "runs/r1/checkpoints/best saved; $HF_HOME/hub and ~/x")
    + f'<img src="data:image/png;base64,{PNG}"/><video src="clip.mp4" width="320" controls></video>'
    + '<p>Next: <a href="05_evaluation.html">Evaluation</a> follows.</p>'
)

FORBIDDEN = ["/work/checkout", "/root", "/tmp"]


def check(html: str, tmp_path: Path, toc_next: str | None = "notebooks/05_evaluation.html"):
    (tmp_path / "notebooks").mkdir(exist_ok=True)
    (tmp_path / "notebooks" / "clip.mp4").write_bytes(b"\0\0\0\x18ftypmp42" + b"\0" * 64)
    f = tmp_path / "notebooks" / "04_x.html"
    f.write_text(html)
    return pagecheck.check_page(html, "notebooks/04_x.html", page_path=f, toc_next=toc_next, forbidden_paths=FORBIDDEN)


def test_a_clean_page_passes(tmp_path):
    assert check(CLEAN, tmp_path) == []


SEEDED = {
    "object-repr": cell("zoo_tables.figure(z)", "&lt;Figure size 1300x380 with 3 Axes&gt;"),
    "pipe-table": "<p>| parameter | type | default |\n|—|—|—|\n| lr | float | 0.1 |</p>",
    "machine-path": cell("print(ckpt)", "/work/checkout/runs/r1/checkpoints/best"),
    "warning": cell("zoo.train()", "/x/site-packages/y.py:12: UserWarning: something\n  warnings.warn(msg)"),
    "unresolved-role": "<p>The run paused at step {glue:text}`paused_step`.</p>",
    "broken-media": '<img src="../_images/missing.png"/>',
    "small-video": '<video src="clip.mp4" width="128" controls></video>',
    "next-link": '<p>Next: <a href="06_training.html">the training chapter</a>.</p>',
    "raw-table": (
        '<table border="1" class="dataframe"><thead><tr style="text-align: right;"><th></th><th>sign</th>'
        "<th>proves</th></tr></thead><tbody><tr><th>0</th><td>Step 1</td><td>a batch was loaded</td></tr>"
        "</tbody></table>"
    ),
}
#: pandas' default display at its worst: bare row numbers, a cell cut at 50 characters, a footer
RAW_TABLE = (
    SEEDED["raw-table"].replace(
        "</tbody>",
        "<tr><th>1</th><td>Step 2</td><td>the step override reached the trainer's config...</td></tr></tbody>",
    )
    + "<p>2 rows × 3 columns</p>"
)


@pytest.mark.parametrize("defect", sorted(SEEDED))
def test_each_check_fails_on_a_page_seeded_with_its_defect(defect, tmp_path):
    found = check(CLEAN.replace("</main>", SEEDED[defect] + "</main>"), tmp_path)
    assert [f.check for f in found] == [defect], found


def test_more_shapes_of_the_same_defects(tmp_path):
    shapes = {
        "object-repr": cell("x", "&lt;tutorial_utils.zoo.Thing object at 0x7f3a2b&gt;"),
        "machine-path": '<p>see <a href="#">/tmp/tmpab12/run.log</a></p>',
        "warning": cell("x", "Traceback (most recent call last):\n  File ..."),
        "broken-media": '<img src="data:image/png;base64,AAAA"/>',
    }
    for defect, html in shapes.items():
        found = check(CLEAN.replace("</main>", html + "</main>"), tmp_path)
        assert [f.check for f in found] == [defect], (defect, found)
    # the three raw-table findings each alone, and the tables the chapters show instead: none
    named = (
        '<table class="dataframe"><thead><tr><th></th><th>success</th></tr><tr><th>task_id</th><th></th></tr>'
        "</thead><tbody><tr><th>0</th><td>5/5</td></tr></tbody></table>"
    )
    plain = '<table class="dataframe"><thead><tr><th>path</th></tr></thead><tbody><tr><td>data/... (194 more)</td></tr></tbody></table>'
    assert check(CLEAN.replace("</main>", named + plain + "</main>"), tmp_path) == []
    found = check(CLEAN.replace("</main>", RAW_TABLE + "</main>"), tmp_path)
    assert [f.detail.split(":")[0].split(" (")[0] for f in found] == [
        "a cell cut to '...'", "a first column of bare row numbers", "a truncated table"
    ], found  # fmt: skip
    # the same text inside a code cell's input is the book's source, not an output: not a warning
    assert check(CLEAN.replace("</main>", cell("warnings.warn('UserWarning')", "ok") + "</main>"), tmp_path) == []
    # a path in a script that is not shown is no finding; in saved widget state (shown) it is
    state = '<script type="application/vnd.jupyter.widget-state+json">{"v": "/root/x"}</script>'
    view = '<script type="application/vnd.jupyter.widget-view+json">{"model_id": "m"}</script>'
    assert [f.check for f in check(CLEAN.replace("</main>", state + view + "</main>"), tmp_path)] == ["machine-path"]
    assert check(CLEAN.replace("</main>", state + "</main>"), tmp_path) == []  # state that no output shows


def test_next_link_follows_the_themes_next_page_without_a_toc(tmp_path):
    html = page('<p>Next: <a href="06_training.html">the training chapter</a>.</p>', next_href="05_evaluation.html")
    assert [f.check for f in check(html, tmp_path, toc_next=None)] == ["next-link"]
    html = page('<p>Next: <a href="05_evaluation.html">evaluation</a>.</p>', next_href="05_evaluation.html")
    assert check(html, tmp_path, toc_next=None) == []


def test_check_site_walks_the_pages_in_toc_order(tmp_path):
    site = tmp_path / "site"
    (site / "notebooks").mkdir(parents=True)
    (site / "_static").mkdir()
    (site / "_static" / "x.html").write_text("&lt;Figure size 1x1 with 1 Axes&gt;")  # theme files are skipped
    (site / "notebooks" / "a.html").write_text(page('<p>Next: <a href="c.html">C</a></p>', next_href="c.html"))
    (site / "notebooks" / "b.html").write_text(page("<p>fine</p>", next_href=None))
    found = pagecheck.check_site(site, order=["notebooks/a.html", "notebooks/b.html"], forbidden_paths=FORBIDDEN)
    assert [(f.page, f.check) for f in found] == [("notebooks/a.html", "next-link")]


def test_machine_paths_name_this_machines_folders():
    found = pagecheck.machine_paths()
    assert os.fspath(paths.REPO) in found and os.path.expanduser("~") in found


def test_typed_result_numbers_in_sources_are_found():
    text = (
        "# Job\n\nThe promoted sweep took about 35 minutes and reached 70% (14/20 episodes).\n\n"
        "100 episodes took 8 to 17 minutes.\n"
        "```python\nprint('90%')\n```\n\nThe paper reports 98.6% <!-- typed: a fact of the paper -->\n"
        "Run `-p steps 12000` and {glue:text}`rate`.\n"
    )
    found = pagecheck.typed_numbers(text, "jobs/x.md")
    assert [f.detail.split(" typed")[0] for f in found] == [
        "'about 35 minutes'",
        "'70%'",
        "'14/20 episodes'",
        "'took 8 to 17 minutes'",
    ]
    assert [f.page for f in found] == ["jobs/x.md:3"] * 3 + ["jobs/x.md:5"]
    assert pagecheck.typed_numbers("Nothing typed here: {glue:text}`x` and `50%`, a 95% Wilson interval.\n") == []


# --- the real book -------------------------------------------------------------------------------

HTML = Path(os.environ.get("BOOK_ROOT") or REPO / "_build" / "html").resolve()


@pytest.mark.browser
def test_the_built_book_shows_no_defect():
    """Every check over every page of ``_build/html`` (``make test`` builds it first)."""
    if not (HTML / "index.html").is_file():
        msg = f"{HTML}/index.html is missing: run `make html` first"
        if os.environ.get("REQUIRE_BOOK") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    found = pagecheck.check_site(HTML)
    assert not found, "the built pages show:\n" + "\n".join(map(str, found))


@pytest.mark.browser
def test_the_pages_read_without_a_build_type_no_result():
    found = pagecheck.check_sources(REPO)
    assert not found, "results typed by hand (render them from a file):\n" + "\n".join(map(str, found))

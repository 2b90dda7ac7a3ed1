"""Shared figures: they draw without error and show what they claim."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest

from tutorial_utils.data.reader import LeRobotDataset
from tutorial_utils.data.synth import generate_dataset
from tutorial_utils.report import page, plots


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return LeRobotDataset(generate_dataset(tmp_path_factory.mktemp("p") / "d", 2, 12, image_size=32))


def test_episode_figure(ds):
    fig = plots.episode_figure(ds.episode(1), 5, state_names=["a"] * 8)
    axes = fig.get_axes()
    assert len(axes) == 4  # two cameras, state, action
    assert "frame 5" in axes[0].get_title()
    assert [t.get_text() for t in axes[3].get_legend().get_texts()][:2] == ["action[0]", "action[1]"]
    fig = plots.episode_figure(ds.episode(0), 999)  # clamps to the last frame
    assert f"frame {ds.episode(0).length - 1}" in fig.get_axes()[0].get_title()


def test_traces_without_images_and_fps():
    fig = plots.traces_figure({"x": np.arange(10.0)}, marker=4, fps=20, title="t")
    ax = fig.get_axes()[0]
    assert ax.get_xlabel() == "time (s)" and len(ax.get_lines()) == 2  # trace + marker


def test_stats_and_timings_figures():
    stats = {
        "a": {
            "mean": [0, 1],
            "std": [1, 1],
            "min": [-2, -1],
            "max": [2, 3],
            "q01": [-1, 0],
            "q99": [1, 2],
            "mask": [True, False],
        }
    }
    assert len(plots.stats_figure(stats, ["a"]).get_axes()) == 1
    fig = plots.timings_figure({"cold": 0.5, "warm": 0.001})
    assert fig.get_axes()[0].get_xscale() == "log"


def test_stacked_figure_splits_each_bar_into_its_parts_and_labels_the_total():
    fig = plots.stacked_figure(
        {"default": {"forward": 3.0, "backward": 5.0}, "1 thread": {"forward": 2.0, "backward": 4.0}}
    )
    ax = fig.get_axes()[0]
    widths = sorted(round(p.get_width(), 6) for p in ax.patches)
    assert widths == [2.0, 3.0, 4.0, 5.0]  # one segment per part and row
    assert [t.get_text().strip() for t in ax.texts] == ["8 ms", "6 ms"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["forward", "backward"]


def _shown(monkeypatch):
    import IPython.display

    got = []
    monkeypatch.setattr(IPython.display, "display", lambda *objs, **kw: got.extend(objs))
    return got


def test_show_displays_a_figure_built_without_pyplot_as_an_image(monkeypatch):
    from matplotlib.figure import Figure

    got = _shown(monkeypatch)
    fig = Figure(figsize=(13, 3.8))
    fig.subplots().plot([0, 1], label="a")
    assert page.show(fig) is None  # a cell ending in show() prints no repr
    (img,) = got
    assert img.data.startswith(b"\x89PNG") and img.width == page.PAGE_PX  # wider than the page: page wide


def test_show_closes_a_pyplot_figure_so_it_is_not_shown_twice(monkeypatch):
    import matplotlib.pyplot as plt

    got = _shown(monkeypatch)
    fig, ax = plt.subplots(figsize=(4, 3))
    page.show(ax)  # an Axes is shown as its figure
    assert len(got) == 1 and got[0].width == 400
    assert fig.number not in plt.get_fignums()
    with pytest.raises(TypeError, match="matplotlib Figure"):
        page.show("not a figure")


def test_readable_enlarges_text_that_would_be_tiny_at_page_width():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 3.8))
    ax = fig.subplots()
    ax.plot([0, 1], label="a curve")
    ax.legend(fontsize=5)
    ax.set_title("a title", fontsize=20)
    page.readable(fig)
    px_per_pt = page.PAGE_PX / (13 * 72)
    legend = ax.get_legend().get_texts()[0]
    assert legend.get_fontsize() * px_per_pt >= page.MIN_TEXT_PX - 1e-6  # 5 pt would be ~4 px
    assert ax.title.get_fontsize() == 20  # large text stays as it is


def test_numbers_are_rounded_for_reading():
    assert [page.number(x) for x in (160.0, 23.540298, 130.6, 136.555556, 0.052598, 12345.6, 10000.0, 3)] == [
        "160", "23.54", "130.6", "136.6", "0.0526", "12,346", "10,000", "3",
    ]  # fmt: skip
    assert [page.number(x) for x in (2e-7, float("nan"), True, "text", -1.172421)] == [
        "2.00e-07", "nan", "True", "text", "-1.172",
    ]  # fmt: skip


def test_setup_makes_pandas_print_readable_numbers():
    import pandas as pd

    with pd.option_context("display.float_format", None):
        page.setup()
        html = pd.DataFrame({"seconds": [130.600000, 160.0]})._repr_html_()
        assert "130.6<" in html and "160<" in html and "130.600000" not in html


def test_chapter_tables_show_whole_cells_and_no_bare_row_numbers():
    import pandas as pd

    long = "the step override reached the trainer's config and nothing else was changed"
    df = pd.DataFrame({"sign": ["Step 1", "Step 2"], "proves": [long, "x"], "seconds": [130.6, 160.0]})
    with pd.option_context("display.float_format", None, "display.max_colwidth", 50):
        page.setup()
        html = page.table_html(df)
        assert long in html and "..." not in html  # pandas cuts cells at 50 characters by default
        assert "<th>0</th>" not in html and "<th></th>" not in html  # 0, 1 name nothing: no index column
        assert "130.6<" in html  # the rounded numbers stay
        keyed = page.table_html(df.set_index("sign"))
        assert "<th>Step 1</th>" in keyed  # an index that names its rows stays
        assert "<th>1</th>" in page.table_html(df.iloc[1:])  # a slice's numbers are the rows it kept


def test_videos_are_embedded_captioned_and_readable(tmp_path):
    import base64

    clip = tmp_path / "a.mp4"
    clip.write_bytes(b"\x00\x00\x00\x18ftypmp42 not a real movie")
    html = page.videos_html([(clip, "ACT <success>, episode 3")])
    assert base64.b64encode(clip.read_bytes()).decode() in html  # the page needs no file beside it
    assert "ACT &lt;success&gt;, episode 3" in html  # captions are text, not markup
    assert f'width="{page.VIDEO_PX}"' in html and page.VIDEO_PX >= 240  # the browser test's smallest video
    with pytest.raises(FileNotFoundError, match="missing.mp4: no such video"):
        page.videos_html([(tmp_path / "missing.mp4", "x")])

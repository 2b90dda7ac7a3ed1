"""Shared figures: they draw without error and show what they claim."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest

from tutorial_utils.data.format import LeRobotDataset
from tutorial_utils.data.synth import generate_dataset
from tutorial_utils.report import plots


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

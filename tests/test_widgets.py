"""Widgets: sliders drive a re-rendered figure."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from tutorial_utils.data.format import LeRobotDataset
from tutorial_utils.data.synth import generate_dataset
from tutorial_utils.report import widgets


def test_slider_browser_rerenders():
    import matplotlib.pyplot as plt

    calls = []

    def render(a, b):
        calls.append((a, b))
        return plt.figure()

    box = widgets.slider_browser(render, {"a": (0, 3, 1), "b": (0, 5, 2)}, title="t")
    assert calls == [(1, 2)]
    box.children[1].value = 3  # the "a" slider (after the title)
    assert calls[-1] == (3, 2)


def test_episode_browser(tmp_path):
    ds = LeRobotDataset(generate_dataset(tmp_path / "d", 2, 10, image_size=32))
    box = widgets.episode_browser(ds, episode=1, frame=3)
    sliders = [c for c in box.children if c.__class__.__name__ == "IntSlider"]
    assert [s.description for s in sliders] == ["episode", "frame"]
    assert sliders[0].max == 1 and sliders[0].value == 1
    sliders[0].value = 0  # switching episodes re-renders without error

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
    box.children[2].value = 4  # the "b" slider
    assert calls[-1] == (3, 4)


def test_episode_browser(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from tutorial_utils.report import plots

    drawn = []

    def figure(ep, frame, **kw):
        drawn.append((ep.length, frame))
        return plt.figure()

    monkeypatch.setattr(plots, "episode_figure", figure)
    ds = LeRobotDataset(generate_dataset(tmp_path / "d", 2, 10, image_size=32))
    box = widgets.episode_browser(ds, episode=1, frame=3)
    sliders = [c for c in box.children if c.__class__.__name__ == "IntSlider"]
    assert [s.description for s in sliders] == ["episode", "frame"]
    assert sliders[0].max == 1 and sliders[0].value == 1
    assert sliders[1].value == 3 and sliders[1].max == max(ds.lengths) - 1  # the frame slider spans the longest
    assert drawn[-1] == (ds.lengths[1], 3)
    sliders[0].value = 0  # switching episodes re-renders
    assert drawn[-1] == (ds.lengths[0], 3)
    sliders[1].value = sliders[1].max  # the second slider re-renders too, clamped to this episode's last frame
    assert drawn[-1] == (ds.lengths[0], min(sliders[1].max, ds.lengths[0] - 1))

"""Widgets: sliders drive a re-rendered figure."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from tutorial_utils.data.reader import LeRobotDataset
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


def test_episode_browser_works_without_a_kernel(tmp_path):
    """The figures are drawn up front and the sliders switch between them in the browser
    (jslink), so the saved widget state of the static book moves too."""
    import ipywidgets as w

    ds = LeRobotDataset(generate_dataset(tmp_path / "d", 2, 10, image_size=32))
    box = widgets.episode_browser(ds, episode=1, frame=3, episodes=3, frames=6)
    sliders = [c for c in box.children if isinstance(c, w.SelectionSlider)]
    assert [s.description for s in sliders] == ["episode", "frame"]
    assert sliders[0].options == ("1", "0")
    steps = [int(x) for x in sliders[1].options]  # from the asked frame to the longest episode's end
    assert len(steps) == 6 and steps[0] == 3 and steps[-1] == int(max(ds.lengths)) - 1 and steps == sorted(steps)
    outer = box.children[-1]
    assert isinstance(outer, w.Stack) and len(outer.children) == 2
    images = [img for inner in outer.children for img in inner.children]
    assert len(images) == 12 and all(isinstance(i, w.Image) and i.value[:2] == b"\xff\xd8" for i in images)
    distinct = sum(len({min(f, ds.lengths[e] - 1) for f in steps}) for e in (1, 0))  # past the end: the last
    assert len({bytes(i.value) for i in images}) == distinct  # every (episode, frame) is its own picture
    links = [x for x in w.Widget.widgets.values() if type(x).__name__ == "Link"]
    linked = {(id(x.source[0]), id(x.target[0])) for x in links}
    assert (id(sliders[0]), id(outer)) in linked
    assert all((id(sliders[1]), id(inner)) in linked for inner in outer.children)

"""ipywidgets for the chapters, always paired with a static figure of the same thing.

The widgets re-draw a matplotlib figure from a ``render(**values) -> Figure`` function, so
any chapter can make a browser over any figure. In the HTML book the page shows the saved
widget state; the chapter follows every widget with the static figure.
"""

from __future__ import annotations

from collections.abc import Callable


def slider_browser(
    render: Callable[..., object],
    sliders: dict[str, tuple[int, int, int]],
    title: str = "",
    continuous_update: bool = False,
):
    """A box of integer sliders (name -> (min, max, value)) above an output that shows
    ``render(**values)``. Returns the ``ipywidgets.VBox``."""
    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import display

    controls = {
        name: w.IntSlider(
            min=lo,
            max=hi,
            value=val,
            description=name,
            continuous_update=continuous_update,
            layout=w.Layout(width="60%"),
        )
        for name, (lo, hi, val) in sliders.items()
    }
    out = w.Output()

    def redraw(*_):
        with out:
            out.clear_output(wait=True)
            fig = render(**{k: c.value for k, c in controls.items()})
            display(fig)
            plt.close(fig)

    for c in controls.values():
        c.observe(redraw, names="value")
    redraw()
    header = [w.HTML(f"<b>{title}</b>")] if title else []
    return w.VBox(header + list(controls.values()) + [out])


def episode_browser(dataset, episode: int = 0, frame: int = 0, figsize=(10, 7)):
    """Episode and frame sliders over a :class:`~tutorial_utils.data.format.LeRobotDataset`: both
    camera frames at the chosen step, state and action traces with the step marked."""
    from tutorial_utils.report.plots import episode_figure

    cache: dict[int, object] = {}

    def names(key):
        n = dataset.features[key].get("names")
        return next(iter(n.values())) if isinstance(n, dict) else n

    def render(episode: int, frame: int):
        if episode not in cache:
            cache.clear()
            cache[episode] = dataset.episode(episode)
        ep = cache[episode]
        return episode_figure(
            ep,
            min(frame, ep.length - 1),
            state_names=names("observation.state"),
            action_names=names("action"),
            figsize=figsize,
        )

    longest = int(max(dataset.lengths)) - 1
    box = slider_browser(
        render,
        {"episode": (0, dataset.num_episodes - 1, episode), "frame": (0, longest, frame)},
        title=f"{dataset.root.name}: {dataset.num_episodes} episodes",
    )
    return box


__all__ = ["slider_browser", "episode_browser"]

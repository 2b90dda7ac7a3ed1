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


def image_browser(
    render: Callable[..., object],
    choices: dict[str, list[tuple[str, object]]],
    title: str = "",
    fmt: str = "jpeg",
    dpi: int = 72,
):
    """Sliders over figures drawn once, now: ``choices`` maps each slider's name to its
    ``(label, value)`` options, and every combination is drawn with ``render(**values)``.
    The sliders switch between the drawn images in the browser (``jslink``), with no kernel, so
    the control works the same in JupyterLab and in the static HTML book. Returns the
    ``ipywidgets.VBox``; keep the options few (their product is the number of figures)."""
    import io

    import ipywidgets as w
    import matplotlib.pyplot as plt

    from tutorial_utils.report.page import readable

    names = list(choices)
    sliders = {
        n: w.SelectionSlider(
            options=[label for label, _ in opts],
            description=n,
            continuous_update=True,
            layout=w.Layout(width="60%"),
        )
        for n, opts in choices.items()
    }

    def level(i: int, values: dict):
        if i == len(names):
            fig = render(**values)
            buf = io.BytesIO()
            readable(fig).savefig(buf, format=fmt, dpi=dpi)
            plt.close(fig)
            return w.Image(value=buf.getvalue(), format=fmt, layout=w.Layout(max_width="100%"))
        stack = w.Stack([level(i + 1, {**values, names[i]: v}) for _, v in choices[names[i]]], selected_index=0)
        w.jslink((sliders[names[i]], "index"), (stack, "selected_index"))
        return stack

    view = level(0, {})
    header = [w.HTML(f"<b>{title}</b>")] if title else []
    return w.VBox(header + list(sliders.values()) + [view])


def episode_browser(dataset, episode: int = 0, frame: int = 0, figsize=(10, 6.5), episodes: int = 3, frames: int = 6):
    """Episode and frame sliders over a :class:`~tutorial_utils.data.reader.LeRobotDataset`: both
    camera frames at the chosen step, state and action traces with the step marked. The figures
    are drawn once (:func:`image_browser`): ``episodes`` episodes from ``episode`` on, ``frames``
    steps spread over each episode from ``frame`` to its end, so the sliders work in the static
    HTML book too."""
    from tutorial_utils.report.plots import episode_figure

    def names(key):
        n = dataset.features[key].get("names")
        return next(iter(n.values())) if isinstance(n, dict) else n

    shown = [(episode + k) % dataset.num_episodes for k in range(min(episodes, dataset.num_episodes))]
    longest = int(max(dataset.lengths[e] for e in shown)) - 1
    start = min(frame, longest)
    steps = sorted({round(start + (longest - start) * k / max(1, frames - 1)) for k in range(frames)})
    cache: dict[int, object] = {}

    def render(episode: int, frame: int):
        ep = cache.setdefault(episode, dataset.episode(episode))
        return episode_figure(
            ep,
            min(frame, ep.length - 1),
            state_names=names("observation.state"),
            action_names=names("action"),
            figsize=figsize,
        )

    return image_browser(
        render,
        {"episode": [(str(e), e) for e in shown], "frame": [(str(f), f) for f in steps]},
        title=f"{dataset.root.name}: episodes {', '.join(map(str, shown))} of {dataset.num_episodes}, "
        f"{len(steps)} frames each (a frame past an episode's end shows its last)",
    )


__all__ = ["slider_browser", "image_browser", "episode_browser"]

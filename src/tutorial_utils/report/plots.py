"""Matplotlib figures the chapters share. Generic: any array traces, any camera frames.

matplotlib is imported inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def _names(n: int, names: Sequence[str] | None, prefix: str) -> list[str]:
    if names is not None and len(names) == n:
        return [str(x) for x in names]
    return [f"{prefix}[{i}]" for i in range(n)]


def traces_figure(
    series: Mapping[str, np.ndarray],
    names: Mapping[str, Sequence[str]] | None = None,
    marker: int | None = None,
    fps: float | None = None,
    title: str | None = None,
    images: Mapping[str, np.ndarray] | None = None,
    figsize: tuple[float, float] | None = None,
):
    """A figure with optional images on top and one panel of line traces per series.

    ``series``: name -> (T, D) array; ``names``: name -> D labels; ``marker``: a time step to
    mark with a vertical line; ``fps``: label the x axis in seconds instead of frames.
    """
    import matplotlib.pyplot as plt

    images = dict(images or {})
    n_img, n_ser = len(images), len(series)
    rows = (1 if n_img else 0) + n_ser
    fig = plt.figure(figsize=figsize or (10, 2.6 * n_ser + (2.8 if n_img else 0)), layout="constrained")
    grid = fig.add_gridspec(rows, max(n_img, 1), height_ratios=([1.1] if n_img else []) + [1] * n_ser)
    for j, (label, img) in enumerate(images.items()):
        ax = fig.add_subplot(grid[0, j])
        ax.imshow(img)
        ax.set_title(label, fontsize=9)
        ax.axis("off")
    for i, (label, arr) in enumerate(series.items()):
        arr = np.asarray(arr)
        arr = arr[:, None] if arr.ndim == 1 else arr
        ax = fig.add_subplot(grid[(1 if n_img else 0) + i, :])
        x = np.arange(len(arr)) / fps if fps else np.arange(len(arr))
        for d, name in enumerate(_names(arr.shape[1], (names or {}).get(label), label)):
            ax.plot(x, arr[:, d], lw=1.2, label=name)
        if marker is not None:
            ax.axvline(marker / fps if fps else marker, color="k", lw=1, ls="--")
        ax.set_ylabel(label)
        ax.legend(fontsize=7, ncol=min(8, arr.shape[1]), loc="upper left", frameon=False)
        ax.grid(alpha=0.3)
    if n_ser:
        ax.set_xlabel("time (s)" if fps else "frame")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def episode_figure(
    episode,
    frame_index: int = 0,
    cameras: Sequence[str] | None = None,
    state_names: Sequence[str] | None = None,
    action_names: Sequence[str] | None = None,
    fps: float | None = None,
    figsize: tuple[float, float] | None = None,
):
    """Camera frames at ``frame_index`` plus state and action traces of a LeRobot episode.

    ``episode`` is a :class:`tutorial_utils.data.reader.Episode` (anything with ``state``,
    ``action``, ``task``, ``index``, ``video_paths`` and ``frames(key)``).
    """
    cameras = list(cameras if cameras is not None else episode.video_paths)
    f = int(np.clip(frame_index, 0, episode.length - 1))
    images = {f"{cam.split('.')[-1]} (frame {f})": episode.frames(cam)[f] for cam in cameras}
    return traces_figure(
        {"state": episode.state, "action": episode.action},
        names={"state": state_names, "action": action_names},
        marker=f,
        fps=fps,
        images=images,
        figsize=figsize,
        title=f"episode {episode.index}: {episode.task}",
    )


def stats_figure(
    stats: Mapping[str, Mapping[str, Sequence[float]]],
    keys: Sequence[str],
    names: Mapping[str, Sequence[str]] | None = None,
    figsize: tuple[float, float] | None = None,
):
    """Per-dimension range of each column: min..max (thin), q01..q99 (thick), mean +- std (dot, bar)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(keys), figsize=figsize or (5 * len(keys), 3.2), layout="constrained", squeeze=False)
    for ax, key in zip(axes[0], keys):
        s = {k: np.asarray(v, dtype=float).reshape(-1) for k, v in stats[key].items() if k != "mask"}
        x = np.arange(len(s["mean"]))
        ax.vlines(x, s["min"], s["max"], color="0.7", lw=1, label="min..max")
        if "q01" in s:
            ax.vlines(x, s["q01"], s["q99"], color="tab:blue", lw=5, alpha=0.5, label="q01..q99")
        ax.errorbar(x, s["mean"], yerr=s["std"], fmt="o", color="k", ms=3, capsize=3, label="mean ± std")
        ax.set_xticks(x, _names(len(x), (names or {}).get(key), "d"), rotation=45, fontsize=8)
        ax.set_title(key, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, frameon=False)
    return fig


def timings_figure(
    timings: Mapping[str, float], unit: str = "s", title: str | None = None, figsize: tuple[float, float] = (6, 2.2)
):
    """Horizontal bars of named durations, each labelled with its value (log scale if they span > 100x)."""
    import matplotlib.pyplot as plt

    labels, values = list(timings), np.asarray(list(timings.values()), dtype=float)
    fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    ax.barh(labels, values, color="tab:blue")
    if values.min() > 0 and values.max() / values.min() > 100:
        ax.set_xscale("log")
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:.3g} {unit}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def stacked_figure(
    rows: Mapping[str, Mapping[str, float]],
    unit: str = "ms",
    title: str | None = None,
    figsize: tuple[float, float] = (7, 3.0),
):
    """One horizontal bar per row, split into its named parts (the same parts, in the same order,
    in every row), each bar labelled with its total: where the time of each variant goes."""
    import matplotlib.pyplot as plt

    labels = list(rows)
    parts = list(next(iter(rows.values()))) if rows else []
    fig, ax = plt.subplots(figsize=figsize, layout="constrained")
    left = np.zeros(len(labels))
    colors = plt.get_cmap("tab10").colors
    for i, part in enumerate(parts):
        values = np.asarray([float(rows[label].get(part, 0.0)) for label in labels])
        ax.barh(labels, values, left=left, color=colors[i % len(colors)], label=part)
        left += values
    for y, total in enumerate(left):
        ax.text(total, y, f" {total:.3g} {unit}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, left.max() * 1.18 if len(left) else 1)
    ax.set_xlabel(unit)
    ax.legend(fontsize=8, ncols=min(len(parts), 3), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    if title:
        ax.set_title(title, fontsize=10, pad=12 + 12 * ((len(parts) + 2) // 3))
    return fig


__all__ = ["traces_figure", "episode_figure", "stats_figure", "timings_figure", "stacked_figure"]

"""The live training monitor: a Jupyter panel over a run directory, and its static twin for the book.

:func:`monitor` returns a :class:`RunMonitor`, whose panel (ipywidgets) tails the run's files
from a background thread, so the kernel stays free (it may even be the kernel that trains):

- ``metrics.jsonl``: the loss, validation, learning-rate, throughput and data-wait curves and the
  system metrics the training process samples into each row
  (:mod:`tutorial_utils.train.sysmetrics`); a line that is not a JSON row (a write cut short, a
  full disk) is skipped and counted, never an error;
- ``status.json``: state, step/total, ETA, wall time (the loop's heartbeat);
- ``samples/step_*.json``: the predicted vs the true action chunk of one fixed validation frame
  at each validation (``eval_freq``);
- ``train.log``: the last lines, warnings and errors highlighted.

The Stop and Pause buttons call :func:`tutorial_utils.runs.control.send`: the loop finishes its
step, saves a checkpoint and exits (paused: resumable with ``runs.resume``). The thread polls
every ``interval`` seconds, redraws the figure at most every ``figure_every`` seconds (only when
a row arrived, and never spending more than ``max_draw_share`` of the time drawing: on a busy
machine, where one draw takes seconds, the figure updates less often, the text as often), and ends
when the run is no longer running (finished, stopped, paused, failed, stale), when the panel is
closed, or on :meth:`RunMonitor.stop`. When the process showing the panel is the one training, a
helper process draws the figure (:func:`helper_png`): matplotlib then never holds the training's
interpreter lock (``benchmarks/bench_monitor.py --draw-here`` measures the difference).

:func:`static_panel` draws the same panels from a run's files as one matplotlib figure plus
HTML (progress, system metrics, log lines), for the published book where no kernel runs.

Everything here reads files only; matplotlib and ipywidgets are imported inside the functions.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
import os
import re
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tutorial_utils.data.libero_schema import LIBERO_ACTION_NAMES
from tutorial_utils.errors import TutorialError
from tutorial_utils.io import human_bytes, read_json_or_empty, tail_lines
from tutorial_utils.jobs import STATUS_FILE as STATUS
from tutorial_utils.paths import for_book
from tutorial_utils.report.page import figure_png, readable
from tutorial_utils.train.checkpoints import METRICS_FILE as METRICS
from tutorial_utils.train.rundir import LOG_FILE as LOG
from tutorial_utils.train.rundir import SAMPLES_DIR as SAMPLES
from tutorial_utils.train.rundir import SUMMARY_FILE
from tutorial_utils.train.sysmetrics import PREFIX, system_fields

#: run states after which nothing more is written: the poll thread stops
FINAL_STATES = ("finished", "stopped", "paused", "failed", "stale")
#: data wait above this share of the step time is shown as data-bound
DATA_BOUND = 0.30
ACTION_NAMES = tuple(LIBERO_ACTION_NAMES)
BLUE, RED, GREY, ORANGE = "#1f4e79", "#d1495b", "#777777", "#e07b00"
_ERROR = re.compile(r"(error|exception)\b|\b(traceback|non-finite|nan|failed|killed)\b", re.I)
_WARNING = re.compile(r"\bwarn(ing)?s?\b", re.I)


class MonitorError(TutorialError, ValueError):
    """The monitor was pointed at something that is not a run directory."""


# --- reading the files ----------------------------------------------------------------------------


class MetricsTail:
    """Incremental reader of ``metrics.jsonl``: each :meth:`poll` reads only the bytes appended
    since the last one and returns the new rows. A line without its newline yet (a write in
    progress) waits for the next poll; a complete line that is not a JSON object with an integer
    ``step`` is skipped and counted in :attr:`skipped`. A file replaced or shortened (a resume
    drops the rows past its checkpoint) is read again from the start (:attr:`reset` is set)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.rows: list[dict] = []
        self.skipped = 0
        self.reset = False
        self._key: tuple | None = None
        self._offset = 0
        self._partial = b""

    @property
    def partial(self) -> bool:
        """Whether the file ends in a line without its newline (a write cut short, or in progress)."""
        return bool(self._partial.strip())

    def poll(self) -> list[dict]:
        self.reset = False
        try:
            st = os.stat(self.path)
        except OSError:
            return []
        key = (st.st_ino, st.st_dev)
        if key != self._key or st.st_size < self._offset:
            self.reset = self._key is not None
            self._key, self._offset, self._partial = key, 0, b""
            self.rows, self.skipped = [], 0
        if st.st_size == self._offset:
            return []
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except OSError:
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()  # b"" when the chunk ended with a newline
        new = []
        for line in lines:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                self.skipped += 1
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int) and not isinstance(row["step"], bool):
                new.append(row)
            else:
                self.skipped += 1
        self.rows.extend(new)
        return new


def line_level(line: str) -> str | None:
    """``"error"``, ``"warning"`` or None: how a log line is highlighted."""
    if _ERROR.search(line):
        return "error"
    if _WARNING.search(line):
        return "warning"
    return None


def latest_sample(run_dir: str | os.PathLike) -> dict | None:
    """The newest ``samples/step_*.json`` of a run (the highest step), or None."""
    best, best_step = None, -1
    for f in (Path(run_dir) / SAMPLES).glob("step_*.json"):
        try:
            step = int(f.stem.split("_", 1)[1])
        except ValueError:
            continue
        if step > best_step:
            best, best_step = f, step
    if best is None:
        return None
    data = read_json_or_empty(best)
    return data if isinstance(data.get("pred"), list) and isinstance(data.get("true"), list) else None


@dataclass
class RunView:
    """What the panels show: a snapshot of a run directory's files."""

    run_dir: Path
    state: str
    training: dict
    rows: list[dict]
    sample: dict | None
    log: list[str]
    skipped: int = 0
    partial: bool = False
    summary: dict = field(default_factory=dict)

    @property
    def train_rows(self) -> list[dict]:
        return [r for r in self.rows if "loss" in r]

    @property
    def val_rows(self) -> list[dict]:
        return [r for r in self.rows if "val_action_mae" in r]

    @property
    def last_system(self) -> dict:
        for r in reversed(self.rows):
            if fields := system_fields(r):
                return fields
        return {}


def check_run_dir(run_dir: str | os.PathLike) -> Path:
    d = Path(run_dir)
    if not d.is_dir():
        raise MonitorError(
            f"{d}: no such run directory. Pass the run's output_dir (a training run writes {METRICS}, {STATUS} and "
            f"{LOG} there); `python -m tutorial_utils runs list` shows the runs."
        )
    return d


def read_view(run_dir: str | os.PathLike, tail: MetricsTail | None = None, log_lines: int = 20) -> RunView:
    """A :class:`RunView` of ``run_dir``; ``tail`` (kept between calls) reads only new rows."""
    from tutorial_utils import jobs
    from tutorial_utils.runs.registry import run_state

    d = check_run_dir(run_dir)
    tail = tail or MetricsTail(d / METRICS)
    tail.poll()
    status = jobs.read_status(d)
    training = status.get("training") if isinstance(status.get("training"), dict) else {}
    return RunView(
        run_dir=d,
        state=run_state(d, status),
        training=training,
        rows=list(tail.rows),
        sample=latest_sample(d),
        log=tail_lines(d / LOG, log_lines),
        skipped=tail.skipped,
        partial=tail.partial,
        summary=read_json_or_empty(d / SUMMARY_FILE),
    )


# --- the panels as HTML ---------------------------------------------------------------------------


def duration(seconds: float | None) -> str:
    """``1:02:03`` (or ``-``)."""
    if not isinstance(seconds, (int, float)) or seconds != seconds or seconds < 0:
        return "-"
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _progress(view: RunView) -> tuple[int | None, int | None]:
    tr = view.training
    last = view.train_rows[-1]["step"] if view.train_rows else None
    step = tr.get("step") if isinstance(tr.get("step"), int) else last
    if isinstance(last, int) and isinstance(step, int):
        step = max(step, last)
    total = tr.get("total") if isinstance(tr.get("total"), int) else view.summary.get("steps")
    return step, total


def progress_html(view: RunView) -> str:
    """State, step/total, ETA, wall time, throughput, data-wait share, last loss and best validation."""
    step, total = _progress(view)
    tr, rows = view.training, view.train_rows
    color = {"running": BLUE, "failed": RED, "stale": RED, "paused": ORANGE}.get(view.state, GREY)
    pct = f" ({100 * step / total:.0f}%)" if step is not None and total else ""
    parts = [
        f'<b style="color:{color}">{html.escape(view.state)}</b>',
        f"step {step if step is not None else '-'}/{total if total is not None else '-'}{pct}",
    ]
    if view.state == "running":
        parts.append(f"ETA {duration(tr.get('eta_s'))}")
    wall = next(
        (v for v in (tr.get("wall_s"), *map(view.summary.get, ("wall_s_total", "wall_s"))) if v is not None), None
    )
    parts.append(f"wall {duration(wall)}")
    if rows:
        last = rows[-1]
        parts.append(f"{last.get('samples_per_s', 0):.1f} samples/s")
        share = last.get("data_wait_share")
        if isinstance(share, (int, float)):
            style = f' style="color:{RED}"' if share > DATA_BOUND else ""
            bound = " (data-bound)" if share > DATA_BOUND else ""
            parts.append(f"<span{style}>data wait {100 * share:.0f}%{bound}</span>")
        parts.append(f"loss {last['loss']:.4f}")
    if view.val_rows:
        best = min(view.val_rows, key=lambda r: r["val_action_mae"])
        parts.append(f"best val action error {best['val_action_mae']:.4f} (step {best['step']})")
    note = []
    if tr.get("stopped_by"):
        note.append(f"stopped by {html.escape(str(tr['stopped_by']))}")
    if tr.get("error"):
        note.append(f'<span style="color:{RED}">{html.escape(str(tr["error"]))}</span>')
    if view.skipped or view.partial:
        n = view.skipped + int(view.partial)
        note.append(f"{n} line(s) of {METRICS} skipped (not a JSON row: a write cut short)")
    head = f"<b>{html.escape(view.run_dir.name)}</b>: " + " · ".join(parts)
    return f"<div>{head}</div>" + (f'<div style="font-size:90%">{"; ".join(note)}</div>' if note else "")


def system_html(view: RunView) -> str:
    """The newest system sample as a one-row table (CPU, RAM, disk, network, GPU)."""
    s = view.last_system
    if not s:
        return "<div><i>no system metrics in the rows (system_metrics=false, or no row yet)</i></div>"
    cells = []
    if "cpu_process_pct" in s:
        cells.append(("CPU (process)", f"{s['cpu_process_pct']:.0f}% of a core"))
    if "cpu_system_pct" in s:
        cells.append(("CPU (machine)", f"{s['cpu_system_pct']:.0f}% of {s.get('cpu_count', '?')} cores"))
    if "ram_process_bytes" in s:
        cells.append(("RAM (process)", human_bytes(s["ram_process_bytes"])))
    if "ram_used_bytes" in s and "ram_total_bytes" in s:
        cells.append(("RAM (machine)", f"{human_bytes(s['ram_used_bytes'])} / {human_bytes(s['ram_total_bytes'])}"))
    if "disk_free_bytes" in s:
        cells.append(("disk free", human_bytes(s["disk_free_bytes"])))
    if "net_sent_bps" in s:
        cells.append(("network", f"↑ {human_bytes(s['net_sent_bps'])}/s ↓ {human_bytes(s.get('net_recv_bps', 0))}/s"))
    if "gpu_mem_bytes" in s:
        total = f" / {human_bytes(s['gpu_mem_total_bytes'])}" if "gpu_mem_total_bytes" in s else ""
        peak = f" (peak {human_bytes(s['gpu_mem_max_bytes'])})" if "gpu_mem_max_bytes" in s else ""
        cells.append(("GPU memory", f"{human_bytes(s['gpu_mem_bytes'])}{total}{peak}"))
    if "gpu_util_pct" in s:
        cells.append(("GPU", f"{s['gpu_util_pct']:.0f}%"))
    head = "".join(f'<th style="padding:0 8px;text-align:left">{html.escape(k)}</th>' for k, _ in cells)
    body = "".join(f'<td style="padding:0 8px">{html.escape(v)}</td>' for _, v in cells)
    return f'<table style="font-size:90%"><tr>{head}</tr><tr>{body}</tr></table>'


def log_html(lines: list[str]) -> str:
    """Log lines in a ``<pre>``, errors in red and warnings in orange; this machine's folders
    written portably (``runs/...``, ``$TMPDIR/...``: :func:`tutorial_utils.paths.for_book`)."""
    out = []
    for line in lines:
        text = html.escape(for_book(line))
        level = line_level(line)
        if level == "error":
            text = f'<span style="color:{RED};font-weight:bold">{text}</span>'
        elif level == "warning":
            text = f'<span style="color:{ORANGE}">{text}</span>'
        out.append(text)
    body = "\n".join(out) if out else "(no log lines yet)"
    return (
        '<pre style="font-size:80%;line-height:1.25;max-height:16em;overflow:auto;'
        f'white-space:pre-wrap;margin:0">{body}</pre>'
    )


# --- the panels as a figure -----------------------------------------------------------------------


def health_html(diagnosis: Any) -> str:
    """The run's diagnosis (:func:`tutorial_utils.runs.health.diagnose`): each finding with its
    fix, errors in red and warnings in amber; one line when nothing was found."""
    if diagnosis is None:
        return ""
    if not diagnosis.findings:
        return '<div style="font-size:90%">health: no finding (<code>runs diagnose</code> checks)</div>'
    items = []
    for f in diagnosis.findings:
        color = RED if f.severity == "error" else ORANGE
        items.append(
            f'<li><b style="color:{color}">{html.escape(f.severity)} {html.escape(f.code)}</b>: '
            f"{html.escape(for_book(f.message))} <i>Fix: {html.escape(for_book(f.fix))}</i></li>"
        )
    return '<div style="font-size:90%">health:<ul style="margin:0">' + "".join(items) + "</ul></div>"


def run_health(run_dir: str | os.PathLike, record: bool = False) -> Any:
    """The run's diagnosis, or None when it cannot be made (the panel must never fail on it);
    ``record`` also writes it into ``status.json`` as ``health``."""
    from tutorial_utils.runs import health

    try:
        diag = health.diagnose(run_dir)
        if record:
            health.record(run_dir, diagnosis=diag)
        return diag
    except Exception:  # a half-written run: the next poll tries again
        return None


def _series(rows: list[dict], key: str, scale: float = 1.0) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            xs.append(r["step"])
            ys.append(v * scale)
    return xs, ys


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color=GREY, fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])


def panel_figure(view: RunView, figsize: tuple[float, float] = (13, 6.4), fast: bool = False):
    """The monitor's curves as one :class:`matplotlib.figure.Figure` (made without pyplot, so a
    background thread may draw it): loss and validation, learning rate, throughput and data
    wait, CPU and RAM, GPU memory or disk, and the newest sample prediction. ``fast``: fixed
    margins instead of matplotlib's constrained layout, which halves the drawing time (the live
    panel redraws it while training runs)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout=None if fast else "constrained")
    axes = fig.subplots(2, 3)
    if fast:
        fig.subplots_adjust(left=0.05, right=0.95, bottom=0.08, top=0.9, wspace=0.5, hspace=0.45)
    tr, va = view.train_rows, view.val_rows
    gb = 1 / 1e9

    ax = axes[0, 0]
    if tr:
        ax.plot(*_series(tr, "loss"), color=BLUE, alpha=0.35, lw=0.8, label="loss")
        ax.plot(*_series(tr, "loss_mean"), color=BLUE, lw=1.4, label="loss (mean over log window)")
        if all(y > 0 for y in _series(tr, "loss")[1]):
            ax.set_yscale("log")
        ax.set_ylabel("training loss")
        if va:
            ax2 = ax.twinx()
            ax2.plot(*_series(va, "val_action_mae"), "o-", color=RED, ms=3, label="validation action error")
            ax2.set_ylabel("validation action MAE", color=RED)
            ax2.legend(loc="upper right", fontsize=7)
        ax.legend(loc="lower left", fontsize=7)
    else:
        _empty(ax, "no loss rows yet")
    ax.set_title("loss and validation", fontsize=10)

    ax = axes[0, 1]
    if tr:
        ax.plot(*_series(tr, "lr"), color=BLUE)
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        ax.set_ylabel("learning rate")
    else:
        _empty(ax, "no rows yet")
    ax.set_title("learning-rate schedule", fontsize=10)

    ax = axes[0, 2]
    if tr:
        ax.plot(*_series(tr, "samples_per_s"), color=BLUE, label="samples/s")
        ax.set_ylabel("samples/s", color=BLUE)
        ax.set_ylim(bottom=0)
        ax2 = ax.twinx()
        ax2.plot(*_series(tr, "data_wait_share", 100), color=ORANGE, lw=1, label="data wait")
        ax2.axhline(100 * DATA_BOUND, color=RED, ls=":", lw=0.8)
        ax2.set_ylim(0, 100)
        ax2.set_ylabel("data wait, % of step time", color=ORANGE)
    else:
        _empty(ax, "no rows yet")
    ax.set_title("throughput and data wait", fontsize=10)

    ax = axes[1, 0]
    if _series(tr, PREFIX + "cpu_process_pct")[0]:
        ax.plot(*_series(tr, PREFIX + "cpu_process_pct"), color=BLUE, label="CPU, training process (% of a core)")
        ax.plot(*_series(tr, PREFIX + "cpu_system_pct"), color=GREY, label="CPU, machine (% of all cores)")
        ax.set_ylim(bottom=0)
        ax.set_ylabel("CPU %")
        ax.legend(loc="upper left", fontsize=7)
        ax2 = ax.twinx()
        ax2.plot(*_series(tr, PREFIX + "ram_process_bytes", gb), color=RED, lw=1, label="RAM, process")
        ax2.plot(*_series(tr, PREFIX + "ram_used_bytes", gb), color=RED, ls="--", lw=1, label="RAM, machine")
        ax2.set_ylim(bottom=0)
        ax2.set_ylabel("RAM, GB", color=RED)
        ax2.legend(loc="lower right", fontsize=7)
    else:
        _empty(ax, "no system metrics")
    ax.set_title("CPU and RAM", fontsize=10)

    ax = axes[1, 1]
    if _series(tr, PREFIX + "gpu_mem_bytes")[0]:
        ax.plot(*_series(tr, PREFIX + "gpu_mem_bytes", gb), color=BLUE, label="allocated")
        ax.plot(*_series(tr, PREFIX + "gpu_mem_max_bytes", gb), color=BLUE, ls="--", label="peak")
        total = view.last_system.get("gpu_mem_total_bytes")
        if total:
            ax.axhline(total * gb, color=RED, ls=":", lw=0.8, label="GPU memory")
        ax.set_ylabel("GPU memory, GB")
        ax.legend(fontsize=7)
        ax.set_title("GPU memory (VRAM)", fontsize=10)
    elif _series(tr, PREFIX + "disk_free_bytes")[0]:
        xs, ys = _series(tr, PREFIX + "disk_free_bytes", gb)
        ax.plot(xs, ys, color=BLUE)
        ax.set_ylim(0, 1.15 * max(ys) + 1e-9)
        ax.set_ylabel("free, GB")
        ax.set_title("disk free under the run directory (no GPU)", fontsize=10)
    else:
        _empty(ax, "no GPU or disk metrics")
        ax.set_title("GPU memory / disk", fontsize=10)

    ax = axes[1, 2]
    sample_axes(ax, view.sample)
    for a in (axes[0, 0], axes[0, 1], axes[0, 2], axes[1, 0], axes[1, 1]):
        if a.has_data():
            a.set_xlabel("step", fontsize=8)
        a.tick_params(labelsize=7)
    fig.suptitle(f"{view.run_dir.name}: {view.state}", fontsize=11)
    return fig


def sample_axes(ax, sample: dict | None) -> None:
    """Predicted (dashed) vs true (solid) action chunk of one validation frame, one colour per dimension."""
    import numpy as np

    if not sample:
        _empty(ax, "no sample prediction yet\n(one is saved at each validation, eval_freq)")
        ax.set_title("sample prediction", fontsize=10)
        return
    pred, true = np.asarray(sample["pred"], float), np.asarray(sample["true"], float)
    pad = np.asarray(sample.get("is_pad") or [False] * len(true), bool)
    true = np.where(pad[:, None], np.nan, true) if true.ndim == 2 and len(pad) == len(true) else true
    colors = ["#1f4e79", "#d1495b", "#2e933c", "#7a4fa3", "#e07b00", "#00a6a6", "#333333"]
    names = list(ACTION_NAMES) if pred.shape[-1] == len(ACTION_NAMES) else [f"a{i}" for i in range(pred.shape[-1])]
    t = np.arange(len(pred))
    for i, name in enumerate(names):
        c = colors[i % len(colors)]
        ax.plot(t, true[:, i], color=c, lw=1.4, label=name)
        ax.plot(t, pred[:, i], color=c, lw=1.2, ls="--")
    ax.set_xlabel("step in chunk (solid: true, dashed: predicted)", fontsize=8)
    ax.legend(fontsize=6, ncol=4, loc="lower left")
    ep = f", episode {sample['episode']}" if sample.get("episode") is not None else ""
    ax.set_title(f"sample prediction at step {sample.get('step')}{ep}", fontsize=10)
    ax.tick_params(labelsize=7)


# --- static, for the book -------------------------------------------------------------------------


@dataclass
class StaticPanel:
    """The monitor's panels without a kernel: :attr:`figure` (matplotlib) and :attr:`html`
    (progress, system metrics, log lines). In a notebook it shows both."""

    figure: Any
    html: str
    view: RunView
    _png: bytes | None = field(default=None, repr=False)

    def png(self) -> bytes:
        """The figure as PNG (drawn once)."""
        if self._png is None:
            self._png = figure_png(readable(self.figure), dpi=100)  # its text readable at the page's width
        return self._png

    def _repr_html_(self) -> str:
        png = base64.b64encode(self.png()).decode()
        return f'{self.html}<img style="max-width:100%" src="data:image/png;base64,{png}"/>'

    def save(self, dest: str | os.PathLike, name: str = "monitor") -> tuple[Path, Path]:
        """Write ``<dest>/<name>.png`` and ``<dest>/<name>.html`` (atomically); returns both paths."""
        from tutorial_utils.io import atomic_write_bytes, atomic_write_text

        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        png = atomic_write_bytes(dest / f"{name}.png", self.png())
        page = atomic_write_text(dest / f"{name}.html", self.html + "\n")
        return png, page


def static_panel(run_dir: str | os.PathLike, log_lines: int = 20, figsize=(13, 6.4)) -> StaticPanel:
    """The monitor's panels from a run's files, for the published book (no live kernel)."""
    view = read_view(run_dir, log_lines=log_lines)
    text = progress_html(view) + health_html(run_health(run_dir)) + system_html(view) + log_html(view.log)
    return StaticPanel(panel_figure(view, figsize=figsize), text, view)


# --- live, in Jupyter -----------------------------------------------------------------------------

#: one live monitor per run directory: a new one stops the old one's thread
_LIVE: dict[str, weakref.ref] = {}


#: the longest a helper process may take for one figure before the monitor draws it itself
HELPER_TIMEOUT_S = 120.0
_HELPER_TAILS: dict[str, MetricsTail] = {}


def helper_png(run_dir: str, figsize: tuple[float, float], log_lines: int = 20) -> bytes:
    """The live panel's figure of ``run_dir`` as PNG, read and drawn in a helper process (it
    keeps its own :class:`MetricsTail` per run, so each call reads only the new rows)."""
    tail = _HELPER_TAILS.setdefault(run_dir, MetricsTail(Path(run_dir) / METRICS))
    return figure_png(panel_figure(read_view(run_dir, tail, log_lines), figsize, fast=True))


class RunMonitor:
    """The live panel over one run directory (see the module doc). :attr:`panel` is the
    ipywidgets ``VBox``; showing the monitor shows it. :meth:`refresh` reads the files once."""

    def __init__(
        self,
        run_dir: str | os.PathLike,
        interval: float = 2.0,
        figure_every: float = 10.0,
        log_lines: int = 20,
        figsize: tuple[float, float] = (13, 6.4),
        runs_dir: str | os.PathLike | None = None,
        max_draw_share: float = 0.01,
        health_every: float = 30.0,
        draw_in_helper: bool | None = None,
    ):
        import ipywidgets as w

        self.run_dir = check_run_dir(run_dir).resolve()
        self.interval, self.figure_every, self.log_lines, self.figsize = interval, figure_every, log_lines, figsize
        self.runs_dir, self.max_draw_share = runs_dir, max_draw_share
        self.health_every, self._next_health, self.diagnosis = health_every, 0.0, None
        self.tail = MetricsTail(self.run_dir / METRICS)
        self.view: RunView | None = None
        self.polls = 0
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._drawn_rows = -1
        self._drawn_sample: Any = None
        self._next_draw = 0.0
        self.draw_s, self.draws = 0.0, 0
        # None: in a helper process when this process is the one training (see _png)
        self.draw_in_helper, self._helper, self.helper_error = draw_in_helper, None, None
        self.helper_draws = 0  # figures the helper process drew
        self.header = w.HTML()
        self.bar = w.IntProgress(min=0, max=1, value=0, layout=w.Layout(width="60%"))
        self.stop_button = w.Button(description="Stop", icon="stop", tooltip="finish the step, checkpoint, exit")
        self.pause_button = w.Button(description="Pause", icon="pause", tooltip="like stop; resume with runs.resume")
        self.message = w.HTML()
        self.image = w.Image(format="png", layout=w.Layout(max_width="100%"))
        self.system = w.HTML()
        self.health = w.HTML()
        self.log = w.HTML()
        self.stop_button.on_click(lambda _: self.send("stop"))
        self.pause_button.on_click(lambda _: self.send("pause"))
        controls = w.HBox([self.bar, self.stop_button, self.pause_button])
        self.panel = w.VBox([self.header, controls, self.message, self.health, self.image, self.system, self.log])

    # --- display ---------------------------------------------------------------------------------

    def _repr_mimebundle_(self, **kwargs):
        """The live widget, and for a page without a kernel (the HTML book prefers ``text/html``,
        see ``_config.yml``) a frozen copy without the buttons: there they would do nothing."""
        bundle = self.panel._repr_mimebundle_(**kwargs)
        return {**bundle, "text/html": self.frozen_html()}

    def frozen_html(self) -> str:
        """The panel as it is now, as plain HTML with no controls, and where to get the live one."""
        with self._lock:  # drawn again here with its text readable at the page's width
            png = figure_png(readable(panel_figure(self.view, self.figsize)), dpi=100) if self.view else b""
        png = base64.b64encode(png).decode()
        return (
            '<div class="monitor-frozen"><p><em>The live panel as it was when this cell ran. In JupyterLab '
            "(<code>make lab</code>) it follows the run and its Stop and Pause buttons work.</em></p>"
            + self.header.value
            + self.health.value
            + (f'<img style="max-width:100%" src="data:image/png;base64,{png}"/>' if png else "")
            + self.system.value
            + self.log.value
            + "</div>"
        )

    @property
    def closed(self) -> bool:
        return getattr(self.panel, "comm", None) is None

    @property
    def running(self) -> bool:
        """Whether the poll thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    # --- reading ---------------------------------------------------------------------------------

    def refresh(self, force_figure: bool = False) -> RunView:
        """Read the run's files (new metrics rows only) and update the panel."""
        with self._lock:
            view = read_view(self.run_dir, self.tail, self.log_lines)
            self.view, self.polls = view, self.polls + 1
            step, total = _progress(view)
            if total:
                self.bar.max = max(1, int(total))
                self.bar.value = min(int(step or 0), self.bar.max)
            self.bar.bar_style = {"finished": "success", "failed": "danger", "stale": "danger"}.get(view.state, "")
            live = view.state == "running"
            self.stop_button.disabled = self.pause_button.disabled = not live
            self.header.value = progress_html(view)
            self.system.value = system_html(view)
            self.log.value = log_html(view.log)
            if time.monotonic() >= self._next_health or (not live and self.diagnosis is None):
                # the diagnosis (stale, NaN, divergence, data-bound, disk...) also goes into status.json
                self.diagnosis = run_health(self.run_dir, record=True)
                self.health.value = health_html(self.diagnosis)
                self._next_health = time.monotonic() + self.health_every
            sample_key = (view.sample or {}).get("step")
            changed = len(view.rows) != self._drawn_rows or sample_key != self._drawn_sample or self.tail.reset
            if force_figure or (changed and time.monotonic() >= self._next_draw) or self._drawn_rows < 0:
                t0 = time.monotonic()
                self.image.value = self._png(view)
                now = time.monotonic()
                self.draw_s, self.draws = now - t0, self.draws + 1
                self._next_draw = now + max(self.figure_every, self.draw_s / max(self.max_draw_share, 1e-3))
                self._drawn_rows, self._drawn_sample = len(view.rows), sample_key
            return view

    def _png(self, view: RunView) -> bytes:
        """The figure as PNG. Drawing it is a few hundred milliseconds of pure Python that holds
        the interpreter lock; when the process that shows the panel is also the one training
        (a running run whose heartbeat has this process's pid), that time is taken from the training steps (measured by
        ``benchmarks/bench_monitor.py``). Then it is drawn by one helper process, started at
        the first draw, while this thread only waits. A helper that cannot start or fails
        falls back to drawing here (``helper_error`` says why)."""
        helper = self.draw_in_helper
        if helper is None:
            helper = view.state == "running" and view.training.get("pid") == os.getpid()
        if helper and self.helper_error is None:
            try:
                if self._helper is None:
                    import multiprocessing
                    from concurrent.futures import ProcessPoolExecutor

                    self._helper = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
                png = self._helper.submit(helper_png, str(self.run_dir), self.figsize, self.log_lines).result(
                    timeout=HELPER_TIMEOUT_S
                )
                self.helper_draws += 1
                return png
            except Exception as exc:  # no spawn here, a broken helper, a timeout: draw in this process
                self.helper_error = f"{type(exc).__name__}: {exc}"
                self._close_helper()
        return figure_png(panel_figure(view, self.figsize, fast=True))

    def _close_helper(self) -> None:
        helper, self._helper = self._helper, None
        if helper is not None:
            helper.shutdown(wait=False, cancel_futures=True)

    # --- control ---------------------------------------------------------------------------------

    def send(self, command: str) -> dict | None:
        """Write ``command`` (stop, pause) to the run's control file; the result shows in the panel."""
        from tutorial_utils.runs.control import send

        try:
            record = send(self.run_dir, command, runs_dir=self.runs_dir)
        except (TutorialError, ValueError) as exc:
            self.message.value = f'<span style="color:{RED}">{html.escape(str(exc))}</span>'
            return None
        when = _dt.datetime.fromtimestamp(record["time"]).strftime("%H:%M:%S")
        self.message.value = (
            f"{html.escape(command)} sent at {when}: the run finishes its current step, saves a checkpoint and exits"
            + (" (resume it with runs.resume)." if command == "pause" else ".")
        )
        return record

    # --- the thread ------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            if self.closed:
                break
            try:
                view = self.refresh()
            except Exception as exc:  # a file vanished mid-read, a widget gone: show it, keep polling
                self.message.value = f'<span style="color:{RED}">monitor: {html.escape(repr(exc)[:300])}</span>'
                continue
            if view.state in FINAL_STATES:
                self.refresh(force_figure=True)
                break
        self._close_helper()

    def start(self) -> RunMonitor:
        """Start polling in a daemon thread (a monitor of the same run directory stops)."""
        key = str(self.run_dir)
        old = _LIVE.get(key)
        if old is not None and old() is not None and old() is not self:
            old().stop()
        if not self.running:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name=f"monitor-{self.run_dir.name}", daemon=True)
            self._thread.start()
            _LIVE[key] = weakref.ref(self)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the poll thread (the panel stays, frozen)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._close_helper()

    def close(self) -> None:
        """Stop the thread and close the widgets."""
        self.stop()
        self.panel.close()


def monitor(
    run_dir: str | os.PathLike,
    interval: float = 2.0,
    figure_every: float = 10.0,
    log_lines: int = 20,
    start: bool = True,
    runs_dir: str | os.PathLike | None = None,
    max_draw_share: float = 0.01,
    draw_in_helper: bool | None = None,
) -> RunMonitor:
    """The live panel of a training run: show it as a cell's last expression (or with
    ``display``). It reads the files once now and, while the run is running, every ``interval``
    seconds from a background thread; the kernel stays free. ``mon.stop()`` ends the polling,
    ``mon.close()`` removes the panel. The figure is redrawn at most every ``figure_every``
    seconds and at most ``max_draw_share`` of the time; by a helper process when this process is the
    one training (``draw_in_helper=None``), so the drawing never holds the training's interpreter
    lock."""
    mon = RunMonitor(
        run_dir,
        interval=interval,
        figure_every=figure_every,
        log_lines=log_lines,
        runs_dir=runs_dir,
        max_draw_share=max_draw_share,
        draw_in_helper=draw_in_helper,
    )
    view = mon.refresh(force_figure=True)
    if start and view.state not in FINAL_STATES:
        mon.start()
    return mon


__all__ = [
    "MetricsTail",
    "MonitorError",
    "RunMonitor",
    "RunView",
    "StaticPanel",
    "latest_sample",
    "line_level",
    "log_html",
    "monitor",
    "panel_figure",
    "progress_html",
    "read_view",
    "static_panel",
    "system_html",
    "tail_lines",
]

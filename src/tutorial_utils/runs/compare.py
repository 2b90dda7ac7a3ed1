"""Compare training runs: overlaid curves, a best/last table, the parameter diff, seeds grouped.

:func:`compare` loads N runs (their ``metrics.jsonl`` through
:func:`~tutorial_utils.runs.registry.read_metrics`, ``summary.json``, parameters from
``train_config.json``, checkpoints with evaluated success rates) and returns a
:class:`Comparison`:

- ``figure()``: train loss, the chosen validation metric and the learning rate, one line per
  run, loss smoothed with a debiased EMA (:func:`ema`, TensorBoard's "smoothing");
- ``table``: one row per run with the best and the last value of the metric, the last loss and,
  when a checkpoint was evaluated, its success rate with the 95% Wilson interval; ``styled()``
  highlights the best value in each column;
- ``diff``: only the parameters that differ between the runs;
- ``seeds``: runs that differ only in ``seed`` grouped, with mean, standard deviation and range;
- ``best``: the best (run, checkpoint) across the runs by the metric
  (:func:`best_across_runs`; :func:`mark_best_across_runs` also marks it as its run's ``best``).

The metric is any key of the validation rows (``val_action_mae`` by default, lower is better) or
``success_rate`` (higher is better, from evaluated checkpoints).
CLI: ``python -m tutorial_utils runs compare RUN RUN ... [--metric M] [--out fig.svg]``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tutorial_utils.errors import ConfigError, TutorialError
from tutorial_utils.io import read_json_or_empty
from tutorial_utils.runs import checkpoints as rck
from tutorial_utils.runs.registry import read_metrics, resolve, run_state
from tutorial_utils.train.checkpoints import CONFIG_FILE, METRICS_FILE
from tutorial_utils.train.rundir import SUMMARY_FILE

#: parameters that say where or how a run was launched, not what it trained: left out of the diff
NOT_COMPARED = ("output_dir", "run_id", "resume", "resume_from", "progress", "system_metrics")
#: default EMA smoothing of the loss curves (0: none; 0.99: very smooth)
SMOOTHING = 0.6


class RunWithoutMetrics(TutorialError, ValueError):
    """A run given to the comparison has no metrics rows."""


@dataclass
class RunData:
    """What the comparison reads of one run."""

    run_id: str
    path: Path
    state: str
    train: list[dict]  # rows with a loss (one per log step)
    val: list[dict]  # validation rows
    params: dict[str, Any]  # flat: policy parameters as policy.<name>
    summary: dict
    checkpoints: list[dict] = field(default_factory=list)

    @property
    def step(self) -> int | None:
        steps = [r["step"] for r in self.train + self.val]
        return max(steps) if steps else None


def _flat_params(d: Path) -> dict[str, Any]:
    """A run's training parameters, policy ones as ``policy.<name>``; ``dataset`` by name and size
    (each train job copies its dataset into its own folder, so paths always differ)."""
    cfg = read_json_or_empty(d / CONFIG_FILE)
    train = dict(cfg.get("train") or read_json_or_empty(d / "copy.json").get("train") or {})
    policy = train.pop("policy_config", None) or cfg.get("policy_config") or {}
    out = {k: v for k, v in train.items() if k not in NOT_COMPARED}
    out.update({f"policy.{k}": v for k, v in policy.items()})
    ds = cfg.get("dataset")
    if isinstance(ds, dict) and ds.get("frames") is not None:
        out["dataset"] = f"{ds.get('name') or Path(str(out.get('dataset', ''))).name} ({ds['frames']} frames)"
    return {k: tuple(v) if isinstance(v, list) else v for k, v in out.items()}


def load_run(run: str | os.PathLike, runs_dir: str | os.PathLike | None = None) -> RunData:
    """One run's metrics, parameters, summary and checkpoints; a run without metrics rows is a
    :class:`RunWithoutMetrics` error."""
    d = resolve(run, runs_dir)
    rows = read_metrics(d)
    train = [r for r in rows if isinstance(r.get("loss"), (int, float))]
    val = [r for r in rows if isinstance(r.get(rck.DEFAULT_METRIC), (int, float))]
    if not train and not val:
        raise RunWithoutMetrics(
            f"{d / METRICS_FILE}: run {d.name} (state {run_state(d)}) has no metrics rows, so there is nothing to "
            "compare. Compare training runs that logged at least one step (log_freq >= 1); "
            "`python -m tutorial_utils runs list` shows each run's job and step."
        )
    return RunData(
        d.name,
        d,
        run_state(d),
        train,
        val,
        _flat_params(d),
        read_json_or_empty(d / SUMMARY_FILE),
        rck.list_checkpoints(d),
    )


def ema(values: Sequence[float], smoothing: float = SMOOTHING) -> list[float]:
    """Exponential moving average, debiased like TensorBoard's smoothing (the first points are
    not pulled towards 0). Non-finite values stay in place as NaN and do not enter the average."""
    if not 0.0 <= smoothing < 1.0:
        raise ConfigError(f"smoothing={smoothing}: pass a number in [0, 1) (0: none, 0.9: strong).")
    out, acc, weight = [], 0.0, 0.0
    for v in values:
        v = float(v)
        if not math.isfinite(v):
            out.append(math.nan)
            continue
        acc = smoothing * acc + (1.0 - smoothing) * v
        weight = smoothing * weight + (1.0 - smoothing)
        out.append(acc / weight)
    return out


def _finite(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _check_metric(runs: list[RunData], metric: str) -> None:
    known = sorted({m for r in runs for m in rck.metric_names(r.val, r.checkpoints)})
    if metric not in known:
        raise rck.MetricError(
            f"metric {metric!r} is not recorded by the runs compared ({', '.join(r.run_id for r in runs)}; "
            f"their {METRICS_FILE} validation rows and evaluated checkpoints). Available: {', '.join(known) or 'none'}. "
            "Pass one of them as metric (--metric)."
        )


def _success(r: RunData) -> dict:
    """The evaluated checkpoint with the highest success rate (with its interval), else {}."""
    row = rck.pick_best([c for c in r.checkpoints if "success_rate" in c], "success_rate", "max")
    return row or {}


def run_row(r: RunData, metric: str, mode: str) -> dict[str, Any]:
    """One table row: best and last value of ``metric``, last loss, best success rate with its interval."""
    series = r.checkpoints if metric in rck.HIGHER_IS_BETTER else r.val
    series = [x for x in series if _finite(x.get(metric)) is not None]
    best = rck.pick_best(series, metric, mode) or {}
    last = series[-1] if series else {}
    sr = _success(r)
    ci = sr.get("ci95") or (None, None)
    total = r.summary.get("steps") or r.params.get("steps")
    return {
        "run": r.run_id,
        "state": r.state,
        "step": r.step,
        "total": total,
        "last_loss": _finite(r.train[-1]["loss"]) if r.train else None,
        f"best_{metric}": _finite(best.get(metric)),
        "best_step": best.get("step"),
        f"last_{metric}": _finite(last.get(metric)),
        "success_rate": sr.get("success_rate"),
        "ci95_low": ci[0],
        "ci95_high": ci[1],
        "episodes": sr.get("episodes"),
        "success_checkpoint": sr.get("name"),
    }


def param_diff(runs: Sequence[RunData]) -> dict[str, dict[str, Any]]:
    """``{parameter: {run_id: value}}`` for the parameters whose values are not all equal (a
    parameter one run lacks counts as different, with value None)."""
    keys = sorted({k for r in runs for k in r.params})
    out = {}
    for k in keys:
        values = {r.run_id: r.params.get(k) for r in runs}
        if len({json.dumps(v, sort_keys=True, default=str) for v in values.values()}) > 1:
            out[k] = values
    return out


def seed_groups(runs: Sequence[RunData], metric: str, mode: str) -> list[dict[str, Any]]:
    """Runs whose parameters are equal but for ``seed``, grouped: per group the runs, seeds,
    and mean, standard deviation (n - 1) and min/max of the best metric, the last loss and the
    success rate."""
    groups: dict[str, list[RunData]] = {}
    for r in runs:
        key = json.dumps({k: v for k, v in r.params.items() if k != "seed"}, sort_keys=True, default=str)
        groups.setdefault(key, []).append(r)
    out = []
    for members in groups.values():
        rows = [run_row(r, metric, mode) for r in members]
        g: dict[str, Any] = {
            "runs": [r.run_id for r in members],
            "seeds": [r.params.get("seed") for r in members],
            "n": len(members),
        }
        for col in (f"best_{metric}", "last_loss", "success_rate"):
            vals = [v for row in rows if (v := _finite(row[col])) is not None]
            mean = sum(vals) / len(vals) if vals else None
            std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else None
            g.update(
                {
                    f"{col}_mean": mean,
                    f"{col}_std": std,
                    f"{col}_min": min(vals) if vals else None,
                    f"{col}_max": max(vals) if vals else None,
                }
            )
        out.append(g)
    return out


def best_across_runs(
    runs: Sequence[str | os.PathLike], metric: str = rck.DEFAULT_METRIC, mode: str | None = None, runs_dir=None
) -> dict[str, Any]:
    """The best (run, checkpoint) by ``metric`` over the ``step_*`` checkpoints of every run:
    :func:`tutorial_utils.runs.checkpoints.best_checkpoint` of each, then the best of those.
    A run none of whose checkpoints carries the metric is passed over; if no run has it, the
    error names the metrics the runs have."""
    picks, errors = [], []
    for run in runs:
        try:
            picks.append(rck.best_checkpoint(run, metric, mode, runs_dir))
        except rck.MetricError as exc:
            errors.append(str(exc))
    best = rck.pick_best(picks, "value", rck.metric_mode(metric, mode))
    if best is None:
        raise rck.MetricError(
            f"no checkpoint of {len(list(runs))} run(s) carries {metric!r}:\n  " + "\n  ".join(errors)
        )
    return {**best, "checkpoint": best["name"], "passed_over": errors}


def mark_best_across_runs(
    runs: Sequence[str | os.PathLike], metric: str = rck.DEFAULT_METRIC, mode: str | None = None, runs_dir=None
) -> dict[str, Any]:
    """:func:`best_across_runs`, then mark that checkpoint as its run's ``best`` (by hand, with the
    metric recorded: :func:`tutorial_utils.runs.checkpoints.mark_best`). Returns the choice and
    ``best_dir``."""
    best = best_across_runs(runs, metric, mode, runs_dir)
    path = rck.mark_best(best["path"], metric=metric, mode=mode)  # the run's own best by it: the same one
    return {**best, "best_dir": str(path)}


@dataclass
class Comparison:
    """The result of :func:`compare` (see the module docstring)."""

    runs: list[RunData]
    metric: str
    mode: str
    rows: list[dict[str, Any]]
    diff: dict[str, dict[str, Any]]
    groups: list[dict[str, Any]]
    best: dict[str, Any] | None

    @property
    def table(self):
        """The best/last table as a pandas DataFrame, indexed by run."""
        import pandas as pd

        return pd.DataFrame(self.rows).set_index("run")

    @property
    def diff_table(self):
        """The parameters that differ (rows) by run (columns)."""
        import pandas as pd

        return pd.DataFrame(self.diff).T.reindex(columns=[r.run_id for r in self.runs])

    @property
    def seeds(self):
        """One row per group of runs that differ only in ``seed``."""
        import pandas as pd

        return pd.DataFrame(self.groups)

    def styled(self):
        """:attr:`table` as a pandas ``Styler``: the best value of the metric columns, the lowest
        last loss and the highest success rate highlighted."""
        df = self.table
        m = self.metric
        cols = [c for c in (f"best_{m}", f"last_{m}") if df[c].notna().any()]
        green = "background-color: #c8ecc8; font-weight: bold"
        st = df.style.format(precision=4, na_rep="-")
        if cols:
            st = (st.highlight_max if self.mode == "max" else st.highlight_min)(subset=cols, props=green)
        if df["last_loss"].notna().any():
            st = st.highlight_min(subset=["last_loss"], props=green)
        if df["success_rate"].notna().any():
            st = st.highlight_max(subset=["success_rate"], props=green)
        return st.set_caption(f"{len(df)} runs by {m} ({'higher' if self.mode == 'max' else 'lower'} is better)")

    def figure(self, smoothing: float = SMOOTHING):
        """Train loss (raw, faint, and EMA-smoothed), the metric and the learning rate, overlaid."""
        from matplotlib.figure import Figure

        fig = Figure(figsize=(13, 3.8), layout="constrained")
        ax_loss, ax_val, ax_lr = fig.subplots(1, 3)
        colors = [f"C{i % 10}" for i in range(len(self.runs))]
        for r, c in zip(self.runs, colors, strict=True):
            steps = [x["step"] for x in r.train]
            loss = [float(x["loss"]) for x in r.train]
            if steps:
                ax_loss.plot(steps, loss, color=c, alpha=0.25, lw=0.8)
                ax_loss.plot(steps, ema(loss, smoothing), color=c, lw=1.6, label=r.run_id)
                lr = [(x["step"], x["lr"]) for x in r.train if _finite(x.get("lr")) is not None]
                if lr:
                    ax_lr.plot(*zip(*lr, strict=True), color=c, lw=1.4)
            if self.metric in rck.HIGHER_IS_BETTER:
                pts = sorted((x["step"], x) for x in r.checkpoints if x.get("name") != "best" and self.metric in x)
                for step, x in pts:
                    lo, hi = x.get("ci95") or (x[self.metric], x[self.metric])
                    ax_val.errorbar(
                        step, x[self.metric], yerr=[[x[self.metric] - lo], [hi - x[self.metric]]], color=c, fmt="o"
                    )
            else:
                pts = [(x["step"], x[self.metric]) for x in r.val if _finite(x.get(self.metric)) is not None]
                if pts:
                    ax_val.plot(*zip(*pts, strict=True), color=c, marker="o", ms=3, lw=1.4)
        if self.best:
            ax_val.plot(
                self.best["step"], self.best["value"], marker="*", ms=14, color="gold", mec="black", ls="none",
                label=f"best: {self.best['run']} {self.best['checkpoint']}",
            )  # fmt: skip
            ax_val.legend(fontsize=7)
        ax_loss.set(
            title=f"train loss (EMA {smoothing})", xlabel="step", yscale="log" if self._positive() else "linear"
        )
        ax_val.set(title=f"{self.metric} ({'higher' if self.mode == 'max' else 'lower'} is better)", xlabel="step")
        ax_lr.set(title="learning rate", xlabel="step")
        ax_loss.legend(fontsize=7)
        for ax in (ax_loss, ax_val, ax_lr):
            ax.grid(alpha=0.3)
        return fig

    def _positive(self) -> bool:
        return all(float(x["loss"]) > 0 for r in self.runs for x in r.train if _finite(x["loss"]) is not None)

    def text(self) -> str:
        """The table, the parameter diff, the seed groups and the best checkpoint as plain text."""
        import pandas as pd

        with pd.option_context(
            "display.width", 200, "display.max_columns", 30, "display.float_format", "{:.4g}".format
        ):
            cols = [c for c in self.table.columns if c not in ("ci95_low", "ci95_high", "success_checkpoint")]
            tab = self.table[cols].copy()
            if self.table["success_rate"].notna().any():
                tab["ci95"] = [
                    f"[{lo:.2f}, {hi:.2f}]" if lo is not None and not pd.isna(lo) else "-"
                    for lo, hi in zip(self.table["ci95_low"], self.table["ci95_high"], strict=True)
                ]
            parts = [
                f"runs by {self.metric} ({'higher' if self.mode == 'max' else 'lower'} is better):",
                tab.to_string(),
            ]
            if self.diff:
                parts += ["", "parameters that differ:", self.diff_table.to_string()]
            else:
                parts += ["", "parameters: all equal"]
            multi = [g for g in self.groups if g["n"] > 1]
            if multi:
                m = f"best_{self.metric}"
                parts += ["", "seeds aggregated (runs equal but for seed):"]
                for g in multi:
                    mean, std = g[f"{m}_mean"], g[f"{m}_std"]
                    shown = f"{mean:.4g} +- {std:.2g}" if mean is not None and std is not None else "-"
                    parts.append(f"  n={g['n']} seeds {g['seeds']}: {m} {shown}  ({', '.join(g['runs'])})")
        if self.best:
            b = self.best
            parts += [
                "",
                f"best across runs: {b['run']} {b['checkpoint']} (step {b['step']}, {self.metric} {b['value']:.4g})",
            ]
        return "\n".join(parts)


def compare(
    runs: Sequence[str | os.PathLike],
    metric: str = rck.DEFAULT_METRIC,
    mode: str | None = None,
    runs_dir: str | os.PathLike | None = None,
) -> Comparison:
    """Load ``runs`` (ids or paths) and compare them by ``metric`` (see the module docstring)."""
    if not runs:
        raise ConfigError("compare: name at least one run (`python -m tutorial_utils runs list` shows them).")
    loaded = [load_run(r, runs_dir) for r in runs]
    _check_metric(loaded, metric)
    mode = rck.metric_mode(metric, mode)
    try:
        best = best_across_runs([r.path for r in loaded], metric, mode)
    except rck.MetricError:
        best = None  # validated, but no checkpoint was saved at a validated step
    return Comparison(
        loaded,
        metric,
        mode,
        [run_row(r, metric, mode) for r in loaded],
        param_diff(loaded),
        seed_groups(loaded, metric, mode),
        best,
    )

"""A run's checkpoints: the listing, ``best`` by hand, keep-last-N, evaluated success rates.

``checkpoints/step_*`` are complete, resumable checkpoints (policy files + training state);
``last`` is a symlink to the newest; ``best`` holds the weights of the lowest validation action
error (or, after :func:`mark_best`, the checkpoint chosen by hand: the training loop then leaves
it alone). Pruning (:func:`prune`, and the loop's ``keep_last``) never deletes ``last``'s target,
``best``, nor the ``step_*`` that ``best`` came from.

An evaluated success rate is shown when a results file is known for the checkpoint: one passed
in ``results`` (``{checkpoint name: results.json}``), ``<checkpoint>/results.json``, or one
attached with :func:`attach_results` (``<run>/evaluations/<name>/results.json``). Each rate
comes with its 95% Wilson interval.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tutorial_utils.errors import ConfigError
from tutorial_utils.io import atomic_dir, atomic_write_json, dir_size, read_json_or_empty, read_small
from tutorial_utils.runs.registry import RunBusy, read_metrics, resolve, resolve_owned, run_state
from tutorial_utils.train import checkpoints as ck

#: where :func:`attach_results` keeps an evaluation's results.json, per checkpoint name
EVALUATIONS_DIR = "evaluations"
RESULTS_FILE = "results.json"  # the evaluation's file (tutorial_utils.evaluate.loop.RESULTS_FILE)
#: the policy files a checkpoint shares with ``best`` and an exported bundle
POLICY_FILES = ("model.safetensors", "config.json", "dataset_statistics.json")
#: what ``best`` is chosen by unless the user names another metric (lower is better)
DEFAULT_METRIC = "val_action_mae"
#: metrics where higher is better (any other metric: lower is better)
HIGHER_IS_BETTER = ("success_rate",)
#: validation-row keys that are not metrics
_NOT_METRICS = ("step", "best", "time", "val_frames")


class MetricError(ConfigError):
    """A metric the run does not record, or that no checkpoint of the run carries."""


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float] | None:
    """The Wilson score interval of a success rate (95% by default); None for no episodes."""
    if n <= 0:
        return None
    p = successes / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def _results(run: Path, name: str, path: Path, given: Mapping[str, Any] | None) -> dict | None:
    cands = []
    if given and name in given:
        cands.append(Path(given[name]))
    cands += [path / RESULTS_FILE, run / EVALUATIONS_DIR / name / RESULTS_FILE]
    for c in cands:
        data = read_json_or_empty(c)
        if data.get("total_episodes"):
            n, k = int(data["total_episodes"]), int(data.get("total_successes", 0))
            return {"success_rate": k / n, "episodes": n, "successes": k, "ci95": wilson(k, n), "results": str(c)}
    return None


def _val_at(rows: list[dict], step: int | None) -> dict:
    """The validation row of ``step`` (the loop validates before it saves), else {}."""
    found = {}
    for r in rows:
        if "val_action_mae" in r and r.get("step") == step:
            found = r
    return {k: v for k, v in found.items() if k.startswith("val_")}


def list_checkpoints(
    run: str | os.PathLike, runs_dir: str | os.PathLike | None = None, results: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """One row per checkpoint (``step_*`` oldest first, then ``best``): name, step, time
    (ISO), bytes, reason (periodic, final, SIGTERM, control:stop...), is_last, is_best,
    resumable, the validation metrics at its step (``val_action_mae``...) and, when a results
    file is known, ``success_rate``, ``episodes`` and ``ci95`` (Wilson)."""
    d = resolve(run, runs_dir)
    root = d / ck.CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    rows = read_metrics(d)
    last = ck.last_target(root)
    best_step = ck.best_step(root)
    out = []
    dirs = sorted(p for p in root.glob("step_*") if p.is_dir() and not p.is_symlink())
    if (root / ck.BEST).is_dir():
        dirs.append(root / ck.BEST)
    for p in dirs:
        state = read_json_or_empty(p / ck.TRAIN_STATE_JSON)
        conf = read_json_or_empty(p / "config.json")
        step = ck.checkpoint_step(p)
        when = state.get("time")
        if not isinstance(when, (int, float)):
            when = p.stat().st_mtime
        val = _val_at(rows, step) or {k: v for k, v in (conf.get("val") or {}).items() if k.startswith("val_")}
        marked = conf.get("best") if isinstance(conf.get("best"), dict) else {}
        row = {
            "name": p.name,
            "step": step,
            "time": _dt.datetime.fromtimestamp(when).isoformat(timespec="seconds"),
            "bytes": dir_size(p),
            "reason": state.get("reason") or ("best (by hand)" if marked.get("by") == "hand" else "best"),
            "is_last": p.name == last,
            "is_best": p.name == ck.BEST or (best_step is not None and step == best_step),
            "resumable": ck.is_complete(p) and ck.has_optimizer_state(p),  # keep_optimizer=last drops it
            **val,
        }
        ev = _results(d, p.name, p, results)
        if ev:
            row.update(ev)
        out.append(row)
    return out


def attach_results(
    run: str | os.PathLike, checkpoint: str, results_json: str | os.PathLike, runs_dir: str | os.PathLike | None = None
) -> Path:
    """Record an evaluation of ``checkpoint`` (its ``results.json``) in the run, so the listing
    shows its success rate."""
    d = resolve(run, runs_dir)
    path = ck.resolve_checkpoint(d / ck.CHECKPOINTS_DIR, checkpoint, resumable=False)
    data = read_small(
        results_json,
        schema={"total_episodes": int, "total_successes": int},
        fix="pass the results.json an evaluation wrote (runs evaluate / the evaluation job)",
    )
    return atomic_write_json(d / EVALUATIONS_DIR / path.name / RESULTS_FILE, data)


def metric_mode(metric: str, mode: str | None = None) -> str:
    """``"min"`` or ``"max"``: ``mode`` when given, else ``max`` for :data:`HIGHER_IS_BETTER`
    (and any name with ``success`` in it), ``min`` for the rest (errors, losses)."""
    if mode is None:
        return "max" if metric in HIGHER_IS_BETTER or "success" in metric else "min"
    if mode not in ("min", "max"):
        raise ConfigError(f"mode={mode!r}: pass 'min' (lower is better) or 'max' (higher is better).")
    return mode


def metric_names(rows: list[dict], checkpoints: list[dict] = ()) -> list[str]:
    """The metrics a run records: the keys of its validation rows (``val_*``) and, when a
    checkpoint was evaluated, ``success_rate``."""
    names = {
        k
        for r in rows
        if DEFAULT_METRIC in r
        for k, v in r.items()
        if k not in _NOT_METRICS and isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    names |= {k for c in checkpoints for k in HIGHER_IS_BETTER if isinstance(c.get(k), (int, float))}
    return sorted(names)


def _score(row: dict, metric: str) -> float | None:
    v = row.get(metric)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def pick_best(rows: list[dict], metric: str, mode: str | None = None) -> dict | None:
    """The row with the best finite ``metric`` (``mode`` as :func:`metric_mode`); a tie goes to
    the earlier row. None when no row has the metric."""
    scored = [(v, i) for i, r in enumerate(rows) if (v := _score(r, metric)) is not None]
    if not scored:
        return None
    sign = -1.0 if metric_mode(metric, mode) == "max" else 1.0
    return rows[min(scored, key=lambda t: (sign * t[0], t[1]))[1]]


def best_checkpoint(
    run: str | os.PathLike,
    metric: str = DEFAULT_METRIC,
    mode: str | None = None,
    runs_dir: str | os.PathLike | None = None,
    results: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``step_*`` checkpoint of a run that is best by ``metric``: any key of the validation
    rows (``val_action_mae`` by default, lower is better) or ``success_rate`` (higher is better)
    for evaluated checkpoints. Returns its :func:`list_checkpoints` row plus ``run``, ``metric``,
    ``mode`` and ``value``. A :class:`MetricError` names the metrics the run has."""
    d = resolve(run, runs_dir)
    cks = [r for r in list_checkpoints(d, results=results) if r["name"] != ck.BEST]
    known = metric_names(read_metrics(d), cks)
    if metric not in known:
        raise MetricError(
            f"{d / ck.METRICS_FILE}: run {d.name} has no metric {metric!r}. Its metrics: {', '.join(known) or 'none'} "
            f"(validation rows; success_rate once a checkpoint is evaluated: runs.checkpoints.attach_results). "
            "Pass one of them as metric (--metric)."
        )
    row = pick_best(cks, metric, mode)
    if row is None:
        raise MetricError(
            f"{d}: no checkpoint of run {d.name} carries {metric!r} (checkpoints: "
            f"{', '.join(r['name'] for r in cks) or 'none'}). Validation runs every eval_freq steps and checkpoints "
            "every save_freq steps: make save_freq a multiple of eval_freq, or evaluate a checkpoint for success_rate."
        )
    return {
        **row,
        "run": d.name,
        "path": str(d),
        "metric": metric,
        "mode": metric_mode(metric, mode),
        "value": row[metric],
    }


def mark_best(
    run: str | os.PathLike,
    checkpoint: str | None = None,
    runs_dir: str | os.PathLike | None = None,
    *,
    metric: str | None = None,
    mode: str | None = None,
) -> Path:
    """Make ``checkpoint`` the run's ``best`` by hand: its policy files are copied into
    ``checkpoints/best`` (replaced atomically), whose config.json records ``best: {by: hand,
    from, step, time}``. The training loop then no longer replaces ``best`` on a lower
    validation error. Without ``checkpoint``, the one best by ``metric`` (default
    :data:`DEFAULT_METRIC`, see :func:`best_checkpoint`) is marked and the record also says
    ``metric``, ``mode`` and ``value``. Returns the ``best`` directory."""
    d = resolve(run, runs_dir)
    root = d / ck.CHECKPOINTS_DIR
    chosen: dict[str, Any] = {}
    if checkpoint is not None and (metric or mode):
        raise MetricError(
            f"mark_best got both a checkpoint ({checkpoint!r}) and a metric/mode: name the checkpoint to mark it "
            "by hand, or give only the metric (and mode) to mark the best one by it"
        )
    if checkpoint is None:
        pick = best_checkpoint(d, metric or DEFAULT_METRIC, mode)
        checkpoint = pick["name"]
        chosen = {"metric": pick["metric"], "mode": pick["mode"], "value": pick["value"]}
    src = ck.resolve_checkpoint(root, checkpoint, resumable=False)
    if src.name == ck.BEST:
        raise ck.CheckpointNotFound(f"{checkpoint!r} is best already; name the step_* checkpoint to mark.")
    step = ck.checkpoint_step(src)
    conf = read_json_or_empty(src / "config.json")
    with atomic_dir(root / ck.BEST) as tmp:
        for name in POLICY_FILES:
            if name != "config.json":
                shutil.copy2(src / name, tmp / name)
        val = _val_at(read_metrics(d), step)
        conf["best"] = {
            "by": "hand",
            "from": src.name,
            "step": step,
            "time": _dt.datetime.now().isoformat(timespec="seconds"),
            **chosen,
        }
        if val:
            conf["val"] = val
        atomic_write_json(tmp / "config.json", conf)
    return root / ck.BEST


def prune(run: str | os.PathLike, keep_last: int, runs_dir: str | os.PathLike | None = None) -> list[str]:
    """Keep the newest ``keep_last`` ``step_*`` checkpoints of a run that is not running (the
    loop's ``keep_last`` does it during training); ``last``'s target and ``best`` stay. Returns
    the deleted names."""
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
        raise ConfigError(
            f"keep_last={keep_last!r}: pass a whole number >= 1 (the newest checkpoints to keep); nothing was removed."
        )
    d = resolve_owned(run, runs_dir, "prune")
    if run_state(d) == "running":
        raise RunBusy(f"run {d.name} is running; pass keep_last to the training run instead, or stop it first.")
    return ck.prune(d / ck.CHECKPOINTS_DIR, keep_last)

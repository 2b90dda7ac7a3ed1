"""Evaluate chosen checkpoints of a run in LIBERO and record the results in the run.

``evaluate_checkpoints(run, ["best", "last", "step_000500"], trials_per_task=10)`` runs the
evaluation chain (policy server + LIBERO client, :mod:`tutorial_utils.evaluate.chain`) once per
checkpoint, each as its own evaluation run under ``runs/`` with its logs, then attaches its
``results.json`` to the training run (:func:`tutorial_utils.runs.checkpoints.attach_results`), so
``runs checkpoints RUN`` lists the success rate with its 95% Wilson interval beside the
validation metrics, and ``runs best RUN --metric success_rate`` picks by it.

Every checkpoint is evaluated on the same episodes (same tasks, trials, init states and client
seed), so the success rates are comparable; the interval says how far apart two rates must be
before the difference means anything.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tutorial_utils import jobs
from tutorial_utils.errors import ConfigError
from tutorial_utils.runs.checkpoints import attach_results, wilson
from tutorial_utils.runs.registry import resolve

#: what a checkpoint is evaluated with unless the caller says otherwise (the evaluate job's names)
DEFAULTS: dict[str, Any] = {"suite": "libero_spatial", "task_ids": "all", "trials_per_task": 1, "videos": False}


def _checkpoint_dir(run_dir: Path, name: str) -> Path:
    from tutorial_utils.train.checkpoints import CHECKPOINTS_DIR, resolve_checkpoint

    return resolve_checkpoint(run_dir / CHECKPOINTS_DIR, name, resumable=False)


def evaluate_checkpoints(
    run: str | os.PathLike,
    checkpoints: list[str] | tuple[str, ...] = ("best", "last"),
    runs_dir: str | os.PathLike | None = None,
    **eval_overrides: Any,
) -> list[dict[str, Any]]:
    """Evaluate each named checkpoint of ``run`` in LIBERO (the evaluate job's parameters as
    keyword arguments: ``suite``, ``task_ids``, ``trials_per_task``, ``workers``...) and attach
    the results to the run. Returns one row per checkpoint: name, step, family, episodes,
    successes, success_rate, ci95 (Wilson), the evaluation run directory."""
    from tutorial_utils.evaluate.chain import run_job
    from tutorial_utils.policies.checkpoint import read_checkpoint_config
    from tutorial_utils.train.checkpoints import checkpoint_step

    d = resolve(run, runs_dir)
    if not checkpoints:
        raise ConfigError("no checkpoint to evaluate: name at least one (best, last, step_000500, ...)")
    for key in ("policy", "checkpoint"):
        if key in eval_overrides:
            raise ConfigError(
                f"{key}= is set from each checkpoint (its config.json names the family); leave it out of the "
                "evaluation parameters"
            )
    # resolve every name first (a typo fails before any evaluation has run); names of one
    # checkpoint (`best` and `last` are often the same step) are evaluated once
    targets: dict[Any, tuple[Path, str]] = {}
    for name in checkpoints:
        path = _checkpoint_dir(d, name)
        targets.setdefault(checkpoint_step(path) or path.resolve(), (path, name))
    params = {**DEFAULTS, **eval_overrides}
    rows = []
    for path, name in targets.values():
        family = read_checkpoint_config(path)["family"]
        eval_dir = os.path.join(runs_dir, jobs.new_run_id("evaluate")) if runs_dir else ""
        res = run_job(eval_dir, policy=family, checkpoint=os.fspath(path), **params)
        if not res.diagnosis.ok:
            raise RuntimeError(
                f"evaluating {d.name}:{name} failed at stage {res.diagnosis.failed_stage}: "
                f"{'; '.join(res.diagnosis.causes[:2])}. Logs: {res.run_dir}"
            )
        results_json = res.run_dir / "results.json"
        attach_results(d, path.name, results_json)
        n, k = int(res.results["total_episodes"]), int(res.results["total_successes"])
        rows.append(
            {
                "checkpoint": name,
                "resolved": path.name,
                "step": checkpoint_step(path),
                "family": family,
                "episodes": n,
                "successes": k,
                "success_rate": k / n if n else None,
                "ci95": wilson(k, n),
                "eval_run": os.fspath(res.run_dir),
            }
        )
    return rows


def describe(rows: list[dict[str, Any]]) -> str:
    """The rows as a small text table (what ``runs evaluate`` prints)."""
    lines = [f"{'checkpoint':<14} {'step':>7} {'success':>9} {'95% CI':>17}  evaluation run"]
    for r in rows:
        lo, hi = r["ci95"] or (float("nan"), float("nan"))
        rate = f"{r['successes']}/{r['episodes']}"
        lines.append(
            f"{r['checkpoint']:<14} {r['step'] if r['step'] is not None else '-':>7} {rate:>9} "
            f"[{100 * lo:5.1f}%, {100 * hi:5.1f}%]  {r['eval_run']}"
        )
    return "\n".join(lines)

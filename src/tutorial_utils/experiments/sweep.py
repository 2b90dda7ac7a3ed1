"""A sweep (the ``sweep`` job, ``notebooks/jobs/sweep.md``): one family, one training parameter,
several values, each trained and evaluated as the zoo does; the best run exported as a bundle and
evaluated through the policy server."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tutorial_utils import jobs, paths
from tutorial_utils.errors import ConfigError
from tutorial_utils.experiments.budget import load_average
from tutorial_utils.experiments.zoo import (
    _eval_params,
    _family_schedule,
    _say,
    _Shared,
    _train_and_evaluate,
    _train_params,
)
from tutorial_utils.io import atomic_write_json
from tutorial_utils.params import param as _param  # SweepConfig has a field named `param`
from tutorial_utils.report.zoo_tables import SWEEP_FILE, outcome


@dataclass
class SweepConfig(_Shared):
    """Every parameter of the sweep job (``notebooks/jobs/sweep.md``, generated from these fields)."""

    policy: str = _param("mini", "the family every run trains", "sweep")
    param: str = _param(
        "optimizer_lr", "the training parameter varied: any TrainConfig name or one of the family's own", "sweep"
    )
    values: str = _param("1e-4,1e-3", "the values of `param`, comma-separated", "sweep", cpu="1e-4,3e-4,1e-3")
    steps: int = _param(4, "training steps of each run", "training", cpu=1500, gpu=20000)
    batch_size: int = _param(2, "samples per training step", "training", cpu=32, gpu=64)
    eval_freq: int = _param(
        2, "validation (and the `best` checkpoint) every N steps (0: only at the end)", "training", cpu=250, gpu=2000
    )
    trials_per_task: int = _param(1, "episodes per task (init states 0, 1, ...)", "evaluation", cpu=2, gpu=50)
    max_steps: int | None = _param(
        10, "step limit per episode (None: the suite's limit, spatial 220)", "evaluation", cpu=None
    )

    def check(self) -> None:
        super().check()
        parse_values(self.policy, self.param, self.values)


def parse_values(policy: str, param: str, values: str) -> list[Any]:
    """``"1e-4,3e-4"`` as values of the training parameter ``param`` (a :class:`TrainConfig` name
    or one of ``policy``'s own), each converted to the parameter's type; a clear error for an
    unknown parameter, a bad value or fewer than two values."""
    import dataclasses

    from tutorial_utils import params, policies
    from tutorial_utils.train.config import TrainConfig

    cls = next(
        (
            c
            for c in (TrainConfig, policies.family(policy).config_class)
            if param in {f.name for f in dataclasses.fields(c)}
        ),
        None,
    )
    if cls is None or param in ("policy", "dataset", "output_dir", "run_id", "resume"):
        raise ConfigError(
            f"param={param!r} is not a training parameter of policy={policy!r} that a sweep can vary; "
            f"see `python -m tutorial_utils train --list-params policy={policy}`"
        )
    out = [params.coerce(cls, param, v.strip(), key=param) for v in str(values).split(",") if v.strip()]
    if len(out) < 2 or len(set(map(repr, out))) != len(out):
        raise ConfigError(f"values={values!r}: give at least two different values of {param}, comma-separated")
    return out


def sweep(run_dir: str | os.PathLike, echo: bool = False, **parameters: Any) -> dict[str, Any]:
    """Train ``policy`` once per value of ``param`` (everything else equal; the family's learning
    rate and warm-up as the zoo sets them, unless ``param`` is one of them), evaluate each run's
    ``best`` checkpoint on the same episodes, pick the best run (success rate, then validation
    error), export its checkpoint as a bundle (parity checked), and evaluate the bundle through
    the policy server as a deployment would. Writes and returns ``sweep.json``'s content."""
    from tutorial_utils import params
    from tutorial_utils.runs import export

    cfg = params.from_mapping(SweepConfig, parameters, "the sweep job's parameters (SweepConfig)")
    param, policy, dataset, steps, batch_size = cfg.param, cfg.policy, cfg.dataset, cfg.steps, cfg.batch_size
    eval_freq, log_freq, num_workers, seed = cfg.eval_freq, cfg.log_freq, cfg.num_workers, cfg.seed
    suite, task_ids, trials_per_task, max_steps, workers = (
        cfg.suite,
        cfg.task_ids,
        cfg.trials_per_task,
        cfg.max_steps,
        cfg.workers,
    )
    vals = parse_values(policy, param, cfg.values)
    run_dir = Path(run_dir)
    ev_params = _eval_params(suite, task_ids, trials_per_task, workers, max_steps)
    base = _train_params(policy, dataset, steps, batch_size, eval_freq, log_freq, num_workers, seed)
    base.update({k: v for k, v in _family_schedule(policy, steps).items() if k != param})  # as the zoo trains it
    out: dict[str, Any] = {
        "kind": "sweep",
        # the training seed stays `seed`; the evaluation's client seed is `eval_seed`
        "config": {
            **base,
            "param": param,
            "values": vals,
            **{("eval_seed" if k == "seed" else k): v for k, v in ev_params.items()},
            "cpu_count": os.cpu_count(),
        },  # fmt: skip
        "rows": [],
        "curves": {},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "finished": False,
    }
    for v in vals:
        label = f"{param}={v}"
        print(f"[zoo] {label}: {policy}, {steps} steps", flush=True)
        row, curves = _train_and_evaluate(label, {**base, param: v}, ev_params, echo, load=load_average())
        row["value"] = v
        out["rows"].append(row)
        out["curves"][label] = curves
        atomic_write_json(run_dir / SWEEP_FILE, out)
        _say(row)
    best = max(out["rows"], key=lambda r: (r["success_rate"] or 0.0, -(r["best_val_action_mae"] or math.inf)))
    source = paths.from_book(best["train_run"]) / "checkpoints" / best["checkpoint"]
    bundle = run_dir / "bundle"
    manifest = export.verify(bundle) if (bundle / export.MANIFEST_FILE).is_file() else export.export(source, bundle)
    ev = jobs.run_notebook(
        paths.JOBS / "evaluate.md", {"policy": policy, "checkpoint": os.fspath(bundle), **ev_params}, echo=echo
    )
    results = json.loads((ev.run_dir / "results.json").read_text(encoding="utf-8"))
    out["best"] = best["label"]
    out["bundle"] = {
        "from": best["label"],
        "path": paths.for_book(os.fspath(bundle)),
        "step": manifest["step"],
        "parity": manifest["parity"],
        "files": {name: f["bytes"] for name, f in manifest["files"].items()},
        **outcome(results),
        "eval_run": paths.for_book(os.fspath(ev.run_dir)),
    }
    out["finished"] = True
    atomic_write_json(run_dir / SWEEP_FILE, out)
    b = out["bundle"]
    print(
        f"[zoo] bundle of {b['from']} (step {b['step']}, parity {b['parity']['max_abs_diff']:.2g}): "
        f"{b['successes']}/{b['episodes']} episodes through the policy server",
        flush=True,
    )
    return out

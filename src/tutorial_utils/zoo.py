"""The model zoo comparison: every family that trains on the recorded demonstrations, given the
same demonstrations and the same CPU budget, evaluated with the same LIBERO client.

``run(...)`` (the ``zoo`` job, ``notebooks/jobs/zoo.md``) does, for each family:

1. **budget -> steps**: 30 training steps of the family on the dataset, through the real trainer
   and data loader (:func:`calibrate`), turn the shared budget (``train_minutes``) into a step count, so every
   family gets about the same CPU time *and* a learning-rate schedule that ends where its budget
   does (a wall-clock stop would cut a cosine schedule in the middle). The load average at that
   moment is recorded: on a busy machine the steps come out lower, and the table says so.
2. **train**: the train job (``notebooks/jobs/train.md``) with those steps, a real run directory
   under ``runs/`` with every platform file (metrics, checkpoints, status, health);
3. **evaluate**: the evaluate job on the run's ``best`` checkpoint (lowest validation action
   error) with the same tasks, trials, init states and client seed for every family; the results
   are attached to the training run (``runs checkpoints RUN`` shows them);
4. **table**: one row per family: parameters, steps, samples/s, validation error, success rate
   with its 95% Wilson interval, the policy server's round-trip latency.

Both jobs are reused when a finished run with the same parameters exists, so an interrupted zoo
continues where it stopped. The result is ``zoo.json`` (with the curves and per-task successes
the chapter plots) in the zoo's run directory; ``promote`` copies it into ``logs/``.
CLI: ``python -m tutorial_utils zoo {table,promote} RUN_DIR``; ``zoo smolvla-smoke`` runs LeRobot's
SmolVLA on a local stand-in VLM (:func:`smolvla_smoke`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tutorial_utils import jobs, paths
from tutorial_utils.errors import ConfigError, TutorialError, error_text
from tutorial_utils.io import atomic_write_json
from tutorial_utils.params import param
from tutorial_utils.params import param as _param  # SweepConfig has a field named `param`
from tutorial_utils.policies.base import PolicyUnavailable
from tutorial_utils.report.zoo_tables import SWEEP_FILE, ZOO_FILE, load, row_label, text
from tutorial_utils.train.speed import budget_steps

#: the catalogue's groups, in the order the platform guide presents them
GROUPS = ("vision-language-action", "imitation learning", "policy learning", "reinforcement learning", "this book")


def _families_with(attribute: str) -> list[type]:
    """The registered TrainablePolicy classes (registration order) whose ``attribute`` is set."""
    from tutorial_utils import policies

    out = []
    for name in policies.registered():
        try:
            cls = policies.family(name)
        except PolicyUnavailable:  # a serving-only policy
            continue
        if getattr(cls, attribute, None):
            out.append(cls)
    return out


def comparison_families() -> tuple[str, ...]:
    """The families the comparison trains and evaluates: those whose class sets ``comparison = True``
    (mini, act, diffusion, vqbet), in registration order."""
    return tuple(cls.name for cls in _families_with("comparison"))


def learning_rate(name: str) -> float:
    """The peak learning rate family ``name`` trains with (its recipe's, ``train.config.family_recipe``)."""
    from tutorial_utils.train.config import family_recipe

    return family_recipe(name)["optimizer_lr"]


def timing_overrides(name: str) -> dict[str, Any]:
    """Config overrides only the zoo's step timing uses (the family's ``timing_overrides``)."""
    from tutorial_utils import policies

    return dict(policies.family(name).timing_overrides)


def __getattr__(name: str) -> Any:
    if name == "FAMILIES":  # read from the families' classes when asked (it imports them)
        return comparison_families()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def catalog():
    """The families with a catalogue row (their class's ``catalog``) as a pandas DataFrame: group,
    the guide's scenario, how far it goes here, whether the project's trainer trains it, whether
    the comparison includes it and whether it needs a GPU server."""
    import pandas as pd

    from tutorial_utils import policies

    gpu = set(policies.gpu_server())
    classes = _families_with("catalog")
    order = {g: i for i, g in enumerate(GROUPS)}
    classes.sort(key=lambda c: order.get(c.catalog["group"], len(GROUPS)))
    rows = [
        {
            "family": c.name,
            "group": c.catalog["group"],
            "scenario": c.catalog["scenario"],
            "here": c.catalog["here"],
            "trains here": c.name not in gpu and bool(c.trains_here) and not policies.trainer_refusal(c.name),
            "in the comparison": bool(c.comparison),
            "GPU server": c.name in gpu,
        }
        for c in classes
    ]
    return pd.DataFrame(rows).set_index("family")


def parse_families(text: str | None) -> list[str]:
    """``"mini,act"`` -> ``["mini", "act"]``, None -> every family of the comparison. A family
    outside the comparison that the trainer trains (``mlp``, ``tdmpc``: for a positive control) may
    be named; an unknown name, or a family the trainer refuses (SAC, :func:`policies.trainer_refusal`),
    is a clear error."""
    from tutorial_utils import policies

    families = comparison_families()
    if text is None:
        return list(families)
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    if not names:
        raise ConfigError(f"families={text!r}: name at least one of {', '.join(families)}")
    trainable = policies.trainable()
    for n in names:
        if n not in families:
            cls = policies.family(n) if n in trainable else None
            if cls is not None and not policies.trainer_refusal(n):
                continue  # the trainer trains it, outside the comparison (mlp, tdmpc)
            if cls is not None:
                group = (cls.catalog or {}).get("group")
                other = (
                    f"it is built here{f' ({group})' if group else ''} but not part of the comparison. "
                    f"{getattr(cls, 'what_ran', '')}".strip()
                )
            else:
                other = f"trainable families: {', '.join(trainable)}"
            raise ConfigError(f"families: {n!r} is not in the zoo's comparison ({', '.join(families)}); {other}")
    if len(set(names)) != len(names):
        raise ConfigError(f"families={text!r} names a family twice")
    return names


def time_family(
    name: str, steps: int = 3, batch_size: int = 8, overrides: dict | None = None, round_trips: bool = False
) -> dict[str, Any]:
    """Time ``steps`` training steps (forward, backward, AdamW) of family ``name`` at its default
    config (plus ``overrides``) on synthetic frames of its image size, and ``predict`` on one
    observation. The first step is a warm-up and not counted. Returns parameters (M), image
    size, action horizon, seconds per step, samples/s, predict seconds, build seconds and, with
    ``round_trips``, the p50 of requests through a websocket policy server serving the model."""
    import numpy as np
    import torch

    from tutorial_utils import policies
    from tutorial_utils.train.data import WindowDataset, collate, synthetic_source

    t0 = time.perf_counter()
    overrides = dict(overrides or {})
    cfg = policies.family(name).config_class
    size = int(overrides.get("image_size", cfg().image_size))
    src = synthetic_source(n_episodes=4, length=24, image_size=size)
    model = policies.make(name, overrides or None, src.statistics)
    build_s = time.perf_counter() - t0
    windows = model.training_source(src) if hasattr(model, "training_source") else src  # the family's own windows
    ds = WindowDataset(windows, np.arange(len(src)), model.action_horizon, model.image_size)
    rng = np.random.default_rng(0)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    model.train()
    times = []
    for step in range(steps + 1):
        batch = collate([ds[int(i)] for i in rng.choice(len(src), batch_size)])
        t = time.perf_counter()
        out = model(batch, torch.Generator().manual_seed(step))
        opt.zero_grad(set_to_none=True)
        out["total_loss"].backward()
        opt.step()
        if step:
            times.append(time.perf_counter() - t)
    one = collate([ds[0]])
    model.predict(one, generator=torch.Generator().manual_seed(0))  # warm-up
    lat = []
    for k in range(3):
        t = time.perf_counter()
        model.predict(one, generator=torch.Generator().manual_seed(k))
        lat.append(time.perf_counter() - t)
    rt = _round_trips(model, one) if round_trips else []
    step_s = float(np.median(times))
    return {
        "family": name,
        "params_m": round(model.parameter_counts()["total"] / 1e6, 2),
        "image_size": model.image_size,
        "action_horizon": model.action_horizon,
        "s_per_step": round(step_s, 4),
        "samples_per_s": round(batch_size / step_s, 2),
        "predict_s": round(float(np.median(lat)), 4),
        "build_s": round(build_s, 1),
        "round_trip_ms_p50": round(float(np.median(rt)), 1) if rt else None,
    }


def _round_trips(model, batch, n: int = 5) -> list[float]:
    """Milliseconds of ``n`` requests (after one warm-up) to a policy server serving ``model``,
    sent as the LIBERO client sends them (openpi keys, the policy's image size)."""
    from tutorial_utils.report.platform import openpi_observation
    from tutorial_utils.serve.client import PolicyClient
    from tutorial_utils.serve.server import ServerThread

    obs = openpi_observation(batch, 0)
    out = []
    with ServerThread(model.serving_policy()) as srv, PolicyClient(port=srv.port, connect_timeout=30) as client:
        client.infer(obs)
        for _ in range(n):
            t = time.perf_counter()
            client.infer(obs)
            out.append((time.perf_counter() - t) * 1000.0)
    return out


def calibrate(
    name: str, dataset: str, batch_size: int, num_workers: int, steps: int = 30, log_freq: int = 5
) -> dict[str, Any]:
    """Seconds per training step of family ``name`` on ``dataset`` as the train job will run it
    (the real trainer, data loader and workers, on this machine now), from ``steps`` steps in a
    temporary folder: the median of the logged windows after the first (the first holds the
    warm-up). Also returns the load average before it started."""
    import statistics
    import tempfile

    from tutorial_utils.io import read_jsonl
    from tutorial_utils.train.config import TrainConfig
    from tutorial_utils.train.job import resolve_dataset
    from tutorial_utils.train.loop import METRICS_FILE, train

    load = _load()
    with tempfile.TemporaryDirectory(prefix=f"zoo-calibrate-{name}-") as tmp:
        root = resolve_dataset(dataset, tmp)
        cfg = TrainConfig.from_overrides(
            {
                "policy": name,
                "dataset": str(root),
                "output_dir": str(Path(tmp) / "run"),
                "steps": steps,
                "batch_size": batch_size,
                "num_workers": num_workers,
                "eval_freq": 0,
                "log_freq": log_freq,
                "save_checkpoint": False,
                "progress": False,
                **{f"policy.{k}": v for k, v in timing_overrides(name).items()},
            }
        )
        t0 = time.perf_counter()
        train(cfg)
        wall = time.perf_counter() - t0
        rates = [r["samples_per_s"] for r in read_jsonl(Path(tmp) / "run" / METRICS_FILE) if "samples_per_s" in r]
    if len(rates) < 2:
        raise RuntimeError(f"calibrating {name}: {len(rates)} metrics windows; give it more steps than log_freq")
    return {
        "s_per_step": round(batch_size / statistics.median(rates[1:]), 4),
        "steps": steps,
        "wall_s": round(wall, 1),
        "load": load,
    }


def _budgeted_before(
    fam: str, dataset: str, batch_size: int, num_workers: int, seed: int, minutes: float
) -> tuple[int, dict] | None:
    """``(steps, timing)`` of a finished zoo training of ``fam`` with the same budget and data in
    this profile (its steps came from a calibration, which never repeats exactly): rerunning an
    interrupted zoo then reuses that training instead of calibrating again and training anew."""
    from tutorial_utils import profiles

    want = {
        "policy": fam,
        "dataset": dataset,
        "batch_size": batch_size,
        "num_workers": num_workers,
        "seed": seed,
        "time_limit_min": _safety_limit(minutes),
    }
    for row in reversed(jobs.list_runs()):
        if row["job"] != "train" or row["state"] != "succeeded" or row["profile"] != profiles.current():
            continue
        st = jobs.read_status(paths.RUNS / row["run_id"])
        got = st.get("parameters") or {}
        if all(got.get(k) == v for k, v in want.items()) and isinstance(got.get("steps"), int):
            return got["steps"], {"reused_budget_of": row["run_id"]}
    return None


def demonstrations(dataset: str, suite: str, task_ids: str, trials_per_task: int) -> dict[str, Any] | None:
    """What the families learn from, and how it meets the evaluation: the dataset's episodes and,
    from its ``meta/record_manifest.json`` (datasets the record job wrote), the
    demonstrations per task, the init states they start from, and how many of the evaluated
    (task, init state) pairs a demonstration started from (trial ``k`` of a task is evaluated from
    its init state ``k``). None for the synthetic dataset."""
    if dataset == "synthetic":
        return None
    from collections import Counter

    from tutorial_utils.evaluate.loop import EvalConfig
    from tutorial_utils.evaluate.parallel import resolve_task_ids
    from tutorial_utils.sim.record import read_manifest
    from tutorial_utils.train.job import resolve_dataset

    root = resolve_dataset(dataset, paths.RUNS)  # a name or a path: run_dir is only used for synthetic
    info = json.loads((root / "meta" / "info.json").read_text(encoding="utf-8"))
    out: dict[str, Any] = {"episodes": info.get("total_episodes")}
    manifest = read_manifest(root)
    if not manifest:
        return out
    pairs = {
        (int(e["task_id"]), int(e["init_state"]))
        for e in manifest.get("episodes", [])
        if e.get("success") and e.get("episode_index") is not None
    }
    if not pairs:
        return out
    per_task = Counter(t for t, _ in pairs)
    inits = sorted({i for _, i in pairs})
    tasks = resolve_task_ids(EvalConfig(suite=suite, task_ids=task_ids))
    evaluated = {(t, k) for t in tasks for k in range(int(trials_per_task))}
    out.update(
        per_task_min=min(per_task.values()),
        per_task_max=max(per_task.values()),
        init_states=[inits[0], inits[-1]],
        eval_pairs=len(evaluated),
        eval_pairs_seen=len(evaluated & pairs),
    )
    return out


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


#: the zoo times a family only once the 1-minute load is below this share of the cores, or after
#: :data:`SETTLE_MAX_S`: on 2 cores, steps timed while the previous family's evaluation was still
#: ending ran up to four times slower than the same steps a minute later (TD-MPC: 1.09 against 0.27 s)
SETTLE_LOAD_SHARE = 0.5
SETTLE_MAX_S = 120.0


def settle(max_s: float = SETTLE_MAX_S, share: float = SETTLE_LOAD_SHARE, poll_s: float = 5.0, sleep=time.sleep):
    """Wait until the machine is quiet enough to time steps (the 1-minute load below ``share`` of
    the cores) or ``max_s`` passed. Returns ``(load before, load after, seconds waited)``."""
    before = _load()
    waited = 0.0
    limit = share * (os.cpu_count() or 1)
    while waited < max_s and (_load() or 0.0) >= limit:
        sleep(poll_s)
        waited += poll_s
    return before, _load(), waited


def _outcome(results: dict) -> dict[str, Any]:
    """An evaluation's episodes, successes, success rate with its Wilson interval, and the
    policy server's latency (:func:`tutorial_utils.evaluate.loop.latency_summary`)."""
    from tutorial_utils.evaluate.loop import latency_summary
    from tutorial_utils.runs.checkpoints import wilson

    n, k = int(results["total_episodes"]), int(results["total_successes"])
    lo, hi = wilson(k, n) or (None, None)
    return {
        "episodes": n,
        "successes": k,
        "success_rate": k / n if n else None,
        "ci95_low": lo,
        "ci95_high": hi,
        **latency_summary(results),
    }


def _family_row(
    fam: str, train_dir: Path, eval_dir: Path, results: dict, timing: dict | None, load: float | None
) -> dict[str, Any]:
    """One row of the table from the family's training run and its evaluation's results."""
    summary = json.loads((train_dir / "summary.json").read_text(encoding="utf-8"))
    best = summary.get("best") or {}
    return {
        "family": fam,
        "params_m": round(summary["parameters"]["total"] / 1e6, 2),
        "batch_size": summary["batch_size"],
        "steps": summary["steps_done"],
        "steps_planned": summary.get("steps"),
        "time_limited": bool(summary.get("time_limited")),
        "train_min": round(summary["wall_s"] / 60.0, 1),
        "samples_per_s": round(summary["samples_per_s"], 1),
        "data_wait_share": round(summary["data_wait_share"], 3),
        "last_loss": summary.get("last_loss"),
        "best_val_action_mae": best.get("val_action_mae"),
        "best_step": best.get("step"),
        **_outcome(results),
        "timed_s_per_step": (timing or {}).get("s_per_step"),
        "load_at_start": load,
        **({"settle_s": timing["settle_s"]} if timing and "settle_s" in timing else {}),
        "train_run": paths.for_book(os.fspath(train_dir)),
        "eval_run": paths.for_book(os.fspath(eval_dir)),
    }


def _curves(train_dir: Path, results: dict) -> dict[str, Any]:
    """What the chapter plots of one family: loss and validation rows, successes per task."""
    from tutorial_utils.runs.registry import read_metrics

    rows = read_metrics(train_dir)
    return {
        "train": [[r["step"], r["loss"]] for r in rows if isinstance(r.get("loss"), (int, float))],
        "val": [[r["step"], r["val_action_mae"]] for r in rows if isinstance(r.get("val_action_mae"), (int, float))],
        "per_task": [
            {"task_id": t["task_id"], "task": t["task"], "successes": t["successes"], "episodes": len(t["episodes"])}
            for t in results.get("tasks", [])
        ],
    }


def _safety_limit(minutes: float) -> float:
    """The train job's ``time_limit_min`` for a budget of ``minutes``: a safety net past the
    budget (the calibrated steps should end first); also how a zoo training is recognised."""
    return round(1.5 * minutes, 2)


def _train_params(
    policy: str, dataset: str, steps: int, batch_size: int, eval_freq: int, log_freq: int, num_workers: int, seed: int
) -> dict[str, Any]:
    """The train job's parameters every compared run shares (checkpoints at each validation)."""
    return {
        "policy": policy,
        "dataset": dataset,
        "steps": steps,
        "batch_size": batch_size,
        "eval_freq": eval_freq,
        "log_freq": log_freq,
        "save_freq": eval_freq,
        "num_workers": num_workers,
        "seed": seed,
        "freeze_modules": "",
    }


def _family_schedule(family: str, steps: int) -> dict[str, Any]:
    """What the zoo and the sweep add to a family's own recipe (which the train job applies itself:
    ``train.config.family_recipe``): a warm-up of a tenth of the steps (at most 200) where the
    recipe names no warm-up of its own (ACT's and TD-MPC's have none)."""
    from tutorial_utils import policies

    if "scheduler_warmup_steps" in policies.family(family).train_defaults:
        return {}
    return {"scheduler_warmup_steps": min(200, max(0, steps // 10))}


def _positive(**values: int) -> None:
    for key, value in values.items():
        if int(value) < 1:
            raise ConfigError(f"{key}={value} must be >= 1")


def _eval_params(
    suite: str,
    task_ids: str,
    trials_per_task: int,
    workers: int,
    max_steps: int | None,
    replan_steps: int | None = None,
) -> dict:
    """The evaluate job's parameters every compared run is evaluated with (same client seed)."""
    out: dict[str, Any] = {
        "suite": suite,
        "task_ids": task_ids,
        "trials_per_task": trials_per_task,
        "seed": 7,
        "workers": workers,
    }
    if max_steps is not None:  # None: the suite's own limit
        out["max_steps"] = int(max_steps)
    if replan_steps is not None:  # None: each family's own (its whole chunk, or its n_action_steps)
        out["replan_steps"] = int(replan_steps)
    return out


def _train_and_evaluate(
    label: str, train_params: dict, ev_params: dict, echo: bool, timing: dict | None = None, load: float | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The train job, then the evaluate job on its ``best`` checkpoint (both reused when they
    finished before with the same parameters); the results attached to the run and its health
    recorded. Returns the table row and the curves of this run."""
    from tutorial_utils.runs import health
    from tutorial_utils.runs.checkpoints import attach_results

    fam = train_params["policy"]
    tr = jobs.run_notebook(paths.JOBS / "train.md", train_params, reuse=True, echo=echo)
    status = jobs.read_status(tr.run_dir).get("train") or {}
    ckpt = status.get("best_checkpoint") or status.get("last_checkpoint")
    if not ckpt:
        raise RuntimeError(f"{tr.run_dir}: the {label} training left no checkpoint to evaluate")
    ev = jobs.run_notebook(
        paths.JOBS / "evaluate.md", {"policy": fam, "checkpoint": ckpt, **ev_params}, reuse=True, echo=echo
    )
    attach_results(tr.run_dir, Path(ckpt).name, ev.run_dir / "results.json")
    diagnosis = health.diagnose(tr.run_dir)  # now with the success rate (the "loss falls, success 0" checklist)
    health.record(tr.run_dir, diagnosis=diagnosis)
    results = json.loads((ev.run_dir / "results.json").read_text(encoding="utf-8"))
    row = _family_row(fam, tr.run_dir, ev.run_dir, results, timing, load)
    row.update(
        label=label,
        checkpoint=Path(ckpt).name,
        reused=bool(tr.reused and ev.reused),
        health=[f.code for f in diagnosis.findings if f.severity != "info"],
    )
    return row, _curves(tr.run_dir, results)


def _say(row: dict) -> None:
    print(
        f"[zoo] {row['label']}: {row['successes']}/{row['episodes']} episodes "
        f"({100 * (row['success_rate'] or 0):.0f}%), {row['steps']} steps in {row['train_min']} min",
        flush=True,
    )


_DATASET = {
    "cpu": "libero_spatial_no_noops_expert_128_init10_lerobot",
    "gpu": "libero_spatial_no_noops_expert_256_lerobot",
}


@dataclass
class _Shared:
    """The training and evaluation parameters every run of a zoo or a sweep shares."""

    dataset: str = param(
        "synthetic", "the demonstrations: a name under data/, a path, or synthetic", "training", **_DATASET
    )
    steps: int = param(2, "training steps of each run", "training")
    batch_size: int = param(2, "samples per training step", "training", cpu=16, gpu=64)
    eval_freq: int = param(
        0, "validation (and the `best` checkpoint) every N steps (0: only at the end)", "training", cpu=250, gpu=1000
    )
    log_freq: int = param(1, "a loss line and a metrics row every N steps", "training", cpu=25, gpu=100)
    num_workers: int = param(0, "DataLoader worker processes of each training", "training", cpu=1, gpu=8)
    seed: int = param(42, "training seed of every run", "training")
    suite: str = param("libero_spatial", "LIBERO suite of the evaluation", "evaluation")
    task_ids: str = param("0", "tasks evaluated: all, 0-4, 0,3", "evaluation", cpu="all")
    trials_per_task: int = param(1, "episodes per task (init states 0, 1, ...)", "evaluation", cpu=10, gpu=50)
    max_steps: int | None = param(
        20, "step limit per episode (None: the suite's limit, spatial 220)", "evaluation", cpu=None
    )
    workers: int = param(1, "LIBERO client processes per evaluation", "evaluation", cpu=2, gpu=8)

    def check(self) -> None:
        _positive(
            trials_per_task=self.trials_per_task, workers=self.workers, batch_size=self.batch_size, steps=self.steps
        )
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"max_steps={self.max_steps} must be >= 1 (None: the suite's own limit)")


@dataclass
class ZooConfig(_Shared):
    """Every parameter of the zoo job (``notebooks/jobs/zoo.md``, generated from these fields)."""

    families: str | None = param(
        None, "comma-separated families (None: every family of the comparison: mini,act,diffusion,vqbet)", "zoo"
    )
    train_minutes: float | None = param(
        None,
        "the CPU budget of each family, minutes, turned into steps by timing it (None: train `steps` steps each)",
        "zoo",
        cpu=10.0,
        gpu=30.0,
    )
    replan_steps: int | None = param(
        None, "actions of each chunk executed before asking again (None: each family's own)", "evaluation"
    )

    def check(self) -> None:
        super().check()
        parse_families(self.families)
        if self.replan_steps is not None and self.replan_steps < 1:
            raise ConfigError(f"replan_steps={self.replan_steps} must be >= 1 (None: each family's own)")
        if self.train_minutes is not None and self.train_minutes <= 0:
            raise ConfigError(f"train_minutes={self.train_minutes} must be > 0 (None: train `steps` steps each)")


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


def run(run_dir: str | os.PathLike, echo: bool = False, **parameters: Any) -> dict[str, Any]:
    """The comparison (see the module docstring) with the :class:`ZooConfig` ``parameters``:
    ``train_minutes`` is the CPU budget of each family (turned into steps by timing it); None
    trains every family ``steps`` steps. Writes and returns ``zoo.json``'s content."""
    from tutorial_utils import params

    cfg = params.from_mapping(ZooConfig, parameters, "the zoo job's parameters (ZooConfig)")
    names = parse_families(cfg.families)
    dataset, train_minutes, steps, batch_size = cfg.dataset, cfg.train_minutes, cfg.steps, cfg.batch_size
    eval_freq, log_freq, num_workers, seed = cfg.eval_freq, cfg.log_freq, cfg.num_workers, cfg.seed
    suite, task_ids, trials_per_task, max_steps = cfg.suite, cfg.task_ids, cfg.trials_per_task, cfg.max_steps
    workers, replan_steps = cfg.workers, cfg.replan_steps
    run_dir = Path(run_dir)
    out: dict[str, Any] = {
        "kind": "zoo",
        "config": {
            "families": names,
            "dataset": dataset,
            "train_minutes": train_minutes,
            "steps": steps,
            "batch_size": batch_size,
            "eval_freq": eval_freq,
            "seed": seed,
            "suite": suite,
            "task_ids": task_ids,
            "trials_per_task": trials_per_task,
            "max_steps": max_steps,
            "workers": workers,
            "replan_steps": replan_steps,
            "learning_rates": {f: learning_rate(f) for f in names},
            "cpu_count": os.cpu_count(),
            "demonstrations": demonstrations(dataset, suite, task_ids, trials_per_task),
        },
        "rows": [],
        "curves": {},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    ev_params = _eval_params(suite, task_ids, trials_per_task, workers, max_steps, replan_steps)
    for fam in names:
        t0 = time.time()
        load = _load()
        timing = None
        fam_steps = int(steps)
        if train_minutes:
            earlier = _budgeted_before(fam, dataset, batch_size, num_workers, seed, train_minutes)
            if earlier:  # a rerun continues with the earlier budget's steps (and reuses that training)
                fam_steps, timing = earlier
            else:
                _, load, settle_s = settle()  # the previous family's evaluation may still be ending
                timing = {**calibrate(fam, dataset, batch_size, num_workers), "settle_s": settle_s}
                fam_steps = budget_steps(timing["s_per_step"], train_minutes)
        print(
            f"[zoo] {fam}: {fam_steps} steps"
            + (
                f" ({train_minutes} min at {timing['s_per_step']} s/step, load {load})"
                if timing and "s_per_step" in timing
                else f" (the budget of {timing['reused_budget_of']})"
                if timing
                else ""
            ),
            flush=True,
        )
        train_params = {
            **_train_params(fam, dataset, fam_steps, batch_size, eval_freq, log_freq, num_workers, seed),
            "save_freq": 0,  # the zoo evaluates `best`, saved at each validation that improves
            **_family_schedule(fam, fam_steps),
        }
        if train_minutes:
            train_params["time_limit_min"] = _safety_limit(train_minutes)
        row, curves = _train_and_evaluate(fam, train_params, ev_params, echo, timing, load)
        row["zoo_s"] = round(time.time() - t0, 1)
        out["rows"].append(row)
        out["curves"][fam] = curves
        out["finished"] = False
        atomic_write_json(run_dir / ZOO_FILE, out)  # a partial table survives an interruption
        _say(row)
    out["finished"] = True
    atomic_write_json(run_dir / ZOO_FILE, out)
    return out


# --- a sweep: one family, one parameter, several values ---------------------------------------------


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
        row, curves = _train_and_evaluate(label, {**base, param: v}, ev_params, echo, load=_load())
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
        **_outcome(results),
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


# --- SmolVLA's code on a stand-in VLM ------------------------------------------------------------

SMOLVLA_FILE = "smolvla_smoke.json"


def smolvla_smoke(
    run_dir: str | os.PathLike, dataset: str = "synthetic", steps: int = 4, batch_size: int = 2, chunk_size: int = 8
) -> dict[str, Any]:
    """LeRobot's SmolVLA, end to end through this project, on a stand-in VLM (random weights, toy
    size: :mod:`tutorial_utils.policies.smolvla`): write the stand-in with ``dataset``'s task
    instructions, train ``steps`` steps with the project's trainer on ``dataset``, load the last
    checkpoint, predict one chunk twice with the same seed (the reload must repeat it exactly),
    and serve it through the websocket policy server. Runs in the SmolVLA environment (the CLI
    ``zoo smolvla-smoke`` starts one). Writes and returns ``smolvla_smoke.json``."""
    import importlib.metadata

    import numpy as np
    import torch

    from tutorial_utils import policies
    from tutorial_utils.io import read_jsonl
    from tutorial_utils.policies import smolvla
    from tutorial_utils.train.config import TrainConfig
    from tutorial_utils.train.data import WindowDataset, collate, open_dataset
    from tutorial_utils.train.job import prepare_metadata, resolve_dataset
    from tutorial_utils.train.loop import train

    _positive(steps=steps, batch_size=batch_size, chunk_size=chunk_size)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    root = resolve_dataset(dataset, run_dir)
    prepare_metadata(root)
    source = open_dataset(root, run_dir)
    size = int(source.image_shape[0])
    tasks = [r["task"] for r in read_jsonl(root / "meta" / "tasks.jsonl")]
    t0 = time.perf_counter()
    vlm = smolvla.write_standin(run_dir / "standin_vlm", tasks, image_size=size)
    model_cfg = {
        "policy": "smolvla",
        "policy.vlm_model_name": str(vlm),
        "policy.image_size": size,
        "policy.chunk_size": chunk_size,
        "policy.n_action_steps": chunk_size,
        "policy.num_steps": 4,
    }
    cfg = TrainConfig.from_overrides(
        {
            **model_cfg,
            "dataset": str(root),
            "output_dir": str(run_dir / "train"),
            "steps": steps,
            "batch_size": batch_size,
            "log_freq": 1,
            "eval_freq": 0,
            "save_freq": steps,
            "num_workers": 0,
            "seed": 0,
            "scheduler_warmup_steps": 0,  # a few steps: the learning rate LeRobot's SmolVLA recipe uses from the first
            "optimizer_lr": 1e-4,
        }
    )
    res = train(cfg)
    ckpt = res.summary.get("last_checkpoint")
    model = policies.load(ckpt)
    ds = WindowDataset(source, np.arange(len(source)), model.action_horizon, model.image_size)
    one = collate([ds[0]])
    first = model.predict(one, generator=torch.Generator().manual_seed(0))
    again = policies.load(ckpt).predict(one, generator=torch.Generator().manual_seed(0))
    rt = _round_trips(model, one)
    counts = model.parameter_counts()
    out = {
        "kind": "smolvla_smoke",
        "stand_in": json.loads((vlm / smolvla.STANDIN_FILE).read_text()),
        "versions": {p: importlib.metadata.version(p) for p in ("lerobot", "transformers", "huggingface_hub", "torch")},
        "dataset": paths.for_book(os.fspath(root)),
        "params": counts,
        "steps_done": res.steps_done,
        "losses": [round(float(v), 5) for _, v in res.losses],
        "samples_per_s": res.summary.get("samples_per_s"),
        "checkpoint": paths.for_book(os.fspath(ckpt)),
        "chunk_shape": list(first.shape),
        "chunk_finite": bool(np.isfinite(first).all()),
        "reload_repeats": bool(np.array_equal(first, again)),
        "round_trip_ms_p50": round(float(np.median(rt)), 1),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    atomic_write_json(run_dir / SMOLVLA_FILE, out)
    return out


def run_smolvla_smoke(
    run_dir: str | os.PathLike, dataset: str = "synthetic", steps: int = 4, batch_size: int = 2
) -> dict[str, Any]:
    """:func:`smolvla_smoke` in this process when it can import SmolVLA, else in a child process
    with the SmolVLA environment (``.smolvla`` first on PYTHONPATH, the Hub offline), whose output
    streams through; returns ``smolvla_smoke.json``'s content."""
    import subprocess

    from tutorial_utils.policies import smolvla

    run_dir = Path(run_dir)
    problem = smolvla.transformers_problem()
    if problem is None:
        return smolvla_smoke(run_dir, dataset, steps, batch_size)
    if os.environ.get("TUTORIAL_SMOLVLA_CHILD"):  # the child could not import it either: say why, no loop
        raise PolicyUnavailable(problem)
    env = smolvla.environment() | {"TUTORIAL_SMOLVLA_CHILD": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [
        sys.executable,
        "-m",
        "tutorial_utils",
        "zoo",
        "smolvla-smoke",
        "--run-dir",
        str(run_dir),
        "--dataset",
        dataset,
        "--steps",
        str(steps),
        "--batch-size",
        str(batch_size),
    ]
    print(
        f"[smolvla] in the SmolVLA environment (PYTHONPATH={smolvla.ENV_DIR.name}): {paths.for_book(str(run_dir))}",
        flush=True,
    )
    # its output passes through here, with this machine's folders written portably (a page shows it)
    with subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc:
        for line in proc.stdout:
            print(paths.for_book(line), end="", flush=True)
    rc = proc.returncode
    if rc != 0 or not (run_dir / SMOLVLA_FILE).is_file():
        raise PolicyUnavailable(f"the SmolVLA smoke test failed (exit status {rc}); its output is above")
    return json.loads((run_dir / SMOLVLA_FILE).read_text())


def _smolvla_main(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir or jobs.ensure_run_dir("", "smolvla_smoke"))
    out = run_smolvla_smoke(run_dir, args.dataset, args.steps, args.batch_size)
    if not os.environ.get("TUTORIAL_SMOLVLA_CHILD"):
        print(json.dumps({k: v for k, v in out.items() if k not in ("stand_in", "losses")}))
    return 0 if out["chunk_finite"] and out["reload_repeats"] else 1


def promote(run_dir: str | os.PathLike, prefix: str | None = None, reference: bool = False) -> list[Path]:
    """Copy a finished zoo's ``zoo.json`` (or a sweep's ``sweep.json``) into this build's
    ``_build/promoted/logs/<prefix>.json``, or with ``reference=True`` the shipped
    ``logs/<prefix>.json`` (the chapters read it, preferring this build's, and draw their figures from it). An unfinished one is refused.
    Each row whose evaluation run is on this machine also gets a rollout video of its first success and
    its first failure (``assets/<prefix>_<label>_success.mp4``, ``..._failure.mp4``), named in the row's
    ``videos``. A zoo
    from before ``config.demonstrations`` gets it here when its dataset is on this machine
    (``zoo promote logs/zoo_cpu.json --prefix zoo_cpu`` fills in a promoted one)."""
    zoo = load(run_dir)
    if not zoo.get("finished"):
        planned = zoo["config"].get("families") or zoo["config"].get("values") or []
        raise ConfigError(
            f"{run_dir}: this run did not finish ({len(zoo['rows'])} of {len(planned)} trained and evaluated); "
            "rerun its job with the same parameters (finished trainings and evaluations are reused), then promote it"
        )
    if prefix is None:  # zoo_cpu.json, sweep_gpu.json...: the kind and the profile the job ran in
        profile = jobs.read_status(run_dir).get("profile") if Path(run_dir).is_dir() else None
        prefix = f"{zoo.get('kind', 'zoo')}_{profile or 'cpu'}"
    cfg = zoo["config"]
    if "demonstrations" not in cfg and cfg.get("dataset"):  # a zoo from before the field: read it now, if here
        with contextlib.suppress(TutorialError, OSError):
            d = demonstrations(
                cfg["dataset"], cfg.get("suite", "libero_spatial"), cfg.get("task_ids", "all"), cfg["trials_per_task"]
            )
            cfg["demonstrations"] = d and {**d, "read_at": "promotion"}  # from the dataset here now, not during the run
    if zoo.get("kind") == "sweep" and "eval_seed" not in cfg and "seed" in cfg:
        # a sweep from before `eval_seed` wrote the client seed over the training seed: read the training
        # seed back from a run's parameters when that run is here, else leave it out rather than wrong
        cfg["eval_seed"] = cfg.pop("seed")
        for row in zoo["rows"]:
            with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
                cfg["seed"] = int(jobs.read_status(paths.from_book(row["train_run"]))["parameters"]["seed"])
                break
    from tutorial_utils.report import promote as P
    from tutorial_utils.report import provenance

    logs_dir, assets_dir = P.destinations(reference)
    dest = logs_dir / f"{prefix}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    # a promoted file promoted again (to fill in the demonstrations) keeps the run it came from
    source = zoo.get("promoted_from") or paths.for_book(os.fspath(Path(run_dir)))
    written = [dest]
    for row in zoo["rows"]:  # a success and a failure of each row, where its evaluation is on this machine
        ev = paths.from_book(row["eval_run"]) if row.get("eval_run") else None
        if ev is None or not (ev / P.RESULTS_FILE).is_file():
            continue
        pair = P.rollout_pair(ev, assets_dir / f"{prefix}_{row_label(row)}".replace("=", "_").replace(" ", "_"))
        row["videos"] = {k: {**v, "video": f"assets/{v['video'].name}"} for k, v in pair.items()}
        written += [v["video"] for v in pair.values()]
    atomic_write_json(dest, {**zoo, "promoted_from": source})
    if Path(run_dir).is_dir():  # a run here: stamp it (its dataset's fingerprint when the dataset is here)
        with contextlib.suppress(TutorialError, OSError):
            from tutorial_utils.train.job import resolve_dataset

            data = (
                resolve_dataset(cfg["dataset"], paths.RUNS) if cfg.get("dataset") not in (None, "synthetic") else None
            )
            st = provenance.stamp(run_dir, data, stage=zoo.get("kind", "zoo"))
            provenance.write_stamps({f"{p.parent.name}/{p.name}": st for p in written}, reference=reference)
    return written


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m tutorial_utils zoo", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table", help="print a zoo's comparison table")
    t.add_argument("run", help="the zoo or sweep job's run directory, or a promoted logs/*.json")
    p = sub.add_parser(
        "promote", help="copy a finished zoo's or sweep's results into _build/promoted/logs/ for the chapters"
    )
    p.add_argument("run")
    p.add_argument("--prefix", default=None, help="the file name in logs/ (default: <zoo|sweep>_<profile>)")
    p.add_argument("--reference", action="store_true", help="into logs/, the reference shipped with the book")
    s = sub.add_parser(
        "smolvla-smoke",
        help="LeRobot's SmolVLA on a local stand-in VLM (random weights): train a few steps, reload, serve",
    )
    s.add_argument("--dataset", default="synthetic", help="a dataset name under data/, a path, or synthetic")
    s.add_argument("--steps", type=int, default=4, help="training steps")
    s.add_argument("--batch-size", type=int, default=2)
    s.add_argument("--run-dir", default="", help="where to write (default: a new runs/<time>-smolvla_smoke-<id>)")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "smolvla-smoke":
            return _smolvla_main(args)
        if args.cmd == "table":
            print(text(load(args.run)))
        else:
            for f in promote(args.run, args.prefix, reference=args.reference):
                print(f"promoted {f}")
    except (ConfigError, FileNotFoundError, PolicyUnavailable) as exc:
        print(error_text(exc), file=sys.stderr)
        return 1
    return 0

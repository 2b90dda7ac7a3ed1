"""The model zoo comparison: every family that trains on the recorded demonstrations, given the
same demonstrations and the same CPU budget, evaluated with the same LIBERO client.

``run(...)`` (the ``zoo`` job, ``notebooks/jobs/zoo.md``) does, for each family:

1. **budget -> steps**: a minute of training of the family on the dataset, through the real trainer
   and data loader (:func:`.budget.calibrate`: the rate of its second half, and the slow start the
   budget pays once), turn the shared budget (``train_minutes``) into a step count, so every
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
SmolVLA on a local stand-in VLM (:func:`tutorial_utils.experiments.smolvla_smoke.smolvla_smoke`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tutorial_utils import jobs, paths
from tutorial_utils.errors import ConfigError, TutorialError, error_text
from tutorial_utils.experiments.budget import budget_minutes, calibrate, load_average, settle
from tutorial_utils.experiments.catalog import learning_rate, parse_families, untimed_steps
from tutorial_utils.experiments.coverage import demonstrations
from tutorial_utils.experiments.smolvla_smoke import smolvla_main
from tutorial_utils.io import atomic_write_json
from tutorial_utils.params import at_least_one, param
from tutorial_utils.policies.base import PolicyUnavailable
from tutorial_utils.report.zoo_tables import ZOO_FILE, load, outcome, row_label, text
from tutorial_utils.train.speed import budget_steps


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
        if (
            all(got.get(k) == v for k, v in want.items())
            and isinstance(got.get("steps"), int)
            and _same_recipe(paths.RUNS / row["run_id"], fam)
        ):
            return got["steps"], {"reused_budget_of": row["run_id"]}
    return None


def _same_recipe(run_dir: Path, fam: str) -> bool:
    """Whether a finished training ran with the family's recipe as it is now (a training from
    before the recipe changed is not this budget's: VQ-BeT's became LeRobot's on 2026-12-05).
    A schedule field the zoo sets itself (the warm-up) does not count."""
    from tutorial_utils.train.config import _same, family_recipe

    f = Path(run_dir) / "train_config.json"
    if not f.is_file():
        return False
    ran = json.loads(f.read_text(encoding="utf-8")).get("train") or {}
    recipe = family_recipe(fam)
    return all(_same(ran.get(k), v) for k, v in recipe.items() if k != "scheduler_warmup_steps")


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
        **outcome(results),
        "timed_s_per_step": (timing or {}).get("s_per_step"),
        "load_at_start": load,
        **({"settle_s": timing["settle_s"]} if timing and "settle_s" in timing else {}),
        **({"start_s": timing["start_s"]} if timing and "start_s" in timing else {}),
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
    budget (the calibrated steps should end first); also how a zoo training is recognised
    (:func:`_budgeted_before`). It was 1.5 x the budget while the calibration timed 30 steps; a
    training budgeted that way (at its slow start's rate) is not taken for a budget timed now."""
    return round(1.25 * minutes, 2)


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
        at_least_one(
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
        load = load_average()
        timing = None
        fam_steps = int(steps)
        if train_minutes:
            earlier = _budgeted_before(fam, dataset, batch_size, num_workers, seed, train_minutes)
            if earlier:  # a rerun continues with the earlier budget's steps (and reuses that training)
                fam_steps, timing = earlier
            else:
                _, load, settle_s = settle()  # the previous family's evaluation may still be ending
                timing = {**calibrate(fam, dataset, batch_size, num_workers), "settle_s": settle_s}
                # a cheap first phase (VQ-BeT's action codes) is timed away and comes on top of the budget
                timing["untimed_steps"] = untimed_steps(fam)
                minutes = budget_minutes(timing, train_minutes)  # the slow start is paid once, out of the budget
                fam_steps = budget_steps(timing["s_per_step"], minutes) + timing["untimed_steps"]
        print(
            f"[zoo] {fam}: {fam_steps} steps"
            + (
                f" ({train_minutes} min, {timing['start_s']} s of it for the slow start,"
                f" at {timing['s_per_step']} s/step, load {load}"
                + (f", plus {timing['untimed_steps']} untimed first-phase steps" if timing.get("untimed_steps") else "")
                + ")"
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
            return smolvla_main(args)
        if args.cmd == "table":
            print(text(load(args.run)))
        else:
            for f in promote(args.run, args.prefix, reference=args.reference):
                print(f"promoted {f}")
    except (ConfigError, FileNotFoundError, PolicyUnavailable) as exc:
        print(error_text(exc), file=sys.stderr)
        return 1
    return 0

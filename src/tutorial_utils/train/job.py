"""What ``notebooks/jobs/train.md`` runs: resolve the dataset, prepare its metadata, train, record the success signs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tutorial_utils.io import read_jsonl
from tutorial_utils.train.checkpoints import METRICS_FILE
from tutorial_utils.train.config import DatasetNotReady, TrainConfig
from tutorial_utils.train.data import _in_data
from tutorial_utils.train.loop import TrainResult, train
from tutorial_utils.train.rundir import LOG_FILE

# --- the job notebook's logic ---------------------------------------------------------------------

#: What ``smoke=True`` sets on the mini backend (the dit4dit backend's smoke test is the bridge's).
SMOKE_OVERRIDES = {"steps": 2, "batch_size": 1, "log_freq": 1, "eval_freq": 0, "save_freq": 0}


def prepare_metadata(root: str | os.PathLike) -> dict[str, str]:
    """Write ``meta/modality.json`` and the statistics of a dataset that lacks them; returns
    ``{what: path}`` for each file written (empty when nothing was missing)."""
    from tutorial_utils.data import modality, stats

    root = Path(root)
    done: dict[str, str] = {}
    if not (root / modality.MODALITY_PATH).is_file():
        modality.build_modality(root)
        done["modality"] = str(root / modality.MODALITY_PATH)
    if not (root / stats.STATS_GR00T_PATH).is_file():
        stats.compute_all(root)
        done["stats"] = str(root / stats.STATS_GR00T_PATH)
    return done


def resolve_dataset(dataset: str, run_dir: str | os.PathLike) -> Path:
    """The job's ``dataset``: ``"synthetic"`` -> a small synthetic LIBERO-schema dataset in
    ``<run_dir>/dataset`` (written once, with its metadata); a name -> ``data/<name>``; else a path."""
    from tutorial_utils import paths

    if dataset == "synthetic":
        from tutorial_utils.data.synth import generate_dataset

        root = Path(run_dir) / "dataset"
        if not (root / "meta" / "info.json").is_file():
            generate_dataset(root, n_episodes=4, mean_length=16, image_size=64, n_tasks=2, seed=0)
        prepare_metadata(root)
        return root
    p = _in_data(dataset)
    if not (p / "meta" / "info.json").is_file():
        raise DatasetNotReady(
            f"dataset {dataset!r} not found (looked at {p} and {paths.DATA / dataset}). Record it with the record_demos "
            "job (`python -m tutorial_utils job run notebooks/jobs/record_demos.md`), or pass dataset=synthetic."
        )
    return p


def family_parameters(parameters: dict[str, Any]) -> dict[str, Any]:
    """The train job's parameters beyond its ``parameters`` cell: the chosen family's own
    (``policy``'s config fields with their defaults), so ``-p policy act -p chunk_size 16`` is a
    job parameter like any other (the train job's entry in :data:`tutorial_utils.jobs.registry.JOBS`
    names this function for :func:`tutorial_utils.jobs.run_notebook`)."""
    import dataclasses

    from tutorial_utils import params, policies

    cls = policies.family(str(parameters.get("policy") or "mini")).config_class
    return {f.name: params.default_of(f) for f in dataclasses.fields(cls) if f.metadata.get("help") is not None}


def _explain_unknown(names: list[str], parameters: dict[str, Any]) -> str:
    """For each unknown name that another family takes: which one, and how to choose it."""
    import dataclasses

    from tutorial_utils import policies

    chosen = str(parameters.get("policy") or "mini")
    hints = []
    for name in names:
        owners = [
            fam
            for fam in policies.trainable()
            if any(f.name == name for f in dataclasses.fields(policies.family(fam).config_class))
        ]
        if owners:
            hints.append(
                f"{name} is a parameter of {', '.join(owners)}, not of policy={chosen!r} "
                f"(choose the family with -p policy {owners[0]}; its parameters: "
                f"python -m tutorial_utils train --list-params policy={owners[0]})"
            )
    return "; ".join(hints)


family_parameters.explain = _explain_unknown  # type: ignore[attr-defined]


def run_job(run_dir: str | os.PathLike, **params: Any) -> TrainResult:
    """What ``notebooks/jobs/train.md`` runs: resolve ``params["dataset"]``, train into
    ``run_dir`` with the other parameters (:class:`TrainConfig` names), record the success signs
    in ``status.json``. ``backend="dit4dit"`` runs upstream's training through the bridge instead."""
    from tutorial_utils.bridge.commands import split_backend

    backend, bridge_params = split_backend(params)
    if backend == "dit4dit":
        return _run_dit4dit(run_dir, {**params, **bridge_params})
    if bridge_params.get("smoke"):  # the smoke test whatever the profile: 2 steps at batch 1
        params.update(SMOKE_OVERRIDES)
    dataset = str(params.pop("dataset", "") or "")
    if not dataset:
        raise DatasetNotReady("the train job needs a dataset: pass dataset=<name under data/, a path, or synthetic>.")
    from tutorial_utils import jobs
    from tutorial_utils.logs import parse_train_log, train_signs

    root = resolve_dataset(dataset, run_dir)
    wrote = prepare_metadata(root)  # DiT4DiT computes missing statistics too; here it is said out loud
    for what, path in wrote.items():
        print(f"{root.name}: wrote the missing {what} ({path})")
    cfg = TrainConfig.from_overrides({**params, "dataset": str(root), "output_dir": str(run_dir)})
    res = train(cfg)
    log = parse_train_log(Path(run_dir) / LOG_FILE)
    signs = train_signs(log)
    jobs.update_status(
        run_dir,
        success_signs=signs,
        train={
            k: res.summary.get(k)
            for k in (
                "policy",
                "steps_done",
                "stopped_by",
                "first_loss",
                "last_loss",
                "best",
                "samples_per_s",
                "data_wait_share",
                "last_checkpoint",
                "best_checkpoint",
                "final_model_bytes",
                "run_dir_bytes_after",
                "wall_s",
            )
        },
        dataset=str(root),
    )
    return res


def _run_dit4dit(run_dir: str | os.PathLike, params: dict[str, Any]) -> TrainResult:
    """Upstream's training through the bridge; its loss lines become ``metrics.jsonl`` rows and a
    :class:`TrainResult`, so the job notebook reads both backends alike."""
    from tutorial_utils.bridge.job import train_job
    from tutorial_utils.io import atomic_write_text

    out = train_job(run_dir, **params)
    rows = []
    for s in out["steps"]:
        loss = s["losses"]
        t = loss.get("data_time", 0.0) + loss.get("model_time", 0.0)
        lr = next((v for k, v in loss.items() if k.startswith("learning_rate")), None)
        rows.append({"step": s["step"], "loss": loss.get("total_loss"), "lr": lr,
                     "samples_per_s": out["batch_size"] / t if t else None, "data_time": loss.get("data_time"),
                     "model_time": loss.get("model_time")})  # fmt: skip
    atomic_write_text(Path(run_dir) / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in rows))
    data = sum(r["data_time"] or 0.0 for r in rows)
    total = data + sum(r["model_time"] or 0.0 for r in rows)
    speeds = [r["samples_per_s"] for r in rows if r["samples_per_s"]]
    summary = {
        "backend": "dit4dit",
        "steps_done": rows[-1]["step"] if rows else 0,
        "first_loss": rows[0]["loss"] if rows else None,
        "last_loss": rows[-1]["loss"] if rows else None,
        "samples_per_s": sum(speeds) / len(speeds) if speeds else 0.0,
        "data_wait_share": data / total if total else 0.0,
        "time_limited": False,
        "last_checkpoint": None,
        "final_model": out.get("final_model"),
        "wall_s": out.get("wall_s"),
    }
    losses = [(r["step"], r["loss"]) for r in rows]
    return TrainResult(Path(run_dir), summary["steps_done"], losses, None, summary)


def metrics_table(run_dir: str | os.PathLike, every: int = 1) -> list[dict]:
    """Rows of ``metrics.jsonl`` merged per step (training and validation rows), every n-th kept."""
    rows: dict[int, dict] = {}
    for r in read_jsonl(Path(run_dir) / METRICS_FILE):
        rows.setdefault(int(r["step"]), {}).update(r)
    steps = sorted(rows)
    keep = steps[:: max(1, every)]
    if steps and steps[-1] not in keep:
        keep.append(steps[-1])
    return [rows[s] for s in keep]
